"""Boot an image in QEMU for smoke tests, and always tear it down again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

MIN_MEMORY_MIB = 2048  # k3s with docker does not come up in less
DEFAULT_MEMORY_MIB = 4096  # the layer's QB_MEM for the qemux86-64 images
DEFAULT_CPUS = 4  # the layer's QB_SMP
KVM_CPU_MODEL = "host"
TCG_CPU_MODEL = "max"
KVM_PROBE_TIMEOUT_S = 20.0
# Lines a kernel prints once its core start-up (timers, SMP, drivers) is behind it: with no
# disk and no init it gets as far as mounting root, panics and, with -no-reboot, QEMU exits.
KERNEL_STARTED_MARKERS = ("Kernel panic", "VFS: ", "Freeing unused kernel", "Run /init")
# A QEMU that dies this soon under KVM is taken for a KVM failure, not a guest failure.
KVM_EARLY_EXIT_S = 30.0
# Console lines after which the guest never offers SSH, with what they mean: waiting on would only
# burn the boot timeout (a kernel without panic= stays in its panic; an emergency shell waits for
# a person at the console).
FATAL_CONSOLE_LINES = (
    ("Kernel panic - not syncing", "the guest kernel panicked"),
    ("You are in emergency mode", "systemd stopped the boot in emergency mode (a unit the boot needs failed)"),
    ("Cannot open access to console, the root account is locked",
     "systemd stopped the boot in emergency mode (a unit the boot needs failed)"),
    ("No bootable option or device was found", "the UEFI firmware found nothing to boot on the disk"),
    ("grub rescue>", "GRUB found no configuration to boot (grub rescue)"),
)
PANIC_TRACE_END = "---[ end Kernel panic"  # the last line of a kernel panic's report
PANIC_TRACE_WAIT_S = 5.0  # how long to let a panic finish printing its trace into the console log


class QemuError(Exception):
    """QEMU could not start, exited early, or the guest never offered SSH."""


class QemuExited(QemuError):
    """QEMU ended before the guest offered SSH."""

    def __init__(self, message: str, returncode: int | None, after_s: float) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.after_s = after_s


@dataclass(frozen=True)
class QemuConfig:
    kernel: Path
    rootfs: Path
    console_log: Path
    ssh_port: int
    memory_mib: int = DEFAULT_MEMORY_MIB
    cpus: int = DEFAULT_CPUS
    kvm: bool = True
    initrd: Path | None = None
    extra_kernel_args: str = ""
    qemu_binary: str = "qemu-system-x86_64"
    nic_model: str = "virtio-net-pci"  # what the image's kernel has built in
    # (code, variables) OVMF flash images: boot `rootfs` as a whole UEFI disk (the A/B
    # .uefiimg: GRUB picks the slot) instead of handing QEMU the kernel.
    firmware: tuple[Path, Path] | None = None


def kvm_usable(device: Path = Path("/dev/kvm")) -> bool:
    """KVM makes the guest ~10x faster; worth probing when we may open the device
    read-write (an open /dev/kvm does not prove QEMU can run a guest on it: see probe_kvm)."""
    return device.exists() and os.access(device, os.R_OK | os.W_OK)


def accelerator_args(kvm: bool) -> list[str]:
    return ["-accel", "kvm", "-cpu", KVM_CPU_MODEL] if kvm else ["-accel", "tcg", "-cpu", TCG_CPU_MODEL]


@dataclass(frozen=True)
class KvmProbe:
    usable: bool
    detail: str  # one line: what the probe saw
    seconds: float


def exit_description(returncode: int | None) -> str:
    """'code 1', or 'signal SIGABRT' for a QEMU that aborted (Popen reports -6)."""
    if returncode is not None and returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


def _first_meaningful_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(nothing)"])[0][:200]


def _stop_group(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, to a process started with start_new_session=True."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
            # The leader is gone; one more kill for anything left in the group.
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    process.wait()


def probe_kvm(
    kernel: Path,
    qemu_binary: str = "qemu-system-x86_64",
    cpus: int = DEFAULT_CPUS,
    timeout_s: float = KVM_PROBE_TIMEOUT_S,
    poll_s: float = 0.1,
) -> KvmProbe:
    """Boot kernel under KVM, with the CPU model the smoke test uses and no disk: a working
    KVM gets through the kernel's start-up in a second or two. Broken (often nested) KVM
    makes QEMU abort at once ("failed to set MSR ...") or hang with no kernel output."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-kvm-probe-") as temp:
        serial = Path(temp) / "serial.log"
        output = Path(temp) / "qemu.log"
        argv = [
            qemu_binary, "-name", "gpu-k8s-kvm-probe", *accelerator_args(True),
            "-smp", str(cpus), "-m", "256", "-nodefaults", "-display", "none",
            "-serial", f"file:{serial}", "-kernel", str(kernel),
            "-append", "console=ttyS0 panic=-1", "-no-reboot",
        ]
        with output.open("wb") as qemu_output:
            try:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=qemu_output,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            except FileNotFoundError:
                raise QemuError(f"{qemu_binary} not found; install it (Debian/Ubuntu: "
                                "sudo apt-get install qemu-system-x86)") from None

        def kernel_started() -> bool:
            try:
                text = serial.read_text(errors="replace")
            except OSError:
                return False
            return any(marker in text for marker in KERNEL_STARTED_MARKERS)

        try:
            while True:
                exited = process.poll() is not None
                if kernel_started():
                    return KvmProbe(True, "the kernel started under KVM", time.monotonic() - started)
                if exited:
                    said = _first_meaningful_line(output.read_text(errors="replace"))
                    return KvmProbe(False, f"QEMU exited with {exit_description(process.returncode)}: {said}",
                                    time.monotonic() - started)
                if time.monotonic() - started > timeout_s:
                    return KvmProbe(False, f"the kernel did not start under KVM within {timeout_s:.0f} s "
                                    "(the guest hangs)", time.monotonic() - started)
                time.sleep(poll_s)
        finally:
            _stop_group(process)


@dataclass(frozen=True)
class Accelerator:
    kvm: bool
    chosen_automatically: bool
    reason: str  # one line, for the person watching and for the report

    def describe(self) -> str:
        return ("KVM" if self.kvm else "TCG (software emulation, slow)") + f": {self.reason}"


def choose_accelerator(
    requested: bool | None,
    kernel: Path,
    qemu_binary: str = "qemu-system-x86_64",
    cpus: int = DEFAULT_CPUS,
    kvm_device: Path = Path("/dev/kvm"),
    probe_timeout_s: float = KVM_PROBE_TIMEOUT_S,
) -> Accelerator:
    """requested: True (--kvm) forces KVM, False (--no-kvm) forbids it, None probes once."""
    if requested is True:
        return Accelerator(True, False, "forced with --kvm (not probed)")
    if requested is False:
        return Accelerator(False, False, "KVM not used (--no-kvm)")
    if not kvm_usable(kvm_device):
        return Accelerator(False, True, f"{kvm_device} is missing or not read-write for this user")
    probe = probe_kvm(kernel, qemu_binary, cpus, probe_timeout_s)
    if probe.usable:
        return Accelerator(True, True, f"KVM probe passed in {probe.seconds:.1f} s")
    return Accelerator(False, True, f"KVM probe failed: {probe.detail} (--kvm forces KVM)")


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def qemu_command(config: QemuConfig) -> list[str]:
    """The full QEMU command line: serial console to a file, user networking with the
    guest's port 22 forwarded to config.ssh_port on loopback, the disk opened with
    -snapshot so the image file is never modified."""
    if config.memory_mib < MIN_MEMORY_MIB:
        raise QemuError(
            f"--memory-mib must be at least {MIN_MEMORY_MIB} (k3s needs it), got {config.memory_mib}"
        )
    argv = [
        config.qemu_binary,
        "-name", "gpu-k8s-smoke",
        *accelerator_args(config.kvm),
        "-smp", str(config.cpus),
        "-m", str(config.memory_mib),
        "-nographic",
        "-monitor", "none",
        "-serial", f"file:{config.console_log}",
    ]
    if config.firmware is not None:
        if config.initrd is not None or config.extra_kernel_args:
            raise QemuError("a UEFI disk boots its own kernel: --initrd and --kernel-args do not apply to it")
        code, variables = config.firmware
        # -snapshot below also keeps the firmware's variable store unchanged.
        argv += [
            "-drive", f"if=pflash,format=qcow2,unit=0,readonly=on,file={code}",
            "-drive", f"if=pflash,format=qcow2,unit=1,file={variables}",
        ]
    else:
        append = "root=/dev/vda rw console=ttyS0"
        if config.extra_kernel_args:
            append += " " + config.extra_kernel_args
        argv += ["-kernel", str(config.kernel)]
        if config.initrd is not None:
            argv += ["-initrd", str(config.initrd)]
        argv += ["-append", append]
    argv += [
        "-drive", f"file={config.rootfs},if=virtio,format=raw",
        "-snapshot",
        "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{config.ssh_port}-:22",
        "-device", f"{config.nic_model},netdev=net0",
        # The hardware watchdog the A/B images arm: a hung guest is reset, which
        # -no-reboot turns into QEMU exiting instead of a silent reboot loop.
        "-device", "i6300esb",
        "-no-reboot",
    ]
    return argv


def fatal_console_line(line: str) -> str | None:
    """What a console line means when the boot can no longer reach SSH; None for any other line."""
    return next((what for marker, what in FATAL_CONSOLE_LINES if marker in line), None)


class ConsoleWatch:
    """Reads the serial console log as it grows (never all of it again) and finds the first line
    that ends the boot. A prompt that waits for input (grub rescue>) has no newline after it, so
    the unfinished last line is looked at too."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.unfinished = ""

    def fatal(self) -> tuple[str, str] | None:
        """(what it means, the line), or None."""
        try:
            with self.path.open("rb") as console:
                console.seek(self.offset)
                new = console.read()
        except OSError:
            return None
        self.offset += len(new)
        lines = (self.unfinished + new.decode(errors="replace")).split("\n")
        self.unfinished = lines.pop()
        for line in [*lines, self.unfinished]:
            what = fatal_console_line(line)
            if what is not None:
                return what, line.strip()
        return None


class QemuGuestFailed(QemuError):
    """The guest's console shows its boot has ended short of SSH (a kernel panic, an emergency shell)."""


def read_ssh_banner(port: int, timeout: float = 2.0) -> bytes:
    """The first bytes the guest's SSH server sends through the forward; b"" if none.

    QEMU's user networking accepts the host-side connection even when nothing listens
    in the guest, so a connect alone proves nothing: only a banner does."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
            connection.settimeout(timeout)
            return connection.recv(256)
    except OSError:
        return b""


class QemuMachine:
    """A running QEMU; use as a context manager so it is stopped on every path."""

    def __init__(self, config: QemuConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.qemu_log = config.console_log.with_name(config.console_log.stem + ".qemu.log")

    def start(self) -> None:
        self.config.console_log.parent.mkdir(parents=True, exist_ok=True)
        self.config.console_log.write_bytes(b"")
        with self.qemu_log.open("wb") as qemu_output:
            try:
                self.process = subprocess.Popen(
                    qemu_command(self.config),
                    stdin=subprocess.DEVNULL,
                    stdout=qemu_output,
                    stderr=subprocess.STDOUT,
                    # Own process group: Ctrl-C reaches us, not QEMU, and stop() can kill
                    # everything QEMU started.
                    start_new_session=True,
                )
            except FileNotFoundError:
                raise QemuError(
                    f"{self.config.qemu_binary} not found; install it (Debian/Ubuntu: "
                    "sudo apt-get install qemu-system-x86)"
                ) from None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def console_tail(self, lines: int = 20) -> str:
        try:
            text = self.config.console_log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def qemu_output(self) -> str:
        try:
            return self.qemu_log.read_text(errors="replace").strip()
        except OSError:
            return ""

    def wait_for_ssh(
        self,
        timeout_s: float,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_wait: Callable[[float], None] | None = None,
    ) -> float:
        """Seconds until the guest's SSH server answered. Raises QemuError, with the end of the
        console log, on timeout, when QEMU exits first, and as soon as the console shows the boot
        cannot get there (QemuGuestFailed: a kernel panic, an emergency shell)."""
        started = clock()
        watch = ConsoleWatch(self.config.console_log)
        while True:
            if not self.running:
                code = self.process.returncode if self.process else None
                raise QemuExited(
                    f"QEMU exited with {exit_description(code)} before SSH came up; QEMU said: "
                    f"{self.qemu_output() or '(nothing)'}\nlast console lines:\n{self.console_tail()}",
                    code,
                    clock() - started,
                )
            fatal = watch.fatal()
            if fatal is not None:
                self._let_the_panic_finish(fatal[1], poll_s, clock)
                raise QemuGuestFailed(
                    f"{fatal[0]} after {clock() - started:.0f} s, so the guest will never offer SSH: \"{fatal[1]}\"; "
                    f"stopped waiting (QEMU is stopped); console log {self.config.console_log}, last lines:\n"
                    f"{self.console_tail(40)}"
                )
            if read_ssh_banner(self.config.ssh_port).startswith(b"SSH-"):
                return clock() - started
            waited = clock() - started
            if waited > timeout_s:
                raise QemuError(
                    f"no SSH from the guest after {timeout_s:.0f} s (port {self.config.ssh_port}); "
                    f"console log {self.config.console_log}, last lines:\n{self.console_tail()}"
                )
            if on_wait:
                on_wait(waited)
            time.sleep(poll_s)

    def _let_the_panic_finish(self, line: str, poll_s: float, clock: Callable[[], float]) -> None:
        """A panic prints its reason first and its trace after: the tail is worth more with the
        trace, which ends with PANIC_TRACE_END (or stops coming)."""
        if "Kernel panic" not in line:
            return
        deadline = clock() + PANIC_TRACE_WAIT_S
        while PANIC_TRACE_END not in self.console_tail(60) and clock() < deadline and self.running:
            time.sleep(min(poll_s, 0.2))

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop QEMU and anything in its process group; safe to call more than once."""
        if self.process is None:
            return
        _stop_group(self.process, grace_s)

    def __enter__(self) -> QemuMachine:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
