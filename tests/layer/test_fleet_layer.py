"""Issue 9, the layer half: Mender A/B kas includes and pins, the opt-in class, node state
on the data partition, the watchdog, artifact signing, the system-upgrade-controller."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from bbfile import parse
from layer_paths import KAS, LAYER, REPO
from test_kas import SERIES_OF, merged

sys.path.insert(0, str(LAYER / "lib"))
from gpu_k8s import signing
from gpu_k8s.signing import signing_problems

CLASS = LAYER / "classes/gpu_k8s_mender.bbclass"
DATA_DIR = LAYER / "recipes-core/gpu-k8s-data"
SUC_DIR = LAYER / "recipes-fleet/gpu-k8s-system-upgrade"
# meta-mender per series (kas/include/<series>.yml)
MENDER_PIN = {
    "kirkstone": "0dd0a7d12ab8c435d1164dfc441ecfa3669a922a",
    "scarthgap": "7412e59dd5da65f33ec853a42951097be0b62d7c",
    "wrynose": "7812c18483fab33c10f1aaea59a21bf1dbfefdec",
}
# meta-mender-community per Jetson build: the Nano's kirkstone jetpack4 layer, the Orin's
# wrynose native scheme (common + native + jetpack7; tests/layer/test_orin_layer.py)
COMMUNITY = {
    "jetson-nano.yml": ("kirkstone", "1d98cc9391e57a6f9cdf8df9cfc6f266b85dca6c",
                        {"meta-mender-tegra/meta-mender-tegra-jetpack4"}),
    "jetson-orin-nano.yml": ("wrynose", "f6860e099fe97260612380dd0092e854831bd9c0",
                             {"meta-mender-tegra/meta-mender-tegra-common",
                              "meta-mender-tegra/meta-mender-tegra-native",
                              "meta-mender-tegra/meta-mender-tegra-jetpack7"}),
}


# ---------------------------------------------------------------- kas


@pytest.mark.parametrize(
    ("name", "mender_layers"),
    [
        ("jetson-nano.yml", {"meta-mender-core"}),
        ("jetson-orin-nano.yml", {"meta-mender-core"}),
        ("x86-64.yml", {"meta-mender-core"}),
        ("qemu-x86-64.yml", {"meta-mender-core", "meta-mender-qemu"}),
        ("x86-64-scarthgap.yml", {"meta-mender-core"}),
    ],
)
def test_each_build_gets_the_mender_layers_its_machine_needs(name, mender_layers):
    repos = merged(KAS / name)["repos"]
    series = SERIES_OF[name]
    assert (repos["meta-mender"]["branch"], repos["meta-mender"]["commit"]) == (series, MENDER_PIN[series])
    assert set(repos["meta-mender"]["layers"]) == mender_layers
    if name in COMMUNITY:
        branch, pin, layers = COMMUNITY[name]
        community = repos["meta-mender-community"]
        assert (community["branch"], community["commit"], set(community["layers"])) == (branch, pin, layers)
    else:
        assert "meta-mender-community" not in repos, f"{name}: meta-mender-tegra is for Jetson builds only"


@pytest.mark.parametrize("name", sorted(SERIES_OF))
def test_each_build_opts_into_the_ab_class_and_takes_keys_only_from_the_environment(name):
    conf = merged(KAS / name)
    text = "\n".join(conf["local_conf_header"].values())
    assert re.search(r'^INHERIT \+= "gpu_k8s_mender"$', text, re.M), f"{name}: no INHERIT of gpu_k8s_mender"
    assert "KEY" not in text, f"{name}: signing keys belong in the environment or site.conf, not a kas file"
    env = conf.get("env", {})
    for var in ("MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY", "GPU_K8S_VERSION"):
        assert var in env and env[var] is None, f"{name}: {var} must pass through from the environment, unset"


def test_no_file_in_the_repository_is_a_private_key():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in tracked.split():
        path = REPO / rel
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert b"PRIVATE KEY-----" not in path.read_bytes() or rel.startswith("tests/"), f"{rel} holds a key"


# ---------------------------------------------------------------- the opt-in class


def class_assignments() -> dict[str, str]:
    bb = parse(CLASS)
    return {":".join((a.var, *a.overrides)): a.value for a in bb.assignments}


def test_the_class_builds_on_mender_full_and_the_series_tegra_scheme_only_on_jetson():
    text = CLASS.read_text()
    assert re.search(r"^inherit mender-full$", text, re.M)
    # which scheme, per series and only on tegra: tests/layer/test_orin_layer.py runs the function
    assert re.search(r"^inherit \$\{@gpu_k8s_tegra_mender_class\(d\)\}$", text, re.M)
    assert "tegra-mender-setup" not in re.sub(r"#.*", "", text), "the class name lives in conf/series/"


def test_the_jetson_initramfs_images_keep_their_own_image_types():
    values = class_assignments()
    assert values["IMAGE_FSTYPES:pn-tegra-minimal-initramfs:tegra"] == "${INITRAMFS_FSTYPES}"
    assert values["IMAGE_FSTYPES:pn-tegra-initrd-flash-initramfs:tegra"] == "${TEGRA_INITRD_FLASH_INITRAMFS_FSTYPES}"


def test_x86_64_partitions_are_found_by_distinct_fixed_partuuids():
    values = class_assignments()
    assert "mender-partuuid" in values["MENDER_FEATURES_ENABLE:append:genericx86-64"].split()
    assert values["MENDER_STORAGE_DEVICE:genericx86-64"] == "", "mender warns when a device is set with partuuid"
    parts = [values[f"MENDER_{p}:genericx86-64"] for p in ("BOOT_PART", "ROOTFS_PART_A", "ROOTFS_PART_B", "DATA_PART")]
    ids = [p.removeprefix("/dev/disk/by-partuuid/") for p in parts]
    assert all(p.startswith("/dev/disk/by-partuuid/") for p in parts)
    assert len({str(uuid.UUID(i)) for i in ids}) == 4


def test_disk_sizes_leave_room_for_two_root_slots_and_container_images():
    values = class_assignments()
    for machine in ("genericx86-64", "qemux86-64"):
        total = int(values[f"MENDER_STORAGE_TOTAL_SIZE_MB_DEFAULT:{machine}"])
        data = int(values[f"MENDER_DATA_PART_SIZE_MB_DEFAULT:{machine}"])
        root_slot = (total - 16 - data) // 2  # 16 MiB EFI partition
        assert root_slot >= 1536, f"{machine}: a root slot of {root_slot} MiB is too small for the node image"
        assert data >= 1024, f"{machine}: the data partition holds docker's images, {data} MiB is too small"
    assert int(values["MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra"]) >= 3072


def test_standalone_mode_keeps_the_mender_daemons_off():
    values = class_assignments()
    assert values["SYSTEMD_AUTO_ENABLE:pn-mender"] == "disable"
    assert values["PREFERRED_RPROVIDER_mender-update"] == "mender", "the C++ client has the mender-update command"


def test_the_artifact_name_is_the_release_version():
    values = class_assignments()
    assert values["MENDER_ARTIFACT_NAME"] == "${GPU_K8S_VERSION}"


def test_signing_is_checked_before_the_rootfs_and_the_artifact_are_made():
    text = CLASS.read_text()
    assert re.search(r"^do_rootfs\[prefuncs\] \+= \"\$\{GPU_K8S_ARTIFACT_SIGNING_CHECK\}\"$", text, re.M)
    assert "gpu_k8s_check_artifact_signing" in class_assignments()["GPU_K8S_ARTIFACT_SIGNING_CHECK"]
    assert re.search(r'^do_image_mender\[prefuncs\] \+= "gpu_k8s_check_artifact_signing"$', text, re.M)
    values = class_assignments()
    assert values["GPU_K8S_ARTIFACT_SIGNING"] == "required"
    assert values["GPU_K8S_ARTIFACT_SIGNING:pn-gpu-k8s-image-dev"] == "optional"


def test_adding_the_layer_alone_changes_no_other_recipe():
    # Without INHERIT += "gpu_k8s_mender" the gpu-k8s-mender override is never set.
    for append in (LAYER / "recipes-kernel/watchdog/linux-yocto_%.bbappend",
                   LAYER / "dynamic-layers/mender/recipes-bsp/grub-mender-grubenv/grub-mender-grubenv_%.bbappend"):
        assert re.search(r"^inherit \$\{@bb\.utils\.contains\('DISTRO_FEATURES', 'gpu-k8s-mender', ",
                         append.read_text(), re.M), f"{append.name} must change its recipe only with the A/B class"
    pg = parse(LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb")
    ab = pg.words("RDEPENDS", "${PN}", "append", "gpu-k8s-mender")
    assert {"gpu-k8s-data", "gpu-k8s-watchdog", "gpu-k8s-system-upgrade-images", "gpu-k8s-update"} <= set(ab)
    assert not {"gpu-k8s-data", "gpu-k8s-watchdog"} & set(pg.words("RDEPENDS", "${PN}"))


# ---------------------------------------------------------------- watchdog


def test_systemd_arms_the_hardware_watchdog():
    conf = configparser.ConfigParser()
    conf.read(LAYER / "recipes-core/gpu-k8s-watchdog/files/60-gpu-k8s-watchdog.conf")
    runtime = conf["Manager"]["RuntimeWatchdogSec"]
    assert runtime.endswith("s") and 0 < int(runtime[:-1]) <= 60, "reset a hung node within a minute"
    assert conf["Manager"]["RebootWatchdogSec"]
    recipe = parse(LAYER / "recipes-core/gpu-k8s-watchdog/gpu-k8s-watchdog_1.0.bb")
    assert "${systemd_unitdir}/system.conf.d" in recipe.tasks["do_install"], "a vendor drop-in, not /etc"


def test_the_qemu_kernel_has_the_watchdog_the_smoke_test_adds():
    cfg = (LAYER / "recipes-kernel/watchdog/files/gpu-k8s-watchdog-x86.cfg").read_text()
    assert re.search(r"^CONFIG_I6300ESB_WDT=y$", cfg, re.M)
    watchdog = parse(LAYER / "classes/gpu_k8s_mender_watchdog.bbclass")
    assert watchdog.words("SRC_URI", "append", "x86-64") == ["file://gpu-k8s-watchdog-x86.cfg"]


# ---------------------------------------------------------------- node state on /data


def persist_list() -> dict[str, str]:
    entries = {}
    for line in (DATA_DIR / "files/persist.list").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, path = line.split()
            entries[name] = path
    return entries


def test_everything_a_slot_switch_must_keep_is_on_the_data_partition():
    paths = set(persist_list().values())
    assert {"/var/lib/docker", "/var/lib/rancher/k3s", "/etc/rancher/node", "/var/lib/gpu-k8s"} <= paths


def test_docker_and_k3s_never_start_without_their_state_bound():
    unit = configparser.ConfigParser(strict=False)
    unit.read(DATA_DIR / "files/gpu-k8s-data.service")
    before = unit["Unit"]["Before"].split()
    assert {"docker.service", "k3s.service", "k3s-agent.service", "local-fs.target"} <= set(before)
    assert unit["Unit"]["RequiresMountsFor"] == "/data"
    dropin = configparser.ConfigParser()
    dropin.read(DATA_DIR / "files/10-gpu-k8s-data.conf")
    assert dropin["Unit"]["Requires"] == "gpu-k8s-data.service"
    recipe = parse(DATA_DIR / "gpu-k8s-data_1.0.bb")
    assert set(recipe.words("GPU_K8S_DATA_REQUIRED_BY")) == {"docker.service", "k3s.service", "k3s-agent.service"}
    assert "${systemd_system_unitdir}/$unit.d" in recipe.tasks["do_install"], "vendor drop-ins, not /etc"


class DataRun:
    """The real gpu-k8s-data script under a root prefix, with a mount that only records."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.root.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.calls = tmp_path / "mount.calls"
        fake_mount = bin_dir / "mount"
        fake_mount.write_text(f'#!/bin/sh\necho "$@" >> {self.calls}\n')
        fake_mount.chmod(0o755)
        self.mountinfo = tmp_path / "mountinfo"
        self.mounted(["/", "/data"])
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_K8S_ROOT": str(self.root),
                    "GPU_K8S_PERSIST_LIST": str(DATA_DIR / "files/persist.list"),
                    "GPU_K8S_NODE_CONFIG_LIST": str(DATA_DIR / "files/node-config.list"),
                    "GPU_K8S_MOUNTINFO": str(self.mountinfo)}

    def mounted(self, points: list[str]) -> None:
        self.mountinfo.write_text("".join(f"{20 + i} 1 8:1 / {p} rw - ext4 /dev/x rw\n" for i, p in enumerate(points)))

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(DATA_DIR / "files/gpu-k8s-data.sh"), *args], env=self.env,
                              capture_output=True, text=True, timeout=30)

    def new_slot(self) -> None:
        """An A/B update: a fresh root filesystem from the image; /data stays."""
        for child in self.root.iterdir():
            if child.name != "data":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()

    def mounts(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def test_first_boot_seeds_the_data_partition_from_the_image_and_binds_it(tmp_path):
    run = DataRun(tmp_path)
    shipped = run.root / "var/lib/rancher/k3s/agent/images"
    shipped.mkdir(parents=True)
    (shipped / "pause.tar").write_text("image")
    result = run.run()
    assert result.returncode == 0, result.stderr
    seeded = run.root / "data/gpu-k8s/rancher-k3s/agent/images/pause.tar"
    assert seeded.read_text() == "image", "what the image ships must be on /data before it is hidden"
    binds = {line.split()[-1]: line.split()[-2] for line in run.mounts()}
    assert binds[str(run.root / "var/lib/rancher/k3s")] == str(run.root / "data/gpu-k8s/rancher-k3s")
    assert len(binds) == len(persist_list())
    assert all(line.startswith("--bind ") for line in run.mounts())


def test_a_later_boot_keeps_the_data_partition_copy(tmp_path):
    run = DataRun(tmp_path)
    kept = run.root / "data/gpu-k8s/rancher-node"
    kept.mkdir(parents=True)
    (kept / "password").write_text("from the first slot")
    (run.root / "etc/rancher/node").mkdir(parents=True)
    (run.root / "etc/rancher/node/password").write_text("from the new image")
    assert run.run().returncode == 0
    assert (kept / "password").read_text() == "from the first slot"


def test_paths_already_bound_are_left_alone(tmp_path):
    run = DataRun(tmp_path)
    run.mounted(["/", "/data", *persist_list().values()])
    result = run.run()
    assert result.returncode == 0 and run.mounts() == []
    assert "already bound" in result.stdout


def node_config_list() -> dict[str, tuple[str, str]]:
    entries = {}
    for line in (DATA_DIR / "files/node-config.list").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, path, *flag = line.split()
            entries[name] = (path, flag[0] if flag else "")
    return entries


def test_everything_that_provisions_a_node_is_kept_but_no_image_drop_in():
    paths = {path for path, _ in node_config_list().values()}
    assert {"/etc/rancher/k3s/config.yaml", "/etc/rancher/k3s/token", "/etc/default/k3s", "/etc/default/k3s-agent",
            "/etc/gpu-device-plugin/config.yaml", "/etc/default/gpu-k8s-update"} <= paths
    image_dropins = {"10-gpu-k8s-runtime.yaml", "20-gpu-k8s-kubelet.yaml", "60-gpu-k8s-gpu-labels.yaml"}
    assert not {Path(path).name for path in paths} & image_dropins, "the layer's drop-ins come from the new slot"
    assert not any(path.startswith(("/usr", "/lib")) for path in paths)


def provision_agent(root: Path) -> None:
    """What docs/layer.md "Joining a cluster" tells a person to do on an agent."""
    (root / "etc/rancher/k3s").mkdir(parents=True, exist_ok=True)
    (root / "etc/rancher/k3s/token").write_text("K10secret\n")
    (root / "etc/rancher/k3s/config.yaml").write_text(
        "server: https://server:6443\ntoken-file: /etc/rancher/k3s/token\n")


def image_slot(root: Path, plugin_default: str = "resources: 1\n") -> None:
    """What the image ships in /etc: the layer's drop-ins and the plugin's default config."""
    (root / "etc/rancher/k3s/config.yaml.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/rancher/k3s/config.yaml.d/10-gpu-k8s-runtime.yaml").write_text("docker: true\n")
    (root / "etc/gpu-device-plugin").mkdir(parents=True, exist_ok=True)
    (root / "etc/gpu-device-plugin/config.yaml").write_text(plugin_default)


def test_an_agent_provisioned_as_documented_is_the_same_agent_on_the_new_slot(tmp_path):
    run = DataRun(tmp_path)
    image_slot(run.root)
    assert run.run().returncode == 0
    provision_agent(run.root)  # written after boot, through no link: regular files on the slot
    stop = run.run("--adopt")  # the update's reboot stops the unit
    assert stop.returncode == 0, stop.stderr
    run.new_slot()
    image_slot(run.root)
    boot = run.run()
    assert boot.returncode == 0, boot.stderr
    config = run.root / "etc/rancher/k3s/config.yaml"
    assert config.is_symlink() and os.readlink(config) == "../../../data/gpu-k8s/node-config/k3s-config"
    kept = run.root / "data/gpu-k8s/node-config"
    assert (kept / "k3s-config").read_text().startswith("server: https://server:6443")
    assert (kept / "k3s-token").read_text() == "K10secret\n"
    assert (run.root / "etc/rancher/k3s/token").read_text() == "K10secret\n", "read through the link"
    dropin = run.root / "etc/rancher/k3s/config.yaml.d/10-gpu-k8s-runtime.yaml"
    assert not dropin.is_symlink(), "the image's drop-ins are the new slot's own"


def test_a_file_written_after_boot_is_kept_at_the_next_boot_even_without_a_clean_shutdown(tmp_path):
    run = DataRun(tmp_path)
    assert run.run().returncode == 0
    (run.root / "etc/default").mkdir(parents=True)
    (run.root / "etc/default/k3s-agent").write_text("K3S_URL=https://server:6443\n")
    assert run.run().returncode == 0  # a reboot on the same slot
    assert (run.root / "data/gpu-k8s/node-config/default-k3s-agent").read_text() == "K3S_URL=https://server:6443\n"
    assert (run.root / "etc/default/k3s-agent").is_symlink()


def test_an_edit_that_replaced_the_link_is_kept_not_reverted(tmp_path):
    run = DataRun(tmp_path)
    provision_agent(run.root)
    assert run.run().returncode == 0
    config = run.root / "etc/rancher/k3s/config.yaml"
    assert config.is_symlink()
    config.unlink()  # sed -i writes a new file in place of the link
    config.write_text("server: https://other:6443\n")
    assert run.run("--adopt").returncode == 0
    assert (run.root / "data/gpu-k8s/node-config/k3s-config").read_text() == "server: https://other:6443\n"
    assert config.is_symlink()


def test_nothing_is_linked_that_does_not_exist(tmp_path):
    """A dangling link in config.yaml.d would stop k3s (it reads every *.yaml there)."""
    run = DataRun(tmp_path)
    image_slot(run.root)
    assert run.run().returncode == 0
    assert not (run.root / "etc/rancher/k3s/config.yaml.d/90-local.yaml").is_symlink()
    assert not (run.root / "etc/rancher/k3s/config.yaml").exists()


def test_the_plugin_config_keeps_your_edit_and_takes_new_defaults_only_when_unchanged(tmp_path):
    run = DataRun(tmp_path)
    image_slot(run.root, "resources: 1\n")
    assert run.run().returncode == 0
    kept = run.root / "data/gpu-k8s/node-config/gpu-device-plugin"
    assert kept.read_text() == "resources: 1\n"
    # an update with a new default, never edited: the new default applies
    run.new_slot()
    image_slot(run.root, "resources: 2\n")
    assert run.run().returncode == 0
    assert kept.read_text() == "resources: 2\n"
    # edited through the link, then an update with yet another default: the edit wins
    (run.root / "etc/gpu-device-plugin/config.yaml").write_text("resources: 7\n")
    run.new_slot()
    image_slot(run.root, "resources: 3\n")
    result = run.run()
    assert result.returncode == 0
    assert kept.read_text() == "resources: 7\n"
    assert "kept your copy" in result.stdout
    assert (run.root / "data/gpu-k8s/node-config/.image/gpu-device-plugin").read_text() == "resources: 3\n"
    assert (run.root / "etc/gpu-device-plugin/config.yaml").read_text() == "resources: 7\n"


def test_without_the_data_partition_nothing_is_bound_and_the_unit_fails(tmp_path):
    run = DataRun(tmp_path)
    run.mounted(["/"])
    result = run.run()
    assert result.returncode == 1 and run.mounts() == []
    assert "/data is not mounted" in result.stderr
    assert not (run.root / "data").exists()


# ---------------------------------------------------------------- signing


def key_files(tmp_path: Path) -> tuple[str, str]:
    private, public = tmp_path / "signing.key", tmp_path / "verify.pem"
    private.write_text("-----BEGIN PRIVATE KEY-----\nMIG...\n-----END PRIVATE KEY-----\n")
    public.write_text("-----BEGIN PUBLIC KEY-----\nMFk...\n-----END PUBLIC KEY-----\n")
    return str(private), str(public)


def test_a_production_image_without_keys_stops_with_the_fix(tmp_path):
    problems = signing_problems("required", "", None)
    assert len(problems) == 1
    assert "MENDER_ARTIFACT_SIGNING_KEY and MENDER_ARTIFACT_VERIFY_KEY are not set" in problems[0]
    assert "openssl" in problems[0] and 'GPU_K8S_ARTIFACT_SIGNING = "off"' in problems[0]


def test_a_key_pair_passes(tmp_path):
    private, public = key_files(tmp_path)
    assert signing_problems("required", private, public) == []
    assert signing_problems("optional", private, public) == []


def test_a_private_key_is_never_taken_as_the_verify_key(tmp_path):
    private, _ = key_files(tmp_path)
    problems = signing_problems("required", private, private)
    assert any("is a private key and would be copied into the image" in p for p in problems)


def test_keys_that_do_not_exist_are_named(tmp_path):
    problems = signing_problems("required", str(tmp_path / "nope.key"), str(tmp_path / "nope.pem"))
    assert any("nope.key, which is not a file" in p for p in problems)
    assert any("nope.pem, which is not a file" in p for p in problems)


def test_the_debug_image_may_go_unsigned_but_not_half_signed(tmp_path):
    private, _ = key_files(tmp_path)
    assert signing_problems("optional", "", "") == []
    assert signing_problems("off", "", "") == []
    half = signing_problems("optional", private, "")
    assert half == ["MENDER_ARTIFACT_SIGNING_KEY is set but MENDER_ARTIFACT_VERIFY_KEY is not: set both, or neither"]


def test_a_relative_key_path_is_refused_with_the_fix(tmp_path):
    # bitbake runs mender-artifact and `install` in each task's own directory
    problems = signing_problems("required", "keys/signing.key", "/keys/verify.pem")
    assert problems == ["MENDER_ARTIFACT_SIGNING_KEY (keys/signing.key) is a relative path, which bitbake's tasks, "
                        "each run in a directory of its own, cannot find: give it as an absolute path"]


def test_the_verify_key_the_root_filesystem_holds_is_deployed_beside_the_manifest(tmp_path):
    """./task release checks each artifact against this record (tools/fleet/release.py)."""
    text = CLASS.read_text()
    assert re.search(r'^do_rootfs\[postfuncs\] \+= "gpu_k8s_deploy_verify_key"$', text, re.M)
    assert "${IMAGE_ROOTFS}${sysconfdir}/mender/artifact-verify-key.pem" in text, "the key the boards will hold"
    rootfs_key = tmp_path / "rootfs/etc/mender/artifact-verify-key.pem"
    rootfs_key.parent.mkdir(parents=True)
    rootfs_key.write_text("-----BEGIN PUBLIC KEY-----\n")
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for manifest, record in (("gpu-k8s-image-genericx86-64.rootfs-20261201.manifest",  # wrynose's IMAGE_NAME
                              "gpu-k8s-image-genericx86-64.rootfs-20261201.artifact-verify-key.pem"),
                             ("gpu-k8s-image-jetson-nano-devkit-20261201.rootfs.manifest",  # kirkstone's
                              "gpu-k8s-image-jetson-nano-devkit-20261201.rootfs.artifact-verify-key.pem")):
        link_name = manifest.split("-2026")[0]
        written = signing.deploy_verify_key(str(rootfs_key), str(deploy / manifest), str(deploy), link_name)
        assert written == str(deploy / record)
        assert (deploy / record).read_text() == rootfs_key.read_text()
        assert os.readlink(deploy / f"{link_name}.artifact-verify-key.pem") == record
    assert signing.deploy_verify_key(str(tmp_path / "none.pem"), str(deploy / "x.manifest"), str(deploy), "x") == ""


def test_a_new_verify_key_at_the_same_path_rebuilds_the_mender_package_instead_of_coming_from_sstate():
    append = LAYER / "dynamic-layers/mender/recipes-mender/mender-client/mender_%.bbappend"
    assert re.search(r"^inherit \$\{@bb\.utils\.contains\('DISTRO_FEATURES', 'gpu-k8s-mender', "
                     r"'gpu_k8s_mender_verify_key', '', d\)\}$", append.read_text(), re.M), "with the A/B class only"
    text = (LAYER / "classes/gpu_k8s_mender_verify_key.bbclass").read_text()
    expression = re.search(r'^do_install\[file-checksums\] \+= "\$\{@(.+)\}"$', text, re.M)
    assert expression, text

    class Data:
        def __init__(self, key: str) -> None:
            self.key = key

        def getVar(self, name: str) -> str:  # bitbake's name
            assert name == "MENDER_ARTIFACT_VERIFY_KEY"
            return self.key

    # bitbake's file-checksums entries are PATH:EXPECTED-TO-EXIST
    assert eval(expression[1], {"d": Data("/keys/verify.pem")}) == "/keys/verify.pem:True"
    assert eval(expression[1], {"d": Data("")}) == "", "no key: nothing to hash"


def test_an_unknown_signing_mode_is_refused():
    assert signing_problems("sometimes", "", "") == [
        'GPU_K8S_ARTIFACT_SIGNING must be one of required, optional, off, got "sometimes"'
    ]


# ---------------------------------------------------------------- system-upgrade-controller


def rendered_manifest() -> list[dict]:
    recipe = parse(next(SUC_DIR.glob("gpu-k8s-system-upgrade_*.bb")))
    version = recipe.path.stem.split("_")[1]
    text = (SUC_DIR / "files/system-upgrade-controller.yaml").read_text()
    text = text.replace("@SUC_IMAGE@", recipe.value("GPU_K8S_SUC_IMAGE").replace("${PV}", version))
    text = text.replace("@SUC_VERSION@", f"v{version}")
    k3s_version = parse(LAYER / "recipes-containers/k3s/k3s-line-1.36.inc").value("K3S_VERSION")
    text = text.replace("@KUBECTL_IMAGE@", recipe.value("GPU_K8S_SUC_KUBECTL_IMAGE").replace("${K3S_VERSION}",
                                                                                         k3s_version))
    assert "@" not in re.sub(r"#.*", "", text.replace("fieldPath: \"metadata.labels['upgrade", "")), "unfilled"
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_controller_is_v0_20_1_the_line_for_k3s_1_36():
    (deploy,) = [d for d in rendered_manifest() if d["kind"] == "Deployment"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "rancher/system-upgrade-controller:v0.20.1"
    assert container["imagePullPolicy"] == "IfNotPresent"


def test_jobs_never_pull_the_preloaded_upgrade_image():
    (env,) = [d for d in rendered_manifest() if d["kind"] == "ConfigMap"]
    assert env["data"]["SYSTEM_UPGRADE_JOB_IMAGE_PULL_POLICY"] == "IfNotPresent"
    assert int(env["data"]["SYSTEM_UPGRADE_JOB_ACTIVE_DEADLINE_SECONDS"]) >= 1800, "a Nano writes a GB to SD"
    assert env["data"]["SYSTEM_UPGRADE_JOB_KUBECTL_IMAGE"].startswith("rancher/kubectl:")


def test_the_drain_steps_kubectl_follows_the_k3s_line_and_air_gapped_archives_must_hold_it():
    (env,) = [d for d in rendered_manifest() if d["kind"] == "ConfigMap"]
    k3s_version = parse(LAYER / "recipes-containers/k3s/k3s-line-1.36.inc").value("K3S_VERSION")
    assert env["data"]["SYSTEM_UPGRADE_JOB_KUBECTL_IMAGE"] == f"rancher/kubectl:v{k3s_version}"
    recipe = parse(next(SUC_DIR.glob("gpu-k8s-system-upgrade_*.bb")))
    assert "recipes-containers/k3s/k3s_version.inc" in recipe.requires
    install = recipe.tasks["do_install"]
    assert "manifest.json" in install and "${GPU_K8S_SUC_KUBECTL_IMAGE}" in install


def test_the_controller_may_register_its_crd_and_drain_nodes():
    roles = {d["metadata"]["name"]: d for d in rendered_manifest() if d["kind"] == "ClusterRole"}
    rules = roles["system-upgrade-controller"]["rules"]
    assert any("customresourcedefinitions" in r["resources"] and "create" in r["verbs"] for r in rules)
    drainer = roles["system-upgrade-controller-drainer"]["rules"]
    assert any("pods/eviction" in r["resources"] for r in drainer)
    bindings = [d for d in rendered_manifest() if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert all(s["namespace"] == "system-upgrade" for b in bindings for s in b["subjects"])


def test_the_manifest_ships_only_to_servers_and_the_images_to_every_node():
    pg = parse(LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb")
    words = pg.words("RDEPENDS", "${PN}", "append", "gpu-k8s-mender")
    assert "gpu-k8s-system-upgrade-images" in words
    assert "${@'gpu-k8s-system-upgrade' if d.getVar('GPU_K8S_K3S_ROLE') == 'server' else ''}" in " ".join(words)


def fake_docker(tmp_path: Path, present: bool) -> tuple[dict, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker.calls"
    (bin_dir / "docker").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1 $2" = "image inspect" ] && exit {0 if present else 1}\n'
        '[ "$1 $2" = "save -o" ] && echo archive > "$3"\nexit 0\n'
    )
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def fleet_images_script(tmp_path: Path, archives: list[str]) -> Path:
    images = tmp_path / "share/gpu-k8s/images"
    (images / "fleet").mkdir(parents=True)
    for name in archives:
        (images / "fleet" / name).write_text("archive")
    script = tmp_path / "gpu-k8s-fleet-images"
    text = (SUC_DIR / "files/gpu-k8s-fleet-images.sh").read_text()
    script.write_text(text.replace("@DATADIR@", str(tmp_path / "share"))
                      .replace("@UPGRADE_IMAGE@", "localhost/gpu-k8s-upgrade:latest"))
    return script


def k3s_config(tmp_path: Path, docker: bool) -> dict:
    config = tmp_path / "k3s/config.yaml.d"
    config.mkdir(parents=True)
    (config / "10-gpu-k8s-runtime.yaml").write_text("docker: true\n" if docker else "default-runtime: nvidia\n")
    return {"K3S_CONFIG_DIR": str(tmp_path / "k3s"), "K3S_DATA_DIR": str(tmp_path / "k3s-data")}


def test_the_upgrade_image_is_imported_once_and_archives_are_loaded(tmp_path):
    script = fleet_images_script(tmp_path, ["system-upgrade-controller.tar"])
    env, calls = fake_docker(tmp_path, present=False)
    env.update(k3s_config(tmp_path, docker=True))
    assert subprocess.run(["sh", str(script)], env=env, capture_output=True, timeout=30).returncode == 0
    lines = calls.read_text().splitlines()
    assert any(line.startswith("import ") and line.endswith("localhost/gpu-k8s-upgrade:latest") for line in lines)
    assert any(line.startswith("load --input ") and "system-upgrade-controller.tar" in line for line in lines)


def test_with_k3s_containerd_the_images_go_where_k3s_imports_them(tmp_path):
    script = fleet_images_script(tmp_path, ["system-upgrade-controller.tar"])
    env, calls = fake_docker(tmp_path, present=False)
    env.update(k3s_config(tmp_path, docker=False))
    result = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    images = tmp_path / "k3s-data/agent/images"
    linked = images / "system-upgrade-controller.tar"
    assert linked.is_symlink() and linked.resolve() == tmp_path / "share/gpu-k8s/images/fleet" / linked.name
    saves = [line for line in calls.read_text().splitlines() if line.startswith("save ")]
    assert saves == [f"save -o {images}/gpu-k8s-upgrade.tar.tmp localhost/gpu-k8s-upgrade:latest"]
    assert not [line for line in calls.read_text().splitlines() if line.startswith("load")]


def test_an_upgrade_image_already_there_is_not_imported_again(tmp_path):
    script = fleet_images_script(tmp_path, [])
    env, calls = fake_docker(tmp_path, present=True)
    env.update(k3s_config(tmp_path, docker=True))
    assert subprocess.run(["sh", str(script)], env=env, capture_output=True, timeout=30).returncode == 0
    assert not [line for line in calls.read_text().splitlines() if line.startswith(("import", "load"))]


def test_grub_boots_the_slots_with_the_kernel_arguments_of_the_wic_entry():
    append = LAYER / "dynamic-layers/mender/recipes-bsp/grub-mender-grubenv/grub-mender-grubenv_%.bbappend"
    words = parse(LAYER / "classes/gpu_k8s_mender_grubenv.bbclass").words("SRC_URI", "append", "x86-64")
    assert words == ["file://07_gpu_k8s_bootargs_grub.cfg;subdir=git"], "the grubenv Makefile reads NN_*_grub.cfg"
    cfg = (append.parent / "files/07_gpu_k8s_bootargs_grub.cfg").read_text()
    image = (LAYER / "recipes-core/images/gpu-k8s-image.inc").read_text()
    wic_args = re.search(r'^APPEND:append:x86-64 = "([^"]*)"', image, re.M).group(1).split()
    for arg in wic_args:
        assert re.search(rf'^set bootargs="\$\{{bootargs\}} .*{re.escape(arg)}', cfg, re.M), f"GRUB lacks {arg}"


def test_a_job_outlives_every_reboot_the_agent_may_take_before_its_verdict():
    """Every reboot kills the job's pod and Kubernetes counts it as a failure: the update's own
    reboot, and on an Orin or Thor up to MAX_SWITCH_REBOOTS more while a staged capsule waits.
    A lower limit ends the job as BackoffLimitExceeded before the agent can say 'rolled back'."""
    sys.path.insert(0, str(REPO / "updater" / "src"))
    try:
        from gpu_k8s_update.decide import MAX_SWITCH_REBOOTS
    finally:
        sys.path.remove(str(REPO / "updater" / "src"))
    (env,) = [d for d in rendered_manifest() if d["kind"] == "ConfigMap"]
    killed_pods = 1 + MAX_SWITCH_REBOOTS
    assert int(env["data"]["SYSTEM_UPGRADE_JOB_BACKOFF_LIMIT"]) >= killed_pods + 1, (
        "the pod that gives the verdict must still be allowed to run")
