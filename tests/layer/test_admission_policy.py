"""The server image refuses the NVIDIA toolkit's feature variables from unprivileged GPU pods.

The policies themselves run in Kubernetes' own admission plugins in conformance/admission (the "Kubernetes
conformance (Go)" leg: k8s.io/apiserver v0.36.4, the release k3s v1.36.4+k3s1 carries); here the image's side:
what the recipe installs for each knob, and the k3s drop-in's copy into the auto-deploy directory, run at the OS
boundary."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml
from bbfile import parse
from k3s_layer import CONFIG_DIR, CONFIG_RECIPE

HARNESS = Path(__file__).resolve().parent / "admission"
MANIFEST = CONFIG_DIR / "files/gpu-k8s-nvidia-feature-variables.yaml"
DROP_IN = CONFIG_DIR / "files/40-gpu-k8s-admission.conf"
FEATURES = ["NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_GDRCOPY", "NVIDIA_NVSWITCH"]


def test_both_policies_share_their_scope_and_name_every_feature_variable() -> None:
    documents = list(yaml.safe_load_all(MANIFEST.read_text()))
    policies = {d["kind"]: d for d in documents if d["kind"].endswith("AdmissionPolicy")}
    mutating, validating = policies["MutatingAdmissionPolicy"], policies["ValidatingAdmissionPolicy"]
    assert mutating["spec"]["matchConstraints"] == validating["spec"]["matchConstraints"]
    variables = [{v["name"]: v["expression"] for v in p["spec"]["variables"]} for p in (mutating, validating)]
    for name in ("features", "containers", "targets"):
        assert variables[0][name] == variables[1][name], f"the two policies must pick the same {name}"
    assert re.findall(r"'(NVIDIA_\w+)'", variables[0]["features"]) == FEATURES
    # the plugin's own list (cdi.handover's neighbour in config/settings.py) names the same four
    settings = (CONFIG_DIR.parents[2] / "plugin/src/gpu_device_plugin/config/settings.py").read_text()
    assert re.findall(r'"(NVIDIA_\w+)"\)', settings) == FEATURES


def install(tmp_path: Path, isolation: str) -> Path:
    """The k3s-config recipe's do_install for a server with these knobs (the renderer stubbed out)."""
    bb = parse(CONFIG_RECIPE)
    dest = tmp_path / "image"
    values = {"D": str(dest), "UNPACKDIR": str(CONFIG_DIR / "files"),
              "systemd_system_unitdir": "/usr/lib/systemd/system", "datadir": "/usr/share",
              "libexecdir": "/usr/libexec", "bindir": "/usr/bin", "sysconfdir": "/etc",
              "K3S_CONFIG_DIR": "/etc/rancher/k3s/config.yaml.d", "GPU_K8S_K3S_RUNTIME": "docker",
              "GPU_K8S_GPU_ISOLATION": isolation, "PYTHON": "true"}
    script = re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: values.get(m.group(1), ""), bb.tasks["do_install"])
    done = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return dest


def test_a_server_image_hands_k3s_the_policies_and_the_opt_out_leaves_them_out(tmp_path: Path) -> None:
    dest = install(tmp_path / "on", "1")
    shipped = dest / "usr/share/gpu-k8s/admission/gpu-k8s-nvidia-feature-variables.yaml"
    assert shipped.read_text() == MANIFEST.read_text()
    dropin = dest / "usr/lib/systemd/system/k3s.service.d/40-gpu-k8s-admission.conf"
    assert "@DATADIR@" not in dropin.read_text()
    assert not (dest / "usr/lib/systemd/system/k3s-agent.service.d/40-gpu-k8s-admission.conf").exists(), \
        "agents do not run the API server"
    off = install(tmp_path / "off", "0")
    assert not (off / "usr/share/gpu-k8s/admission").exists()
    assert not (off / "usr/lib/systemd/system/k3s.service.d/40-gpu-k8s-admission.conf").exists()


def test_k3s_copies_the_policies_into_its_auto_deploy_directory_and_does_not_start_without_them(
        tmp_path: Path) -> None:
    conf = configparser.RawConfigParser(strict=False, interpolation=None)
    conf.optionxform = str
    conf.read_string(DROP_IN.read_text())
    assert conf["Unit"]["RequiresMountsFor"] == "/var/lib/rancher/k3s"
    command = conf["Service"]["ExecStartPre"]
    assert not command.startswith("-"), "a failed copy must stop k3s, not start it without the policies"
    # run it with / at tmp_path: the k3s data directory on the data partition, the image's copy in /usr/share
    root = tmp_path / "node"
    source = root / "usr/share/gpu-k8s/admission"
    source.mkdir(parents=True)
    shutil.copy(MANIFEST, source)
    rooted = command.replace("@DATADIR@", f"{root}/usr/share").replace("/var/lib/rancher", f"{root}/var/lib/rancher")
    argv = shlex.split(rooted)
    assert argv[:2] == ["/bin/sh", "-c"]
    assert subprocess.run(argv, capture_output=True, text=True, check=False).returncode == 0
    deployed = root / "var/lib/rancher/k3s/server/manifests/gpu-k8s-nvidia-feature-variables.yaml"
    assert deployed.read_text() == MANIFEST.read_text()
    assert (deployed.stat().st_mode & 0o777, deployed.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    # the image's copy missing: the start fails
    (source / MANIFEST.name).unlink()
    assert subprocess.run(argv, capture_output=True, text=True, check=False).returncode != 0
