"""check-image's state check: where each machine's image puts its writable state (derived from
the layer's own daemon.json, the k3s drop-ins its renderer writes, openssh's configuration) and
whether persist.list / node-config.list keep it on /data. The facts are the layer's real files,
as tools/image/bitbake_probe.py reads them from a parse; the parse itself (docs/layer.md) proves
which file bitbake picks for each machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tools.image import state_paths as sp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/layer"))
import k3s_layer  # noqa: E402  (tests/layer: the renderer run with each machine's knobs)

DATA_FILES = REPO / "meta-gpu-k8s/recipes-core/gpu-k8s-data/files"
DOCKER_FILES = REPO / "meta-gpu-k8s/recipes-containers/gpu-k8s-docker-config/files"
K3S_FILES = REPO / "meta-gpu-k8s/recipes-containers/k3s/files"

# docker's version per series at our meta-virtualization pins (DOCKER_VERSION of docker-moby /
# docker-ce): wrynose aab9c1a0, scarthgap f980aefb, kirkstone 92b6abcd.
DOCKER_VERSION = {"wrynose": "v29.3.0", "scarthgap": "25.0.9", "kirkstone": "20.10.25-ce"}
# Each machine's daemon.json (FILESPATH: the SoC's directory first; x86-64 with GPU_K8S_NVIDIA
# the CDI one) and series.
MACHINES = {
    "qemux86-64": ("daemon.json", "wrynose"),
    "genericx86-64": ("daemon-nvidia-cdi.json", "wrynose"),
    "genericx86-64-scarthgap": ("daemon.json", "scarthgap"),
    "jetson-nano-devkit": ("tegra/daemon.json", "kirkstone"),
    "jetson-orin-nano-devkit-nvme": ("tegra234/daemon.json", "wrynose"),
    "jetson-agx-thor-devkit": ("tegra264/daemon.json", "wrynose"),
}
# openssh's PACKAGECONFIG default: oe-core wrynose names one host key, kirkstone none.
OPENSSH_PACKAGECONFIG = {"wrynose": ["systemd-sshd-socket-mode", "hostkey-ecdsa"],
                         "scarthgap": ["systemd-sshd-socket-mode"], "kirkstone": []}


def rendered_dropins(machine: str, tmp_path: Path, **changes: str) -> dict[str, str]:
    knob_machine = "genericx86-64" if machine == "genericx86-64-scarthgap" else machine
    out = tmp_path / f"dropins-{machine}-{len(list(tmp_path.iterdir()))}"
    result = k3s_layer.run_renderer(out, k3s_layer.config_knobs(knob_machine, **changes))
    assert result.returncode == 0, result.stderr
    return {path.name: path.read_text() for path in sorted(out.glob("*.yaml"))}


def facts_for(machine: str, tmp_path: Path, *, daemon_json: str | None = None, persist: str | None = None,
              node_config: str | None = None, dropins: dict[str, str] | None = None,
              mender_features: tuple[str, ...] = ("mender-image", sp.MACHINE_ID_FEATURE), **knobs: str
              ) -> sp.StateFacts:
    daemon_file, series = MACHINES[machine]
    return sp.StateFacts(
        ab=True,
        persist_list=(DATA_FILES / "persist.list").read_text() if persist is None else persist,
        node_config_list=(DATA_FILES / "node-config.list").read_text() if node_config is None else node_config,
        docker={"version": DOCKER_VERSION[series],
                "daemon_json": (DOCKER_FILES / daemon_file).read_text() if daemon_json is None else daemon_json,
                "daemon_json_source": f"files/{daemon_file}"},
        containerd={"config_toml": None, "source": ""},
        k3s={"dropins": rendered_dropins(machine, tmp_path, **knobs) if dropins is None else dropins,
             "units": {name: (K3S_FILES / name).read_text() for name in ("k3s.service", "k3s-agent.service")}},
        sshd={"packageconfig": OPENSSH_PACKAGECONFIG[series], "host_key_dir": None},
        mender_features=mender_features,
        networkd=True,
    )


def lost(facts: sp.StateFacts) -> dict[str, list[str]]:
    """path -> what, of every piece of state the image would lose at the next update."""
    found: dict[str, list[str]] = {}
    for finding in sp.evaluate(facts):
        if not finding.ok:
            found.setdefault(finding.state.path, []).append(finding.state.what)
    return found


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_every_machine_keeps_all_its_state_on_data(tmp_path, machine):
    findings = sp.evaluate(facts_for(machine, tmp_path))
    assert [f for f in findings if not f.ok] == []
    paths = {f.state.path for f in findings}
    assert {"/var/lib/docker", "/var/lib/containerd", "/var/lib/rancher/k3s", "/var/lib/kubelet",
            "/etc/rancher/node", "/var/lib/gpu-k8s", "/etc/systemd/network", "/etc/machine-id"} <= paths


@pytest.mark.parametrize("machine", ["jetson-orin-nano-devkit-nvme", "jetson-agx-thor-devkit", "genericx86-64",
                                     "qemux86-64"])
def test_defect_2_docker_29_without_the_pin_puts_images_in_containerds_root_which_must_be_kept(tmp_path, machine):
    daemon = json.loads((DOCKER_FILES / MACHINES[machine][0]).read_text())
    assert daemon["features"]["containerd-snapshotter"] is False, "the classic store is pinned"
    del daemon["features"]["containerd-snapshotter"]
    unpinned = json.dumps(daemon)
    store = {f.state.what: f for f in sp.evaluate(facts_for(machine, tmp_path, daemon_json=unpinned))}
    images = store["docker: images and layers (containerd store)"]
    assert images.state.path == "/var/lib/containerd" and images.ok, "kept anyway: persist.list has containerd"
    # ... and the image: no pin, no containerd in persist.list: docker's images on the slot
    persist = "\n".join(line for line in (DATA_FILES / "persist.list").read_text().splitlines()
                        if not line.startswith("containerd "))
    assert "/var/lib/containerd" in lost(facts_for(machine, tmp_path, daemon_json=unpinned, persist=persist))


def test_the_classic_store_pinned_keeps_images_under_the_data_root_wherever_it_is(tmp_path):
    facts = facts_for("jetson-orin-nano-devkit-nvme", tmp_path, daemon_json=json.dumps(
        {"data-root": "/var/docker", "features": {"containerd-snapshotter": False}}))
    assert lost(facts) == {"/var/docker": ["docker: containers, volumes, image metadata",
                                           "docker: images and layers (classic store)"]}
    moved = facts_for("jetson-orin-nano-devkit-nvme", tmp_path, daemon_json=json.dumps(
        {"data-root": "/data/docker", "features": {"containerd-snapshotter": False}}))
    assert lost(moved) == {}, "a data-root under /data is kept (tegra-demo-distro's choice)"


def test_the_nanos_docker_20_has_only_the_classic_store(tmp_path):
    findings = sp.evaluate(facts_for("jetson-nano-devkit", tmp_path))
    images = next(f for f in findings if f.state.what.startswith("docker: images"))
    assert images.state.path == "/var/lib/docker" and "docker 20.10.25-ce has only the classic" in images.state.source


def test_k3s_in_containerd_mode_keeps_its_containerd_under_the_data_dir(tmp_path):
    findings = sp.evaluate(facts_for("jetson-orin-nano-devkit-nvme", tmp_path, runtime="containerd"))
    inner = next(f for f in findings if f.state.what.startswith("k3s's containerd"))
    assert inner.state.path == "/var/lib/rancher/k3s/agent/containerd" and inner.ok


def test_a_data_dir_or_kubelet_root_dir_outside_data_is_named(tmp_path):
    dropins = rendered_dropins("jetson-orin-nano-devkit-nvme", tmp_path)
    dropins["70-site.yaml"] = 'data-dir: "/opt/k3s"\nkubelet-arg+:\n  - "root-dir=/opt/kubelet"\n'
    assert lost(facts_for("jetson-orin-nano-devkit-nvme", tmp_path, dropins=dropins)) == {
        "/opt/k3s": ["k3s: datastore, certificates, tokens, agent state"],
        "/opt/kubelet": ["kubelet: pod volumes, device-plugin checkpoint, DRA plugin state"]}


@pytest.mark.parametrize(("machine", "keys"), [
    ("jetson-orin-nano-devkit-nvme", {"ecdsa"}), ("jetson-nano-devkit", {"rsa", "ecdsa", "ed25519"})])
def test_defect_9_the_ssh_host_keys_sshd_uses_are_kept(tmp_path, machine, keys):
    findings = sp.evaluate(facts_for(machine, tmp_path))
    host_keys = {f.state.path: f for f in findings if f.state.what.startswith("SSH host key")}
    assert set(host_keys) == {f"/etc/ssh/ssh_host_{k}_key{pub}" for k in keys for pub in ("", ".pub")}
    assert all(f.ok and "node-config.list" in f.kept_by for f in host_keys.values())
    without = "\n".join(line for line in (DATA_FILES / "node-config.list").read_text().splitlines()
                        if not line.startswith("ssh-host-"))
    assert set(lost(facts_for(machine, tmp_path, node_config=without))) == set(host_keys)


def test_defect_9_network_settings_and_machine_id_are_kept(tmp_path):
    persist = "\n".join(line for line in (DATA_FILES / "persist.list").read_text().splitlines()
                        if not line.startswith("systemd-network "))
    assert lost(facts_for("genericx86-64", tmp_path, persist=persist)) == {
        "/etc/systemd/network": ["local network settings (systemd-networkd)"]}
    assert lost(facts_for("genericx86-64", tmp_path, mender_features=("mender-image", "mender-grub"))) == {
        "/etc/machine-id": ["machine-id"]}


def test_an_image_without_ab_slots_keeps_nothing_and_fails_nothing():
    facts = sp.StateFacts(ab=False)
    assert sp.evaluate(facts) == []
    assert "not an A/B image" in sp.report_lines(facts, [])[0]


def test_the_report_names_what_is_lost_and_the_fix(tmp_path):
    facts = facts_for("jetson-orin-nano-devkit-nvme", tmp_path, persist="docker /var/lib/docker\n")
    lines = sp.report_lines(facts, sp.evaluate(facts))
    lost_kubelet = next(line for line in lines if "NOT KEPT  kubelet" in line)
    assert "/var/lib/kubelet" in lost_kubelet and f"add a line to {sp.PERSIST_LIST}" in lost_kubelet
    assert "kept      docker: containers" in "\n".join(lines)
    assert lines[-1].endswith("/etc/systemd/network") and "pieces of state not kept on /data" in lines[-1]


@pytest.mark.parametrize(("version", "major"), [("v29.3.0", 29), ("25.0.9", 25), ("20.10.25-ce", 20), ("git", None)])
def test_docker_versions_as_the_recipes_spell_them(version, major):
    assert sp.docker_major(version) == major


def test_bad_facts_are_refused_with_the_reason():
    with pytest.raises(sp.StateFactsError, match="not JSON"):
        sp.docker_paths("{", "files/daemon.json", "v29.3.0", sp.CONTAINERD_ROOT)
    with pytest.raises(sp.StateFactsError, match="persist.list:2: want NAME PATH"):
        sp.Keeping.from_lists("# c\ndocker\n", "")
    with pytest.raises(sp.StateFactsError, match="incomplete"):
        sp.StateFacts.from_json({})


def test_containerds_root_comes_from_the_top_level_of_the_config_the_image_installs():
    config = 'version = 3\nroot = "/data/containerd"\n[plugins."io.containerd.cri.v1.images"]\n  root = "/x"\n'
    assert sp.containerd_root(config, "files/config.toml") == ("/data/containerd", "root in files/config.toml")
    assert sp.containerd_root('[grpc]\n  root = "/x"\n', "f")[0] == sp.CONTAINERD_ROOT
    assert sp.containerd_root(None, "")[0] == "/var/lib/containerd"
