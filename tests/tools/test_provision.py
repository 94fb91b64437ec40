"""`./task flash --server-url --token-file --role --label`: a node's k3s provisioning written
onto its data partition (never into the image), found where gpu-k8s-data links it from.
Real ext4 file systems (mkfs.ext4) edited by the real debugfs; stand-ins for bmaptool and
the tegraflash scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from disk_images import DATA_AT, HAVE_E2FSPROGS, ext4, gpt_disk, read_back

from tools.flash import flash, provision

pytestmark = pytest.mark.skipif(not HAVE_E2FSPROGS,
                                reason="needs e2fsprogs (debugfs, mkfs.ext4), as the flash task itself does")

def mode_of(target: str, path: str) -> str:
    out = subprocess.run(["debugfs", "-R", f"stat {path}", target], capture_output=True, text=True, check=True).stdout
    return out.split("Mode:", 1)[1].split()[0]


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "node-token"
    path.write_text("K10abcdef::server:0123456789\n")
    return path


def agent(token: Path, **changes: object) -> provision.Provisioning:
    values: dict[str, object] = {"server_url": "https://k3s-server.lan:6443", "token_file": token, "role": "agent",
                                 "labels": ("site=lab-2", "example.com/rack=3")}
    values.update(changes)
    return provision.Provisioning(**values)  # type: ignore[arg-type]


NANO_LAYOUT = """<?xml version="1.0"?>
<partition_layout version="01.00.0000">
    <device type="sdmmc_user" instance="3">
        <partition name="APP" id="1" type="data"><filename> APPFILE </filename></partition>
        <partition name="APP_b" id="42" type="data"><filename> APPFILE </filename></partition>
        <partition name="UDA" id="43" type="data"><filename> DATAFILE </filename></partition>
    </device>
</partition_layout>
"""

COPY_IMAGE = """
import shutil
shutil.copyfile(argv[-2], argv[-1])
"""


def test_an_x86_disk_written_with_provisioning_joins_on_first_boot_and_the_image_stays_clean(
        tmp_path: Path, host_tree, stand_ins, token: Path) -> None:
    stand_ins.add("bmaptool", COPY_IMAGE)
    disk = gpt_disk(tmp_path / "gpu-k8s-image-genericx86-64.uefiimg", tmp_path)
    (tmp_path / "gpu-k8s-image-genericx86-64.manifest").write_text("k3s-agent aarch64 1.36.4\nk3s x 1\n")
    before = disk.read_bytes()
    options = flash.FlashOptions(sd_image=disk, device="/dev/sdb", yes=True, root=host_tree.root,
                                 provisioning=agent(token))
    results = flash.run_flash(options, euid=0, interactive=False)
    assert results[-1].startswith("provisioned on the data partition: joins https://k3s-server.lan:6443")
    device = f"{host_tree.root / 'dev' / 'sdb'}?offset={DATA_AT}"
    config = read_back(device, "gpu-k8s/node-config/k3s-config")
    assert 'server: "https://k3s-server.lan:6443"' in config
    assert 'token-file: "/etc/rancher/k3s/token"' in config
    assert '  - "example.com/rack=3"' in config
    assert read_back(device, "gpu-k8s/node-config/k3s-token") == "K10abcdef::server:0123456789\n"
    assert mode_of(device, "gpu-k8s/node-config/k3s-token") == "0600", "the token is root's alone"
    assert disk.read_bytes() == before, "the image as built: no token in it"


def test_usb_flashing_writes_a_temporary_copy_of_the_packages_data_image(
        tmp_path: Path, host_tree, stand_ins, token: Path) -> None:
    content = tmp_path / "tegraflash"
    content.mkdir()
    ext4(content / "gpu-k8s-image-jetson-nano-devkit.dataimg", "data")
    # The Nano's package as meta-tegra kirkstone makes it: the layout gives UDA the DATAFILE
    # token, doflash.sh names the file (image_types_tegra.bbclass: DATAARGS).
    (content / "flash.xml.in").write_text(NANO_LAYOUT)
    capture = tmp_path / "flashed.dataimg"
    script = stand_ins.add("doflash.sh", f"""
import shutil
shutil.copyfile('gpu-k8s-image-jetson-nano-devkit.dataimg', {str(capture)!r})
# the real one: ./tegra210-flash-helper.sh -B 1048576 --datafile gpu-k8s-image-jetson-nano-devkit.dataimg flash.xml.in
""")
    (content / "doflash.sh").write_text(script.read_text())
    (content / "doflash.sh").chmod(0o755)
    script.unlink()
    deploy = tmp_path / "build/tmp/deploy/images/jetson-nano-devkit"
    deploy.mkdir(parents=True)
    package = deploy / "gpu-k8s-image-jetson-nano-devkit.tegraflash.tar.gz"
    subprocess.run(["tar", "-czf", str(package), "-C", str(content), "."], check=True)
    packed = package.read_bytes()
    host_tree.add_usb_device("1-2", "0955", "7f21")
    options = flash.FlashOptions(method="full", build_dir=tmp_path / "build", root=host_tree.root,
                                 provisioning=agent(token))
    flash.run_flash(options, euid=0, interactive=False)
    assert "k3s-server.lan" in read_back(str(capture), "gpu-k8s/node-config/k3s-config")
    assert package.read_bytes() == packed, "the build's package is never changed"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"server_url": "http://k3s:6443"}, "--server-url 'http://k3s:6443' must be https://HOST:6443"),
        ({"server_url": "https://k3s"}, "--server-url 'https://k3s' has no port: k3s's API listens on 6443, so "
                                        "give https://k3s:6443"),
        ({"server_url": "https://k3s:port"}, "--server-url 'https://k3s:port' must be https://HOST:PORT and nothing "
                                             "else, e.g. https://k3s:6443"),
        ({"server_url": "https://k3s:6443/v1"}, "must be https://HOST:PORT and nothing else"),
        ({"server_url": None, "token_file": None}, "--role agent needs --server-url"),
        ({"role": "master"}, "--role must be server or agent"),
        ({"labels": ("site",)}, "--label 'site' is not KEY=VALUE"),
        ({"token_file": Path("/nonexistent/token")}, "--token-file /nonexistent/token: No such file"),
    ],
)
def test_bad_provisioning_is_refused_before_anything_is_written(
        tmp_path: Path, host_tree, stand_ins, token: Path, changes: dict, message: str) -> None:
    stand_ins.add("bmaptool", COPY_IMAGE)
    disk = gpt_disk(tmp_path / "disk.uefiimg", tmp_path)
    options = flash.FlashOptions(sd_image=disk, device="/dev/sdb", yes=True, root=host_tree.root,
                                 provisioning=agent(token, **changes))
    with pytest.raises(flash.FlashError) as refused:
        flash.run_flash(options, euid=0, interactive=False)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert stand_ins.calls("bmaptool") == []


def test_a_role_the_image_was_not_built_for_is_refused(tmp_path: Path, host_tree, stand_ins, token: Path) -> None:
    stand_ins.add("bmaptool", COPY_IMAGE)
    disk = gpt_disk(tmp_path / "gpu-k8s-image-genericx86-64.uefiimg", tmp_path)
    (tmp_path / "gpu-k8s-image-genericx86-64.manifest").write_text("k3s x 1\nk3s-server core2_64 1.36.4\n")
    options = flash.FlashOptions(sd_image=disk, device="/dev/sdb", yes=True, root=host_tree.root,
                                 provisioning=agent(token))
    with pytest.raises(flash.FlashError, match="--role agent, but this image was built as a k3s server"):
        flash.run_flash(options, euid=0, interactive=False)
    assert stand_ins.calls("bmaptool") == []


def test_an_image_without_a_data_partition_is_named(tmp_path: Path) -> None:
    plain = ext4(tmp_path / "rootfs.ext4", "root")
    with pytest.raises(provision.ProvisionError, match="has no data partition .*A/B image"):
        provision.data_partition_offset(plain)


def test_provisioning_never_goes_into_a_kept_sd_image(tmp_path: Path, token: Path) -> None:
    options = flash.FlashOptions(method="sdcard", package=tmp_path / "x.tar.gz", provisioning=agent(token))
    with pytest.raises(flash.FlashError, match="never into a kept SD image: give --device"):
        flash.run_flash(options, euid=0, interactive=False)
