"""The gate's probes: each looks at one part of the node and says what it saw."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from gpu_k8s_update import decide
from gpu_k8s_update.model import HealthFacts, NodeStatus
from gpu_k8s_update.settings import Settings
from gpu_k8s_update.system import run_command

HTTP_TIMEOUT_S = 5.0


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path) -> None:
        super().__init__("localhost", timeout=HTTP_TIMEOUT_S)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(HTTP_TIMEOUT_S)
        self.sock.connect(str(self.socket_path))


def docker_up(socket_path: Path) -> tuple[bool, str]:
    """Docker's API answers GET /_ping with OK once the daemon serves requests."""
    connection = _UnixHTTPConnection(socket_path)
    try:
        connection.request("GET", "/_ping")
        response = connection.getresponse()
        body = response.read(64).decode("ascii", "replace").strip()
    except OSError as error:
        return False, f"{socket_path}: {error.strerror or error}"
    except http.client.HTTPException as error:
        return False, f"{socket_path}: {error}"
    finally:
        connection.close()
    if response.status == 200 and body == "OK":
        return True, ""
    return False, f"/_ping answered {response.status} {body!r}"


def docker_expected(socket_path: Path, daemon: Path) -> bool:
    """Docker is checked where it is installed (or its socket exists): a containerd-mode
    image has neither, and must not fail its gate for lacking docker."""
    return daemon.exists() or socket_path.exists()


def http_ok(url: str) -> tuple[bool, str]:
    """200 from a local health endpoint (the kubelet's healthz, the plugin's /healthz)."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return (True, "") if response.status == 200 else (False, f"{url} answered {response.status}")
    except urllib.error.HTTPError as error:
        body = error.read(200).decode("utf-8", "replace").strip()
        return False, f"{url} answered {error.code} {body}".strip()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return False, f"{url}: {reason}"


# kubectl's words when no API server answered at all (refused, no route, timeout, TLS never
# completed, the server still starting). Anything else the server said is an answer.
_UNREACHABLE_SIGNS = (
    "connection to the server", "unable to connect to the server", "connection refused", "i/o timeout",
    "no route to host", "network is unreachable", "tls handshake timeout", "context deadline exceeded",
    "client.timeout exceeded", "serviceunavailable", "the server is currently unable to handle the request",
    "eof", "connection reset by peer", "no answer within",
)


def api_unreachable(message: str, returncode: int) -> bool:
    """True when kubectl failed because no API server answered, False when one answered with
    an error (NotFound, Forbidden, Unauthorized...): that is a finding, not an outage."""
    if returncode in (124, 127):  # our timeout; no kubectl on the node
        return True
    text = message.lower()
    if "error from server (" in text and "serviceunavailable" not in text:
        return False
    if "must be logged in" in text or "unauthorized" in text or "forbidden" in text:
        return False
    return any(sign in text for sign in _UNREACHABLE_SIGNS)


def node_status(
    kubectl: Sequence[str], kubeconfigs: Sequence[Path], node_name: str
) -> tuple[NodeStatus | None, str, bool]:
    """The node as the API server sees it, through the node's own kubeconfig: (status,
    detail, answered). status None with answered False: no API server could be asked; with
    answered True: it answered, but not with this node (not registered, not allowed)."""
    kubeconfig = next((path for path in kubeconfigs if path.is_file()), None)
    if kubeconfig is None:
        return None, "no kubeconfig: " + ", ".join(str(path) for path in kubeconfigs), False
    result = run_command(
        [*kubectl, "--kubeconfig", str(kubeconfig), "--request-timeout=10s", "get", "node", node_name, "-o", "json"],
        timeout_s=30,
    )
    if result.returncode != 0:
        detail = result.last_line or f"kubectl exit {result.returncode}"
        if api_unreachable(result.output, result.returncode):
            return None, detail, False
        if "notfound" in detail.lower().replace(" ", ""):
            detail = (f"the API server has no node {node_name!r} ({detail}): the node did not register, or "
                      "k3s registered it under another name (set GPU_K8S_UPDATE_NODE_NAME)")
        return None, f"{detail} (with {kubeconfig})", True
    try:
        return decide.parse_node(json.loads(result.output)), "", True
    except ValueError:
        return None, "kubectl printed no JSON", True


def plugin_registered(checkpoint: Path, boot_time: float) -> tuple[bool, str]:
    """The kubelet rewrites its device-manager checkpoint when a plugin reports devices. The
    file lives on persistent storage, so only a write in this boot counts."""
    try:
        stat = checkpoint.stat()
        data = json.loads(checkpoint.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False, f"{checkpoint} does not exist yet (no plugin registered)"
    except (OSError, ValueError) as error:
        return False, f"{checkpoint}: {error}"
    if not isinstance(data, dict) or not decide.checkpoint_has_resource(data):
        return False, f"the kubelet lists no {decide.GPU_RESOURCE} devices in {checkpoint.name}"
    if stat.st_mtime < boot_time:
        return False, f"{checkpoint.name} was last written before this boot (plugin not registered yet)"
    return True, ""


def probe_health(settings: Settings, boot_time: float, node_name: str) -> HealthFacts:
    docker_ok: bool | None = None
    docker_detail = ""
    if settings.docker_socket is not None and docker_expected(settings.docker_socket, settings.docker_daemon):
        docker_ok, docker_detail = docker_up(settings.docker_socket)
    kubelet_ok, kubelet_detail = http_ok(settings.kubelet_healthz_url)
    node, node_detail, answered = node_status(settings.kubectl_command, settings.kubeconfigs, node_name)
    registered, plugin_detail = plugin_registered(settings.plugin_checkpoint, boot_time)
    healthz_ok: bool | None = None
    if settings.plugin_healthz_url:
        healthz_ok, healthz_detail = http_ok(settings.plugin_healthz_url)
        plugin_detail = healthz_detail or plugin_detail
    return HealthFacts(
        docker_ok=docker_ok,
        docker_detail=docker_detail,
        kubelet_ok=kubelet_ok,
        kubelet_detail=kubelet_detail,
        node=node,
        node_detail=node_detail,
        api_answered=answered,
        plugin_registered=registered,
        plugin_detail=plugin_detail,
        plugin_healthz_ok=healthz_ok,
    )
