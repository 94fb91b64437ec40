"""flash --machine jetson-agx-thor / jetson-agx-thor-t4000: recovery-mode detection by the Thor
modules' USB ids (0955:7026 the devkit's T5000, 0955:7226 the T4000), meta-tegra wrynose's
initrd-flash (which hands Thor to NVIDIA's unified flash) run from a real .tegraflash-tar.zst,
and the refusals: another module, no board, missing host tools, and every option that would
write a drive of this host (Thor writes none). Every refusal proves no script ran and no device
file changed. The node's join is written into the package's data image before anything runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from disk_images import HAVE_E2FSPROGS, ext4, read_back

from tools.flash import flash, initrd_flash, provision, targets, thor, usb

DEVKIT = "jetson-agx-thor-devkit"
T4000 = "jetson-agx-thor-t4000"
MACHINE_NAME = {DEVKIT: "jetson-agx-thor", T4000: "jetson-agx-thor-t4000"}

pytestmark = [
    pytest.mark.skipif(shutil.which("zstd") is None, reason="the Thor package is .tar.zst: needs zstd"),
    pytest.mark.usefixtures("kept_logs"),  # no run leaves flash logs in /tmp
]

# initrd-flash's stand-in: what the unified flash would push is the package directory's content;
# it keeps a copy of the data image it would send (DATAFILE of .env.initrd-flash). Like
# meta-tegra's at the pin on CHIPID 0x26 it tees the unified flash's output into
# log.initrd-flash.<date> and exits 0 whatever that flash did; UNIFIED_FLASH picks the line
# NVIDIA's flash_bsp_images.py ends with (none: no result line), INITRD_FLASH_EXIT an early failure.
INITRD_FLASH = """
import shutil
values = dict(line.split('=', 1) for line in open('.env.initrd-flash').read().splitlines() if '=' in line)
name = values['DATAFILE'].strip('"')
if name and env.get('CAPTURE_DATA_IMAGE'):
    shutil.copyfile(name, env['CAPTURE_DATA_IMAGE'])
result = {'done': '\\033[01;32mFlashing finished Successfully!!\\033[0m',
          'failed': '\\033[01;31mFlashing finished Unsuccessfully!!\\033[0m',
          'none': ''}[env.get('UNIFIED_FLASH', 'done')]
with open('log.initrd-flash.2026-11-26-17.30.00', 'w') as log:
    log.write('Machine:       ' + values['MACHINE'].strip('"') + '\\n')
    log.write('== Step 5: Running unified flash ==\\n' + result + '\\n')
print('Found Jetson device in recovery mode'); print('Running unified flash')
if env.get('INITRD_FLASH_EXIT'):
    sys.exit(int(env['INITRD_FLASH_EXIT']))
"""
# The shape of the layouts meta-tegra packs for Thor with our data partition in place: the QSPI
# template (flash.xml.in, boot firmware only) and the t264 NVMe A/B layout
# (external-flash.xml.in) whose partition 13 after APP_b takes DATAFILE.
QSPI_LAYOUT = '<partition_layout version="01.00.0000"><device type="spi" instance="0"></device></partition_layout>'
NVME_LAYOUT = """<?xml version="1.0"?>
<partition_layout version="01.00.0000">
    <device type="external" instance="0" sector_size="512" num_sectors="EXT_NUM_SECTORS" >
        <partition name="RECNAME" id="3" type="kernel"><filename> RECFILE </filename></partition>
        <partition name="esp" type="data"><filename> ESP_FILE </filename></partition>
        <partition name="UDA" type="data"><size> 419430400 </size></partition>
        <partition name="reserved" type="data"><size> 351272960 </size></partition>
        <partition name="APP" id="1" type="data"><filename> APPFILE </filename></partition>
        <partition name="APP_b" id="2" type="data"><filename> APPFILE_b </filename></partition>
        <partition name="permanet_user_storage" id="13" type="data">
            <allocation_attribute> 0x808 </allocation_attribute>
            <filename> DATAFILE </filename>
        </partition>
    </device>
</partition_layout>
"""


def thor_build(tmp_path: Path, stand_ins, machine: str = DEVKIT, manifest: str | None = None,
               data_image: bool = False) -> Path:
    """A kas build dir whose deploy dir holds a Thor .tegraflash-tar.zst with a stand-in initrd-flash."""
    content = tmp_path / f"tegraflash-{machine}"
    content.mkdir(parents=True)
    script = stand_ins.add("initrd-flash", INITRD_FLASH)
    (content / "initrd-flash").write_text(script.read_text())
    (content / "initrd-flash").chmod(0o755)
    script.unlink()  # only the copy inside the package may run
    datafile = f"gpu-k8s-image-{machine}.dataimg"
    (content / ".env.initrd-flash").write_text(
        f'FLASH_HELPER=tegra-flash-helper.sh\nBOOTDEV="nvme0n1p1"\nCHIPID="0x26"\nMACHINE="{machine}"\n'
        f'ROOTFS_IMAGE="gpu-k8s-image.ext4"\nDATAFILE="{datafile}"\nEXTERNAL_ROOTFS_DRIVE=1\nNO_INTERNAL_STORAGE=1\n')
    (content / "flash.xml.in").write_text(QSPI_LAYOUT)
    (content / "external-flash.xml.in").write_text(NVME_LAYOUT)
    (content / "gpu-k8s-image.ext4").write_bytes(b"\0" * 4096)
    if data_image:
        ext4(content / datafile, "data")
    build_dir = tmp_path / f"build-{machine}"
    deploy = build_dir / "tmp" / "deploy" / "images" / machine
    deploy.mkdir(parents=True)
    package = deploy / f"gpu-k8s-image-{machine}.tegraflash-tar.zst"
    subprocess.run(["tar", "--zstd", "-cf", str(package), "-C", str(content), "."], check=True)
    if manifest is not None:
        (deploy / f"gpu-k8s-image-{machine}.manifest").write_text(manifest)
    return build_dir


@pytest.fixture
def host_tools(stand_ins):
    """The host programs meta-tegra's Thor flashing wants, as stand-ins (the test host may lack them)."""
    for tool in ("dtc", "cpp"):
        stand_ins.add(tool)
    return stand_ins


@pytest.fixture
def devkit_build(tmp_path, host_tools) -> Path:
    return thor_build(tmp_path, host_tools)


def options(build_dir: Path, host_tree, **overrides) -> flash.FlashOptions:
    return flash.FlashOptions(build_dir=build_dir, root=host_tree.root, **overrides)


def device_contents(host_tree) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((host_tree.root / "dev").iterdir()) if path.is_file()}


# --- recovery mode over USB ---------------------------------------------------------------

def test_full_flash_runs_initrd_flash_on_the_port_of_the_thor_devkit_found(host_tree, devkit_build, stand_ins):
    host_tree.add_usb_device("1-4", "0955", "7523")  # an Orin Nano on another port is not flashed
    host_tree.add_usb_device("1-2", "0955", "7026", serial="1425124000321")
    lines = thor.run_thor_flash(options(devkit_build, host_tree), "jetson-agx-thor")
    (call,) = stand_ins.calls("initrd-flash")
    assert call["argv"] == ["--usb-instance", "1-2"]
    assert "gpu-k8s-flash-" in call["cwd"] and not Path(call["cwd"]).exists()  # unpacked, then cleaned up
    assert lines[0] == "flashed (full) the Jetson AGX Thor T5000 (P3834-0008, the devkit's) at USB port 1-2"
    assert lines[1].startswith('NVIDIA\'s unified flash reported "Flashing finished Successfully!!"; initrd-flash\'s '
                               "logs are kept in ")
    assert "Flashing finished Successfully" in kept_log(lines[1])
    assert lines[2].startswith("power-cycle the Thor (or press Reset) now")


def test_the_t4000_is_found_by_its_own_id(tmp_path, host_tree, host_tools) -> None:
    build_dir = thor_build(tmp_path, host_tools, T4000)
    host_tree.add_usb_device("2-1", "0955", "7226")
    lines = thor.run_thor_flash(options(build_dir, host_tree), "jetson-agx-thor-t4000")
    assert host_tools.calls("initrd-flash")[0]["argv"] == ["--usb-instance", "2-1"]
    assert "Jetson AGX Thor T4000 (P3834-0000)" in lines[0]


@pytest.mark.parametrize(("method", "flag"), [("spi-only", "--qspi-only"), ("external-only", "--external-only")])
def test_partial_flashes_pass_initrd_flashs_own_flags(host_tree, devkit_build, stand_ins, method, flag) -> None:
    host_tree.add_usb_device("3-1", "0955", "7026")
    thor.run_thor_flash(options(devkit_build, host_tree, method=method), "jetson-agx-thor")
    assert stand_ins.calls("initrd-flash")[0]["argv"] == [flag, "--usb-instance", "3-1"]


def kept_log(message: str) -> str:
    """The text of the log.initrd-flash.* file in the directory a message names as kept."""
    kept = Path(re.search(r"kept in (\S+?gpu-k8s-flash-logs-\w+)", message).group(1))
    (log,) = kept.glob("log.initrd-flash.*")
    return log.read_text()


def test_a_failed_unified_flash_fails_although_initrd_flash_exits_0_and_its_log_is_kept(
        host_tree, devkit_build, stand_ins, kept_logs, monkeypatch) -> None:
    # meta-tegra's initrd-flash exits 0 on Thor whatever the unified flash did: only its log knows
    host_tree.add_usb_device("1-2", "0955", "7026")
    monkeypatch.setenv("UNIFIED_FLASH", "failed")
    with pytest.raises(flash.FlashError, match=r"^initrd-flash exited 0, but NVIDIA's unified flash reports a failure"
                       r".*the board is not flashed; put it back in recovery mode") as failed:
        thor.run_thor_flash(options(devkit_build, host_tree), "jetson-agx-thor")
    assert "Flashing finished Unsuccessfully" in kept_log(str(failed.value))
    assert len(stand_ins.calls("initrd-flash")) == 1


def test_a_log_without_the_unified_flashs_result_is_an_error(
        host_tree, devkit_build, stand_ins, kept_logs, monkeypatch) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    monkeypatch.setenv("UNIFIED_FLASH", "none")
    with pytest.raises(flash.FlashError, match=r"^initrd-flash exited 0, but its log has no result line from NVIDIA's "
                       r"unified flash \(\"Flashing finished Successfully!!\"\), so the Thor is not known to be "
                       r"flashed \(its logs are kept in ") as unknown:
        thor.run_thor_flash(options(devkit_build, host_tree), "jetson-agx-thor")
    assert "Running unified flash" in kept_log(str(unknown.value))


def test_an_initrd_flash_that_exits_non_zero_keeps_its_log_past_the_temporary_package(
        host_tree, devkit_build, stand_ins, kept_logs, monkeypatch) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    monkeypatch.setenv("INITRD_FLASH_EXIT", "3")
    with pytest.raises(flash.FlashError, match=r"^initrd-flash failed with exit code 3; its logs are kept in ") as no:
        thor.run_thor_flash(options(devkit_build, host_tree), "jetson-agx-thor")
    assert "Machine:       jetson-agx-thor-devkit" in kept_log(str(no.value))
    assert not Path(stand_ins.calls("initrd-flash")[0]["cwd"]).exists(), "the unpacked package itself is gone"


def test_the_unified_flash_verdict_reads_nvidias_result_lines() -> None:
    assert initrd_flash.thor_verdict("...\n\x1b[01;32mFlashing finished Successfully!!\x1b[0m\n") == (
        initrd_flash.Verdict("done", "Flashing finished Successfully!!"))
    assert initrd_flash.thor_verdict("Flashing finished Unsuccessfully!!\n").outcome == "failed"
    crashed = "Exception 5 raised in flash BSP\nFlashing finished Successfully"  # one die failed, another not
    assert initrd_flash.thor_verdict(crashed) == initrd_flash.Verdict("failed", "Exception 5 raised in flash BSP")
    assert initrd_flash.thor_verdict("== Step 5: Running unified flash ==\nFinished at ...\n").outcome is None
    assert initrd_flash.thor_verdict("Final status: SUCCESS\n").outcome is None, "the Orin's line is not Thor's"


@pytest.mark.parametrize(("machine", "product", "seen", "hint"), [
    (DEVKIT, "7226", "a Jetson AGX Thor T4000 (P3834-0000) in recovery mode (USB 0955:7226)",
     "--machine jetson-agx-thor-t4000 for a Jetson AGX Thor T4000 (P3834-0000) (0955:7226)"),
    (T4000, "7026", "a Jetson AGX Thor T5000 (P3834-0008, the devkit's) in recovery mode (USB 0955:7026)",
     "--machine jetson-agx-thor for a Jetson AGX Thor T5000 (P3834-0008, the devkit's) (0955:7026)"),
    (DEVKIT, "7023", "a Jetson AGX Orin (P3701-0000/-0005) in recovery mode (USB 0955:7023)", "build and flash"),
    (DEVKIT, "7326", "a Jetson that is not a Nano in recovery mode (USB 0955:7326)", "build and flash"),
])
def test_a_board_of_another_module_is_refused_naming_the_right_machine_and_nothing_runs(
        tmp_path, host_tree, host_tools, machine, product, seen, hint) -> None:
    build_dir = thor_build(tmp_path, host_tools, machine)
    host_tree.add_usb_device("1-2", "0955", product)
    before = device_contents(host_tree)
    with pytest.raises(flash.FlashError) as refused:
        thor.run_thor_flash(options(build_dir, host_tree), MACHINE_NAME[machine])
    message = str(refused.value)
    assert message.startswith(f"no board for {machine} (0955:")
    assert seen in message and "this image is for another module" in message and hint in message
    assert host_tools.calls("initrd-flash") == []
    assert device_contents(host_tree) == before


def test_two_thors_in_recovery_are_refused(host_tree, devkit_build, stand_ins) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    host_tree.add_usb_device("2-2", "0955", "7026")
    with pytest.raises(flash.FlashError, match=r"^2 boards for jetson-agx-thor-devkit .*initrd-flash flashes one"):
        thor.run_thor_flash(options(devkit_build, host_tree), "jetson-agx-thor")
    assert stand_ins.calls("initrd-flash") == []


def test_no_thor_in_recovery_says_how_to_get_there(host_tree, devkit_build, stand_ins) -> None:
    host_tree.add_usb_device("1-5", "0955", "7020")  # a running Jetson, not in recovery mode
    with pytest.raises(flash.FlashError, match=r"no jetson-agx-thor-devkit \(0955:7026 .*\) in recovery mode found "
                       r"on USB; put the AGX Thor devkit in recovery mode: .*Force Recovery button"):
        thor.run_thor_flash(options(devkit_build, host_tree), "jetson-agx-thor")
    assert stand_ins.calls("initrd-flash") == []


def test_every_thor_module_id_is_known_to_the_recovery_scan(host_tree) -> None:
    for port, product in enumerate(usb.THOR_RECOVERY_MODELS, start=1):
        host_tree.add_usb_device(f"1-{port}", "0955", product)
    boards = usb.find_recovery_boards(host_tree.root)
    assert sorted(board.product_id for board in boards) == ["7026", "7226"]
    assert all(board.model and not board.orin_model and not board.is_nano for board in boards)
    # one module per machine, so a board can only ever match one Thor image
    ids = [target.product_ids for target in thor.THOR_TARGETS.values()]
    assert set().union(*ids) == set(usb.THOR_RECOVERY_MODELS) and sum(map(len, ids)) == 2


# --- Thor writes no drive of this host ------------------------------------------------------

@pytest.mark.parametrize(("changes", "complaint"), [
    ({"device": "/dev/sdb", "yes": True}, "--device/--force-device: jetson-agx-thor-devkit is flashed over USB only"),
    ({"device": "/dev/sda", "force_device": "/dev/sda"}, "no drive of this host is written"),
    ({"method": "external", "device": "/dev/sdb"}, "--device/--force-device"),
    ({"method": "external"}, "--method external: jetson-agx-thor-devkit is flashed over USB only"),
    ({"method": "sdcard"}, "use --method full, spi-only or external-only"),
    ({"output": Path("/tmp/thor.sdcard")}, "--output keeps an SD image, which a Thor has none of"),
    ({"method": "doflash"}, "unknown --method 'doflash' for a Thor; choose one of: full, spi-only, external-only"),
])
def test_every_way_to_write_a_host_drive_is_refused_before_anything_runs_or_changes(
        host_tree, devkit_build, stand_ins, changes, complaint) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    before = device_contents(host_tree)
    with pytest.raises(flash.FlashUsageError, match=re.escape(complaint)):
        thor.run_thor_flash(options(devkit_build, host_tree, **changes), "jetson-agx-thor")
    assert stand_ins.calls("initrd-flash") == []
    assert device_contents(host_tree) == before, "no device file was touched"


def test_a_kept_sd_image_is_refused_without_touching_the_drive(tmp_path, host_tree, devkit_build, stand_ins) -> None:
    image = tmp_path / "thor.sdcard"
    image.write_bytes(b"x" * 1024)
    stand_ins.add("bmaptool", "open(argv[-1], 'wb').write(b'WRITTEN BY bmaptool')\n")
    before = device_contents(host_tree)
    with pytest.raises(flash.FlashUsageError, match="--sd-image: .*flashed over USB only"):
        thor.run_thor_flash(options(devkit_build, host_tree, sd_image=image, device="/dev/sdb", yes=True),
                                  "jetson-agx-thor")
    assert stand_ins.calls("bmaptool") == [] and device_contents(host_tree) == before


# --- the host and the package -------------------------------------------------------------

def test_missing_host_tools_are_named_with_their_packages_before_anything_runs(
        host_tree, tmp_path, stand_ins, monkeypatch) -> None:
    build_dir = thor_build(tmp_path, stand_ins)
    host_tree.add_usb_device("1-2", "0955", "7026")
    monkeypatch.setenv("PATH", str(stand_ins.bin_dir))  # no zstd, dtc, cpp, python3
    with pytest.raises(flash.FlashError, match=r"Thor flashing needs zstd \(apt-get install zstd\), dtc \(apt-get "
                       r"install device-tree-compiler\), cpp \(apt-get install cpp\), python3"):
        thor.run_thor_flash(options(build_dir, host_tree), "jetson-agx-thor")
    assert stand_ins.calls("initrd-flash") == []


@pytest.mark.parametrize(("package", "complaint"), [
    ("nano", r"is a gzip tar \(the Jetson Nano's .tegraflash.tar.gz\), not a zstd tar \(the Orin's and Thor's "
             r".tegraflash-tar.zst\): pass the .tegraflash-tar.zst that ./task build --machine jetson-agx-thor made"),
    ("plain", r"is an uncompressed tar, not a zstd tar"),
    ("junk", r"is not a tar archive of any kind this flash reads, not a zstd tar"),
    ("orin", r"^this package was made for CHIPID 0x23 \(MACHINE jetson-orin-nano-devkit-nvme\), not 0x26 "
             r"\(jetson-agx-thor-devkit\), says its .env.initrd-flash: flash it with --machine jetson-orin-nano, or "
             r"pass the package ./task build --machine jetson-agx-thor made"),
    ("t4000", r"^this package was made for MACHINE jetson-agx-thor-t4000, not jetson-agx-thor-devkit, says its "
              r".env.initrd-flash: flash it with --machine jetson-agx-thor-t4000"),
])
def test_a_package_of_the_wrong_format_or_for_another_machine_is_refused_before_anything_is_flashed(
        tmp_path, host_tree, devkit_build, host_tools, package, complaint) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    wrong = tmp_path / "given.tegraflash-tar.zst"
    if package == "nano":
        subprocess.run(["tar", "-czf", str(wrong), "-C", str(tmp_path / f"tegraflash-{DEVKIT}"), "."], check=True)
    elif package == "plain":
        subprocess.run(["tar", "-cf", str(wrong), "-C", str(tmp_path / f"tegraflash-{DEVKIT}"), "."], check=True)
    elif package == "junk":
        wrong.write_bytes(b"<html>404 Not Found</html>" * 20)
    else:
        content = tmp_path / f"tegraflash-{DEVKIT}"
        env = content / ".env.initrd-flash"
        made_for = {"orin": ('"0x23"', "jetson-orin-nano-devkit-nvme"), "t4000": ('"0x26"', T4000)}[package]
        env.write_text(env.read_text().replace('"0x26"', made_for[0]).replace(f'"{DEVKIT}"', f'"{made_for[1]}"'))
        subprocess.run(["tar", "--zstd", "-cf", str(wrong), "-C", str(content), "."], check=True)
    for dry_run in (True, False):
        with pytest.raises(flash.FlashError, match=complaint):
            thor.run_thor_flash(options(devkit_build, host_tree, package=wrong, dry_run=dry_run), "jetson-agx-thor")
    assert host_tools.calls("initrd-flash") == []


def test_missing_package_says_how_to_build_it(host_tree, tmp_path, host_tools) -> None:
    with pytest.raises(flash.FlashError, match=r"tegraflash-tar.zst; build it first with "
                       r"`./task build --machine jetson-agx-thor-t4000` \(or pass --package PATH\)"):
        thor.run_thor_flash(options(tmp_path / "empty", host_tree), "jetson-agx-thor-t4000")


def test_dry_run_shows_every_command_and_runs_none(host_tree, devkit_build, stand_ins, capsys) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    lines = thor.run_thor_flash(options(devkit_build, host_tree, dry_run=True), "jetson-agx-thor")
    out = capsys.readouterr().out
    assert "would run: tar --zstd -xf " in out and "./initrd-flash --usb-instance 1-2" in out
    assert stand_ins.calls("initrd-flash") == []
    assert not [line for line in lines if line.startswith("power-cycle")], "nothing was flashed, nothing to reset"


def test_the_machine_names_pick_the_thor_path(host_tree, devkit_build, stand_ins) -> None:
    host_tree.add_usb_device("1-2", "0955", "7026")
    assert targets.kind("jetson-agx-thor") == targets.kind("jetson-agx-thor-t4000") == "thor"
    targets.flash_machine("jetson-agx-thor", options(devkit_build, host_tree))
    assert len(stand_ins.calls("initrd-flash")) == 1
    assert {"jetson-agx-thor", "jetson-agx-thor-t4000"} <= set(targets.flashable_machines())


# --- zero-touch join ----------------------------------------------------------------------

@pytest.mark.skipif(not HAVE_E2FSPROGS, reason="needs e2fsprogs (debugfs, mkfs.ext4), as the flash task does")
def test_a_thor_agent_carries_its_join_on_the_data_partition_it_is_flashed_with(
        tmp_path, host_tree, host_tools, monkeypatch) -> None:
    build_dir = thor_build(tmp_path, host_tools, manifest="k3s-agent armv9a 1.36.4\nk3s x 1\n", data_image=True)
    host_tree.add_usb_device("1-2", "0955", "7026")
    monkeypatch.setenv("CAPTURE_DATA_IMAGE", str(tmp_path / "flashed.dataimg"))
    token = tmp_path / "node-token"
    token.write_text("K10thor::server:abcdef\n")
    provisioning = provision.Provisioning(server_url="https://k3s-server.lan:6443", token_file=token, role="agent",
                                          labels=("site=lab-3",))
    lines = thor.run_thor_flash(options(build_dir, host_tree, provisioning=provisioning), "jetson-agx-thor")
    flashed = tmp_path / "flashed.dataimg"
    config = read_back(flashed, "gpu-k8s/node-config/k3s-config")
    assert 'server: "https://k3s-server.lan:6443"' in config and '  - "site=lab-3"' in config
    assert read_back(flashed, "gpu-k8s/node-config/k3s-token") == "K10thor::server:abcdef\n"
    assert "(partition permanet_user_storage of external-flash.xml.in)" in lines[0]
    assert lines[1].startswith("flashed (full) the Jetson AGX Thor T5000")


def test_a_server_image_is_not_flashed_as_an_agent(tmp_path, host_tree, host_tools) -> None:
    build_dir = thor_build(tmp_path, host_tools, manifest="k3s-server armv9a 1.36.4\nk3s x 1\n")
    host_tree.add_usb_device("1-2", "0955", "7026")
    token = tmp_path / "node-token"
    token.write_text("K10thor::server:abcdef\n")
    provisioning = provision.Provisioning(server_url="https://k3s-server.lan:6443", token_file=token, role="agent")
    with pytest.raises(flash.FlashError, match=r"--role agent, but this image was built as a k3s server .*"
                       r"./task build --machine jetson-agx-thor --role agent"):
        thor.run_thor_flash(options(build_dir, host_tree, provisioning=provisioning), "jetson-agx-thor")
    assert host_tools.calls("initrd-flash") == []
