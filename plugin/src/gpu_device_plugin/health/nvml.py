"""Health of discrete GPUs from NVML events (Xid, ECC), with recovery.

Marks a GPU Unhealthy on: a critical Xid (the official skip list and DP_* variables
apply), a double-bit ECC error, a failed event wait (every GPU: we cannot tell which),
the GPU not answering a cheap NVML query, or, on an NVSwitch board, Fabric Manager down
or the GPU's NVLink fabric not set up (health/fabric: CUDA fails with 802 there).
Single-bit ECC errors were corrected by the hardware and only get logged. A GPU goes back
to Healthy once it answers NVML normally and nothing bad was seen for
`recovery_quiet_period_s`.

One thread, one nvmlInit for the monitor's life. While every GPU is healthy and sends
events, it sleeps in the event wait for `idle_wait_ms` at a time (an idle plugin costs no
CPU); while a GPU recovers or has no events it waits `wait_timeout_ms` and polls every
`check_interval_s`. A stop is seen when the current wait returns; stop() does not wait
longer than STOP_JOIN_S for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..discovery.base import DiscoveryError
from ..discovery.nvml_lib import is_nvml_error, load_nvml, nvml_init, nvml_shutdown, text
from ..model import Gpu
from . import fabric
from .base import Report, loop_alive
from .records import HealthRecords, LastXids
from .rules import GOOD, Observation, XidPolicy, bad, xid_policy_from_env

log = logging.getLogger(__name__)

# nvmlEventType* bits (nvml.h); fixed by the C API, so plain constants keep the rules pure.
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
WANTED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC
STOP_JOIN_S = 3.0  # systemd's stop timeout must also cover the gRPC server's shutdown


def classify_event(policy: XidPolicy, event_type: int, event_data: int) -> Observation | None:
    """What one NVML event means for its GPU: a bad observation, or None (nothing to act on)."""
    if event_type & EVENT_XID_CRITICAL:
        xid = int(event_data)
        if policy.is_critical(xid):
            return bad(f"Xid {xid}: critical GPU error reported by the NVIDIA driver")
        return None
    if event_type & EVENT_DOUBLE_BIT_ECC and policy.other_checks_enabled:
        return bad("double-bit ECC error: GPU memory returned uncorrectable data")
    return None


class NvmlHealthMonitor:
    """HealthMonitor for NvmlBackend GPUs (IDs are NVML UUIDs)."""

    def __init__(
        self,
        nvml_module: Any = None,
        *,
        recovery_quiet_period_s: float = 60.0,
        wait_timeout_ms: int = 500,
        idle_wait_ms: int = 5000,
        check_interval_s: float = 1.0,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        root: str = "/",
    ) -> None:
        self._nvml_module = nvml_module
        self._root = root  # the host's / (where /proc and the NVSwitch list are read)
        self._fabric_manager = fabric.FabricManagerWatch(root)
        self._wait_timeout_ms = wait_timeout_ms
        self._idle_wait_ms = idle_wait_ms
        self._covered: set[str] = set()  # GPUs registered for events in the current event set
        self._check_interval_s = check_interval_s
        self._env = env
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._beat = time.monotonic()  # last turn of the monitor loop
        self._started = False
        self._gpus: dict[str, Gpu] = {}
        self._records = HealthRecords(clock, recovery_quiet_period_s, "it answered NVML normally")
        self._xids = LastXids()  # from the Xid events of the GPUs registered for them
        self._policy = XidPolicy()

    # -- HealthMonitor ------------------------------------------------------------------

    def start(self, gpus: Sequence[Gpu], report: Report) -> None:
        if self._started:
            raise RuntimeError("NvmlHealthMonitor.start called twice; create a new monitor instead")
        self._started = True
        self._policy = xid_policy_from_env(os.environ if self._env is None else self._env)
        for warning in self._policy.warnings:
            log.warning("%s", warning)
        self._gpus = {gpu.id: gpu for gpu in gpus}
        self._records.start(self._gpus, report)
        if not self._policy.checks_enabled:
            log.info("NVML health checks disabled by DP_DISABLE_HEALTHCHECKS")
            return
        if not gpus:
            return
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            limit = min(max(self._wait_timeout_ms, self._idle_wait_ms) / 1000 + 2.0, STOP_JOIN_S)
            thread.join(timeout=limit)
            if thread.is_alive():
                log.debug("NVML health thread still in its event wait after %.1f s; it ends with the wait", limit)

    def alive(self) -> bool:
        return loop_alive(self._started, self._stop.is_set(), self._thread, self._beat)

    def last_xid(self, gpu_id: str) -> int | None:
        """The last Xid NVML reported for the GPU (0: none yet); None while it is not registered for them."""
        return self._xids.last(gpu_id)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("NVML health monitor stopped on an unexpected error; GPU health is not watched")

    def _loop(self) -> None:
        nvml: Any = None
        event_set: Any = None
        wait_s = self._wait_timeout_ms / 1000
        next_check = self._clock()
        try:
            while not self._stop.is_set():
                self._beat = time.monotonic()  # alive() compares against this: a hung call stops it
                if nvml is None:
                    nvml = self._init_or_mark_all()
                    if nvml is None:
                        self._stop.wait(self._check_interval_s)
                        continue
                if event_set is None:
                    event_set = self._register_events(nvml)
                if event_set is not None:
                    if not self._wait_once(nvml, event_set):
                        # Rebuild the event set: a broken one would keep every GPU Unhealthy.
                        self._free_event_set(nvml, event_set)
                        event_set = None
                        with self._lock:
                            self._covered = set()
                        self._xids.watch(())
                        self._stop.wait(wait_s)
                else:
                    self._stop.wait(wait_s)
                now = self._clock()
                if now >= next_check:
                    self._check_devices(nvml)
                    next_check = now + self._check_interval_s
        finally:
            if nvml is not None:
                if event_set is not None:
                    self._free_event_set(nvml, event_set)
                nvml_shutdown(nvml)

    def _init_or_mark_all(self) -> Any:
        try:
            nvml = load_nvml(self._nvml_module)
            nvml_init(nvml)
        except DiscoveryError as exc:
            self._observe_all(bad(f"NVML unavailable: {exc}"))
            return None
        return nvml

    def _register_events(self, nvml: Any) -> Any:
        """An event set with every GPU that supports Xid events; None when none does."""
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("cannot create an NVML event set (%s): GPUs are checked by polling every %.0f s",
                        exc, self._check_interval_s)
            return None
        covered: set[str] = set()
        for gpu_id in self._gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu_id.encode())  # bytes: old nvidia-ml-py takes no str
                supported = self._supported_events(nvml, handle)
                mask = supported & WANTED_EVENTS
                if not mask & EVENT_XID_CRITICAL:
                    log.warning("GPU %s does not support Xid events: checked by polling every %.0f s",
                                gpu_id, self._check_interval_s)
                    continue
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                except Exception as exc:
                    if not is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
                        raise
                    # Some GPUs list ECC events yet refuse them; Xid alone still helps.
                    nvml.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, event_set)
                covered.add(gpu_id)
            except Exception as exc:
                self._observe(gpu_id, bad(f"cannot register for NVML events ({exc})"))
        with self._lock:
            self._covered = covered
        self._xids.watch(covered)
        if not covered:
            self._free_event_set(nvml, event_set)
            return None
        return event_set

    @staticmethod
    def _supported_events(nvml: Any, handle: Any) -> int:
        try:
            return int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
        except Exception as exc:
            if is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
                return 0
            raise

    @staticmethod
    def _free_event_set(nvml: Any, event_set: Any) -> None:
        try:
            nvml.nvmlEventSetFree(event_set)
        except Exception as exc:
            log.debug("nvmlEventSetFree failed: %s", exc)

    def _idle(self) -> bool:
        """Every GPU healthy and sending events: nothing needs polling, so waits can be long."""
        with self._lock:
            covered = self._covered == set(self._gpus)
        return covered and self._records.all_healthy()

    def _wait_once(self, nvml: Any, event_set: Any) -> bool:
        """Wait for one event and act on it; False when the wait itself failed."""
        timeout_ms = self._idle_wait_ms if self._idle() else self._wait_timeout_ms
        try:
            data = nvml.nvmlEventSetWait(event_set, timeout_ms)
        except Exception as exc:
            if is_nvml_error(nvml, exc, "NVML_ERROR_TIMEOUT"):
                return True
            # Which GPU failed is unknown: mark all, as the official plugin does; they recover.
            self._observe_all(bad(f"NVML event wait failed ({exc})"))
            return False
        event_type = int(data.eventType)
        xid_gpu = self._event_gpu(nvml, data) if event_type & EVENT_XID_CRITICAL else None
        if xid_gpu is not None:
            self._xids.seen(xid_gpu, int(data.eventData))
        observation = classify_event(self._policy, event_type, int(data.eventData))
        if observation is None:
            if event_type & EVENT_XID_CRITICAL:
                log.info("ignoring Xid %d (application error, or DP_DISABLE_HEALTHCHECKS)", data.eventData)
            elif event_type & EVENT_SINGLE_BIT_ECC:
                log.info("single-bit ECC error corrected by the GPU")
            return True
        gpu_id = xid_gpu if event_type & EVENT_XID_CRITICAL else self._event_gpu(nvml, data)
        if gpu_id is None:
            self._observe_all(bad(f"{observation.reason} (on a GPU NVML could not name)"))
        else:
            self._observe(gpu_id, observation)
        return True

    def _event_gpu(self, nvml: Any, data: Any) -> str | None:
        try:
            uuid = text(nvml.nvmlDeviceGetUUID(data.device))
        except Exception as exc:
            log.warning("cannot read the UUID of the GPU an event came from: %s", exc)
            return None
        return uuid if uuid in self._gpus else None

    def _check_devices(self, nvml: Any) -> None:
        # an NVSwitch board's GPUs also need their fabric (a listdir; every other board stops here)
        on_fabric = bool(fabric.nvswitches(self._root))
        manager_running = self._fabric_manager.running() if on_fabric else True
        for gpu_id in self._gpus:
            healthy = self._records.healthy(gpu_id)
            # Healthy GPUs are polled only while non-Xid checks are on; recovery always is.
            if healthy and not self._policy.other_checks_enabled:
                continue
            self._observe(gpu_id, self._query(nvml, gpu_id, on_fabric, manager_running))

    @staticmethod
    def _query(nvml: Any, gpu_id: str, on_fabric: bool = False, manager_running: bool = True) -> Observation:
        """Handle fetch plus one cheap query: does the GPU answer NVML normally? On an NVSwitch board: is its
        fabric up?"""
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_id.encode())  # bytes: old nvidia-ml-py takes no str
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                if not is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
                    raise  # NOT_SUPPORTED: it answered; it just lacks that query
            if on_fabric:
                return fabric.classify(manager_running, fabric.fabric_state(nvml, handle))
        except Exception as exc:
            return bad(f"GPU does not answer NVML ({exc})")
        return GOOD

    # -- state --------------------------------------------------------------------------

    def _observe_all(self, observation: Observation) -> None:
        for gpu_id in self._gpus:
            self._observe(gpu_id, observation)

    def _observe(self, gpu_id: str, observation: Observation) -> None:
        self._records.observe(gpu_id, observation)
