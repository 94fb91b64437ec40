"""smoke-test says no as early as it can: options and files it cannot boot are refused before any
QEMU starts, and the wait for SSH ends as soon as the guest's console shows the boot has ended
short of it (a kernel panic, systemd's emergency shell, firmware or GRUB with nothing to boot),
with the console's tail, QEMU stopped. Stand-in QEMUs write a console the way a guest does and
then stay up, as a panicked kernel without panic= does; tests/tools/test_qemu_boot.py panics a
real kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_qemu_command import RECORD_PID, SERIAL_FILE

from tools.smoke import qemu, smoke_test

BOOT_LINES = ("[    0.000000] Linux version 6.18.3-yocto-standard\n"
              "[    1.204112] Run /sbin/init as init process\n")
# The guest prints its last words, then stays up (no panic=, no watchdog armed yet): only the
# console tells that SSH will never come.
STAYS_UP = """
import time
while True:
    time.sleep(1)
"""
PANIC = ("[    2.310552] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n"
         "[    2.310600] CPU: 0 PID: 1 Comm: swapper/0 Not tainted 6.18.3-yocto-standard #1\n"
         "[    2.310700] Call Trace:\n"
         "[    2.310800]  <TASK>\n"
         "[    2.311000] ---[ end Kernel panic - not syncing: VFS: Unable to mount root fs on "
         "unknown-block(0,0) ]---\n")
EMERGENCY = ("[FAILED] Failed to mount /data.\n"
             "You are in emergency mode. After logging in, type \"journalctl -xb\" to view\n"
             "system logs, \"systemctl reboot\" to reboot, or \"exit\"\nto continue bootup.\n")
GRUB_RESCUE = "error: no such partition.\nEntering rescue mode...\ngrub rescue> "  # a prompt: no newline


def guest_that_ends_with(console: str) -> str:
    return RECORD_PID + SERIAL_FILE + f"open(serial, 'w').write({BOOT_LINES + console!r})\n" + STAYS_UP


@pytest.fixture
def image(tmp_path: Path) -> Path:
    rootfs = tmp_path / "gpu-k8s-image-dev-qemux86-64.ext4"
    rootfs.write_bytes(b"rootfs")
    (tmp_path / "bzImage").write_bytes(b"kernel")
    return rootfs


@pytest.mark.parametrize(("console", "means", "line"), [
    (PANIC, "the guest kernel panicked", "Kernel panic - not syncing: VFS: Unable to mount root fs on "
                                         "unknown-block(0,0)"),
    (EMERGENCY, "systemd stopped the boot in emergency mode (a unit the boot needs failed)",
     "You are in emergency mode. After logging in"),
    (GRUB_RESCUE, "GRUB found no configuration to boot (grub rescue)", "grub rescue>"),
], ids=["panic", "emergency", "grub-rescue"])
def test_a_boot_that_ended_short_of_ssh_fails_at_once_with_the_console_tail_and_qemu_stopped(
        image: Path, stand_ins, console: str, means: str, line: str, capsys) -> None:
    stand_ins.add("qemu-system-x86_64", guest_that_ends_with(console))
    # a boot timeout the test would sit out if the console were not read: its message would differ
    options = smoke_test.SmokeOptions(image=image, kvm=False, boot_timeout_s=120, log_dir=image.parent)
    with pytest.raises(smoke_test.SmokeTestError) as failed:
        smoke_test.run_smoke_test(options, environ={})
    message = str(failed.value)
    assert message.startswith(f"{means} after "), message
    assert "so the guest will never offer SSH" in message and line in message
    assert "no SSH from the guest after" not in message
    # the console's tail is in the report: the panic's whole trace, the emergency shell's words
    tail = message.split("last lines:\n", 1)[1]
    assert console.rstrip().splitlines()[-1].strip() in tail
    assert "Run /sbin/init as init process" in tail
    (log,) = image.parent.glob("smoke-test-*.console.log")
    assert f"next step: read {log}" in message
    assert "boot to SSH  FAIL" in capsys.readouterr().out
    pid = int((stand_ins.calls_dir / "qemu.pid").read_text())
    assert not os.path.exists(f"/proc/{pid}"), f"QEMU (pid {pid}) is still running"


@pytest.mark.parametrize("line", [
    "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100",
    "You are in emergency mode. After logging in, type \"journalctl -xb\"",
    "Cannot open access to console, the root account is locked.",
    "BdsDxe: No bootable option or device was found.",
    "grub rescue> ",
])
def test_each_line_that_ends_a_boot_is_known(line: str) -> None:
    assert qemu.fatal_console_line(line) is not None


@pytest.mark.parametrize("line", [
    "[    0.000000] Kernel command line: root=/dev/vda rw console=ttyS0 panic=0",
    "[FAILED] Failed to start gpu-k8s-fleet-images.service - load the fleet's images.",
    "[    3.1] systemd[1]: Reached target emergency.target is not reached",
    "Welcome to GRUB!",
    "k3s[812]: level=info msg=\"Starting k3s v1.36.4+k3s1\"",
])
def test_a_boot_that_goes_on_is_not_taken_for_one_that_ended(line: str) -> None:
    assert qemu.fatal_console_line(line) is None


def test_the_console_is_read_as_it_grows_and_a_prompt_counts_without_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"")
    watch = qemu.ConsoleWatch(log)
    assert watch.fatal() is None
    with log.open("ab") as console:
        console.write(b"[    2.3] Kernel pan")  # a line the guest is still writing
        console.flush()
        assert watch.fatal() is None
        console.write(b"ic - not syncing: Attempted to kill init!\n")
        console.flush()
        assert watch.fatal() == ("the guest kernel panicked", "[    2.3] Kernel panic - not syncing: Attempted to kill "
                                                              "init!")
        assert watch.offset == log.stat().st_size, "what was read is not read again"
    other = tmp_path / "grub.log"
    other.write_bytes(b"error: no such partition.\ngrub rescue> ")
    assert qemu.ConsoleWatch(other).fatal() == ("GRUB found no configuration to boot (grub rescue)", "grub rescue>")


# --- refused before any QEMU starts ---------------------------------------------------------

@pytest.mark.parametrize(("make", "options", "error", "says"), [
    ((), {"image": "gone.ext4"}, smoke_test.SmokeTestError, r"^--image .*gone.ext4 does not exist$"),
    (("gpu-k8s-image-dev-qemux86-64.uefiimg", "bzImage", *smoke_test.OVMF_FILES),
     {"image": "gpu-k8s-image-dev-qemux86-64.uefiimg", "kernel_args": "quiet"}, smoke_test.SmokeTestUsageError,
     r"^--kernel-args does not apply to gpu-k8s-image-dev-qemux86-64.uefiimg: GRUB on the disk sets the kernel "
     r"command line"),
    (("gpu-k8s-image-dev-qemux86-64.uefiimg", "bzImage"), {"image": "gpu-k8s-image-dev-qemux86-64.uefiimg"},
     smoke_test.SmokeTestError, r"boots through UEFI firmware, but .*ovmf.code.qcow2.* is missing"),
    (("gpu-k8s-image-dev-qemux86-64.ext4", "bzImage"), {"image": "gpu-k8s-image-dev-qemux86-64.ext4",
                                                         "runtime": "podman"},
     smoke_test.SmokeTestUsageError, r"^--runtime must be auto, docker or containerd, got 'podman'$"),
    ((), {}, smoke_test.SmokeTestError, r"^no gpu-k8s-image-dev .uefiimg or ext4 image in .*; run `./task build` "
                                        r"first or pass --image PATH$"),
], ids=["missing-image", "kernel-args-on-a-uefi-disk", "no-ovmf", "runtime", "nothing-built"])
def test_what_cannot_boot_is_refused_before_any_qemu_starts(tmp_path: Path, stand_ins, make, options, error,
                                                            says) -> None:
    stand_ins.add("qemu-system-x86_64", guest_that_ends_with(PANIC))
    for name in make:
        (tmp_path / name).write_bytes(b"x")
    given = {key: tmp_path / value if key == "image" else value for key, value in options.items()}
    with pytest.raises(error, match=says):
        smoke_test.run_smoke_test(smoke_test.SmokeOptions(**given), environ={"KAS_BUILD_DIR": str(tmp_path / "b")})
    assert stand_ins.calls("qemu-system-x86_64") == []
