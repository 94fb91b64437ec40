"""The API calls the driver makes, as the resource.k8s.io/v1 API names them: this node's slices of this
driver (list, watch, create, update, delete), a ResourceClaim, the Node, and who we are.

The node's own identity (system:node:<name>, the kubelet's certificate on k3s) is allowed all of them
by the Node authorizer at 1.36: slices whose spec.nodeName is the node (NodeRestriction checks it on
create and delete; nodeName is immutable), list and watch only with a spec.nodeName field selector,
and a ResourceClaim only when a pod bound to the node uses it.
"""

from typing import Any

from .kube import ApiError, ApiWatch, KubeClient

RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE_API}/resourceslices"
NODE_PREFIX = "system:node:"


class Cluster:
    def __init__(self, client: KubeClient, node: str, driver: str) -> None:
        self.client = client
        self.node = node
        self.driver = driver

    @property
    def _selector(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node},spec.driver={self.driver}"}

    def list_slices(self) -> tuple[list[dict[str, Any]], str]:
        """Our slices and the list's resourceVersion (where a watch starts)."""
        answer = self.client.request("GET", SLICES, query=self._selector)
        return list(answer.get("items") or []), str((answer.get("metadata") or {}).get("resourceVersion", ""))

    def watch_slices(self, resource_version: str) -> ApiWatch:
        return self.client.watch(SLICES, {**self._selector, "resourceVersion": resource_version,
                                          "allowWatchBookmarks": "true"})

    def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.client.request("POST", SLICES, obj)

    def update_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.client.request("PUT", f"{SLICES}/{obj['metadata']['name']}", obj)

    def delete_slice(self, name: str) -> None:
        try:
            self.client.request("DELETE", f"{SLICES}/{name}")
        except ApiError as exc:
            if exc.status != 404:  # already gone is what we wanted
                raise

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.client.request("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")

    def node_owner(self) -> dict[str, str] | None:
        """The Node's name and uid, to own our slices; None when we may not read it (another identity)."""
        try:
            node = self.client.request("GET", f"/api/v1/nodes/{self.node}")
        except ApiError:
            return None
        uid = (node.get("metadata") or {}).get("uid")
        return {"name": self.node, "uid": str(uid)} if uid else None


def identity(client: KubeClient) -> str:
    """Who the API server takes us for (a SelfSubjectReview, which every authenticated user may make)."""
    review = client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username", ""))


def node_of(username: str) -> str:
    """The node a node identity speaks for ("system:node:orin-1" -> "orin-1"); "" for any other user."""
    return username[len(NODE_PREFIX):] if username.startswith(NODE_PREFIX) else ""
