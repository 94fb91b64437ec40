"""The pure decision functions, state by state, with plain values."""

from __future__ import annotations

import pytest
from gpu_k8s_update import decide, probes, settings
from gpu_k8s_update.model import GatePolicy, HealthFacts, Marker, NodeStatus, Outcome, Phase, Step, UpdateFacts

THIS_BOOT, EARLIER_BOOT = "boot-2", "boot-1"


def marker(phase: Phase, version: str = "1.1.0", boot_id: str = EARLIER_BOOT, attempts: int = 1,
           switch_reboots: int = 0) -> Marker:
    return Marker(version, "https://u/x.mender", phase, boot_id, "gpu-k8s-1.0.0", attempts,
                  switch_reboots=switch_reboots)


def facts(booted: str, pending: bool, mark: Marker | None, gate: str | None = None,
          staged: bool = False) -> UpdateFacts:
    return UpdateFacts("1.1.0", booted, pending, THIS_BOOT, mark, switch_staged=staged, gate_outcome=gate)


@pytest.mark.parametrize(
    ("booted", "pending", "mark", "step"),
    [
        ("gpu-k8s-1.1.0", False, None, Step.DONE),
        ("gpu-k8s-1.1.0", True, marker(Phase.INSTALLED), Step.WAIT_FOR_GATE),
        ("gpu-k8s-1.0.0", False, marker(Phase.INSTALLED), Step.ROLLED_BACK),
        ("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED), Step.ROLLED_BACK),
        ("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED, boot_id=THIS_BOOT), Step.REBOOT),
        ("gpu-k8s-1.0.0", False, marker(Phase.INSTALLED, boot_id=THIS_BOOT), Step.INSTALL),
        ("gpu-k8s-1.0.0", False, marker(Phase.INSTALLING), Step.INSTALL),
        ("gpu-k8s-1.0.0", False, marker(Phase.INSTALLING, attempts=3), Step.GIVE_UP),
        ("gpu-k8s-1.0.0", True, None, Step.BUSY),
        ("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED, version="1.2.0", boot_id=THIS_BOOT), Step.BUSY),
        ("gpu-k8s-1.0.0", False, marker(Phase.INSTALLED, version="0.9.0"), Step.INSTALL),
        ("gpu-k8s-1.0.0", False, None, Step.INSTALL),
    ],
)
def test_every_state_maps_to_one_step(booted: str, pending: bool, mark: Marker | None, step: Step) -> None:
    decision = decide.plan_upgrade(facts(booted, pending, mark), max_attempts=3)
    assert decision.step is step, decision.reason
    assert decision.reason


@pytest.mark.parametrize(
    ("gate", "step"),
    [("committed", Step.DONE), ("committing", Step.DONE), (None, Step.UNGATED), ("rolled-back", Step.UNGATED),
     ("committed-elsewhere", Step.UNGATED)],
)
def test_a_committed_update_is_done_only_when_the_gate_passed_it(gate: str | None, step: Step) -> None:
    decision = decide.plan_upgrade(facts("gpu-k8s-1.1.0", False, marker(Phase.INSTALLED), gate=gate), max_attempts=3)
    assert decision.step is step, decision.reason
    without_marker = decide.plan_upgrade(facts("gpu-k8s-1.1.0", False, None), max_attempts=3)
    assert without_marker.step is Step.DONE, "no marker: nothing of ours to vouch for"


def test_the_old_slot_with_the_capsule_still_staged_is_rebooted_not_reported_rolled_back() -> None:
    staged = decide.plan_upgrade(facts("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED), staged=True), max_attempts=3)
    assert staged.step is Step.REBOOT and staged.count_reboot, staged.reason
    assert "capsule" in staged.reason
    this_boot = decide.plan_upgrade(
        facts("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED, boot_id=THIS_BOOT), staged=True), max_attempts=3)
    assert this_boot.step is Step.REBOOT and not this_boot.count_reboot, "installed in this boot: the first reboot"
    spent = decide.plan_upgrade(
        facts("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED, switch_reboots=decide.MAX_SWITCH_REBOOTS), staged=True),
        max_attempts=3)
    assert spent.step is Step.ROLLED_BACK and "did not apply the update capsule" in spent.reason
    not_staged = decide.plan_upgrade(facts("gpu-k8s-1.0.0", True, marker(Phase.INSTALLED)), max_attempts=3)
    assert not_staged.step is Step.ROLLED_BACK, "capsule gone and still the old slot: the new one fell back"


def test_an_interrupted_install_is_cleaned_before_installing_again() -> None:
    decision = decide.plan_upgrade(facts("gpu-k8s-1.0.0", False, marker(Phase.INSTALLING)), max_attempts=3)
    assert decision.clean_first
    fresh = decide.plan_upgrade(facts("gpu-k8s-1.0.0", False, None), max_attempts=3)
    assert not fresh.clean_first


@pytest.mark.parametrize(
    ("artifact", "version", "matches"),
    [("1.1.0", "1.1.0", True), ("gpu-k8s-1.1.0", "1.1.0", True), ("gpu-k8s-1.1.0", "1.0", False),
     ("gpu-k8s-11.1.0", "1.1.0", False), ("gpu-k8s-1.1.0-rc1", "1.1.0", False)],
)
def test_version_matching_is_exact_or_a_dash_suffix(artifact: str, version: str, matches: bool) -> None:
    assert decide.version_matches(artifact, version) is matches


def healthy(**changes: object) -> HealthFacts:
    values: dict[str, object] = dict(
        docker_ok=True, docker_detail="", kubelet_ok=True, kubelet_detail="",
        node=NodeStatus(True, "KubeletReady", 1), node_detail="", plugin_registered=True, plugin_detail="",
    )
    values.update(changes)
    return HealthFacts(**values)  # type: ignore[arg-type]


POLICY = GatePolicy(timeout_s=900, gpu_expected=True, unreachable_grace_s=300)


def test_healthy_gpu_node_passes_at_once() -> None:
    verdict = decide.judge_health(healthy(), POLICY, elapsed_s=5)
    assert verdict.outcome is Outcome.PASS
    assert "1 nvidia.com/gpu allocatable" in verdict.reason


def test_problems_wait_until_the_timeout_then_fail_with_every_reason() -> None:
    sick = healthy(kubelet_ok=False, kubelet_detail="connection refused", node=NodeStatus(False, "NotReady", 0))
    waiting = decide.judge_health(sick, POLICY, elapsed_s=100)
    assert waiting.outcome is Outcome.WAIT and len(waiting.problems) == 3
    failed = decide.judge_health(sick, POLICY, elapsed_s=900)
    assert failed.outcome is Outcome.FAIL
    assert "kubelet: connection refused" in failed.reason and "node not Ready" in failed.reason


def test_unreachable_api_waits_for_the_grace_then_local_checks_suffice() -> None:
    offline = healthy(node=None, node_detail="connection refused")
    assert decide.judge_health(offline, POLICY, elapsed_s=10).outcome is Outcome.WAIT
    verdict = decide.judge_health(offline, POLICY, elapsed_s=300)
    assert verdict.outcome is Outcome.PASS and "unreachable" in verdict.reason


def test_a_server_never_passes_while_its_own_api_server_does_not_answer() -> None:
    """A k3s server's API server comes up with the new slot: a server whose API never answers is a
    failed update (the whole control plane), not a network outage to wait out."""
    server = GatePolicy(timeout_s=900, gpu_expected=True, unreachable_grace_s=300, api_required=True)
    offline = healthy(node=None, node_detail="connection refused")
    waiting = decide.judge_health(offline, server, elapsed_s=600)
    assert waiting.outcome is Outcome.WAIT and "this server's API server does not answer" in waiting.reason
    failed = decide.judge_health(offline, server, elapsed_s=900)
    assert failed.outcome is Outcome.FAIL and "API server does not answer (connection refused)" in failed.reason
    back = decide.judge_health(healthy(), server, elapsed_s=650)
    assert back.outcome is Outcome.PASS and "node Ready" in back.reason and "unreachable" not in back.reason


def test_unreachable_api_never_excuses_a_failed_local_check() -> None:
    offline = healthy(node=None, node_detail="refused", plugin_registered=False, plugin_detail="not registered")
    assert decide.judge_health(offline, POLICY, elapsed_s=899).outcome is Outcome.WAIT
    assert decide.judge_health(offline, POLICY, elapsed_s=900).outcome is Outcome.FAIL


def test_an_api_server_that_answers_with_an_error_is_never_taken_for_an_outage() -> None:
    unknown = healthy(node=None, node_detail='the API server has no node "nano"', api_answered=True)
    assert decide.judge_health(unknown, POLICY, elapsed_s=300).outcome is Outcome.WAIT
    failed = decide.judge_health(unknown, POLICY, elapsed_s=900)
    assert failed.outcome is Outcome.FAIL and "has no node" in failed.reason


@pytest.mark.parametrize(
    ("output", "returncode", "unreachable"),
    [
        ("The connection to the server 127.0.0.1:6444 was refused - did you specify the right host or port?", 1, True),
        ("Unable to connect to the server: dial tcp 10.0.0.1:6443: i/o timeout", 1, True),
        ("Error from server (ServiceUnavailable): the server is currently unable to handle the request", 1, True),
        ("kubectl: no answer within 30s", 124, True),
        ('Error from server (NotFound): nodes "nano" not found', 1, False),
        ('Error from server (Forbidden): nodes "x" is forbidden: User "system:node:y" cannot get', 1, False),
        ("error: You must be logged in to the server (Unauthorized)", 1, False),
    ],
)
def test_kubectl_failures_are_told_apart(output: str, returncode: int, unreachable: bool) -> None:
    assert probes.api_unreachable(output, returncode) is unreachable


def test_plugin_healthz_when_configured_is_authoritative() -> None:
    down = healthy(plugin_registered=True, plugin_healthz_ok=False, plugin_detail="503")
    assert decide.judge_health(down, POLICY, elapsed_s=1).outcome is Outcome.WAIT
    up = healthy(plugin_registered=False, plugin_healthz_ok=True)
    assert decide.judge_health(up, POLICY, elapsed_s=1).outcome is Outcome.PASS


def test_gpu_expectation_follows_what_the_node_had_before() -> None:
    assert decide.gpu_expected("auto", 2)[0] is True
    assert decide.gpu_expected("auto", 0)[0] is False
    assert decide.gpu_expected("auto", None)[0] is False
    assert decide.gpu_expected("yes", 0)[0] is True
    assert decide.gpu_expected("no", 4)[0] is False


def test_node_object_parsing() -> None:
    node = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}],
                       "allocatable": {"nvidia.com/gpu": "2"}}}
    assert decide.parse_node(node) == NodeStatus(False, "KubeletNotReady", 2)
    assert decide.parse_node({}) == NodeStatus(False, "no Ready condition", 0)


def test_settings_from_environment_and_flags() -> None:
    loaded = settings.load(
        {"GPU_K8S_UPDATE_GATE_TIMEOUT_S": "60", "GPU_K8S_UPDATE_REBOOT_COMMAND": "reboot -f",
         "GPU_K8S_UPDATE_DOCKER_SOCKET": "", "GPU_K8S_UPDATE_KUBECONFIGS": "/a:/b"},
        {"gate_timeout_s": 30.0, "gpu": None},
    )
    assert loaded.gate_timeout_s == 30.0, "flags win over the environment"
    assert loaded.reboot_command == ("reboot", "-f")
    assert loaded.docker_socket is None
    assert [str(p) for p in loaded.kubeconfigs] == ["/a", "/b"]


def test_node_name_comes_from_the_upgrade_job_unless_configured() -> None:
    assert settings.load({"SYSTEM_UPGRADE_NODE_NAME": "nano-7"}).node_name == "nano-7"
    configured = {"SYSTEM_UPGRADE_NODE_NAME": "nano-7", "GPU_K8S_UPDATE_NODE_NAME": "edge-7"}
    assert settings.load(configured).node_name == "edge-7"


def test_a_bad_flag_value_is_refused_like_a_bad_variable() -> None:
    with pytest.raises(settings.SettingsError, match="--timeout must be greater than 0"):
        settings.load({}, {"gate_timeout_s": 0.0})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [("GPU_K8S_UPDATE_GATE_TIMEOUT_S", "soon", "must be a number"),
     ("GPU_K8S_UPDATE_POLL_INTERVAL_S", "0", "greater than 0"),
     ("GPU_K8S_UPDATE_GPU", "maybe", "yes, no or auto"),
     ("GPU_K8S_UPDATE_MENDER_COMMAND", " ", "is empty"),
     ("GPU_K8S_UPDATE_AB_BACKEND", "swupdate", "one of mender-grub, mender-uboot, mender-tegra"),
     ("GPU_K8S_UPDATE_ROLE", "master", "server, agent or auto")],
)
def test_bad_settings_name_the_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(settings.SettingsError, match=message) as raised:
        settings.load({variable: value})
    assert variable in str(raised.value)
