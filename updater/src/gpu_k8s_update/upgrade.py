"""`gpu-k8s-update upgrade`: what the rollout job runs on each node. Idempotent: every run
looks at the node, takes one step (see decide.plan_upgrade) and may be killed at any point,
its own reboot included; the next run carries on from the marker."""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gpu_k8s_update import decide, publish
from gpu_k8s_update.ab.mender import MENDER_NO_UPDATE_IN_PROGRESS, MENDER_REBOOT_REQUIRED
from gpu_k8s_update.exits import (
    EXIT_BUSY,
    EXIT_ERROR,
    EXIT_GATE_TIMEOUT,
    EXIT_GAVE_UP,
    EXIT_NO_UPDATER,
    EXIT_NOT_FOR_THIS_DEVICE,
    EXIT_OK,
    EXIT_ROLLED_BACK,
    EXIT_UNGATED,
    EXIT_USAGE,
)
from gpu_k8s_update.gate import reboot_and_wait
from gpu_k8s_update.model import Marker, Phase, Step, UpdateFacts
from gpu_k8s_update.node import Node
from gpu_k8s_update.system import SystemStateError

log = logging.getLogger(__name__)

VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


class UsageError(ValueError):
    pass


def check_arguments(version: str, source: str) -> None:
    if not VERSION_PATTERN.match(version):
        raise UsageError(
            f"--version {version!r} is not a release version: use letters, digits, '.', '_', '+', '-' (e.g. 1.4.0)"
        )
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        if not parsed.netloc:
            raise UsageError(f"--artifact-url {source!r} has no host: e.g. https://updates.example/1.4.0/x.mender")
        return
    if parsed.scheme == "" and source.startswith("/"):
        if not Path(source).is_file():
            raise UsageError(f"--artifact-url {source}: no such file (mount the USB stick first?)")
        return
    raise UsageError(
        f"--artifact-url {source!r} must be an http(s) URL or an absolute path to a .mender file"
    )


_DEVICE_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def parse_offers(offers: Sequence[str]) -> dict[str, str]:
    """`--artifact TYPE=URL` values: one artifact per Mender device type."""
    chosen: dict[str, str] = {}
    for offer in offers:
        device_type, sep, source = offer.partition("=")
        if not sep or not _DEVICE_TYPE.match(device_type) or not source:
            raise UsageError(f"--artifact {offer!r} is not DEVICE_TYPE=URL, e.g. "
                             "jetson-nano-devkit=http://updates.lan/1.4.0/gpu-k8s-image-jetson-nano-devkit.mender")
        if device_type in chosen and chosen[device_type] != source:
            raise UsageError(f"--artifact names two artifacts for device type {device_type}: give one")
        chosen[device_type] = source
    return chosen


def choose_artifact(offers: dict[str, str], device_type: str) -> str | None:
    """The artifact for this node's own device type; None when none was offered for it."""
    return offers.get(device_type)


def observe(node: Node, version: str) -> UpdateFacts:
    state = node.ab.pending()
    last_gate = node.store.load_gate_result() or {}
    gate_about_target = decide.version_matches(str(last_gate.get("version", "")), version)
    return UpdateFacts(
        target=version,
        booted_version=node.ab.booted_version(),
        pending=state.pending,
        boot_id=node.host.boot_id(),
        marker=node.store.load_marker(),
        switch_staged=state.switch_staged,
        gate_outcome=str(last_gate.get("outcome")) if gate_about_target else None,
    )


def run_upgrade_for_device(node: Node, version: str, offers: Sequence[str]) -> int:
    """`upgrade --artifact TYPE=URL ...`: one job for several machines (the rollout's server ring
    spans device types); each node installs only the artifact of its own Mender device type and
    refuses, touching nothing, when none was offered for it."""
    try:
        chosen = parse_offers(offers)
    except UsageError as error:
        log.error("%s", error)
        return EXIT_USAGE
    try:
        device_type = node.device_type()
    except SystemStateError as error:
        reason = f"cannot tell which artifact fits this node: {error}"
        log.error("upgrade: %s", reason)
        node.publish_state(publish.FAILED, version, reason)
        return EXIT_NOT_FOR_THIS_DEVICE
    source = choose_artifact(chosen, device_type)
    if source is None:
        reason = (f"no artifact for this node's device type {device_type} among {', '.join(sorted(chosen))}: "
                  "nothing installed (is its update.gpu-k8s.io/device-type label wrong?)")
        log.error("upgrade: %s", reason)
        node.publish_state(publish.FAILED, version, reason)
        return EXIT_NOT_FOR_THIS_DEVICE
    log.info("upgrade: device type %s: artifact %s", device_type, source)
    return run_upgrade(node, version, source)


def run_upgrade(node: Node, version: str, source: str) -> int:
    settings = node.settings
    try:
        check_arguments(version, source)
    except UsageError as error:
        log.error("%s", error)
        return EXIT_USAGE
    no_updater = node.ab.check()
    if no_updater:
        log.error("upgrade: %s", no_updater)
        return EXIT_NO_UPDATER
    started = node.host.monotonic()
    announced = None
    while True:
        try:
            facts = observe(node, version)
        except SystemStateError as error:
            log.error("upgrade: %s", error)
            return EXIT_ERROR
        decision = decide.plan_upgrade(facts, settings.max_install_attempts)
        if decision.step is not announced:
            log.info("upgrade to %s: %s: %s", version, decision.step.value, decision.reason)
            node.store.record("upgrade-" + decision.step.value, version=version, reason=decision.reason)
            announced = decision.step
            _publish_step(node, version, decision.step, decision.reason)
        if decision.step is Step.DONE:
            if facts.marker is not None and facts.marker.version == version:
                node.store.clear_marker()
            return EXIT_OK
        if decision.step is Step.WAIT_FOR_GATE:
            if node.host.monotonic() - started >= settings.wait_for_gate_s:
                log.error("upgrade: the health gate has not decided within %.0fs; see "
                          "'journalctl -u gpu-k8s-update-gate' on the node", settings.wait_for_gate_s)
                return EXIT_GATE_TIMEOUT
            node.host.sleep(settings.poll_interval_s)
            continue
        if decision.step is Step.ROLLED_BACK:
            return _report_rollback(node, version, decision.reason)
        if decision.step is Step.REBOOT:
            if decision.count_reboot and facts.marker is not None:
                node.store.save_marker(replace(facts.marker, switch_reboots=facts.marker.switch_reboots + 1))
            return reboot_and_wait(node, f"boot {version}")
        if decision.step is Step.UNGATED:
            log.error("upgrade: %s", decision.reason)
            return EXIT_UNGATED
        if decision.step is Step.BUSY:
            return EXIT_BUSY
        if decision.step is Step.GIVE_UP:
            return EXIT_GAVE_UP
        return _install(node, facts, source, clean_first=decision.clean_first)


# What each step means for the published update state (ROLLED_BACK publishes its full reason itself).
_STEP_STATES = {
    Step.DONE: publish.COMMITTED, Step.WAIT_FOR_GATE: publish.PENDING, Step.REBOOT: publish.PENDING,
    Step.INSTALL: publish.PENDING, Step.BUSY: publish.FAILED, Step.GIVE_UP: publish.FAILED,
    Step.UNGATED: publish.FAILED,
}


def _publish_step(node: Node, version: str, step: Step, reason: str) -> None:
    state = _STEP_STATES.get(step)
    if state is not None:
        node.publish_state(state, version, reason)


def _report_rollback(node: Node, version: str, reason: str) -> int:
    gate = node.store.load_gate_result() or {}
    if gate.get("version") and decide.version_matches(str(gate["version"]), version):
        reason += f"; the gate said: {gate.get('reason', '?')} ({gate.get('time', '?')})"
    else:
        reason += ("; no gate verdict was recorded: the new slot most likely never came up (the watchdog and the "
                   "boot counter returned to the old slot, or the boot firmware did not switch to it)")
    try:
        split = node.ab.pending().slot_problem
    except SystemStateError as error:
        split = str(error)
    if split:
        reason += f"; and this boot is not whole: {split}"
    # Mender still holds the half-finished standalone update; clear it so a later install can
    # start. On the old slot this switches nothing: the rootfs-image module switches only while
    # upgrade_available=1, the Tegra module only when the running slot is not the one it left
    # (it removes a capsule still staged and disarms OsIndications).
    cleanup = node.ab.rollback()
    if cleanup.returncode not in (0, MENDER_NO_UPDATE_IN_PROGRESS):
        log.warning("upgrade: mender-update rollback (cleanup) exit %d: %s", cleanup.returncode, cleanup.last_line)
    log.error("upgrade: %s. The rollout stops here; to try this version again on this node run "
              "'gpu-k8s-update forget' on it", reason)
    node.publish_state(publish.ROLLED_BACK, version, reason)
    return EXIT_ROLLED_BACK


def _install(node: Node, facts: UpdateFacts, source: str, clean_first: bool) -> int:
    if clean_first:
        cleanup = node.ab.rollback()
        log.info("upgrade: cleared Mender's unfinished update first (mender-update rollback exit %d)",
                 cleanup.returncode)
    previous = facts.marker
    attempts = 1
    if previous is not None and previous.version == facts.target and previous.phase is Phase.INSTALLING:
        attempts = previous.attempts + 1
    status, detail, _ = node.node_status()
    gpus_before = status.gpus_allocatable if status is not None else None
    if status is None:
        log.info("upgrade: node status unknown (%s); the gate will not know whether to require a GPU", detail)
    marker = Marker(
        version=facts.target,
        artifact_url=source,
        phase=Phase.INSTALLING,
        boot_id=facts.boot_id,
        from_version=facts.booted_version,
        attempts=attempts,
        gpus_before=gpus_before,
    )
    node.store.save_marker(marker)
    log.info("upgrade: installing %s from %s (attempt %d)", facts.target, source, attempts)
    result = node.ab.install(source)
    if result.returncode not in (0, MENDER_REBOOT_REQUIRED):
        log.error("upgrade: mender-update install failed (exit %d): %s", result.returncode, result.last_line)
        node.store.record("upgrade-install-failed", version=facts.target, returncode=result.returncode,
                          output=result.last_line)
        node.publish_state(publish.FAILED, facts.target, f"mender-update install {source} failed (exit "
                           f"{result.returncode}): {result.last_line}")
        return EXIT_ERROR
    node.store.save_marker(replace(marker, phase=Phase.INSTALLED))
    node.store.record("upgrade-installed", version=facts.target)
    node.publish_state(publish.PENDING, facts.target, "installed in the other slot; rebooting into it")
    return reboot_and_wait(node, f"boot {facts.target}")
