"""The gate's optional GPU smoke pod: one pod pinned to this node that asks for one
nvidia.com/gpu and runs `true`. It proves what the other checks cannot: the kubelet admits a
GPU pod (the plugin's Allocate answers) and the container runtime starts it.

Off unless GPU_K8S_UPDATE_SMOKE_IMAGE names a preloaded image. It needs a kubeconfig that may
create pods: a server node's /etc/rancher/k3s/k3s.yaml (an agent's kubelet credentials may not)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpu_k8s_update.decide import GPU_RESOURCE
from gpu_k8s_update.system import run_command

POD_NAME = "gpu-k8s-update-smoke"
NAMESPACE = "default"


def pod_manifest(node_name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD_NAME, "namespace": NAMESPACE, "labels": {"app": POD_NAME}},
        "spec": {
            # nodeName skips the scheduler: the node is still cordoned by the rollout.
            "nodeName": node_name,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "smoke",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "true"],
                "resources": {"limits": {GPU_RESOURCE: "1"}},
            }],
        },
    }


def pod_outcome(pod: dict[str, Any]) -> tuple[bool | None, str]:
    """True: it ran; False: it cannot run (with why); None: not finished yet."""
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    if phase == "Succeeded":
        return True, ""
    if phase == "Failed":
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated:
                return False, f"exited {terminated.get('exitCode')} ({terminated.get('reason', '')})".strip()
        return False, f"{status.get('reason', 'Failed')}: {status.get('message', '')}".strip(": ")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("ErrImageNeverPull", "CreateContainerError", "CreateContainerConfigError"):
            return False, f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    return None, phase or "no status yet"


def run_smoke_pod(
    kubectl: Sequence[str],
    kubeconfig: Path,
    node_name: str,
    image: str,
    timeout_s: float = 180.0,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> tuple[bool, str]:
    base = [*kubectl, "--kubeconfig", str(kubeconfig), "--request-timeout=20s"]
    delete = [*base, "delete", "pod", POD_NAME, "-n", NAMESPACE, "--ignore-not-found", "--wait=false"]
    run_command(delete, timeout_s=60)
    created = _apply(base, pod_manifest(node_name, image))
    if created:
        return False, f"cannot create the smoke pod: {created}"
    try:
        started = monotonic()
        detail = "no status yet"
        while monotonic() - started < timeout_s:
            result = run_command([*base, "get", "pod", POD_NAME, "-n", NAMESPACE, "-o", "json"], timeout_s=60)
            if result.returncode == 0:
                try:
                    done, detail = pod_outcome(json.loads(result.output))
                except ValueError:
                    done, detail = None, "kubectl printed no JSON"
                if done is not None:
                    return done, detail
            sleep(2.0)
        return False, f"did not finish within {timeout_s:.0f}s ({detail})"
    finally:
        run_command(delete, timeout_s=60)


def _apply(base: Sequence[str], manifest: dict[str, Any]) -> str:
    try:
        completed = subprocess.run([*base, "apply", "-f", "-"], input=json.dumps(manifest), text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if completed.returncode != 0:
        lines = [line for line in completed.stdout.splitlines() if line.strip()]
        return lines[-1] if lines else f"kubectl exit {completed.returncode}"
    return ""
