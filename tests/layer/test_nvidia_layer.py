"""The x86-64 NVIDIA stack in the layer: one driver version for kernel side and userspace, the
licence gate's one line, the GPU_K8S_NVIDIA knob per machine and series, the toolkit's CVE
floor, and the CDI unit's script run against fake sysfs trees and fake NVIDIA tools."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from bbfile import parse, parse_with_requires
from layer_paths import KAS, LAYER
from nvidia_layer import NVIDIA_CLASS, VERSION_INC, Data, class_functions

KERNEL = LAYER / "recipes-kernel/nvidia-open-gpu-kernel-modules/nvidia-open-gpu-kernel-modules_r580.bb"
USERSPACE = LAYER / "recipes-graphics/nvidia-driver/nvidia-driver_r580.bb"
TOOLKIT_DIR = LAYER / "recipes-containers/nvidia-container-toolkit"
CDI_DIR = LAYER / "recipes-containers/gpu-k8s-nvidia-cdi"
CDI_SCRIPT = CDI_DIR / "files/gpu-k8s-nvidia-cdi"
PACKAGEGROUP = LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb"


# ---- one version ------------------------------------------------------------------------

def test_kernel_modules_and_userspace_take_pv_from_the_one_version_file() -> None:
    version = parse(VERSION_INC).value("NVIDIA_DRIVER_VERSION")
    assert re.fullmatch(r"580\.\d+(\.\d+)?", version), f"not an R580 release: {version}"
    for recipe in (KERNEL, USERSPACE):
        bb = parse(recipe)
        assert bb.value("PV") == "${NVIDIA_DRIVER_VERSION}", f"{recipe.name} sets its own PV"
        assert any(r.endswith("nvidia-driver/nvidia-driver-version.inc") or r == "nvidia-driver-version.inc"
                   for r in bb.requires), f"{recipe.name} does not require the version file"
    assert parse(KERNEL).value("SRCREV") == "${NVIDIA_OPEN_GPU_KERNEL_MODULES_SRCREV}"


def test_the_version_number_is_written_nowhere_else_in_the_layer() -> None:
    version = parse(VERSION_INC).value("NVIDIA_DRIVER_VERSION")
    elsewhere = [p.relative_to(LAYER) for p in LAYER.rglob("*") if p.is_file() and p != VERSION_INC
                 and version in p.read_text(errors="replace")]
    assert not elsewhere, f"{version} is also written in {elsewhere}: kernel side and userspace could drift"


def test_the_pins_are_full_hashes() -> None:
    inc = parse(VERSION_INC)
    assert re.fullmatch(r"[0-9a-f]{40}", inc.value("NVIDIA_OPEN_GPU_KERNEL_MODULES_SRCREV"))
    for name in ("NVIDIA_DRIVER_RUN_SHA256", "NVIDIA_FABRICMANAGER_SHA256"):
        assert re.fullmatch(r"[0-9a-f]{64}", inc.value(name)), name
    for name in ("NVIDIA_DRIVER_LICENSE_MD5", "NVIDIA_FABRICMANAGER_LICENSE_MD5"):
        assert re.fullmatch(r"[0-9a-f]{32}", inc.value(name)), name
    assert "branch=580" in parse(KERNEL).value("SRC_URI")
    userspace = USERSPACE.read_text()
    assert 'SRC_URI[sha256sum] = "${NVIDIA_DRIVER_RUN_SHA256}"' in userspace
    assert parse(USERSPACE).value("LIC_FILES_CHKSUM") == "file://LICENSE;md5=${NVIDIA_DRIVER_LICENSE_MD5}"


def test_the_run_is_fetched_from_where_the_version_file_says_its_release_line_publishes_it() -> None:
    # a data-centre release is published under .../tesla/<version>/ only, a production one
    # under .../XFree86/...: the location travels with the version, not with the recipe
    base = parse(VERSION_INC).value("NVIDIA_DRIVER_RUN_BASE_URI")
    assert base.startswith("https://") and base.endswith("/${NVIDIA_DRIVER_VERSION}")
    uri = parse(USERSPACE).words("SRC_URI")[0]
    assert uri == "${NVIDIA_DRIVER_RUN_BASE_URI}/${NVIDIA_RUN};unpack=0"


def test_userspace_ships_firmware_under_its_own_version_and_no_graphics_libraries() -> None:
    bb = parse_with_requires(USERSPACE)
    install = bb.tasks["do_install"]
    assert "firmware/nvidia/${PV}" in install
    libraries = [entry.split(":")[0] for entry in bb.words("NVIDIA_LIBRARIES")]
    assert {"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm"} <= set(libraries)
    assert not [lib for lib in libraries if re.match(r"lib(GL|EGL|GLX|vulkan|nvidia-gl)", lib)]
    assert {"nvidia-smi", "nvidia-persistenced"} <= set(bb.words("NVIDIA_TOOLS"))
    assert "install -m 4755 ${S}/nvidia-modprobe" in install


# ---- modules at boot, nouveau off ---------------------------------------------------------

def test_nvidia_and_uvm_load_at_boot_and_nouveau_is_kept_off() -> None:
    bb = parse(KERNEL)
    assert bb.words("KERNEL_MODULE_AUTOLOAD") == ["nvidia", "nvidia-uvm"]
    conf = (KERNEL.parent / "files/gpu-k8s-nvidia.conf").read_text().splitlines()
    assert "blacklist nouveau" in conf and "install nouveau /bin/false" in conf
    assert "ARCH=x86_64" in bb.value("EXTRA_OEMAKE")
    assert bb.value("MODULES_MODULE_SYMVERS_LOCATION") == "kernel-open"


# ---- the licence gate and the knob ------------------------------------------------------

def test_without_the_licence_the_parse_stops_with_one_line_naming_the_fix() -> None:
    problem = class_functions()["gpu_k8s_nvidia_problem"](Data())
    assert "\n" not in problem
    assert "licence is not accepted" in problem
    assert "kas/include/nvidia-licence.yml" in problem
    assert 'LICENSE_FLAGS_ACCEPTED += "nvidia-driver"' in problem
    assert 'GPU_K8S_NVIDIA = "0"' in problem


@pytest.mark.parametrize("accepted", ["nvidia-driver", "commercial nvidia-driver_nvidia-driver"])
def test_the_accepted_licence_passes(accepted: str) -> None:
    assert class_functions()["gpu_k8s_nvidia_problem"](Data(LICENSE_FLAGS_ACCEPTED=accepted)) == ""


def test_the_kas_include_accepts_exactly_the_flag_the_driver_recipe_carries() -> None:
    flag = parse(USERSPACE).value("LICENSE_FLAGS")
    assert flag == parse(NVIDIA_CLASS).value("GPU_K8S_NVIDIA_LICENSE_FLAG")
    include = yaml.safe_load((KAS / "include/nvidia-licence.yml").read_text())
    lines = "\n".join(include["local_conf_header"].values())
    assert f'LICENSE_FLAGS_ACCEPTED:append = " {flag}"' in lines


def test_the_packagegroup_runs_the_gate_and_adds_the_stack_only_with_the_knob() -> None:
    bb = parse(PACKAGEGROUP)
    assert "gpu_k8s_nvidia" in bb.inherits
    anonymous = bb.tasks["python"]
    assert "problem = gpu_k8s_nvidia_problem(d)" in anonymous and "bb.fatal(problem)" in anonymous
    append = bb.value("RDEPENDS", "${PN}", "append")
    assert "GPU_K8S_NVIDIA_PACKAGES" in append and "== '1'" in append


@pytest.mark.parametrize(("arch", "overrides", "goversion", "default"), [
    ("x86_64", "x86-64:genericx86-64", None, "1"),          # wrynose: one Go (1.26), no GOVERSION
    ("x86_64", "x86-64:qemuall:qemux86-64", None, "0"),     # QEMU: no GPU, a knob
    ("aarch64", "tegra:tegra210:jetson-nano-devkit", "1.17%", "0"),
    ("x86_64", "x86-64:genericx86-64", "1.22%", "0"),       # scarthgap's Go cannot build toolkit 1.20
])
def test_the_stack_is_on_by_default_only_for_x86_machines_whose_series_can_build_it(
        arch: str, overrides: str, goversion: str | None, default: str) -> None:
    values = {"TARGET_ARCH": arch, "MACHINEOVERRIDES": overrides}
    if goversion:
        values["GOVERSION"] = goversion
    assert class_functions()["gpu_k8s_nvidia_default"](Data(**values)) == default


def test_a_build_that_only_adds_the_layer_gets_no_driver_and_no_licence_stop() -> None:
    plain = Data(DISTRO_FEATURES="systemd virtualization seccomp")
    assert class_functions()["gpu_k8s_nvidia_default"](plain) == "0"


def test_asking_for_the_stack_where_it_cannot_be_built_says_why_in_one_line() -> None:
    functions = class_functions()
    old_go = functions["gpu_k8s_nvidia_problem"](Data(GOVERSION="1.22%", LICENSE_FLAGS_ACCEPTED="nvidia-driver"))
    assert "Go >= 1.25" in old_go and "Go 1.22" in old_go and "\n" not in old_go
    arm = functions["gpu_k8s_nvidia_problem"](Data(TARGET_ARCH="aarch64"))
    assert "x86-64" in arm and 'GPU_K8S_NVIDIA = "0"' in arm
    bad = functions["gpu_k8s_nvidia_problem"](Data(GPU_K8S_NVIDIA="yes"))
    assert bad == 'GPU_K8S_NVIDIA must be "0" or "1", got "yes" (set it in local.conf)'
    assert functions["gpu_k8s_nvidia_problem"](Data(GPU_K8S_NVIDIA="0")) == ""


# ---- the toolkit ------------------------------------------------------------------------

def toolkit_recipe() -> Path:
    recipes = sorted(TOOLKIT_DIR.glob("nvidia-container-toolkit_*.bb"))
    assert len(recipes) == 1, recipes
    return recipes[0]


def test_the_toolkit_is_at_or_above_the_cve_2025_23266_floor_and_pinned() -> None:
    version = toolkit_recipe().stem.split("_")[1]
    assert tuple(int(x) for x in version.split(".")) >= (1, 17, 8), f"toolkit {version} has CVE-2025-23266"
    bb = parse(toolkit_recipe())
    assert re.fullmatch(r"[0-9a-f]{40}", bb.value("SRCREV"))
    assert f"branch=release-{'.'.join(version.split('.')[:2])}" in bb.value("SRC_URI")


def test_the_toolkit_builds_cdi_modes_only_and_its_runtime_isolates_in_mode_auto() -> None:
    bb = parse(toolkit_recipe())
    commands = {word.rsplit("/", 1)[1] for word in bb.words("GO_INSTALL")}
    assert commands == {"nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime"}
    settings = [line for line in (TOOLKIT_DIR / "files/config.toml").read_text().splitlines()
                if line and not line.startswith("#")]
    # the runtime as tests/plugin/test_isolation.py reads it, merged over nvidia-ctk's defaults
    assert settings == ["accept-nvidia-visible-devices-envvar-when-unprivileged = false",
                        "accept-nvidia-visible-devices-as-volume-mounts = true",
                        "[nvidia-container-runtime]", 'mode = "auto"']


def test_the_isolation_opt_out_turns_exactly_the_envvar_line(tmp_path: Path) -> None:
    bb = parse(toolkit_recipe())
    assert "gpu_k8s_platform" in bb.inherits
    install = bb.tasks["do_install:append"]
    sed = re.search(r"sed -i -e '([^']+)'", install)
    assert sed and 'if [ "${GPU_K8S_GPU_ISOLATION}" = "0" ]' in install
    config = tmp_path / "config.toml"
    config.write_text((TOOLKIT_DIR / "files/config.toml").read_text())
    subprocess.run(["sed", "-i", "-e", sed.group(1), str(config)], check=True)
    changed = [line for line in config.read_text().splitlines() if line.startswith("accept-")]
    assert changed == ["accept-nvidia-visible-devices-envvar-when-unprivileged = true",
                       "accept-nvidia-visible-devices-as-volume-mounts = true"]
    assert parse(LAYER / "classes/gpu_k8s_platform.bbclass").value("GPU_K8S_GPU_ISOLATION") == "1"


def test_a_series_with_an_older_go_skips_the_toolkit_with_the_reason() -> None:
    text = toolkit_recipe().read_text()
    assert "inherit go-mod gpu_k8s_nvidia" in text
    assert "raise bb.parse.SkipRecipe('nvidia-container-toolkit %s needs Go >= %s" in text


def test_every_nvidia_recipe_stays_off_other_architectures() -> None:
    for recipe in (KERNEL, USERSPACE, toolkit_recipe(), CDI_DIR / "gpu-k8s-nvidia-cdi_1.0.bb"):
        assert parse(recipe).value("COMPATIBLE_HOST") == "x86_64.*-linux", recipe.name


# ---- the CDI unit -----------------------------------------------------------------------

def test_the_unit_never_holds_up_docker_or_k3s_and_udev_restarts_it_for_a_new_gpu() -> None:
    unit = (CDI_DIR / "files/gpu-k8s-nvidia-cdi.service").read_text()
    assert re.search(r"^Before=.*docker\.service.*k3s\.service", unit, re.M)
    assert "RemainAfterExit" not in unit, "a oneshot that remains active could not be started again by udev"
    assert "WantedBy=multi-user.target" in unit
    rule = (CDI_DIR / "files/71-gpu-k8s-nvidia.rules").read_text()
    assert 'ATTR{vendor}=="0x10de"' in rule and 'SYSTEMD_WANTS}+="gpu-k8s-nvidia-cdi.service"' in rule
    for other in LAYER.rglob("*.service"):
        assert not re.search(r"^(Requires|BindsTo)=.*gpu-k8s-nvidia-cdi", other.read_text(), re.M), other


def pci_device(sysfs: Path, address: str, vendor: str, device: str, klass: str) -> None:
    path = sysfs / "bus/pci/devices" / address
    path.mkdir(parents=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "device").write_text(device + "\n")
    (path / "class").write_text(klass + "\n")


FAKE_TOOLS = {
    "modprobe": 'echo "modprobe $*" >>"$CALLS"\n'
                '[ -z "${MODPROBE_FAILS:-}" ] || { echo "$MODPROBE_FAILS" >&2; exit 1; }',
    "nvidia-ctk": textwrap.dedent("""\
        echo "nvidia-ctk $*" >>"$CALLS"
        case "$1" in
            --version) echo "NVIDIA Container Toolkit CLI version 1.20.0" ;;
            cdi) out=${3#--output=}; echo "cdiVersion: 0.5.0" >"$out" ;;
        esac"""),
    "nvidia-smi": 'echo "nvidia-smi $*" >>"$CALLS"; echo "GPU 0: NVIDIA L4 (UUID: GPU-1234)"',
    "nvidia-modprobe": 'echo "nvidia-modprobe $*" >>"$CALLS"',
}


@pytest.fixture
def node(tmp_path: Path):
    sysfs = tmp_path / "sys"
    (sysfs / "bus/pci/devices").mkdir(parents=True)
    (sysfs / "module/nvidia").mkdir(parents=True)
    (sysfs / "module/nvidia/version").write_text("580.142\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_TOOLS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GPU_K8S_SYSFS": str(sysfs), "CALLS": str(tmp_path / "calls"),
           "GPU_K8S_NVIDIA_CDI_SPEC": str(tmp_path / "run/cdi/nvidia.yaml"),
           "GPU_K8S_NVIDIA_CDI_STATE_DIR": str(tmp_path / "run/gpu-k8s")}

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", str(CDI_SCRIPT)], env={**env, **extra}, capture_output=True, text=True,
                              timeout=30)

    def calls() -> list[str]:
        path = Path(env["CALLS"])
        return path.read_text().splitlines() if path.exists() else []

    return SimpleNamespace(sysfs=sysfs, run=run, calls=calls, spec=Path(env["GPU_K8S_NVIDIA_CDI_SPEC"]))


def test_a_box_without_an_nvidia_gpu_gets_one_line_and_boots_on(node) -> None:
    pci_device(node.sysfs, "0000:00:02.0", "0x8086", "0x46a6", "0x030000")  # an Intel iGPU
    result = node.run()
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["gpu-k8s-nvidia-cdi: no NVIDIA GPU: no CDI spec written, the node runs "
                                          "without GPUs"]
    assert node.calls() == [], "nothing is loaded or generated on a GPU-less box"
    assert not node.spec.exists()


def test_a_gpu_older_than_turing_is_named_and_the_node_runs_on(node) -> None:
    pci_device(node.sysfs, "0000:01:00.0", "0x10de", "0x1b80", "0x030000")  # GTX 1080, Pascal
    result = node.run()
    assert result.returncode == 0
    assert "older than Turing" in result.stdout and "0000:01:00.0(10de:1b80)" in result.stdout
    assert "no NVIDIA GPU this driver serves" in result.stdout
    assert node.calls() == []


def test_a_turing_or_newer_gpu_gets_driver_nodes_and_a_spec_written_in_one_step(node) -> None:
    pci_device(node.sysfs, "0000:01:00.0", "0x10de", "0x27b8", "0x030200")  # L4 (3D controller)
    result = node.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.spec.read_text() == "cdiVersion: 0.5.0\n"
    calls = node.calls()
    assert calls[0] == "modprobe nvidia-uvm"
    assert "nvidia-smi -L" in calls
    assert "nvidia-ctk system create-device-nodes --control-devices" in calls
    generate = [c for c in calls if c.startswith("nvidia-ctk cdi generate")]
    assert generate and generate[0].endswith("/run/gpu-k8s/nvidia.yaml"), "the spec is staged, then renamed in"
    assert "written: driver 580.142, 1 GPU(s)" in result.stdout


def test_an_unchanged_node_keeps_its_spec_and_a_changed_gpu_list_rewrites_it(node) -> None:
    pci_device(node.sysfs, "0000:01:00.0", "0x10de", "0x27b8", "0x030200")
    assert node.run().returncode == 0
    again = node.run()
    assert "is current" in again.stdout
    assert sum(c.startswith("nvidia-ctk cdi generate") for c in node.calls()) == 1
    pci_device(node.sysfs, "0000:02:00.0", "0x10de", "0x27b8", "0x030200")
    assert "written" in node.run().stdout
    assert sum(c.startswith("nvidia-ctk cdi generate") for c in node.calls()) == 2


def test_a_driver_that_does_not_load_fails_the_unit_with_the_kernel_s_words_and_no_spec(node) -> None:
    pci_device(node.sysfs, "0000:01:00.0", "0x10de", "0x27b8", "0x030200")
    assert node.run().returncode == 0
    result = node.run(MODPROBE_FAILS="modprobe: ERROR: could not insert 'nvidia': Exec format error")
    assert result.returncode == 1
    assert "Exec format error" in result.stdout and "dmesg | grep NVRM" in result.stdout
    assert not node.spec.exists(), "a spec for a driver that is not there would only mislead the runtime"


def test_the_script_is_posix_sh() -> None:
    if not Path("/bin/dash").exists():
        pytest.skip("dash not installed")
    subprocess.run(["/bin/dash", "-n", str(CDI_SCRIPT)], check=True)
    assert os.access(CDI_SCRIPT, os.X_OK)


# ---- data-centre GPUs: persistence daemon, MIG nodes, Fabric Manager ---------------------

FABRICMANAGER = LAYER / "recipes-graphics/nvidia-driver/nvidia-fabricmanager_r580.bb"
DRIVER_FILES = LAYER / "recipes-graphics/nvidia-driver/files"


def test_persistenced_ships_with_the_library_it_loads_and_a_unit_that_runs_only_with_a_gpu() -> None:
    bb = parse_with_requires(USERSPACE)
    libraries = dict(entry.split(":") for entry in bb.words("NVIDIA_LIBRARIES"))
    assert libraries["libnvidia-cfg"] == "libnvidia-cfg.so.1", "nvidia-persistenced dlopens libnvidia-cfg.so.1"
    assert libraries["libcudadebugger"] == "libcudadebugger.so.1"
    files = bb.value("FILES", "${PN}-persistenced")
    assert "${bindir}/nvidia-persistenced" in files and "${libdir}/libnvidia-cfg.so*" in files
    assert "${libdir}/libcudadebugger.so*" in bb.value("FILES", "${PN}-libcuda")
    packages = bb.words("PACKAGES")
    assert packages.index("${PN}-persistenced") < packages.index("${PN}-tools"), "the daemon must not land in -tools"
    assert bb.value("SYSTEMD_SERVICE", "${PN}-persistenced") == "nvidia-persistenced.service"
    assert "--user-group nvidia-persistenced" in bb.value("USERADD_PARAM", "${PN}-persistenced")
    unit = (DRIVER_FILES / "nvidia-persistenced.service").read_text()
    assert "ConditionPathExistsGlob=/proc/driver/nvidia/gpus/*" in unit
    assert re.search(r"^ExecStart=@BINDIR@/nvidia-persistenced --user nvidia-persistenced$", unit, re.M)
    assert re.search(r"^Before=.*docker\.service.*k3s\.service", unit, re.M)


def test_fabric_manager_is_of_the_drivers_version_and_skipped_when_its_archive_is_not_pinned() -> None:
    bb = parse_with_requires(FABRICMANAGER)
    assert bb.value("PV") == "${NVIDIA_DRIVER_VERSION}"
    assert 'SRC_URI[sha256sum] = "${NVIDIA_FABRICMANAGER_SHA256}"' in FABRICMANAGER.read_text()
    assert bb.value("LIC_FILES_CHKSUM") == "file://LICENSE;md5=${NVIDIA_FABRICMANAGER_LICENSE_MD5}"
    assert bb.value("NVIDIA_FABRICMANAGER_ARCHIVE") == "fabricmanager-linux-x86_64-${PV}-archive"
    assert "/redist/fabricmanager/linux-x86_64/${NVIDIA_FABRICMANAGER_ARCHIVE}.tar.xz" in FABRICMANAGER.read_text()
    assert bb.value("LICENSE_FLAGS") == parse(USERSPACE).value("LICENSE_FLAGS")
    assert "raise bb.parse.SkipRecipe('no sha256/licence md5 pinned for Fabric Manager" in FABRICMANAGER.read_text()
    # nv-fabricmanager links libz.so.1, and file-rdeps (which would name it) is skipped
    assert "zlib" in bb.words("RDEPENDS", "${PN}")


def test_the_pinned_release_carries_fabric_manager_by_default() -> None:
    # the driver is a data-centre release with its Fabric Manager archive pinned beside it, so an
    # x86-64 image runs CUDA on HGX/DGX (NVSwitch) boards without the builder setting anything
    inc = parse(VERSION_INC)
    values = {name: inc.value(name) for name in ("NVIDIA_FABRICMANAGER_SHA256", "NVIDIA_FABRICMANAGER_LICENSE_MD5")}
    assert class_functions()["gpu_k8s_nvidia_fabricmanager_pinned"](Data(**values))
    assert "GPU_K8S_NVIDIA_FABRICMANAGER ??= " in NVIDIA_CLASS.read_text()


def test_fabric_manager_starts_only_with_an_nvswitch_and_before_the_cdi_unit_and_k3s() -> None:
    unit = (DRIVER_FILES / "nvidia-fabricmanager.service").read_text()
    assert "ConditionPathExistsGlob=/proc/driver/nvidia-nvswitch/devices/*" in unit
    before = re.search(r"^Before=(.*)$", unit, re.M).group(1).split()
    assert {"gpu-k8s-nvidia-cdi.service", "k3s.service", "k3s-agent.service", "docker.service"} <= set(before)
    assert "nvidia-fabricmanager.service" in re.search(r"^After=(.*)$", (CDI_DIR / "files/gpu-k8s-nvidia-cdi.service")
                                                      .read_text(), re.M).group(1)


@pytest.mark.parametrize(("sha", "md5", "knob", "default", "problem"), [
    ("", "", None, "0", ""),
    ("ab" * 32, "cd" * 16, None, "1", ""),
    ("", "", "1", None, f"Fabric Manager {parse(VERSION_INC).value('NVIDIA_DRIVER_VERSION')} is not pinned"),
    ("", "", "maybe", None, 'GPU_K8S_NVIDIA_FABRICMANAGER must be "0" or "1"'),
])
def test_fabric_manager_is_in_the_image_exactly_when_pinned(sha: str, md5: str, knob: str | None,
                                                            default: str | None, problem: str) -> None:
    functions = class_functions()
    values = {"NVIDIA_FABRICMANAGER_SHA256": sha, "NVIDIA_FABRICMANAGER_LICENSE_MD5": md5,
              "LICENSE_FLAGS_ACCEPTED": "nvidia-driver"}
    if default is not None:
        pinned = functions["gpu_k8s_nvidia_fabricmanager_pinned"](Data(**values))
        assert ("1" if pinned else "0") == default
    if knob is not None:
        values["GPU_K8S_NVIDIA_FABRICMANAGER"] = knob
    found = functions["gpu_k8s_nvidia_problem"](Data(**values))
    assert (problem in found and "\n" not in found) if problem else found == ""
    group = parse(PACKAGEGROUP)
    assert "nvidia-driver-persistenced" in group.words("GPU_K8S_NVIDIA_PACKAGES")
    assert "GPU_K8S_NVIDIA_FABRICMANAGER') == '1'" in group.value("GPU_K8S_NVIDIA_FABRICMANAGER_PACKAGE")


def test_mig_capability_nodes_are_created_where_the_driver_lists_them(node, tmp_path: Path) -> None:
    mig = tmp_path / "proc/driver/nvidia/capabilities/mig"
    mig.mkdir(parents=True)
    (mig / "config").write_text("DeviceFileMinor: 1\n")
    (mig / "monitor").write_text("DeviceFileMinor: 2\n")
    pci_device(node.sysfs, "0000:01:00.0", "0x10de", "0x20b5", "0x030200")  # A100 80GB
    result = node.run(GPU_K8S_PROC=str(tmp_path / "proc"))
    assert result.returncode == 0, result.stdout + result.stderr
    calls = [c for c in node.calls() if c.startswith("nvidia-modprobe")]
    assert calls == [f"nvidia-modprobe -f {mig}/config", f"nvidia-modprobe -f {mig}/monitor"]


def test_a_gpu_without_mig_needs_no_capability_nodes(node, tmp_path: Path) -> None:
    pci_device(node.sysfs, "0000:01:00.0", "0x10de", "0x27b8", "0x030200")
    assert node.run(GPU_K8S_PROC=str(tmp_path / "no-proc")).returncode == 0
    assert not [c for c in node.calls() if c.startswith("nvidia-modprobe")]


# ---- Jetson: the runtime settings drop-in ------------------------------------------------

RUNTIME_CONFIG_RECIPE = (LAYER / "dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-runtime-config/"
                         "gpu-k8s-nvidia-runtime-config_1.0.bb")


def test_the_jetson_drop_in_extends_the_setup_unit_and_is_not_for_the_nano() -> None:
    bb = parse(RUNTIME_CONFIG_RECIPE)
    assert bb.value("COMPATIBLE_MACHINE") == "(tegra)"
    assert bb.value("COMPATIBLE_MACHINE", "tegra210") == "(^$)"
    install = bb.tasks["do_install"]
    assert "${systemd_system_unitdir}/${GPU_K8S_NVIDIA_SETUP_UNIT}.d" in install
    assert bb.value("RDEPENDS", "${PN}") == "gpu-device-plugin nvidia-container-toolkit"
    platform = parse(LAYER / "classes/gpu_k8s_platform.bbclass")
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_MODE", "tegra234") == "csv"
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE", "tegra") == "gpu-k8s-nvidia-runtime-config"
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE", "tegra210") == ""
    tegra = parse(PACKAGEGROUP).words("RDEPENDS", "${PN}", "append", "tegra")
    assert "${GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE}" in tegra
