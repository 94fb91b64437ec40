"""The QEMU command line and the KVM choice, with stand-in QEMUs (no real QEMU runs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.smoke import qemu

# Stand-in QEMU behaviours for the KVM probe. Each records its pid so tests can prove it is gone.
RECORD_PID = "open(os.path.join(state_dir, 'qemu.pid'), 'w').write(str(os.getpid()))\n"
SERIAL_FILE = "serial = next(a for a in argv if a.startswith('file:'))[len('file:'):]\n"
# What QEMU 7.2 does under a broken nested KVM with -cpu host: an MSR error, then abort().
CRASHES_UNDER_KVM = RECORD_PID + """
if 'kvm' in argv:
    sys.stderr.write('qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\\n')
    sys.stderr.write("qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion failed.\\n")
    sys.stderr.flush()
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's directory
    os.abort()
"""
# Other CPU models: the firmware prints, the kernel never does, QEMU runs on.
HANGS_UNDER_KVM = RECORD_PID + SERIAL_FILE + """
import time
open(serial, 'w').write('SeaBIOS (version 1.16.2)\\nBooting from ROM...\\nProbing EDD (edd=off to disable)... ok\\n')
while True:
    time.sleep(1)
"""
KERNEL_STARTS = RECORD_PID + SERIAL_FILE + """
open(serial, 'w').write('[    0.000000] Linux version 6.1.0\\n'
                        '[    0.912345] Kernel panic - not syncing: VFS: Unable to mount root fs\\n')
"""


def test_qemu_command_line_has_what_the_smoke_test_needs(tmp_path: Path) -> None:
    config = qemu.QemuConfig(
        kernel=Path("bzImage"), rootfs=Path("img.ext4"), console_log=tmp_path / "c.log", ssh_port=2345, kvm=True
    )
    argv = qemu.qemu_command(config)
    line = " ".join(argv)
    assert "-accel kvm -cpu host" in line and "-nographic" in argv and "-snapshot" in argv
    assert "-m 4096" in line and "-smp 4" in line  # the layer's QB_MEM and QB_SMP
    assert "hostfwd=tcp:127.0.0.1:2345-:22" in line
    assert "-append root=/dev/vda rw console=ttyS0" in line
    assert f"-serial file:{tmp_path / 'c.log'}" in line


def test_a_uefi_disk_boots_through_ovmf_not_a_kernel(tmp_path: Path) -> None:
    config = qemu.QemuConfig(
        kernel=Path("bzImage"), rootfs=Path("node.uefiimg"), console_log=tmp_path / "c.log", ssh_port=2345,
        firmware=(Path("ovmf.code.qcow2"), Path("ovmf.vars.qcow2")),
    )
    argv = qemu.qemu_command(config)
    line = " ".join(argv)
    assert "-kernel" not in argv and "-append" not in argv, "GRUB on the disk picks the kernel and the A/B slot"
    assert "if=pflash,format=qcow2,unit=0,readonly=on,file=ovmf.code.qcow2" in line
    assert "if=pflash,format=qcow2,unit=1,file=ovmf.vars.qcow2" in line
    assert "file=node.uefiimg,if=virtio,format=raw" in line and "-snapshot" in argv


def test_every_boot_has_the_watchdog_the_ab_images_arm(tmp_path: Path) -> None:
    config = qemu.QemuConfig(kernel=Path("k"), rootfs=Path("r"), console_log=tmp_path / "c", ssh_port=1)
    argv = qemu.qemu_command(config)
    assert argv[argv.index("i6300esb") - 1] == "-device" and "-no-reboot" in argv


def test_kernel_arguments_for_a_uefi_disk_are_refused(tmp_path: Path) -> None:
    config = qemu.QemuConfig(
        kernel=Path("k"), rootfs=Path("d.uefiimg"), console_log=tmp_path / "c", ssh_port=1,
        firmware=(Path("code"), Path("vars")), extra_kernel_args="quiet",
    )
    with pytest.raises(qemu.QemuError, match="UEFI disk boots its own kernel"):
        qemu.qemu_command(config)


def test_without_kvm_the_command_line_asks_for_tcg(tmp_path: Path) -> None:
    config = qemu.QemuConfig(kernel=Path("k"), rootfs=Path("r"), console_log=tmp_path / "c", ssh_port=1, kvm=False)
    line = " ".join(qemu.qemu_command(config))
    assert "-accel tcg -cpu max" in line and "kvm" not in qemu.qemu_command(config)


def test_too_little_memory_is_refused() -> None:
    config = qemu.QemuConfig(kernel=Path("k"), rootfs=Path("r"), console_log=Path("c"), ssh_port=1, memory_mib=1024)
    with pytest.raises(qemu.QemuError, match="--memory-mib must be at least 2048"):
        qemu.qemu_command(config)


def assert_stand_in_gone(stand_ins) -> None:
    pid = int((stand_ins.calls_dir / "qemu.pid").read_text())
    assert not os.path.exists(f"/proc/{pid}"), f"the probe left QEMU (pid {pid}) running"


def test_probe_reports_a_qemu_that_aborts_under_kvm(stand_ins, tmp_path: Path) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM)
    probe = qemu.probe_kvm(tmp_path / "bzImage", timeout_s=10)
    assert not probe.usable
    assert probe.detail == (
        "QEMU exited with signal SIGABRT: qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69"
    )
    assert probe.seconds < 10, "an abort must be seen at once, not after the timeout"
    (call,) = stand_ins.calls("qemu-system-x86_64")
    line = " ".join(call["argv"])
    assert "-accel kvm -cpu host" in line and f"-kernel {tmp_path / 'bzImage'}" in line and "-no-reboot" in line
    assert "-drive" not in line, "the probe must not touch the image"


def test_probe_gives_up_on_a_guest_that_hangs_and_stops_it(stand_ins, tmp_path: Path) -> None:
    stand_ins.add("qemu-system-x86_64", HANGS_UNDER_KVM)
    probe = qemu.probe_kvm(tmp_path / "bzImage", timeout_s=1, poll_s=0.05)
    assert not probe.usable
    assert "did not start under KVM within 1 s" in probe.detail
    assert_stand_in_gone(stand_ins)


def test_probe_passes_when_the_kernel_gets_through_its_start_up(stand_ins, tmp_path: Path) -> None:
    stand_ins.add("qemu-system-x86_64", KERNEL_STARTS)
    probe = qemu.probe_kvm(tmp_path / "bzImage", timeout_s=10, poll_s=0.05)
    assert probe.usable, probe.detail
    assert_stand_in_gone(stand_ins)


def test_auto_choice_falls_back_to_tcg_with_the_reason(stand_ins, tmp_path: Path) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM)
    kvm_device = tmp_path / "kvm"
    kvm_device.write_text("")
    accelerator = qemu.choose_accelerator(None, tmp_path / "bzImage", kvm_device=kvm_device)
    assert not accelerator.kvm and accelerator.chosen_automatically
    assert accelerator.describe().startswith("TCG (software emulation, slow): KVM probe failed: QEMU exited")
    assert "--kvm forces KVM" in accelerator.reason


def test_auto_choice_uses_kvm_when_the_probe_passes(stand_ins, tmp_path: Path) -> None:
    stand_ins.add("qemu-system-x86_64", KERNEL_STARTS)
    kvm_device = tmp_path / "kvm"
    kvm_device.write_text("")
    accelerator = qemu.choose_accelerator(None, tmp_path / "bzImage", kvm_device=kvm_device)
    assert accelerator.kvm and accelerator.chosen_automatically
    assert accelerator.reason.startswith("KVM probe passed in ")


@pytest.mark.parametrize(
    ("requested", "device_exists", "kvm", "reason"),
    [
        (False, True, False, "KVM not used (--no-kvm)"),
        (True, False, True, "forced with --kvm (not probed)"),
        (None, False, False, "is missing or not read-write"),
    ],
    ids=["no-kvm", "forced", "no-dev-kvm"],
)
def test_choices_that_need_no_probe_run_no_qemu(
    stand_ins, tmp_path: Path, requested: bool | None, device_exists: bool, kvm: bool, reason: str
) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM)
    kvm_device = tmp_path / "kvm"
    if device_exists:
        kvm_device.write_text("")
    accelerator = qemu.choose_accelerator(requested, tmp_path / "bzImage", kvm_device=kvm_device)
    assert accelerator.kvm is kvm and reason in accelerator.reason
    assert stand_ins.calls("qemu-system-x86_64") == []
