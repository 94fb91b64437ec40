"""`gpu-k8s-update gate`: after an update boots, commit it once the node is healthy, or reboot
into the old slot. Runs from gpu-k8s-update-gate.service only while our marker exists."""

from __future__ import annotations

import logging
from dataclasses import replace

from gpu_k8s_update import decide
from gpu_k8s_update.model import GatePolicy, Outcome, Phase
from gpu_k8s_update.node import Node
from gpu_k8s_update.system import MENDER_NO_UPDATE_IN_PROGRESS, SystemStateError, missing_ab_updater

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1


def run_gate(node: Node) -> int:
    settings, store = node.settings, node.store
    no_updater = missing_ab_updater(settings.mender_command, settings.artifact_info)
    if no_updater:
        log.error("gate: %s", no_updater)
        return EXIT_ERROR
    try:
        pending = node.bootenv.upgrade_pending()
        booted = node.host.booted_version()
        boot_id = node.host.boot_id()
    except SystemStateError as error:
        log.error("gate: %s", error)
        return EXIT_ERROR
    if not pending:
        log.info("gate: no update pending (upgrade_available=0) on %s: nothing to decide", booted)
        return EXIT_OK
    marker = store.load_marker()
    if marker is not None and marker.phase is Phase.INSTALLED and marker.boot_id == boot_id:
        log.info("gate: %s was installed in this boot; the gate decides after the reboot into it", marker.version)
        return EXIT_OK
    if marker is not None and not decide.version_matches(booted, marker.version):
        log.warning(
            "gate: update pending but this slot runs %s, not %s: not committing; the upgrade command reports it",
            booted, marker.version,
        )
        return EXIT_OK
    expected, why = decide.gpu_expected(settings.gpu, marker.gpus_before if marker else None)
    policy = GatePolicy(settings.gate_timeout_s, expected, settings.unreachable_grace_s)
    log.info("gate: judging %s within %.0fs as node %s (%s); %s", booted, policy.timeout_s, node.node_name,
             node.node_name_source, why)
    store.record("gate-start", version=booted, gpu_expected=expected, why=why, node=node.node_name,
                 node_name_from=node.node_name_source)
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


def _wants_smoke_pod(node: Node, policy: GatePolicy, api_reachable: bool) -> bool:
    return bool(node.settings.smoke_image) and policy.gpu_expected and api_reachable


def _commit(node: Node, version: str, reason: str) -> int:
    log.info("gate: committing %s: %s", version, reason)
    result = node.mender.commit()
    if result.returncode == MENDER_NO_UPDATE_IN_PROGRESS:
        log.warning("gate: mender-update commit found no update in progress; leaving things as they are")
        node.store.record("gate-nothing-to-commit", version=version)
        return EXIT_OK
    if result.returncode != 0:
        return roll_back(node, version, f"healthy, but mender-update commit failed: {result.last_line}")
    node.store.save_gate_result({"version": version, "outcome": "committed", "reason": reason})
    node.store.record("gate-committed", version=version, reason=reason)
    node.store.clear_marker()
    log.info("gate: %s committed", version)
    return EXIT_OK


def roll_back(node: Node, version: str, reason: str) -> int:
    """Record why, point the bootloader back at the old slot and reboot. The boot counter
    (bootlimit=1) and the watchdog do the same if anything here fails or hangs."""
    log.error("gate: rolling back %s: %s", version, reason)
    node.store.save_gate_result({"version": version, "outcome": "rolled-back", "reason": reason})
    node.store.record("gate-rollback", version=version, reason=reason)
    result = node.mender.rollback()
    if result.returncode != 0:
        log.warning(
            "gate: mender-update rollback exit %d (%s); rebooting anyway, the boot counter returns to the old slot",
            result.returncode, result.last_line,
        )
    return reboot_and_wait(node, f"roll back {version}")


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
