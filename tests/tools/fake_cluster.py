"""A simulated k3s cluster for the fleet tests: the API server's objects (Nodes, Plans, Jobs) in
one JSON file, one kubectl double for the build host and for every node, and
system-upgrade-controller v0.20.1 played one reconcile round at a time, with simulated boards
(tests/updater/fake_board.py, fake_tegra.py) as its nodes, running the real gpu-k8s-update.

What is modelled, from system-upgrade-controller v0.20.1 (pkg/upgrade/plan/plan.go,
handle_upgrade.go, handle_batch.go, job/job.go at f1362a3f) and Kubernetes:
- a Plan's status: latestVersion (spec.version with '+' as '-'), latestHash (sha224 of the
  version and the service account), the Complete condition and `applying`;
- node selection (SelectConcurrentNodes): the nodeSelector, kubernetes.io/hostname present, the
  plan.upgrade.cattle.io/<plan> label not at latestHash; nodes already applying first, then
  candidates ordered by sha256(node UID + plan UID + hash), up to `concurrency`;
- one Job per selected node (apply-<plan>-on-<node>-with-<hash>), backoffLimit 4 (the layer's
  SYSTEM_UPGRADE_JOB_BACKOFF_LIMIT); its pod runs prepare, then cordon or drain (as the Plan
  says) in one round, the upgrade container in the next; a pod killed by its node's reboot counts as a failure and
  the Job controller starts the next one; more failures than the backoff limit fail the Job
  (BackoffLimitExceeded), which SUC reports on the Plan (Complete False, JobFailed);
- a complete Job labels the node with the Plan's hash and uncordons it (postCompleteDelay is
  compressed to nothing);
- a rebooting node: NotReady until it is up; while servers are down the API server answers only
  if a majority of the servers is up (embedded etcd), so the only server's reboot takes it along:
  the host's kubectl is refused, the controller stops; when the server boots, its API server
  refuses its own gate's first calls while k3s starts;
- the node authorizer and NodeRestriction for a node's own kubectl calls (the kubelet's
  credential): it reads and patches only its own Node, may change annotations and labels outside
  kubernetes.io / k8s.io (save the kubelet's own), never node-restriction.kubernetes.io labels or
  taints, and cannot list nodes.
The prepare step's wait is decided by the updater's own `plans.plan_state` (what wait-plan asks);
the upgrade container runs the real `gpu-k8s-update` CLI against the node's simulated board, and
after a reboot the board's boot runs the real gate unit's command when its marker exists.

Single threaded by construction: the host's calls come one at a time from `./task`, and a tick
runs the nodes' agents one after another (their own kubectl calls nest inside it)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS.parent
for _path in (TESTS / "updater", REPO_ROOT / "updater" / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

NAMESPACE = "system-upgrade"
CONTROLLER = "system-upgrade-controller"
BACKOFF_LIMIT = 4  # the layer's SYSTEM_UPGRADE_JOB_BACKOFF_LIMIT
SERVER_LABEL = "node-role.kubernetes.io/control-plane"
HOSTNAME = "kubernetes.io/hostname"
REFUSED = "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?"
# Host looks (rollout/status snapshots) a rebooting node stays down for.
REBOOT_POLLS = 2
# Calls a booting server's API server refuses while k3s starts (its own gate's first probes).
SERVER_START_CALLS = 8
KUBELET_LABELS = {"kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
                  "beta.kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/instance-type",
                  "node.kubernetes.io/instance-type", "topology.kubernetes.io/region",
                  "topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
                  "failure-domain.beta.kubernetes.io/zone"}
KUBELET_PREFIXES = ("kubelet.kubernetes.io", "node.kubernetes.io")


# ---------------------------------------------------------------- labels and names


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def safe_concat_name(*parts: str) -> str:
    """wrangler's name.SafeConcatName: joined with '-', cut to 63 with a hash suffix."""
    full = "-".join(parts)
    if len(full) < 64:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:5]
    cut = 57 if full[56].isalnum() and (full[56].islower() or full[56].isdigit()) else 56
    return full[:cut] + "-" + digest


def plan_hash(plan: dict[str, Any]) -> str:
    """DigestStatus: sha224 over the latest version and the service account (no secrets here)."""
    digest = hashlib.sha224()
    digest.update(plan["status"]["latestVersion"].encode())
    digest.update(plan["spec"].get("serviceAccountName", "").encode())
    return digest.hexdigest()


def set_condition(obj: dict[str, Any], kind: str, status: str, reason: str = "", message: str = "") -> None:
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for condition in conditions:
        if condition["type"] == kind:
            condition.update(status=status, reason=reason, message=message)
            return
    conditions.append({"type": kind, "status": status, "reason": reason, "message": message})


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


# ---------------------------------------------------------------- the cluster (test side)


class Cluster:
    """Built by a test: nodes backed by simulated boards, then driven through ./task."""

    def __init__(self, root: Path, kubelet_url: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.state_file = root / "cluster.json"
        self.kubectl = root / "kubectl"
        self.kubectl.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                                "import fake_cluster\nsys.exit(fake_cluster.kubectl_main(sys.argv[1:]))\n")
        self.kubectl.chmod(0o755)
        self.kubelet_url = kubelet_url
        self.boards: dict[str, Any] = {}
        self.save({"tick": 0, "auto_tick": True, "nodes": {}, "plans": {}, "jobs": {}, "pods": {}, "logs": {},
                   "identities": {}, "env": {}, "broken": {}, "rebooting": {}, "start_refusals": {},
                   "events": [], "history": []})

    def load(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def save(self, state: dict[str, Any]) -> None:
        self.state_file.write_text(json.dumps(state, indent=1))

    def environment(self) -> dict[str, str]:
        """For the build host's ./task: this cluster's kubectl."""
        return {"GPU_K8S_KUBECTL": str(self.kubectl), "FLEET_SIM_STATE": str(self.state_file)}

    def add_node(self, name: str, board: Any, *, server: bool = False, canary: bool = False, arch: str = "arm64",
                 gate_timeout_s: float = 20.0) -> None:
        """A node running `board` (its Mender device type is the node's device-type label)."""
        if server:
            board.make_server()
        admin = board.root / "k3s.yaml"
        admin.write_text("apiVersion: v1\nkind: Config\n")
        env = board.environment(self.kubelet_url, {
            "GPU_K8S_UPDATE_KUBECTL_COMMAND": str(self.kubectl),
            "GPU_K8S_UPDATE_NODE_NAME": name,
            "GPU_K8S_UPDATE_KUBECONFIGS": ":".join(str(p) for p in ([admin] if server else []) + [board.kubeconfig]),
            "GPU_K8S_UPDATE_STATUS_KUBECONFIGS": str(board.kubeconfig),
            "GPU_K8S_UPDATE_GATE_TIMEOUT_S": str(gate_timeout_s),
            "GPU_K8S_UPDATE_UNREACHABLE_GRACE_S": "0.3",
            "FLEET_SIM_STATE": str(self.state_file),
        })
        labels = {HOSTNAME: name, "kubernetes.io/arch": arch, "kubernetes.io/os": "linux",
                  "update.gpu-k8s.io/device-type": board.device_type}
        if server:
            labels.update({SERVER_LABEL: "true", "node-role.kubernetes.io/master": "true"})
        if canary:
            labels["update.gpu-k8s.io/ring"] = "canary"
        state = self.load()
        state["nodes"][name] = {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), "labels": labels,
                         "annotations": {}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                       "capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"},
                       "nodeInfo": {"osImage": "meta-gpu-k8s", "architecture": arch,
                                    "kubeletVersion": "v1.36.4+k3s1"}},
            # what runs there besides DaemonSets: a drain moves it, a cordon leaves it
            "sim": {"workload": f"work-{name}", "server": server},
        }
        state["identities"][str(board.kubeconfig)] = f"system:node:{name}"
        state["identities"][str(admin)] = "admin"
        state["env"][name] = env
        self.save(state)
        self.boards[name] = board
        (self.root / "boards.pkl").write_bytes(pickle.dumps(self.boards))

    def break_release(self, name: str, release: str) -> None:
        """`release` boots on this node without its GPU: the device plugin never registers."""
        state = self.load()
        state["broken"].setdefault(name, []).append(release)
        self.save(state)

    def events(self, kind: str | None = None) -> list[list[Any]]:
        return [event for event in self.load()["events"] if kind is None or event[1] == kind]

    def first(self, kind: str, node: str) -> int:
        """The tick of the first event of this kind on this node (a KeyError if none)."""
        for tick, found, where, _ in self.load()["events"]:
            if found == kind and where == node:
                return tick
        raise KeyError(f"no {kind} event on {node}")


# ---------------------------------------------------------------- the kubectl double


def kubectl_main(argv: list[str]) -> int:
    path = Path(os.environ["FLEET_SIM_STATE"])
    state = json.loads(path.read_text())
    kubeconfig = None
    words: list[str] = []
    namespace = None
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--kubeconfig":
            kubeconfig, index = argv[index + 1], index + 2
            continue
        if word.startswith("--request-timeout"):
            index += 1
            continue
        if word == "-n":
            namespace, index = argv[index + 1], index + 2
            continue
        words.append(word)
        index += 1
    identity = state["identities"].get(kubeconfig, "admin") if kubeconfig else "admin"
    api = Api(path, state, identity)
    code = api.serve(words, namespace)
    api.store()
    return code


class Api:
    def __init__(self, path: Path, state: dict[str, Any], identity: str) -> None:
        self.path, self.state, self.identity = path, state, identity

    def store(self) -> None:
        self.path.write_text(json.dumps(self.state, indent=1))

    @property
    def node_name(self) -> str | None:
        return self.identity.removeprefix("system:node:") if self.identity.startswith("system:node:") else None

    def refused(self) -> bool:
        """No API server answers this caller right now: the servers' quorum is down, or this is a
        server's own agent while its k3s is still starting."""
        caller = os.environ.get("FLEET_SIM_NODE")
        if caller and self.state["start_refusals"].get(caller):
            self.state["start_refusals"][caller] -= 1
            return True
        return not api_up(self.state)

    def serve(self, words: list[str], namespace: str | None) -> int:
        host = "FLEET_SIM_NODE" not in os.environ
        if host and words[:2] == ["get", "plans.upgrade.cattle.io"] and "-l" in words and self.state["auto_tick"]:
            self.state = tick(self.path, self.state)
        if self.refused():
            print(REFUSED, file=sys.stderr)
            return 1
        words = [w for w in words if w not in ("-o", "json")]
        verb, kind = (words + ["", ""])[:2]
        if verb == "get" and kind == "crd":
            print("customresourcedefinition.apiextensions.k8s.io/plans.upgrade.cattle.io")
            return 0
        if verb == "get" and kind in ("nodes", "node"):
            return self.get_nodes(words[2:])
        if verb == "patch" and kind == "node":
            return self.patch_node(words[2], words[words.index("-p") + 1])
        if verb == "get" and kind == "plans.upgrade.cattle.io":
            return self.get_named(self.state["plans"], words[2:], "plans.upgrade.cattle.io")
        if verb == "get" and kind == "jobs":
            return self.get_named(self.state["jobs"], words[2:], "jobs.batch")
        if verb == "apply":
            return self.apply(sys.stdin.read())
        if verb == "logs":
            name = words[1].split("/", 1)[1]
            tail = int(words[words.index("--tail") + 1]) if "--tail" in words else 20
            print("\n".join(self.state["logs"].get(name, "").splitlines()[-tail:]))
            return 0
        print("fake kubectl: unexpected " + " ".join(words), file=sys.stderr)
        return 3

    def forbidden(self, message: str) -> int:
        print(f'Error from server (Forbidden): {message}', file=sys.stderr)
        return 1

    def get_nodes(self, rest: list[str]) -> int:
        nodes = self.state["nodes"]
        public = {name: public_object(node) for name, node in nodes.items()}
        if rest and not rest[0].startswith("-"):
            name = rest[0]
            if self.node_name is not None and name != self.node_name:
                return self.forbidden(f'nodes "{name}" is forbidden: User "{self.identity}" cannot get resource '
                                      f'"nodes" in API group "" at the cluster scope: node \'{self.node_name}\' '
                                      f"cannot read '{name}', only its own Node object")
            if name not in public:
                print(f'Error from server (NotFound): nodes "{name}" not found', file=sys.stderr)
                return 1
            print(json.dumps(public[name]))
            return 0
        if self.node_name is not None:
            return self.forbidden(f'nodes is forbidden: User "{self.identity}" cannot list resource "nodes" in API '
                                  f"group \"\" at the cluster scope: node '{self.node_name}' cannot read all nodes, "
                                  "only its own Node object")
        print(json.dumps({"kind": "List", "items": [public[name] for name in sorted(public)]}))
        return 0

    def patch_node(self, name: str, body: str) -> int:
        node = self.state["nodes"].get(name)
        if node is None:
            print(f'Error from server (NotFound): nodes "{name}" not found', file=sys.stderr)
            return 1
        patch = json.loads(body)
        metadata = patch.get("metadata") or {}
        if self.node_name is not None:  # the node authorizer, then NodeRestriction
            if name != self.node_name:
                return self.forbidden(f'nodes "{name}" is forbidden: node "{self.node_name}" is not allowed to '
                                      f'modify node "{name}"')
            if "taints" in (patch.get("spec") or {}):
                return self.forbidden(f'nodes "{name}" is forbidden: node "{name}" is not allowed to modify taints')
            bad = sorted(key for key in (metadata.get("labels") or {}) if forbidden_label(key))
            if bad:
                return self.forbidden(f'nodes "{name}" is forbidden: is not allowed to modify labels: {", ".join(bad)}')
        for field in ("annotations", "labels"):
            for key, value in (metadata.get(field) or {}).items():
                if value is None:
                    node["metadata"][field].pop(key, None)
                else:
                    node["metadata"][field][key] = value
        print(f"node/{name} patched")
        return 0

    def get_named(self, objects: dict[str, Any], rest: list[str], resource: str) -> int:
        if self.node_name is not None:
            return self.forbidden(f'{resource} is forbidden: User "{self.identity}" cannot list resource')
        if rest and not rest[0].startswith("-"):
            found = objects.get(rest[0])
            if found is None:
                print(f'Error from server (NotFound): {resource} "{rest[0]}" not found', file=sys.stderr)
                return 1
            print(json.dumps(public_object(found)))
            return 0
        items = list(objects.values())
        if "-l" in rest:
            wanted = rest[rest.index("-l") + 1]
            key, sep, value = wanted.partition("=")
            items = [o for o in items if key in (o["metadata"].get("labels") or {})
                     and (not sep or o["metadata"]["labels"][key] == value)]
        print(json.dumps({"kind": "List", "items": [public_object(o) for o in items]}))
        return 0

    def apply(self, manifest: str) -> int:
        import yaml  # only the host applies, and its Python has PyYAML (the tools' venv)

        for document in yaml.safe_load_all(manifest):
            if not document:
                continue
            if document.get("kind") != "Plan":
                print(f"fake kubectl: cannot apply {document.get('kind')}", file=sys.stderr)
                return 1
            name = document["metadata"]["name"]
            existing = self.state["plans"].get(name)
            if existing is None:
                document["metadata"]["uid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
                document["status"] = {}
                self.state["plans"][name] = document
                print(f"plan.upgrade.cattle.io/{name} created")
            else:
                existing["spec"] = document["spec"]
                existing["metadata"]["labels"] = document["metadata"].get("labels", {})
                existing["metadata"]["annotations"] = document["metadata"].get("annotations", {})
                print(f"plan.upgrade.cattle.io/{name} configured")
        return 0


def public_object(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key != "sim"}


def forbidden_label(key: str) -> bool:
    """NodeRestriction's getForbiddenLabels for one label key."""
    namespace = key.split("/", 1)[0] if "/" in key else ""
    if namespace == "node-restriction.kubernetes.io" or namespace.endswith(".node-restriction.kubernetes.io"):
        return True
    kubernetes = namespace in ("kubernetes.io", "k8s.io") or namespace.endswith((".kubernetes.io", ".k8s.io"))
    kubelet = key in KUBELET_LABELS or namespace in KUBELET_PREFIXES or namespace.endswith(
        tuple("." + prefix for prefix in KUBELET_PREFIXES))
    return kubernetes and not kubelet


def api_up(state: dict[str, Any]) -> bool:
    """Embedded etcd answers while a majority of the servers is up."""
    servers = [name for name, node in state["nodes"].items() if node["sim"]["server"]]
    if not servers:
        return True
    up = [name for name in servers if name not in state["rebooting"]]
    return 2 * len(up) > len(servers)


# ---------------------------------------------------------------- the controller and the nodes


def event(state: dict[str, Any], kind: str, node: str, detail: str = "") -> None:
    state["events"].append([state["tick"], kind, node, detail])


def tick(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """One round: rebooting nodes come up when due; while the API server answers, the
    controller reconciles every Plan and each Job's pod takes one step."""
    state["tick"] += 1
    boards = pickle.loads((path.parent / "boards.pkl").read_bytes())
    for name in sorted(state["rebooting"]):
        state["rebooting"][name] -= 1
        if state["rebooting"][name] <= 0:
            del state["rebooting"][name]
            state = boot(path, state, boards, name)
    if api_up(state):
        reconcile_plans(state)
        for job_name in sorted(state["jobs"]):
            job = state["jobs"][job_name]
            if condition(job, "Complete") or condition(job, "Failed"):
                continue
            node = job["metadata"]["labels"]["upgrade.cattle.io/node"]
            if node in state["rebooting"]:
                continue
            state = run_pod(path, state, boards, job_name)
            if not api_up(state):
                break  # the controller went down with its server
        if api_up(state):
            handle_jobs(state)
            reconcile_plans(state)
    state["history"].append({"tick": state["tick"], "api_up": api_up(state),
                             **{kind: copy.deepcopy(state[kind]) for kind in ("nodes", "plans", "jobs")}})
    return state


def reconcile_plans(state: dict[str, Any]) -> None:
    for plan in state["plans"].values():
        status = plan["status"]
        status["latestVersion"] = plan["spec"]["version"].replace("+", "-")
        status["latestHash"] = plan_hash(plan)
        set_condition(plan, "LatestResolved", "True", "Version")
        set_condition(plan, "Validated", "True", "PlanIsValid")
        chosen = select_nodes(state, plan)
        names = [node["metadata"]["labels"][HOSTNAME] for node in chosen]
        for node in chosen:
            name = safe_concat_name("apply", plan["metadata"]["name"], "on", node["metadata"]["name"].split(".")[0],
                                    "with", status["latestHash"])
            if name not in state["jobs"]:
                create_job(state, plan, node, name)
        if names:
            if status.get("applying") != names:
                status["applying"] = names
                set_condition(plan, "Complete", "False", "SyncJob")
        else:
            status["applying"] = None
            set_condition(plan, "Complete", "True", "Complete")


def select_nodes(state: dict[str, Any], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """SelectConcurrentNodes."""
    latest = plan["status"]["latestHash"]
    done_label = f"plan.upgrade.cattle.io/{plan['metadata']['name']}"

    def wanted(node: dict[str, Any]) -> bool:
        labels = node["metadata"]["labels"]
        return (selector_matches(plan["spec"].get("nodeSelector"), labels) and HOSTNAME in labels
                and labels.get(done_label) not in ("disabled", latest))

    applying = plan["status"].get("applying") or []
    selected = [n for n in state["nodes"].values() if wanted(n) and n["metadata"]["labels"][HOSTNAME] in applying]
    if len(selected) < plan["spec"].get("concurrency", 1):
        candidates = [n for n in state["nodes"].values()
                      if wanted(n) and n["metadata"]["labels"][HOSTNAME] not in applying]
        candidates.sort(key=lambda n: hashlib.sha256(
            (n["metadata"]["uid"] + plan["metadata"]["uid"] + latest).encode()).hexdigest())
        selected += candidates[:plan["spec"].get("concurrency", 1) - len(selected)]
    return sorted(selected, key=lambda n: n["metadata"]["name"])


def create_job(state: dict[str, Any], plan: dict[str, Any], node: dict[str, Any], name: str) -> None:
    labels = {"upgrade.cattle.io/controller": CONTROLLER, "upgrade.cattle.io/node": node["metadata"]["name"],
              "upgrade.cattle.io/plan": plan["metadata"]["name"],
              "upgrade.cattle.io/version": plan["status"]["latestVersion"],
              f"plan.upgrade.cattle.io/{plan['metadata']['name']}": plan["status"]["latestHash"]}
    labels.update({k: v for k, v in (plan["metadata"].get("labels") or {}).items() if "cattle.io/" not in k})
    state["jobs"][name] = {
        "kind": "Job", "apiVersion": "batch/v1",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                     "creationTimestamp": f"2026-11-23T22:{state['tick'] // 60:02d}:{state['tick'] % 60:02d}Z"},
        "spec": {"backoffLimit": BACKOFF_LIMIT,
                 "activeDeadlineSeconds": plan["spec"].get("jobActiveDeadlineSecs")},
        "status": {"active": 1, "failed": 0},
        "sim": {"started": False},
    }
    event(state, "job", node["metadata"]["name"], plan["metadata"]["name"])


def prepare_done(state: dict[str, Any], prepare: dict[str, Any] | None) -> bool:
    """The prepare container: `gpu-k8s-update wait-plan --plan P ... --version V`, decided by the
    updater's own plan_state for each Plan in turn."""
    if not prepare:
        return True
    from gpu_k8s_update import plans

    args = prepare.get("args") or []
    version = args[args.index("--version") + 1]
    waited = [args[i + 1] for i, word in enumerate(args) if word == "--plan"]
    return all(name in state["plans"] and plans.plan_state(state["plans"][name], version)[0] for name in waited)


def run_pod(path: Path, state: dict[str, Any], boards: dict[str, Any], job_name: str) -> dict[str, Any]:
    job = state["jobs"][job_name]
    plan = state["plans"][job["metadata"]["labels"]["upgrade.cattle.io/plan"]]
    name = job["metadata"]["labels"]["upgrade.cattle.io/node"]
    node = state["nodes"][name]
    spec = plan["spec"]
    if not job["sim"]["started"]:
        # this round the pod's init containers run: prepare (waits), then cordon or drain
        if not prepare_done(state, spec.get("prepare")):
            return state
        job["sim"]["started"] = True
    else:
        # the next round its upgrade container runs (minutes pass in between on a real node)
        return run_upgrade_container(path, state, job_name)
    if spec.get("drain"):
        if not node["spec"].get("unschedulable") or node["sim"].get("workload"):
            event(state, "drain", name, node["sim"].get("workload") or "")
        node["spec"]["unschedulable"] = True
        node["sim"]["workload"] = None  # evicted: it waits for another node
    elif spec.get("cordon"):
        if not node["spec"].get("unschedulable"):
            event(state, "cordon", name)
        node["spec"]["unschedulable"] = True
    return state


def run_upgrade_container(path: Path, state: dict[str, Any], job_name: str) -> dict[str, Any]:
    job = state["jobs"][job_name]
    plan = state["plans"][job["metadata"]["labels"]["upgrade.cattle.io/plan"]]
    name = job["metadata"]["labels"]["upgrade.cattle.io/node"]
    spec = plan["spec"]
    command = spec["upgrade"]["command"]
    assert command[:3] == ["chroot", "/host", "gpu-k8s-update"], command
    env = {**state["env"][name], "SYSTEM_UPGRADE_NODE_NAME": name, "FLEET_SIM_NODE": name,
           "SYSTEM_UPGRADE_PLAN_NAME": plan["metadata"]["name"]}
    arguments = [*command[3:], *spec["upgrade"]["args"]]
    event(state, "pod", name, " ".join(arguments))
    state = run_agent(path, state, env, arguments, job_name)
    code = state.pop("_last_code")
    job, node = state["jobs"][job_name], state["nodes"][name]  # the state was read back
    if code == 0:
        job["status"] = {"succeeded": 1, "failed": job["status"]["failed"]}
        set_condition(job, "Complete", "True")
        event(state, "job-complete", name, plan["metadata"]["name"])
        return state
    job["status"]["failed"] += 1
    job["sim"]["started"] = False  # the Job controller's next pod starts from its init containers
    if code == -9:  # killed by its own node's reboot: ContainerStatusUnknown
        event(state, "reboot", name, plan["metadata"]["name"])
        node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
        state["rebooting"][name] = REBOOT_POLLS
    else:
        event(state, "pod-failed", name, f"exit {code}")
    if job["status"]["failed"] > job["spec"]["backoffLimit"]:
        job["status"].pop("active", None)
        set_condition(job, "Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        event(state, "job-failed", name, plan["metadata"]["name"])
    return state


def run_agent(path: Path, state: dict[str, Any], env: dict[str, str], arguments: list[str],
              log_to: str | None = None) -> dict[str, Any]:
    """Run gpu-k8s-update as the node would; its kubectl calls come back here nested."""
    path.write_text(json.dumps(state, indent=1))
    result = subprocess.run([sys.executable, "-m", "gpu_k8s_update", *arguments], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    state = json.loads(path.read_text())
    if log_to:
        state["logs"][log_to] = result.stderr
    state["_last_code"] = result.returncode
    return state


def boot(path: Path, state: dict[str, Any], boards: dict[str, Any], name: str) -> dict[str, Any]:
    """The node comes up: firmware and bootloader pick the slot, the kubelet and the device
    plugin start, and the gate unit runs when the agent's marker exists (its rollback reboots
    the node once more, into the old slot, which runs the gate again)."""
    board = boards[name]
    node = state["nodes"][name]
    for _ in range(4):
        board.power_cycle()
        release = board.running
        healthy = release not in state["broken"].get(name, [])
        board.register_plugin(gpus=1 if healthy else 0)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        node["status"]["allocatable"]["nvidia.com/gpu"] = "1" if healthy else "0"
        event(state, "boot", name, release)
        if node["sim"]["server"]:
            state["start_refusals"][name] = SERVER_START_CALLS
        if not (board.data / "marker.json").exists():
            return state
        state = run_agent(path, state, {**state["env"][name], "FLEET_SIM_NODE": name}, ["gate"])
        code = state.pop("_last_code")
        state["start_refusals"].pop(name, None)
        node = state["nodes"][name]
        verdict = json.loads((board.data / "gate-result.json").read_text()) if (
            board.data / "gate-result.json").exists() else {}
        event(state, "gate", name, f"exit {code}: {verdict.get('outcome', '-')}: {verdict.get('reason', '')}")
        if code != -9:
            return state
    raise AssertionError(f"{name} kept rebooting")


def handle_jobs(state: dict[str, Any]) -> None:
    """handleJobs: a failed Job marks its Plan; a complete one labels and uncordons its node."""
    for job in state["jobs"].values():
        plan = state["plans"].get(job["metadata"]["labels"]["upgrade.cattle.io/plan"])
        if plan is None:
            continue
        node = state["nodes"][job["metadata"]["labels"]["upgrade.cattle.io/node"]]
        if condition(job, "Failed"):
            failed = condition(job, "Failed") or {}
            set_condition(plan, "Complete", "False", "JobFailed",
                          f"Job {NAMESPACE}/{job['metadata']['name']} failed on Node {node['metadata']['name']}: "
                          f"{failed.get('reason')}: {failed.get('message')}")
        elif condition(job, "Complete"):
            label = f"plan.upgrade.cattle.io/{plan['metadata']['name']}"
            wanted = job["metadata"]["labels"][label]
            if node["metadata"]["labels"].get(label) != wanted:
                node["metadata"]["labels"][label] = wanted
                if node["spec"].get("unschedulable") and (plan["spec"].get("cordon") or plan["spec"].get("drain")):
                    node["spec"]["unschedulable"] = False
                    event(state, "uncordon", node["metadata"]["name"])
