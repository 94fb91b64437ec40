"""The kubelet's PodResources API v1 `List`, over its Unix socket, without grpcio.

One unary call per use through api/grpc_client (a fresh connection each time, as Register
does); the answer is read with the wire codec from api/podresources' declaration. A missing
socket (no kubelet on this node yet) is not an error: there is just nobody to attribute.
"""

from __future__ import annotations

import os
from typing import Any

from ..api import grpc_client, podresources, wire
from ..api.status import RpcFailure

CLASSES = wire.message_classes(podresources.MESSAGES)


class PodResourcesError(Exception):
    """The kubelet's PodResources service did not answer; the message says why."""


def socket_beside(kubelet_socket: str) -> str:
    """The PodResources socket of the kubelet whose device-plugin socket is `kubelet_socket`:
    /var/lib/kubelet/device-plugins/kubelet.sock -> /var/lib/kubelet/pod-resources/kubelet.sock."""
    root = os.path.dirname(os.path.dirname(kubelet_socket.rstrip("/"))) or "/"
    return os.path.join(root, "pod-resources", "kubelet.sock")


def list_pods(socket_path: str, timeout: float = 2.0) -> list[Any] | None:
    """Every pod's resources, or None when no kubelet serves `socket_path` (the socket is absent)."""
    if not os.path.exists(socket_path):
        return None
    request = CLASSES["ListPodResourcesRequest"]().SerializeToString()
    try:
        answer = grpc_client.call(socket_path, podresources.LIST_METHOD, request, timeout)
        return list(CLASSES["ListPodResourcesResponse"].FromString(answer).pod_resources)
    except RpcFailure as failure:
        raise PodResourcesError(f"{socket_path}: {failure.code.name}: {failure.details}") from None
    except wire.DecodeError as exc:
        raise PodResourcesError(f"{socket_path}: unreadable answer ({exc})") from None
