"""A mixed fleet through `./task`, dry: an x86-64 server, Orin agents and Nano agents are built
(--dry-run, each with its role), released from the deploy directories those builds name, and
rolled out with one Plan pair per device type, so no artifact reaches a node of another
machine or role.

The tasks run in this process through the same command line as `./task` (tools/program.py,
tasks.py), with build/ in a temporary directory, a build host that passes its checks, a key
pair made for the run, and artifacts signed with it written where each build said its images
would be, with the device and payload types each image's Mender integration gives them and
the verify key each image holds recorded beside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from mender_artifacts import make_artifact, record_verify_key
from signing_keys import fleet_key, write_pair

from tools import paths
from tools.fleet import release
from tools.image import build, hostcheck
from tools.program import program

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = "1.4.0"
# (--machine, --role as given, the role the image takes)
FLEET_BUILDS = [("x86-64", None, "server"), ("jetson-orin-nano", "agent", "agent"), ("jetson-nano", None, "agent")]


@pytest.fixture
def build_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "build"
    for module in (paths, build, release):
        monkeypatch.setattr(module, "BUILD_ROOT", root)
    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda path: hostcheck.HostFacts(
        path, free_bytes=500 * hostcheck.GIB, euid=1000, locales=("en_US.utf8",)))
    monkeypatch.setattr(hostcheck, "check_host_tools", lambda which=None: [])
    # the fleet's pair, made here: build checks it is one, release checks each artifact against it
    keys = write_pair(tmp_path / "keys", fleet_key())
    monkeypatch.setenv("MENDER_ARTIFACT_SIGNING_KEY", str(keys.private))
    monkeypatch.setenv("MENDER_ARTIFACT_VERIFY_KEY", str(keys.public))
    monkeypatch.setenv("GPU_K8S_VERSION", VERSION)
    for name in ("KAS_WORK_DIR", "KAS_BUILD_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    return root


def task(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """One ./task command line; its exit status and output."""
    try:
        program.run(["./task", "--search-root", str(REPO_ROOT), *argv])
        code = 0
    except SystemExit as exited:
        code = int(exited.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def device_type(machine: str, role: str) -> str:
    """What the image's Mender device type is: the MACHINE, with the role appended where the
    role is not the machine's default (kas/include/agent.yml, server.yml)."""
    target = build.MACHINES[machine]
    return target.yocto_machine if role == target.default_role else f"{target.yocto_machine}-{role}"


def node(name: str, kind: str, canary: bool = False, server: bool = False) -> dict[str, str]:
    labels = {"kubernetes.io/hostname": name, "update.gpu-k8s.io/device-type": kind}
    if canary:
        labels["update.gpu-k8s.io/ring"] = "canary"
    if server:
        labels["node-role.kubernetes.io/control-plane"] = "true"
    return labels


def selected(selector: dict, labels: dict[str, str]) -> bool:
    for expression in selector.get("matchExpressions", []):
        value = labels.get(expression["key"])
        if (expression["operator"] == "In") != (value in expression["values"]):
            return False
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


def test_a_mixed_fleet_builds_releases_and_rolls_out_with_one_plan_pair_per_device_type(
        build_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy_dirs = {}
    for machine, role, takes in FLEET_BUILDS:
        argv = ["build", "--machine", machine, "--dry-run", *(["--role", role] if role else [])]
        if machine == "x86-64":
            argv.append("--accept-nvidia-licence")
        code, out = task(capsys, *argv)
        assert code == 0, out
        assert f"as a k3s {takes}" in out
        assert f"release version {VERSION} (GPU_K8S_VERSION from the environment)" in out
        kas_argument = re.search(r"kas build --target gpu-k8s-image (\S+)", out)
        assert kas_argument is not None, out
        assert kas_argument[1] == build.kas_file_for(machine, role, machine == "x86-64")
        (where,) = re.findall(r"artifacts would be in (\S+)", out)
        deploy_dirs[(machine, takes)] = Path(where)
    assert deploy_dirs[("jetson-orin-nano", "agent")] == (
        build_root / "jetson-orin-nano-agent/build/tmp/deploy/images/jetson-orin-nano-devkit-nvme")
    assert len(set(deploy_dirs.values())) == 3, "no two builds share a deploy directory"

    # what each build leaves: a signed artifact of its device type and Mender payload
    for (machine, takes), directory in deploy_dirs.items():
        directory.mkdir(parents=True)
        yocto_machine = build.MACHINES[machine].yocto_machine
        stem = f"gpu-k8s-image-{yocto_machine}-20261201120000"
        make_artifact(directory / f"{stem}.mender", VERSION, device_type=device_type(machine, takes),
                      payload_type=build.MACHINES[machine].update_payload)
        (directory / f"gpu-k8s-image-{yocto_machine}.mender").symlink_to(f"{stem}.mender")
        (directory / f"{stem}.manifest").write_text(f"k3s x {VERSION}\nk3s-{takes} x {VERSION}\n")
        record_verify_key(directory / f"{stem}.manifest")  # the key the image holds, as the layer records it

    code, out = task(capsys, "release")
    assert code == 0, out
    output = build_root / "release" / VERSION
    assert f"--release {output} --base-url http://HOST:8080/" in out
    recorded = {entry["machine"]: entry for entry in yaml.safe_load((output / "release.json").read_text())["artifacts"]}
    assert {machine: (entry["device_types"], entry["payload_types"], entry["role"])
            for machine, entry in recorded.items()} == {
        "genericx86-64": (["genericx86-64"], ["rootfs-image"], "server"),
        "jetson-orin-nano-devkit-nvme": (["jetson-orin-nano-devkit-nvme-agent"], ["tegra-rootfs-image"], "agent"),
        "jetson-nano-devkit": (["jetson-nano-devkit"], ["rootfs-image"], "agent"),
    }

    code, out = task(capsys, "rollout", "--version", VERSION, "--release", str(output), "--base-url",
                     "http://updates.lan:8080/", "--dry-run")
    assert code == 0, out
    plans = [doc for doc in yaml.safe_load_all(out) if doc]
    kinds = ["genericx86-64", "jetson-orin-nano-devkit-nvme-agent", "jetson-nano-devkit"]
    assert sorted(plan["metadata"]["name"] for plan in plans) == sorted(
        ["gpu-k8s-os-server", *(f"gpu-k8s-os-{ring}-{kind}" for ring in ("canary", "fleet") for kind in kinds)])

    fleet = [node("server-1", "genericx86-64", server=True),
             node("orin-c", "jetson-orin-nano-devkit-nvme-agent", canary=True),
             node("orin-1", "jetson-orin-nano-devkit-nvme-agent"),
             node("nano-c", "jetson-nano-devkit", canary=True), node("nano-1", "jetson-nano-devkit"),
             node("orin-server", "jetson-orin-nano-devkit-nvme", server=True)]  # no artifact in this release
    url_of = {entry["device_types"][0]: f"http://updates.lan:8080/{entry['file']}" for entry in recorded.values()}
    reached: dict[str, list[str]] = {}
    for plan in plans:
        args = plan["spec"]["upgrade"]["args"]
        # each node's gpu-k8s-update takes the offer for its own device type
        offers = dict(args[i + 1].split("=", 1) for i, word in enumerate(args) if word == "--artifact")
        for labels in fleet:
            if selected(plan["spec"]["nodeSelector"], labels):
                url = offers.get(labels["update.gpu-k8s.io/device-type"])
                assert url == url_of[labels["update.gpu-k8s.io/device-type"]], (plan["metadata"]["name"], labels)
                reached.setdefault(labels["kubernetes.io/hostname"], []).append(plan["metadata"]["name"])
    assert set(reached) == {"server-1", "orin-c", "orin-1", "nano-c", "nano-1"}
    assert all(len(names) == 1 for names in reached.values()), reached
    assert "orin-server" not in reached, "an Orin server never gets the Orin agents' image"
