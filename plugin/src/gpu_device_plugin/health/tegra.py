"""Health of a Jetson's integrated GPU: its device nodes, and GPU driver errors in the kernel log.

Marks the GPU Unhealthy when one of its device nodes disappears or cannot be opened, or
when nvgpu logs an error that means the GPU (not one application) is in trouble. Recovers
after `recovery_quiet_period_s` with every node present and openable and no new error line.

Kernel log lines come from nvgpu's logger, "nvgpu: <dev> <function>:<line> [ERR]  <text>"
(L4T R32 and later), or from older kernels' dev_err, "gk20a <dev>: <function>: <text>".
How they are judged (see `classify_kmsg_line`):
- channel errors carry an Xid-like code: nvgpu's error notifier values are the Xid numbers
  (8 idle timeout, 13 graphics exception, 31 MMU fault, 32 PBDMA error, 43 channel reset),
  so they go through the same Xid policy as NVML: application errors (13, 31, 43, 45, 68,
  109) are ignored by default, DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS apply.
  "error notifier set to N for ch C" gives N; "Job on channel C timed out" is 8; PBDMA
  interrupts 32; MMU faults 31; SM / graphics exceptions 13; "fifo sched ctxsw timeout"
  and "preempt TSG/channel ... timeout" are context-switch timeouts, 109.
- driver-level failures always count: "SW quiesce" (nvgpu stopped the GPU), PMU halt or
  exterr, "fecs watchdog" / "cannot ctxsw anymore", a failed power-on, uncorrected ECC.
- everything else is noise: warnings and info, "fake mmu fault" (nvgpu's own recovery
  trick), debug dumps, other drivers, and [ERR] lines not listed above.

Thor has no nvgpu: its iGPU runs on NVIDIA's open driver (OpenRM), which reports like a dGPU's,
"NVRM: Xid (PCI:0000:01:00): <xid>, pid=..., name=..., <text>" (kernel_rc.c in
open-gpu-kernel-modules; " GPU-I:nn ..." inside the parenthesis on MIG). Those Xids go through the
same policy; "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus" and "... RmInitAdapter failed"
are driver-level. NVRM lines only concern a GPU on OpenRM, at the PCI address they name (a
dGPU beside Thor's iGPU logs its own), and nvgpu lines only the others.
"""

import errno
import logging
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ..discovery.tegra import OPENRM
from ..host import inotify
from ..model import Gpu
from .base import Report, loop_alive
from .records import HealthRecords, LastXids
from .rules import GOOD, Observation, XidPolicy, bad, xid_policy_from_env

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# Kernel log classification (pure)

# Patterns are strings, compiled by re (and cached) on first use: a node whose kernel never
# logs a GPU error never compiles them, and the plugin starts ~3 ms sooner.
_KMSG_PREFIX = r"(?P<prio>\d+),\d+,\d+,[^;]*;"
_NVGPU_LINE = r"nvgpu:.*?(?P<func>\w+):(?P<line>\d+)\s+\[(?P<tag>ERR|WRN|INFO|DBG)\]\s*(?P<text>.*)"
_OLD_GPU_LINE = r"(?:gk20a|gm20b|gp10b|gv11b|ga10b|nvgpu)\s+\S+:\s+(?P<text>.*)"
_ERR_LEVEL = 3  # KERN_ERR; nvgpu_err and dev_err log at this level


class KmsgRecord(NamedTuple):
    level: int | None  # syslog level 0-7 when the line carried a /dev/kmsg prefix
    text: str


NVGPU, NVRM = "nvgpu", "nvrm"  # which driver logged it: nvgpu (Nano, Orin) or NVIDIA's RM (Thor)


class GpuLogError(NamedTuple):
    """A GPU driver's error line that may matter: `xid` for channel errors, None for driver failures."""

    xid: int | None
    summary: str
    source: str = NVGPU
    pci: str = ""  # NVRM lines: the GPU's "dddd:bb:dd", as the driver names it


def parse_kmsg_record(raw: str) -> KmsgRecord:
    """A /dev/kmsg record "prio,seq,usec,flags;text" (continuation lines dropped), or a plain line."""
    first = raw.split("\n", 1)[0].rstrip("\r")
    match = re.match(_KMSG_PREFIX, first)
    if match is None:
        return KmsgRecord(None, first)
    return KmsgRecord(int(match["prio"]) & 7, first[match.end():])


# (pattern on the lowercased error text, Xid or None for driver-level, summary)
_XID_NOTIFIER = r"error notifier set to (\d+)"
_RULES: tuple[tuple[str, int | None, str], ...] = (
    (r"sw quiesce", None, "nvgpu stopped the GPU (SW quiesce)"),
    (r"pmu halt|pmu exterr", None, "GPU power-management unit (PMU) halted"),
    (r"fecs watchdog|cannot ctxsw anymore", None, "context-switch firmware (FECS) stopped"),
    (r"(failed|unable) to (power ?on|unrailgate)|power ?on failed", None,
     "GPU failed to power on"),
    (r"(uncorrected|double[- ]bit).*\becc\b|\becc\b.*(uncorrected|double[- ]bit)", None,
     "uncorrectable ECC error"),
    (r"job on channel \d+ timed out", 8, "channel watchdog timeout"),
    (r"pbdma_intr|pbdma intr", 32, "PBDMA error (corrupted push buffer stream)"),
    (r"mmu fault|mmu_fault", 31, "GPU memory page fault"),
    (r"sm exception|sm_exception|gr exception|mme_fe1 exception|hww (global|warp) esr", 13,
     "graphics engine exception"),
    (r"ctxsw timeout|preempt (tsg|channel|ch) \d+ timeout|preempt timed out", 109,
     "context-switch timeout"),
)


_NVRM_PCI = r"(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
_NVRM_XID = r"NVRM: Xid \(PCI:" + _NVRM_PCI + r"[^)]*\): (?P<xid>\d+),"
_NVRM_GPU = r"NVRM: GPU " + _NVRM_PCI + r"\.[0-9a-fA-F]: (?P<text>.*)"
_NVRM_RULES = (
    (r"fallen off the bus", "the GPU has fallen off the bus"),
    (r"rminitadapter failed", "the NVIDIA driver could not initialise the GPU (RmInitAdapter failed)"),
)


def classify_nvrm_line(text: str) -> GpuLogError | None:
    """A line of NVIDIA's kernel driver (OpenRM, Thor's) that reports a GPU error, or None."""
    xid = re.search(_NVRM_XID, text)
    if xid is not None:
        return GpuLogError(int(xid["xid"]), f"Xid {xid['xid']}", NVRM, xid["pci"].lower())
    gpu = re.search(_NVRM_GPU, text)
    if gpu is not None:
        lowered = gpu["text"].lower()
        for pattern, summary in _NVRM_RULES:
            if re.search(pattern, lowered):
                return GpuLogError(None, summary, NVRM, gpu["pci"].lower())
    return None


def classify_kmsg_line(raw: str) -> GpuLogError | None:
    """What one kernel log line says about the GPU; None for anything that is not a GPU error."""
    record = parse_kmsg_record(raw)
    text = record.text.strip()
    if "NVRM:" in text:
        return classify_nvrm_line(text)
    match = re.match(_NVGPU_LINE, text)
    if match is not None:
        if match["tag"] != "ERR":
            return None
        message = match["text"]
    else:
        old = re.match(_OLD_GPU_LINE, text)
        if old is None or (record.level is not None and record.level > _ERR_LEVEL):
            return None
        message = old["text"]
    lowered = message.lower()
    if "fake mmu fault" in lowered:  # nvgpu raises it itself to reset an engine during recovery
        return None
    notifier = re.search(_XID_NOTIFIER, lowered)
    if notifier is not None:
        return GpuLogError(int(notifier.group(1)), f"channel error notifier {notifier.group(1)}")
    for pattern, xid, summary in _RULES:
        if re.search(pattern, lowered):
            return GpuLogError(xid, summary)
    return None


def log_error_observation(found: GpuLogError, raw: str, policy: XidPolicy) -> Observation | None:
    """The bad observation a classified kernel log line gives its GPU under `policy`, or None."""
    if found.xid is None:
        counts = policy.other_checks_enabled
        label = found.summary
    else:
        counts = policy.is_critical(found.xid)
        label = found.summary if found.source == NVRM else f"{found.summary} (Xid-equivalent {found.xid})"
    if not counts:
        return None
    driver = "NVIDIA driver" if found.source == NVRM else "nvgpu"
    return bad(f"{driver} error in the kernel log: {label}: {parse_kmsg_record(raw).text.strip()[:160]}")


def kmsg_observation(raw: str, policy: XidPolicy) -> Observation | None:
    """The bad observation a kernel log line gives the GPU under `policy`, or None."""
    found = classify_kmsg_line(raw)
    return None if found is None else log_error_observation(found, raw, policy)


def concerns(found: GpuLogError, gpu: Gpu) -> bool:
    """Whether a driver's error line is about `gpu`: nvgpu's about a GPU nvgpu drives, NVRM's about
    a GPU on OpenRM at the PCI address the line names."""
    openrm = gpu.properties.get("gpu_driver") == OPENRM
    if found.source != NVRM:
        return not openrm
    bus = gpu.properties.get("pci_bus_id", "").lower()
    return openrm and (not found.pci or not bus or bus.startswith(found.pci))


# ---------------------------------------------------------------------------------------
# Device nodes (thin I/O)

# Opening a Jetson device node is not always harmless: the channel, address-space, TSG,
# debugger and profiler nodes (and the other engines' nvhost-* nodes) create a session and
# can power the engine up, and on Thor opening /dev/nvidia0 brings the GPU up in the NVIDIA
# driver. Only the control nodes, whose open is cheap (/dev/nvidiactl opens no GPU), are
# opened; the others are checked for presence and permissions.
_OPENABLE_NODE = r"/(nvhost-ctrl|nvhost-ctrl-gpu|nvmap|nvgpu/igpu\d+/ctrl|nvidiactl)$"


def check_device_node(host_path: str, shown_as: str) -> str | None:
    """The problem with one device node (`shown_as`: its path on the host), or None when it is
    there and, for control nodes, opens; the others must be character devices whose major a
    driver holds (/proc/devices), which is what opening them would need."""
    try:
        st = os.stat(host_path)
    except FileNotFoundError:
        return f"device node {shown_as} is missing"
    except OSError as exc:
        return f"cannot stat device node {shown_as}: {exc.strerror}"
    if not re.search(_OPENABLE_NODE, shown_as):
        # os.access always says yes to root; it only tells something to a plugin that is not root
        if os.geteuid() != 0 and not os.access(host_path, os.R_OK | os.W_OK):
            return f"cannot open device node {shown_as}: permission denied (check its mode and owner)"
        return _driver_problem(st, host_path, shown_as)
    try:
        fd = os.open(host_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"cannot open device node {shown_as}: permission denied (check its mode and owner)"
        if exc.errno == errno.ENOENT:
            return f"device node {shown_as} is missing"
        if exc.errno in (errno.ENXIO, errno.ENODEV):
            return f"cannot open device node {shown_as}: no device behind it (driver unbound or GPU gone)"
        if exc.errno in (errno.EBUSY, errno.EAGAIN, errno.EINTR):
            return None  # the driver answered: the node works, it is just busy
        return f"cannot open device node {shown_as}: {exc.strerror}"
    os.close(fd)
    return None


def _driver_problem(st: os.stat_result, host_path: str, shown_as: str) -> str | None:
    root = host_path[: -len(shown_as)] if host_path.endswith(shown_as) else ""
    majors = _char_majors(os.path.join(root or "/", "proc/devices"))
    if majors is None:
        return None  # no /proc to ask (a test tree, or a container without the host's /proc)
    if not stat.S_ISCHR(st.st_mode):
        return f"device node {shown_as} is not a character device (replaced by a file? re-create it: reboot)"
    major = os.major(st.st_rdev)
    if major not in majors:
        return (f"cannot open device node {shown_as}: no device behind it (no driver holds character major "
                f"{major}: driver unloaded or GPU gone)")
    return None


def _char_majors(proc_devices: str) -> set[int] | None:
    """The character-device majors drivers registered (/proc/devices), or None when it cannot be read.

    /proc/devices, not /sys/dev/char: drivers that make their nodes with mknod (NVIDIA's) register
    a major but no sysfs device."""
    try:
        with open(proc_devices, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    section = text.split("Block devices:", 1)[0]
    return {int(line.split()[0]) for line in section.splitlines() if line.strip()[:1].isdigit()}


_WATCH_MASK = (
    inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO
    | inotify.IN_ATTRIB | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF
)


class TegraHealthMonitor:
    """HealthMonitor for TegraBackend GPUs (normally one integrated GPU)."""

    def __init__(
        self,
        root: str = "/",
        kmsg_path: str | None = None,
        recovery_quiet_period_s: float = 60.0,
        *,
        # inotify (nodes) and the kernel log (nvgpu errors) report at once; the periodic recheck
        # only catches a driver unbound behind an unchanged node and times recovery, so every
        # 10 s is enough, and a 1 s wake-up cost an idle Nano ~0.07 % of a core
        recheck_interval_s: float = 10.0,
        file_poll_interval_s: float = 0.2,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self._kmsg_path = kmsg_path if kmsg_path is not None else self._host_path("/dev/kmsg")
        self._recheck_interval_s = recheck_interval_s
        self._file_poll_interval_s = file_poll_interval_s  # kmsg stand-ins (files, FIFOs) cannot be selected
        self._env = env
        self._clock = clock
        self._policy = XidPolicy()
        self._gpus: list[Gpu] = []
        self._records = HealthRecords(clock, recovery_quiet_period_s,
                                     "nodes present and no GPU driver errors in the kernel log")
        self._xids = LastXids()  # Xid-equivalents from the kernel log, while it is read
        self._thread: threading.Thread | None = None
        self._beat = time.monotonic()  # last turn of the monitor loop
        self._started = False
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        # Owned by the thread:
        self._inotify: inotify.Inotify | None = None
        self._watches: dict[int, str] = {}  # wd -> watched directory
        self._relevant: dict[str, set[str]] = {}  # watched directory -> entry names that matter
        self._kmsg_fd = -1
        self._kmsg_selectable = False
        self._kmsg_buffer = b""

    def _host_path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    # -- HealthMonitor ------------------------------------------------------------------

    def start(self, gpus: Sequence[Gpu], report: Report) -> None:
        if self._started:
            raise RuntimeError("TegraHealthMonitor.start called twice; create a new monitor instead")
        self._started = True
        self._policy = xid_policy_from_env(os.environ if self._env is None else self._env)
        for warning in self._policy.warnings:
            log.warning("%s", warning)
        self._gpus = list(gpus)
        self._records.start([gpu.id for gpu in gpus], report)
        if not self._policy.checks_enabled:
            log.info("Tegra health checks disabled by DP_DISABLE_HEALTHCHECKS")
            return
        if not gpus:
            return
        self._wake_r, self._wake_w = os.pipe()
        # Open the kernel log now, so lines logged after start() returns are never skipped.
        self._open_kmsg()
        self._setup_watches()
        self._recheck()  # a node missing at start is reported before start returns
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tegra-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        if thread is None or not thread.is_alive():
            self._close_files()

    def alive(self) -> bool:
        return loop_alive(self._started, self._stopped.is_set(), self._thread, self._beat)

    def last_xid(self, gpu_id: str) -> int | None:
        """The last nvgpu channel error's Xid-equivalent (0: none yet); None while the kernel log is not read."""
        return self._xids.last(gpu_id)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("Tegra health monitor stopped on an unexpected error; GPU health is not watched")

    def _loop(self) -> None:
        next_recheck = time.monotonic() + self._recheck_interval_s
        while not self._stopped.is_set():
            self._beat = time.monotonic()  # alive() compares against this: a hung call stops it
            timeout = max(0.0, next_recheck - time.monotonic())
            readable = [self._wake_r]
            if self._inotify is not None:
                readable.append(self._inotify.fileno())
            if self._kmsg_fd >= 0:
                if self._kmsg_selectable:
                    readable.append(self._kmsg_fd)
                else:
                    timeout = min(timeout, self._file_poll_interval_s)
            poller = select.poll()  # not select.select: descriptors above 1023 are fine here
            for fd in readable:
                poller.register(fd, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(timeout * 1000)}
            if self._wake_r in ready or self._stopped.is_set():
                break
            changed = self._inotify is not None and self._inotify.fileno() in ready and self._nodes_touched()
            if self._kmsg_fd >= 0 and (not self._kmsg_selectable or self._kmsg_fd in ready):
                self._read_kmsg()
            if changed or time.monotonic() >= next_recheck:
                self._recheck()
                next_recheck = time.monotonic() + self._recheck_interval_s

    # -- device nodes -------------------------------------------------------------------

    def _node_paths(self) -> list[str]:
        return sorted({node for gpu in self._gpus for node in gpu.device_nodes})

    def _setup_watches(self) -> None:
        try:
            self._inotify = inotify.Inotify()
        except OSError as exc:
            log.warning("no inotify (%s): device nodes are re-checked every %.0f s only",
                        exc, self._recheck_interval_s)
            return
        dev = self._host_path("/dev")
        directories = {dev} | {os.path.dirname(self._host_path(node)) for node in self._node_paths()}
        self._relevant = {d: set() for d in directories}
        for node in self._node_paths():
            host = self._host_path(node)
            for directory in directories:
                if host.startswith(directory + os.sep):
                    self._relevant[directory].add(os.path.relpath(host, directory).split(os.sep, 1)[0])
        self._add_missing_watches()

    def _add_missing_watches(self) -> None:
        if self._inotify is None:
            return
        watched = set(self._watches.values())
        for directory in self._relevant:
            if directory in watched or not os.path.isdir(directory):
                continue
            try:
                self._watches[self._inotify.add_watch(directory, _WATCH_MASK)] = directory
            except OSError as exc:
                log.debug("cannot watch %s: %s", directory, exc)

    def _nodes_touched(self) -> bool:
        """Drain inotify; True when an event concerns one of the GPU's nodes."""
        assert self._inotify is not None
        touched = False
        for event in self._inotify.read_events():
            if event.mask & inotify.IN_Q_OVERFLOW:
                touched = True
                continue
            directory = self._watches.get(event.wd)
            if directory is None:
                continue
            if event.mask & inotify.IN_IGNORED:
                del self._watches[event.wd]  # re-added by the next recheck once it exists again
                touched = True
            elif event.mask & (inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
                touched = True  # the directory itself went away
            else:
                touched = touched or event.name in self._relevant.get(directory, ())
        return touched

    def _recheck(self) -> None:
        self._add_missing_watches()
        for gpu in self._gpus:
            observation = GOOD
            if self._policy.other_checks_enabled:
                for node in gpu.device_nodes:
                    problem = check_device_node(self._host_path(node), node)
                    if problem is not None:
                        observation = bad(problem)
                        break
            self._observe(gpu.id, observation)

    # -- kernel log ---------------------------------------------------------------------

    def _open_kmsg(self) -> None:
        try:
            fd = os.open(self._kmsg_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot read the kernel log %s (%s): GPU driver errors will not mark the GPU Unhealthy; "
                        "run the plugin as root (CAP_SYSLOG)", self._kmsg_path, exc.strerror)
            return
        self._kmsg_fd = fd
        self._xids.watch(gpu.id for gpu in self._gpus)
        self._kmsg_selectable = stat.S_ISCHR(os.fstat(fd).st_mode)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # skip the backlog: old boot messages are not news
        except OSError:
            self._drain_kmsg()  # a FIFO cannot seek: what is queued now is the backlog
        self._kmsg_buffer = b""

    def _drain_kmsg(self) -> list[bytes]:
        """Every complete record readable now (one per read on /dev/kmsg, lines elsewhere)."""
        records: list[bytes] = []
        while True:
            try:
                chunk = os.read(self._kmsg_fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # /dev/kmsg: records were overwritten before we read them; go on
            if not chunk:
                break
            if self._kmsg_selectable:
                records.append(chunk)
                continue
            self._kmsg_buffer += chunk
            *lines, self._kmsg_buffer = self._kmsg_buffer.split(b"\n")
            records.extend(lines)
        return records

    def _read_kmsg(self) -> None:
        try:
            records = self._drain_kmsg()
        except OSError as exc:
            log.warning("reading the kernel log %s failed (%s): GPU driver errors are no longer watched",
                        self._kmsg_path, exc.strerror)
            os.close(self._kmsg_fd)
            self._kmsg_fd = -1
            self._xids.watch(())
            return
        for raw in records:
            text = raw.decode("utf-8", "replace")
            found = classify_kmsg_line(text)
            if found is None:
                continue
            observation = log_error_observation(found, text, self._policy)
            for gpu in self._gpus:
                if not concerns(found, gpu):
                    continue
                if found.xid is not None:
                    self._xids.seen(gpu.id, found.xid)
                if observation is not None:
                    self._observe(gpu.id, observation)

    # -- state --------------------------------------------------------------------------

    def _observe(self, gpu_id: str, observation: Observation) -> None:
        self._records.observe(gpu_id, observation)

    def _close_files(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        for fd in (self._kmsg_fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._kmsg_fd = self._wake_r = self._wake_w = -1
