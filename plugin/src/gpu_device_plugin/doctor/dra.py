"""Check 8: the DRA driver, on a node whose GPUs it hands out (allocationApi dra or both).

What this node shows without the API server: which API the config chose, whether k3s can apply
a claim's CDI devices at all (not through docker), the driver's two sockets as the kubelet finds
them, and the claims its checkpoint holds. The devices' health reaches the cluster as device
taints in the driver's ResourceSlices (docs/dra.md); here the discovery and device-node checks
above say what the driver's health monitors see.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..dra.checkpoint import FILE as CHECKPOINT_FILE
from ..dra.settings import DEFAULT_DRIVER
from .k3s import K3sConfig
from .kubelet import LISTENING, MISSING, REFUSED
from .report import FAIL, PASS, SKIP, WARN, Check

NAME = "DRA driver"
DRIVER_FIX = "is gpu-dra-driver.service running? journalctl -u gpu-dra-driver"


@dataclass(frozen=True)
class DraPaths:
    """Where the driver serves on this kubelet (the unit's defaults, beside the kubelet's root)."""

    registration: str
    dra: str
    checkpoint: str

    @classmethod
    def beside(cls, kubelet_socket: str, driver: str = DEFAULT_DRIVER) -> DraPaths:
        # /var/lib/kubelet/device-plugins/kubelet.sock -> /var/lib/kubelet
        root = os.path.dirname(os.path.dirname(kubelet_socket.rstrip("/"))) or "/"
        plugin_dir = os.path.join(root, "plugins", driver)
        return cls(os.path.join(root, "plugins_registry", f"{driver}-reg.sock"),
                   os.path.join(plugin_dir, "dra.sock"), os.path.join(plugin_dir, CHECKPOINT_FILE))


def prepared_claims(text: str | None) -> int | None:
    """How many claims the driver's checkpoint holds; 0 with no checkpoint, None when unreadable."""
    if text is None:
        return 0
    try:
        claims = json.loads(text).get("claims")
    except (ValueError, AttributeError):
        return None
    return len(claims) if isinstance(claims, dict) else None


def evaluate_dra(allocation_api: str, k3s: K3sConfig, paths: DraPaths, registration: str, dra: str,
                 checkpoint: str | None) -> Check:
    """`registration`, `dra`: the sockets' states (kubelet.probe_socket); `checkpoint`: its text or None."""
    if allocation_api not in ("dra", "both"):
        return Check(NAME, SKIP, f"allocationApi is {allocation_api or 'device-plugin'}: the device plugin hands "
                     "out this node's GPUs and the DRA driver stays idle")
    if k3s.docker:
        return Check(NAME, FAIL, f"allocationApi is {allocation_api}, but k3s runs pods through docker (docker: true "
                     f"in {k3s.docker_from}), whose cri-dockerd drops a claim's CDI devices: the driver refuses to "
                     "publish, so claims for this node's GPUs stay unallocated",
                     'build the image with GPU_K8S_K3S_RUNTIME = "containerd", or set allocationApi: device-plugin')
    down = [(what, path, state) for what, path, state in (("registration", paths.registration, registration),
                                                           ("DRA", paths.dra, dra)) if state != LISTENING]
    if down:
        said = {MISSING: "missing", REFUSED: "stale (nothing accepts on it)"}
        detail = "; ".join(f"its {what} socket {path} is {said.get(state, state)}" for what, path, state in down)
        return Check(NAME, FAIL, f"allocationApi is {allocation_api}, but {detail}: the kubelet cannot prepare "
                     "claims, so pods with a GPU claim do not start", DRIVER_FIX)
    claims = prepared_claims(checkpoint)
    if claims is None:
        return Check(NAME, WARN, f"{paths.checkpoint} is unreadable: the driver sets it aside at its next start "
                     "and prepares claims again", DRIVER_FIX)
    extended = " and serves nvidia.com/gpu requests through DRA" if allocation_api == "both" else ""
    return Check(NAME, PASS, f"the DRA driver listens on {paths.registration} and {paths.dra}{extended}; "
                 f"{claims} prepared claim(s) in its checkpoint")
