"""`status`: where every node of the fleet stands and where the current rollout is, read from
the cluster with kubectl (KUBECONFIG picks it, GPU_K8S_KUBECTL overrides the command), as
`./task rollout` reads it.

Per node: its machine (the update device type label), role (k3s server or agent), whether it is
Ready and schedulable, the release and slot it runs and its update state (pending, committed,
rolled back, failed, with why and when), as the node's update agent publishes them in
annotations on its own Node (updater/src/gpu_k8s_update/publish.py), what the layer's data check
did to its /data since its last update (repaired, made again, not mounting), and its GPUs (allocatable
nvidia.com/gpu of its capacity: the device plugin reports an unhealthy GPU to the kubelet, which
takes it out of allocatable). Per rollout Plan: its ring, version, which node it is updating and
what it waits for. Pure rendering apart from the kubectl calls (run_status)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools import console
from tools.fleet import rollout

# What the node's update agent publishes (the same keys as updater's publish.py).
PREFIX = "update.gpu-k8s.io/"
OS_VERSION = PREFIX + "os-version"
SLOT = PREFIX + "slot"
STATE = PREFIX + "update-state"
TARGET = PREFIX + "update-version"
REASON = PREFIX + "update-reason"
TIME = PREFIX + "update-time"
DATA = PREFIX + "data"
BAD_STATES = {"rolled-back": "ROLLED BACK", "failed": "FAILED"}
GPU = "nvidia.com/gpu"
RING_ORDER = {"server": 0, "canary": 1, "fleet": 2}


class StatusError(rollout.RolloutError):
    """The cluster could not be read; the message names the problem and the fix."""


@dataclass(frozen=True)
class NodeRow:
    name: str
    machine: str
    role: str
    ready: str
    os_version: str
    slot: str
    update: str
    gpu: str
    data: str = "-"
    problem: str = ""  # why this node makes the status fail ('' if it does not)
    data_problem: str = ""  # the same for its data partition


@dataclass(frozen=True)
class PlanRow:
    plan: str
    ring: str
    version: str
    state: str  # complete, updating, waiting, FAILED, not started
    detail: str
    problem: str = ""


@dataclass(frozen=True)
class Report:
    nodes: list[NodeRow]
    plans: list[PlanRow]

    @property
    def problems(self) -> list[str]:
        found = [problem for row in self.nodes for problem in (row.problem, row.data_problem)]
        return [problem for problem in [*found, *(row.problem for row in self.plans)] if problem]


# ---------------------------------------------------------------- nodes


def _ready(node: Mapping[str, Any]) -> str:
    status = node.get("status") or {}
    ready = "Unknown"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = "Ready" if condition.get("status") == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        ready += ",SchedulingDisabled"
    return ready


def _gpus(node: Mapping[str, Any]) -> str:
    status = node.get("status") or {}
    capacity = (status.get("capacity") or {}).get(GPU)
    if capacity is None:
        return "-"
    allocatable = (status.get("allocatable") or {}).get(GPU, "0")
    try:
        have, of = int(str(allocatable)), int(str(capacity))
    except ValueError:
        return f"{allocatable}/{capacity}"
    return f"{have}/{of}" + (f" ({of - have} unhealthy)" if have < of else "")


def data_cell(name: str, value: str | None) -> tuple[str, str]:
    """The DATA cell and the problem it makes, from `update.gpu-k8s.io/data` (updater's
    data_check.py): `ok`, `unknown`, or a verdict and the time the node's check gave it. A /data
    made again since the last update lost the node's k3s state, images and provisioning; one
    that does not mount leaves its workloads down: both need a person, so both fail the status."""
    if not value:
        return "-", ""
    verdict, _, when = value.partition(" ")
    if verdict == "recreated":
        return f"RECREATED {when}".strip(), (
            f"{name}: /data was made again at {when or '?'} (the check could not repair it), after its last update: "
            "its k3s state, images and provisioning are gone; provision it again (docs/fleet.md, 'First flash "
            "with the A/B layout'). This clears when the node commits its next update")
    if verdict == "unavailable":
        return f"UNAVAILABLE {when}".strip(), (
            f"{name}: /data does not mount in this boot (checked {when or '?'}): its workloads do not run; see "
            "'journalctl -u gpu-k8s-data-check' on the node (docs/layer.md, 'A /data that cannot brick a board')")
    return value, ""


def node_row(node: Mapping[str, Any]) -> NodeRow:
    name = rollout.name_of(node)
    notes = node.get("metadata", {}).get("annotations") or {}
    info = (node.get("status") or {}).get("nodeInfo") or {}
    machine = rollout.device_type_of(node) or f"? ({info.get('architecture', 'no device-type label')})"
    os_version = notes.get(OS_VERSION) or f"{info.get('osImage', '?')} (os-release)"
    state, target = notes.get(STATE, ""), notes.get(TARGET, "")
    if not state:
        update = "unknown (no report from its update agent)"
    else:
        update = f"{BAD_STATES.get(state, state)} {target}".strip()
    problem = ""
    if state in BAD_STATES:
        problem = (f"{name}: {state.replace('-', ' ')} {target} at {notes.get(TIME, '?')}: "
                   f"{notes.get(REASON) or 'no reason given'}")
    data, data_problem = data_cell(name, notes.get(DATA))
    return NodeRow(name=name, machine=machine, role="server" if rollout.is_server(node) else "agent",
                   ready=_ready(node), os_version=os_version, slot=notes.get(SLOT, "-"), update=update,
                   gpu=_gpus(node), data=data, problem=problem, data_problem=data_problem)


# ---------------------------------------------------------------- the rollout


def _selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector, as the controller evaluates a Plan's nodeSelector (it also
    requires kubernetes.io/hostname)."""
    if "kubernetes.io/hostname" not in labels:
        return False
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def waited_plans(plan: Mapping[str, Any]) -> list[str]:
    """The Plans a Plan's prepare step waits for (`wait-plan --plan NAME ...`)."""
    args = ((plan.get("spec") or {}).get("prepare") or {}).get("args") or []
    return [args[index + 1] for index, word in enumerate(args[:-1]) if word == "--plan"]


def plan_row(plan: Mapping[str, Any], plans: Mapping[str, Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
             jobs: Sequence[Mapping[str, Any]]) -> PlanRow:
    name = plan.get("metadata", {}).get("name", "?")
    labels = plan.get("metadata", {}).get("labels") or {}
    spec = plan.get("spec") or {}
    version = str(spec.get("version", "?"))
    ring = labels.get(rollout.RING_LABEL, "?")
    summary = rollout.plan_summary(plan)
    selected = [n for n in nodes if _selector_matches(spec.get("nodeSelector"), rollout.labels_of(n))]
    done_label = f"plan.upgrade.cattle.io/{name}"
    states = []
    for node in selected:
        node_name = rollout.name_of(node)
        if summary["hash"] and rollout.labels_of(node).get(done_label) == summary["hash"]:
            states.append(rollout.NodeState(ring, node_name, "done"))
        else:
            states.append(rollout.job_state(ring, node_name, rollout.job_for(jobs, name, node_name)))
    done = sum(1 for s in states if s.state == "done")
    count = f"{done}/{len(states)} nodes done"
    failed = [s for s in states if s.state == "FAILED"]
    if failed:
        first = failed[0]
        return PlanRow(name, ring, version, "FAILED", f"{count}; {first.node}: {first.detail}",
                       problem=f"{name}: node {first.node} failed: {first.detail}")
    if rollout.plan_done(plan, version):
        return PlanRow(name, ring, version, "complete", count)
    blocking = [waited for waited in waited_plans(plan) if not rollout.plan_done(plans.get(waited), version)]
    started = [s for s in states if s.state == "updating"]
    if blocking:
        held = f"; jobs wait in prepare on {', '.join(s.node for s in started)}" if started else ""
        return PlanRow(name, ring, version, "waiting", f"for {rollout.describe_plan(blocking[0])}{held}; {count}")
    if started:
        doing = ", ".join(f"{s.node} ({s.detail.split(' running', 1)[-1].strip(' ()') or 'running'})"
                          for s in started)
        return PlanRow(name, ring, version, "updating", f"{doing}; {count}")
    return PlanRow(name, ring, version, "not started", count)


def report(nodes: Sequence[Mapping[str, Any]], plans: Sequence[Mapping[str, Any]],
           jobs: Sequence[Mapping[str, Any]]) -> Report:
    by_name = {p.get("metadata", {}).get("name", "?"): p for p in plans}
    plan_rows = [plan_row(plan, by_name, nodes, jobs) for plan in plans]
    plan_rows.sort(key=lambda row: (RING_ORDER.get(row.ring, 3), row.plan))
    servers_first = sorted(nodes, key=lambda n: (not rollout.is_server(n), rollout.name_of(n)))
    return Report([node_row(node) for node in servers_first], plan_rows)


NODE_HEADERS = ["NODE", "MACHINE", "ROLE", "STATUS", "OS VERSION", "SLOT", "UPDATE", "DATA", "GPU"]
PLAN_HEADERS = ["PLAN", "RING", "VERSION", "STATE", "DETAIL"]


def render(status: Report) -> str:
    rows = [[r.name, r.machine, r.role, r.ready, r.os_version, r.slot, r.update, r.data, r.gpu]
            for r in status.nodes]
    parts = ["nodes", console.format_table(NODE_HEADERS, rows) if rows else "(no nodes)"]
    if status.plans:
        parts += ["", "rollout", console.format_table(
            PLAN_HEADERS, [[r.plan, r.ring, r.version, r.state, r.detail] for r in status.plans])]
    else:
        parts += ["", "rollout: none in the cluster (no Plans made by ./task rollout)"]
    if status.problems:
        parts += ["", "problems"] + [f"  {problem}" for problem in status.problems]
    return "\n".join(parts)


# ---------------------------------------------------------------- the cluster


def read(kubectl: rollout.Kubectl) -> Report:
    try:
        nodes = rollout.kubectl_json(kubectl, "get", "nodes").get("items", [])
        plans = rollout.kubectl_json(kubectl, "-n", rollout.NAMESPACE, "get", "plans.upgrade.cattle.io", "-l",
                                     "app.kubernetes.io/managed-by=gpu-k8s-rollout").get("items", [])
        jobs = rollout.kubectl_json(kubectl, "-n", rollout.NAMESPACE, "get", "jobs", "-l",
                                    "upgrade.cattle.io/plan").get("items", [])
    except rollout.ClusterUnreachable as error:
        raise StatusError(f"cannot reach the cluster ({error}): point KUBECONFIG at it, or set GPU_K8S_KUBECTL; a "
                          "single server rebooting into an update is back within minutes") from None
    except rollout.RolloutError as error:
        text = str(error)
        if "plans.upgrade.cattle.io" in text and ("the server doesn't have a resource type" in text
                                                  or "notfound" in text.lower().replace(" ", "")):
            return report(nodes, [], [])
        raise StatusError(text) from None
    return report(nodes, plans, jobs)


def run_status(kubectl: rollout.Kubectl | None = None) -> Report:
    status = read(kubectl or rollout.run_kubectl)
    print(render(status))
    return status
