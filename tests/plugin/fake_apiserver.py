"""A small Kubernetes API server for the DRA driver's tests: the calls the driver makes, kept in memory,
over HTTP/1.1 on loopback (optionally TLS with client certificates), no network.

What it holds to of the real one: resourceVersions that go up and make an update with a stale one a
409; generateName; field selectors on spec.nodeName and spec.driver (and, as the Node authorizer,
list and watch of slices refused without the node's spec.nodeName selector when an identity is a
node's); NodeRestriction (a node creates and deletes only slices of its own node); watches as
chunked JSON lines from a resourceVersion. Feature gates that are off drop their fields, as the
real server drops fields of disabled gates (`gates={"DRADeviceTaints": False}`).
Tests script it: `put_claim`, `delete_slice` (as someone else), `fail_next`, `wait_for`.
"""

from __future__ import annotations

import copy
import itertools
import json
import queue
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS_PREFIX = "/apis/resource.k8s.io/v1/namespaces/"


class FakeApiServer:
    def __init__(self, user: str = "system:node:node-a", gates: dict[str, bool] | None = None,
                 tls: ssl.SSLContext | None = None, token: str = "test-token") -> None:
        self.user = user
        self.token = token
        self.gates = {"DRADeviceTaints": True, "DRAConsumableCapacity": True, **(gates or {})}
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call
        self._version = itertools.count(100)
        self._names = itertools.count(1)
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._watchers: list[queue.Queue[tuple[int, str, dict[str, Any]] | None]] = []
        self._failures: list[int] = []
        self._cond = threading.Condition()
        server = self
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
        self._http.daemon_threads = True
        if tls is not None:
            self._http.socket = tls.wrap_socket(self._http.socket, server_side=True)
        self.port = self._http.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            for watcher in self._watchers:
                watcher.put(None)
        self._http.shutdown()
        self._http.server_close()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def kubeconfig(self, path: str, extra_user: dict[str, Any] | None = None,
                   extra_cluster: dict[str, Any] | None = None) -> str:
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "node",
               "clusters": [{"name": "fake", "cluster": {"server": self.url, **(extra_cluster or {})}}],
               "users": [{"name": "node", "user": extra_user if extra_user is not None else {"token": self.token}}],
               "contexts": [{"name": "node", "context": {"cluster": "fake", "user": "node"}}]}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f)  # JSON is YAML
        return path

    # ------------------------------------------------------------ scripting

    def add_node(self, name: str) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}"}}

    def put_claim(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        with self._cond:
            self.claims[(meta["namespace"], meta["name"])] = copy.deepcopy(claim)

    def fail_next(self, *statuses: int) -> None:
        """The next calls answer these statuses (e.g. 503) before any work."""
        with self._cond:
            self._failures.extend(statuses)

    def delete_slice(self, name: str) -> None:
        """As someone else (the kubelet wiping a driver's slices)."""
        with self._cond:
            obj = self.slices.pop(name)
            obj["metadata"]["resourceVersion"] = str(next(self._version))
            self._emit("DELETED", obj)

    def slice_list(self) -> list[dict[str, Any]]:
        with self._cond:
            return copy.deepcopy(sorted(self.slices.values(), key=lambda s: s["metadata"]["name"]))

    def devices(self) -> dict[str, dict[str, Any]]:
        """Every published device by name, from the slices of the pool's newest generation."""
        found = self.slice_list()
        top = max((s["spec"]["pool"]["generation"] for s in found), default=0)
        return {d["name"]: d for s in found if s["spec"]["pool"]["generation"] == top for d in s["spec"]["devices"]}

    def wait_for(self, predicate: Callable[[FakeApiServer], bool], timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(f"the API server did not reach the expected state in {timeout} s; slices: "
                                     f"{json.dumps(list(self.slices.values()))[:2000]}")

    # ------------------------------------------------------------ the API (handler threads, under the lock)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        event = (int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj))
        self._events.append(event)
        for watcher in self._watchers:
            watcher.put(event)
        self._cond.notify_all()

    def _node(self) -> str:
        return self.user[len("system:node:"):] if self.user.startswith("system:node:") else ""

    def _admit_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj.update(apiVersion="resource.k8s.io/v1", kind="ResourceSlice")  # as the real one answers typed clients
        for device in obj.get("spec", {}).get("devices") or []:
            if not self.gates["DRADeviceTaints"]:
                device.pop("taints", None)
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", "2026-11-30T12:00:00Z")
            if not self.gates["DRAConsumableCapacity"]:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
        return obj

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        self.requests.append((method, path))
        if self._failures:
            return self._failures.pop(0), {"kind": "Status", "message": "injected failure"}
        if path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" and method == "POST":
            return 201, {**body, "status": {"userInfo": {"username": self.user, "groups": ["system:nodes"]}}}
        if path.startswith("/api/v1/nodes/") and method == "GET":
            node = self.nodes.get(path.rsplit("/", 1)[1])
            return (200, node) if node else (404, {"kind": "Status", "message": "node not found"})
        if path.startswith(CLAIMS_PREFIX) and method == "GET":
            namespace, _, name = path[len(CLAIMS_PREFIX):].split("/")
            claim = self.claims.get((namespace, name))
            return (200, claim) if claim else (404, {"kind": "Status", "message": f"resourceclaims {name} not found"})
        if path == SLICES and method == "GET":
            selected = self._selected(query)
            if selected is None:
                return 403, {"kind": "Status",
                             "message": "can only list/watch resourceslices with nodeName field selector"}
            return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                         "metadata": {"resourceVersion": str(next(self._version))},
                         "items": [copy.deepcopy(s) for s in self.slices.values() if selected(s)]}
        if path == SLICES and method == "POST":
            node = self._node()
            if node and body["spec"].get("nodeName") != node:
                return 403, {"kind": "Status", "message": "can only create ResourceSlice with the same NodeName"}
            obj = self._admit_slice(body)
            meta = obj["metadata"]
            if not meta.get("name"):
                meta["name"] = f"{meta.pop('generateName', 'slice-')}{next(self._names):05d}"
            if meta["name"] in self.slices:
                return 409, {"kind": "Status", "message": "already exists"}
            meta.update(uid=f"uid-{meta['name']}", resourceVersion=str(next(self._version)))
            self.slices[meta["name"]] = obj
            self._emit("ADDED", obj)
            return 201, obj
        if path.startswith(SLICES + "/"):
            name = path[len(SLICES) + 1:]
            current = self.slices.get(name)
            if current is None:
                return 404, {"kind": "Status", "message": f"resourceslices {name} not found"}
            if method == "DELETE":
                if self._node() and current["spec"].get("nodeName") != self._node():
                    return 403, {"kind": "Status", "message": "can only delete ResourceSlice of the same node"}
                del self.slices[name]
                current["metadata"]["resourceVersion"] = str(next(self._version))
                self._emit("DELETED", current)
                return 200, current
            if method == "PUT":
                if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    return 409, {"kind": "Status", "message": "the object has been modified"}
                if body["spec"].get("nodeName") != current["spec"].get("nodeName"):
                    return 422, {"kind": "Status", "message": "spec.nodeName: field is immutable"}
                obj = self._admit_slice(body)
                obj["metadata"].update(uid=current["metadata"]["uid"], resourceVersion=str(next(self._version)))
                self.slices[name] = obj
                self._emit("MODIFIED", obj)
                return 200, obj
        return 404, {"kind": "Status", "message": f"no route {method} {path}"}

    def _selected(self, query: dict[str, str]) -> Callable[[dict[str, Any]], bool] | None:
        wanted = dict(part.split("=", 1) for part in query.get("fieldSelector", "").split(",") if "=" in part)
        if self._node() and wanted.get("spec.nodeName") != self._node():
            return None
        return lambda s: all({"spec.nodeName": s["spec"].get("nodeName"), "spec.driver": s["spec"].get("driver")}
                             .get(key) == value for key, value in wanted.items())

    @contextmanager
    def watch(self, query: dict[str, str]) -> Iterator[queue.Queue[tuple[int, str, dict[str, Any]] | None]]:
        events: queue.Queue[tuple[int, str, dict[str, Any]] | None] = queue.Queue()
        since = int(query.get("resourceVersion") or 0)
        with self._cond:
            if query.get("sendInitialEvents") == "true":
                # client-go's watch-list (WatchListClient, on by default from 1.35): the objects as ADDED
                # events, then a bookmark that says the initial list is over
                version = next(self._version)
                for obj in self.slices.values():
                    events.put((version, "ADDED", copy.deepcopy(obj)))
                events.put((version, "BOOKMARK", {
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"resourceVersion": str(version),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}))
                since = version
            for event in self._events:
                if event[0] > since:
                    events.put(event)
            self._watchers.append(events)
        try:
            yield events
        finally:
            with self._cond:
                self._watchers.remove(events)


def _handler(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall

        def log_message(self, *args: object) -> None:
            pass

        def _authorized(self) -> bool:
            if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                peer = getattr(self.connection, "getpeercert", lambda: None)()
                if not peer:
                    self._send(401, {"kind": "Status", "message": "Unauthorized"})
                    return False
            return True

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            if not self._authorized():
                return
            if method == "GET" and query.get("watch") == "true" and url.path == SLICES:
                self._watch(query)
                return
            with server._cond:
                status, answer = server.handle(method, url.path, query, body)
            self._send(status, answer)

        def _watch(self, query: dict[str, str]) -> None:
            with server._cond:
                selected = server._selected(query)
            if selected is None:
                self._send(403, {"kind": "Status", "message": "watch needs the nodeName field selector"})
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with server.watch(query) as events:
                try:
                    while True:
                        event = events.get()
                        if event is None:
                            break
                        _, kind, obj = event
                        if kind != "BOOKMARK" and not selected(obj):
                            continue
                        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass
            self.close_connection = True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler
