"""Zero-touch join on the Orin: `./task flash --machine jetson-orin-* --server-url --token-file
--role --label` writes the provisioning into the data partition image of the tegraflash package,
found through the package's own flash layout (the partition whose file is DATAFILE, whatever
its name: meta-mender-tegra's layouts and ours call it permanet_user_storage) and `.env.initrd-flash`, before
initrd-flash, doexternal.sh or dosdcard.sh write anything. A package built without a data
partition is refused before anything is flashed. Real ext4 images (mkfs.ext4) read back with
the real debugfs; stand-ins for meta-tegra's scripts capture the image they would write."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from disk_images import ext4, read_back

from tools.flash import flash, orin, provision

pytestmark = [
    pytest.mark.skipif(
        not (shutil.which("debugfs") and shutil.which("mkfs.ext4") and shutil.which("zstd")),
        reason="needs e2fsprogs (debugfs, mkfs.ext4) and zstd, as the flash task itself does"),
    pytest.mark.usefixtures("kept_logs"),  # no run leaves flash logs in /tmp
]

NVME = "jetson-orin-nano-devkit-nvme"
DATAFILE = f"gpu-k8s-image-{NVME}.dataimg"  # meta-mender-tegra: ${IMAGE_BASENAME}-${MACHINE}.dataimg

# The shape of meta-mender-tegra's flash_l4t_t234_nvme_rootfs_ab.xml (wrynose, e5465ec4): the
# two root slots, UDA with no file, and the data partition that takes DATAFILE, written last.
MENDER_NVME_LAYOUT = """<?xml version="1.0"?>
<!-- Nvidia Tegra Partition Layout Version 1.0.0 -->
<partition_layout version="01.00.0000">
    <device type="external" instance="0" sector_size="512" num_sectors="EXT_NUM_SECTORS" >
        <partition name="A_kernel" id="3" type="kernel"><filename> boot.img </filename></partition>
        <partition name="esp" type="data"><filename> esp.img </filename></partition>
        <partition name="UDA" type="data"><size> 419430400 </size></partition>
        <partition name="APP" id="1" type="data"><filename> APPFILE </filename></partition>
        <partition name="APP_b" id="2" type="data"><filename> APPFILE_b </filename></partition>
        <partition name="permanent_user_storage" id= "17" type="data">
            <allocation_attribute> 0x808 </allocation_attribute>
            <filename> DATAFILE </filename>
        </partition>
    </device>
</partition_layout>
"""
# meta-tegra's redundant layout before the data partition: nothing takes DATAFILE.
STOCK_NVME_LAYOUT = MENDER_NVME_LAYOUT.replace("<filename> DATAFILE </filename>", "").replace(
    "permanent_user_storage", "reserved")
QSPI_LAYOUT = '<partition_layout version="01.00.0000"><device type="spi" instance="0"></device></partition_layout>'

# Each script copies the data image it would write (DATAFILE of .env.initrd-flash) aside; initrd-flash
# then logs the board's report as meta-tegra's does on the Orin (log.initrd-flash.<date>).
CAPTURE = """
import shutil
values = dict(line.split('=', 1) for line in open('.env.initrd-flash').read().splitlines() if '=' in line)
name = values['DATAFILE'].strip('"')
if name:
    shutil.copyfile(name, env['CAPTURE_DATA_IMAGE'])
if os.path.basename(sys.argv[0]) == 'initrd-flash':
    open('log.initrd-flash.2026-11-26-17.30.00', 'w').write('Final status: SUCCESS\\n')
"""


def orin_package(tmp_path: Path, stand_ins, layout: str = MENDER_NVME_LAYOUT, datafile: str = DATAFILE,
                 label: str = "data", manifest: str = "k3s-agent cortexa78ae 1.36.4\nk3s x 1\n",
                 role_dir: str = "jetson-orin-nano-agent") -> Path:
    """build/<role_dir>/build/tmp/deploy/images/<MACHINE> with a .tegraflash-tar.zst as meta-tegra
    wrynose packs it (.env.initrd-flash, flash.xml.in for QSPI, external-flash.xml.in for NVMe)."""
    content = tmp_path / f"content-{role_dir}"
    content.mkdir()
    for name in ("initrd-flash", "doexternal.sh"):
        script = stand_ins.add(name, CAPTURE)
        (content / name).write_text(script.read_text())
        (content / name).chmod(0o755)
        script.unlink()
    (content / ".env.initrd-flash").write_text(
        f'FLASH_HELPER=tegra-flash-helper.sh\nCHIPID="0x23"\nMACHINE="{NVME}"\nLNXFILE="boot.img"\n'
        f'ROOTFS_IMAGE="gpu-k8s-image.ext4"\nDATAFILE="{datafile}"\nEXTERNAL_ROOTFS_DRIVE=1\n')
    (content / "flash.xml.in").write_text(QSPI_LAYOUT)
    (content / "external-flash.xml.in").write_text(layout)
    (content / "gpu-k8s-image.ext4").write_bytes(b"\0" * 4096)
    if datafile:
        ext4(content / datafile, label)
    deploy = tmp_path / "build" / role_dir / "build" / "tmp" / "deploy" / "images" / NVME
    deploy.mkdir(parents=True)
    package = deploy / f"gpu-k8s-image-{NVME}.tegraflash-tar.zst"
    subprocess.run(["tar", "--zstd", "-cf", str(package), "-C", str(content), "."], check=True)
    (deploy / f"gpu-k8s-image-{NVME}.manifest").write_text(manifest)
    return package


@pytest.fixture
def orin_host(host_tree, stand_ins, tmp_path, monkeypatch):
    """Host tools as stand-ins, an Orin Nano in recovery mode, build/ under tmp_path."""
    for tool in ("dtc", "cpp", "sgdisk", "udisksctl", "bmaptool"):
        stand_ins.add(tool)
    host_tree.add_usb_device("1-2", "0955", "7523")
    monkeypatch.setattr(flash.build, "BUILD_ROOT", tmp_path / "build")
    monkeypatch.setenv("CAPTURE_DATA_IMAGE", str(tmp_path / "flashed.dataimg"))
    for name in ("KAS_WORK_DIR", "KAS_BUILD_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    return host_tree


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "node-token"
    path.write_text("K10orin::server:abcdef\n")
    return path


def agent(token: Path, **changes) -> provision.Provisioning:
    values = {"server_url": "https://k3s-server.lan:6443", "token_file": token, "role": "agent",
              "labels": ("site=lab-2",)}
    values.update(changes)
    return provision.Provisioning(**values)


def run(host_tree, provisioning: provision.Provisioning, **changes) -> list[str]:
    options = flash.FlashOptions(root=host_tree.root, provisioning=provisioning, **changes)
    return orin.run_orin_flash(options, "jetson-orin-nano", interactive=False)


def test_an_orin_agent_flashed_over_usb_carries_its_join_on_the_data_partition(
        orin_host, stand_ins, tmp_path, token) -> None:
    package = orin_package(tmp_path, stand_ins)
    packed = package.read_bytes()
    lines = run(orin_host, agent(token))
    (call,) = stand_ins.calls("initrd-flash")
    assert call["argv"] == ["--usb-instance", "1-2"]
    flashed = tmp_path / "flashed.dataimg"
    config = read_back(flashed, "gpu-k8s/node-config/k3s-config")
    assert 'server: "https://k3s-server.lan:6443"' in config and '  - "site=lab-2"' in config
    assert read_back(flashed, "gpu-k8s/node-config/k3s-token") == "K10orin::server:abcdef\n"
    assert lines[0].startswith("provisioned on the data partition: joins https://k3s-server.lan:6443")
    assert f"{DATAFILE} (partition permanent_user_storage of external-flash.xml.in)" in lines[0]
    assert package.read_bytes() == packed, "the build's package never carries the token"


def test_the_data_image_is_found_through_the_layout_not_by_its_name(orin_host, stand_ins, tmp_path, token) -> None:
    orin_package(tmp_path, stand_ins, datafile="site-data.ext4")
    run(orin_host, agent(token))
    assert "k3s-server.lan" in read_back(tmp_path / "flashed.dataimg", "gpu-k8s/node-config/k3s-config")


def test_a_drive_written_on_this_host_gets_the_provisioning_too(orin_host, stand_ins, tmp_path, token) -> None:
    orin_package(tmp_path, stand_ins)
    run(orin_host, agent(token), method="external", device="/dev/sdb", yes=True)
    assert len(stand_ins.calls("doexternal.sh")) == 1
    assert "k3s-server.lan" in read_back(tmp_path / "flashed.dataimg", "gpu-k8s/node-config/k3s-config")


@pytest.mark.parametrize(("package", "says"), [
    ({"layout": STOCK_NVME_LAYOUT}, "has no data partition (flash.xml.in and external-flash.xml.in give no "
                                    "partition the DATAFILE image)"),
    ({"datafile": ""}, "external-flash.xml.in has a data partition (permanent_user_storage) but the package "
                       "carries no image for it"),
    ({"label": "rootfs"}, f"{DATAFILE}, this package's data partition image, is not an ext4 file system "
                          "labelled 'data'"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_package_without_a_data_partition_is_refused_before_anything_is_flashed(
        orin_host, stand_ins, tmp_path, token, package: dict, says: str, dry_run: bool) -> None:
    orin_package(tmp_path, stand_ins, **package)
    with pytest.raises(flash.FlashError) as refused:
        run(orin_host, agent(token), dry_run=dry_run)
    message = str(refused.value)
    assert says in message, message
    assert "rebuild it (./task build --machine jetson-orin-nano --role agent)" in message
    assert message.endswith("nothing was flashed") and "\n" not in message
    assert stand_ins.calls("initrd-flash") == []


def test_a_dry_run_checks_the_package_and_writes_nothing(orin_host, stand_ins, tmp_path, token, capsys) -> None:
    package = orin_package(tmp_path, stand_ins)
    packed = package.read_bytes()
    lines = run(orin_host, agent(token), dry_run=True)
    assert lines[0] == (f"would write the provisioning into {DATAFILE} (partition permanent_user_storage of "
                        "external-flash.xml.in)")
    assert "./initrd-flash --usb-instance 1-2" in capsys.readouterr().out
    assert stand_ins.calls("initrd-flash") == [] and package.read_bytes() == packed


def test_the_role_picks_its_build_and_must_match_the_image(orin_host, stand_ins, tmp_path, token) -> None:
    orin_package(tmp_path, stand_ins, role_dir="jetson-orin-nano-agent")
    orin_package(tmp_path, stand_ins, role_dir="jetson-orin-nano",
                 manifest="k3s-server cortexa78ae 1.36.4\nk3s x 1\n")
    run(orin_host, agent(token))  # --role agent: the agent build's package
    assert len(stand_ins.calls("initrd-flash")) == 1
    with pytest.raises(flash.FlashUsageError, match="has a server and an agent image .* --role server or --role agent"):
        run(orin_host, provision.Provisioning())
    mismatched = tmp_path / "build" / "jetson-orin-nano-agent" / "build" / "tmp" / "deploy" / "images" / NVME
    (mismatched / f"gpu-k8s-image-{NVME}.manifest").write_text("k3s-server x 1\n")
    with pytest.raises(flash.FlashError, match=r"--role agent, but this image was built as a k3s server .*"
                       r"./task build --machine jetson-orin-nano --role agent"):
        run(orin_host, agent(token))
    assert len(stand_ins.calls("initrd-flash")) == 1


@pytest.mark.parametrize(("changes", "says"), [
    ({"method": "spi-only"}, "--method spi-only writes the boot firmware only"),
    ({"method": "sdcard"}, "keeps its rootfs on its NVMe drive"),
])
def test_methods_that_write_no_data_partition_take_no_provisioning(
        orin_host, stand_ins, tmp_path, token, changes: dict, says: str) -> None:
    orin_package(tmp_path, stand_ins)
    with pytest.raises(flash.FlashUsageError, match=says):
        run(orin_host, agent(token), **changes)
    assert stand_ins.calls("initrd-flash") == []
