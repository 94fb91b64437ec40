"""NVML health: the pure rules (Xid policy, recovery) and the monitor thread against the fake NVML."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fake_nvml import (
    NVML_ERROR_GPU_IS_LOST,
    FakeNvml,
    make_gpus,
    nvmlEventTypeDoubleBitEccError,
    nvmlEventTypeSingleBitEccError,
    nvmlEventTypeXidCriticalError,
)
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.health.nvml import NvmlHealthMonitor, classify_event
from gpu_device_plugin.health.rules import (
    APPLICATION_XIDS,
    GOOD,
    HealthRecord,
    XidPolicy,
    bad,
    next_state,
    xid_policy_from_env,
)
from gpu_device_plugin.model import Gpu, Health
from helpers import Reports

# -- the Xid policy (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "critical", "ignored"),
    [
        ({}, {79, 48, 94, 8, 32}, {13, 31, 43, 45, 68, 109}),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, set(), {79, 48, 13}),
        ({"DP_DISABLE_HEALTHCHECKS": "xids"}, set(), {79, 48, 13}),
        ({"DP_DISABLE_HEALTHCHECKS": "ALL"}, set(), {79}),
        ({"DP_DISABLE_HEALTHCHECKS": "48,79"}, {94, 8}, {48, 79, 13, 31}),
        ({"DP_DISABLE_HEALTHCHECKS": " 48 , ,79 "}, {94}, {48, 79}),
        ({"DP_ENABLE_HEALTHCHECKS": "13"}, {13, 79}, {31, 43}),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, {13, 31, 43, 45, 68, 109, 79}, set()),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, {79}, {48, 13}),
        ({"DP_DISABLE_HEALTHCHECKS": "48", "DP_ENABLE_HEALTHCHECKS": "48"}, {48}, {13}),
        ({"DP_DISABLE_HEALTHCHECKS": "", "DP_ENABLE_HEALTHCHECKS": ""}, {79}, {13}),
    ],
)
def test_xid_policy_follows_the_official_env_semantics(
    env: dict[str, str], critical: set[int], ignored: set[int]
) -> None:
    policy = xid_policy_from_env(env)
    wrongly_ignored = {x for x in critical if not policy.is_critical(x)}
    wrongly_critical = {x for x in ignored if policy.is_critical(x)}
    assert not wrongly_ignored and not wrongly_critical, f"{env}: {wrongly_ignored=} {wrongly_critical=}"


@pytest.mark.parametrize(
    ("env", "checks", "other_checks"),
    [
        ({}, True, True),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, False, False),
        ({"DP_DISABLE_HEALTHCHECKS": "xids"}, False, False),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, True, False),
        ({"DP_DISABLE_HEALTHCHECKS": "48"}, True, True),
    ],
)
def test_disable_all_turns_checking_off_unless_xids_are_force_enabled(
    env: dict[str, str], checks: bool, other_checks: bool
) -> None:
    policy = xid_policy_from_env(env)
    assert (policy.checks_enabled, policy.other_checks_enabled) == (checks, other_checks)


def test_unparseable_xid_tokens_are_ignored_with_a_warning_naming_them() -> None:
    policy = xid_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "48,foo", "DP_ENABLE_HEALTHCHECKS": "x1"})
    assert not policy.is_critical(48)
    assert len(policy.warnings) == 2
    assert "DP_DISABLE_HEALTHCHECKS: 'foo'" in policy.warnings[0]
    assert "DP_ENABLE_HEALTHCHECKS: 'x1'" in policy.warnings[1]


def test_default_application_xids_are_the_official_skip_list() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS


# -- event classification (pure) ----------------------------------------------------------


def test_critical_xid_event_is_a_bad_observation_naming_the_xid() -> None:
    observation = classify_event(XidPolicy(), nvmlEventTypeXidCriticalError, 79)
    assert observation is not None and not observation.ok
    assert "Xid 79" in observation.reason


def test_application_xid_event_is_ignored() -> None:
    assert classify_event(XidPolicy(), nvmlEventTypeXidCriticalError, 13) is None


def test_double_bit_ecc_is_bad_and_single_bit_ecc_is_not() -> None:
    dbe = classify_event(XidPolicy(), nvmlEventTypeDoubleBitEccError, 0)
    assert dbe is not None and "double-bit ECC" in dbe.reason
    assert classify_event(XidPolicy(), nvmlEventTypeSingleBitEccError, 0) is None


def test_double_bit_ecc_is_ignored_when_health_checks_are_disabled() -> None:
    policy = xid_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"})
    assert classify_event(policy, nvmlEventTypeDoubleBitEccError, 0) is None


# -- recovery state machine (pure) --------------------------------------------------------


def test_bad_observation_marks_unhealthy_with_its_reason_and_time() -> None:
    state = next_state(HealthRecord(), bad("Xid 79"), now=100.0, quiet_period_s=60)
    assert state == HealthRecord(healthy=False, reason="Xid 79", last_bad=100.0)


def test_good_observation_within_the_quiet_period_keeps_unhealthy() -> None:
    state = HealthRecord(healthy=False, reason="Xid 79", last_bad=100.0)
    assert next_state(state, GOOD, now=159.9, quiet_period_s=60) == state


def test_good_observation_after_the_quiet_period_recovers() -> None:
    state = HealthRecord(healthy=False, reason="Xid 79", last_bad=100.0)
    assert next_state(state, GOOD, now=160.0, quiet_period_s=60).healthy


def test_new_bad_observation_restarts_the_quiet_period() -> None:
    state = next_state(HealthRecord(), bad("Xid 79"), now=100.0, quiet_period_s=60)
    state = next_state(state, bad("does not answer"), now=150.0, quiet_period_s=60)
    assert not next_state(state, GOOD, now=200.0, quiet_period_s=60).healthy
    assert next_state(state, GOOD, now=210.0, quiet_period_s=60).healthy


def test_healthy_gpu_stays_healthy_on_good_observations() -> None:
    assert next_state(HealthRecord(), GOOD, now=0.0, quiet_period_s=60) == HealthRecord()


# -- the monitor thread -------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds




def wait_for(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def wait_loops(nvml: FakeNvml, loops: int = 3) -> None:
    """Let the monitor run `loops` more event waits (so every step between them ran too)."""
    target = nvml.wait_calls + loops
    wait_for(lambda: nvml.wait_calls >= target, what=f"{loops} more event waits")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def running() -> Iterator[Callable[..., tuple[NvmlHealthMonitor, Reports, list[Gpu]]]]:
    monitors: list[NvmlHealthMonitor] = []

    def start(nvml: FakeNvml, clock: Callable[[], float] = time.monotonic, env: dict[str, str] | None = None,
              **kwargs: float) -> tuple[NvmlHealthMonitor, Reports, list[Gpu]]:
        gpus = NvmlBackend("/nonexistent", nvml).discover()
        options = {"wait_timeout_ms": 20, "idle_wait_ms": 20, "check_interval_s": 5.0, "recovery_quiet_period_s": 60.0,
                   **kwargs}
        monitor = NvmlHealthMonitor(nvml, env=env or {}, clock=clock, **options)
        reports = Reports()
        monitor.start(gpus, reports)
        monitors.append(monitor)
        return monitor, reports, gpus

    yield start
    for monitor in monitors:
        monitor.stop()


def test_critical_xid_marks_that_gpu_unhealthy_without_waiting_for_a_poll(running, clock: FakeClock) -> None:
    nvml = FakeNvml(make_gpus(2))
    # The fake clock stands still: after the first poll no other runs, only the event can tell.
    monitor, reports, gpus = running(nvml, clock=clock, wait_timeout_ms=500)
    nvml.emit_xid(gpus[1].id, 79)
    wait_for(lambda: reports.calls, what="an Unhealthy report")
    ((gpu_id, health),) = reports.calls
    assert (gpu_id, health.healthy) == (gpus[1].id, False)
    assert "Xid 79" in health.reason


def test_application_xids_are_ignored_but_later_critical_ones_are_not(running) -> None:
    nvml = FakeNvml(make_gpus(2))
    _, reports, gpus = running(nvml)
    for xid in sorted(APPLICATION_XIDS):
        nvml.emit_xid(gpus[0].id, xid)
    nvml.emit_xid(gpus[1].id, 48)
    wait_for(lambda: reports.calls, what="the report for Xid 48")
    wait_loops(nvml)
    assert reports.states() == [(gpus[1].id, False)], "an application Xid marked a GPU Unhealthy"


def test_dp_disable_healthchecks_list_ignores_those_xids(running) -> None:
    nvml = FakeNvml(make_gpus(1))
    _, reports, gpus = running(nvml, env={"DP_DISABLE_HEALTHCHECKS": "48"})
    nvml.emit_xid(gpus[0].id, 48)
    nvml.emit_xid(gpus[0].id, 79)
    wait_for(lambda: reports.calls, what="the report for Xid 79")
    assert "Xid 79" in reports.calls[0][1].reason


def test_dp_enable_healthchecks_makes_an_application_xid_count(running) -> None:
    nvml = FakeNvml(make_gpus(1))
    _, reports, gpus = running(nvml, env={"DP_ENABLE_HEALTHCHECKS": "31"})
    nvml.emit_xid(gpus[0].id, 31)
    wait_for(lambda: reports.calls, what="the report for Xid 31")
    assert "Xid 31" in reports.calls[0][1].reason


def test_dp_disable_healthchecks_all_starts_no_nvml_thread(running) -> None:
    nvml = FakeNvml(make_gpus(1))
    monitor, reports, gpus = running(nvml, env={"DP_DISABLE_HEALTHCHECKS": "all"})
    nvml.emit_xid(gpus[0].id, 79)
    time.sleep(0.05)
    assert nvml.event_sets == [] and nvml.wait_calls == 0
    assert reports.calls == []
    assert monitor.alive()


def test_double_bit_ecc_marks_unhealthy_and_single_bit_does_not(running) -> None:
    nvml = FakeNvml(make_gpus(2))
    _, reports, gpus = running(nvml)
    nvml.emit_event(gpus[0].id, nvmlEventTypeSingleBitEccError)
    nvml.emit_event(gpus[1].id, nvmlEventTypeDoubleBitEccError)
    wait_for(lambda: reports.calls, what="the double-bit ECC report")
    wait_loops(nvml)
    assert reports.states() == [(gpus[1].id, False)]


def test_unhealthy_gpu_recovers_after_the_quiet_period_when_it_answers(running, clock: FakeClock) -> None:
    nvml = FakeNvml(make_gpus(1))
    _, reports, gpus = running(nvml, clock=clock)
    nvml.emit_xid(gpus[0].id, 79)
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    clock.advance(30)
    wait_loops(nvml)
    assert reports.states() == [(gpus[0].id, False)], "recovered before the quiet period ended"
    clock.advance(31)
    wait_for(lambda: len(reports.calls) == 2, what="the Healthy report")
    assert reports.calls[1] == (gpus[0].id, Health(True))


def test_new_critical_xid_during_the_quiet_period_delays_recovery(running, clock: FakeClock) -> None:
    nvml = FakeNvml(make_gpus(1))
    _, reports, gpus = running(nvml, clock=clock)
    nvml.emit_xid(gpus[0].id, 79)
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    clock.advance(50)
    nvml.emit_xid(gpus[0].id, 79)
    wait_loops(nvml)
    clock.advance(20)  # 70 s after the first Xid, 20 s after the second
    wait_loops(nvml)
    assert reports.states() == [(gpus[0].id, False)]
    clock.advance(41)
    wait_for(lambda: len(reports.calls) == 2, what="the Healthy report")


def test_gpu_that_does_not_answer_nvml_does_not_recover_until_it_does(running, clock: FakeClock) -> None:
    nvml = FakeNvml(make_gpus(1))
    _, reports, gpus = running(nvml, clock=clock)
    nvml.emit_xid(gpus[0].id, 79)
    nvml.gpus[0].answering = False
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    clock.advance(120)
    wait_loops(nvml)
    assert reports.states() == [(gpus[0].id, False)], "recovered while NVML could not reach the GPU"
    nvml.gpus[0].answering = True
    clock.advance(5)  # answers now, but failed 5 s ago: the quiet period starts over
    wait_loops(nvml)
    assert len(reports.calls) == 1
    clock.advance(60)
    wait_for(lambda: len(reports.calls) == 2, what="the Healthy report")


def test_gpu_without_event_support_is_polled_and_marked_when_it_stops_answering(
    running, clock: FakeClock
) -> None:
    gpus_spec = make_gpus(2)
    gpus_spec[1].supported_events = 0
    nvml = FakeNvml(gpus_spec)
    _, reports, gpus = running(nvml, clock=clock)
    wait_loops(nvml)
    assert set(nvml.event_sets[0].registered) == {gpus[0].id}
    nvml.gpus[1].answering = False
    clock.advance(5)
    wait_for(lambda: reports.calls, what="the poll to find the silent GPU")
    ((gpu_id, health),) = reports.calls
    assert gpu_id == gpus[1].id and "does not answer NVML" in health.reason


def test_gpu_listing_ecc_events_it_refuses_still_gets_xid_events(running) -> None:
    nvml = FakeNvml(make_gpus(1, refuse_ecc_registration=True))
    _, reports, gpus = running(nvml)
    nvml.emit_xid(gpus[0].id, 79)
    wait_for(lambda: reports.calls, what="the Xid report")
    assert nvml.event_sets[0].registered == {gpus[0].id: nvmlEventTypeXidCriticalError}


def test_event_wait_error_marks_every_gpu_and_they_recover(running, clock: FakeClock) -> None:
    nvml = FakeNvml(make_gpus(2))
    _, reports, gpus = running(nvml, clock=clock)
    nvml.emit_wait_error(NVML_ERROR_GPU_IS_LOST)
    wait_for(lambda: len(reports.calls) == 2, what="both GPUs marked")
    assert all(not health.healthy and "event wait failed" in health.reason for _, health in reports.calls)
    clock.advance(61)
    wait_for(lambda: len(reports.calls) == 4, what="both GPUs Healthy again")
    assert sorted(reports.states()[2:]) == sorted((g.id, True) for g in gpus)
    assert len(nvml.event_sets) == 2 and nvml.event_sets[0].freed, "the failed event set was not rebuilt"


def test_event_from_a_gpu_nvml_cannot_name_marks_every_gpu(running) -> None:
    nvml = FakeNvml(make_gpus(2))
    _, reports, gpus = running(nvml)
    nvml.emit_xid(None, 79)
    wait_for(lambda: len(reports.calls) == 2, what="both GPUs marked")
    assert sorted(reports.states()) == sorted((g.id, False) for g in gpus)


def test_nvml_init_failure_marks_every_gpu_with_the_fix(running) -> None:
    nvml = FakeNvml(make_gpus(2))
    gpus = NvmlBackend("/nonexistent", nvml).discover()
    nvml.library_missing = True
    monitor = NvmlHealthMonitor(nvml, env={}, wait_timeout_ms=20)
    reports = Reports()
    monitor.start(gpus, reports)
    try:
        wait_for(lambda: len(reports.calls) == 2, what="both GPUs marked")
    finally:
        monitor.stop()
    assert all("libnvidia-ml.so.1 not found" in health.reason for _, health in reports.calls)


def test_monitor_inits_nvml_once_and_shuts_it_down_and_frees_events_on_stop(
    running, clock: FakeClock
) -> None:
    nvml = FakeNvml(make_gpus(1))
    monitor, _, _ = running(nvml, clock=clock)
    for _ in range(3):
        clock.advance(5)
        wait_loops(nvml)
    assert monitor.alive()
    monitor.stop()
    monitor.stop()  # idempotent
    assert not monitor.alive()
    assert nvml.init_calls == 2, "expected one nvmlInit for discovery and one for the monitor"
    assert nvml.shutdown_calls == nvml.init_calls
    assert nvml.event_sets[0].freed


def test_stop_returns_within_about_one_event_wait(running) -> None:
    nvml = FakeNvml(make_gpus(1))
    monitor, _, _ = running(nvml, wait_timeout_ms=200, idle_wait_ms=200)
    wait_loops(nvml, 1)
    started = time.monotonic()
    monitor.stop()
    assert time.monotonic() - started < 2.0, "stop did not return after the current event wait"


def test_alive_is_false_when_the_thread_died(running) -> None:
    def exploding_report(gpu_id: str, health: Health) -> None:
        raise RuntimeError("report failed")

    nvml = FakeNvml(make_gpus(1))
    gpus = NvmlBackend("/nonexistent", nvml).discover()
    monitor = NvmlHealthMonitor(nvml, env={}, wait_timeout_ms=20)
    monitor.start(gpus, exploding_report)
    try:
        assert monitor.alive()
        nvml.emit_xid(gpus[0].id, 79)
        wait_for(lambda: not monitor.alive(), what="the thread to die")
    finally:
        monitor.stop()


def test_a_driver_call_that_never_returns_makes_the_monitor_report_not_alive(monkeypatch) -> None:
    import gpu_device_plugin.health.base as health_base

    nvml = FakeNvml(make_gpus(1))
    gpus = NvmlBackend("/nonexistent", nvml).discover()
    release = threading.Event()
    real_wait = nvml.nvmlEventSetWait

    def hung_wait(event_set, timeoutms):  # the driver stops answering: the call blocks
        release.wait(5)
        return real_wait(event_set, timeoutms)

    monitor = NvmlHealthMonitor(nvml, env={}, wait_timeout_ms=20)
    monitor.start(gpus, Reports())
    try:
        wait_for(lambda: nvml.wait_calls > 0, what="the monitor waits for events")
        assert monitor.alive()
        monkeypatch.setattr(health_base, "STALL_LIMIT_S", 0.3)
        monkeypatch.setattr(nvml, "nvmlEventSetWait", hung_wait)
        wait_for(lambda: not monitor.alive(), what="a stuck monitor loop noticed")
    finally:
        release.set()
        monitor.stop()


def record_wait_timeouts(nvml: FakeNvml) -> list[int]:
    """The timeout of every nvmlEventSetWait from now on."""
    timeouts: list[int] = []
    real_wait = nvml.nvmlEventSetWait

    def recorded_wait(event_set, timeoutms):
        timeouts.append(timeoutms)
        return real_wait(event_set, timeoutms)

    nvml.nvmlEventSetWait = recorded_wait
    return timeouts


def test_waits_are_long_while_every_gpu_is_healthy_with_events_and_short_while_one_recovers(running) -> None:
    nvml = FakeNvml(make_gpus(2))
    timeouts = record_wait_timeouts(nvml)
    _, reports, gpus = running(nvml, wait_timeout_ms=20, idle_wait_ms=300)
    wait_loops(nvml, 2)
    assert set(timeouts) == {300}, "an idle monitor must not wake every wait_timeout_ms"
    nvml.emit_xid(gpus[0].id, 79)
    wait_for(lambda: reports.calls, what="the Unhealthy report")
    timeouts.clear()
    wait_loops(nvml, 2)
    assert set(timeouts) == {20}, "a recovering GPU is polled at the short interval"


def test_a_gpu_without_events_keeps_the_short_waits(running) -> None:
    gpus_spec = make_gpus(2)
    gpus_spec[1].supported_events = 0
    nvml = FakeNvml(gpus_spec)
    timeouts = record_wait_timeouts(nvml)
    running(nvml, wait_timeout_ms=20, idle_wait_ms=300)
    wait_loops(nvml, 2)
    assert set(timeouts) == {20}
