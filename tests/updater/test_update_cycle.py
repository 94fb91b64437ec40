"""The whole update cycle through the real CLI on a simulated board: install, reboot, gate,
commit or rollback, and the rollout job's view of each state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fake_board import Board, DockerSocket, HealthServer, describe, run_agent, running_agent

URL = "https://updates.example/1.1.0/gpu-k8s-image-jetson-nano-devkit.mender"
NEW = "gpu-k8s-1.1.0"
KILLED = -signal.SIGKILL


def upgrade(board: Board, kubelet: HealthServer, **extra: str):
    return run_agent(board.environment(kubelet.url, extra), "upgrade", "--version", "1.1.0", "--artifact-url", URL)


def gate(board: Board, kubelet: HealthServer, **extra: str):
    return run_agent(board.environment(kubelet.url, extra), "gate")


def installed_and_rebooted(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    result = upgrade(board, kubelet)
    assert result.returncode == KILLED, "the upgrade should end killed by its own reboot\n" + describe(result)
    board.power_cycle()
    assert board.running == NEW and board.pending


def test_first_run_installs_marks_and_is_killed_by_its_own_reboot(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW)
    result = upgrade(board, kubelet)
    assert result.returncode == KILLED, describe(result)
    assert board.mender_calls("install") == 1
    assert board.state()["reboots"] == 1
    marker = board.marker()
    assert marker is not None, "no tried marker written"
    assert marker["version"] == "1.1.0" and marker["phase"] == "installed" and marker["from_version"] == "gpu-k8s-1.0.0"
    assert marker["gpus_before"] == 1, "the node's GPUs before the update are remembered for the gate"
    assert board.pending and board.running == "gpu-k8s-1.0.0"


@pytest.fixture(params=["mender-uboot", "mender-grub"], ids=["nano-uboot", "x86-64-grub"])
def either_board(request: pytest.FixtureRequest, tmp_path: Path) -> Board:
    return Board(tmp_path / "board", backend=request.param)


def test_healthy_node_is_committed_and_the_job_then_succeeds(either_board: Board, kubelet: HealthServer) -> None:
    board = either_board
    installed_and_rebooted(board, kubelet)
    result = gate(board, kubelet)
    assert result.returncode == 0, describe(result)
    assert board.state()["committed"] == [NEW]
    assert not board.pending
    assert board.gate_result()["outcome"] == "committed"
    assert "healthy" in board.gate_result()["reason"]
    assert board.marker() is None, "a committed update leaves no marker, so the gate unit stays off"
    again = upgrade(board, kubelet)
    assert again.returncode == 0, describe(again)
    assert board.mender_calls("install") == 1, "done means done: no second install"
    board.power_cycle()
    assert board.running == NEW, "a committed slot survives the next reboot"


def test_healthy_node_with_docker_checked_is_committed(board: Board, kubelet: HealthServer, tmp_path: Path) -> None:
    docker = DockerSocket(Path("/tmp") / f"gku-docker-{tmp_path.name[-12:]}.sock").start()
    try:
        installed_and_rebooted(board, kubelet)
        result = gate(board, kubelet, GPU_K8S_UPDATE_DOCKER_SOCKET=str(docker.path))
        assert result.returncode == 0, describe(result)
        assert "docker up" in board.gate_result()["reason"]
    finally:
        docker.stop()
        docker.path.unlink(missing_ok=True)


def test_docker_down_rolls_back(board: Board, kubelet: HealthServer, tmp_path: Path) -> None:
    installed_and_rebooted(board, kubelet)
    dockerd = tmp_path / "dockerd"
    dockerd.write_text("")
    result = gate(board, kubelet, GPU_K8S_UPDATE_DOCKER_SOCKET=str(tmp_path / "no-docker.sock"),
                  GPU_K8S_UPDATE_DOCKER_DAEMON=str(dockerd))
    assert result.returncode == KILLED, describe(result)
    assert "docker" in board.gate_result()["reason"]


def test_containerd_node_without_docker_is_not_judged_on_docker(
    board: Board, kubelet: HealthServer, tmp_path: Path
) -> None:
    installed_and_rebooted(board, kubelet)
    result = gate(board, kubelet, GPU_K8S_UPDATE_DOCKER_SOCKET=str(tmp_path / "no-docker.sock"))
    assert result.returncode == 0, describe(result)
    assert "docker" not in board.gate_result()["reason"]


def test_upgrade_on_the_new_slot_waits_for_the_gate_then_succeeds(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    env = board.environment(kubelet.url)
    with running_agent(env, "upgrade", "--version", "1.1.0", "--artifact-url", URL) as job:
        time.sleep(1.0)
        assert job.poll() is None, "the job must wait while the update is pending"
        assert gate(board, kubelet).returncode == 0
        job.wait(timeout=30)
        assert job.returncode == 0
    assert board.mender_calls("install") == 1


def test_unhealthy_kubelet_rolls_back_and_the_job_fails_at_that_node(
        either_board: Board, kubelet: HealthServer) -> None:
    board = either_board
    installed_and_rebooted(board, kubelet)
    kubelet.set_status(500)
    result = gate(board, kubelet)
    assert result.returncode == KILLED, "the gate reboots without committing\n" + describe(result)
    verdict = board.gate_result()
    assert verdict["outcome"] == "rolled-back" and "kubelet" in verdict["reason"], verdict
    assert board.state()["committed"] == []
    board.power_cycle()
    assert board.running == "gpu-k8s-1.0.0" and not board.pending
    kubelet.set_status(200)
    job = upgrade(board, kubelet)
    assert job.returncode == 3, describe(job)
    assert "back on gpu-k8s-1.0.0" in job.stderr and "kubelet" in job.stderr, "the job names the gate's reason"
    rerun = upgrade(board, kubelet)
    assert rerun.returncode == 3, "re-running keeps the rollout stopped\n" + describe(rerun)
    assert board.mender_calls("install") == 1


def test_node_never_ready_times_out_and_rolls_back(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    board.set_node(ready=False)
    started = time.monotonic()
    result = gate(board, kubelet, GPU_K8S_UPDATE_GATE_TIMEOUT_S="1")
    assert result.returncode == KILLED, describe(result)
    assert time.monotonic() - started >= 1.0, "the gate waits for its timeout before giving up"
    assert "node not Ready (KubeletNotReady)" in board.gate_result()["reason"]
    assert "waiting" in result.stderr, "the wait is logged with its reason"


def test_gpu_node_whose_plugin_never_registers_rolls_back(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    board.set_node(ready=True, gpus=0)
    board.register_plugin(gpus=0)
    result = gate(board, kubelet)
    assert result.returncode == KILLED, describe(result)
    reason = board.gate_result()["reason"]
    assert "no allocatable nvidia.com/gpu" in reason and "device plugin" in reason, reason


def test_gpu_smoke_pod_runs_before_the_commit(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    result = gate(board, kubelet, GPU_K8S_UPDATE_SMOKE_IMAGE="localhost/gpu-k8s-smoke:latest")
    assert result.returncode == 0, describe(result)
    assert "GPU smoke pod ran" in board.gate_result()["reason"]
    pod = board.state()
    assert pod["smoke_pods_created"] == 1 and pod["smoke_pod"] is None, "the smoke pod is deleted afterwards"


def test_gpu_smoke_pod_that_cannot_get_a_gpu_rolls_back(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    board.change(smoke_outcome="Failed")
    result = gate(board, kubelet, GPU_K8S_UPDATE_SMOKE_IMAGE="localhost/gpu-k8s-smoke:latest")
    assert result.returncode == KILLED, describe(result)
    reason = board.gate_result()["reason"]
    assert "GPU smoke pod: UnexpectedAdmissionError" in reason, reason
    assert board.state()["committed"] == []


def test_cpu_only_node_passes_without_a_gpu(board: Board, kubelet: HealthServer) -> None:
    board.set_node(gpus=0)
    board.register_plugin(gpus=0)
    installed_and_rebooted(board, kubelet)
    result = gate(board, kubelet)
    assert result.returncode == 0, describe(result)
    assert "GPU not required" in result.stderr


def test_stale_plugin_checkpoint_from_before_the_boot_does_not_count(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    board.change(api_down=True)
    os.utime(board.checkpoint, (0, 0))
    result = gate(board, kubelet)
    assert result.returncode == KILLED, describe(result)
    assert "before this boot" in board.gate_result()["reason"]


def test_api_server_unreachable_commits_on_local_checks_after_the_grace(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    board.change(api_down=True)
    result = gate(board, kubelet)
    assert result.returncode == 0, describe(result)
    reason = board.gate_result()["reason"]
    assert "API server unreachable" in reason and "device plugin registered" in reason, reason
    assert board.state()["committed"] == [NEW]


def test_boot_counter_returns_to_the_old_slot_when_the_gate_never_runs(
        either_board: Board, kubelet: HealthServer) -> None:
    board = either_board
    installed_and_rebooted(board, kubelet)
    board.power_cycle()  # hung boot, watchdog reset: bootcount exceeds bootlimit
    assert board.running == "gpu-k8s-1.0.0" and not board.pending
    job = upgrade(board, kubelet)
    assert job.returncode == 3, describe(job)
    assert "no gate verdict" in job.stderr
    assert board.state()["in_progress"] is None, "Mender's leftover update is cleared for the next install"
    assert board.state()["bootenv"]["mender_boot_part"] == "2", "cleanup on the old slot must not switch slots"


def test_forget_lets_a_rolled_back_version_be_tried_again(board: Board, kubelet: HealthServer) -> None:
    installed_and_rebooted(board, kubelet)
    board.power_cycle()
    assert upgrade(board, kubelet).returncode == 3
    forget = run_agent(board.environment(kubelet.url), "forget")
    assert forget.returncode == 0 and board.marker() is None
    retry = upgrade(board, kubelet)
    assert retry.returncode == KILLED, describe(retry)
    assert board.mender_calls("install") == 2


def test_killed_mid_install_installs_again_on_the_next_run(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW, kill_caller_during_install=1)
    first = upgrade(board, kubelet)
    assert first.returncode == KILLED
    assert board.marker()["phase"] == "installing" and board.marker()["attempts"] == 1
    assert board.state()["in_progress"] is not None, "Mender is left with a half-done update"
    second = upgrade(board, kubelet)
    assert second.returncode == KILLED, describe(second)
    assert board.mender_calls("rollback") == 1, "the half-done update is cleared before installing again"
    assert board.mender_calls("install") == 2
    assert board.marker()["phase"] == "installed" and board.marker()["attempts"] == 2
    board.power_cycle()
    assert board.running == NEW


def test_interrupted_installs_give_up_after_the_limit(board: Board, kubelet: HealthServer) -> None:
    board.publish(URL, NEW, kill_caller_during_install=5)
    for _ in range(3):
        assert upgrade(board, kubelet).returncode == KILLED
    result = upgrade(board, kubelet)
    assert result.returncode == 5, describe(result)
    assert "interrupted 3 times" in result.stderr
    assert board.mender_calls("install") == 3


def test_killed_between_install_and_reboot_reboots_without_installing_again(
    board: Board, kubelet: HealthServer
) -> None:
    board.publish(URL, NEW)
    board.change(reboot_kills_caller=False)
    first = upgrade(board, kubelet, GPU_K8S_UPDATE_REBOOT_WAIT_S="0.2")
    assert first.returncode == 1 and "still running" in first.stderr, describe(first)
    board.change(reboot_kills_caller=True)
    second = upgrade(board, kubelet)
    assert second.returncode == KILLED, describe(second)
    assert board.mender_calls("install") == 1
    assert board.state()["reboots"] == 2


def test_failed_download_fails_the_job_and_changes_no_slot(board: Board, kubelet: HealthServer) -> None:
    result = upgrade(board, kubelet)  # nothing published at URL: 404
    assert result.returncode == 1, describe(result)
    assert "404" in result.stderr
    assert not board.pending and board.state()["reboots"] == 0


def test_foreign_pending_update_is_left_alone(board: Board, kubelet: HealthServer) -> None:
    board.change(bootenv={"mender_boot_part": "2", "upgrade_available": "1", "bootcount": "0", "bootlimit": "1"})
    result = upgrade(board, kubelet)
    assert result.returncode == 75, describe(result)
    assert board.mender_calls("install") == 0 and board.mender_calls("rollback") == 0


def test_gate_without_a_pending_update_does_nothing(board: Board, kubelet: HealthServer) -> None:
    result = gate(board, kubelet)
    assert result.returncode == 0 and "no update pending" in result.stderr
    assert board.state()["calls"] == []


def test_bad_arguments_are_refused_in_one_line_and_change_nothing(board: Board, kubelet: HealthServer) -> None:
    env = board.environment(kubelet.url)
    for version, url, expected in (
        ("1.1 beta", URL, "not a release version"),
        ("1.1.0", "ftp://updates.example/x.mender", "must be an http(s) URL"),
        ("1.1.0", "/nonexistent/x.mender", "no such file"),
    ):
        result = run_agent(env, "upgrade", "--version", version, "--artifact-url", url)
        assert result.returncode == 2, describe(result)
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
        assert len(errors) == 1 and expected in errors[0], result.stderr
    assert board.state()["calls"] == [] and board.marker() is None


def test_status_shows_the_next_step(board: Board, kubelet: HealthServer) -> None:
    result = run_agent(board.environment(kubelet.url), "status", "--version", "1.1.0")
    assert result.returncode == 0, describe(result)
    report = json.loads(result.stdout)
    assert report["booted_version"] == "gpu-k8s-1.0.0" and report["pending"] is False
    assert report["next_step"]["step"] == "install"
    assert report["node_name"] == {"name": "nano-1", "from": "configured"}


def test_a_board_without_an_ab_updater_is_refused_clearly_and_nothing_is_written(
        board: Board, kubelet: HealthServer) -> None:
    """An image built without the A/B opt-in: no image-info, no mender-update."""
    (board.bin / "mender-update").unlink()
    board.image_info.unlink()
    board.publish(URL, NEW)
    for command in (("upgrade", "--version", "1.1.0", "--artifact-url", URL), ("gate",)):
        result = run_agent(board.environment(kubelet.url), *command)
        assert result.returncode == 6, describe(result)
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
        assert len(errors) == 1 and "this image has no A/B updater" in errors[0], result.stderr
        assert "First flash with the A/B layout" in errors[0]
        assert "Traceback" not in result.stderr
    assert board.marker() is None and board.state()["reboots"] == 0, "nothing was marked, nothing rebooted"


@pytest.mark.parametrize("tool", ["mender-update", "fw_printenv"])
def test_an_ab_image_missing_a_tool_of_its_backend_names_it(board: Board, kubelet: HealthServer, tool: str) -> None:
    (board.bin / tool).unlink()
    board.publish(URL, NEW)
    for command in (("upgrade", "--version", "1.1.0", "--artifact-url", URL), ("gate",)):
        result = run_agent(board.environment(kubelet.url), *command)
        assert result.returncode == 6, describe(result)
        assert f"(mender-uboot: {tool} is not installed)" in result.stderr, result.stderr
    assert board.marker() is None and board.state()["calls"] == []


def test_the_release_version_before_the_command_is_refused_not_mistaken(board: Board, kubelet: HealthServer) -> None:
    env = board.environment(kubelet.url)
    result = run_agent(env, "--version", "1.1.0", "upgrade", "--artifact-url", URL)
    assert result.returncode == 2
    assert "gpu-k8s-update upgrade --artifact-url" in result.stderr and "--version 1.1.0" in result.stderr
    assert board.mender_calls("install") == 0
    own = run_agent(env, "--version")
    assert own.returncode == 0 and own.stdout.startswith("gpu-k8s-update ")


def test_an_update_committed_before_the_gate_judged_it_fails_the_job(
        either_board: Board, kubelet: HealthServer) -> None:
    """Someone ran `mender-update commit` on the new slot before the gate did."""
    board = either_board
    installed_and_rebooted(board, kubelet)
    commit = subprocess.run([str(board.bin / "mender-update"), "commit"], capture_output=True, text=True, check=False)
    assert commit.returncode == 0 and not board.pending
    result = gate(board, kubelet)
    assert result.returncode == 0 and "committed, but not by this gate" in result.stderr, describe(result)
    assert board.gate_result()["outcome"] == "committed-elsewhere"
    job = upgrade(board, kubelet)
    assert job.returncode == 7 and "never passed it" in job.stderr, describe(job)
    assert upgrade(board, kubelet).returncode == 7, "re-running keeps the rollout stopped"
