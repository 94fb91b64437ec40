"""What a node tells the cluster about its update (annotations on its own Node, read by
`./task status`), which artifact a node takes when one job offers several, and a server's gate,
which needs its own API server back: through the real CLI on simulated boards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_partition import E2FSPROGS, data_boot
from fake_board import Board, HealthServer, describe, run_agent
from gpu_k8s_update import data_check, publish

URL = "https://updates.example/1.1.0/gpu-k8s-image-jetson-nano-devkit.mender"
X86_URL = "https://updates.example/1.1.0/gpu-k8s-image-genericx86-64.mender"
NEW = "gpu-k8s-1.1.0"
URL_12 = "https://updates.example/1.2.0/gpu-k8s-image-jetson-nano-devkit.mender"
KILLED = -9


def upgrade(board: Board, kubelet: HealthServer, *source: str, **extra: str):
    return run_agent(board.environment(kubelet.url, extra), "upgrade", "--version", "1.1.0", *source)


def gate(board: Board, kubelet: HealthServer, **extra: str):
    return run_agent(board.environment(kubelet.url, extra), "gate")


def annotations(board: Board) -> dict[str, str]:
    return board.state()["node"]["metadata"].get("annotations") or {}


def published_states(board: Board) -> list[tuple[str, str]]:
    return [(values[publish.STATE], values[publish.REASON]) for values in board.state().get("published", [])]


def test_a_committed_update_is_published_step_by_step(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    assert upgrade(board, kubelet, "--artifact-url", URL).returncode == KILLED
    board.power_cycle()
    result = gate(board, kubelet)
    assert result.returncode == 0, describe(result)
    states = published_states(board)
    assert [state for state, _ in states] == ["pending", "pending", "pending", "committed"], states
    assert "installed in the other slot; rebooting" in states[1][1]
    assert "the health gate is judging it" in states[2][1]
    now = annotations(board)
    assert now[publish.STATE] == "committed" and now[publish.TARGET] == "1.1.0"
    assert now[publish.OS_VERSION] == NEW and now[publish.SLOT] == "part 3"
    assert now[publish.AB_BACKEND] == "mender-uboot" and now[publish.TIME].endswith("Z")
    assert "healthy" in now[publish.REASON]


def test_a_rollback_is_published_with_the_gates_reason_and_again_from_the_old_slot(
        board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    upgrade(board, kubelet, "--artifact-url", URL)
    board.power_cycle()
    kubelet.set_status(500)
    assert gate(board, kubelet).returncode == KILLED
    assert annotations(board)[publish.STATE] == "rolled-back"
    assert "kubelet" in annotations(board)[publish.REASON]
    board.power_cycle()
    kubelet.set_status(200)
    # the old slot's boot: nothing to judge, but the cluster learns where the node is at once
    assert gate(board, kubelet).returncode == 0
    now = annotations(board)
    assert now[publish.STATE] == "rolled-back" and now[publish.TARGET] == "1.1.0"
    assert now[publish.OS_VERSION] == "gpu-k8s-1.0.0" and now[publish.SLOT] == "part 2"
    assert "back on gpu-k8s-1.0.0; the gate said: not healthy" in now[publish.REASON]
    job = upgrade(board, kubelet, "--artifact-url", URL)
    assert job.returncode == 3, describe(job)
    assert annotations(board)[publish.STATE] == "rolled-back"


def test_an_unreachable_api_server_costs_the_node_nothing_but_the_report(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    board.change(api_down=True)
    assert upgrade(board, kubelet, "--artifact-url", URL).returncode == KILLED
    board.power_cycle()
    result = gate(board, kubelet)
    assert result.returncode == 0 and board.state()["committed"] == [NEW], describe(result)
    assert "not published" in result.stderr and "refused" in result.stderr
    assert not board.state().get("published")


def test_a_node_takes_the_artifact_of_its_own_device_type(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    result = upgrade(board, kubelet, "--artifact", f"genericx86-64={X86_URL}", "--artifact",
                     f"jetson-nano-devkit={URL}")
    assert result.returncode == KILLED, describe(result)
    installs = [call for call in board.state()["calls"] if call[:2] == ["mender-update", "install"]]
    assert installs == [["mender-update", "install", URL]]
    assert "device type jetson-nano-devkit" in result.stderr


def test_no_artifact_for_this_device_type_touches_nothing(board: Board, kubelet: HealthServer) -> None:
    result = upgrade(board, kubelet, "--artifact", f"genericx86-64={X86_URL}")
    assert result.returncode == 8, describe(result)
    assert "no artifact for this node's device type jetson-nano-devkit among genericx86-64" in result.stderr
    assert board.mender_calls("install") == 0 and board.marker() is None and board.state()["reboots"] == 0
    assert annotations(board)[publish.STATE] == "failed"


def test_an_unreadable_device_type_touches_nothing(board: Board, kubelet: HealthServer) -> None:
    board.device_type_file.unlink()
    result = upgrade(board, kubelet, "--artifact", f"jetson-nano-devkit={URL}")
    assert result.returncode == 8 and "cannot read Mender's device type" in result.stderr, describe(result)
    assert board.mender_calls("install") == 0


def test_a_malformed_artifact_offer_is_a_usage_error(board: Board, kubelet: HealthServer) -> None:
    result = upgrade(board, kubelet, "--artifact", URL)
    assert result.returncode == 2 and "is not DEVICE_TYPE=URL" in result.stderr, describe(result)
    both = upgrade(board, kubelet, "--artifact", f"jetson-nano-devkit={URL}", "--artifact-url", URL)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def server_gate(board: Board, kubelet: HealthServer):
    return gate(board, kubelet, GPU_K8S_UPDATE_GATE_TIMEOUT_S="1.5", GPU_K8S_UPDATE_UNREACHABLE_GRACE_S="0.3")


def test_a_server_whose_api_server_never_answers_rolls_back(tmp_path: Path, kubelet: HealthServer) -> None:
    server = Board(tmp_path / "server", backend="mender-grub")
    server.make_server()
    server.publish(X86_URL, NEW)
    assert upgrade(server, kubelet, "--artifact-url", X86_URL).returncode == KILLED
    server.power_cycle()
    server.change(api_down=True)
    result = server_gate(server, kubelet)
    assert result.returncode == KILLED, describe(result)
    assert "a k3s server" in result.stderr
    verdict = server.gate_result()
    assert verdict["outcome"] == "rolled-back" and "this server's API server does not answer" in verdict["reason"]
    assert server.state()["committed"] == []


def test_an_agent_in_the_same_outage_keeps_its_update_on_local_checks(tmp_path: Path, kubelet: HealthServer) -> None:
    agent = Board(tmp_path / "agent", backend="mender-grub")
    agent.publish(X86_URL, NEW)
    upgrade(agent, kubelet, "--artifact-url", X86_URL)
    agent.power_cycle()
    agent.change(api_down=True)
    result = server_gate(agent, kubelet)
    assert result.returncode == 0, describe(result)
    assert "unreachable" in agent.gate_result()["reason"] and agent.state()["committed"] == [NEW]


def test_the_published_patch_touches_only_annotations_in_our_own_domain() -> None:
    """A node may change its own annotations (NodeRestriction guards labels and taints): the patch
    carries nothing else, so the kubelet's credential is enough on every node."""
    values = publish.annotations(publish.ROLLED_BACK, "1.4.0", "the gate said:\n  kubelet down", "1.3.0", "B",
                                 "mender-tegra", "recreated 2026-11-29T12:00:00Z", now=0)
    body = json.loads(publish.merge_patch(values))
    assert list(body) == ["metadata"] and list(body["metadata"]) == ["annotations"]
    assert set(body["metadata"]["annotations"]) == set(publish.KEYS)
    assert all(key.startswith("update.gpu-k8s.io/") for key in publish.KEYS)
    assert values[publish.REASON] == "the gate said: kubelet down" and values[publish.TIME] == "1970-01-01T00:00:00Z"
    assert publish.DATA == "update.gpu-k8s.io/data" and values[publish.DATA] == "recreated 2026-11-29T12:00:00Z"
    with pytest.raises(ValueError, match="unknown update state"):
        publish.annotations("half-done", "1.4.0", "", "1.3.0", "A", "mender-grub", "ok")


# ---------------------------------------------------------------- the data partition (issue 33)

needs_e2fsprogs = pytest.mark.skipif(not E2FSPROGS, reason="e2fsprogs and util-linux's blkid are not on this host")


def node_status(board: Board, kubelet: HealthServer) -> dict:
    result = run_agent(board.environment(kubelet.url), "status")
    assert result.returncode == 0, describe(result)
    return json.loads(result.stdout)


def update_to_1_2(board: Board, kubelet: HealthServer) -> None:
    """A whole update the gate commits, its first boot finding /data clean."""
    board.publish(URL_12, "gpu-k8s-1.2.0")
    job = run_agent(board.environment(kubelet.url), "upgrade", "--version", "1.2.0", "--artifact-url", URL_12)
    assert job.returncode == KILLED, describe(job)
    board.power_cycle()
    data_boot(board, "clean")
    assert gate(board, kubelet).returncode == 0
    assert board.state()["committed"][-1] == "gpu-k8s-1.2.0"


@needs_e2fsprogs
def test_a_data_partition_made_again_is_published_until_the_node_commits_an_update(
        board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    assert upgrade(board, kubelet, "--artifact-url", URL).returncode == KILLED
    board.power_cycle()
    assert data_boot(board, "clean")["state"] == "ok"
    assert gate(board, kubelet).returncode == 0
    assert annotations(board)[publish.DATA] == "ok"
    # a later boot: the data partition is beyond repair; the layer makes a new one
    board.power_cycle()
    lost = data_boot(board, "lost")
    assert lost["state"] == "recreated" and board.marker() is None
    # the node is provisioned again and the next rollout's job finds it on 1.1.0 already
    job = upgrade(board, kubelet, "--artifact-url", URL)
    assert job.returncode == 0, describe(job)
    now = annotations(board)
    assert now[publish.STATE] == "committed" and now[publish.DATA] == f"recreated {lost['time']}"
    shown = node_status(board, kubelet)["data"]
    assert shown["state"] == "recreated" and "Everything on /data is gone" in shown["detail"]
    # a repair in a later boot does not hide the loss before it
    board.power_cycle()
    assert data_boot(board, "damaged")["state"] == "repaired"
    upgrade(board, kubelet, "--artifact-url", URL)
    assert annotations(board)[publish.DATA] == f"recreated {lost['time']}"
    # an update the gate commits is the line under it
    update_to_1_2(board, kubelet)
    assert annotations(board)[publish.DATA] == "ok"
    assert board.state()["published"][-1][publish.DATA] == "ok"


@needs_e2fsprogs
def test_a_repaired_data_partition_is_published_with_when_and_an_update_clears_it(
        board: Board, kubelet: HealthServer) -> None:
    board.power_cycle()
    repaired = data_boot(board, "damaged")
    assert repaired["state"] == "repaired"
    board.publish(URL, NEW)
    assert upgrade(board, kubelet, "--artifact-url", URL).returncode == KILLED
    assert board.state()["published"][0][publish.DATA] == f"repaired {repaired['time']}"
    board.power_cycle()
    data_boot(board, "clean")
    assert gate(board, kubelet).returncode == 0
    assert annotations(board)[publish.DATA] == "ok", "the repair came before the update the gate committed"


@needs_e2fsprogs
def test_a_data_partition_that_does_not_mount_in_this_boot_is_what_the_node_reports(
        board: Board, kubelet: HealthServer) -> None:
    board.power_cycle()
    missing = data_boot(board, "missing")
    assert missing["state"] == "unavailable"
    shown = node_status(board, kubelet)["data"]
    assert shown["annotation"] == f"unavailable {missing['time']}" and "did not appear" in shown["detail"]


def test_a_node_without_the_check_says_unknown_and_a_broken_log_line_costs_nothing(
        board: Board, kubelet: HealthServer) -> None:
    assert node_status(board, kubelet)["data"]["annotation"] == "unknown"
    lines = ["not json", json.dumps({"boot_id": "b1", "check": {"state": "half"}}),
             json.dumps({"boot_id": "b2", "check": {"state": "repaired", "time": "2026-11-02T00:00:00Z"}})]
    found = data_check.summarize(None, lines, 0)
    assert (found.state, found.annotation) == ("repaired", "repaired 2026-11-02T00:00:00Z")
    assert data_check.summarize(None, lines, 3).annotation == "ok", "everything before the last commit"
    assert data_check.summarize(None, lines, 9).state == "repaired", "a log shorter than at the commit is new"
    assert data_check.lines_seen_at_last_commit([{"event": "gate-committed", "data_events": 2}, "junk",
                                                 {"event": "gate-committed"}]) == 2


@needs_e2fsprogs
def test_the_report_at_k3s_start_publishes_only_the_data_annotation_and_waits_for_the_api(
        board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    upgrade(board, kubelet, "--artifact-url", URL)
    board.power_cycle()
    data_boot(board, "clean")
    gate(board, kubelet)
    before = annotations(board)
    board.power_cycle()
    lost = data_boot(board, "lost")
    board.change(api_down=True)
    env = board.environment(kubelet.url)
    refused = run_agent(env, "report", "--timeout", "0.2")
    assert refused.returncode == 1 and "not published within" in refused.stderr, describe(refused)
    assert annotations(board) == before
    board.change(api_down=False)
    done = run_agent(env, "report")
    assert done.returncode == 0, describe(done)
    assert board.state()["published"][-1] == {publish.DATA: f"recreated {lost['time']}"}
    assert annotations(board) == {**before, publish.DATA: f"recreated {lost['time']}"}
