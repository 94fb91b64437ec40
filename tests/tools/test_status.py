"""`./task status`: the fleet table and the rollout's state from Node, Plan and Job objects, and
its exit status (non-zero when a node failed or rolled back, its /data was made again since its
last update or does not mount, or a rollout job failed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.fleet import rollout, status

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "updater" / "src"))
from gpu_k8s_update import publish  # noqa: E402

NANO, X86 = "jetson-nano-devkit", "genericx86-64"


def node(name: str, device_type: str = NANO, *, server: bool = False, ready: bool = True, cordoned: bool = False,
         gpus: tuple[int, int] | None = (1, 1), state: str = "", target: str = "1.4.0", reason: str = "",
         labels: dict[str, str] | None = None, data: str = "ok") -> dict:
    found = {"kubernetes.io/hostname": name, rollout.DEVICE_TYPE_LABEL: device_type, **(labels or {})}
    if server:
        found[rollout.SERVER_LABEL] = "true"
    notes = {}
    if state:
        notes = publish.annotations(state, target, reason, "1.4.0" if state == "committed" else "1.3.0", "part 2",
                                    "mender-uboot", data, now=1795000000)
    item: dict = {"metadata": {"name": name, "labels": found, "annotations": notes},
                  "spec": {"unschedulable": True} if cordoned else {},
                  "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                             "nodeInfo": {"osImage": "meta-gpu-k8s 6.0", "architecture": "arm64"}}}
    if gpus is not None:
        item["status"]["allocatable"] = {"nvidia.com/gpu": str(gpus[0])}
        item["status"]["capacity"] = {"nvidia.com/gpu": str(gpus[1])}
    return item


def rendered_plans(**changes: object) -> dict[str, dict]:
    options = rollout.RolloutOptions(version="1.4.0", artifacts=(
        rollout.Artifact(X86, "http://u/x.mender"), rollout.Artifact(NANO, "http://u/n.mender")), **changes)
    return {doc["metadata"]["name"]: doc for doc in rollout.manifest_documents(rollout.render_plans(options))}


def with_status(plan: dict, complete: bool = False, applying: list[str] | None = None) -> dict:
    return {**plan, "status": {"latestVersion": "1.4.0", "latestHash": f"h-{plan['metadata']['name']}",
                               "applying": applying or [],
                               "conditions": [{"type": "Complete", "status": "True" if complete else "False"}]}}


def job(plan: str, node_name: str, failed: int = 0, state: str = "active") -> dict:
    conditions = []
    if state == "failed":
        conditions = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                       "message": "Job has reached the specified backoff limit"}]
    return {"metadata": {"name": f"apply-{plan}-on-{node_name}-with-h", "creationTimestamp": "2026-11-23T22:00:00Z",
                         "labels": {"upgrade.cattle.io/plan": plan, "upgrade.cattle.io/node": node_name}},
            "status": {"failed": failed, "conditions": conditions, **({"active": 1} if state == "active" else {})}}


def test_the_keys_status_reads_are_the_ones_the_agent_publishes() -> None:
    assert (status.OS_VERSION, status.SLOT, status.STATE, status.TARGET, status.REASON, status.TIME, status.DATA) == (
        publish.OS_VERSION, publish.SLOT, publish.STATE, publish.TARGET, publish.REASON, publish.TIME, publish.DATA)
    assert set(status.BAD_STATES) == {publish.ROLLED_BACK, publish.FAILED}


def test_a_node_row_says_machine_role_release_slot_update_and_gpus() -> None:
    row = status.node_row(node("x86-1", X86, server=True, cordoned=True, gpus=(1, 2), state="committed"))
    assert (row.machine, row.role, row.ready, row.os_version, row.slot, row.update, row.gpu) == (
        X86, "server", "Ready,SchedulingDisabled", "1.4.0", "part 2", "committed 1.4.0", "1/2 (1 unhealthy)")
    assert row.problem == "" and row.data == "ok" and row.data_problem == ""
    quiet = status.node_row(node("old", "", gpus=None, ready=False))
    assert quiet.update.startswith("unknown") and quiet.os_version == "meta-gpu-k8s 6.0 (os-release)"
    assert quiet.machine == "? (arm64)" and quiet.gpu == "-" and quiet.ready == "NotReady" and quiet.slot == "-"
    assert quiet.data == "-", "an agent that never reported says nothing about /data"


@pytest.mark.parametrize(("state", "shown"), [("rolled-back", "ROLLED BACK 1.4.0"), ("failed", "FAILED 1.4.0")])
def test_a_node_that_rolled_back_or_failed_is_a_problem_with_its_reason(state: str, shown: str) -> None:
    row = status.node_row(node("nano-c", state=state, reason="the gate said: device plugin: not registered"))
    assert row.update == shown
    assert row.problem.startswith(f"nano-c: {state.replace('-', ' ')} 1.4.0 at 2026-")
    assert row.problem.endswith("the gate said: device plugin: not registered")


def test_the_rollout_shows_the_server_updating_and_the_agents_waiting_for_it() -> None:
    found = rendered_plans()
    nodes = [node("x86-1", X86, server=True, cordoned=True, state="pending"),
             node("nano-c", labels={rollout.RING_LABEL: "canary"}), node("nano-1")]
    plans = [with_status(found[rollout.SERVER_PLAN], applying=["x86-1"]),
             *(with_status(plan) for name, plan in found.items() if name != rollout.SERVER_PLAN)]
    jobs = [job(rollout.SERVER_PLAN, "x86-1", failed=1), job(f"gpu-k8s-os-canary-{NANO}", "nano-c")]
    shown = status.report(nodes, plans, jobs)
    rows = {row.plan: row for row in shown.plans}
    assert [row.ring for row in shown.plans][0] == "server", "the server ring is listed first"
    assert rows[rollout.SERVER_PLAN].state == "updating"
    assert rows[rollout.SERVER_PLAN].detail == "x86-1 (after its reboot); 0/1 nodes done"
    canary = rows[f"gpu-k8s-os-canary-{NANO}"]
    assert canary.state == "waiting" and canary.detail.startswith("for the server ring; jobs wait in prepare on nano-c")
    fleet = rows[f"gpu-k8s-os-fleet-{NANO}"]
    assert fleet.state == "waiting" and fleet.detail.startswith("for the server ring")
    assert rows[f"gpu-k8s-os-canary-{X86}"].detail.endswith("0/0 nodes done")
    assert shown.problems == []
    text = status.render(shown)
    assert text.splitlines()[1].split() == ["NODE", "MACHINE", "ROLE", "STATUS", "OS", "VERSION", "SLOT", "UPDATE",
                                            "DATA", "GPU"]
    assert "pending 1.4.0" in text and "x86-1" in text.splitlines()[3], "servers are listed first"


def test_a_failed_job_and_a_rolled_back_node_fail_the_status() -> None:
    found = rendered_plans()
    server_done = {f"plan.upgrade.cattle.io/{rollout.SERVER_PLAN}": f"h-{rollout.SERVER_PLAN}"}
    nodes = [node("x86-1", X86, server=True, state="committed", labels=server_done),
             node("nano-c", state="rolled-back", reason="the gate said: kubelet: connection refused",
                  labels={rollout.RING_LABEL: "canary"})]
    canary = f"gpu-k8s-os-canary-{NANO}"
    plans = [with_status(found[rollout.SERVER_PLAN], complete=True), with_status(found[canary], applying=["nano-c"])]
    shown = status.report(nodes, plans, [job(canary, "nano-c", failed=5, state="failed")])
    rows = {row.plan: row for row in shown.plans}
    assert rows[rollout.SERVER_PLAN].state == "complete" and rows[rollout.SERVER_PLAN].detail == "1/1 nodes done"
    assert rows[canary].state == "FAILED" and "BackoffLimitExceeded" in rows[canary].detail
    assert len(shown.problems) == 2
    assert shown.problems[0].startswith("nano-c: rolled back 1.4.0") and "kubelet" in shown.problems[0]
    assert shown.problems[1].startswith(f"{canary}: node nano-c failed: job apply-")


LOST = "recreated 2026-11-29T12:00:00Z"


@pytest.mark.parametrize(("published", "shown", "problem"), [
    ("ok", "ok", ""),
    ("repaired 2026-11-28T06:00:00Z", "repaired 2026-11-28T06:00:00Z", ""),
    (LOST, "RECREATED 2026-11-29T12:00:00Z", "nano-1: /data was made again at 2026-11-29T12:00:00Z"),
    ("unavailable 2026-11-29T12:00:00Z", "UNAVAILABLE 2026-11-29T12:00:00Z", "nano-1: /data does not mount"),
    ("unknown", "unknown", ""),
])
def test_the_data_column_says_what_the_check_did_and_a_lost_or_unmounted_data_is_a_problem(
        published: str, shown: str, problem: str) -> None:
    found = status.report([node("nano-1", state="committed", data=published)], [], [])
    row = found.nodes[0]
    assert row.data == shown and row.problem == ""
    assert found.problems == ([row.data_problem] if problem else [])
    assert row.data_problem.startswith(problem) if problem else row.data_problem == ""
    assert shown in status.render(found).splitlines()[3]


def test_a_rolled_back_node_that_also_lost_its_data_has_both_problems() -> None:
    found = status.report([node("nano-c", state="rolled-back", reason="the gate said: no GPU", data=LOST)], [], [])
    assert len(found.problems) == 2 and found.problems[0].startswith("nano-c: rolled back 1.4.0 at ")
    assert found.problems[1].startswith("nano-c: /data was made again at 2026-11-29T12:00:00Z")
    assert "provision it again (docs/fleet.md, 'First flash with the A/B layout')" in found.problems[1]


FAKE_KUBECTL = """
import json, sys
cluster = json.load(open(env["STATUS_CLUSTER"]))
args = [a for a in argv if a not in ("-o", "json")]
if args[:2] == ["-n", "system-upgrade"]:
    args = args[2:]
if cluster.get("down"):
    print("The connection to the server 10.0.0.5:6443 was refused - did you specify the right host or port?",
          file=sys.stderr)
    sys.exit(1)
if args[:2] == ["get", "nodes"]:
    print(json.dumps({"items": cluster["nodes"]}))
elif args[:2] == ["get", "plans.upgrade.cattle.io"]:
    if cluster.get("no_crd"):
        print('error: the server doesn\\'t have a resource type "plans"', file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"items": cluster["plans"]}))
elif args[:2] == ["get", "jobs"]:
    print(json.dumps({"items": cluster["jobs"]}))
else:
    print("fake kubectl: unexpected " + " ".join(argv), file=sys.stderr)
    sys.exit(3)
"""


def task_status(stand_ins, tmp_path: Path, cluster: dict) -> subprocess.CompletedProcess[str]:
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    stand_ins.add("kubectl", FAKE_KUBECTL)
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools/program.py"), "--search-root", str(REPO_ROOT),
                           "status"], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": str(stand_ins.bin_dir) + ":/usr/bin:/bin",
                               "STATUS_CLUSTER": str(tmp_path / "cluster.json")})


def test_task_status_exits_0_on_a_healthy_fleet_and_1_on_a_rolled_back_node(stand_ins, tmp_path: Path) -> None:
    healthy = {"nodes": [node("x86-1", X86, server=True, state="committed"), node("nano-1", state="committed")],
               "plans": [], "jobs": []}
    fine = task_status(stand_ins, tmp_path, healthy)
    assert fine.returncode == 0, fine.stderr
    assert "committed 1.4.0" in fine.stdout and "rollout: none in the cluster" in fine.stdout
    healthy["nodes"].append(node("nano-c", state="rolled-back", reason="the gate said: no GPU"))
    bad = task_status(stand_ins, tmp_path, healthy)
    assert bad.returncode == 1 and "1 problem(s)" in bad.stderr
    assert "nano-c: rolled back 1.4.0" in bad.stdout and "ROLLED BACK 1.4.0" in bad.stdout


def test_task_status_without_a_controller_still_shows_the_nodes(stand_ins, tmp_path: Path) -> None:
    done = task_status(stand_ins, tmp_path, {"nodes": [node("nano-1", state="committed")], "no_crd": True})
    assert done.returncode == 0, done.stderr
    assert "nano-1" in done.stdout


def test_task_status_names_an_unreachable_cluster_in_one_line(stand_ins, tmp_path: Path) -> None:
    done = task_status(stand_ins, tmp_path, {"down": True})
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("error: cannot reach the cluster") and "KUBECONFIG" in done.stderr


def test_task_status_exits_1_on_a_node_whose_data_was_made_again(stand_ins, tmp_path: Path) -> None:
    cluster = {"nodes": [node("x86-1", X86, server=True, state="committed"),
                         node("nano-1", state="committed", data="repaired 2026-11-28T06:00:00Z")],
               "plans": [], "jobs": []}
    repaired = task_status(stand_ins, tmp_path, cluster)
    assert repaired.returncode == 0, repaired.stderr
    assert "repaired 2026-11-28T06:00:00Z" in repaired.stdout
    cluster["nodes"][1] = node("nano-1", state="committed", data=LOST)
    lost = task_status(stand_ins, tmp_path, cluster)
    assert lost.returncode == 1 and "1 problem(s)" in lost.stderr
    assert "RECREATED 2026-11-29T12:00:00Z" in lost.stdout and "nano-1: /data was made again" in lost.stdout
