"""`./task rollout`: the Plans it renders, the input it refuses, and how it follows a rollout
through a stand-in kubectl on PATH that plays back a cluster step by step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools.fleet import rollout

REPO_ROOT = Path(__file__).resolve().parents[2]

URL = "http://updates.lan/1.4.0/gpu-k8s-image-jetson-nano-devkit.mender"
NANO = "jetson-nano-devkit"
SERVER = "gpu-k8s-os-server"
CANARY, FLEET = f"gpu-k8s-os-canary-{NANO}", f"gpu-k8s-os-fleet-{NANO}"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
# Every PlanSpec / ContainerSpec / DrainSpec JSON field of system-upgrade-controller v0.20.1
# (pkg/apis/upgrade.cattle.io/v1/types.go): a key outside these is silently dropped by it.
PLAN_SPEC_FIELDS = {
    "concurrency", "jobActiveDeadlineSecs", "nodeSelector", "serviceAccountName", "channel", "version",
    "secrets", "tolerations", "exclusive", "window", "prepare", "upgrade", "cordon", "drain",
    "imagePullSecrets", "postCompleteDelay", "priorityClassName", "postCompleteLabels",
}
CONTAINER_FIELDS = {"image", "command", "args", "envs", "envFrom", "volumes", "securityContext"}
DRAIN_FIELDS = {"timeout", "gracePeriod", "deleteLocalData", "deleteEmptydirData", "ignoreDaemonSets", "force",
                "disableEviction", "skipWaitForDeleteTimeout", "podSelector"}


def options(**changes: object) -> rollout.RolloutOptions:
    url = str(changes.pop("artifact_url", URL))
    device_type = str(changes.pop("device_type", NANO))
    values: dict[str, object] = {"version": "1.4.0", "artifacts": (rollout.Artifact(device_type, url),)}
    values.update(changes)
    return rollout.RolloutOptions(**values)  # type: ignore[arg-type]


def plans(**changes: object) -> dict[str, dict]:
    documents = list(yaml.safe_load_all(rollout.render_plans(options(**changes))))
    return {doc["metadata"]["name"]: doc for doc in documents if doc}


def test_dry_run_yaml_is_the_server_ring_then_a_canary_plan_and_a_fleet_plan_gated_on_it() -> None:
    found = plans(concurrency=3)
    assert set(found) == {SERVER, CANARY, FLEET}
    for plan in found.values():
        assert plan["apiVersion"] == "upgrade.cattle.io/v1" and plan["kind"] == "Plan"
        assert plan["metadata"]["namespace"] == "system-upgrade"
        spec = plan["spec"]
        assert set(spec) <= PLAN_SPEC_FIELDS, f"unknown Plan fields {set(spec) - PLAN_SPEC_FIELDS}"
        assert set(spec["upgrade"]) <= CONTAINER_FIELDS and set(spec.get("drain", {})) <= DRAIN_FIELDS
        assert spec["version"] == "1.4.0" and spec["serviceAccountName"] == "system-upgrade"
        assert spec["upgrade"]["image"] == "localhost/gpu-k8s-upgrade:latest"
        command = spec["upgrade"]["command"] + spec["upgrade"]["args"]
        assert command == ["chroot", "/host", "gpu-k8s-update", "upgrade", "--version", "1.4.0",
                           "--artifact", f"{NANO}={URL}"]
        assert spec["cordon"] is True
        assert spec["tolerations"] == [{"operator": "Exists"}], "tainted GPU nodes and servers must be updated too"
    server, canary, fleet = found[SERVER]["spec"], found[CANARY]["spec"], found[FLEET]["spec"]
    for agents in (canary, fleet):
        assert agents["drain"]["ignoreDaemonSets"] is True
        assert agents["drain"]["timeout"] == "10m", "a string: SUC reads an integer drain timeout as nanoseconds"
    assert server["concurrency"] == 1 and canary["concurrency"] == 1, "one by one whatever --concurrency says"
    assert fleet["concurrency"] == 3
    device = {"key": "update.gpu-k8s.io/device-type", "operator": "In", "values": [NANO]}
    agent = {"key": CONTROL_PLANE, "operator": "NotIn", "values": ["true"]}
    assert server["nodeSelector"]["matchExpressions"] == [
        device, {"key": CONTROL_PLANE, "operator": "In", "values": ["true"]}]
    assert canary["nodeSelector"]["matchExpressions"] == [
        device, agent, {"key": "update.gpu-k8s.io/ring", "operator": "In", "values": ["canary"]}]
    assert fleet["nodeSelector"]["matchExpressions"] == [
        device, agent, {"key": "update.gpu-k8s.io/ring", "operator": "NotIn", "values": ["canary"]}]
    assert "prepare" not in server
    for agents, waited in ((canary, [SERVER]), (fleet, [SERVER, CANARY])):
        prepare = agents["prepare"]
        assert prepare["image"] == "localhost/gpu-k8s-upgrade:latest"
        assert prepare["command"][:2] == ["sh", "-c"]
        assert "chroot /host gpu-k8s-update wait-plan" in prepare["command"][2]
        assert prepare["args"][:4] == ["--namespace", "system-upgrade", "--version", "1.4.0"]
        assert prepare["args"][4:] == [word for name in waited for word in ("--plan", name)]
    # A Nano writes a GB rootfs to SD, reboots and runs a 15-minute gate inside one job.
    assert server["jobActiveDeadlineSecs"] >= 1800
    assert canary["jobActiveDeadlineSecs"] > server["jobActiveDeadlineSecs"], "canaries also wait for the servers"
    assert fleet["jobActiveDeadlineSecs"] > canary["jobActiveDeadlineSecs"], "fleet jobs also wait for canaries"


def test_the_server_ring_cordons_and_never_drains() -> None:
    """Defect 3: a server drained by its own update evicts CoreDNS, the controller's neighbours and
    every workload of a small cluster onto no node, and its reboot takes the API server along."""
    server = plans()[SERVER]["spec"]
    assert server["cordon"] is True and "drain" not in server


def test_prepare_script_hands_the_service_account_through_chroot() -> None:
    script = plans()[FLEET]["spec"]["prepare"]["command"]
    completed = subprocess.run(
        ["sh", "-n", "-c", script[2]], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, f"prepare script is not valid sh: {completed.stderr}"
    assert "GPU_K8S_UPDATE_API_TOKEN" in script[2] and "GPU_K8S_UPDATE_API_CA" in script[2]


def test_ring_and_selector_choose_the_plans_and_nodes() -> None:
    assert set(plans(ring="server")) == {SERVER}
    assert set(plans(ring="canary")) == {SERVER, CANARY}, "the servers come before any canary"
    assert set(plans(ring="fleet")) == {FLEET}
    for plan in plans(selector="example.com/site=lab-2").values():
        assert plan["spec"]["nodeSelector"]["matchExpressions"][-1] == {
            "key": "example.com/site", "operator": "In", "values": ["lab-2"]}


def test_values_that_look_like_yaml_stay_strings() -> None:
    url = "https://u.lan/a.mender?x=1&y=#frag: [1]"
    spec = plans(artifact_url=url, version="1.4.0+build.7")[CANARY]["spec"]
    assert spec["upgrade"]["args"] == ["--version", "1.4.0+build.7", "--artifact", f"{NANO}={url}"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": "1.4 beta"}, "--version '1.4 beta' must be"),
        ({"version": "x" * 64}, "--version"),
        ({"artifact_url": "ftp://updates.lan/a.mender"}, "must be an http(s) URL"),
        ({"artifact_url": "/mnt/usb/a.mender"}, "must be an http(s) URL"),
        ({"concurrency": 0}, "--concurrency must be 1 or more"),
        ({"selector": "site"}, "is not KEY=VALUE"),
        ({"selector": "bad key=x"}, "is not KEY=VALUE"),
        ({"selector": "update.gpu-k8s.io/ring=canary"}, "use --ring"),
        ({"ring": "everything"}, "--ring must be one of"),
        ({"device_type": "Jetson_Nano"}, "device type 'Jetson_Nano' must be"),
        ({"artifacts": ()}, "no artifact to roll out"),
    ],
)
def test_bad_input_is_refused_with_one_line(changes: dict, message: str) -> None:
    with pytest.raises(rollout.RolloutError) as refused:
        rollout.render_plans(options(**changes))
    assert message in str(refused.value) and "\n" not in str(refused.value)


# ---------------------------------------------------------------- a cluster played back

FAKE_KUBECTL = """
import json, sys
scenario_file = env["ROLLOUT_SCENARIO"]
with open(scenario_file) as f:
    scenario = json.load(f)
args = list(argv)
if args[:1] == ["-n"]:
    args = args[2:]
step = scenario["steps"][min(scenario["step"], len(scenario["steps"]) - 1)]
def out(obj):
    print(json.dumps(obj))
def save():
    with open(scenario_file, "w") as f:
        json.dump(scenario, f)
if args[:2] == ["get", "crd"]:
    if scenario.get("crd_error"):
        print(scenario["crd_error"], file=sys.stderr)
        sys.exit(1)
    if scenario.get("unreachable"):
        print("The connection to the server 10.0.0.5:6443 was refused - did you specify the right host or port?",
              file=sys.stderr)
        sys.exit(1)
    if not scenario.get("crd", True):
        print('Error from server (NotFound): customresourcedefinitions "plans.upgrade.cattle.io" not found',
              file=sys.stderr)
        sys.exit(1)
    print("plans.upgrade.cattle.io")
elif step.get("down"):
    # the only server rebooting into its update: no API server answers
    if args[:2] == ["get", "plans.upgrade.cattle.io"]:
        scenario["step"] += 1
        save()
    print("The connection to the server 10.0.0.5:6443 was refused - did you specify the right host or port?",
          file=sys.stderr)
    sys.exit(1)
elif args[:3] == ["get", "nodes", "-l"]:
    key, _, value = args[3].partition("=")
    out({"items": [n for n in step["nodes"] if n["metadata"]["labels"].get(key) == value]})
elif args[:2] == ["get", "nodes"]:
    out({"items": step["nodes"]})
elif args[:1] == ["apply"]:
    scenario["applied"] = sys.stdin.read()
    save()
    print("plan.upgrade.cattle.io/gpu-k8s-os-canary created")
elif args[:2] == ["get", "plans.upgrade.cattle.io"] and args[2] == "-l":
    out({"items": step["plans"]})
elif args[:2] == ["get", "plans.upgrade.cattle.io"]:
    found = [p for p in step["plans"] if p["metadata"]["name"] == args[2]]
    if not found:
        print('Error from server (NotFound): plans.upgrade.cattle.io "%s" not found' % args[2], file=sys.stderr)
        sys.exit(1)
    out(found[0])
elif args[:2] == ["get", "jobs"]:
    # the last look of each snapshot: the next one sees the next step
    out({"items": step["jobs"]})
    scenario["step"] += 1
    save()
elif args[:1] == ["logs"]:
    print(scenario["logs"].get(args[1].split("/", 1)[1], ""))
else:
    print("fake kubectl: unexpected " + " ".join(argv), file=sys.stderr)
    sys.exit(3)
"""


def node(name: str, canary: bool = False, done: dict[str, str] | None = None, device_type: str = NANO,
         server: bool = False) -> dict:
    labels = {"kubernetes.io/hostname": name, **({"update.gpu-k8s.io/ring": "canary"} if canary else {})}
    if device_type:
        labels["update.gpu-k8s.io/device-type"] = device_type
    if server:
        labels[CONTROL_PLANE] = "true"
    for plan, plan_hash in (done or {}).items():
        labels[f"plan.upgrade.cattle.io/{plan}"] = plan_hash
    return {"metadata": {"name": name, "labels": labels}}


def plan(ring: str, version: str = "1.4.0", complete: bool = False, device_type: str = NANO) -> dict:
    return {"metadata": {"name": SERVER if ring == "server" else f"gpu-k8s-os-{ring}-{device_type}"},
            "status": {"latestVersion": version, "latestHash": f"hash-{ring}",
                       "conditions": [{"type": "Complete", "status": "True" if complete else "False"}]}}


def job(ring: str, node_name: str, state: str = "active", failed: int = 0, device_type: str = NANO) -> dict:
    status: dict = {"active": 1} if state == "active" else {}
    status["failed"] = failed
    if state == "failed":
        status["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                 "message": "Job has reached the specified backoff limit"}]
    name = SERVER if ring == "server" else f"gpu-k8s-os-{ring}-{device_type}"
    return {"metadata": {"name": f"apply-{name}-on-{node_name}-with-hash",
                         "creationTimestamp": "2026-11-23T22:00:00Z",
                         "labels": {"upgrade.cattle.io/plan": name, "upgrade.cattle.io/node": node_name}},
            "status": status}


def play(stand_ins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: dict) -> Path:
    scenario_file = tmp_path / "scenario.json"
    scenario_file.write_text(json.dumps({"step": 0, "logs": {}, **scenario}))
    stand_ins.add("kubectl", FAKE_KUBECTL)
    monkeypatch.setenv("ROLLOUT_SCENARIO", str(scenario_file))
    monkeypatch.delenv("GPU_K8S_KUBECTL", raising=False)
    monkeypatch.setattr(rollout, "FOLLOW_INTERVAL_S", 0)
    return scenario_file


def test_follows_the_server_then_canary_then_fleet_to_the_end(stand_ins, tmp_path, monkeypatch, capsys) -> None:
    server_done = {SERVER: "hash-server"}
    canary_done = {**server_done, CANARY: "hash-canary"}
    both_done = {**canary_done, FLEET: "hash-fleet"}
    cluster = [node("server-1", server=True), node("nano-c", canary=True), node("nano-1")]
    steps = [
        {"nodes": cluster, "plans": [plan("server"), plan("canary"), plan("fleet")],
         "jobs": [job("server", "server-1"), job("canary", "nano-c"), job("fleet", "nano-1")]},
        {"down": True},
        {"nodes": [node("server-1", done=server_done, server=True), *cluster[1:]],
         "plans": [plan("server", complete=True), plan("canary"), plan("fleet")],
         "jobs": [job("canary", "nano-c", failed=1)]},
        {"nodes": [node("server-1", done=server_done, server=True), node("nano-c", True, canary_done), cluster[2]],
         "plans": [plan("server", complete=True), plan("canary", complete=True), plan("fleet")],
         "jobs": [job("fleet", "nano-1")]},
        {"nodes": [node("server-1", done=server_done, server=True), node("nano-c", True, both_done),
                   node("nano-1", done={FLEET: "hash-fleet"})],
         "plans": [plan("server", complete=True), plan("canary", complete=True), plan("fleet", complete=True)],
         "jobs": []},
    ]
    scenario_file = play(stand_ins, tmp_path, monkeypatch, {"steps": steps})
    progress = rollout.run_rollout(options())
    assert progress is not None and progress.finished and not progress.stopped
    out = capsys.readouterr().out
    assert "server-1 is the only server: while it reboots the API server is down" in out
    assert "waiting   for the server ring" in out, "agents wait while the server ring is not complete"
    assert "waiting   for the canary ring" in out, "fleet nodes wait while the canary is not complete"
    assert "the API server does not answer" in out and "server-1 is rebooting into its update" in out
    assert "the API server answers again" in out
    assert "(after its reboot)" in out
    assert out.count("done") >= 3
    applied = list(yaml.safe_load_all(json.loads(scenario_file.read_text())["applied"]))
    assert [doc["metadata"]["name"] for doc in applied if doc] == [SERVER, CANARY, FLEET]


def test_an_api_server_that_never_comes_back_ends_following_not_the_rollout(stand_ins, tmp_path, monkeypatch,
                                                                           capsys) -> None:
    cluster = [node("server-1", server=True), node("nano-c", canary=True)]
    steps = [{"nodes": cluster, "plans": [plan("server")], "jobs": [job("server", "server-1")]},
             *({"down": True} for _ in range(5))]
    play(stand_ins, tmp_path, monkeypatch, {"steps": steps})
    ticks = iter(range(0, 10_000, 600))
    monkeypatch.setattr(rollout, "API_OUTAGE_LIMIT_S", 1800)
    with pytest.raises(rollout.RolloutError) as stopped:
        rollout.follow(options(), rollout.run_kubectl, sleep=lambda s: None, clock=lambda: next(ticks))
    assert "has not answered for 30 minutes" in str(stopped.value)
    assert "the rollout goes on in the cluster" in str(stopped.value)
    assert capsys.readouterr().out.count("the API server does not answer") == 1, "said once per outage"


def test_a_canary_that_rolled_back_stops_the_rollout_and_says_why(stand_ins, tmp_path, monkeypatch) -> None:
    steps = [
        {"nodes": [node("nano-c", canary=True), node("nano-1")],
         "plans": [plan("canary"), plan("fleet")],
         "jobs": [job("canary", "nano-c", state="failed", failed=3), job("fleet", "nano-1")]},
    ]
    logs = {f"apply-{CANARY}-on-nano-c-with-hash":
            "2026-11-23 22:01:00 ERROR   upgrade: 1.4.0 was installed and booted, but this node is back on 1.3.0; "
            "the gate said: not healthy after 900s: kubelet: connection refused"}
    play(stand_ins, tmp_path, monkeypatch, {"steps": steps, "logs": logs})
    with pytest.raises(rollout.RolloutError) as stopped:
        rollout.run_rollout(options())
    message = str(stopped.value)
    assert "rollout stopped at canary node nano-c" in message and "BackoffLimitExceeded" in message
    assert "kubelet: connection refused" in message, "the node's own reason reaches the person"


def test_no_canary_node_refuses_before_applying(stand_ins, tmp_path, monkeypatch) -> None:
    scenario_file = play(stand_ins, tmp_path, monkeypatch,
                         {"steps": [{"nodes": [node("nano-1")], "plans": [], "jobs": []}]})
    with pytest.raises(rollout.RolloutError, match="no agent of device type jetson-nano-devkit is labelled"):
        rollout.run_rollout(options())
    assert "applied" not in json.loads(scenario_file.read_text())


@pytest.mark.parametrize(("server_version", "refused"), [
    ("1.4.0", "the canary ring of jetson-nano-devkit has not completed 1.4.0"),
    ("1.3.0", "the server ring has not completed 1.4.0"),
])
def test_fleet_ring_alone_needs_the_earlier_rings_complete_at_this_version(stand_ins, tmp_path, monkeypatch,
                                                                          server_version, refused) -> None:
    steps = [{"nodes": [node("nano-1")], "jobs": [],
              "plans": [plan("server", version=server_version, complete=True),
                        plan("canary", version="1.3.0", complete=True)]}]
    scenario_file = play(stand_ins, tmp_path, monkeypatch, {"steps": steps})
    with pytest.raises(rollout.RolloutError, match=refused):
        rollout.run_rollout(options(ring="fleet"))
    assert "applied" not in json.loads(scenario_file.read_text())


def test_missing_controller_is_named(stand_ins, tmp_path, monkeypatch) -> None:
    play(stand_ins, tmp_path, monkeypatch, {"crd": False, "steps": [{"nodes": [], "plans": [], "jobs": []}]})
    with pytest.raises(rollout.RolloutError, match="system-upgrade-controller is not installed"):
        rollout.run_rollout(options())


def test_task_refuses_bad_input_in_one_line_without_calling_kubectl(stand_ins) -> None:
    stand_ins.add("kubectl", "sys.exit(0)")
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "rollout", "--version", "1.4.0",
         "--artifact-url", "ftp://x/y.mender", "--device-type", NANO],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().count("\n") == 0 and "must be an http(s) URL" in completed.stderr
    assert stand_ins.calls("kubectl") == []


@pytest.mark.parametrize("value", ["0", "three"])
def test_task_refuses_a_bad_concurrency_in_one_line(stand_ins, value: str) -> None:
    stand_ins.add("kubectl", "sys.exit(0)")
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "rollout", "--version", "1.4.0",
         "--artifact-url", URL, "--concurrency", value],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().count("\n") == 0 and "--concurrency must be a whole number >= 1" in completed.stderr
    assert stand_ins.calls("kubectl") == []


def test_task_dry_run_prints_plans_and_calls_no_kubectl(stand_ins) -> None:
    stand_ins.add("kubectl", "sys.exit(0)")
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "rollout", "--version", "1.4.0",
         "--artifact-url", URL, "--device-type", NANO, "--dry-run", "--ring", "canary"],
        capture_output=True, text=True, check=True,
    )
    documents = [doc for doc in yaml.safe_load_all(completed.stdout) if doc]
    assert [doc["metadata"]["name"] for doc in documents] == [SERVER, CANARY]
    assert stand_ins.calls("kubectl") == []


# ---------------------------------------------------------------- a mixed fleet

X86, ORIN = "genericx86-64", "jetson-orin-nano-devkit-nvme"
X86_URL = "http://updates.lan/1.4.0/gpu-k8s-image-genericx86-64.mender"
MIXED_FLEET = [
    node("gpu-server", canary=True, device_type=X86, server=True),  # the k3s server (its canary label is moot)
    node("gpu-box-2", device_type=X86, canary=True),
    node("gpu-box-3", device_type=X86),
    node("nano-c", canary=True), node("nano-1"), node("nano-2"),
    node("orin-1", device_type=ORIN),  # this release carries no Orin artifact
    node("old-nano", device_type=""),  # an image from before the device-type label
]


def matches(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector of matchExpressions (In / NotIn), as the controller applies it."""
    for expression in selector.get("matchExpressions", []):
        value = labels.get(expression["key"])
        if expression["operator"] == "In" and value not in expression["values"]:
            return False
        if expression["operator"] == "NotIn" and value in expression["values"]:
            return False
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


def mixed_options(**changes: object) -> rollout.RolloutOptions:
    values: dict[str, object] = {"version": "1.4.0", "artifacts": (
        rollout.Artifact(X86, X86_URL), rollout.Artifact(NANO, URL))}
    values.update(changes)
    return rollout.RolloutOptions(**values)  # type: ignore[arg-type]


def offered(spec: dict) -> dict[str, str]:
    """The --artifact TYPE=URL offers of a Plan's upgrade command, by device type."""
    args = spec["upgrade"]["args"]
    return dict(args[i + 1].split("=", 1) for i, word in enumerate(args) if word == "--artifact")


def test_a_mixed_fleet_gets_a_server_ring_and_one_plan_pair_per_device_type_and_no_node_a_foreign_artifact() -> None:
    documents = [doc for doc in yaml.safe_load_all(rollout.render_plans(mixed_options())) if doc]
    names = [doc["metadata"]["name"] for doc in documents]
    assert names[0] == SERVER, "the server ring is applied first"
    agent_rings = {f"gpu-k8s-os-{ring}-{kind}" for ring in ("canary", "fleet") for kind in (X86, NANO)}
    assert set(names) == {SERVER} | agent_rings
    url_of = {X86: X86_URL, NANO: URL}
    updated: dict[str, list[str]] = {}
    for doc in documents:
        spec = doc["spec"]
        offers = offered(spec)
        for item in MIXED_FLEET:
            labels = item["metadata"]["labels"]
            if matches(spec["nodeSelector"], labels):
                device_type = labels.get("update.gpu-k8s.io/device-type")
                # what the node's gpu-k8s-update takes: the offer for its own device type
                assert offers.get(device_type) == url_of[device_type], f"{doc['metadata']['name']} on a {device_type}"
                updated.setdefault(item["metadata"]["name"], []).append(doc["metadata"]["name"])
        name = doc["metadata"]["name"]
        if name == SERVER:
            assert offers == url_of, "the server ring offers every device type's own artifact"
            assert "prepare" not in spec
            continue
        assert len(offers) == 1, "an agent ring carries its own device type's artifact only"
        waited = [spec["prepare"]["args"][i + 1] for i, w in enumerate(spec["prepare"]["args"]) if w == "--plan"]
        own_type = name.split("-", 4)[-1]
        expected = [SERVER] if "-canary-" in name else [SERVER, f"gpu-k8s-os-canary-{own_type}"]
        assert waited == expected, f"{name} waits for the server ring (and the canary of its own type)"
    assert updated["gpu-server"] == [SERVER], "the server goes in the server ring only, canary label or not"
    assert "orin-1" not in updated and "old-nano" not in updated, "a node no artifact fits is never selected"
    assert all(len(plans) == 1 for plans in updated.values()), "each node is in exactly one Plan"
    assert set(updated) == {"gpu-server", "gpu-box-2", "gpu-box-3", "nano-c", "nano-1", "nano-2"}


def test_a_mixed_fleet_rollout_leaves_the_orin_and_unlabelled_nodes_alone(
        stand_ins, tmp_path, monkeypatch, capsys) -> None:
    steps = [{"nodes": MIXED_FLEET, "plans": [], "jobs": []}]
    play(stand_ins, tmp_path, monkeypatch, {"steps": steps})
    notes, control_plane = rollout.preflight(mixed_options(), rollout.run_kubectl)
    assert any("orin-1" in note and f"no {ORIN} artifact" in note for note in notes), notes
    assert any("old-nano" in note and "no update.gpu-k8s.io/device-type label" in note for note in notes), notes
    assert control_plane[0].startswith("servers first, one at a time: gpu-server; each is cordoned, not drained")
    assert "gpu-server is the only server" in control_plane[1]


def test_a_server_only_device_type_needs_no_canary(stand_ins, tmp_path, monkeypatch) -> None:
    steps = [{"nodes": [node("gpu-server", device_type=X86, server=True), node("nano-c", canary=True)],
              "plans": [], "jobs": []}]
    play(stand_ins, tmp_path, monkeypatch, {"steps": steps})
    notes, _ = rollout.preflight(mixed_options(), rollout.run_kubectl)
    assert notes == []


def test_the_control_plane_plan_names_what_a_person_loses_meanwhile() -> None:
    servers = [node(f"server-{n}", device_type=X86, server=True) for n in range(3)]
    assert "the others keep the API server up" in rollout.control_plane_plan(servers, servers)[1]
    assert "neither keeps quorum" in rollout.control_plane_plan(servers[:2], servers[:2])[1]
    untouched = rollout.control_plane_plan(servers[:1], [])
    assert untouched[0].startswith("no k3s server is updated") and "version skew" in untouched[1]


def test_an_artifact_whose_device_type_matches_no_node_is_refused_before_anything_is_applied(
        stand_ins, tmp_path, monkeypatch) -> None:
    scenario_file = play(stand_ins, tmp_path, monkeypatch, {"steps": [{"nodes": MIXED_FLEET, "plans": [], "jobs": []}]})
    wrong = mixed_options(artifacts=(rollout.Artifact("jetson-agx-orin-devkit", URL),))
    with pytest.raises(rollout.RolloutError) as refused:
        rollout.run_rollout(wrong)
    message = str(refused.value)
    assert "no selected node has device type jetson-agx-orin-devkit" in message
    assert f"{NANO} (3)" in message and f"{X86} (3)" in message, "names the types the cluster has"
    assert "applied" not in json.loads(scenario_file.read_text())


def test_an_unreachable_cluster_is_named_as_such(stand_ins, tmp_path, monkeypatch) -> None:
    play(stand_ins, tmp_path, monkeypatch, {"unreachable": True, "steps": [{"nodes": [], "plans": [], "jobs": []}]})
    with pytest.raises(rollout.RolloutError) as refused:
        rollout.run_rollout(options())
    message = str(refused.value)
    assert message.startswith("cannot reach the cluster") and "KUBECONFIG" in message
    assert "not installed" not in message


def write_release(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "release.json").write_text(json.dumps({"version": "1.4.0", "artifacts": [
        {"file": "gpu-k8s-image-jetson-nano-devkit-1.rootfs.mender", "device_types": [NANO]},
        {"file": "gpu-k8s-image-genericx86-64-1.rootfs.mender", "device_types": [X86]}]}))


def test_a_release_directory_gives_one_artifact_per_device_type(tmp_path) -> None:
    write_release(tmp_path / "1.4.0")
    found = rollout.resolve_artifacts("1.4.0", None, None, tmp_path / "1.4.0", "http://updates.lan:8080", tmp_path)
    assert found == (rollout.Artifact(NANO, "http://updates.lan:8080/gpu-k8s-image-jetson-nano-devkit-1.rootfs.mender"),
                     rollout.Artifact(X86, "http://updates.lan:8080/gpu-k8s-image-genericx86-64-1.rootfs.mender"))
    one = rollout.resolve_artifacts("1.4.0", "http://u/gpu-k8s-image-genericx86-64-1.rootfs.mender", None, None, None,
                                    tmp_path)
    assert one == (rollout.Artifact(X86, "http://u/gpu-k8s-image-genericx86-64-1.rootfs.mender"),), \
        "the device type comes from the release that made the file"
    with pytest.raises(rollout.RolloutError, match="pass --device-type"):
        rollout.resolve_artifacts("1.4.0", "http://u/other.mender", None, None, None, tmp_path)
    with pytest.raises(rollout.RolloutError, match="needs --base-url"):
        rollout.resolve_artifacts("1.4.0", None, None, tmp_path / "1.4.0", None, tmp_path)
    with pytest.raises(rollout.RolloutError, match="not --version 1.5.0"):
        rollout.resolve_artifacts("1.5.0", None, None, tmp_path / "1.4.0", "http://u/", tmp_path)


@pytest.mark.parametrize(("said", "reported"), [
    ("error: You must be logged in to the server (Unauthorized)",
     "the cluster refused kubectl's credentials (error: You must be logged in to the server (Unauthorized)): use a "
     "current kubeconfig"),
    ('Error from server (Forbidden): customresourcedefinitions.apiextensions.k8s.io "plans.upgrade.cattle.io" is '
     'forbidden: User "dev" cannot get resource "customresourcedefinitions"',
     "kubectl's user may not read the cluster's CRDs"),
    ("Unable to connect to the server: dial tcp: lookup k3s.lan: no such host", "cannot reach the cluster"),
    ("error: error loading config file \"/root/.kube/config\": yaml: line 3: did not find expected key",
     "kubectl get crd plans.upgrade.cattle.io failed: error: error loading config file"),
])
def test_kubectls_own_failure_is_reported_not_a_missing_controller(stand_ins, tmp_path, monkeypatch, said,
                                                                   reported) -> None:
    scenario_file = play(stand_ins, tmp_path, monkeypatch,
                         {"crd_error": said, "steps": [{"nodes": [], "plans": [], "jobs": []}]})
    with pytest.raises(rollout.RolloutError) as refused:
        rollout.run_rollout(options())
    assert str(refused.value).startswith(reported), str(refused.value)
    assert "not installed" not in str(refused.value)
    assert "applied" not in json.loads(scenario_file.read_text())


@pytest.mark.parametrize("base_url", ["updates.lan:8080", "updates.lan:8080/releases/", "//updates.lan/"])
def test_a_base_url_without_its_scheme_is_blamed_on_base_url_with_the_fix(tmp_path, base_url: str) -> None:
    write_release(tmp_path / "1.4.0")
    with pytest.raises(rollout.RolloutUsageError) as refused:
        rollout.resolve_artifacts("1.4.0", None, None, tmp_path / "1.4.0", base_url, tmp_path)
    message = str(refused.value)
    assert message.startswith(f"--base-url {base_url!r} must be an http(s) URL the nodes can reach, with its scheme")
    assert "e.g. http://updates.lan" in message and "--artifact-url" not in message
