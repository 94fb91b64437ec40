"""The decisions, as pure functions of observed facts: no I/O, no clock, no subprocess."""

from __future__ import annotations

from typing import Any

from gpu_k8s_update.model import (
    Decision,
    GateOutcome,
    GatePolicy,
    HealthFacts,
    NodeStatus,
    Outcome,
    Phase,
    Step,
    UpdateFacts,
    Verdict,
)

GPU_RESOURCE = "nvidia.com/gpu"


def version_matches(artifact_name: str, version: str) -> bool:
    """The image's artifact name is the release version, or ends with '-<version>'
    (e.g. 'gpu-k8s-image-1.4.0' for version 1.4.0)."""
    return artifact_name == version or artifact_name.endswith("-" + version)


# Extra reboots the upgrade asks for while the old slot keeps coming up with the capsule still
# staged (the firmware applies it on a reset, so normally Linux never sees that state).
MAX_SWITCH_REBOOTS = 2
_GATE_PASSED = (GateOutcome.COMMITTING.value, GateOutcome.COMMITTED.value)


def plan_upgrade(facts: UpdateFacts, max_attempts: int) -> Decision:
    """What the upgrade command does next. Re-running it in any state is safe: every
    state maps to one step, and the steps that act write the marker first."""
    marker = facts.marker
    ours = marker is not None and marker.version == facts.target
    installed = ours and marker is not None and marker.phase is Phase.INSTALLED
    on_target = version_matches(facts.booted_version, facts.target)
    if on_target and not facts.pending:
        if installed and facts.gate_outcome not in _GATE_PASSED:
            return _decision(
                Step.UNGATED,
                f"running {facts.booted_version}, committed, but the health gate never passed it (its verdict: "
                f"{facts.gate_outcome or 'none'}): something committed the new slot before it was judged (a hand-run "
                "'mender-update commit', a service that marks the booted slot good); the node keeps an unproven "
                "update. Check it, then run 'gpu-k8s-update forget'",
            )
        return _decision(Step.DONE, f"running {facts.booted_version}, committed")
    if on_target:
        return _decision(
            Step.WAIT_FOR_GATE, f"running {facts.booted_version}, not committed yet: the health gate decides"
        )
    rebooted_since = marker is not None and marker.boot_id != facts.boot_id
    if installed and marker is not None and rebooted_since and facts.switch_staged:
        if marker.switch_reboots >= MAX_SWITCH_REBOOTS:
            return _decision(
                Step.ROLLED_BACK,
                f"{facts.target} is installed, but after {marker.switch_reboots + 1} reboots this node still runs "
                f"{facts.booted_version} with the switch staged: the boot firmware did not apply the update capsule",
            )
        return _decision(
            Step.REBOOT,
            f"{facts.target} is installed and staged, but this boot still runs {facts.booted_version}: the boot "
            "firmware has not applied the capsule that switches slots yet; rebooting again",
            count_reboot=True,
        )
    if installed and rebooted_since:
        return _decision(
            Step.ROLLED_BACK,
            f"{facts.target} was installed and booted, but this node is back on {facts.booted_version}: "
            "the new slot failed its health gate or did not boot",
        )
    if installed and facts.pending:
        return _decision(Step.REBOOT, f"{facts.target} is installed in the other slot; the reboot did not happen yet")
    if facts.pending and not ours:
        owner = f"an update to {marker.version}" if marker is not None else "an update installed outside gpu-k8s-update"
        return _decision(
            Step.BUSY,
            f"{owner} is pending (installed, not committed); let its gate finish, or run "
            "'mender-update rollback' to drop it",
        )
    if ours and marker is not None and marker.phase is Phase.INSTALLING:
        if marker.attempts >= max_attempts:
            return _decision(
                Step.GIVE_UP,
                f"installing {facts.target} was interrupted {marker.attempts} times; "
                "check the artifact URL and the node's disk, then run 'gpu-k8s-update forget'",
            )
        return _decision(
            Step.INSTALL,
            f"a previous install of {facts.target} was interrupted (attempt {marker.attempts}); installing again",
            clean_first=True,
        )
    return _decision(Step.INSTALL, f"running {facts.booted_version}, target {facts.target}", clean_first=facts.pending)


def _decision(step: Step, reason: str, clean_first: bool = False, count_reboot: bool = False) -> Decision:
    return Decision(step, reason, clean_first, count_reboot)


def judge_health(facts: HealthFacts, policy: GatePolicy, elapsed_s: float) -> Verdict:
    """Pass, wait or fail the pending update from one round of probes.

    Local checks (docker, kubelet, plugin registration) are always required. The API
    server's view (node Ready, GPUs allocatable) is required while it answers; when it has
    not answered for `unreachable_grace_s`, the local checks alone pass the gate, so a node
    updated off-network or while its server is down keeps a good image. Not on a server
    (policy.api_required): there the API server is part of what the update must bring back."""
    problems: list[str] = []
    if facts.docker_ok is False:
        problems.append(f"docker: {facts.docker_detail}")
    if not facts.kubelet_ok:
        problems.append(f"kubelet: {facts.kubelet_detail}")
    if policy.gpu_expected:
        if facts.plugin_healthz_ok is False:
            problems.append(f"device plugin /healthz: {facts.plugin_detail}")
        elif facts.plugin_healthz_ok is None and not facts.plugin_registered:
            problems.append(f"device plugin: {facts.plugin_detail}")
    if facts.smoke_ok is False:
        problems.append(f"GPU smoke pod: {facts.smoke_detail}")
    unreachable_pass = False
    if facts.node is None and facts.api_answered:
        problems.append(f"API server: {facts.node_detail}")
    elif facts.node is None and policy.api_required:
        problems.append(f"this server's API server does not answer ({facts.node_detail}): a server passes only once "
                        "its own API server is back and shows the node")
    elif facts.node is None:
        if elapsed_s >= policy.unreachable_grace_s:
            unreachable_pass = True
        else:
            problems.append(
                f"API server unreachable ({facts.node_detail}); local checks alone pass after "
                f"{policy.unreachable_grace_s:.0f}s"
            )
    else:
        problems.extend(node_problems(facts.node, policy.gpu_expected))
    if not problems:
        checked = _checked_summary(facts, policy)
        if unreachable_pass:
            reason = (
                f"API server unreachable for {elapsed_s:.0f}s ({facts.node_detail}); "
                f"local checks pass: {checked}"
            )
        else:
            reason = f"healthy: {checked}"
        return Verdict(Outcome.PASS, reason)
    if elapsed_s >= policy.timeout_s:
        return Verdict(Outcome.FAIL, f"not healthy after {elapsed_s:.0f}s: " + "; ".join(problems), tuple(problems))
    return Verdict(Outcome.WAIT, "; ".join(problems), tuple(problems))


def node_problems(node: NodeStatus, gpu_expected: bool) -> list[str]:
    problems = []
    if not node.ready:
        problems.append(f"node not Ready ({node.ready_reason})")
    if gpu_expected and node.gpus_allocatable < 1:
        problems.append(f"node has no allocatable {GPU_RESOURCE}")
    return problems


def _checked_summary(facts: HealthFacts, policy: GatePolicy) -> str:
    parts = []
    if facts.docker_ok:
        parts.append("docker up")
    parts.append("kubelet healthy")
    if facts.node is not None:
        parts.append("node Ready")
    if policy.gpu_expected:
        if facts.node is not None:
            parts.append(f"{facts.node.gpus_allocatable} {GPU_RESOURCE} allocatable")
        parts.append("device plugin registered")
    if facts.smoke_ok:
        parts.append("GPU smoke pod ran")
    return ", ".join(parts)


def gpu_expected(setting: str, gpus_before: int | None) -> tuple[bool, str]:
    """Whether the gate requires a GPU, and why. 'auto' trusts what the node advertised
    before the update: a GPU node must come back as one."""
    if setting == "yes":
        return True, "GPU required by configuration"
    if setting == "no":
        return False, "GPU not required by configuration"
    if gpus_before is None:
        return False, "GPU not required: unknown whether this node had GPUs before the update (set GPU=yes to require)"
    if gpus_before > 0:
        return True, f"GPU required: the node had {gpus_before} {GPU_RESOURCE} allocatable before the update"
    return False, f"GPU not required: the node had no {GPU_RESOURCE} before the update"


def parse_node(node: dict[str, Any]) -> NodeStatus:
    """Ready condition and allocatable GPUs from a Node object (kubectl get node -o json)."""
    status = node.get("status") or {}
    ready, reason = False, "no Ready condition"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            reason = condition.get("reason") or condition.get("message") or str(condition.get("status"))
    raw = (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")
    try:
        gpus = int(str(raw))
    except ValueError:
        gpus = 0
    return NodeStatus(ready=ready, ready_reason=reason, gpus_allocatable=gpus)


def checkpoint_has_resource(checkpoint: dict[str, Any], resource: str = GPU_RESOURCE) -> bool:
    """The kubelet's device-manager checkpoint lists the resources registered plugins reported."""
    registered = (checkpoint.get("Data") or {}).get("RegisteredDevices") or {}
    return bool(registered.get(resource))

