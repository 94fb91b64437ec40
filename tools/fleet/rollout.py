"""`rollout`: roll an OS release over the fleet with system-upgrade-controller (v0.20.1).

Rings, each a Plan rendered from templates/rollout/plan.yaml.j2, as k3s's own upgrade guidance
orders them: first the `server` ring (one Plan for every k3s server of every device type in the
release, one node at a time, cordoned but not drained: a server's pods, CoreDNS and the
controller itself among them, have nowhere else to go in a small cluster, and its reboot takes
the API server with it), then per device type (the Mender device type each image labels its
node with, update.gpu-k8s.io/device-type) a `canary` ring (agents labelled
update.gpu-k8s.io/ring=canary, one at a time) and a `fleet` ring (every other agent). An agent
ring's prepare step waits until the rings before it completed this version. Every job runs
`chroot /host gpu-k8s-update upgrade --artifact TYPE=URL ...`: the node installs the artifact
of its own device type only (the server ring spans device types), and succeeds only after the
new slot passed its health gate; a node that rolled back fails its job, and the rollout stops
there. No node is ever cordoned for an artifact it cannot install: every Plan selects only the
device types it carries artifacts for."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from tools import console
from tools.fleet.version import version_problem
from tools.usage import UsageError

TEMPLATES = Path(__file__).resolve().parent / "templates" / "rollout"
NAMESPACE = "system-upgrade"
RING_LABEL = "update.gpu-k8s.io/ring"
# Written by every image (gpu-k8s-k3s-config, GPU_K8S_UPDATE_DEVICE_TYPE): the Mender device
# type its artifacts must name.
DEVICE_TYPE_LABEL = "update.gpu-k8s.io/device-type"
# k3s labels its servers (control-plane nodes) with it, value "true"; agents carry none.
SERVER_LABEL = "node-role.kubernetes.io/control-plane"
UPGRADE_IMAGE = "localhost/gpu-k8s-upgrade:latest"
RINGS = ("server", "canary", "fleet", "all")
PLAN_PREFIX = "gpu-k8s-os-"
SERVER_PLAN = PLAN_PREFIX + "server"
# One server: download, write the other slot, reboot (the API server with it), gate (15 min).
SERVER_DEADLINE_S = 3600
# A canary job starts at once and waits in prepare for the server ring, then fits a Nano: drain
# (10 min at most), download + write a GB rootfs to SD, reboot, gate (15 min).
CANARY_DEADLINE_S = 3 * 3600
# The fleet ring's jobs start at once and wait in prepare for the servers and the canaries.
FLEET_DEADLINE_S = 6 * 3600
# How long `follow` waits for an API server that stopped answering (a server rebooting into its
# update) before it leaves the rollout to the cluster.
API_OUTAGE_LIMIT_S = 30 * 60
DRAIN_TIMEOUT = "10m"
POST_COMPLETE_DELAY = "2m"
FOLLOW_INTERVAL_S = 15.0
# In the prepare container (busybox): hand the service account through chroot, which hides it.
PREPARE_SCRIPT = (
    "sa=/var/run/secrets/kubernetes.io/serviceaccount; "
    'export GPU_K8S_UPDATE_API_TOKEN="$(cat $sa/token)" GPU_K8S_UPDATE_API_CA="$(cat $sa/ca.crt)"; '
    'exec chroot /host gpu-k8s-update wait-plan "$@"'
)

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
# Plan names hold the device type and SUC makes label keys of them: a DNS label, 63 at most.
_DEVICE_TYPE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,43}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class RolloutError(Exception):
    """The rollout cannot go ahead or stopped; the message names the problem and the fix."""


class RolloutUsageError(RolloutError, UsageError):
    """An option value or combination no cluster could take."""


class ClusterUnreachable(RolloutError):
    """No API server answered kubectl (as opposed to one answering with an error)."""


@dataclass(frozen=True)
class Artifact:
    device_type: str  # the Mender device type the artifact installs on
    url: str


@dataclass(frozen=True)
class RolloutOptions:
    version: str
    artifacts: tuple[Artifact, ...]
    ring: str = "all"
    concurrency: int = 1
    selector: str | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class Ring:
    name: str  # server, canary or fleet
    concurrency: int
    deadline_s: int
    # server: every artifact of the rollout (each server picks its own type's); otherwise one
    artifacts: tuple[Artifact, ...]
    waits_for: tuple[str, ...] = ()  # Plans that must complete this version before a node starts

    @property
    def is_server(self) -> bool:
        return self.name == "server"

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(artifact.device_type for artifact in self.artifacts)

    @property
    def device_type(self) -> str:
        """An agent ring's one device type ('' for the server ring, which spans them)."""
        return "" if self.is_server else self.artifacts[0].device_type

    @property
    def plan_name(self) -> str:
        return SERVER_PLAN if self.is_server else f"{PLAN_PREFIX}{self.name}-{self.device_type}"


def plan_name(ring: str, device_type: str = "") -> str:
    return SERVER_PLAN if ring == "server" else f"{PLAN_PREFIX}{ring}-{device_type}"


def describe_plan(name: str) -> str:
    """'the server ring', 'the canary ring of jetson-nano-devkit'."""
    if name == SERVER_PLAN:
        return "the server ring"
    ring, _, device_type = name.removeprefix(PLAN_PREFIX).partition("-")
    return f"the {ring} ring of {device_type}"


# ---------------------------------------------------------------- input


def parse_selector(selector: str | None) -> list[tuple[str, str]]:
    if not selector:
        return []
    key, sep, value = selector.partition("=")
    prefix, slash, name = key.rpartition("/")
    valid_key = bool(_LABEL_NAME.match(name)) and (not slash or (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)))
    if not sep or not valid_key or not _LABEL_NAME.match(value):
        raise RolloutUsageError(
            f"--selector {selector!r} is not KEY=VALUE with a Kubernetes label key and value "
            "(e.g. --selector site=lab-2)"
        )
    if key == RING_LABEL:
        raise RolloutUsageError(f"--selector cannot use {RING_LABEL}: that label picks the ring; use --ring")
    return [(key, value)]


def validate(options: RolloutOptions) -> None:
    """Every check that needs no cluster; one line naming the problem and the fix."""
    problem = version_problem(options.version)
    if problem:
        raise RolloutUsageError(f"--version {problem}")
    if not options.artifacts:
        raise RolloutUsageError("no artifact to roll out: give --artifact-url URL --device-type TYPE, or --release DIR "
                           "--base-url URL")
    for artifact in options.artifacts:
        check_artifact(artifact)
    types = [artifact.device_type for artifact in options.artifacts]
    if len(set(types)) != len(types):
        raise RolloutUsageError(f"two artifacts for one device type ({', '.join(sorted(types))}): give one per type")
    if options.ring not in RINGS:
        raise RolloutUsageError(f"--ring must be one of {', '.join(RINGS)}, got {options.ring!r}")
    if options.concurrency < 1:
        raise RolloutUsageError(f"--concurrency must be 1 or more, got {options.concurrency}")
    parse_selector(options.selector)


def check_artifact(artifact: Artifact) -> None:
    url = urllib.parse.urlparse(artifact.url)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise RolloutUsageError(
            f"--artifact-url {artifact.url!r} must be an http(s) URL every node can reach, "
            "e.g. http://updates.lan/1.4.0/gpu-k8s-image-jetson-nano-devkit.mender (see ./task release)"
        )
    if not _DEVICE_TYPE.match(artifact.device_type):
        raise RolloutUsageError(
            f"device type {artifact.device_type!r} must be 1-45 lower-case letters, digits or '-' (it names "
            "the Plans), e.g. jetson-nano-devkit"
        )


def rings(options: RolloutOptions) -> list[Ring]:
    """The rings to apply, in order. The server ring and each canary ring update one node at a
    time whatever --concurrency says: the first failure must stop everything. `--ring canary`
    brings the server ring too (it must come first; a server already on this version is done at
    once); `--ring fleet` only the fleet rings, after the rest completed."""
    server = Ring("server", 1, SERVER_DEADLINE_S, options.artifacts)
    canaries = [Ring("canary", 1, CANARY_DEADLINE_S, (artifact,), (SERVER_PLAN,)) for artifact in options.artifacts]
    fleets = [Ring("fleet", options.concurrency, FLEET_DEADLINE_S, (artifact,),
                   (SERVER_PLAN, plan_name("canary", artifact.device_type))) for artifact in options.artifacts]
    return {"server": [server], "canary": [server, *canaries], "fleet": fleets,
            "all": [server, *canaries, *fleets]}[options.ring]


def labels_of(node: Mapping[str, Any]) -> Mapping[str, str]:
    return node.get("metadata", {}).get("labels") or {}


def device_type_of(node: Mapping[str, Any]) -> str:
    return labels_of(node).get(DEVICE_TYPE_LABEL, "")


def is_server(node: Mapping[str, Any]) -> bool:
    return labels_of(node).get(SERVER_LABEL) == "true"


def name_of(node: Mapping[str, Any]) -> str:
    return str(node.get("metadata", {}).get("name", "?"))


def check_base_url(base_url: str) -> str:
    """--base-url as the nodes will use it: an http(s) URL ending in '/'."""
    url = urllib.parse.urlparse(base_url)
    if url.scheme not in ("http", "https") or not url.netloc:
        guess = "http://" + base_url.split("://", 1)[-1].lstrip("/")
        raise RolloutUsageError(
            f"--base-url {base_url!r} must be an http(s) URL the nodes can reach, with its scheme: e.g. "
            f"{guess.rstrip('/')}/ (where ./task release's directory is served)"
        )
    return base_url if base_url.endswith("/") else base_url + "/"


def artifacts_from_release(release_dir: Path, base_url: str, version: str) -> tuple[Artifact, ...]:
    """One artifact per device type from a `./task release` directory (release.json), served
    from base_url."""
    base = check_base_url(base_url)
    manifest = release_dir / "release.json"
    try:
        release = json.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RolloutError(f"--release {release_dir}: no release.json there (make it with ./task release)") from None
    except (OSError, ValueError) as error:
        raise RolloutError(f"--release {release_dir}: cannot read release.json ({error})") from None
    if release.get("version") != version:
        raise RolloutUsageError(f"{manifest} is release {release.get('version')!r}, not --version {version}")
    found = []
    for entry in release.get("artifacts") or []:
        for device_type in entry.get("device_types") or []:
            found.append(Artifact(device_type, urllib.parse.urljoin(base, urllib.parse.quote(entry["file"]))))
    return tuple(found)


def device_types_from_releases(artifact_url: str, version: str, releases: Path) -> list[str]:
    """The device types ./task release recorded for the artifact file this URL names."""
    name = Path(urllib.parse.urlparse(artifact_url).path).name
    try:
        release = json.loads((releases / version / "release.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    for entry in release.get("artifacts") or []:
        if entry.get("file") == name:
            return list(entry.get("device_types") or [])
    return []


def resolve_artifacts(
    version: str,
    artifact_url: str | None,
    device_type: str | None,
    release_dir: Path | None,
    base_url: str | None,
    releases: Path,
) -> tuple[Artifact, ...]:
    """The task's artifact options, as one Artifact per device type."""
    if release_dir is not None:
        if artifact_url or device_type:
            raise RolloutUsageError("give either --release DIR --base-url URL, or --artifact-url URL, not both")
        if not base_url:
            raise RolloutUsageError(f"--release {release_dir} needs --base-url: where the nodes download its files, "
                               "e.g. http://updates.lan:8080/")
        return artifacts_from_release(release_dir, base_url, version)
    if not artifact_url:
        raise RolloutUsageError("missing --artifact-url URL (with --device-type TYPE), or --release DIR --base-url URL")
    if device_type:
        return (Artifact(device_type, artifact_url),)
    types = device_types_from_releases(artifact_url, version, releases)
    if not types:
        raise RolloutUsageError(
            f"which device type does {artifact_url} install on? pass --device-type (e.g. jetson-nano-devkit; "
            f"the node label {DEVICE_TYPE_LABEL}), or roll out a whole release with --release DIR --base-url URL"
        )
    return tuple(Artifact(device_type, artifact_url) for device_type in types)


# ---------------------------------------------------------------- rendering


def render_plans(options: RolloutOptions) -> str:
    validate(options)
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML; values are quoted with tojson in the template
    )
    template = environment.get_template("plan.yaml.j2")
    documents = [
        template.render(
            ring=ring,
            namespace=NAMESPACE,
            ring_label=RING_LABEL,
            device_type_label=DEVICE_TYPE_LABEL,
            server_label=SERVER_LABEL,
            artifacts_annotation=json.dumps({a.device_type: a.url for a in ring.artifacts}, sort_keys=True),
            waits_for=[describe_plan(name) for name in ring.waits_for],
            version=options.version,
            selector=parse_selector(options.selector),
            image=UPGRADE_IMAGE,
            prepare_script=PREPARE_SCRIPT,
            drain_timeout=DRAIN_TIMEOUT,
            post_complete_delay=POST_COMPLETE_DELAY,
        ).strip()
        for ring in rings(options)
    ]
    return "---\n" + "\n---\n".join(documents) + "\n"


# ---------------------------------------------------------------- the cluster


Kubectl = Callable[[Sequence[str], str | None], "subprocess.CompletedProcess[str]"]


def kubectl_command() -> list[str]:
    return shlex.split(os.environ.get("GPU_K8S_KUBECTL", "kubectl"))


def run_kubectl(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [*kubectl_command(), *args]
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise RolloutError(
            f"{argv[0]} not found: install kubectl, or set GPU_K8S_KUBECTL (e.g. 'k3s kubectl')"
        ) from None
    except subprocess.TimeoutExpired:
        raise ClusterUnreachable(f"{shlex.join(argv)} did not answer within 120 s: is the cluster reachable?") from None


def kubectl_json(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    result = kubectl([*args, "-o", "json"], None)
    if result.returncode != 0:
        message = f"kubectl {' '.join(args)} failed: {last_line(result.stderr)}"
        raise ClusterUnreachable(message) if cluster_unreachable(result.stderr) else RolloutError(message)
    return json.loads(result.stdout)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


# kubectl's words when no API server answered (as opposed to one answering with an error).
_UNREACHABLE = ("connection to the server", "unable to connect to the server", "connection refused", "i/o timeout",
                "no route to host", "no such host", "tls handshake timeout", "context deadline exceeded")


def cluster_unreachable(message: str) -> bool:
    text = message.lower()
    return any(sign in text for sign in _UNREACHABLE)


def crd_failure(stderr: str) -> str:
    """What kubectl's failure to read the Plan CRD means, with the fix: only a NotFound from
    the API server says the controller is missing."""
    said = last_line(stderr)
    text = stderr.lower()
    if cluster_unreachable(stderr):
        return (f"cannot reach the cluster ({said}): point KUBECONFIG at it, or set GPU_K8S_KUBECTL (e.g. "
                "'k3s kubectl' on a server node)")
    if "unauthorized" in text or "must be logged in" in text:
        return (f"the cluster refused kubectl's credentials ({said}): use a current kubeconfig (a k3s server's "
                "/etc/rancher/k3s/k3s.yaml, its server address changed to one this host reaches) in KUBECONFIG")
    if "forbidden" in text:
        return (f"kubectl's user may not read the cluster's CRDs ({said}): a rollout creates Plans and follows "
                "nodes and jobs, so use a cluster-admin kubeconfig (a k3s server's /etc/rancher/k3s/k3s.yaml)")
    if "(notfound)" in text or "not found" in text:
        return ("system-upgrade-controller is not installed in this cluster (no plans.upgrade.cattle.io CRD): it "
                f"ships with the image's k3s server manifests; is this the fleet's server? ({said})")
    return f"kubectl get crd plans.upgrade.cattle.io failed: {said}"


def selected_nodes(options: RolloutOptions, nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    selector = parse_selector(options.selector)
    return [node for node in nodes if all(labels_of(node).get(k) == v for k, v in selector)]


def preflight(options: RolloutOptions, kubectl: Kubectl) -> tuple[list[str], list[str]]:
    """Refuse before applying anything when the rollout could not work or would touch a
    node that cannot install its artifact. Returns (notes about nodes left out, what the
    control plane does meanwhile)."""
    crd = kubectl(["get", "crd", "plans.upgrade.cattle.io"], None)
    if crd.returncode != 0:
        raise RolloutError(crd_failure(crd.stderr))
    every_node = kubectl_json(kubectl, "get", "nodes").get("items", [])
    nodes = selected_nodes(options, every_node)
    by_type: dict[str, list[Mapping[str, Any]]] = {}
    for item in nodes:
        by_type.setdefault(device_type_of(item), []).append(item)
    present = ", ".join(f"{kind or '(no label)'} ({len(items)})" for kind, items in sorted(by_type.items())) or "none"
    for artifact in options.artifacts:
        if artifact.device_type not in by_type:
            raise RolloutError(
                f"no selected node has device type {artifact.device_type} (label {DEVICE_TYPE_LABEL}), so "
                f"{artifact.url} fits no node; the selected nodes' device types: {present}"
            )
    wanted = {artifact.device_type for artifact in options.artifacts}
    agents = {kind: [n for n in items if not is_server(n)] for kind, items in by_type.items()}
    if options.ring in ("canary", "all"):
        for device_type in sorted(wanted):
            if not agents[device_type]:
                continue  # only servers of this type: the server ring is their canary
            canaries = [n for n in agents[device_type] if labels_of(n).get(RING_LABEL) == "canary"]
            if not canaries:
                names = ", ".join(name_of(n) for n in agents[device_type][:3])
                raise RolloutError(
                    f"no agent of device type {device_type} is labelled {RING_LABEL}=canary: label one or two "
                    f"first (kubectl label node NAME {RING_LABEL}=canary; e.g. one of {names})"
                )
    if options.ring == "fleet":
        _refuse_unless_complete(options, kubectl, SERVER_PLAN, "the server ring")
        for device_type in sorted(wanted):
            if agents[device_type]:
                _refuse_unless_complete(options, kubectl, plan_name("canary", device_type),
                                        f"the canary ring of {device_type}")
    notes = []
    for device_type, items in sorted(by_type.items()):
        if device_type not in wanted:
            names = ", ".join(name_of(n) for n in items)
            why = (f"they carry no {DEVICE_TYPE_LABEL} label (an image from before it; label them by hand if "
                   "you know their type)" if not device_type else f"this release has no {device_type} artifact")
            notes.append(f"left alone: {names}: {why}")
    if options.ring == "fleet":
        return notes, ["the server ring completed this release already: the control plane is not touched"]
    servers = [n for n in every_node if is_server(n)]
    updated = [n for n in nodes if is_server(n) and device_type_of(n) in wanted]
    return notes, control_plane_plan(servers, updated, updating_agents=options.ring != "server")


def _refuse_unless_complete(options: RolloutOptions, kubectl: Kubectl, name: str, what: str) -> None:
    plan = kubectl(["-n", NAMESPACE, "get", "plans.upgrade.cattle.io", name, "-o", "json"], None)
    if plan.returncode != 0 or not plan_done(json.loads(plan.stdout), options.version):
        raise RolloutError(
            f"{what} has not completed {options.version}: the fleet Plans would wait forever; run --ring canary "
            "first (or --ring all)"
        )


def control_plane_plan(servers: Sequence[Mapping[str, Any]], updated: Sequence[Mapping[str, Any]],
                       updating_agents: bool = True) -> list[str]:
    """What happens to the control plane while this rollout runs, in a few lines for the person
    who started it."""
    names = ", ".join(name_of(n) for n in updated)
    if not updated:
        lines = ["no k3s server is updated by this rollout: the control plane keeps running its release"]
        if servers and updating_agents:
            lines.append("agents must not run a newer k3s than the servers (Kubernetes' version skew policy): "
                         "update the servers first when a release moves k3s")
        return lines
    lines = [f"servers first, one at a time: {names}; each is cordoned, not drained (its pods, the "
             "system-upgrade-controller's among them, stay where they are), then installs, reboots and "
             "passes its health gate against its own API server before the next node starts"]
    if len(servers) == 1:
        lines.append(f"{name_of(updated[0])} is the only server: while it reboots the API server is down for "
                     "minutes (kubectl, the controller and this command pause; running pods keep running; the "
                     "agents' jobs wait for the server ring); this command waits for it to come back")
    elif len(servers) == 2:
        lines.append("two servers: with k3s's embedded etcd neither keeps quorum alone, so the API server pauses "
                     "while each one reboots (an external datastore keeps it up)")
    else:
        lines.append(f"{len(servers)} servers: the others keep the API server up while one reboots")
    if updating_agents:
        lines.append("agents follow only once every server runs the release (their jobs wait in prepare)")
    return lines


def apply(manifest: str, kubectl: Kubectl) -> None:
    result = kubectl(["apply", "-f", "-"], manifest)
    if result.returncode != 0:
        raise RolloutError(f"kubectl apply failed: {last_line(result.stderr)}")
    for line in result.stdout.splitlines():
        console.info(line)


# ---------------------------------------------------------------- following progress


def suc_version(version: str) -> str:
    return version.replace("+", "-")


def plan_summary(plan: Mapping[str, Any]) -> dict[str, Any]:
    status = plan.get("status") or {}
    complete = any(
        c.get("type") == "Complete" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return {
        "name": plan.get("metadata", {}).get("name", "?"),
        "version": status.get("latestVersion", ""),
        "hash": status.get("latestHash", ""),
        "complete": complete,
        "applying": list(status.get("applying") or []),
    }


@dataclass(frozen=True)
class NodeState:
    ring: str
    node: str
    state: str  # waiting, updating, done, FAILED
    detail: str = ""


def selects(node: Mapping[str, Any], ring: Ring, selector: Sequence[tuple[str, str]]) -> bool:
    """Whether the ring's Plan selects the node (the template's nodeSelector, evaluated here)."""
    labels = labels_of(node)
    if labels.get(DEVICE_TYPE_LABEL) not in ring.device_types:
        return False
    if not all(labels.get(key) == value for key, value in selector):
        return False
    if ring.is_server or is_server(node):
        return ring.is_server and is_server(node)
    return (labels.get(RING_LABEL) == "canary") == (ring.name == "canary")


def job_for(jobs: Sequence[Mapping[str, Any]], plan: str, node: str) -> list[Mapping[str, Any]]:
    return [job for job in jobs
            if (job.get("metadata", {}).get("labels") or {}).get("upgrade.cattle.io/node") == node
            and (job.get("metadata", {}).get("labels") or {}).get("upgrade.cattle.io/plan") == plan]


def node_states(
    ring: Ring,
    plan: Mapping[str, Any] | None,
    nodes: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    selector: Sequence[tuple[str, str]],
) -> list[NodeState]:
    """Where each node of a ring stands, from the Plan, the nodes' labels and the jobs."""
    summary = plan_summary(plan) if plan else {"hash": "", "complete": False, "name": ring.plan_name}
    done_label = f"plan.upgrade.cattle.io/{ring.plan_name}"
    states = []
    for node in nodes:
        if not selects(node, ring, selector):
            continue
        name = name_of(node)
        if summary["hash"] and labels_of(node).get(done_label) == summary["hash"]:
            states.append(NodeState(ring.name, name, "done", "updated, gate passed, committed"))
            continue
        states.append(job_state(ring.name, name, job_for(jobs, ring.plan_name, name)))
    return states


def job_state(ring: str, node: str, jobs: Sequence[Mapping[str, Any]]) -> NodeState:
    if not jobs:
        return NodeState(ring, node, "waiting", "not started (concurrency or an earlier node)")
    job = max(jobs, key=lambda j: j.get("metadata", {}).get("creationTimestamp", ""))
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            why = condition.get("reason", "Failed")
            message = condition.get("message", "")
            return NodeState(ring, node, "FAILED", f"job {job['metadata']['name']}: {why} {message}".strip())
        if condition.get("type") == "Complete" and condition.get("status") == "True":
            return NodeState(ring, node, "done", "job complete")
    failed = int(status.get("failed") or 0)
    # The job's first pod dies with the node's reboot; the next one confirms the new slot.
    attempt = " (after its reboot)" if failed else ""
    return NodeState(ring, node, "updating", f"job {job['metadata']['name']} running{attempt}")


@dataclass(frozen=True)
class Progress:
    states: list[NodeState]
    finished: bool
    stopped: str  # why the rollout stopped ('' if it did not)


def assess(
    options: RolloutOptions,
    plans: Mapping[str, Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    job_log: Callable[[str], str] = lambda name: "",
) -> Progress:
    selector = parse_selector(options.selector)
    states: list[NodeState] = []
    finished = True
    for ring in rings(options):
        plan = plans.get(ring.plan_name)
        ring_states = node_states(ring, plan, nodes, jobs, selector)
        blocking = [name for name in ring.waits_for if not plan_done(plans.get(name), options.version)]
        if blocking:
            ring_states = [
                NodeState(s.ring, s.node, "waiting", f"for {describe_plan(blocking[0])}")
                if s.state in ("updating", "waiting") else s
                for s in ring_states
            ]
        states.extend(ring_states)
        if not plan_done(plan, options.version):
            finished = False
    for state in states:
        if state.state == "FAILED":
            job_name = state.detail.split(":", 1)[0].removeprefix("job ")
            why = job_log(job_name)
            stopped = f"rollout stopped at {state.ring} node {state.node}: {state.detail}"
            if why:
                stopped += f"; the node said: {why}"
            return Progress(states, False, stopped)
    return Progress(states, finished, "")


def plan_done(plan: Mapping[str, Any] | None, version: str) -> bool:
    if plan is None:
        return False
    summary = plan_summary(plan)
    return summary["version"] == suc_version(version) and summary["complete"]


def snapshot(options: RolloutOptions, kubectl: Kubectl) -> Progress:
    plan_list = kubectl_json(kubectl, "-n", NAMESPACE, "get", "plans.upgrade.cattle.io",
                             "-l", "app.kubernetes.io/managed-by=gpu-k8s-rollout")
    plans = {p["metadata"]["name"]: p for p in plan_list.get("items", [])}
    nodes = kubectl_json(kubectl, "get", "nodes").get("items", [])
    jobs = kubectl_json(kubectl, "-n", NAMESPACE, "get", "jobs", "-l", "upgrade.cattle.io/plan").get("items", [])

    def job_log(name: str) -> str:
        result = kubectl(["-n", NAMESPACE, "logs", f"job/{name}", "-c", "upgrade", "--tail", "20"], None)
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line]
        return (errors[-1] if errors else last_line(result.stdout)).strip() if result.returncode == 0 else ""

    return assess(options, plans, nodes, jobs, job_log)


def outage_note(said: str, last: Sequence[NodeState], options: RolloutOptions | None = None) -> str:
    """What an API server that stopped answering most likely means, from the last states seen."""
    servers = [state.node for state in last if state.ring == "server" and state.state == "updating"]
    if not last and options is not None and options.ring in ("server", "canary", "all"):
        return (f"the API server does not answer ({said}): most likely a server of this rollout is rebooting into "
                "its update, and the control plane with it; running pods keep running; waiting for it to come back")
    if servers:
        return (f"the API server does not answer ({said}): {', '.join(servers)} is rebooting into its update, and "
                "the control plane with it; running pods keep running; waiting for it to come back")
    return f"the API server does not answer ({said}); waiting for it to come back"


def follow(options: RolloutOptions, kubectl: Kubectl, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> Progress:
    """Print each node's state when it changes, until every ring completed or a node failed.
    An API server that stops answering (a server rebooting into its update takes it along) is
    waited for, up to API_OUTAGE_LIMIT_S, and said so once."""
    seen: dict[tuple[str, str], NodeState] = {}
    last: list[NodeState] = []
    outage_since: float | None = None
    while True:
        try:
            progress = snapshot(options, kubectl)
        except ClusterUnreachable as outage:
            if outage_since is None:
                outage_since = clock()
                console.info(outage_note(str(outage).split(" failed: ", 1)[-1], last, options))
            elif clock() - outage_since > API_OUTAGE_LIMIT_S:
                raise RolloutError(
                    f"the API server has not answered for {API_OUTAGE_LIMIT_S // 60} minutes ({outage}); the "
                    "rollout goes on in the cluster: look again with ./task status once it answers"
                ) from None
            sleep(FOLLOW_INTERVAL_S)
            continue
        if outage_since is not None:
            console.info(f"the API server answers again (after {clock() - outage_since:.0f} s)")
            outage_since = None
        for state in progress.states:
            if seen.get((state.ring, state.node)) != state:
                console.info(f"{state.ring:6}  {state.node:24}  {state.state:8}  {state.detail}")
                seen[(state.ring, state.node)] = state
        last = progress.states
        if progress.stopped or progress.finished:
            return progress
        sleep(FOLLOW_INTERVAL_S)


def run_rollout(options: RolloutOptions, kubectl: Kubectl | None = None) -> Progress | None:
    manifest = render_plans(options)
    if options.dry_run:
        print(manifest, end="")
        return None
    kubectl = kubectl or run_kubectl
    console.step(f"checking the cluster for a rollout of {options.version} ({options.ring})")
    notes, control_plane = preflight(options, kubectl)
    for note in notes:
        console.warn(note)
    console.step("the control plane meanwhile")
    for line in control_plane:
        console.info(line)
    console.step("applying the Plans")
    apply(manifest, kubectl)
    console.step("following the rollout (Ctrl-C stops following; the rollout goes on in the cluster)")
    progress = follow(options, kubectl)
    rows = [[s.ring, s.node, s.state, s.detail] for s in progress.states]
    console.summary("rollout", ["ring", "node", "state", "detail"], rows)
    if progress.stopped:
        raise RolloutError(
            progress.stopped + ". Fix the image and roll a new version, or after fixing the node run "
            "'gpu-k8s-update forget' on it and delete its failed job to retry (docs/fleet.md)"
        )
    return progress


def manifest_documents(manifest: str) -> list[dict[str, Any]]:
    """The Plans in a rendered manifest, parsed (tests and --dry-run users)."""
    return [doc for doc in yaml.safe_load_all(manifest) if doc]
