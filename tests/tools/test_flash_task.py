"""flash: recovery-mode detection, the tegraflash scripts, and SD writes that refuse to
touch the wrong disk. Every refusal proves bmaptool/doflash never ran and the target
device file is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.flash import flash, orin, provision, targets, usb
from tools.usage import exit_status

REPO_ROOT = Path(__file__).resolve().parents[2]

GB = 1000**3

BMAPTOOL = """
image, target = argv[-2], argv[-1]
with open(target, 'wb') as device:
    device.write(b'WRITTEN FROM ' + os.path.basename(image).encode())
print(f'bmaptool: info: copying image {os.path.basename(image)} to {target}')
"""


@pytest.fixture
def sd_image(tmp_path: Path) -> Path:
    image = tmp_path / "gpu-k8s-image-jetson-nano-devkit.sdcard"
    with image.open("wb") as out:
        out.truncate(8 * GB)  # sparse: no disk space used
    return image


def write_options(host_tree, sd_image: Path, device: str, **overrides) -> flash.FlashOptions:
    return flash.FlashOptions(sd_image=sd_image, device=device, root=host_tree.root, **overrides)


def device_content(host_tree, name: str) -> bytes:
    return (host_tree.root / "dev" / name).read_bytes()


def test_sd_image_is_written_to_a_safe_card_with_bmaptool(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb", yes=True), euid=0, interactive=False)
    (call,) = stand_ins.calls("bmaptool")
    assert call["argv"] == ["copy", "--nobmap", str(sd_image), str(host_tree.root / "dev" / "sdb")]
    assert device_content(host_tree, "sdb") == b"WRITTEN FROM " + sd_image.name.encode()


def test_bmap_beside_the_image_is_used(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    bmap = sd_image.with_name(sd_image.name + ".bmap")
    bmap.write_text("<bmap/>")
    flash.run_flash(write_options(host_tree, sd_image, "sdb", yes=True), euid=0, interactive=False)
    assert stand_ins.calls("bmaptool")[0]["argv"][:3] == ["copy", "--bmap", str(bmap)]


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        ("/dev/sda", "it holds / of this host"),
        ("/dev/sdc", "it is mounted: /dev/sdc1 on /media/user/CARD"),
        ("/dev/sdd", "smaller than the image"),
        ("/dev/nvme0n1", "not removable"),
        ("/dev/mmcblk1", "not removable"),
    ],
)
def test_unsafe_devices_are_refused_and_nothing_is_written(
    host_tree, sd_image, stand_ins, device: str, reason: str
) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    name = device.removeprefix("/dev/")
    before = device_content(host_tree, name)
    with pytest.raises(flash.FlashError, match=f"refusing to write {device}: .*{reason}"):
        flash.run_flash(write_options(host_tree, sd_image, device, yes=True), euid=0, interactive=False)
    assert stand_ins.calls("bmaptool") == []
    assert device_content(host_tree, name) == before


def test_refusal_even_when_the_person_confirms_interactively(host_tree, sd_image, stand_ins, monkeypatch) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    monkeypatch.setattr("builtins.input", lambda prompt: "/dev/sdc")
    with pytest.raises(flash.FlashError, match=r"mounted: .*\(unmount it first \(sudo umount /dev/sdc1"):
        flash.run_flash(write_options(host_tree, sd_image, "/dev/sdc"), euid=0, interactive=True)
    assert stand_ins.calls("bmaptool") == []


@pytest.mark.parametrize(("device", "reason"), [
    ("/dev/sda", "it holds / of this host"),
    ("/dev/sdc", "it is mounted: /dev/sdc1 on /media/user/CARD"),
])
def test_no_flag_writes_the_hosts_own_disk_or_a_mounted_one(host_tree, sd_image, stand_ins, monkeypatch,
                                                             device: str, reason: str) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    name = device.removeprefix("/dev/")
    before = device_content(host_tree, name)
    monkeypatch.setattr("builtins.input", lambda prompt: device)
    for flags in ({"force_device": device, "yes": True}, {"force_device": name}, {"yes": True}):
        for interactive in (False, True):
            with pytest.raises(flash.FlashError) as refused:
                flash.run_flash(write_options(host_tree, sd_image, device, **flags), euid=0, interactive=interactive)
            assert reason in str(refused.value) and "--force-device" not in str(refused.value), flags
    assert stand_ins.calls("bmaptool") == []
    assert device_content(host_tree, name) == before


def test_force_device_writes_an_internal_drive_that_passes_every_other_check(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    options = write_options(host_tree, sd_image, "/dev/nvme0n1", force_device="/dev/nvme0n1")
    flash.run_flash(options, euid=0, interactive=False)
    assert device_content(host_tree, "nvme0n1").startswith(b"WRITTEN")


def test_a_regular_file_as_device_is_named_by_its_real_path_and_nothing_is_written(
        host_tree, sd_image, stand_ins, tmp_path) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    target = tmp_path / "card.img"
    target.write_bytes(b"ORIGINAL")
    with pytest.raises(flash.FlashUsageError) as refused:
        flash.run_flash(write_options(host_tree, sd_image, str(target), yes=True), euid=0, interactive=False)
    assert str(refused.value).startswith(f"--device {target} is a regular file ({target}), not a disk")
    assert stand_ins.calls("bmaptool") == [] and target.read_bytes() == b"ORIGINAL"


def test_force_device_must_name_the_target(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    options = write_options(host_tree, sd_image, "/dev/sda", force_device="/dev/sdb")
    with pytest.raises(flash.FlashError, match="does not name the target"):
        flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("bmaptool") == []
    assert device_content(host_tree, "sda").startswith(b"ORIGINAL")


def test_force_cannot_make_a_too_small_card_fit(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    with pytest.raises(flash.FlashError, match="smaller than the image"):
        flash.run_flash(write_options(host_tree, sd_image, "/dev/sdd", force_device="sdd"), euid=0, interactive=False)
    assert device_content(host_tree, "sdd").startswith(b"ORIGINAL")


def test_safe_card_needs_confirmation_when_not_interactive(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    with pytest.raises(flash.FlashError, match="needs confirmation"):
        flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb"), euid=0, interactive=False)
    assert stand_ins.calls("bmaptool") == []


def test_typed_confirmation_writes_and_a_wrong_answer_does_not(host_tree, sd_image, stand_ins, monkeypatch) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")
    with pytest.raises(flash.FlashError, match="not confirmed"):
        flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb"), euid=0, interactive=True)
    assert stand_ins.calls("bmaptool") == []
    monkeypatch.setattr("builtins.input", lambda prompt: "/dev/sdb")
    flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb"), euid=0, interactive=True)
    assert device_content(host_tree, "sdb").startswith(b"WRITTEN")


def test_dry_run_shows_the_write_and_writes_nothing(host_tree, sd_image, stand_ins, capsys) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    results = flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb", dry_run=True), euid=1000,
                              interactive=False)
    assert results == [f"would write {sd_image} to /dev/sdb"], "a dry run never reads as if it wrote"
    out = capsys.readouterr().out
    assert f"would run: sudo bmaptool copy --nobmap {sd_image}" in out
    assert "/dev/sdb: Generic STORAGE DEVICE" in out
    assert stand_ins.calls("bmaptool") == []
    assert device_content(host_tree, "sdb").startswith(b"ORIGINAL")


# --- USB recovery flashing with a real tar and stand-in tegraflash scripts -------------

DOFLASH = (
    "print('*** Flashing target device started. ***')\n"
    "print('*** The target device has been flashed successfully. ***')\n"
)
DOSDCARD = (
    "open(os.path.join(os.getcwd(), 'gpu-k8s-image.sdcard'), 'wb').truncate(4 * 1000**3)\n"
    "print('Creating SD card image gpu-k8s-image.sdcard... done')\n"
)


@pytest.fixture
def tegraflash_build(tmp_path: Path, stand_ins) -> Path:
    """A kas build dir whose deploy dir holds a tegraflash package with stand-in scripts."""
    content = tmp_path / "tegraflash"
    content.mkdir()
    for name, body in (("doflash.sh", DOFLASH), ("dosdcard.sh", DOSDCARD)):
        script = stand_ins.add(name, body)
        (content / name).write_text(script.read_text())
        (content / name).chmod(0o755)
        script.unlink()  # only the copies inside the package may run
    (content / "flash.xml.in").write_text("<partition_layout/>")
    build_dir = tmp_path / "build"
    deploy = build_dir / "tmp" / "deploy" / "images" / "jetson-nano-devkit"
    deploy.mkdir(parents=True)
    package = deploy / "gpu-k8s-image-jetson-nano-devkit.tegraflash.tar.gz"
    subprocess.run(["tar", "-czf", str(package), "-C", str(content), "."], check=True)
    return build_dir


def test_full_flash_unpacks_and_runs_doflash_for_the_nano(host_tree, tegraflash_build, stand_ins) -> None:
    host_tree.add_usb_device("1-2", "0955", "7f21", serial="0423418040000")
    options = flash.FlashOptions(method="full", build_dir=tegraflash_build, root=host_tree.root)
    (line,) = flash.run_flash(options, euid=0, interactive=False)
    (call,) = stand_ins.calls("doflash.sh")
    assert call["argv"] == []
    assert (Path(call["cwd"]) / "flash.xml.in").exists() is False  # temp dir cleaned up afterwards
    assert "gpu-k8s-flash-" in call["cwd"]
    assert "port 1-2" in line


def test_spi_only_flash_passes_spi_only(host_tree, tegraflash_build, stand_ins) -> None:
    host_tree.add_usb_device("3-1", "0955", "7f21")
    options = flash.FlashOptions(method="spi-only", build_dir=tegraflash_build, root=host_tree.root)
    flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("doflash.sh")[0]["argv"] == ["--spi-only"]


def test_no_board_in_recovery_is_refused_with_how_to(host_tree, tegraflash_build, stand_ins) -> None:
    options = flash.FlashOptions(method="full", build_dir=tegraflash_build, root=host_tree.root)
    with pytest.raises(flash.FlashError, match="no Jetson Nano in recovery mode found.*FC REC"):
        flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("doflash.sh") == []


def test_another_jetson_in_recovery_is_not_a_nano(host_tree, tegraflash_build, stand_ins) -> None:
    host_tree.add_usb_device("1-4", "0955", "7019")
    options = flash.FlashOptions(method="full", build_dir=tegraflash_build, root=host_tree.root)
    with pytest.raises(flash.FlashError, match=r"not a Nano in recovery mode \(USB 0955:7019\)"):
        flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("doflash.sh") == []


def test_missing_tegraflash_package_says_how_to_build_it(host_tree, tmp_path: Path) -> None:
    options = flash.FlashOptions(build_dir=tmp_path / "empty", root=host_tree.root)
    with pytest.raises(flash.FlashError, match="./task build --machine jetson-nano"):
        flash.run_flash(options, euid=0, interactive=False)


def test_sdcard_method_makes_the_image_and_keeps_it(host_tree, tegraflash_build, stand_ins, tmp_path) -> None:
    kept = tmp_path / "out" / "nano.sdcard"
    options = flash.FlashOptions(method="sdcard", build_dir=tegraflash_build, output=kept, root=host_tree.root)
    (line,) = flash.run_flash(options, euid=0, interactive=False)
    assert kept.stat().st_size == 4 * GB
    assert str(kept) in line
    assert len(stand_ins.calls("dosdcard.sh")) == 1


def test_sdcard_method_refuses_an_unsafe_device_before_making_the_image(host_tree, tegraflash_build, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    options = flash.FlashOptions(
        method="sdcard", build_dir=tegraflash_build, device="/dev/sda", yes=True, root=host_tree.root
    )
    with pytest.raises(flash.FlashError, match="refusing to write /dev/sda"):
        flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("dosdcard.sh") == []
    assert stand_ins.calls("bmaptool") == []
    assert device_content(host_tree, "sda").startswith(b"ORIGINAL")


def test_sdcard_method_writes_the_made_image_to_a_safe_card(host_tree, tegraflash_build, stand_ins, tmp_path) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    options = flash.FlashOptions(
        method="sdcard",
        build_dir=tegraflash_build,
        device="/dev/sdb",
        yes=True,
        output=tmp_path / "kept.sdcard",
        root=host_tree.root,
    )
    flash.run_flash(options, euid=0, interactive=False)
    assert device_content(host_tree, "sdb") == b"WRITTEN FROM gpu-k8s-image.sdcard"


def test_dry_run_flash_shows_every_command_and_runs_none(host_tree, tegraflash_build, stand_ins, capsys) -> None:
    options = flash.FlashOptions(method="full", build_dir=tegraflash_build, dry_run=True, root=host_tree.root)
    results = flash.run_flash(options, euid=1000, interactive=False)
    assert results == ["would flash (full) the Nano in recovery mode (none is connected now)"]
    out = capsys.readouterr().out
    assert "would run: tar -xzf " in out
    assert "would run: cd /tmp/gpu-k8s-flash-" in out or "would run: cd " in out
    assert "sudo ./doflash.sh" in out
    assert stand_ins.calls("doflash.sh") == []


def test_recovery_scan_lists_nano_and_others_and_ignores_other_usb(host_tree) -> None:
    host_tree.add_usb_device("1-1", "046d", "c52b")  # a mouse
    host_tree.add_usb_device("1-2", "0955", "7f21")
    host_tree.add_usb_device("1-3", "0955", "7e19")
    host_tree.add_usb_device("1-5", "0955", "7020")  # an NVIDIA device not in recovery
    boards = usb.find_recovery_boards(host_tree.root)
    assert [(b.sysfs_name, b.is_nano) for b in boards] == [("1-2", True), ("1-3", False)]
    assert usb.select_recovery_board(boards, usb.NANO).sysfs_name == "1-2"


def test_two_nanos_are_refused(host_tree) -> None:
    host_tree.add_usb_device("1-2", "0955", "7f21")
    host_tree.add_usb_device("2-2", "0955", "7f21")
    with pytest.raises(usb.NotOneBoardInRecovery, match=r"^2 Nanos are in recovery mode \(.*\); doflash.sh flashes"):
        usb.select_recovery_board(usb.find_recovery_boards(host_tree.root), usb.NANO)


ORIN_NANO = orin.ORIN_TARGETS["jetson-orin-nano-devkit-nvme"].recovery


@pytest.mark.parametrize(
    ("target", "present", "refusal"),
    [
        (usb.NANO, ["7523"], "no Jetson Nano (0955:7f21) in recovery mode, but found a Jetson Orin Nano 8GB"),
        (usb.NANO, [], "no Jetson Nano in recovery mode found on USB; put the Nano in recovery mode"),
        (ORIN_NANO, ["7f21"], "no board for jetson-orin-nano-devkit-nvme (0955:7523 Jetson Orin Nano 8GB"),
        (ORIN_NANO, ["7523", "7523"], "2 boards for jetson-orin-nano-devkit-nvme are in recovery mode"),
        (ORIN_NANO, [], "no jetson-orin-nano-devkit-nvme (0955:7523 Jetson Orin Nano 8GB (P3767-0003/-0005, "
         "the devkit's)) in recovery mode found on USB; put the Orin Nano devkit in recovery mode"),
    ],
)
def test_one_selection_serves_nano_and_orin_with_their_own_words(host_tree, target, present, refusal) -> None:
    for port, product in enumerate(present, start=2):
        host_tree.add_usb_device(f"1-{port}", "0955", product)
    with pytest.raises(usb.NotOneBoardInRecovery) as refused:
        usb.select_recovery_board(usb.find_recovery_boards(host_tree.root), target)
    assert str(refused.value).startswith(refusal)


def test_the_one_board_of_the_target_is_chosen_among_other_modules(host_tree) -> None:
    host_tree.add_usb_device("1-2", "0955", "7f21")
    host_tree.add_usb_device("1-3", "0955", "7523")
    boards = usb.find_recovery_boards(host_tree.root)
    assert usb.select_recovery_board(boards, usb.NANO).sysfs_name == "1-2"
    assert usb.select_recovery_board(boards, ORIN_NANO).sysfs_name == "1-3"


def test_sudo_only_when_not_root() -> None:
    assert flash.privileged(["./doflash.sh"], euid=0) == ["./doflash.sh"]
    assert flash.privileged(["./doflash.sh"], euid=1000) == ["sudo", "./doflash.sh"]


# --- refusals a first hour meets: host tools, dry runs that would stop, options that clash -----

def only_stand_ins_on_path(stand_ins, monkeypatch) -> None:
    """A host without bmaptool, debugfs and the rest: only the test's stand-ins are on PATH."""
    monkeypatch.setenv("PATH", str(stand_ins.bin_dir))


def test_an_sd_write_without_bmaptool_is_refused_naming_its_package(host_tree, sd_image, stand_ins,
                                                                    monkeypatch) -> None:
    only_stand_ins_on_path(stand_ins, monkeypatch)
    with pytest.raises(flash.FlashError, match=rf"^writing {sd_image.name} to /dev/sdb needs bmaptool \(apt-get "
                       r"install bmap-tools\)$"):
        flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb", yes=True), euid=0, interactive=False)
    assert device_content(host_tree, "sdb").startswith(b"ORIGINAL")


def test_the_nano_sdcard_method_without_bmaptool_stops_before_dosdcard_runs(host_tree, tegraflash_build, stand_ins,
                                                                           monkeypatch) -> None:
    only_stand_ins_on_path(stand_ins, monkeypatch)
    options = flash.FlashOptions(method="sdcard", build_dir=tegraflash_build, device="/dev/sdb", yes=True,
                                 root=host_tree.root)
    with pytest.raises(flash.FlashError, match=r"needs bmaptool \(apt-get install bmap-tools\)"):
        flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("dosdcard.sh") == [] and device_content(host_tree, "sdb").startswith(b"ORIGINAL")


def test_a_dry_run_without_bmaptool_warns_shows_the_rest_and_exits_1(host_tree, sd_image, stand_ins, monkeypatch,
                                                                    capsys) -> None:
    only_stand_ins_on_path(stand_ins, monkeypatch)
    options = write_options(host_tree, sd_image, "/dev/sdb", yes=True, dry_run=True)
    with pytest.raises(flash.DryRunStopped, match=r"^dry run: a real flash would stop here: writing .* needs bmaptool "
                       r"\(apt-get install bmap-tools\); fix that and run again$") as stopped:
        targets.flash_machine("jetson-nano", options)
    out = capsys.readouterr().out
    assert "warning: writing " in out and "(a real run stops here; continuing: --dry-run)" in out
    assert f"would run: bmaptool copy --nobmap {sd_image}" in out, "the dry run still shows the write"
    assert stopped.value.lines == [f"would write {sd_image} to /dev/sdb"]
    assert exit_status(stopped.value) == 1


def test_a_dry_run_that_a_real_run_would_get_through_exits_0(host_tree, tegraflash_build, stand_ins) -> None:
    host_tree.add_usb_device("1-2", "0955", "7f21")
    options = flash.FlashOptions(build_dir=tegraflash_build, dry_run=True, root=host_tree.root)
    assert targets.flash_machine("jetson-nano", options) == ["would flash (full) the Nano at USB port 1-2"]
    assert options.stops == []


def test_flash_dry_run_exits_1_where_a_real_run_would_stop(host_tree, tegraflash_build, tmp_path) -> None:
    # no Nano in recovery mode: the real run stops there; the dry run shows everything, then exits 1
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/program.py"), "--search-root", str(REPO_ROOT), "flash", "--dry-run",
         "--build-dir", str(tegraflash_build)],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={**os.environ, "GPU_K8S_HOST_ROOT": str(host_tree.root), "GPU_K8S_BUILD_ROOT": str(tmp_path / "b")})
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "./doflash.sh" in completed.stdout and "flash summary (dry run)" in completed.stdout
    assert completed.stderr.startswith("error: dry run: a real flash would stop here: no Jetson Nano in recovery "
                                       "mode found on USB")
    assert "Traceback" not in completed.stdout + completed.stderr


def test_method_and_sd_image_together_are_a_usage_error(host_tree, sd_image, stand_ins) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    for machine, method in (("jetson-nano", "sdcard"), ("jetson-orin-nano-sd", "full"), ("x86-64", "disk")):
        options = write_options(host_tree, sd_image, "/dev/sdb", yes=True, method=method)
        with pytest.raises(flash.FlashUsageError, match=rf"^--method {method} and --sd-image exclude each other: "
                           r"--sd-image writes the image file as it is, with bmaptool; leave --method out"):
            targets.flash_machine(machine, options)
    assert stand_ins.calls("bmaptool") == [] and device_content(host_tree, "sdb").startswith(b"ORIGINAL")


def test_provisioning_without_debugfs_is_refused_before_anything_is_written(host_tree, sd_image, stand_ins,
                                                                           monkeypatch, tmp_path) -> None:
    stand_ins.add("bmaptool", BMAPTOOL)
    only_stand_ins_on_path(stand_ins, monkeypatch)
    token = tmp_path / "node-token"
    token.write_text("K10::server:abc\n")
    provisioning = provision.Provisioning(server_url="https://k3s.lan:6443", token_file=token)
    with pytest.raises(flash.FlashError, match=r"^writing the provisioning onto the data partition needs debugfs "
                       r"\(apt-get install e2fsprogs\)$"):
        flash.run_flash(write_options(host_tree, sd_image, "/dev/sdb", yes=True, provisioning=provisioning), euid=0,
                        interactive=False)
    assert stand_ins.calls("bmaptool") == [], "the card is not written only to fail provisioning afterwards"


@pytest.mark.parametrize(("content", "says"), [
    ("zstd", r"is a zstd tar \(the Orin's and Thor's .tegraflash-tar.zst\), not a gzip tar \(the Jetson Nano's "
             r".tegraflash.tar.gz\): pass the .tegraflash.tar.gz that ./task build --machine jetson-nano made"),
    ("junk", r"is not a tar archive of any kind this flash reads, not a gzip tar"),
])
def test_a_nano_package_of_another_format_is_refused_before_it_is_unpacked(
        host_tree, tegraflash_build, stand_ins, tmp_path, content, says) -> None:
    host_tree.add_usb_device("1-2", "0955", "7f21")
    wrong = tmp_path / "wrong.tegraflash.tar.gz"
    if content == "zstd":
        subprocess.run(["tar", "--zstd", "-cf", str(wrong), "-C", str(tmp_path / "tegraflash"), "."], check=True)
    else:
        wrong.write_bytes(b"\0" * 1024)
    with pytest.raises(flash.FlashError, match=says):
        flash.run_flash(flash.FlashOptions(package=wrong, root=host_tree.root), euid=0, interactive=False)
    assert stand_ins.calls("doflash.sh") == []


def test_a_damaged_package_is_an_error_not_a_traceback(host_tree, tegraflash_build, stand_ins, tmp_path) -> None:
    host_tree.add_usb_device("1-2", "0955", "7f21")
    (package,) = tegraflash_build.glob("tmp/deploy/images/*/*.tegraflash.tar.gz")
    cut = tmp_path / "cut.tegraflash.tar.gz"
    cut.write_bytes(package.read_bytes()[:60])  # gzip's header, then nothing
    with pytest.raises(flash.FlashError, match=r"^tar could not unpack .*cut.tegraflash.tar.gz \(exit code \d+, its "
                       r"message above\): a damaged or incomplete package"):
        flash.run_flash(flash.FlashOptions(package=cut, root=host_tree.root), euid=0, interactive=False)
    assert stand_ins.calls("doflash.sh") == []
