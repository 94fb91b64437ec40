"""`gpu-k8s-update gate`: after an update boots, commit it once the node is healthy, or reboot
into the old slot. Runs from gpu-k8s-update-gate.service only while our marker exists."""

from __future__ import annotations

import logging
from dataclasses import replace

from gpu_k8s_update import data_check, decide, publish
from gpu_k8s_update.ab.mender import MENDER_NO_UPDATE_IN_PROGRESS
from gpu_k8s_update.exits import EXIT_ERROR, EXIT_NO_UPDATER, EXIT_OK
from gpu_k8s_update.model import BootState, GateOutcome, GatePolicy, Marker, Outcome, Phase
from gpu_k8s_update.node import Node
from gpu_k8s_update.system import SystemStateError

log = logging.getLogger(__name__)



def run_gate(node: Node) -> int:
    settings, store = node.settings, node.store
    no_updater = node.ab.check()
    if no_updater:
        log.error("gate: %s", no_updater)
        return EXIT_NO_UPDATER
    try:
        state = node.ab.pending()
        booted = node.ab.booted_version()
        boot_id = node.host.boot_id()
    except SystemStateError as error:
        log.error("gate: %s", error)
        return EXIT_ERROR
    marker = store.load_marker()
    if not state.pending:
        if _committed_without_us(node, marker, booted):
            node.publish_state(publish.FAILED, booted, (store.load_gate_result() or {}).get("reason", ""))
            return EXIT_OK
        log.info("gate: no update pending on %s (%s): nothing to decide", booted, node.ab.name)
        _report_boot(node, marker, booted, boot_id)
        return EXIT_OK
    if marker is not None and marker.phase is Phase.INSTALLED and marker.boot_id == boot_id:
        log.info("gate: %s was installed in this boot; the gate decides after the reboot into it", marker.version)
        return EXIT_OK
    if marker is not None and not decide.version_matches(booted, marker.version):
        if state.switch_staged:
            # Not the new slot yet: the firmware applies the capsule on a reset. Judging (or
            # rolling back) here would throw away an update that has not been tried.
            log.info("gate: %s is staged but this boot still runs %s: the boot firmware switches slots on the next "
                     "reset (the upgrade command reboots for it); nothing to judge in this boot",
                     marker.version, booted)
        else:
            log.warning("gate: update pending but this slot runs %s, not %s: not committing; the upgrade command "
                        "reports it", booted, marker.version)
        return EXIT_OK
    unfit = _unfit_to_commit(state)
    if unfit:
        return roll_back(node, booted, unfit)
    expected, why = decide.gpu_expected(settings.gpu, marker.gpus_before if marker else None)
    server = node.is_server
    policy = GatePolicy(settings.gate_timeout_s, expected, settings.unreachable_grace_s, api_required=server)
    log.info("gate: judging %s within %.0fs as node %s (%s); %s; A/B backend %s; %s", booted, policy.timeout_s,
             node.node_name, node.node_name_source, why, node.ab.name,
             "a k3s server: its own API server must answer" if server else "an agent")
    store.record("gate-start", version=booted, gpu_expected=expected, why=why, node=node.node_name,
                 node_name_from=node.node_name_source, backend=node.ab.name, server=server)
    target = marker.version if marker else booted
    node.publish_state(publish.PENDING, target, f"booted {booted}; the health gate is judging it (up to "
                       f"{policy.timeout_s:.0f}s)")
    boot_time = node.host.boot_time()
    started = node.host.monotonic()
    last_reason = ""
    probes = unreachable = 0
    while True:
        elapsed = node.host.monotonic() - started
        facts = node.probe_health(boot_time)
        probes += 1
        unreachable += facts.node is None and not facts.api_answered
        verdict = decide.judge_health(facts, policy, elapsed)
        if verdict.outcome is Outcome.PASS and facts.node is None:
            # Say how often the cluster could not be asked, for whoever reads the verdict.
            verdict = replace(verdict, reason=f"{verdict.reason} (API server unreachable in {unreachable} of "
                              f"{probes} probes)")
        if verdict.outcome is Outcome.PASS and _wants_smoke_pod(node, policy, facts.node is not None):
            # Only once everything else is healthy: it is the slowest check and needs the API.
            ok, detail = node.run_smoke_pod()
            log.info("gate: GPU smoke pod %s%s", "ran" if ok else "failed: ", detail)
            verdict = decide.judge_health(replace(facts, smoke_ok=ok, smoke_detail=detail), policy, elapsed)
        if verdict.outcome is Outcome.PASS:
            return _commit(node, booted, verdict.reason)
        if verdict.outcome is Outcome.FAIL:
            return roll_back(node, booted, verdict.reason)
        if verdict.reason != last_reason:
            log.info("gate: waiting (%.0fs): %s", elapsed, verdict.reason)
            last_reason = verdict.reason
        node.host.sleep(settings.poll_interval_s)


def _unfit_to_commit(state: BootState) -> str:
    """A new slot that must not be committed whatever its health: its boot chain and root
    filesystem disagree, or something marked it good before the gate (then a hang would no
    longer fall back, so the image has lost its safety net)."""
    if state.slot_problem:
        return f"the new slot did not boot as a whole: {state.slot_problem}"
    if state.committed_early:
        return (f"the new slot was marked good before the health gate judged it: {state.committed_early}; an image "
                "that does this cannot fall back from a hung update")
    return ""


def _committed_without_us(node: Node, marker: Marker | None, booted: str) -> bool:
    """Our update runs, committed, with no pass of ours: record it (the upgrade job then fails)."""
    if marker is None or marker.phase is not Phase.INSTALLED or not decide.version_matches(booted, marker.version):
        return False
    last = node.store.load_gate_result() or {}
    if last.get("version") == booted and last.get("outcome") in (GateOutcome.COMMITTING.value,
                                                                 GateOutcome.COMMITTED.value):
        return False
    reason = (f"{booted} is committed, but not by this gate: something committed it before it was judged "
              "(a hand-run 'mender-update commit', a service that marks the booted slot good)")
    log.error("gate: %s", reason)
    node.store.save_gate_result({"version": booted, "outcome": GateOutcome.COMMITTED_ELSEWHERE.value,
                                 "reason": reason})
    node.store.record("gate-committed-elsewhere", version=booted, reason=reason)
    return True


def _wants_smoke_pod(node: Node, policy: GatePolicy, api_reachable: bool) -> bool:
    return bool(node.settings.smoke_image) and policy.gpu_expected and api_reachable


def _commit(node: Node, version: str, reason: str) -> int:
    try:
        unfit = _unfit_to_commit(node.ab.pending())  # again: a boot-time unit may have run since the start
    except SystemStateError as error:
        unfit = f"the A/B state cannot be read before the commit: {error}"
    if unfit:
        return roll_back(node, version, f"healthy, but {unfit}")
    log.info("gate: committing %s: %s", version, reason)
    # Written first: an upgrade job that looks between the commit and the verdict must see a pass.
    node.store.save_gate_result({"version": version, "outcome": GateOutcome.COMMITTING.value, "reason": reason})
    result = node.ab.commit()
    if result.returncode == MENDER_NO_UPDATE_IN_PROGRESS:
        log.warning("gate: mender-update commit found no update in progress; leaving things as they are")
        node.store.save_gate_result({"version": version, "outcome": GateOutcome.COMMITTED_ELSEWHERE.value,
                                     "reason": "mender-update found no update in progress at commit time"})
        node.store.record("gate-nothing-to-commit", version=version)
        return EXIT_OK
    if result.returncode != 0:
        return roll_back(node, version, f"healthy, but mender-update commit failed: {result.last_line}")
    node.store.save_gate_result({"version": version, "outcome": GateOutcome.COMMITTED.value, "reason": reason})
    # The data partition's verdicts so far belong to the time before this update (data_check.py).
    node.store.record(data_check.COMMIT_EVENT, version=version, reason=reason,
                      **{data_check.COUNT_FIELD: node.data_events_count()})
    target = _target_of(node, version)
    node.store.clear_marker()
    log.info("gate: %s committed", version)
    node.publish_state(publish.COMMITTED, target, reason)
    return EXIT_OK


def roll_back(node: Node, version: str, reason: str) -> int:
    """Record why, point the boot back at the old slot and reboot. The boot counter (U-Boot,
    GRUB: bootlimit=1; Tegra: UEFI's rootfs retry count) and the watchdog do the same if
    anything here fails or hangs."""
    log.error("gate: rolling back %s: %s", version, reason)
    node.store.save_gate_result({"version": version, "outcome": GateOutcome.ROLLED_BACK.value, "reason": reason})
    node.store.record("gate-rollback", version=version, reason=reason)
    node.publish_state(publish.ROLLED_BACK, _target_of(node, version), f"the gate said: {reason}; rebooting into "
                       "the old slot")
    result = node.ab.rollback()
    if result.returncode != 0:
        log.warning(
            "gate: mender-update rollback exit %d (%s); rebooting anyway, the boot counter returns to the old slot",
            result.returncode, result.last_line,
        )
    return reboot_and_wait(node, f"roll back {version}")


def _target_of(node: Node, booted: str) -> str:
    """The release version the rollout asked for (the marker's), else the booted artifact name."""
    marker = node.store.load_marker()
    return marker.version if marker is not None and decide.version_matches(booted, marker.version) else booted


def _report_boot(node: Node, marker: Marker | None, booted: str, boot_id: str) -> None:
    """A boot with nothing to judge still tells the cluster where the node stands: after a
    rollback the old slot says so at once, not only when a rollout job runs again."""
    if marker is None or marker.phase is not Phase.INSTALLED or marker.boot_id == boot_id:
        return
    if decide.version_matches(booted, marker.version):
        return
    last = node.store.load_gate_result() or {}
    if decide.version_matches(str(last.get("version", "")), marker.version):
        why = f"the gate said: {last.get('reason', '?')}"
    else:
        why = "no gate verdict was recorded: the new slot most likely never came up"
    node.publish_state(publish.ROLLED_BACK, marker.version, f"back on {booted}; {why}")


def reboot_and_wait(node: Node, why: str) -> int:
    log.warning("rebooting to %s", why)
    result = node.host.reboot()
    if result.returncode != 0:
        log.error("reboot command %s failed (exit %d): %s",
                  " ".join(node.settings.reboot_command), result.returncode, result.last_line)
        return EXIT_ERROR
    # The reboot kills us; still being here after reboot_wait_s is an error worth reporting.
    node.host.sleep(node.settings.reboot_wait_s)
    log.error("asked for a reboot %.0fs ago and still running", node.settings.reboot_wait_s)
    return EXIT_ERROR
