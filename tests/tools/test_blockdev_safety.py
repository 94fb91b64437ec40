"""Block-device safety decisions over fixture sysfs/mountinfo trees."""

from __future__ import annotations

import pytest

from tools.flash import blockdev

GB = 1000**3
IMAGE = 8 * GB


def refusals(host_tree, name: str, image_size: int = IMAGE) -> list[str]:
    device = blockdev.read_block_device(name, host_tree.root)
    state = blockdev.read_host_state(host_tree.root)
    return [r.reason for r in blockdev.refusals_for(device, image_size, state)]


def test_usb_card_reader_with_unmounted_card_is_fine(host_tree) -> None:
    assert refusals(host_tree, "sdb") == []


def test_system_disk_is_refused_for_holding_root_and_boot(host_tree) -> None:
    reasons = refusals(host_tree, "sda")
    assert "it holds / of this host (/dev/sda2)" in reasons
    assert "it holds /boot/efi of this host (/dev/sda1)" in reasons
    assert any("not removable" in r for r in reasons)


def test_mounted_card_is_refused_naming_the_mount(host_tree) -> None:
    assert refusals(host_tree, "sdc") == ["it is mounted: /dev/sdc1 on /media/user/CARD"]


def test_too_small_card_is_refused_with_both_sizes(host_tree) -> None:
    (reason,) = refusals(host_tree, "sdd")
    assert reason == f"it is smaller than the image ({GB} < {IMAGE} bytes)"


def test_internal_nvme_and_emmc_are_not_removable(host_tree) -> None:
    assert any("not removable" in r for r in refusals(host_tree, "nvme0n1"))
    assert any("not removable" in r for r in refusals(host_tree, "mmcblk1"))


def test_usb_stick_reporting_removable_0_counts_as_removable(host_tree) -> None:
    device = blockdev.read_block_device("sde", host_tree.root)
    assert device.usb_attached and not device.removable_flag
    assert refusals(host_tree, "sde") == []


def test_sd_card_in_a_built_in_slot_counts_as_removable(host_tree) -> None:
    assert refusals(host_tree, "mmcblk0") == []


def test_mount_through_a_stacked_device_is_seen(host_tree) -> None:
    """An LVM/dm-crypt volume on a partition keeps the disk busy even though the
    partition itself is not in mountinfo."""
    partition = host_tree.root / "sys" / "block" / "sdb" / "sdb1"
    (partition / "holders" / "dm-0").mkdir(parents=True)
    (host_tree.root / "sys" / "block" / "dm-0").mkdir(parents=True)
    (host_tree.root / "sys" / "block" / "dm-0" / "dev").write_text("254:0")
    host_tree.mount("254:0", "/srv/data", "/dev/mapper/vg-data")
    assert refusals(host_tree, "sdb") == ["it is mounted: a device stacked on /dev/sdb (254:0) on /srv/data"]


@pytest.mark.parametrize("mount_point", ["/", "/boot", "/boot/efi", "/efi", "/usr", "/var", "/home"])
def test_a_disk_holding_any_part_of_the_host_system_is_the_hosts_own_even_through_lvm(
        host_tree, mount_point: str) -> None:
    partition = host_tree.root / "sys" / "block" / "sdb" / "sdb1"
    (partition / "holders" / "dm-0").mkdir(parents=True)
    (host_tree.root / "sys" / "block" / "dm-0").mkdir(parents=True)
    (host_tree.root / "sys" / "block" / "dm-0" / "dev").write_text("254:0")
    host_tree.mount("254:0", mount_point, "/dev/mapper/vg-sys")
    device = blockdev.read_block_device("sdb", host_tree.root)
    found = blockdev.refusals_for(device, IMAGE, blockdev.read_host_state(host_tree.root))
    assert [r.reason for r in found] == [f"it holds {mount_point} of this host (a device stacked on /dev/sdb (254:0))"]
    with pytest.raises(blockdev.UnsafeTarget) as refused:
        blockdev.decide(device, found, "/dev/sdb", confirmed_by_typing=True)
    assert "never written" in str(refused.value) and "--force-device" not in str(refused.value)


def test_swap_partition_is_refused(host_tree) -> None:
    (host_tree.root / "proc" / "swaps").write_text(
        "Filename\tType\tSize\tUsed\tPriority\n/dev/sdb1 partition 1000 0 -2\n"
    )
    assert refusals(host_tree, "sdb") == ["it is in use as swap (/dev/sdb1)"]
    device = blockdev.read_block_device("sdb", host_tree.root)
    state = blockdev.read_host_state(host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget, match=r"\(sudo swapoff /dev/sdb1 first, or choose another device\)$"):
        blockdev.decide(device, blockdev.refusals_for(device, IMAGE, state), "/dev/sdb", True)


def test_mountinfo_escapes_and_optional_fields_are_parsed() -> None:
    text = "36 25 8:17 / /media/my\\040card rw,nosuid shared:7 master:1 - vfat /dev/sdb1 rw\n"
    (mount,) = blockdev.parse_mountinfo(text)
    assert mount == blockdev.Mount("8:17", "/media/my card", "/dev/sdb1")


def test_force_device_lifts_not_removable_only(host_tree) -> None:
    state = blockdev.read_host_state(host_tree.root)
    nvme = blockdev.read_block_device("nvme0n1", host_tree.root)
    blockdev.decide(nvme, blockdev.refusals_for(nvme, IMAGE, state), "/dev/nvme0n1", False)
    mounted = blockdev.read_block_device("sdc", host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget, match=r"mounted: .*\(unmount it first \(sudo umount /dev/sdc1, or eject"):
        blockdev.decide(mounted, blockdev.refusals_for(mounted, IMAGE, state), "/dev/sdc", False)
    small = blockdev.read_block_device("sdd", host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget, match=r"smaller than the image .*\(choose a larger device\)"):
        blockdev.decide(small, blockdev.refusals_for(small, IMAGE, state), "/dev/sdd", False)


def test_the_hosts_own_disk_is_refused_without_ever_naming_an_override(host_tree) -> None:
    device = blockdev.read_block_device("sda", host_tree.root)
    state = blockdev.read_host_state(host_tree.root)
    for forced, typed in ((None, False), ("/dev/sda", False), ("/dev/sda", True), ("sda", True)):
        with pytest.raises(blockdev.UnsafeTarget) as refused:
            blockdev.decide(device, blockdev.refusals_for(device, IMAGE, state), forced, typed)
        message = str(refused.value)
        assert message.startswith("refusing to write /dev/sda: it holds / of this host")
        assert message.endswith("(this host's own disk is never written: choose another device "
                                "(lsblk -d -o NAME,SIZE,MODEL,TRAN,RM))")
        assert "--force-device" not in message


def test_an_internal_disk_names_the_two_ways_to_confirm_it(host_tree) -> None:
    device = blockdev.read_block_device("nvme0n1", host_tree.root)
    state = blockdev.read_host_state(host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget) as refused:
        blockdev.decide(device, blockdev.refusals_for(device, IMAGE, state), None, False)
    assert str(refused.value).endswith("(type the device path when asked, or use --force-device /dev/nvme0n1 if it "
                                       "is the right disk)")


def test_typed_confirmation_lifts_not_removable_only(host_tree) -> None:
    state = blockdev.read_host_state(host_tree.root)
    nvme = blockdev.read_block_device("nvme0n1", host_tree.root)
    blockdev.decide(nvme, blockdev.refusals_for(nvme, IMAGE, state), None, confirmed_by_typing=True)
    system = blockdev.read_block_device("sda", host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget, match="holds /"):
        blockdev.decide(system, blockdev.refusals_for(system, IMAGE, state), None, confirmed_by_typing=True)


def test_description_shows_model_size_and_partitions(host_tree) -> None:
    device = blockdev.read_block_device("sdc", host_tree.root)
    lines = blockdev.describe(device, blockdev.read_host_state(host_tree.root), lambda n: f"{n // GB} GB")
    assert lines[0] == "/dev/sdc: SanDisk Cruzer, 16 GB, USB, removable"
    assert lines[1] == "  /dev/sdc1: 16 GB, mounted on /media/user/CARD"


def test_unknown_device_is_reported(host_tree) -> None:
    with pytest.raises(FileNotFoundError, match="/dev/sdz is not a whole disk"):
        blockdev.read_block_device("sdz", host_tree.root)


def test_a_device_argument_names_the_whole_disk_by_name_path_or_link(host_tree) -> None:
    by_id = host_tree.root / "dev" / "disk" / "by-id"
    by_id.mkdir(parents=True)
    (by_id / "usb-Generic_STORAGE_DEVICE-0:0").symlink_to("../../sdb")
    for text in ("sdb", "/dev/sdb", "/dev/disk/by-id/usb-Generic_STORAGE_DEVICE-0:0"):
        assert blockdev.disk_name(text, host_tree.root) == "sdb", text


@pytest.mark.parametrize(("text", "says"), [
    ("/dev/sdb1", "--device /dev/sdb1 is a partition of /dev/sdb: give the whole disk, /dev/sdb"),
    ("sdc1", "--device /dev/sdc1 is a partition of /dev/sdc"),
])
def test_a_partition_is_named_with_its_disk(host_tree, text: str, says: str) -> None:
    with pytest.raises(blockdev.NotADisk) as refused:
        blockdev.disk_name(text, host_tree.root)
    assert str(refused.value).startswith(says)


def test_a_file_given_as_device_is_reported_by_its_real_path(host_tree, tmp_path, monkeypatch) -> None:
    image = tmp_path / "disk.img"
    image.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(blockdev.NotADisk) as refused:
        blockdev.disk_name("./disk.img", host_tree.root)
    assert str(refused.value).startswith(f"--device ./disk.img is a regular file ({image}), not a disk")
    assert "/dev/tmp" not in str(refused.value) and "--sd-image" in str(refused.value)
    with pytest.raises(blockdev.NotADisk, match=r"is a directory \(/"):
        blockdev.disk_name(str(tmp_path), host_tree.root)
