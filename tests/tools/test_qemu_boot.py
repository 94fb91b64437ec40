"""QEMU for real: a Debian kernel and a busybox initramfs the test builds stand in for the
image. Proves serial capture, the SSH port forward into the guest, the boot-wait timeout,
early exits, a kernel panic noticed at once, -snapshot, and that QEMU is gone after success,
failure, timeout, panic, SIGINT and SIGTERM. Host packages come from `./task test`
(tools/dev/testdeps.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.dev import testdeps
from tools.smoke import qemu, smoke_test

REPO_ROOT = Path(__file__).resolve().parents[2]
BUSYBOX = Path("/bin/busybox")
# Debian's kernel has its NICs as modules; e1000 is one module with no dependencies
# (the real image uses virtio-net-pci, built into linux-yocto).
NET_MODULES = testdeps.TEST_KERNEL_MODULES  # what ./task test keeps of the kernel package

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
echo FIXTURE-BOOTED
mode=$(sed -n 's/.*fixture=\\([a-z]*\\).*/\\1/p' /proc/cmdline)
case "$mode" in
poweroff)
    echo FIXTURE-POWEROFF
    poweroff -f ;;
panic)
    echo FIXTURE-PANIC
    exit 1 ;;
ssh)
    for module in MODULES; do insmod /modules/$module.ko; done
    ip link set eth0 up
    ip addr add 10.0.2.15/24 dev eth0
    echo FIXTURE-LISTENING
    while true; do echo SSH-2.0-fixture | nc -l -p 22; done ;;
*)
    # Nothing below the marker: the kernel's own messages (a loaded host's stalls) stay off the
    # console, so the marker is the console's last line whenever it is read.
    dmesg -n 1
    echo FIXTURE-SILENT
    while true; do sleep 60; done ;;
esac
""".replace("MODULES", " ".join(NET_MODULES))


def kernel_dir() -> Path | None:
    configured = os.environ.get(testdeps.KERNEL_DIR_VARIABLE)
    if configured:
        return Path(configured)
    cached = sorted((testdeps.user_cache_dir() / "test-kernel").glob("linux-image-*"))
    return cached[-1] if cached else None


def missing_prerequisite() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed"
    if not BUSYBOX.exists():
        return "no static busybox at /bin/busybox"
    directory = kernel_dir()
    if directory is None or not list(directory.glob("boot/vmlinuz-*")):
        return f"no test kernel ({testdeps.KERNEL_DIR_VARIABLE} unset and none cached)"
    return None


REASON = missing_prerequisite()
pytestmark = pytest.mark.skipif(
    REASON is not None,
    reason=f"QEMU TESTS SKIPPED: {REASON}; run ./task test, which installs them (as root)",
)


def _cpio_entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> bytes:
    """One entry of the kernel's initramfs format (cpio "newc")."""
    encoded = name.encode() + b"\0"
    fields = [0, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0]
    header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
    entry = header + encoded
    entry += b"\0" * (-len(entry) % 4)
    entry += data + b"\0" * (-len(data) % 4)
    return entry


def build_initramfs(target: Path, modules_root: Path) -> Path:
    entries = [_cpio_entry(d, 0o040755) for d in ("bin", "dev", "proc", "sys", "modules")]
    entries.append(_cpio_entry("dev/console", 0o020600, rdev=(5, 1)))
    entries.append(_cpio_entry("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    entries.append(_cpio_entry("init", 0o100755, INIT.encode()))
    for module in NET_MODULES:
        (found,) = list(modules_root.rglob(f"{module}.ko"))
        entries.append(_cpio_entry(f"modules/{module}.ko", 0o100644, found.read_bytes()))
    entries.append(_cpio_entry("TRAILER!!!", 0))
    target.write_bytes(b"".join(entries))
    return target


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = kernel_dir()
    assert directory is not None
    work = tmp_path_factory.mktemp("qemu-guest")
    rootfs = work / "rootfs.ext4"
    rootfs.write_bytes(b"ROOTFS-UNCHANGED" * 4096)
    return {
        "kernel": next(directory.glob("boot/vmlinuz-*")),
        "initrd": build_initramfs(work / "initramfs.cpio", directory / "lib" / "modules"),
        "rootfs": rootfs,
    }


def qemu_processes_for(marker: Path) -> list[int]:
    """PIDs whose command line mentions marker (our per-test console log path)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(marker).encode() in cmdline and b"qemu-system" in cmdline:
            pids.append(int(proc.name))
    return pids


# The kernel's crypto self-tests can stall a TCG guest for minutes on a busy host (soft lockups
# seen here); skipping them and CPU mitigations makes the boot short and predictable. A vCPU the
# busy host starves is no guest fault: nowatchdog keeps the lockup detectors' reports (emergency
# messages, which no console level silences) off the console.
FAST_BOOT_ARGS = "quiet cryptomgr.notests mitigations=off no_timer_check nowatchdog"


def config_for(guest: dict[str, Path], tmp_path: Path, mode: str) -> qemu.QemuConfig:
    return qemu.QemuConfig(
        kernel=guest["kernel"],
        rootfs=guest["rootfs"],
        initrd=guest["initrd"],
        console_log=tmp_path / "console.log",
        ssh_port=qemu.free_local_port(),
        memory_mib=qemu.MIN_MEMORY_MIB,
        kvm=False,  # nested KVM on CI machines is unreliable; TCG boots this kernel in seconds
        extra_kernel_args=f"fixture={mode} {FAST_BOOT_ARGS}",
        nic_model="e1000",
    )


BOOT_TIMEOUT_S = 180  # generous: TCG on a loaded 2-core CI host; typical boots take seconds


def test_guest_ssh_banner_arrives_through_the_forwarded_port(guest, tmp_path: Path) -> None:
    config = config_for(guest, tmp_path, "ssh")
    before = guest["rootfs"].read_bytes()
    with qemu.QemuMachine(config) as machine:
        # returns only once the guest's "SSH-2.0-fixture" banner came through the forward
        seconds = machine.wait_for_ssh(BOOT_TIMEOUT_S, poll_s=0.2)
        assert qemu_processes_for(config.console_log), "QEMU should run while inside the with block"
    console = config.console_log.read_text(errors="replace")
    assert "FIXTURE-BOOTED" in console and "FIXTURE-LISTENING" in console, console[-2000:]
    assert seconds < BOOT_TIMEOUT_S
    assert qemu_processes_for(config.console_log) == []
    assert guest["rootfs"].read_bytes() == before, "-snapshot must keep the image file unchanged"


def test_no_ssh_times_out_with_the_console_tail_and_qemu_is_stopped(guest, tmp_path: Path) -> None:
    config = config_for(guest, tmp_path, "silent")
    with pytest.raises(qemu.QemuError) as failure, qemu.QemuMachine(config) as machine:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        # the whole log, not its tail: the marker is waited for wherever it landed
        while "FIXTURE-SILENT" not in config.console_log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.2)
        machine.wait_for_ssh(2, poll_s=0.2)
    assert "no SSH from the guest after 2 s" in str(failure.value)
    # the guest prints nothing after its marker, so the tail the error carries ends with it
    assert str(failure.value).rstrip().endswith("FIXTURE-SILENT"), str(failure.value)[-2000:]
    assert qemu_processes_for(config.console_log) == []


def test_a_guest_kernel_panic_ends_the_wait_at_once_and_qemu_is_stopped(guest, tmp_path: Path) -> None:
    # init exits, the kernel panics and stays in its panic (no panic= on the command line): only the
    # console says SSH will never come. Were it not read, the wait would end in a timeout instead.
    config = config_for(guest, tmp_path, "panic")
    with pytest.raises(qemu.QemuGuestFailed) as failure, qemu.QemuMachine(config) as machine:
        machine.wait_for_ssh(BOOT_TIMEOUT_S, poll_s=0.2)
    message = str(failure.value)
    assert message.startswith("the guest kernel panicked after "), message
    assert "Kernel panic - not syncing: Attempted to kill init!" in message
    assert "FIXTURE-PANIC" in message.split("last lines:\n", 1)[1], "the tail shows what came before"
    assert qemu_processes_for(config.console_log) == []


def test_guest_that_exits_before_ssh_is_reported_at_once(guest, tmp_path: Path) -> None:
    config = config_for(guest, tmp_path, "poweroff")
    started = time.monotonic()
    with (
        pytest.raises(qemu.QemuError, match="QEMU exited with code 0 before SSH came up"),
        qemu.QemuMachine(config) as machine,
    ):
        machine.wait_for_ssh(BOOT_TIMEOUT_S, poll_s=0.2)
    assert time.monotonic() - started < BOOT_TIMEOUT_S
    assert "FIXTURE-POWEROFF" in config.console_log.read_text(errors="replace")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_smoke_test_stops_qemu(guest, tmp_path: Path, sig: signal.Signals) -> None:
    argv = [
        sys.executable,
        "-m",
        "invoke",
        "--search-root",
        str(REPO_ROOT),
        "smoke-test",
        "--image",
        str(guest["rootfs"]),
        "--kernel",
        str(guest["kernel"]),
        "--initrd",
        str(guest["initrd"]),
        "--kernel-args",
        f"fixture=silent {FAST_BOOT_ARGS}",
        "--memory-mib",
        "2048",
        "--boot-timeout",
        "300",
        "--log-dir",
        str(tmp_path),
        "--no-kvm",
    ]
    # A test run started in the background (nohup, `cmd &`, some CI runners) inherits SIGINT
    # as ignored, and Python then never raises KeyboardInterrupt: give the task a real Ctrl-C.
    task = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        logs: list[Path] = []
        while time.monotonic() < deadline:
            logs = list(tmp_path.glob("smoke-test-*.console.log"))
            if logs and "FIXTURE-SILENT" in logs[0].read_text(errors="replace"):
                break
            time.sleep(0.2)
        assert logs and qemu_processes_for(logs[0]), "QEMU did not start"
        task.send_signal(sig)
        output, _ = task.communicate(timeout=30)
    finally:
        if task.poll() is None:
            task.kill()
    assert task.returncode == 130, output
    assert "interrupted; QEMU was stopped" in output
    assert qemu_processes_for(logs[0]) == []


def test_full_smoke_test_falls_back_from_crashing_kvm_boots_runs_checks_and_tears_down(
    guest, tmp_path: Path, stand_ins, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole task path with QEMU, accelerator chosen automatically: QEMU aborts under
    KVM (a wrapper makes sure of it, as a broken nested KVM does), so the probe fails and
    the real QEMU boots under TCG; then the SSH banner through the forward and the checks
    (ssh/kubectl are stand-ins: a busybox guest has no k3s)."""
    from test_qemu_command import CRASHES_UNDER_KVM
    from test_smoke_checks import KUBECTL, SSH, SYSTEMCTL

    real_qemu = shutil.which("qemu-system-x86_64")
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM + f"os.execv({real_qemu!r}, [{real_qemu!r}, *argv])\n")
    monkeypatch.setattr(qemu, "kvm_usable", lambda device=None: True)
    stand_ins.add("ssh", SSH)
    stand_ins.add("systemctl", SYSTEMCTL)
    stand_ins.add("kubectl", KUBECTL)
    units = {u: "active" for u in smoke_test.QEMU_UNITS}
    state = {"units": units, "gpus_advertised": 2, "gpus_schedulable": 2, "pods": {}}
    (stand_ins.calls_dir / "node.json").write_text(json.dumps(state))
    options = smoke_test.SmokeOptions(
        image=guest["rootfs"],
        kernel=guest["kernel"],
        initrd=guest["initrd"],
        kernel_args=f"fixture=ssh {FAST_BOOT_ARGS}",
        memory_mib=2048,
        boot_timeout_s=BOOT_TIMEOUT_S,
        log_dir=tmp_path,
        kvm=None,
        nic_model="e1000",
    )
    settings = smoke_test.CheckSettings(
        pod_sleep_s=8, units_timeout_s=1, node_timeout_s=1, pod_timeout_s=5, poll_s=0.01
    )
    results = smoke_test.run_smoke_test(options, environ={}, settings=settings)
    assert all(r.passed for r in results)
    assert "QEMU accelerator: TCG (software emulation, slow): KVM probe failed" in capsys.readouterr().out
    ssh_argv = stand_ins.calls("ssh")[0]["argv"]
    port = ssh_argv[ssh_argv.index("-p") + 1]
    assert ssh_argv[-2] == "root@127.0.0.1" and port != "22"
    (log,) = tmp_path.glob("smoke-test-*.console.log")
    assert "FIXTURE-LISTENING" in log.read_text(errors="replace")
    assert qemu_processes_for(log) == []


@pytest.mark.skipif(not qemu.kvm_usable(), reason="no usable /dev/kvm here")
def test_kvm_probe_on_this_host_decides_promptly(guest) -> None:
    """Whatever this host's KVM does (works, aborts QEMU, hangs the guest), the probe with
    the real QEMU decides within its timeout and leaves no QEMU behind."""
    started = time.monotonic()
    accelerator = qemu.choose_accelerator(None, guest["kernel"], probe_timeout_s=20)
    assert time.monotonic() - started < 40, accelerator
    assert accelerator.reason.startswith("KVM probe passed" if accelerator.kvm else "KVM probe failed")
    assert qemu_processes_for(Path("gpu-k8s-kvm-probe")) == []
