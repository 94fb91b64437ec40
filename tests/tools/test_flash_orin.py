"""flash --machine jetson-orin-nano / -sd / jetson-agx-orin: recovery-mode detection by the Orin
modules' USB ids, meta-tegra wrynose's initrd-flash / dosdcard.sh / doexternal.sh from a real
.tegraflash-tar.zst packed per MACHINE as meta-tegra packs it, the board's own result line as the
verdict, the whole layout sized as make-sdcard lays it out, and the Nano's refusals for host
disks. Every refusal proves no script ran and the device file is unchanged."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.flash import flash, initrd_flash, make_sdcard, orin, targets, usb
from tools.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "layer"))
import tegra_layouts as tl  # the layouts the layer tests use, sized as NVIDIA sizes them

GB = 1000**3
MB = 1000**2

pytestmark = [
    pytest.mark.skipif(shutil.which("zstd") is None, reason="the Orin package is .tar.zst: needs zstd"),
    pytest.mark.usefixtures("kept_logs"),  # no run leaves flash logs in /tmp
]

# initrd-flash's stand-in, shaped like meta-tegra's at the pin on CHIPID 0x23: it writes
# log.initrd-flash.<date>, where the board's own report ends up ("Final status: SUCCESS" or
# FAILED, from the flashing initrd's status file), and the board's device-logs-<date>/, then exits
# 0 whatever that report said. FINAL_STATUS picks the report ("" : none reached the log),
# INITRD_FLASH_EXIT an early failure (signing, RCM boot: the script exits 1 itself).
INITRD_FLASH = """
import os
values = dict(line.split('=', 1) for line in open('.env.initrd-flash').read().splitlines() if '=' in line)
stamp = '2026-11-26-17.30.00'
status = env.get('FINAL_STATUS', 'SUCCESS')
with open('log.initrd-flash.' + stamp, 'w') as log:
    log.write('Machine:       ' + values['MACHINE'].strip('"') + '\\n')
    log.write('== Step 5: Waiting for final status from device at 2026-11-26T17:41:02+00:00 ==\\n')
    if status:
        log.write('Final status: ' + status + '\\n')
        log.write('Successfully finished at 2026-11-26T17:41:09+00:00\\n')
os.mkdir('device-logs-' + stamp)
open(os.path.join('device-logs-' + stamp, 'export-' + values['ROOTFS_DEVICE'].strip('"') + '.log'), 'w').write('ok')
print('Found Jetson device in recovery mode')
if env.get('INITRD_FLASH_EXIT'):
    sys.exit(int(env['INITRD_FLASH_EXIT']))
"""
# make-sdcard's stand-in (dosdcard.sh and doexternal.sh end in it): writes the device it is given,
# or makes the image file `-s` asks for (sparse), as large as make-sdcard makes it.
WRITE_TARGET = """
target = argv[-1]
if target.startswith('/') or '/dev/' in target:
    with open(target, 'wb') as device:
        device.write(b'WRITTEN BY ' + os.path.basename(sys.argv[0]).encode())
else:
    size = argv[argv.index('-s') + 1]
    sectors = int(size[:-1]) * 1000**3 * 99 // 100 // 512 if size.endswith('G') else int(size)
    open(argv[argv.index('-b') + 1] + '.sdcard', 'wb').truncate(sectors * 512)
"""
QSPI = '    <device type="spi" instance="0" sector_size="512" num_sectors="65536"></device>\n'


def rootfs_device(kind: str, slot_bytes: int, before: tuple[tuple[str, int], ...] = ()) -> str:
    """A rootfs device as a package's layout has it: partitions ahead of the slots, the two slots,
    the data partition that fills the rest (at least its 64 MB image)."""
    parts = [tl.partition(name, size=str(size)) for name, size in before]
    parts += [tl.partition("APP", pid=1, filename="APPFILE", size=str(slot_bytes)),
              tl.partition("APP_b", pid=2, filename="APPFILE_b", size=str(slot_bytes)),
              tl.partition("permanet_user_storage", pid=17, filename="DATAFILE", attribute="0x808",
                           size=str(64 * MB))]
    return tl.device(kind, parts)


def layout(*devices: str) -> str:
    return tl.layout(*devices).replace("NUM_SECTORS", "0")


# Each MACHINE's package as meta-tegra wrynose (image_types_tegra.bbclass) packs it: .env.initrd-flash
# with the rootfs device (TNSPEC_BOOTDEV: nvme0n1p1 for the NVMe devkit; the default mmcblk0p1 for the
# SD devkit and the AGX Orin, whose flash_t234_qspi_sdmmc.xml puts it on the eMMC), flash.xml.in,
# external-flash.xml.in and doexternal.sh only for an external rootfs drive, dosdcard.sh only where
# flash.xml.in has an sdcard device.
PACKAGES = {
    "jetson-orin-nano-devkit-nvme": {
        "env": {"BOOTDEV": "nvme0n1p1", "ROOTFS_DEVICE": "nvme0n1", "EXTERNAL_ROOTFS_DRIVE": "1",
                "NO_INTERNAL_STORAGE": "1"},
        "flash.xml.in": lambda slot: layout(QSPI),
        "external-flash.xml.in": lambda slot: layout(rootfs_device("external", slot)),
        "scripts": ("initrd-flash", "doexternal.sh"),
    },
    "jetson-orin-nano-devkit": {
        "env": {"BOOTDEV": "mmcblk0p1", "ROOTFS_DEVICE": "mmcblk0", "EXTERNAL_ROOTFS_DRIVE": "0",
                "NO_INTERNAL_STORAGE": "0"},
        "flash.xml.in": lambda slot: layout(QSPI, rootfs_device("sdcard", slot)),
        "scripts": ("initrd-flash", "dosdcard.sh"),
    },
    "jetson-agx-orin-devkit": {
        "env": {"BOOTDEV": "mmcblk0p1", "ROOTFS_DEVICE": "mmcblk0", "EXTERNAL_ROOTFS_DRIVE": "0",
                "NO_INTERNAL_STORAGE": "0"},
        "flash.xml.in": lambda slot: layout(QSPI, rootfs_device("sdmmc", slot)),
        "scripts": ("initrd-flash",),
    },
}


# The --machine name (tools/image/build.py) of each Yocto MACHINE.
MACHINE_NAME = {"jetson-orin-nano-devkit-nvme": "jetson-orin-nano", "jetson-orin-nano-devkit": "jetson-orin-nano-sd",
                "jetson-agx-orin-devkit": "jetson-agx-orin"}


def orin_build(tmp_path: Path, stand_ins, machine: str, slot_bytes: int = 300 * MB,
               layouts: dict[str, str] | None = None, env: dict[str, str] | None = None) -> Path:
    """A kas build dir whose deploy dir holds the MACHINE's .tegraflash-tar.zst with stand-in scripts;
    `layouts` replaces the package's layout files, `env` adds to its .env.initrd-flash."""
    shape = PACKAGES[machine]
    content = tmp_path / f"tegraflash-{machine}"
    content.mkdir(parents=True)
    for name in shape["scripts"]:
        script = stand_ins.add(name, INITRD_FLASH if name == "initrd-flash" else WRITE_TARGET)
        (content / name).write_text(script.read_text())
        (content / name).chmod(0o755)
        script.unlink()  # only the copies inside the package may run
    values = {"FLASH_HELPER": "tegra-flash-helper.sh", "CHIPID": '"0x23"', "MACHINE": f'"{machine}"',
              "ROOTFS_IMAGE": '"gpu-k8s-image.ext4"', "DATAFILE": f'"gpu-k8s-image-{machine}.dataimg"',
              **{key: f'"{value}"' if not value.isdigit() else value for key, value in shape["env"].items()},
              **(env or {})}
    (content / ".env.initrd-flash").write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    for name in ("flash.xml.in", "external-flash.xml.in"):
        if name in shape:
            (content / name).write_text(shape[name](slot_bytes))
    for name, text in (layouts or {}).items():
        (content / name).write_text(text)
    with (content / "gpu-k8s-image.ext4").open("wb") as rootfs:
        rootfs.truncate(slot_bytes // 2)  # sparse
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


def kept_dir(message: str) -> Path:
    return Path(re.search(r"kept in (\S+?gpu-k8s-flash-logs-\w+)", message).group(1))


def options(build_dir: Path, host_tree, **overrides) -> flash.FlashOptions:
    return flash.FlashOptions(build_dir=build_dir, root=host_tree.root, **overrides)


def device_content(host_tree, name: str) -> bytes:
    return (host_tree.root / "dev" / name).read_bytes()


# --- recovery mode over USB ---------------------------------------------------------------

def test_full_flash_runs_initrd_flash_on_the_port_of_the_orin_nano_found(
        host_tree, nvme_build, stand_ins, kept_logs) -> None:
    host_tree.add_usb_device("1-4", "0955", "7f21")  # a Nano on another port is not flashed
    host_tree.add_usb_device("1-2", "0955", "7523", serial="1421924000123")
    line, verdict = orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    (call,) = stand_ins.calls("initrd-flash")
    assert call["argv"] == ["--usb-instance", "1-2"]
    assert "gpu-k8s-flash-" in call["cwd"] and not Path(call["cwd"]).exists()  # unpacked, then cleaned up
    assert "Jetson Orin Nano 8GB" in line and "port 1-2" in line
    # the board's own report says so, and the logs outlive the unpacked package
    assert verdict.startswith('the board reported "Final status: SUCCESS"; initrd-flash\'s logs are kept in ')
    kept = kept_dir(verdict)
    assert "Final status: SUCCESS" in next(kept.glob("log.initrd-flash.*")).read_text()
    assert (kept / "device-logs-2026-11-26-17.30.00" / "export-nvme0n1.log").is_file()


# --- the verdict: the board's result line, not initrd-flash's exit status ------------------

def test_a_board_that_reports_failed_is_an_error_although_initrd_flash_exits_0(
        host_tree, nvme_build, stand_ins, kept_logs, monkeypatch) -> None:
    # meta-tegra's initrd-flash prints "Final status: FAILED" and exits 0 (initrd-flash.sh, T234 branch)
    host_tree.add_usb_device("1-2", "0955", "7523")
    monkeypatch.setenv("FINAL_STATUS", "FAILED")
    with pytest.raises(flash.FlashError, match=r'^initrd-flash exited 0, but the board reports a failure '
                       r'\("Final status: FAILED"\); its logs are kept in .* the board is not flashed; put it back '
                       r"in recovery mode") as failed:
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    kept = kept_dir(str(failed.value))
    assert "Final status: FAILED" in next(kept.glob("log.initrd-flash.*")).read_text()
    assert (kept / "device-logs-2026-11-26-17.30.00").is_dir(), "the board's own logs say why"
    assert len(stand_ins.calls("initrd-flash")) == 1


def test_a_log_without_the_boards_result_line_is_an_error(host_tree, nvme_build, stand_ins, kept_logs,
                                                          monkeypatch) -> None:
    host_tree.add_usb_device("1-2", "0955", "7523")
    monkeypatch.setenv("FINAL_STATUS", "")
    with pytest.raises(flash.FlashError, match=r'^initrd-flash exited 0, but its log has no result line from the '
                       r'board \("Final status: SUCCESS"\), so the Orin is not known to be flashed \(its logs are '
                       r"kept in ") as unknown:
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    assert "Waiting for final status" in next(kept_dir(str(unknown.value)).glob("log.initrd-flash.*")).read_text()


def test_an_initrd_flash_that_exits_non_zero_is_an_error_naming_its_kept_logs(
        host_tree, nvme_build, stand_ins, kept_logs, monkeypatch) -> None:
    host_tree.add_usb_device("1-2", "0955", "7523")
    monkeypatch.setenv("INITRD_FLASH_EXIT", "1")
    with pytest.raises(flash.FlashError, match=r"^initrd-flash failed with exit code 1; its logs are kept in ") as no:
        orin.run_orin_flash(options(nvme_build, host_tree), "jetson-orin-nano")
    assert "Machine:       jetson-orin-nano-devkit-nvme" in next(
        kept_dir(str(no.value)).glob("log.initrd-flash.*")).read_text()
    assert not Path(stand_ins.calls("initrd-flash")[0]["cwd"]).exists(), "the unpacked package itself is gone"


def test_the_orin_verdict_reads_the_last_final_status_line() -> None:
    assert initrd_flash.orin_verdict("Final status: SUCCESS\nSuccessfully finished at x\n") == initrd_flash.Verdict(
        "done", "Final status: SUCCESS")
    assert initrd_flash.orin_verdict("Final status: FAILED\n").outcome == "failed"
    # the device's status file holds PENDING until the board is done: anything but SUCCESS is no flash
    assert initrd_flash.orin_verdict("Final status: PENDING: expecting command sequence from host\n").outcome == (
        "failed")
    assert initrd_flash.orin_verdict("Final status: SUCCESS\nFinal status: FAILED\n").outcome == "failed"
    assert initrd_flash.orin_verdict("== Step 5: Waiting for final status ==\nERR: x\n").outcome is None
    # Thor's lines are not the Orin's: one reader each, never a line of the other chip taken for a verdict
    assert initrd_flash.orin_verdict("Flashing finished Successfully!!\n").outcome is None


@pytest.mark.parametrize(("method", "flag"), [("spi-only", "--qspi-only"), ("external-only", "--external-only")])
def test_partial_flashes_pass_initrd_flashs_own_flags(host_tree, nvme_build, stand_ins, method, flag) -> None:
    host_tree.add_usb_device("3-1", "0955", "7523")
    orin.run_orin_flash(options(nvme_build, host_tree, method=method), "jetson-orin-nano")
    assert stand_ins.calls("initrd-flash")[0]["argv"] == [flag, "--usb-instance", "3-1"]


def test_agx_orin_is_found_by_its_own_id_and_flashed_on_its_emmc(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-agx-orin-devkit")
    host_tree.add_usb_device("2-1", "0955", "7023")
    line, _ = orin.run_orin_flash(options(build_dir, host_tree), "jetson-agx-orin")
    assert host_tools.calls("initrd-flash")[0]["argv"] == ["--usb-instance", "2-1"]
    assert "Jetson AGX Orin" in line


# --- the AGX Orin roots on its eMMC --------------------------------------------------------

@pytest.mark.parametrize(("method", "device"), [("external", "/dev/sdb"), ("sdcard", "/dev/sdb"), ("sdcard", None)])
def test_the_agx_orin_is_no_nvme_or_sd_machine(tmp_path, host_tree, host_tools, method, device) -> None:
    # meta-tegra's jetson-agx-orin-devkit keeps TNSPEC_BOOTDEV mmcblk0p1 with flash_t234_qspi_sdmmc.xml:
    # its package has no external layout and no doexternal.sh or dosdcard.sh; initrd-flash writes the eMMC
    build_dir = orin_build(tmp_path, host_tools, "jetson-agx-orin-devkit")
    with pytest.raises(flash.FlashUsageError, match=r"^jetson-agx-orin-devkit keeps its rootfs on its eMMC, .*only "
                       r"initrd-flash writes, over USB .*use --method full, or external-only"):
        orin.run_orin_flash(options(build_dir, host_tree, method=method, device=device, yes=True), "jetson-agx-orin")
    assert host_tools.calls("initrd-flash") == [] and device_content(host_tree, "sdb").startswith(b"ORIGINAL")
    assert orin.ORIN_TARGETS["jetson-agx-orin-devkit"].storage == "emmc"


def test_a_package_that_roots_elsewhere_than_flash_takes_its_machine_to_is_not_flashed(
        tmp_path, host_tree, host_tools, monkeypatch) -> None:
    # the table and meta-tegra disagreeing (the AGX Orin once taken for an NVMe machine) stops the flash
    build_dir = orin_build(tmp_path, host_tools, "jetson-agx-orin-devkit")
    host_tree.add_usb_device("2-1", "0955", "7023")
    wrong = orin.OrinTarget("jetson-agx-orin-devkit", orin.AGX_ORIN_DEVKIT_IDS, "nvme", orin.AGX_ORIN_RECOVERY)
    monkeypatch.setitem(orin.ORIN_TARGETS, "jetson-agx-orin-devkit", wrong)
    with pytest.raises(flash.FlashError, match=r"this package writes the rootfs to the eMMC .*but flash takes "
                       r"jetson-agx-orin-devkit to root on its NVMe drive: nothing was flashed"):
        orin.run_orin_flash(options(build_dir, host_tree), "jetson-agx-orin")
    assert host_tools.calls("initrd-flash") == []


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
    opts = options(nvme_build, host_tree, dry_run=True)
    orin.run_orin_flash(opts, "jetson-orin-nano")
    out = capsys.readouterr().out
    assert "would run: tar --zstd -xf " in out
    assert "./initrd-flash --usb-instance 1-2" in out
    assert stand_ins.calls("initrd-flash") == []
    assert opts.stops == [], "nothing a real run would stop at"


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


def test_the_whole_layout_is_counted_against_the_drive_not_the_rootfs_twice(tmp_path, host_tree, host_tools) -> None:
    # Two 400 MB slots and the 64 MB data partition fit the 1 GB drive; with the 400 MB UDA NVIDIA puts
    # ahead of them they do not, although the rootfs image (200 MB) twice would.
    uda = (("UDA", 419430400),)
    crowded = orin_build(tmp_path / "uda", host_tools, "jetson-orin-nano-devkit-nvme", slot_bytes=400 * MB,
                         layouts={"external-flash.xml.in": layout(rootfs_device("external", 400 * MB, uda))})
    with pytest.raises(flash.FlashError, match=r"refusing to write /dev/sdd: .*smaller than the image .*the layout "
                       r"\(external-flash.xml.in: every partition of its rootfs device, as make-sdcard lays them "
                       r"out\) needs 1.2\d GB: use a card or drive of 8 GB or more"):
        orin.run_orin_flash(options(crowded, host_tree, method="external", device="/dev/sdd", yes=True),
                            "jetson-orin-nano")
    assert host_tools.calls("doexternal.sh") == []
    assert device_content(host_tree, "sdd").startswith(b"ORIGINAL")
    fits = orin_build(tmp_path / "slots", host_tools, "jetson-orin-nano-devkit-nvme", slot_bytes=400 * MB)
    orin.run_orin_flash(options(fits, host_tree, method="external", device="/dev/sdd", yes=True), "jetson-orin-nano")
    assert device_content(host_tree, "sdd") == b"WRITTEN BY doexternal.sh"


def test_sd_devkit_card_is_written_by_dosdcard(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit")
    orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", device="/dev/sdb", yes=True),
                              "jetson-orin-nano-sd")
    assert host_tools.calls("dosdcard.sh")[0]["argv"] == ["-y", str(host_tree.root / "dev" / "sdb")]
    assert device_content(host_tree, "sdb") == b"WRITTEN BY dosdcard.sh"


# The SD-card Orin's flash.xml.in as the layer's build packs it: NVIDIA's partition sizes, two
# 14 GiB slots, the 1 GiB data image (tests/layer/test_orin_layer.py checks the same against the layer).
REAL_SD_LAYOUT = tl.as_packaged(
    tl.layout(tl.qspi_device(), tl.rootfs_device("sdcard", sizes=tl.NVIDIA_SIZES)).replace(
        tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"),
        tl.partition("permanet_user_storage", pid=17, filename="DATAFILE", attribute="0x808", size=str(1 << 30))
        + tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF")),
    tl.ROOTFSPART_SIZE_DEFAULT // 2)


def test_a_32_gb_card_is_refused_for_the_sd_card_orin_naming_the_64_gb_it_takes(tmp_path, host_tree,
                                                                                 host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit", layouts={"flash.xml.in": REAL_SD_LAYOUT})
    with pytest.raises(flash.FlashError, match=r"refusing to write /dev/sdb: .*smaller than the image .*needs "
                       r"32.70 GB: use a card or drive of 64 GB or more"):
        orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", device="/dev/sdb", yes=True),
                            "jetson-orin-nano-sd")
    assert host_tools.calls("dosdcard.sh") == [] and device_content(host_tree, "sdb").startswith(b"ORIGINAL")
    host_tree.add_disk("sdf", dev="8:80", size_bytes=64 * GB, removable=True, model="SanDisk Extreme 64GB",
                       bus_path="devices/pci0000:00/0000:00:14.0/usb2/2-3/2-3:1.0/host11/target11:0:0/11:0:0:0/block")
    orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", device="/dev/sdf", yes=True),
                        "jetson-orin-nano-sd")
    assert device_content(host_tree, "sdf") == b"WRITTEN BY dosdcard.sh"


def test_the_sd_image_is_made_for_the_card_the_layer_lays_out_for_and_kept(tmp_path, host_tree, host_tools) -> None:
    build_dir = orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit", layouts={"flash.xml.in": REAL_SD_LAYOUT})
    kept = tmp_path / "out" / "orin.sdcard"
    (line,) = orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", output=kept), "jetson-orin-nano-sd")
    size = orin.ORIN_SD_CARD_SIZE
    assert host_tools.calls("dosdcard.sh")[0]["argv"] == ["-y", "-s", size, "-b", "gpu-k8s-image"]
    assert kept.stat().st_size == make_sdcard.card_sectors(size) * 512 and str(kept) in line


def test_an_sd_layout_larger_than_the_sd_image_is_refused_before_dosdcard_runs(tmp_path, host_tree,
                                                                                host_tools) -> None:
    # a build with 31 GB slots outgrows the 64G image make-sdcard would make
    big = REAL_SD_LAYOUT.replace(str(tl.ROOTFSPART_SIZE_DEFAULT // 2), str(31 * GB))
    build_dir = orin_build(tmp_path, host_tools, "jetson-orin-nano-devkit", layouts={"flash.xml.in": big})
    with pytest.raises(flash.FlashError, match=r"^the SD image would be 64G \(63.36 GB after make-sdcard's 1 %\), but "
                       r"the layout \(flash.xml.in: .*\) needs 6\d.\d\d GB: use a card or drive of 128 GB or more"):
        orin.run_orin_flash(options(build_dir, host_tree, method="sdcard", output=tmp_path / "x.sdcard"),
                            "jetson-orin-nano-sd")
    assert host_tools.calls("dosdcard.sh") == []


@pytest.mark.parametrize(("machine", "method", "device", "message"), [
    ("jetson-orin-nano-devkit-nvme", "sdcard", "/dev/sdb", "keeps its rootfs on its NVMe drive, not an SD card: use "
     "--method external"),
    ("jetson-orin-nano-devkit", "external", "/dev/sdb", "keeps its rootfs on its SD card, not an NVMe drive: use "
     "--method sdcard"),
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
