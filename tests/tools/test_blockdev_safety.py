"""Block-device safety decisions over fixture sysfs/mountinfo trees."""

from __future__ import annotations

import pytest

from tools import blockdev

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
    host_tree.mount("254:0", "/home", "/dev/mapper/vg-home")
    assert refusals(host_tree, "sdb") == ["it is mounted: a device stacked on /dev/sdb (254:0) on /home"]


def test_swap_partition_is_refused(host_tree) -> None:
    (host_tree.root / "proc" / "swaps").write_text(
        "Filename\tType\tSize\tUsed\tPriority\n/dev/sdb1 partition 1000 0 -2\n"
    )
    assert refusals(host_tree, "sdb") == ["it is in use as swap (/dev/sdb1)"]


def test_mountinfo_escapes_and_optional_fields_are_parsed() -> None:
    text = "36 25 8:17 / /media/my\\040card rw,nosuid shared:7 master:1 - vfat /dev/sdb1 rw\n"
    (mount,) = blockdev.parse_mountinfo(text)
    assert mount == blockdev.Mount("8:17", "/media/my card", "/dev/sdb1")


def test_force_device_overrides_mounted_but_never_too_small(host_tree) -> None:
    mounted = blockdev.read_block_device("sdc", host_tree.root)
    state = blockdev.read_host_state(host_tree.root)
    blockdev.decide(mounted, blockdev.refusals_for(mounted, IMAGE, state), "/dev/sdc", False)
    small = blockdev.read_block_device("sdd", host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget, match="smaller than the image .*choose another device"):
        blockdev.decide(small, blockdev.refusals_for(small, IMAGE, state), "/dev/sdd", False)


def test_refusal_message_names_device_reason_and_override(host_tree) -> None:
    device = blockdev.read_block_device("sda", host_tree.root)
    state = blockdev.read_host_state(host_tree.root)
    with pytest.raises(blockdev.UnsafeTarget) as refused:
        blockdev.decide(device, blockdev.refusals_for(device, IMAGE, state), None, False)
    message = str(refused.value)
    assert message.startswith("refusing to write /dev/sda: it holds / of this host")
    assert message.endswith("(use --force-device /dev/sda to override)")


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
