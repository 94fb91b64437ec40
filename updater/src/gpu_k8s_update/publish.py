"""The node's update state, published as annotations on its own Node object, so the build host's
`./task status` sees every node (running release, slot, pending / committed / rolled back /
failed and why) without logging in to one.

Annotations, not labels: the NodeRestriction admission plugin keeps a node from changing its
taints and its labels under kubernetes.io, k8s.io and node-restriction.kubernetes.io, but lets it
change its own annotations; the node authorizer lets it patch its own Node object. So the
kubelet's credential, which every node has, is enough (settings.status_kubeconfigs tries it
first). Publishing never decides anything: a node whose API server does not answer keeps
updating, and publishes again at its next step."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpu_k8s_update.system import run_command

log = logging.getLogger(__name__)

PREFIX = "update.gpu-k8s.io/"
OS_VERSION = PREFIX + "os-version"  # the release the running root filesystem carries
SLOT = PREFIX + "slot"  # the slot it boots: Tegra A/B, or the boot partition (x86-64, Nano)
AB_BACKEND = PREFIX + "ab-backend"
STATE = PREFIX + "update-state"  # one of STATES
TARGET = PREFIX + "update-version"  # the release the state is about
REASON = PREFIX + "update-reason"
TIME = PREFIX + "update-time"  # UTC, when the state was reached
# The data partition since the last committed update, as the layer's gpu-k8s-data-check left it
# (data_check.py): `ok`, `repaired TIME`, `recreated TIME` (everything on /data was lost),
# `unavailable TIME` (it does not mount in this boot), `unknown` (no check on record).
DATA = PREFIX + "data"
KEYS = (OS_VERSION, SLOT, AB_BACKEND, STATE, TARGET, REASON, TIME, DATA)

PENDING, COMMITTED, ROLLED_BACK, FAILED = "pending", "committed", "rolled-back", "failed"
STATES = (PENDING, COMMITTED, ROLLED_BACK, FAILED)
# Annotations may hold 256 KiB in all; a reason is one line for people.
MAX_REASON = 900


def slot_label(slots: Mapping[str, str]) -> str:
    """One short word for the slot from the backend's report: Tegra's root filesystem slot
    letter, or the partition the bootloader boots (mender_boot_part)."""
    if slots.get("rootfs_slot"):
        return slots["rootfs_slot"]
    if slots.get("next_boot_part"):
        return f"part {slots['next_boot_part']}"
    return "?"


def annotations(state: str, target: str, reason: str, booted: str, slot: str, backend: str, data: str,
                now: float | None = None) -> dict[str, str]:
    if state not in STATES:
        raise ValueError(f"unknown update state {state!r}")
    one_line = " ".join(reason.split())
    if len(one_line) > MAX_REASON:
        one_line = one_line[:MAX_REASON - 1] + "…"
    return {
        OS_VERSION: booted,
        SLOT: slot,
        AB_BACKEND: backend,
        STATE: state,
        TARGET: target,
        REASON: one_line,
        TIME: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        DATA: data,
    }


def merge_patch(values: Mapping[str, str]) -> str:
    """A JSON merge patch that touches only these annotations of the Node."""
    return json.dumps({"metadata": {"annotations": dict(values)}}, sort_keys=True)


def publish(kubectl: Sequence[str], kubeconfigs: Sequence[Path], node_name: str,
            values: Mapping[str, str]) -> tuple[bool, str]:
    """Patch the node's annotations with the first kubeconfig the API server accepts.
    Returns (done, what happened)."""
    found = [path for path in kubeconfigs if path.is_file()]
    if not found:
        return False, "no kubeconfig: " + ", ".join(str(path) for path in kubeconfigs)
    said = []
    for kubeconfig in found:
        result = run_command([*kubectl, "--kubeconfig", str(kubeconfig), "--request-timeout=10s", "patch", "node",
                              node_name, "--type", "merge", "-p", merge_patch(values)], timeout_s=30)
        if result.returncode == 0:
            return True, f"published with {kubeconfig}"
        said.append(f"{kubeconfig}: {result.last_line or f'exit {result.returncode}'}")
    return False, "; ".join(said)
