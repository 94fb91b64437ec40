"""`gpu-k8s-update wait-plan`: the agent rings' prepare step. It blocks until each Plan it names
has completed this very version, in turn: a canary waits for the server ring (no agent starts
before every server runs the release), a fleet node for the server ring and its canaries.

It runs as `chroot /host gpu-k8s-update wait-plan ...` in the job's prepare container. The
chroot hides the pod's service-account files, so the container's shell passes the token and
CA in the environment (GPU_K8S_UPDATE_API_TOKEN, GPU_K8S_UPDATE_API_CA); the API address is
the KUBERNETES_SERVICE_HOST/PORT every pod gets."""

from __future__ import annotations

import json
import logging
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def suc_version(version: str) -> str:
    """system-upgrade-controller stores spec.version with '+' replaced (image tags cannot hold it)."""
    return version.replace("+", "-")


def plan_state(plan: Mapping[str, Any], version: str) -> tuple[bool, str]:
    """Whether the Plan completed `version`, and what it is doing otherwise."""
    status = plan.get("status") or {}
    latest = status.get("latestVersion", "")
    if latest != suc_version(version):
        return False, f"Plan is at version {latest or '(none yet)'}, waiting for {suc_version(version)}"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Complete":
            if condition.get("status") == "True":
                return True, "complete"
            detail = condition.get("reason") or condition.get("message") or "not complete"
            break
    else:
        detail = "no Complete condition yet"
    applying = status.get("applying") or []
    return False, f"{detail}; applying on {', '.join(applying) if applying else 'no node'}"


def fetch_plan_from_api(environ: Mapping[str, str], namespace: str, name: str) -> Callable[[], Mapping[str, Any]]:
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = environ.get("GPU_K8S_UPDATE_API_TOKEN", "")
    ca = environ.get("GPU_K8S_UPDATE_API_CA", "")
    if not (host and token and ca):
        raise ValueError(
            "wait-plan needs KUBERNETES_SERVICE_HOST, GPU_K8S_UPDATE_API_TOKEN and GPU_K8S_UPDATE_API_CA "
            "(the Plan's prepare container sets them from its service account)"
        )
    context = ssl.create_default_context(cadata=ca)
    url = f"https://{host}:{port}/apis/upgrade.cattle.io/v1/namespaces/{namespace}/plans/{name}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})

    def fetch() -> Mapping[str, Any]:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return json.loads(response.read().decode("utf-8"))

    return fetch


def wait_for_plan(
    fetch: Callable[[], Mapping[str, Any]],
    version: str,
    name: str,
    sleep: Callable[[float], None],
    poll_interval_s: float,
) -> int:
    """Poll until the Plan completed `version`. There is no timeout of our own: the job's
    active deadline ends the wait, which fails the job and stops the ring there."""
    last = ""
    while True:
        try:
            done, detail = plan_state(fetch(), version)
        except (urllib.error.URLError, OSError, ValueError) as error:
            done, detail = False, f"cannot read Plan {name}: {getattr(error, 'reason', error)}"
        if done:
            log.info("wait-plan: %s completed version %s: this ring may start", name, version)
            return EXIT_OK
        if detail != last:
            log.info("wait-plan: waiting for %s: %s", name, detail)
            last = detail
        sleep(poll_interval_s)
