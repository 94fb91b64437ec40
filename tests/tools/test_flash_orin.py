"""flash --machine jetson-orin-nano / jetson-agx-orin: recovery-mode detection by the Orin
modules' USB ids, meta-tegra wrynose's initrd-flash / dosdcard.sh / doexternal.sh from a real
.tegraflash-tar.zst, and the Nano's refusals for host disks. Every refusal proves no script ran
and the device file is unchanged."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tools.flash import flash, orin, targets, usb

GB = 1000**3

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="the Orin package is .tar.zst: needs zstd")

INITRD_FLASH = "print('Found Jetson device in recovery mode'); print('Flashing complete')\n"
# make-sdcard's stand-in: writes the device (or the image file) it is given, like the real one.
WRITE_TARGET = """
target = argv[-1]
if target.startswith('/') or '/dev/' in target:
    with open(target, 'wb') as device:
        device.write(b'WRITTEN BY ' + os.path.basename(sys.argv[0]).encode())
else:
    base = argv[argv.index('-b') + 1]
    open(base + '.sdcard', 'wb').truncate(2 * 1000**3)
"""
AB_LAYOUT = (
    '<partition_layout><device type="nvme">'
    '<partition name="APP" type="data"/><partition name="APP_b" type="data"/>'
    '<partition name="UDA" type="data"/></device></partition_layout>'
)
SINGLE_LAYOUT = (
    '<partition_layout><device type="sdcard"><partition name="APP" type="data"/></device></partition_layout>'
)


# The --machine name (tools/image/build.py) of each Yocto MACHINE.
MACHINE_NAME = {"jetson-orin-nano-devkit-nvme": "jetson-orin-nano", "jetson-orin-nano-devkit": "jetson-orin-nano-sd",
                "jetson-agx-orin-devkit": "jetson-agx-orin"}


def orin_build(tmp_path: Path, stand_ins, machine: str, rootfs_bytes: int = GB, layout: str = AB_LAYOUT) -> Path:
    """A kas build dir whose deploy dir holds a .tegraflash-tar.zst with stand-in scripts."""
    content = tmp_path / f"tegraflash-{machine}"
    content.mkdir(parents=True)
    for name, body in (("initrd-flash", INITRD_FLASH), ("dosdcard.sh", WRITE_TARGET), ("doexternal.sh", WRITE_TARGET)):
        script = stand_ins.add(name, body)
        (content / name).write_text(script.read_text())
        (content / name).chmod(0o755)
        script.unlink()  # only the copies inside the package may run
    (content / "flash.xml.in").write_text(layout)
    (content / "external-flash.xml.in").write_text(layout)
    with (content / "gpu-k8s-image.ext4").open("wb") as rootfs:
        rootfs.truncate(rootfs_bytes)  # sparse
    build_dir = tmp_path / f"build-{machine}"
    deploy = build_dir / "tmp" / "deploy" / "images" / machine
    deploy.mkdir(parents=True)
    package = deploy / f"gpu-k8s-image-{machine}.tegraflash-tar.zst"
    subprocess.run(["tar", "--zstd", "--sparse", "-cf", str(package), "-C", str(content), "."], check=True)
    return build_dir


@pytest.fixture
def host_tools(stand_ins):
    """The host programs meta-tegra's Orin flashing wants, as stand-ins (the test host may lack them)."""
    for tool in ("dtc", "cpp", "sgdisk", "udisksctl", "bmaptool"):
        stand_ins.add(tool)
    return stand_ins


@pytest.fixture
def nvme_build(tmp_path, host_tools) -> Path:
    return orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit-nvme")


def options(build_dir: Path, host_tree, **overrides) -> flash.FlashOptions:
    return flash.FlashOptions(build_dir=build_dir, root=host_tree.root, **overrides)


def device_content(host_tree, name: str) -> bytes:
    return (host_tree.root / "dev" / name).read_bytes()


# --- recovery mode over USB ---------------------------------------------------------------

def test_full_flash_runs_initrd_flash_on_the_port_of_the_orin_nano_found(host_tree, nvme_build, stand_ins) -> None:
    host_tree.add_usb_device("1-4", "0955", "7f21")  # a Nano on another port is not flashed
    host_tree.add_usb_device("1-2", "0955", "7523", serial="1421924000123")
    (line,) = orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    (call,) = stand_ins.calls("initrd-flash")
    assert call["argv"] == ["--usb-instance", "1-2"]
    assert "gpu-k8s-flash-" in call["cwd"] and not Path(call["cwd"]).exists()  # unpacked, then cleaned up
    assert "Jetson Orin Nano 8GB" in line and "port 1-2" in line


@pytest.mark.parametrize(("method", "flag"), [("spi-only", "--qspi-only"), ("external-only", "--external-only")])
def test_partial_flashes_pass_initrd_flashs_own_flags(host_tree, nvme_build, stand_ins, method, flag) -> None:
    host_tree.add_usb_device("3-1", "0955", "7523")
    orin.run_orin_flash(options(nvme_build, host_tree, method=method), "jetson-orin-nano")
    assert stand_ins.calls("initrd-flash")[0]["argv"] == [flag, "--usb-instance", "3-1"]


def test_agx_orin_is_found_by_its_own_id(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-agx-orin-devkit")
    host_tree.add_usb_device("2-1", "0955", "7023")
    (line,) = orin.run_orin_flash(options(build_dir, host_tree), "jetson-agx-orin")
    assert host_tools.calls("initrd-flash")[0]["argv"] == ["--usb-instance", "2-1"]
    assert "Jetson AGX Orin" in line


@pytest.mark.parametrize(("product", "seen"), [
    ("7f21", "a Jetson Nano in recovery mode (USB 0955:7f21)"),
    ("7023", "a Jetson AGX Orin (P3701-0000/-0005) in recovery mode (USB 0955:7023)"),
    ("7323", "a Jetson Orin NX 16GB (P3767-0000) in recovery mode (USB 0955:7323)"),
])
def test_a_board_of_another_module_is_refused_and_nothing_runs(host_tree, nvme_build, stand_ins, product, seen):
    host_tree.add_usb_device("1-2", "0955", product)
    with pytest.raises(flash.FlashError) as refused:
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    assert "no board for jetson-orin-nano-devkit-nvme (0955:7523 Jetson Orin Nano 8GB" in str(refused.value)
    assert seen in str(refused.value) and "this image is for another module" in str(refused.value)
    assert stand_ins.calls("initrd-flash") == []


def test_two_boards_of_the_module_are_refused_and_nothing_runs(host_tree, nvme_build, stand_ins) -> None:
    host_tree.add_usb_device("1-2", "0955", "7523")
    host_tree.add_usb_device("2-2", "0955", "7523")
    with pytest.raises(flash.FlashError, match=r"^2 boards for jetson-orin-nano-devkit-nvme .*initrd-flash flashes"):
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    assert stand_ins.calls("initrd-flash") == []


def test_no_board_in_recovery_says_how_to_get_there(host_tree, nvme_build, stand_ins) -> None:
    host_tree.add_usb_device("1-5", "0955", "7020")  # a running Jetson, not in recovery mode
    with pytest.raises(flash.FlashError, match=r"no jetson-orin-nano-devkit-nvme .* found on USB; .*FC REC to GND"):
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    assert stand_ins.calls("initrd-flash") == []


def test_agx_recovery_howto_names_its_buttons(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-agx-orin-devkit")
    with pytest.raises(flash.FlashError, match="Force Recovery button"):
        orin.run_orin_flash(options(build_dir, host_tree), "jetson-agx-orin")


def test_two_orin_nanos_in_recovery_are_refused(host_tree, nvme_build, stand_ins) -> None:
    host_tree.add_usb_device("1-2", "0955", "7523")
    host_tree.add_usb_device("2-2", "0955", "7523")
    with pytest.raises(flash.FlashError, match="2 boards for jetson-orin-nano-devkit-nvme"):
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    assert stand_ins.calls("initrd-flash") == []


def test_every_orin_module_id_is_known_to_the_recovery_scan(host_tree) -> None:
    for port, product in enumerate(usb.ORIN_RECOVERY_MODELS, start=1):
        host_tree.add_usb_device(f"1-{port}", "0955", product)
    boards = usb.find_recovery_boards(host_tree.root)
    assert sorted(board.product_id for board in boards) == sorted(usb.ORIN_RECOVERY_MODELS)
    assert all(not board.is_nano and board.orin_model for board in boards)


def test_missing_host_tools_are_named_with_their_packages_before_anything_runs(
        host_tree, tmp_path, stand_ins, monkeypatch) -> None:
    build_dir = orin_build(tmp_path, stand_ins, "jetson-orin-nano-devkit-nvme")
    host_tree.add_usb_device("1-2", "0955", "7523")
    monkeypatch.setenv("PATH", str(stand_ins.bin_dir))  # no zstd, dtc, cpp, sgdisk, udisksctl
    with pytest.raises(flash.FlashError, match=r"needs zstd \(apt-get install zstd\), dtc \(apt-get install "
                       r"device-tree-compiler\), cpp .*sgdisk \(apt-get install gdisk\), udisksctl"):
        orin.run_orin_flash(options(build_dir, host_tree), "jetson-orin-nano")
    assert stand_ins.calls("initrd-flash") == []


def test_missing_package_says_how_to_build_it(host_tree, tmp_path, host_tools) -> None:
    with pytest.raises(flash.FlashError, match=r"tegraflash-tar.zst; build it first with "
                       r"`./task build --machine jetson-orin-nano` \(or pass --package PATH\)"):
        orin.run_orin_flash(options(tmp_path / "empty", host_tree), "jetson-orin-nano")


def test_dry_run_shows_every_command_and_runs_none(host_tree, nvme_build, stand_ins, capsys) -> None:
    host_tree.add_usb_device("1-2", "0955", "7523")
    orin.run_orin_flash(options(nvme_build, host_tree, dry_run=True), "jetson-orin-nano")
    out = capsys.readouterr().out
    assert "would run: tar --zstd -xf " in out
    assert "./initrd-flash --usb-instance 1-2" in out
    assert stand_ins.calls("initrd-flash") == []


# --- NVMe drive / SD card on this host: the Nano's safety checks ----------------------------

@pytest.mark.parametrize(
    ("device", "reason"),
    [
        ("/dev/sda", "it holds / of this host"),
        ("/dev/sdc", "it is mounted: /dev/sdc1 on /media/user/CARD"),
        ("/dev/nvme0n1", "not removable"),
        ("/dev/mmcblk1", "not removable"),
    ],
)
def test_unsafe_drives_are_refused_before_unpacking_and_nothing_is_written(
        host_tree, nvme_build, stand_ins, device, reason) -> None:
    name = device.removeprefix("/dev/")
    before = device_content(host_tree, name)
    with pytest.raises(flash.FlashError, match=f"refusing to write {device}: .*{reason}"):
        orin.run_orin_flash(options(nvme_build, host_tree, method="external", device=device, yes=True),
                                  "jetson-orin-nano")
    assert stand_ins.calls("doexternal.sh") == []
    assert device_content(host_tree, name) == before


def test_a_safe_drive_is_written_by_doexternal_after_confirmation(host_tree, nvme_build, stand_ins) -> None:
    (line,) = orin.run_orin_flash(options(nvme_build, host_tree, method="external", device="/dev/sdb",
                                                yes=True), "jetson-orin-nano")
    (call,) = stand_ins.calls("doexternal.sh")
    assert call["argv"] == ["-y", str(host_tree.root / "dev" / "sdb")]
    assert device_content(host_tree, "sdb") == b"WRITTEN BY doexternal.sh"
    assert "/dev/sdb" in line


def test_a_safe_drive_still_needs_confirmation(host_tree, nvme_build, stand_ins) -> None:
    with pytest.raises(flash.FlashError, match="needs confirmation"):
        orin.run_orin_flash(options(nvme_build, host_tree, method="external", device="/dev/sdb"),
                                  "jetson-orin-nano", interactive=False)
    assert stand_ins.calls("doexternal.sh") == []
    assert device_content(host_tree, "sdb").startswith(b"ORIGINAL")


def test_ab_layout_needs_room_for_both_root_slots(tmp_path, host_tree, host_tools) -> None:
    # 600 MB rootfs: one slot fits the 1 GB card, the redundant layout's two do not.
    ab = orin_build(tmp_path / "ab", host_tools, "jetson-orin-nano-devkit-nvme", rootfs_bytes=600 * 1000**2)
    with pytest.raises(flash.FlashError, match="refusing to write /dev/sdd: .*smaller than the image"):
        orin.run_orin_flash(options(ab, host_tree, method="external", device="/dev/sdd", yes=True),
                                  "jetson-orin-nano")
    assert host_tools.calls("doexternal.sh") == []
    assert device_content(host_tree, "sdd").startswith(b"ORIGINAL")
    single = orin_build(tmp_path / "single", host_tools, "jetson-orin-nano-devkit-nvme",
                        rootfs_bytes=600 * 1000**2, layout=SINGLE_LAYOUT)
    orin.run_orin_flash(options(single, host_tree, method="external", device="/dev/sdd", yes=True),
                              "jetson-orin-nano")
    assert device_content(host_tree, "sdd") == b"WRITTEN BY doexternal.sh"


def test_sd_devkit_card_is_written_by_dosdcard(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit", layout=SINGLE_LAYOUT)
    orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", device="/dev/sdb", yes=True),
                              "jetson-orin-nano-sd")
    assert host_tools.calls("dosdcard.sh")[0]["argv"] == ["-y", str(host_tree.root / "dev" / "sdb")]
    assert device_content(host_tree, "sdb") == b"WRITTEN BY dosdcard.sh"


def test_sd_image_without_a_device_is_made_and_kept(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit", layout=SINGLE_LAYOUT)
    kept = tmp_path / "out" / "orin.sdcard"
    (line,) = orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", output=kept),
                                        "jetson-orin-nano-sd")
    assert host_tools.calls("dosdcard.sh")[0]["argv"] == ["-y", "-s", "32G", "-b", "gpu-k8s-image"]
    assert kept.stat().st_size == 2 * GB and str(kept) in line


@pytest.mark.parametrize(("machine", "method", "device", "message"), [
    ("jetson-orin-nano-devkit-nvme", "sdcard", "/dev/sdb", "keeps its rootfs on NVMe"),
    ("jetson-orin-nano-devkit", "external", "/dev/sdb", "boots from its SD card"),
    ("jetson-orin-nano-devkit-nvme", "external", None, "needs --device"),
    ("jetson-orin-nano-devkit-nvme", "full", "/dev/sdb", "--device is only for"),
    ("jetson-orin-nano-devkit-nvme", "doflash", None, "unknown --method 'doflash' for an Orin"),
])
def test_methods_that_do_not_fit_the_machine_are_refused(
        tmp_path, host_tree, host_tools, machine, method, device, message) -> None:
    build_dir = orin_build(tmp_path, host_tools, machine)
    with pytest.raises(flash.FlashError, match=message):
        orin.run_orin_flash(options(build_dir, host_tree, method=method, device=device, yes=True),
                                  MACHINE_NAME[machine])
    for script in ("initrd-flash", "dosdcard.sh", "doexternal.sh"):
        assert host_tools.calls(script) == []
    assert device_content(host_tree, "sdb").startswith(b"ORIGINAL")


# --- --machine dispatch ---------------------------------------------------------------------

def test_machine_names_pick_the_nano_the_orin_or_the_disk_path(host_tree, nvme_build, stand_ins,
                                                                monkeypatch) -> None:
    host_tree.add_usb_device("1-2", "0955", "7523")
    opts = options(nvme_build, host_tree)
    targets.flash_machine("jetson-orin-nano", opts)
    assert len(stand_ins.calls("initrd-flash")) == 1
    seen = []
    monkeypatch.setattr(flash, "run_flash", lambda o, machine: seen.append((o, machine)) or ["nano"])
    assert targets.flash_machine("jetson-nano", opts) == ["nano"] and seen == [(opts, "jetson-nano")]
    monkeypatch.setattr(targets, "run_disk_flash", lambda o, machine: [machine])
    assert targets.flash_machine("x86-64", opts) == ["x86-64"]
    with pytest.raises(flash.FlashUsageError, match=r"--machine 'qemu' cannot be flashed \(a QEMU image boots in QEMU: "
                       r"./task smoke-test\); choose one of: x86-64, x86-64-scarthgap, jetson-nano, "
                       r"jetson-orin-nano, jetson-orin-nano-sd, jetson-agx-orin, jetson-agx-thor, "
                       r"jetson-agx-thor-t4000"):
        targets.flash_machine("qemu", opts)


def test_a_kept_orin_sd_image_is_written_with_bmaptool_after_the_checks(tmp_path, host_tree, host_tools) -> None:
    image = tmp_path / "orin.sdcard"
    image.write_bytes(b"x" * 1024)
    host_tools.add("bmaptool", "open(argv[-1], 'wb').write(b'WRITTEN BY bmaptool')\n")
    with pytest.raises(flash.FlashError, match="refusing to write /dev/sda"):
        orin.run_orin_flash(options(tmp_path, host_tree, sd_image=image, device="/dev/sda", yes=True),
                                  "jetson-orin-nano-sd", interactive=False)
    assert device_content(host_tree, "sda").startswith(b"ORIGINAL")
    orin.run_orin_flash(options(tmp_path, host_tree, sd_image=image, device="/dev/sdb", yes=True),
                              "jetson-orin-nano-sd", interactive=False)
    assert device_content(host_tree, "sdb") == b"WRITTEN BY bmaptool"
