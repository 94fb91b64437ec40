"""Issue 26, the layer half: Jetson AGX Thor (tegra264) as meta-tegra wrynose provides it. Its
GPU runs on NVIDIA's open kernel driver (OpenRM), the container runtime is pinned to CSV mode
as on the Orin, a boot unit loads nvidia-uvm and makes the driver's device nodes (nothing else
does), and the A/B images get their data partition from the first flash on the t264 NVMe
layout, where it is partition 13."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
import tegra_layouts as tl
from bbfile import parse
from k3s_layer import resolve, with_classes
from layer_paths import LAYER, REPO
from test_orin_layer import NVFLASHXMLPARSE, class_assignments, unit

sys.path.insert(0, str(LAYER / "lib"))
from gpu_k8s import tegra_layout

PLATFORM = LAYER / "classes/gpu_k8s_platform.bbclass"
PACKAGEGROUP = LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb"
NODES_DIR = LAYER / "dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-nodes"
NODES_SCRIPT = NODES_DIR / "files/gpu-k8s-nvidia-nodes"
RUNTIME_CONFIG = (LAYER / "dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-runtime-config/"
                  "gpu-k8s-nvidia-runtime-config_1.0.bb")
# MACHINEOVERRIDES of jetson-agx-thor-devkit as meta-tegra composes them, least specific first
THOR = ("cuda", "tegra", "tegra264", "jetson-agx-thor-devkit")
ORIN = ("cuda", "tegra", "tegra234", "jetson-orin-nano-devkit-nvme")
NANO = ("cuda", "tegra", "tegra210", "jetson-nano-devkit")


# ---------------------------------------------------------------- the GPU stack


def platform(var: str, overrides: tuple[str, ...]) -> str:
    return resolve(parse(PLATFORM), var, overrides)


def test_thor_takes_the_r39_jetson_values_cgroup_v2_the_toolkits_runtime_and_driver_only_cuda():
    assert platform("GPU_K8S_CGROUP_V1", THOR) == "0"
    assert platform("GPU_K8S_CGROUP_DRIVER", THOR) == "systemd"
    assert platform("GPU_K8S_NVIDIA_RUNTIME_PACKAGE", THOR) == "nvidia-container-toolkit"
    assert platform("GPU_K8S_NVIDIA_SETUP_UNIT", THOR) == "nvidia-container-setup.service"
    # R39's drivers.csv hands pods libcuda, NVML and the JIT compiler, never libcudart
    assert platform("GPU_K8S_DEFAULT_CUDA", THOR) == "driver"
    assert platform("GPU_K8S_DEFAULT_KUBELET_PROFILE", THOR) == "default"
    assert platform("GPU_K8S_DEFAULT_DISABLE_NETWORK_POLICY", THOR) == "0"


def test_the_runtime_is_pinned_to_csv_on_thor_as_on_the_orin_and_isolates():
    assert platform("GPU_K8S_NVIDIA_RUNTIME_MODE", THOR) == platform("GPU_K8S_NVIDIA_RUNTIME_MODE", ORIN) == "csv"
    assert platform("GPU_K8S_NVIDIA_RUNTIME_CONFIG_PACKAGE", THOR) == "gpu-k8s-nvidia-runtime-config"
    recipe = with_classes(parse(RUNTIME_CONFIG), "gpu_k8s_platform")
    store = {"GPU_K8S_GPU_ISOLATION": "1", "GPU_K8S_NVIDIA_RUNTIME_MODE": platform("GPU_K8S_NVIDIA_RUNTIME_MODE", THOR)}

    class Data:
        def getVar(self, name: str) -> str:  # bitbake's name
            return store[name]

    settings = re.sub(r"\$\{@(.*?)\}", lambda m: eval(m.group(1), {"d": Data()}),
                      recipe.value("GPU_K8S_RUNTIME_SETTINGS"))
    assert settings.replace("\\\n", " ").split() == [
        "--set", "accept-nvidia-visible-devices-envvar-when-unprivileged=false",
        "--set", "accept-nvidia-visible-devices-as-volume-mounts=true",
        "--set", "nvidia-container-runtime.mode=csv"]
    assert recipe.value("COMPATIBLE_MACHINE") == "(tegra)", "the drop-in is built for Thor too"


def test_the_node_unit_is_thors_alone_and_the_packagegroup_carries_it():
    assert platform("GPU_K8S_NVIDIA_NODES_PACKAGE", THOR) == "gpu-k8s-nvidia-nodes"
    assert platform("GPU_K8S_NVIDIA_NODES_PACKAGE", ORIN) == platform("GPU_K8S_NVIDIA_NODES_PACKAGE", NANO) == ""
    assert "${GPU_K8S_NVIDIA_NODES_PACKAGE}" in parse(PACKAGEGROUP).words("RDEPENDS", "${PN}", "append", "tegra")
    recipe = parse(NODES_DIR / "gpu-k8s-nvidia-nodes_1.0.bb")
    assert recipe.value("COMPATIBLE_MACHINE") == "(tegra264)"
    # nvidia-uvm.ko is meta-tegra's nvidia-kernel-oot package of that name (TEGRA_OOT_COMPUTE_DRIVERS)
    assert set(recipe.words("RDEPENDS", "${PN}")) == {"kmod", "nv-kernel-module-nvidia-uvm"}
    assert recipe.value("SYSTEMD_SERVICE", "${PN}") == "gpu-k8s-nvidia-nodes.service"


def test_thor_alone_gets_pynvml_for_its_gpu_utilization():
    """Thor's open driver answers NVML and has no nvgpu load file: the plugin reads DCGM_FI_DEV_GPU_UTIL
    through pynvml (metrics/tegra.py), which only the x86 stack installed before."""
    assert platform("GPU_K8S_NVML_PYTHON_PACKAGE", THOR) == "python3-nvidia-ml-py"
    assert platform("GPU_K8S_NVML_PYTHON_PACKAGE", ORIN) == platform("GPU_K8S_NVML_PYTHON_PACKAGE", NANO) == ""
    assert "${GPU_K8S_NVML_PYTHON_PACKAGE}" in parse(PACKAGEGROUP).words("RDEPENDS", "${PN}", "append", "tegra")
    recipe = parse(LAYER / "recipes-devtools/python3-nvidia-ml-py/python3-nvidia-ml-py_13.580.126.bb")
    assert "allarch" in recipe.inherits  # one pure-Python module: the same package on aarch64


def test_the_nodes_exist_before_anything_hands_the_gpu_out_and_nothing_waits_on_a_failure():
    service = unit(NODES_DIR / "files/gpu-k8s-nvidia-nodes.service")
    before = service["Unit"]["Before"].split()
    assert {"docker.service", "containerd.service", "k3s.service", "k3s-agent.service",
            "gpu-device-plugin.service"} <= set(before)
    # meta-tegra loads nvidia.ko in systemd-modules-load's ExecStartPost (nv-load-display-modules)
    assert service["Unit"]["After"] == "systemd-modules-load.service"
    assert service["Service"]["Type"] == "oneshot"
    assert "RemainAfterExit" not in service["Service"], "udev could not start a unit that stays active again"
    assert service["Service"]["ExecStart"] == "@LIBEXECDIR@/gpu-k8s/gpu-k8s-nvidia-nodes"
    assert "s#@LIBEXECDIR@#${libexecdir}#g" in parse(NODES_DIR / "gpu-k8s-nvidia-nodes_1.0.bb").tasks["do_install"]
    for other in LAYER.rglob("*.service"):
        assert not re.search(r"^(Requires|BindsTo)=.*gpu-k8s-nvidia-nodes", other.read_text(), re.M), other
    rule = (NODES_DIR / "files/71-gpu-k8s-nvidia-nodes.rules").read_text()
    assert re.search(r'^ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia_uvm", TAG\+="systemd", '
                     r'ENV\{SYSTEMD_WANTS\}\+="gpu-k8s-nvidia-nodes.service"$', rule, re.M)


# ---------------------------------------------------------------- the node unit's script

PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
 10 misc
{gpu_major:>3} {gpu_name}
234 nvidia-caps
{uvm_major:>3} nvidia-uvm

Block devices:
  7 loop
259 blkext
"""
# /proc/driver/nvidia/gpus/<bus>/information as the driver writes it (tab-aligned)
INFORMATION = "Model: \t\t NVIDIA Thor\nBus Location: \t 0000:01:00.0\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
# Stand-ins at the OS boundary: mknod cannot run unprivileged, so it writes what it was asked
# for ("c MAJOR MINOR") into a plain file, and stat answers for such files as for a device node.
FAKE_TOOLS = {
    "modprobe": 'echo "modprobe $*" >>"$CALLS"\n'
                '[ -z "${MODPROBE_FAILS:-}" ] || { echo "$MODPROBE_FAILS" >&2; exit 1; }',
    "mknod": textwrap.dedent("""\
        echo "mknod $*" >>"$CALLS"
        [ "$1" = -m ] && shift 2
        printf 'c %s %s\\n' "$3" "$4" >"$1\""""),
    "stat": textwrap.dedent("""\
        format=$3; path=$4
        [ -f "$path" ] || exit 1
        set -- $(cat "$path")
        [ "$1" = c ] || { echo "regular file"; exit 0; }
        case "$format" in
            %F) echo "character special file" ;;
            *) printf '%x %x\\n' "$2" "$3" ;;
        esac"""),
}


@pytest.fixture
def thor(tmp_path: Path):
    proc, dev, bin_dir = tmp_path / "proc", tmp_path / "dev", tmp_path / "bin"
    for path in (proc, dev, bin_dir):
        path.mkdir()
    for name, body in FAKE_TOOLS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GPU_K8S_PROC": str(proc), "GPU_K8S_DEV": str(dev),
           "CALLS": str(tmp_path / "calls")}

    def driver(gpu_major: int = 195, uvm_major: int = 509, gpu_name: str = "nvidia", minors: tuple = (0,)) -> None:
        (proc / "devices").write_text(PROC_DEVICES.format(gpu_major=gpu_major, gpu_name=gpu_name,
                                                          uvm_major=uvm_major))
        for index, minor in enumerate(minors):
            info = proc / f"driver/nvidia/gpus/0000:0{index + 1}:00.0/information"
            info.parent.mkdir(parents=True, exist_ok=True)
            info.write_text(INFORMATION.format(minor=minor))

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", str(NODES_SCRIPT)], env={**env, **extra}, capture_output=True,
                              text=True, timeout=30)

    def calls() -> list[str]:
        path = Path(env["CALLS"])
        return path.read_text().splitlines() if path.exists() else []

    def nodes() -> dict[str, str]:
        return {path.name: path.read_text().strip() for path in sorted(dev.iterdir())}

    return SimpleNamespace(driver=driver, run=run, calls=calls, nodes=nodes)


def test_a_booting_thor_gets_nvidia_uvm_loaded_and_every_node_cuda_opens(thor) -> None:
    thor.driver()
    result = thor.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert thor.calls()[0] == "modprobe nvidia-uvm", "the module first: its major exists only once it is loaded"
    # the majors /proc/devices gives; minors as NVIDIA's driver fixes them (ctl 255, modeset 254, uvm 0/1)
    assert thor.nodes() == {"nvidia0": "c 195 0", "nvidiactl": "c 195 255", "nvidia-modeset": "c 195 254",
                            "nvidia-uvm": "c 509 0", "nvidia-uvm-tools": "c 509 1"}
    assert all(" -m 0666 " in f" {call} " for call in thor.calls() if call.startswith("mknod"))
    assert "made: nvidia0 nvidiactl nvidia-modeset nvidia-uvm nvidia-uvm-tools" in result.stdout


def test_a_second_run_keeps_current_nodes_and_a_reloaded_module_gets_its_nodes_again(thor) -> None:
    thor.driver()
    assert thor.run().returncode == 0
    again = thor.run()
    assert again.returncode == 0 and "made: none, all current" in again.stdout
    assert sum(call.startswith("mknod") for call in thor.calls()) == 5
    thor.driver(uvm_major=508)  # nvidia-uvm unloaded and loaded again: a new dynamic major
    assert "made: nvidia-uvm nvidia-uvm-tools" in thor.run().stdout
    assert thor.nodes()["nvidia-uvm"] == "c 508 0" and thor.nodes()["nvidia0"] == "c 195 0"


def test_every_gpu_the_driver_lists_gets_its_node_and_the_old_frontend_name_is_read(thor) -> None:
    thor.driver(gpu_name="nvidia-frontend", minors=(0, 1))  # open driver releases before 545 named the major so
    assert thor.run().returncode == 0
    assert thor.nodes()["nvidia0"] == "c 195 0" and thor.nodes()["nvidia1"] == "c 195 1"


def test_a_uvm_module_that_does_not_load_fails_the_unit_with_the_kernels_words_and_makes_nothing(thor) -> None:
    thor.driver()
    result = thor.run(MODPROBE_FAILS="modprobe: ERROR: could not insert 'nvidia_uvm': Unknown symbol in module")
    assert result.returncode == 1
    assert "Unknown symbol in module" in result.stdout and "dmesg" in result.stdout
    assert [call for call in thor.calls() if call.startswith("mknod")] == [] and thor.nodes() == {}


def test_no_driver_in_proc_devices_is_named_and_nothing_is_made(thor, tmp_path) -> None:
    (tmp_path / "proc/devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n  7 loop\n")
    result = thor.run()
    assert result.returncode == 1
    assert "the NVIDIA driver is not loaded" in result.stdout and "lsmod | grep nvidia" in result.stdout
    assert thor.nodes() == {}


def test_a_driver_that_lists_no_gpu_fails_the_unit_instead_of_reporting_ready(thor) -> None:
    thor.driver(minors=())  # nvidia.ko and nvidia-uvm loaded, but no GPU probed
    result = thor.run()
    assert result.returncode == 1
    assert "lists no GPU with a device minor" in result.stdout
    assert "device nodes incomplete" in result.stdout and "device nodes ready" not in result.stdout
    assert "nvidia0" not in thor.nodes() and thor.nodes()["nvidia-uvm"] == "c 509 0"


def test_a_gpu_entry_without_a_device_minor_is_skipped_and_counts_for_nothing(thor, tmp_path) -> None:
    thor.driver(minors=())
    odd = tmp_path / "proc/driver/nvidia/gpus/0000:01:00.0/information"
    odd.parent.mkdir(parents=True)
    odd.write_text("Model: \t\t NVIDIA Thor\nDevice Minor: \t ?\n")
    result = thor.run()
    assert result.returncode == 1 and "names no device minor: skipped" in result.stdout
    assert not [name for name in thor.nodes() if name.startswith("nvidia") and name[6:].isdigit()]


def test_the_node_script_is_posix_sh() -> None:
    if not Path("/bin/dash").exists():
        pytest.skip("dash not installed")
    subprocess.run(["/bin/dash", "-n", str(NODES_SCRIPT)], check=True)
    assert os.access(NODES_SCRIPT, os.X_OK)


# ---------------------------------------------------------------- A/B: data partition and firmware


def t264_nvme_ab_layout() -> str:
    """NVIDIA's flash_l4t_t264_nvme_rootfs_ab.xml as its facts are: recovery kernel (id 3), ESPs
    and reserved areas, UDA and reserved ahead of APP (id 1) and APP_b (id 2); no kernel partitions
    on the NVMe (Thor boots them from the QSPI and the ESP)."""
    return tl.layout(tl.device("external", [
        tl.partition("master_boot_record", "protective_master_boot_record"),
        tl.partition("primary_gpt", "primary_gpt"),
        tl.partition("RECNAME", "kernel", pid=3, filename="RECFILE"),
        tl.partition("RECDTB-NAME", "kernel_dtb", filename="RECDTB_FILE"),
        tl.partition("esp", filename="ESP_FILE", attribute="0x8"),
        tl.partition("A_reserved_on_user"),
        tl.partition("RECNAME_alt", "kernel", filename="REC_ALT_FILE"),
        tl.partition("RECDTB-NAME_alt", "kernel_dtb", filename="RECDTB_ALT_FILE"),
        tl.partition("esp_alt", filename="ESP_ALT_FILE", attribute="0x8"),
        tl.partition("B_reserved_on_user"),
        tl.partition("UDA", size="419430400"),
        tl.partition("reserved"),
        tl.partition("APP", pid=1, filename="APPFILE", attribute="0x8", size="APPSIZE"),
        tl.partition("APP_b", pid=2, filename="APPFILE_b", attribute="0x8", size="APPSIZE"),
        tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"),
    ]))


def test_thors_data_partition_follows_app_b_as_partition_13_which_mender_mounts():
    result = tegra_layout.place_data_partition(t264_nvme_ab_layout(), "permanet_user_storage", 1 << 30)
    assert result is not None and (result.device, result.number, result.appended) == ("external", 13, True)
    assert str(result.number) == class_assignments()["MENDER_DATA_PART_NUMBER:tegra264"]
    numbers = tegra_layout.partition_numbers(result.text)["external"]
    # meta-mender-tegra-common's own tegra264 default, 11, is NVIDIA's UDA ahead of the slots
    assert (numbers["UDA"], numbers["reserved"], numbers["APP"], numbers["APP_b"]) == (11, 12, 1, 2)
    names = [p.get("name") for p in ET.fromstring(result.text).iter("partition")]
    assert names[names.index("APP_b") + 1] == "permanet_user_storage"
    assert tegra_layout.datafile_partitions(result.text) == ["permanet_user_storage"]


def test_thors_qspi_template_gets_no_data_partition():
    assert tegra_layout.place_data_partition(tl.layout(tl.qspi_device()), "permanet_user_storage", 1 << 30) is None


@pytest.mark.skipif(not NVFLASHXMLPARSE.is_file(), reason="meta-tegra wrynose work tree (yocto-parse) not here")
def test_meta_tegras_own_parser_numbers_thors_data_partition_as_we_do(tmp_path):
    placed = tegra_layout.place_data_partition(t264_nvme_ab_layout(), "permanet_user_storage", 1 << 30)
    path = tmp_path / "layout.xml"
    path.write_text(placed.text.replace("NUM_SECTORS", "2000409264").replace("APPSIZE", "26843545600"))
    out = subprocess.run([sys.executable, str(NVFLASHXMLPARSE), "-t", "external", str(path)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    line = next(row for row in out.splitlines() if 'partname="permanet_user_storage"' in row)
    assert "partnumber=13;" in line and 'partfile="DATAFILE"' in line and "partfilltoend=1" in line
    assert re.search(r'partnumber=11;[^\n]*partname="UDA"', out)


def test_thor_boots_without_uboot_grows_its_data_and_keeps_the_t26x_capsule_guid():
    values = class_assignments()
    assert "mender-uboot" in values["MENDER_FEATURES_DISABLE:append:tegra264"].split()
    assert int(values["MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra264"]) >= 512
    # meta-tegra docs/UEFI-Capsule-Update.md: the t26x "general" configuration's GUID
    assert values["TEGRA_UEFI_SYSTEM_IMAGE_TYPE_GUID:tegra264"] == "3c834404-d2d7-4912-8c1c-6e850b5f2824"


def test_thors_kernel_gets_the_tegra_watchdog_with_the_ab_class():
    watchdog = parse(LAYER / "classes/gpu_k8s_mender_watchdog.bbclass")
    assert watchdog.words("SRC_URI", "append", "tegra264") == ["file://gpu-k8s-watchdog-tegra.cfg"]
    assert (LAYER / "dynamic-layers/mender-tegra/recipes-kernel/watchdog/files/gpu-k8s-watchdog-tegra.cfg").is_file()


@pytest.mark.parametrize("machine", ["jetson-agx-thor", "jetson-agx-thor-t4000"])
def test_a_thor_build_without_keys_is_refused_before_kas_starts(machine, tmp_path):
    # the Thor kas file includes the A/B setup, and the T4000's colon-joined override keeps it
    from tools.image import build, preflight
    kas_file = preflight.kas_paths(build.MACHINES[machine].kas_file, root=REPO)
    problem = preflight.signing_problem(kas_file, "gpu-k8s-image", {}, tmp_path / "site.conf")
    assert "MENDER_ARTIFACT_SIGNING_KEY and MENDER_ARTIFACT_VERIFY_KEY are not set" in problem
