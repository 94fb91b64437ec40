"""Which writable state of a node image must outlive an A/B slot switch, where the image's own
configuration puts it, and whether the image keeps it on the data partition.

An update replaces the whole root filesystem; what a booted node wrote there is gone after the
next slot switch. Everything a user expects to keep must therefore be on /data: under it, bound
from it over its place in the root filesystem (gpu-k8s-data's persist.list), or a file linked to
its copy there (node-config.list). The paths are not assumed: docker's come from the daemon.json
the image installs and its docker's version (29 puts a fresh install's images in containerd's
store), containerd's from its config, k3s's data-dir and the kubelet's root-dir from the k3s
configuration the image renders, the SSH host keys from openssh's configuration.

Pure: facts in (bitbake's parse data, gathered by tools/image/bitbake_probe.py), findings out."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

DATA = "/data"
PERSIST_LIST = "meta-gpu-k8s/recipes-core/gpu-k8s-data/files/persist.list"
NODE_CONFIG_LIST = "meta-gpu-k8s/recipes-core/gpu-k8s-data/files/node-config.list"
MACHINE_ID_FEATURE = "mender-persist-systemd-machine-id"
# The first docker release whose fresh installs keep images in containerd's store.
DOCKER_CONTAINERD_STORE_DEFAULT = 29
# Defaults of the programs themselves, when the image's configuration names no other path.
DOCKER_DATA_ROOT = "/var/lib/docker"
CONTAINERD_ROOT = "/var/lib/containerd"
K3S_DATA_DIR = "/var/lib/rancher/k3s"  # k3s run as root
KUBELET_ROOT_DIR = "/var/lib/kubelet"
K3S_NODE_PASSWORD_DIR = "/etc/rancher/node"  # k3s's fixed path: node password (agent and server)
GPU_K8S_STATE_DIR = "/var/lib/gpu-k8s"  # node id, the update agent's markers, the DRA driver's state
NETWORKD_DIR = "/etc/systemd/network"
NETWORKMANAGER_DIR = "/etc/NetworkManager/system-connections"
DROPBEAR_DIR = "/etc/dropbear"
SSH_KEY_TYPES = ("rsa", "ecdsa", "ed25519")


class StateFactsError(ValueError):
    """The probe's facts cannot be read: the check cannot say what the image keeps."""


@dataclass(frozen=True)
class StatePath:
    what: str
    path: str
    source: str  # where the path comes from: a config file and setting, or a program's default
    kind: str = "dir"  # "dir" or "file"
    fix: str = ""  # beyond the generic fix: what else would keep it


@dataclass(frozen=True)
class StateFinding:
    state: StatePath
    kept_by: str | None  # how it outlives a slot switch; None: it does not

    @property
    def ok(self) -> bool:
        return self.kept_by is not None


@dataclass(frozen=True)
class Keeping:
    """What the image keeps on /data: persist.list (NAME PATH) and node-config.list (NAME PATH [flag])."""

    binds: Mapping[str, str]  # path -> name
    files: Mapping[str, str]  # path -> name

    @classmethod
    def from_lists(cls, persist_list: str, node_config_list: str) -> Keeping:
        return cls(binds=_list_entries(persist_list, "persist.list"),
                   files=_list_entries(node_config_list, "node-config.list"))

    def kept_by(self, path: str, kind: str) -> str | None:
        if path == DATA or path.startswith(DATA + "/"):
            return "on /data itself"
        for bound, name in sorted(self.binds.items(), key=lambda item: -len(item[0])):
            if path == bound or path.startswith(bound.rstrip("/") + "/"):
                return f"bound from /data/gpu-k8s/{name} over {bound} (persist.list)"
        if kind == "file" and path in self.files:
            return f"a link to /data/gpu-k8s/node-config/{self.files[path]} (node-config.list)"
        return None


def _list_entries(text: str, name: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < 2 or not words[1].startswith("/"):
            raise StateFactsError(f"{name}:{number}: want NAME PATH, got {line.strip()!r}")
        entries[words[1].rstrip("/") or "/"] = words[0]
    return entries


# ---------------------------------------------------------------- docker and containerd


def docker_major(version: str) -> int | None:
    """29 from "v29.3.0+git1da6517e", 20 from "20.10.25-ce+git..."; None when it is no version."""
    match = re.match(r"^v?(\d+)\.", version.strip())
    return int(match.group(1)) if match else None


def docker_paths(daemon_json: str, source: str, version: str, containerd_root: str) -> list[StatePath]:
    try:
        daemon = json.loads(daemon_json) if daemon_json.strip() else {}
    except ValueError as error:
        raise StateFactsError(f"{source} is not JSON ({error}): docker would not start with it") from None
    if not isinstance(daemon, dict):
        raise StateFactsError(f"{source} is not a JSON object")
    data_root = daemon.get("data-root") or DOCKER_DATA_ROOT
    root_source = (f"data-root in {source}" if daemon.get("data-root")
                   else f"docker's default ({source} sets no data-root)")
    snapshotter = (daemon.get("features") or {}).get("containerd-snapshotter")
    major = docker_major(version)
    if snapshotter is True:
        store, why = "containerd", f"features.containerd-snapshotter true in {source}"
    elif snapshotter is False:
        store, why = "classic", f"features.containerd-snapshotter false in {source}"
    elif major is None or major >= DOCKER_CONTAINERD_STORE_DEFAULT:
        store, why = "containerd", (f"docker {version or '(unknown version)'} keeps a fresh install's images in "
                                    f"containerd's store ({source} does not pin the store)")
    else:
        store, why = "classic", f"docker {version} has only the classic image store"
    paths = [StatePath("docker: containers, volumes, image metadata", data_root, root_source)]
    if store == "classic":
        paths.append(StatePath("docker: images and layers (classic store)", data_root, f"{why}; {root_source}"))
    else:
        paths.append(StatePath("docker: images and layers (containerd store)", containerd_root,
                               f"{why}; containerd's root", fix=f'or pin the classic store: "features": '
                               f'{{"containerd-snapshotter": false}} in {source}'))
    return paths


def containerd_root(config_toml: str | None, source: str) -> tuple[str, str]:
    """containerd's root from the config.toml the image installs, else containerd's default."""
    if config_toml:
        top_level = re.split(r"^\s*\[", config_toml, maxsplit=1, flags=re.M)[0]  # before the first [section]
        match = re.search(r'^\s*root\s*=\s*"([^"]+)"', top_level, re.M)
        if match:
            return match.group(1), f"root in {source}"
    return CONTAINERD_ROOT, "containerd's default (the image installs no config.toml that sets root)"


# ---------------------------------------------------------------- k3s and the kubelet


def _k3s_settings(dropins: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """k3s's view of config.yaml.d: a later file's scalar replaces, "key+" lists append."""
    merged: dict[str, Any] = {}
    kubelet_args: list[str] = []
    for name in sorted(dropins):
        try:
            data = yaml.safe_load(dropins[name]) or {}
        except yaml.YAMLError as error:
            raise StateFactsError(f"k3s drop-in {name} is not YAML: {error}") from None
        if not isinstance(data, dict):
            raise StateFactsError(f"k3s drop-in {name} is not a mapping")
        for key, value in data.items():
            if key in ("kubelet-arg", "kubelet-arg+"):
                kubelet_args = ([] if key == "kubelet-arg" else kubelet_args) + [str(v) for v in value or []]
            else:
                merged[key.rstrip("+")] = value
    return merged, kubelet_args


def _exec_start_flag(units: Mapping[str, str], flags: Sequence[str]) -> tuple[str, str] | None:
    for name, text in sorted(units.items()):
        for line in text.splitlines():
            if not line.strip().startswith("ExecStart="):
                continue
            words = shlex.split(line.split("=", 1)[1])
            for index, word in enumerate(words):
                for flag in flags:
                    if word == flag and index + 1 < len(words):
                        return words[index + 1], f"{flag} in {name}'s ExecStart"
                    if word.startswith(flag + "="):
                        return word.split("=", 1)[1], f"{flag} in {name}'s ExecStart"
    return None


def k3s_paths(dropins: Mapping[str, str], units: Mapping[str, str]) -> list[StatePath]:
    settings, kubelet_args = _k3s_settings(dropins)
    data_dir, data_source = K3S_DATA_DIR, "k3s's default (no data-dir in the image's config.yaml.d or units)"
    from_unit = _exec_start_flag(units, ("--data-dir", "-d"))
    if from_unit:
        data_dir, data_source = from_unit
    if settings.get("data-dir"):
        data_dir, data_source = str(settings["data-dir"]), "data-dir in the image's config.yaml.d"
    paths = [StatePath("k3s: datastore, certificates, tokens, agent state", data_dir, data_source)]
    if settings.get("docker") is not True:
        paths.append(StatePath("k3s's containerd: images, snapshots", f"{data_dir.rstrip('/')}/agent/containerd",
                               f"k3s runs pods in its own containerd (no docker: true); under {data_source}"))
    root_dir, root_source = KUBELET_ROOT_DIR, "the kubelet's default (no root-dir in kubelet-arg)"
    for arg in kubelet_args:
        flag, _, value = arg.partition("=")
        if flag.lstrip("-") == "root-dir" and value:
            root_dir, root_source = value, "root-dir in the image's kubelet-arg"
    paths.append(StatePath("kubelet: pod volumes, device-plugin checkpoint, DRA plugin state", root_dir, root_source))
    paths.append(StatePath("k3s: the node password (without it the server rejects the node on its new slot)",
                           K3S_NODE_PASSWORD_DIR, "k3s's fixed path"))
    return paths


# ---------------------------------------------------------------- identity


def ssh_host_key_paths(packageconfig: Sequence[str], host_key_dir: str | None) -> list[StatePath]:
    """openssh's HostKey files: oe-core writes one per hostkey-TYPE PACKAGECONFIG into
    sshd_config (wrynose); with none (or before that knob, kirkstone) sshd takes its defaults,
    all three types. The directory is OPENSSH_HOST_KEY_DIR where oe-core has it, else /etc/ssh."""
    chosen = [kind for kind in SSH_KEY_TYPES if f"hostkey-{kind}" in packageconfig] or list(SSH_KEY_TYPES)
    directory = (host_key_dir or "/etc/ssh").rstrip("/")
    if any(f"hostkey-{kind}" in packageconfig for kind in SSH_KEY_TYPES):
        source = f"openssh's HostKey lines (PACKAGECONFIG {' '.join('hostkey-' + k for k in chosen)}), in {directory}"
    else:
        source = f"sshd's default HostKeys (no hostkey-* in openssh's PACKAGECONFIG), in {directory}"
    paths = []
    for kind in chosen:
        key = f"{directory}/ssh_host_{kind}_key"
        paths.append(StatePath(f"SSH host key ({kind})", key, source, kind="file"))
        paths.append(StatePath(f"SSH host key ({kind}, public)", key + ".pub", source, kind="file"))
    return paths


def machine_id_finding(mender_features: Sequence[str]) -> StateFinding:
    state = StatePath("machine-id", "/etc/machine-id", "systemd", kind="file",
                      fix=f'enable Mender\'s {MACHINE_ID_FEATURE} '
                          f'(MENDER_FEATURES_ENABLE:append = " {MACHINE_ID_FEATURE}")')
    if MACHINE_ID_FEATURE in mender_features:
        return StateFinding(state, f"in the boot loader's environment, given back as systemd.machine_id= "
                                   f"(MENDER_FEATURES: {MACHINE_ID_FEATURE})")
    return StateFinding(state, None)


# ---------------------------------------------------------------- the whole image


@dataclass(frozen=True)
class StateFacts:
    """What the probe read from bitbake's parse data (bitbake_probe.state_facts)."""

    ab: bool
    persist_list: str = ""
    node_config_list: str = ""
    docker: Mapping[str, str] | None = None  # version, daemon_json, daemon_json_source
    containerd: Mapping[str, str] | None = None  # config_toml, source
    k3s: Mapping[str, Mapping[str, str]] | None = None  # dropins, units
    sshd: Mapping[str, Any] | None = None  # packageconfig, host_key_dir
    dropbear: bool = False
    mender_features: Sequence[str] = ()
    networkd: bool = False
    networkmanager: bool = False
    notes: Sequence[str] = field(default_factory=tuple)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateFacts:
        try:
            return cls(ab=bool(data["ab"]), persist_list=data.get("persist_list") or "",
                       node_config_list=data.get("node_config_list") or "", docker=data.get("docker"),
                       containerd=data.get("containerd"), k3s=data.get("k3s"), sshd=data.get("sshd"),
                       dropbear=bool(data.get("dropbear")), mender_features=tuple(data.get("mender_features") or ()),
                       networkd=bool(data.get("networkd")), networkmanager=bool(data.get("networkmanager")),
                       notes=tuple(data.get("notes") or ()))
        except (KeyError, TypeError) as error:
            raise StateFactsError(f"the probe's state facts are incomplete ({error}): run check-image from this "
                                  "checkout, whose probe writes them") from None

    def paths(self) -> list[StatePath]:
        paths: list[StatePath] = []
        root = CONTAINERD_ROOT
        if self.containerd is not None:
            root, source = containerd_root(self.containerd.get("config_toml"), self.containerd.get("source", ""))
            paths.append(StatePath("containerd (docker's): metadata, content store, snapshots", root, source))
        if self.docker is not None:
            docker = self.docker
            paths += docker_paths(docker.get("daemon_json", ""), docker.get("daemon_json_source", "daemon.json"),
                                  docker.get("version", ""), root)
        if self.k3s is not None:
            paths += k3s_paths(self.k3s.get("dropins") or {}, self.k3s.get("units") or {})
        paths.append(StatePath("our node state: node id, the update agent's markers, the DRA driver's state",
                               GPU_K8S_STATE_DIR, "gpu-k8s-k3s-node-name, gpu-k8s-update, the DRA driver"))
        if self.sshd is not None:
            paths += ssh_host_key_paths(self.sshd.get("packageconfig") or (), self.sshd.get("host_key_dir"))
        if self.dropbear:
            paths.append(StatePath("dropbear's host keys", DROPBEAR_DIR, "dropbear's default"))
        if self.networkd:
            paths.append(StatePath("local network settings (systemd-networkd)", NETWORKD_DIR,
                                   "systemd built with networkd; the image's own files belong in "
                                   "/usr/lib/systemd/network"))
        if self.networkmanager:
            paths.append(StatePath("local network settings (NetworkManager)", NETWORKMANAGER_DIR,
                                   "NetworkManager's connection profiles"))
        return paths


def evaluate(facts: StateFacts) -> list[StateFinding]:
    """One finding per piece of state; [] for an image without A/B slots (nothing is switched)."""
    if not facts.ab:
        return []
    keeping = Keeping.from_lists(facts.persist_list, facts.node_config_list)
    findings = [StateFinding(path, keeping.kept_by(path.path, path.kind)) for path in facts.paths()]
    findings.append(machine_id_finding(facts.mender_features))
    return findings


def report_lines(facts: StateFacts, findings: Sequence[StateFinding]) -> list[str]:
    if not facts.ab:
        return ["state across updates: not an A/B image (one root filesystem, no slot switch): "
                "nothing to keep on /data"]
    lines = ["state that must outlive a slot switch (on /data, or it is lost at the next update):"]
    for finding in findings:
        state = finding.state
        if finding.ok:
            lines.append(f"  kept      {state.what}: {state.path} [{state.source}] -> {finding.kept_by}")
        else:
            fix = (state.fix if state.path == "/etc/machine-id" else
                   f"add a line to {NODE_CONFIG_LIST if state.kind == 'file' else PERSIST_LIST} for {state.path}"
                   + (f", {state.fix}" if state.fix else "") + f", or move it under {DATA}")
            lines.append(f"  NOT KEPT  {state.what}: {state.path} [{state.source}]: the next update loses it; "
                         f"fix: {fix}")
    lines += [f"  note: {note}" for note in facts.notes]
    lost = [f.state.path for f in findings if not f.ok]
    lines.append(f"{len(lost)} of {len(findings)} pieces of state not kept on /data: {', '.join(lost)}" if lost
                 else f"all {len(findings)} pieces of state are kept on /data")
    return lines
