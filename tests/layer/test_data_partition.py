"""Issue 33, defects 6, 8 and 9: slot verification that cannot lose a race, a /data that cannot
brick a board, and a node that keeps its identity across updates.

The check script runs at the OS boundary: the real e2fsck, mke2fs and blkid on image files that
stand in for the partition, stand-ins for mount/umount (nothing is mounted on this host). The
fstab line goes through the real systemd-fstab-generator where the host has it. Unit ordering is
read as systemd reads units and drop-ins (systemd_units.py) and, where the host has it, verified
by systemd-analyze."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import systemd_units as su
from bbfile import parse
from layer_paths import LAYER

sys.path.insert(0, str(LAYER / "lib"))
from gpu_k8s import data_mount

DATA_DIR = LAYER / "recipes-core/gpu-k8s-data"
FILES = DATA_DIR / "files"
CHECK = FILES / "gpu-k8s-data-check.sh"
VERIFY = LAYER / "dynamic-layers/mender-tegra/recipes-mender/tegra-rootfs-update-module"
VERIFY_CLASS = LAYER / "classes/gpu_k8s_mender_tegra_verify.bbclass"
E2FSPROGS = all(shutil.which(tool) for tool in ("e2fsck", "mkfs.ext4", "blkid", "debugfs"))
needs_e2fsprogs = pytest.mark.skipif(not E2FSPROGS, reason="e2fsprogs and util-linux's blkid are not on this host")
FSTAB_GENERATOR = Path("/usr/lib/systemd/system-generators/systemd-fstab-generator")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

# Upstream units, as far as ordering and dependencies go (facts, read at our pins):
# meta-mender-tegra-native's tegra-rootfs-verify.service (mendersoftware/meta-mender-community 72093c00)
UPSTREAM_ROOTFS_VERIFY = """[Unit]
Description=Mark the running Tegra rootfs slot good
After=nvstartup.service
Before=mender-updated.service
ConditionPathExists=/usr/sbin/nvbootctrl
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/tegra-rootfs-verify
"""
# meta-tegra's setup-nv-boot-control.service.in (OE4T/meta-tegra 727633de): it writes
# /etc/nv_boot_control.conf, which nvbootctrl reads, and orders itself before nv_update_verifier only
UPSTREAM_SETUP_NV_BOOT_CONTROL = """[Unit]
Description=Set up redundant boot configuration
DefaultDependencies=no
Before=nv_update_verifier.service
[Service]
Type=oneshot
ExecStart=/usr/bin/setup-nv-boot-control
"""
# meta-tegra's nv_update_verifier.service (727633de)
UPSTREAM_NV_UPDATE_VERIFIER = """[Unit]
Description=OTA bootloader update verifier
[Service]
Type=simple
ExecStart=/usr/sbin/nvbootctrl verify
"""


# ---------------------------------------------------------------- defect 6: the verifier's race


def installed_dropins() -> dict[str, list[Path]]:
    """unit -> the drop-ins the verify class installs for it, read from its do_install."""
    text = VERIFY_CLASS.read_text().replace("\\\n", " ")
    found: dict[str, list[Path]] = {}
    install = r"install -m 0644 \$\{UNPACKDIR\}/(\S+)\s+\$\{D\}\$\{systemd_system_unitdir\}/(\S+)\.d/"
    for name, unit in re.findall(install, text):
        found.setdefault(unit, []).append(VERIFY / "files" / name)
    return found


def tegra_units(with_layer: bool = True) -> dict[str, su.Unit]:
    dropins = installed_dropins() if with_layer else {}
    return {
        "tegra-rootfs-verify.service": su.load("tegra-rootfs-verify.service", UPSTREAM_ROOTFS_VERIFY,
                                               (p.read_text() for p in dropins.get("tegra-rootfs-verify.service", []))),
        "nv_update_verifier.service": su.load("nv_update_verifier.service", UPSTREAM_NV_UPDATE_VERIFIER,
                                              (p.read_text() for p in dropins.get("nv_update_verifier.service", []))),
        "setup-nv-boot-control.service": su.load("setup-nv-boot-control.service", UPSTREAM_SETUP_NV_BOOT_CONTROL),
    }


def test_defect_6_the_slot_verifier_starts_only_after_the_boot_control_setup_it_reads():
    assert set(installed_dropins()) == {"tegra-rootfs-verify.service", "nv_update_verifier.service"}
    units = tegra_units()
    assert su.ordered_after(units, "tegra-rootfs-verify.service", "setup-nv-boot-control.service"), (
        "tegra-rootfs-verify may run `nvbootctrl verify` before /etc/nv_boot_control.conf exists: a committed "
        "slot then falls back at its next boot")
    assert "setup-nv-boot-control.service" in units["tegra-rootfs-verify.service"].get("Unit", "Wants")
    assert su.ordered_after(units, "nv_update_verifier.service", "setup-nv-boot-control.service")
    # the control: upstream alone orders only nv_update_verifier, which is the race of defect 6
    upstream = tegra_units(with_layer=False)
    assert not su.ordered_after(upstream, "tegra-rootfs-verify.service", "setup-nv-boot-control.service")


def test_defect_8_verification_waits_for_datas_mount_but_never_needs_it():
    for name, unit in tegra_units().items():
        if name == "setup-nv-boot-control.service":
            continue
        assert "data.mount" in unit.get("Unit", "After"), f"{name} must read the pending marker where it is"
        needs = unit.get("Unit", "Requires") + unit.get("Unit", "BindsTo") + unit.get("Unit", "Requisite")
        assert "data.mount" not in needs and not unit.get("Unit", "RequiresMountsFor"), (
            f"{name} requires /data: a /data that cannot mount leaves the slot unverified, both slots in the end")
    nvidia = tegra_units()["nv_update_verifier.service"]
    assert nvidia.get("Service", "ExecStart") == ["/usr/sbin/tegra-rootfs-verify"], "the marker-aware verifier only"


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not on this host")
def test_the_verifier_units_with_the_layers_drop_ins_pass_systemd_analyze(tmp_path):
    for name, text in (("tegra-rootfs-verify.service", UPSTREAM_ROOTFS_VERIFY),
                       ("nv_update_verifier.service", UPSTREAM_NV_UPDATE_VERIFIER),
                       ("setup-nv-boot-control.service", UPSTREAM_SETUP_NV_BOOT_CONTROL)):
        (tmp_path / name).write_text(re.sub(r"ExecStart=/\S+.*", "ExecStart=/bin/true", text))
    for unit, dropins in installed_dropins().items():
        (tmp_path / f"{unit}.d").mkdir()
        for dropin in dropins:
            text = dropin.read_text().replace("ExecStart=/usr/sbin/tegra-rootfs-verify", "ExecStart=/bin/true")
            (tmp_path / f"{unit}.d" / dropin.name).write_text(text)
    analyze(tmp_path, "tegra-rootfs-verify.service", "nv_update_verifier.service")


def analyze(unit_dir: Path, *units: str) -> None:
    completed = subprocess.run([SYSTEMD_ANALYZE, "verify", *(str(unit_dir / u) for u in units)],
                               env={**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:"}, capture_output=True,
                               text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    ours = [line for line in completed.stderr.splitlines() if str(unit_dir) in line]
    assert ours == [], "\n".join(ours)


# ---------------------------------------------------------------- defect 8: the fstab line


def mender_fstab(part: str) -> str:
    """/etc/fstab as meta-mender's mender_update_fstab_file writes it (mender-setup-image.inc)."""
    root = f"{'/dev/root':<20} {'/':<20} {'auto':<10} {'defaults':<21} {'1':<2} 1\n"
    return root + f"{part:<20} {'/data':<20} {'auto':<10} {'defaults':<21} {'0':<2} 2\n"


# MENDER_DATA_PART of each machine (PARTUUID= on genericx86-64: mender-partuuid)
DATA_PARTS = ["/dev/nvme0n1p17", "/dev/mmcblk0p17", "/dev/nvme0n1p13", "/dev/mmcblk0p3", "/dev/vda4",
              "PARTUUID=2c3ea3f4-9d1b-4c59-9a07-6f3c1e0b0a04"]


def generated(tmp_path: Path, fstab: str) -> Path:
    """What the real systemd-fstab-generator makes of an fstab."""
    (tmp_path / "fstab").write_text(fstab)
    out = tmp_path / "generated"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    completed = subprocess.run([str(FSTAB_GENERATOR), str(out), str(out), str(out)], capture_output=True, text=True,
                               env={**os.environ, "SYSTEMD_FSTAB": str(tmp_path / "fstab"), "SYSTEMD_PROC_CMDLINE": ""},
                               timeout=60)
    assert completed.returncode == 0, completed.stderr
    return out


@pytest.mark.parametrize("part", DATA_PARTS)
def test_defect_8_the_data_line_is_nofail_ordered_and_checked_by_the_layer_not_systemd_fsck(part):
    line = next(row for row in data_mount.rewrite_fstab(mender_fstab(part)).splitlines() if " /data " in row)
    spec, point, fstype, options, dump, passno = line.split()
    assert (spec, point, fstype, dump, passno) == (part, "/data", "auto", "0", "0")
    assert options.split(",") == ["defaults", "nofail", "x-systemd.before=local-fs.target",
                                  "x-systemd.requires=gpu-k8s-data-check.service"]
    assert data_mount.rewrite_fstab(data_mount.rewrite_fstab(mender_fstab(part))) == \
        data_mount.rewrite_fstab(mender_fstab(part)), "running twice changes nothing"
    assert mender_fstab(part).splitlines()[0] == data_mount.rewrite_fstab(mender_fstab(part)).splitlines()[0]


@pytest.mark.skipif(not FSTAB_GENERATOR.exists(), reason="systemd-fstab-generator is not on this host")
def test_defect_8_systemd_mounts_data_after_the_check_and_boots_on_when_it_fails(tmp_path):
    out = generated(tmp_path, data_mount.rewrite_fstab(mender_fstab("/dev/nvme0n1p17")))
    mount = su.load_files(out / "data.mount")
    assert "gpu-k8s-data-check.service" in mount.get("Unit", "Requires")
    assert "gpu-k8s-data-check.service" in mount.get("Unit", "After")
    assert "local-fs.target" in mount.get("Unit", "Before"), "services that read /data still wait for it"
    assert (out / "local-fs.target.wants/data.mount").is_symlink(), "wanted, so a failure does not end the boot"
    assert not (out / "local-fs.target.requires/data.mount").exists()
    assert not [u for u in mount.get("Unit", "After") + mount.get("Unit", "Requires") if u.startswith("systemd-fsck@")]
    # the control: meta-mender's own line is required by local-fs.target (emergency mode on failure)
    before = generated(tmp_path, mender_fstab("/dev/nvme0n1p17"))
    assert (before / "local-fs.target.requires/data.mount").is_symlink()


def test_the_data_line_and_settings_refuse_what_cannot_repair_itself():
    with pytest.raises(data_mount.DataMountError, match="no /data line"):
        data_mount.rewrite_fstab("/dev/root / auto defaults 1 1\n")
    with pytest.raises(data_mount.DataMountError, match="mounts /data 2 times"):
        data_mount.rewrite_fstab(mender_fstab("/dev/vda4") + "/dev/vda5 /data ext4 defaults 0 2\n")
    assert "GPU_K8S_DATA_PARTNAME=UDA" in data_mount.check_settings("ext4", "data", "UDA")
    with pytest.raises(data_mount.DataMountError, match="repairs and remakes only ext2, ext3, ext4"):
        data_mount.check_settings("btrfs", "data", "")
    with pytest.raises(data_mount.DataMountError, match="MENDER_DATA_PART_LABEL"):
        data_mount.check_settings("ext4", "my data", "")


def test_the_node_image_rewrites_the_line_after_mender_with_each_machines_partition_name():
    image = parse(LAYER / "recipes-core/images/gpu-k8s-image.inc")
    assert image.words("ROOTFS_POSTPROCESS_COMMAND", "append", "gpu-k8s-mender") == ["gpu_k8s_data_mount;"]
    klass = parse(LAYER / "classes/gpu_k8s_mender.bbclass")
    assert "gpu_k8s_data_mount" in klass.tasks
    names = {a.overrides: a.value for a in klass.assignments if a.var == "GPU_K8S_DATA_PARTNAME"}
    layout = parse(LAYER / "classes/gpu_k8s_mender_tegra_layout.bbclass").value("GPU_K8S_TEGRA_DATA_PARTNAME")
    assert names == {(): "", ("tegra210",): "UDA", ("tegra234",): layout, ("tegra264",): layout}


# ---------------------------------------------------------------- defect 8: the check itself


class DataCheck:
    """gpu-k8s-data-check under a root prefix: fstab, an image file for the partition, sysfs;
    mount/umount stand-ins that record and can fail."""

    def __init__(self, tmp_path: Path, device: str = "/dev/nvme0n1p17", partname: str = "permanet_user_storage"):
        self.root = tmp_path / "root"
        self.device = self.root / device.lstrip("/")
        self.device.parent.mkdir(parents=True)
        (self.root / "etc").mkdir()
        (self.root / "etc/fstab").write_text(data_mount.rewrite_fstab(mender_fstab(device)))
        uevent = self.root / "sys/class/block" / self.device.name / "uevent"
        uevent.parent.mkdir(parents=True)
        uevent.write_text(f"MAJOR=259\nMINOR=17\nDEVNAME={self.device.name}\nDEVTYPE=partition\nPARTN=17\n"
                          f"PARTNAME={partname}\n")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.calls = tmp_path / "calls"
        self.mount_failures = tmp_path / "mount-failures"  # how many mounts fail before one works
        (bin_dir / "mount").write_text(
            f'#!/bin/sh\necho "mount $*" >> {self.calls}\nleft=$(cat {self.mount_failures} 2>/dev/null || echo 0)\n'
            f'[ "$left" -gt 0 ] || exit 0\necho $((left - 1)) > {self.mount_failures}\n'
            'echo "mount: wrong fs type, bad option, bad superblock" >&2\nexit 32\n')
        (bin_dir / "umount").write_text(f'#!/bin/sh\necho "umount $*" >> {self.calls}\n')
        for tool in ("mount", "umount"):
            (bin_dir / tool).chmod(0o755)
        self.mountinfo = tmp_path / "mountinfo"
        self.mountinfo.write_text("21 1 8:2 / / rw - ext4 /dev/root rw\n")
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_K8S_ROOT": str(self.root),
                    "GPU_K8S_MOUNTINFO": str(self.mountinfo), "GPU_K8S_DATA_DEVICE_TIMEOUT": "0",
                    "GPU_K8S_DATA_PARTNAME": partname}

    def make_ext4(self, content: dict[str, str] | None = None, label: str = "data") -> None:
        source = self.device.parent / "content"
        source.mkdir(exist_ok=True)
        for name, text in (content or {}).items():
            (source / name).write_text(text)
        self.device.unlink(missing_ok=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(source), str(self.device), "16M"], check=True)
        shutil.rmtree(source)

    def run(self) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(CHECK)], env=self.env, capture_output=True, text=True, timeout=120)

    def state(self) -> dict:
        return json.loads((self.root / "run/gpu-k8s/data-state.json").read_text())

    def blkid(self, tag: str) -> str:
        return subprocess.run(["blkid", "-p", "-s", tag, "-o", "value", str(self.device)], capture_output=True,
                              text=True).stdout.strip()

    def read(self, name: str) -> str:
        return subprocess.run(["debugfs", "-R", f"cat /{name}", str(self.device)], capture_output=True,
                              text=True).stdout

    def mounts(self) -> list[str]:
        return [line for line in self.calls.read_text().splitlines() if line.startswith("mount ")] \
            if self.calls.exists() else []


@needs_e2fsprogs
def test_a_clean_data_partition_is_checked_and_left_as_it_is(tmp_path):
    check = DataCheck(tmp_path)
    check.make_ext4({"kept": "node state\n"})
    uuid = check.blkid("UUID")
    result = check.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert check.state()["state"] == "ok" and check.state()["device"] == "/dev/nvme0n1p17"
    assert check.read("kept") == "node state\n" and check.blkid("UUID") == uuid
    assert check.mounts() == [f"mount -t ext4 {check.device} {check.root}/run/gpu-k8s/data-check"]


@needs_e2fsprogs
def test_defect_8_a_data_partition_whose_superblock_is_gone_is_repaired_from_a_backup_not_remade(tmp_path):
    check = DataCheck(tmp_path)
    check.make_ext4({"kept": "node state\n"})
    with check.device.open("r+b") as image:  # the primary superblock's magic number (offset 1024 + 56)
        image.seek(1080)
        image.write(b"\0\0")
    assert check.blkid("TYPE") == "", "no file system is visible any more"
    result = check.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert check.state()["state"] == "repaired", check.state()
    assert check.read("kept") == "node state\n", "repaired, with what was on it"


@needs_e2fsprogs
def test_defect_8_a_lost_data_partition_is_made_again_as_mender_made_it_and_the_loss_is_reported(tmp_path):
    check = DataCheck(tmp_path)
    check.device.write_bytes(b"\0" * (16 << 20))
    result = check.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert (check.blkid("TYPE"), check.blkid("LABEL")) == ("ext4", "data")
    state = check.state()
    assert state["state"] == "recreated" and "Everything on /data is gone" in state["detail"]
    assert re.search(r"^<3>gpu-k8s-data-check: .* made a new one", result.stdout, re.M), "an error in the journal"
    assert len(check.mounts()) == 1, "mounted once the new file system is made"


@needs_e2fsprogs
def test_a_data_partition_that_checks_clean_but_does_not_mount_is_made_again(tmp_path):
    check = DataCheck(tmp_path)
    check.make_ext4({"kept": "x"})
    check.mount_failures.write_text("1")
    result = check.run()
    assert result.returncode == 0 and check.state()["state"] == "recreated"
    assert "passed e2fsck but does not mount" in check.state()["detail"]
    assert check.read("kept") == "", "a new, empty file system"


@needs_e2fsprogs
def test_when_even_a_new_file_system_does_not_mount_the_boot_goes_on_without_data(tmp_path):
    check = DataCheck(tmp_path)
    check.make_ext4()
    check.mount_failures.write_text("9")
    result = check.run()
    assert result.returncode == 1
    assert check.state()["state"] == "unavailable" and "does not mount either" in check.state()["detail"]


@needs_e2fsprogs
@pytest.mark.skipif(shutil.which("mkfs.vfat") is None, reason="dosfstools is not on this host")
def test_another_kind_of_file_system_is_never_checked_or_replaced(tmp_path):
    check = DataCheck(tmp_path)
    check.device.write_bytes(b"\0" * (16 << 20))
    subprocess.run(["mkfs.vfat", str(check.device)], check=True, capture_output=True)
    before = check.device.read_bytes()
    result = check.run()
    assert result.returncode == 1 and check.state()["state"] == "unavailable"
    assert "holds a vfat file system" in check.state()["detail"]
    assert check.device.read_bytes() == before and check.mounts() == []


@needs_e2fsprogs
def test_a_partition_with_another_gpt_name_is_left_alone(tmp_path):
    check = DataCheck(tmp_path, partname="permanet_user_storage")
    (check.root / "sys/class/block/nvme0n1p17/uevent").write_text("DEVNAME=nvme0n1p17\nPARTNAME=APP_b\n")
    check.device.write_bytes(b"\0" * (4 << 20))
    result = check.run()
    assert result.returncode == 1
    assert "is partition 'APP_b', not the data partition 'permanet_user_storage'" in check.state()["detail"]
    assert check.device.read_bytes() == b"\0" * (4 << 20), "nothing written"


def test_a_device_that_never_appears_leaves_data_unmounted_and_the_boot_going(tmp_path):
    check = DataCheck(tmp_path)
    result = check.run()
    assert result.returncode == 1
    assert check.state()["state"] == "unavailable" and "did not appear within 0s" in check.state()["detail"]


def test_a_data_already_mounted_is_not_touched(tmp_path):
    check = DataCheck(tmp_path)
    check.mountinfo.write_text("21 1 8:2 / / rw - ext4 /dev/root rw\n22 21 259:17 / /data rw - ext4 /dev/x rw\n")
    result = check.run()
    assert result.returncode == 0 and "already mounted" in result.stdout
    assert check.mounts() == [] and not (check.root / "run/gpu-k8s/data-state.json").exists()


def test_the_check_unit_runs_before_the_mount_with_the_images_settings():
    unit = su.load_files(FILES / "gpu-k8s-data-check.service")
    assert unit.value("Unit", "DefaultDependencies") == "no"
    assert "data.mount" in unit.get("Unit", "Before")
    assert unit.get("Service", "EnvironmentFile") == ["-@SYSCONFDIR@/default/gpu-k8s-data"]
    assert unit.get("Service", "ExecStart") == ["@LIBEXECDIR@/gpu-k8s-data-check"]
    assert "/" + data_mount.SETTINGS_FILE in unit.value("Service", "EnvironmentFile")
    recipe = parse(DATA_DIR / "gpu-k8s-data_1.0.bb")
    assert set(recipe.words("RDEPENDS", "${PN}")) >= {"e2fsprogs-e2fsck", "e2fsprogs-mke2fs", "util-linux-blkid"}
    install = recipe.tasks["do_install"]
    assert "gpu-k8s-data-check.sh ${D}${libexecdir}/gpu-k8s-data-check" in install
    assert "s#@SYSCONFDIR@#${sysconfdir}#g" in install


# ---------------------------------------------------------------- defects 8 and 9: gpu-k8s-data


class DataRun:
    """The real gpu-k8s-data script under a root prefix, with a mount that only records."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.root.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "mount").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "mount").chmod(0o755)
        mountinfo = tmp_path / "mountinfo"
        mountinfo.write_text("20 1 8:1 / / rw - ext4 /dev/x rw\n21 1 8:1 / /data rw - ext4 /dev/x rw\n")
        self.state = tmp_path / "data-state.json"
        self.boot_id = tmp_path / "boot_id"
        self.boot_id.write_text("b0\n")
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_K8S_ROOT": str(self.root),
                    "GPU_K8S_PERSIST_LIST": str(FILES / "persist.list"),
                    "GPU_K8S_NODE_CONFIG_LIST": str(FILES / "node-config.list"),
                    "GPU_K8S_MOUNTINFO": str(mountinfo), "GPU_K8S_DATA_STATE": str(self.state),
                    "GPU_K8S_BOOT_ID": str(self.boot_id)}

    def run(self, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(["sh", str(FILES / "gpu-k8s-data.sh"), *args], env=self.env, capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    def new_slot(self) -> None:
        for child in self.root.iterdir():
            if child.name != "data":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()

    def sshd_check_keys(self, kind: str = "ecdsa") -> None:
        """What oe-core's sshd_check_keys does: make a key only where none is (-f follows links)."""
        key = self.root / f"etc/ssh/ssh_host_{kind}_key"
        if not key.is_file():
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_text(f"PRIVATE {kind} {os.urandom(8).hex()}\n")
            key.chmod(0o600)
            key.with_name(key.name + ".pub").write_text(f"PUBLIC {kind}\n")


def test_defect_9_the_ssh_host_key_made_at_the_first_boot_is_the_one_after_every_update(tmp_path):
    run = DataRun(tmp_path)
    run.run()
    run.sshd_check_keys()  # after gpu-k8s-data: nothing was kept yet
    first = (run.root / "etc/ssh/ssh_host_ecdsa_key").read_text()
    run.run("--adopt")  # the update's reboot
    kept = run.root / "data/gpu-k8s/node-config/ssh-host-ecdsa-key"
    assert kept.read_text() == first and oct(kept.stat().st_mode & 0o777) == "0o600", "private, on /data"
    for _ in range(2):  # two updates
        run.new_slot()
        run.run()
        run.sshd_check_keys()
        key = run.root / "etc/ssh/ssh_host_ecdsa_key"
        assert key.is_symlink() and key.read_text() == first, "sshd presents the same host key"


def test_defect_9_a_host_key_made_while_data_was_away_gives_way_to_the_kept_one(tmp_path):
    run = DataRun(tmp_path)
    run.run()
    run.sshd_check_keys()
    run.run("--adopt")
    first = (run.root / "data/gpu-k8s/node-config/ssh-host-ecdsa-key").read_text()
    run.new_slot()
    run.sshd_check_keys()  # a boot in which /data did not mount: sshd made a key of its own
    result = run.run()  # the next boot with /data
    assert (run.root / "etc/ssh/ssh_host_ecdsa_key").read_text() == first
    assert (run.root / "data/gpu-k8s/node-config/ssh-host-ecdsa-key").read_text() == first
    assert "replaced by the kept" in result.stdout


def test_defect_8_a_remade_data_partition_is_on_record_once_per_boot(tmp_path):
    run = DataRun(tmp_path)
    run.state.write_text('{"state": "recreated", "device": "/dev/vda4", "detail": "lost", "time": "t"}\n')
    run.run()
    run.run()  # gpu-k8s-data restarted in the same boot
    events = (run.root / "data/gpu-k8s/data-events.log").read_text().splitlines()
    assert [json.loads(line) for line in events] == [
        {"boot_id": "b0", "check": {"state": "recreated", "device": "/dev/vda4", "detail": "lost", "time": "t"}}]
    run.boot_id.write_text("b1\n")
    run.state.write_text('{"state": "ok", "device": "/dev/vda4", "detail": "clean", "time": "t"}\n')
    run.run()
    assert len((run.root / "data/gpu-k8s/data-events.log").read_text().splitlines()) == 1, "a clean check is no event"


def test_defect_9_network_settings_and_host_keys_are_linked_before_their_users_start_but_never_needed():
    data = su.load_files(FILES / "gpu-k8s-data.service")
    before = data.get("Unit", "Before")
    assert {"systemd-networkd.service", "sshdgenkeys.service", "containerd.service", "docker.service",
            "k3s.service", "k3s-agent.service", "local-fs.target"} <= set(before)
    recipe = parse(DATA_DIR / "gpu-k8s-data_1.0.bb")
    required_by = set(recipe.words("GPU_K8S_DATA_REQUIRED_BY"))
    assert required_by == {"containerd.service", "docker.service", "k3s.service", "k3s-agent.service"}
    assert not required_by & {"systemd-networkd.service", "sshdgenkeys.service", "sshd.socket"}, (
        "a node without /data must still come up on the network and answer ssh")
    dropin = su.load_files(FILES / "10-gpu-k8s-data.conf")
    assert dropin.get("Unit", "Requires") == ["gpu-k8s-data.service"]


MACHINE_ID = "mender-persist-systemd-machine-id"


def test_defect_9_the_machine_id_is_kept_on_every_machine_and_never_turned_off():
    """x86-64 and QEMU get Mender's feature from this layer; the Jetsons from meta-mender-tegra
    (tegra-mender-common.bbclass: `MENDER_FEATURES_ENABLE:append:tegra = " mender-uboot
    mender-persist-systemd-machine-id"` in meta-mender-community wrynose; the kirkstone Nano's
    tegra-mender-setup likewise), of which the layer turns off only mender-uboot on the Orin and
    Thor. The parse shows the expanded MENDER_FEATURES per kas file (docs/layer.md)."""
    klass = parse(LAYER / "classes/gpu_k8s_mender.bbclass")
    enabled = [a for a in klass.assignments if a.var == "MENDER_FEATURES_ENABLE" and MACHINE_ID in a.words()]
    assert [a.overrides for a in enabled] == [("append", "x86-64")], "x86-64 (genericx86-64, qemux86-64)"
    for assignment in klass.assignments:
        if assignment.var == "MENDER_FEATURES_DISABLE" or "remove" in assignment.overrides:
            assert MACHINE_ID not in assignment.words(), f"{assignment}: both slots must boot with one machine-id"


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not on this host")
def test_the_data_units_pass_systemd_analyze(tmp_path):
    for name in ("gpu-k8s-data.service", "gpu-k8s-data-check.service"):
        text = (FILES / name).read_text()
        text = re.sub(r"@LIBEXECDIR@/\S+( --adopt)?", "/bin/true", text)
        text = text.replace("@DATADIR@", "/usr/share").replace("@SYSCONFDIR@", "/etc")
        text = text.replace("@MENDER_FIRSTBOOT_UNITS@", "mender-data-dir.service")
        (tmp_path / name).write_text(text)
    analyze(tmp_path, "gpu-k8s-data.service", "gpu-k8s-data-check.service")
