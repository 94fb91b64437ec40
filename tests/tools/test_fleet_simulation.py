"""A fleet updated end to end through `./task rollout` (the real task code and command line) on a
simulated cluster (fake_cluster.py: the API server's objects, system-upgrade-controller's
reconcile rounds, node reboots) whose nodes are simulated boards running the real
gpu-k8s-update: an x86-64 k3s server, Jetson Nano, Orin and Thor agents; a single-server fleet;
three servers of two machines. `./task status` is then run against the cluster as it stood after
every controller round.

What must hold: the servers go first, one at a time, cordoned and never drained, while the
agents' jobs wait; each node installs only its own device type's artifact; canaries before the
fleet; a server judged by its own API server once it is back, and its job not failed by the
reboot that took the API server along; a canary that rolls back stops the rollout, and status
then exits non-zero naming it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "updater"))

from fake_board import Board, HealthServer  # noqa: E402
from fake_cluster import Cluster  # noqa: E402
from fake_tegra import TegraBoard  # noqa: E402

from tools.fleet import rollout  # noqa: E402
from tools.program import program  # noqa: E402

REPO_ROOT = TESTS.parent
VERSION = "1.4.0"
BASE = "http://updates.lan:8080/"
X86, NANO = "genericx86-64", "jetson-nano-devkit"
ORIN_AGENT, THOR_AGENT, ORIN = "jetson-orin-nano-devkit-nvme-agent", "jetson-agx-thor-devkit-agent", \
    "jetson-orin-nano-devkit-nvme"
SERVER_PLAN = rollout.SERVER_PLAN


def url_of(device_type: str) -> str:
    return f"{BASE}gpu-k8s-image-{device_type}-20261201.mender"


@pytest.fixture
def kubelet() -> Iterator[HealthServer]:
    server = HealthServer().start()
    yield server
    server.stop()


def make_cluster(tmp_path: Path, kubelet: HealthServer, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    cluster = Cluster(tmp_path / "cluster", kubelet.url)
    for key, value in cluster.environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FLEET_SIM_NODE", raising=False)
    monkeypatch.setattr(rollout, "FOLLOW_INTERVAL_S", 0)
    return cluster


def board(tmp_path: Path, name: str, device_type: str) -> Board | TegraBoard:
    """A simulated board on 1.3.0 that can download its own device type's 1.4.0 artifact."""
    root = tmp_path / "boards" / name
    if device_type == X86:
        found: Board | TegraBoard = Board(root, running="1.3.0", backend="mender-grub", device_type=X86)
    elif device_type == NANO:
        found = Board(root, running="1.3.0", backend="mender-uboot", device_type=NANO)
    else:
        found = TegraBoard(root, running="1.3.0", device_type=device_type)
    found.publish(url_of(device_type), VERSION)
    return found


def write_release(tmp_path: Path, device_types: list[str]) -> Path:
    directory = tmp_path / "release" / VERSION
    directory.mkdir(parents=True)
    (directory / "release.json").write_text(json.dumps({"version": VERSION, "artifacts": [
        {"file": url_of(kind).removeprefix(BASE), "device_types": [kind]} for kind in device_types]}))
    return directory


def task(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """One ./task command line, in this process; its exit status and output."""
    try:
        program.run(["./task", "--search-root", str(REPO_ROOT), *argv])
        code = 0
    except SystemExit as exited:
        code = int(exited.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def roll_out(capsys: pytest.CaptureFixture[str], release: Path) -> tuple[int, str]:
    return task(capsys, "rollout", "--version", VERSION, "--release", str(release), "--base-url", BASE)


def statuses(cluster: Cluster, capsys: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict, int, str]]:
    """`./task status` against the cluster as it stood after each controller round."""
    state = cluster.load()
    replay = cluster.root / "replay.json"
    monkeypatch.setenv("FLEET_SIM_STATE", str(replay))
    shown = []
    for moment in state["history"]:
        servers = [n for n, node in moment["nodes"].items() if node["sim"]["server"]]
        rebooting = {n: 1 for n in servers} if not moment["api_up"] else {}
        replay.write_text(json.dumps({**state, **moment, "auto_tick": False, "rebooting": rebooting,
                                      "start_refusals": {}}))
        code, out = task(capsys, "status")
        shown.append((moment, code, out))
    monkeypatch.setenv("FLEET_SIM_STATE", str(cluster.state_file))
    return shown


def table(out: str, first_header: str) -> dict[str, dict[str, str]]:
    """A table `./task status` printed, by its first column: cells by header, cut where the
    dashes under the headers say."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header + " "))
    spans, column = [], 0
    for dashes in lines[start + 1].split("  "):
        spans.append((column, column + len(dashes)))
        column += len(dashes) + 2
    headers = [lines[start][a:b].strip() for a, b in spans]
    found = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        values = [line[a:b].strip() for a, b in spans]
        found[values[0]] = dict(zip(headers, values, strict=True))
    return found


def node_cells(out: str, node: str) -> dict[str, str]:
    return table(out, "NODE")[node]


def installs(found: Board | TegraBoard) -> list[str]:
    return [call[2] for call in found.state()["calls"] if call[:2] == ["mender-update", "install"]]


def plan_complete(moment: dict, name: str) -> bool:
    plan = moment["plans"].get(name)
    return bool(plan) and any(c["type"] == "Complete" and c["status"] == "True"
                              for c in plan["status"].get("conditions", []))


MIXED = [("gpu-server", X86, True, False), ("nano-c", NANO, False, True), ("nano-1", NANO, False, False),
         ("orin-c", ORIN_AGENT, False, True), ("thor-c", THOR_AGENT, False, True), ("thor-1", THOR_AGENT, False, False)]


def test_a_mixed_fleet_updates_server_first_undrained_then_canaries_then_the_fleet(
        tmp_path: Path, kubelet: HealthServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = make_cluster(tmp_path, kubelet, monkeypatch)
    boards = {}
    for name, kind, server, canary in MIXED:
        boards[name] = board(tmp_path, name, kind)
        cluster.add_node(name, boards[name], server=server, canary=canary, arch="x86_64" if kind == X86 else "arm64")
    release = write_release(tmp_path, [X86, NANO, ORIN_AGENT, THOR_AGENT])

    code, out = roll_out(capsys, release)
    assert code == 0, out
    assert "gpu-server is the only server: while it reboots the API server is down" in out
    assert "the API server does not answer" in out and "gpu-server is rebooting into its update" in out

    # every node runs and committed its own device type's 1.4.0, installed once from its own URL
    for name, kind, _, _ in MIXED:
        assert boards[name].running == VERSION, name
        assert installs(boards[name]) == [url_of(kind)], f"{name} was offered another machine's artifact"
        assert cluster.load()["nodes"][name]["metadata"]["annotations"]["update.gpu-k8s.io/update-state"] == \
            "committed"

    # the server first, cordoned and not drained; its job survived the reboot that took the API along
    server_done = cluster.first("job-complete", "gpu-server")
    assert cluster.first("cordon", "gpu-server") < server_done
    assert [e for e in cluster.events("drain") if e[2] == "gpu-server"] == []
    assert cluster.load()["nodes"]["gpu-server"]["sim"]["workload"] == "work-gpu-server", "its pods stayed"
    server_job = next(j for j in cluster.load()["jobs"].values()
                      if j["metadata"]["labels"]["upgrade.cattle.io/plan"] == SERVER_PLAN)
    assert (server_job["status"]["succeeded"], server_job["status"]["failed"]) == (1, 1), \
        "the pod its reboot killed counted once, and did not fail the job"
    assert any(not moment["api_up"] for moment in cluster.load()["history"])
    gate = [e[3] for e in cluster.events("gate") if e[2] == "gpu-server"]
    assert len(gate) == 1 and gate[0].startswith("exit 0: committed: healthy:") and "node Ready" in gate[0], gate
    for name, _, _, _ in MIXED[1:]:
        assert cluster.first("pod", name) > server_done, f"{name} started before the server ring completed"
        assert cluster.first("drain", name) > server_done
    # canaries before the rest of their type
    for canary, fleet in (("nano-c", "nano-1"), ("thor-c", "thor-1")):
        assert cluster.first("pod", fleet) > cluster.first("job-complete", canary)

    # ./task status after every round
    seen_server_updating = seen_agents_waiting = seen_outage = False
    for moment, code, shown in statuses(cluster, capsys, monkeypatch):
        if not moment["api_up"]:
            seen_outage = True
            assert code == 1 and "cannot reach the cluster" in shown
            continue
        assert code == 0, shown
        if not moment["plans"]:
            continue
        server_complete = plan_complete(moment, SERVER_PLAN)
        plan_rows = table(shown, "PLAN")
        if not server_complete:
            for name, _, _, _ in MIXED[1:]:
                assert node_cells(shown, name)["UPDATE"] != f"committed {VERSION}", f"{name} ahead:\n{shown}"
            if plan_rows[SERVER_PLAN]["STATE"] == "updating":
                seen_server_updating = True
                assert node_cells(shown, "gpu-server")["STATUS"] == "Ready,SchedulingDisabled", "cordoned"
                assert plan_rows[SERVER_PLAN]["DETAIL"].startswith("gpu-server")
            canary = plan_rows[f"gpu-k8s-os-canary-{NANO}"]
            if canary["STATE"] == "waiting" and canary["DETAIL"].startswith("for the server ring"):
                seen_agents_waiting = True
    assert seen_server_updating and seen_agents_waiting and seen_outage
    last = shown
    for name, _, _, _ in MIXED:
        assert node_cells(last, name)["UPDATE"] == f"committed {VERSION}", last
        assert node_cells(last, name)["OS VERSION"] == VERSION
    assert {cells["STATE"] for cells in table(last, "PLAN").values()} == {"complete"}, last


def test_a_canary_that_rolls_back_stops_the_rollout_and_fails_the_status(
        tmp_path: Path, kubelet: HealthServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = make_cluster(tmp_path, kubelet, monkeypatch)
    boards = {}
    for name, kind, server, canary in MIXED[:3]:
        boards[name] = board(tmp_path, name, kind)
        # the canary's gate gives up soon; the server's waits for its API server as it always does
        cluster.add_node(name, boards[name], server=server, canary=canary, gate_timeout_s=20 if server else 1.5)
    cluster.break_release("nano-c", VERSION)  # 1.4.0 boots on nano-c without its GPU
    release = write_release(tmp_path, [X86, NANO])

    code, out = roll_out(capsys, release)
    assert code == 1, out
    assert "rollout stopped at canary node nano-c" in out and "BackoffLimitExceeded" in out
    assert "the gate said: not healthy after" in out and "device plugin" in out, "the node's reason reaches the person"
    assert boards["gpu-server"].running == VERSION, "the server ring had completed"
    assert boards["nano-c"].running == "1.3.0" and not boards["nano-c"].pending
    assert installs(boards["nano-1"]) == [], "no fleet node is touched after a canary rolled back"
    assert [e for e in cluster.events() if e[2] == "nano-1" and e[1] in ("pod", "drain", "cordon")] == []

    code, shown = task(capsys, "status")
    assert code == 1, shown
    assert node_cells(shown, "nano-c")["UPDATE"] == f"ROLLED BACK {VERSION}"
    assert node_cells(shown, "nano-c")["OS VERSION"] == "1.3.0", "the release it runs again"
    assert "nano-c: rolled back 1.4.0 at" in shown and "device plugin" in shown
    assert f"gpu-k8s-os-canary-{NANO}: node nano-c failed: job apply-" in shown
    assert node_cells(shown, "gpu-server")["UPDATE"] == f"committed {VERSION}"


def test_a_single_server_fleet_updates_its_only_node_through_its_own_reboot(
        tmp_path: Path, kubelet: HealthServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = make_cluster(tmp_path, kubelet, monkeypatch)
    only = board(tmp_path, "gpu-server", X86)
    cluster.add_node("gpu-server", only, server=True, arch="x86_64")
    release = write_release(tmp_path, [X86])

    code, out = roll_out(capsys, release)
    assert code == 0, out
    assert "gpu-server is the only server" in out and "this command waits for it to come back" in out
    assert "the API server answers again" in out
    assert only.running == VERSION and installs(only) == [url_of(X86)]
    assert [e for e in cluster.events("drain")] == [], "nothing is drained: there is nowhere to go"
    assert cluster.load()["nodes"]["gpu-server"]["spec"].get("unschedulable") is False, "uncordoned when done"
    gate = [e[3] for e in cluster.events("gate") if e[2] == "gpu-server"]
    assert gate[0].startswith("exit 0: committed: healthy:") and "unreachable" not in gate[0], \
        "judged through the cluster once its own API server answered, not on local checks"
    code, shown = task(capsys, "status")
    assert code == 0, shown
    cells = node_cells(shown, "gpu-server")
    assert (cells["MACHINE"], cells["ROLE"], cells["STATUS"], cells["OS VERSION"], cells["SLOT"], cells["UPDATE"],
            cells["GPU"]) == (X86, "server", "Ready", VERSION, "part 3", f"committed {VERSION}", "1/1"), shown


def test_servers_of_two_machines_update_one_at_a_time_each_with_its_own_artifact(
        tmp_path: Path, kubelet: HealthServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = make_cluster(tmp_path, kubelet, monkeypatch)
    servers = {"x86-a": X86, "x86-b": X86, "orin-s": ORIN}
    boards = {}
    for name, kind in servers.items():
        boards[name] = board(tmp_path, name, kind)
        cluster.add_node(name, boards[name], server=True)
    release = write_release(tmp_path, [X86, ORIN])

    code, out = roll_out(capsys, release)
    assert code == 0, out
    assert "3 servers: the others keep the API server up while one reboots" in out
    assert all(moment["api_up"] for moment in cluster.load()["history"]), "two of three servers keep quorum"
    windows = sorted((cluster.first("cordon", name), cluster.first("job-complete", name)) for name in servers)
    for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
        assert end < start, f"two servers updated at once: {windows}"
    for name, kind in servers.items():
        assert boards[name].running == VERSION and installs(boards[name]) == [url_of(kind)], name
