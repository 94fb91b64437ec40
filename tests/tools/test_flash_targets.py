"""`./task flash --machine NAME [--role R]` finds what `./task build --machine NAME [--role R]`
made, for every machine and role (the directories come from tools/image/build.py itself), and writes
an x86-64 node's A/B disk image like an SD card: the disk checks, then the provisioning onto
its data partition."""

from __future__ import annotations

from pathlib import Path

import pytest
from disk_images import DATA_AT, HAVE_E2FSPROGS, gpt_disk, read_back

from tools.flash import flash, provision, targets
from tools.image import build

PACKAGE_TYPE = {"nano": "tegraflash.tar.gz", "orin": "tegraflash-tar.zst", "thor": "tegraflash-tar.zst",
                "disk": "uefiimg"}
COPY_IMAGE = "import shutil\nshutil.copyfile(argv[-2], argv[-1])\n"


@pytest.fixture
def build_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "build"
    monkeypatch.setattr(build, "BUILD_ROOT", root)
    for name in ("KAS_WORK_DIR", "KAS_BUILD_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    return root


def made_by_build(machine: str, role: str | None, suffix: str, rootfs: bool = False) -> Path:
    """Where `./task build` leaves the image: its own kas environment's deploy dir."""
    options = build.BuildOptions(machine=machine, role=role)
    directory = build.deploy_dir(options, build.build_environment(options, {}))
    directory.mkdir(parents=True, exist_ok=True)
    name = f"gpu-k8s-image-{build.MACHINES[machine].yocto_machine}{'.rootfs' if rootfs else ''}.{suffix}"
    (directory / name).write_bytes(b"image")
    return directory / name


@pytest.mark.parametrize("machine", targets.flashable_machines())
@pytest.mark.parametrize("role", build.ROLES)
def test_flash_finds_what_build_made_for_every_machine_and_role(build_root: Path, machine: str, role: str) -> None:
    suffix = PACKAGE_TYPE[targets.kind(machine)]
    made = made_by_build(machine, role, suffix)
    asked = flash.FlashOptions(provisioning=provision.Provisioning(role=role))
    assert flash.find_built(machine, asked, suffix, "image", "--package PATH") == made
    # one role built: found without --role too
    assert flash.find_built(machine, flash.FlashOptions(), suffix, "image", "--package PATH") == made


def test_the_sd_orin_is_found_in_its_own_build_not_the_nvme_ones(build_root: Path) -> None:
    made = made_by_build("jetson-orin-nano-sd", None, "tegraflash-tar.zst")
    assert made.parent == build_root / "jetson-orin-nano-sd/build/tmp/deploy/images/jetson-orin-nano-devkit"
    assert flash.find_built("jetson-orin-nano-sd", flash.FlashOptions(), "tegraflash-tar.zst", "p", "x") == made
    with pytest.raises(flash.FlashError, match=r"build it first with `./task build --machine jetson-orin-nano`"):
        flash.find_built("jetson-orin-nano", flash.FlashOptions(), "tegraflash-tar.zst", "tegraflash package", "x")


def test_an_image_named_the_yocto_4_3_way_is_found_too(build_root: Path) -> None:
    made = made_by_build("jetson-agx-orin", None, "tegraflash-tar.zst", rootfs=True)
    assert made.name == "gpu-k8s-image-jetson-agx-orin-devkit.rootfs.tegraflash-tar.zst"
    assert flash.find_built("jetson-agx-orin", flash.FlashOptions(), "tegraflash-tar.zst", "p", "x") == made


def test_nothing_built_names_both_places_and_the_build_command(build_root: Path) -> None:
    with pytest.raises(flash.FlashError) as refused:
        flash.find_built("jetson-nano", flash.FlashOptions(provisioning=provision.Provisioning(role="server")),
                         "tegraflash.tar.gz", "tegraflash package", "--package PATH")
    message = str(refused.value)
    assert message.startswith(f"no tegraflash package at {build_root}/jetson-nano-server/build/tmp/deploy/images/")
    assert "build it first with `./task build --machine jetson-nano --role server`" in message


@pytest.mark.skipif(not HAVE_E2FSPROGS, reason="needs e2fsprogs (debugfs, mkfs.ext4), as the flash task does")
def test_an_x86_agent_disk_is_found_written_and_provisioned(build_root: Path, tmp_path: Path, host_tree,
                                                            stand_ins) -> None:
    stand_ins.add("bmaptool", COPY_IMAGE)
    options = build.BuildOptions(machine="x86-64", role="agent")
    deploy = build.deploy_dir(options, build.build_environment(options, {}))
    deploy.mkdir(parents=True)
    disk = gpt_disk(deploy / "gpu-k8s-image-genericx86-64.uefiimg", tmp_path)
    (deploy / "gpu-k8s-image-genericx86-64.manifest").write_text("k3s-agent core2_64 1.36.4\nk3s x 1\n")
    (deploy / "gpu-k8s-image-genericx86-64.wic.zst").write_bytes(b"single-root image: never the one written")
    token = tmp_path / "node-token"
    token.write_text("K10x86::server:1\n")
    provisioning = provision.Provisioning(server_url="https://k3s-server.lan:6443", token_file=token, role="agent")
    lines = targets.run_disk_flash(
        flash.FlashOptions(device="/dev/sdb", yes=True, root=host_tree.root, provisioning=provisioning),
        "x86-64", euid=0, interactive=False)
    (call,) = stand_ins.calls("bmaptool")
    assert call["argv"][-2:] == [str(disk), str(host_tree.root / "dev" / "sdb")]
    assert lines[0] == f"wrote {disk} to /dev/sdb"
    written = f"{host_tree.root / 'dev' / 'sdb'}?offset={DATA_AT}"
    assert 'server: "https://k3s-server.lan:6443"' in read_back(written, "gpu-k8s/node-config/k3s-config")


@pytest.mark.parametrize(("changes", "says"), [
    ({}, "--machine x86-64 writes the node's disk image to a drive: give --device /dev/sdX"),
    ({"device": "/dev/sdb", "method": "spi-only"}, "--machine x86-64 writes one disk image: no --method 'spi-only'"),
    ({"device": "/dev/sdb", "package": Path("x.tegraflash.tar.gz")}, "--package is a Jetson's tegraflash package"),
])
def test_an_x86_flash_that_cannot_go_anywhere_is_a_usage_error(build_root: Path, host_tree, stand_ins,
                                                               changes: dict, says: str) -> None:
    stand_ins.add("bmaptool", COPY_IMAGE)
    with pytest.raises(flash.FlashUsageError, match=says):
        targets.run_disk_flash(flash.FlashOptions(root=host_tree.root, yes=True, **changes), "x86-64",
                                     euid=0, interactive=False)
    assert stand_ins.calls("bmaptool") == []
