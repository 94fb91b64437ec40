"""Checks 4-6: the kubelet's socket, the plugin's socket, and what the kubelet recorded."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from typing import Any

from .host import short_list
from .report import FAIL, PASS, SKIP, WARN, Check

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
PLUGIN_FIX = "is gpu-device-plugin.service running? journalctl -u gpu-device-plugin"
LISTENING, MISSING, NOT_SOCKET, REFUSED, UNREACHABLE = "listening", "missing", "not a socket", "refused", "unreachable"


def probe_socket(path: str) -> tuple[str, str]:
    """(state, error text): whether a Unix socket exists at `path` and something accepts on it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return MISSING, ""
    except OSError as exc:
        return UNREACHABLE, exc.strerror or str(exc)
    if not stat.S_ISSOCK(mode):
        return NOT_SOCKET, ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            return REFUSED, ""
        return UNREACHABLE, exc.strerror or str(exc)
    finally:
        sock.close()
    return LISTENING, ""


def evaluate_kubelet_socket(path: str, state: str, error: str = "") -> Check:
    name = "kubelet socket"
    fix = "the kubelet is not running or uses another root dir; set --kubelet-socket"
    if state == LISTENING:
        return Check(name, PASS, f"{path} is a socket and the kubelet accepts connections on it")
    if state == MISSING:
        return Check(name, FAIL, f"no socket at {path}: the plugin cannot register, so the node has no "
                     "GPU capacity", fix + " (k3s: systemctl status k3s or k3s-agent)")
    if state == NOT_SOCKET:
        return Check(name, FAIL, f"{path} exists but is not a socket", fix)
    if state == REFUSED:
        return Check(name, FAIL, f"{path} is a stale socket: nothing accepts connections on it (the kubelet "
                     "stopped or crashed)", "start the kubelet (systemctl restart k3s or k3s-agent), then check "
                     "again")
    return Check(name, WARN, f"cannot connect to {path}: {error}", "run the check as root")


def evaluate_plugin_socket(path: str, state: str, advertised: int, error: str = "") -> Check:
    name = "plugin socket"
    if state == LISTENING:
        return Check(name, PASS, f"{path} is served (the plugin is up)")
    idle = " (expected while discovery finds no GPU: the plugin then serves nothing)" if advertised == 0 else ""
    if state == MISSING:
        return Check(name, WARN, f"no plugin socket at {path}{idle}", PLUGIN_FIX)
    if state == NOT_SOCKET:
        return Check(name, WARN, f"{path} exists but is not a socket{idle}", PLUGIN_FIX)
    if state == REFUSED:
        return Check(name, WARN, f"{path} is a stale socket: the plugin stopped without removing it{idle}",
                     PLUGIN_FIX)
    return Check(name, WARN, f"cannot connect to {path}: {error}", "run the check as root")


def _device_ids(raw: Any) -> list[str]:
    # kubelet >= 1.20 keys device IDs by NUMA node ({"-1": [ids]}); older kubelets store a plain list
    if isinstance(raw, list):
        return [str(i) for i in raw]
    if isinstance(raw, dict):
        return [str(i) for ids in raw.values() if isinstance(ids, list) for i in ids]
    return []


def evaluate_checkpoint(path: str, text: str | None, resource: str) -> Check:
    name = "kubelet checkpoint"
    if text is None:
        return Check(name, SKIP, f"no {path} yet: the kubelet writes it once a device plugin registers")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return Check(name, WARN, f"{path} is not valid JSON ({exc}); the kubelet cannot restore allocations",
                     "the kubelet rewrites it: stop k3s, remove the file, start k3s")
    data = doc.get("Data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        return Check(name, WARN, f"{path} has no Data object: not a device manager checkpoint this check knows",
                     "the kubelet rewrites it: stop k3s, remove the file, start k3s")
    registered_raw = data.get("RegisteredDevices")
    registered = registered_raw if isinstance(registered_raw, dict) else {}
    healthy = _device_ids(registered.get(resource))
    entries = data.get("PodDeviceEntries")
    allocated: set[str] = set()
    pods: set[str] = set()
    containers = 0
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("ResourceName") != resource:
            continue
        containers += 1
        pods.add(str(entry.get("PodUID", "")))
        allocated.update(_device_ids(entry.get("DeviceIDs")))
    others = sorted(str(r) for r in registered if r != resource)
    other_text = f"; other resources: {', '.join(others)}" if others else ""
    use = f"{len(allocated)} allocated to {containers} container(s) in {len(pods)} pod(s)"
    if not healthy:
        return Check(name, WARN, f"the kubelet records no healthy {resource} device ({use}): pods requesting it "
                     f"stay Pending with Insufficient {resource}{other_text}",
                     f"start the plugin and fix the discovery / device node lines above; {PLUGIN_FIX}")
    full = " (all in use: another GPU pod waits until one of these ends)" if set(healthy) <= allocated else ""
    return Check(name, PASS, f"the kubelet records {len(healthy)} healthy {resource} device(s) "
                 f"({short_list(healthy)}), {use}{full}{other_text}")
