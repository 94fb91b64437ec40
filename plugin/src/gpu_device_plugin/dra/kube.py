"""A minimal Kubernetes API client on the standard library (sockets, ssl, our HTTP/1.1 framing in
http1.py): a kubeconfig's current context (server, CA, a client certificate or a bearer token),
JSON requests and watches.

Why not a client library: the driver needs eight REST calls; the official Python client brings
~30 packages that no Yocto series carries, and the images must build the plugin from recipes
that exist on kirkstone and wrynose (PyYAML, which reads the kubeconfig, does).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from ..config import cache
from .http1 import HttpConnection, HttpError, Response


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the file, the field and the fix."""


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message


class Kubeconfig(NamedTuple):
    path: str
    server: str  # https://host:port[/prefix] (http only for tests)
    ca_file: str = ""
    ca_data: str = ""  # PEM
    cert_file: str = ""
    key_file: str = ""
    cert_data: bytes = b""
    key_data: bytes = b""
    token: str = ""
    token_file: str = ""
    insecure: bool = False
    # the name the server's certificate is checked against (and sent as SNI) instead of the URL's host: a
    # kube-apiserver picks its loopback certificate by SNI "apiserver-loopback-client"
    tls_server_name: str = ""


def _named(items: Any, name: str, kind: str, path: str) -> dict[str, Any]:
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(kind), dict):
            return item[kind]
    raise KubeconfigError(f"{path}: no {kind} named {name!r} (current-context names it): fix the kubeconfig")


SECRET_FIELDS = ("token", "client-key-data", "password", "auth-provider", "exec")


def _without_secrets(doc: Any) -> bool:
    """A kubeconfig that names its key and CA by file (k3s's kubelet.kubeconfig) may be kept parsed in
    the cache directory; one with a key, token or password inline never is."""
    users = doc.get("users") if isinstance(doc, dict) else None
    return isinstance(users, list) and all(
        isinstance(u, dict) and not set(u.get("user") or {}) & set(SECRET_FIELDS) for u in users)


def _yaml(text: str, path: str) -> Any:
    import yaml  # ~15 ms of the start: skipped when the cache holds this exact text

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"{path} is not valid YAML ({str(exc).splitlines()[0]})") from None


def parse_kubeconfig(text: str, path: str, cache_dir: str = "") -> Kubeconfig:
    """The current context of a kubeconfig document. Relative file paths are taken from the file's directory.
    `cache_dir`: where a secret-free document may be kept parsed (config.cache)."""
    doc = cache.document(text, lambda t: _yaml(t, path), cache_dir, "kubeconfig.json", _without_secrets)
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path} is not a kubeconfig (no mapping at the top)")
    current = doc.get("current-context")
    if not current:
        raise KubeconfigError(f"{path} has no current-context: set one (kubectl config use-context)")
    context = _named(doc.get("contexts"), current, "context", path)
    cluster = _named(doc.get("clusters"), context.get("cluster", ""), "cluster", path)
    user = _named(doc.get("users"), context.get("user", ""), "user", path) if context.get("user") else {}
    base = os.path.dirname(os.path.abspath(path))

    def file_of(value: Any) -> str:
        return os.path.join(base, str(value)) if value else ""

    def data_of(key: str) -> bytes:
        value = user.get(key) if key.startswith("client") else cluster.get(key)
        try:
            return base64.b64decode(value, validate=True) if value else b""
        except ValueError:
            raise KubeconfigError(f"{path}: {key} is not base64") from None

    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"{path}: cluster server {server!r} must be an https:// URL")
    return Kubeconfig(path=path, server=server.rstrip("/"),
                      ca_file=file_of(cluster.get("certificate-authority")),
                      ca_data=data_of("certificate-authority-data").decode(errors="replace"),
                      cert_file=file_of(user.get("client-certificate")), key_file=file_of(user.get("client-key")),
                      cert_data=data_of("client-certificate-data"), key_data=data_of("client-key-data"),
                      token=str(user.get("token") or ""), token_file=file_of(user.get("tokenFile")),
                      insecure=bool(cluster.get("insecure-skip-tls-verify")),
                      tls_server_name=str(cluster.get("tls-server-name") or ""))


def load_kubeconfig(path: str, cache_dir: str = "") -> Kubeconfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise KubeconfigError(f"cannot read the kubeconfig {path} ({exc.strerror}): on k3s it is the kubelet's "
                              "own (/var/lib/rancher/k3s/agent/kubelet.kubeconfig, written when the node joins); "
                              "point --kubeconfig at one, and run as root to read it") from None
    return parse_kubeconfig(text, path, cache_dir)


def _ssl_context(config: Kubeconfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.ca_file or None, cadata=config.ca_data or None)
    if config.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file or config.cert_data:
        if config.cert_data or config.key_data:
            import tempfile  # only for inline data: it loads random, shutil and more

            # ssl loads a certificate only from files: a private directory, removed once loaded
            with tempfile.TemporaryDirectory(prefix="gpu-dra-") as private:
                cert, key = os.path.join(private, "cert.pem"), os.path.join(private, "key.pem")
                for target, data, source in ((cert, config.cert_data, config.cert_file),
                                             (key, config.key_data, config.key_file)):
                    if not data and source:
                        with open(source, "rb") as f:
                            data = f.read()
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        out.write(data)
                context.load_cert_chain(cert, key)
        else:
            context.load_cert_chain(config.cert_file, config.key_file or None)
    return context


class KubeClient:
    """JSON over one kept-alive connection (calls are serialized), watches on connections of their own."""

    def __init__(self, config: Kubeconfig, timeout: float = 10.0) -> None:
        self.config = config
        self.timeout = timeout
        url = urllib.parse.urlsplit(config.server)
        self._tls = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._tls else 80)
        self._prefix = url.path.rstrip("/")
        try:
            self._context = _ssl_context(config) if self._tls else None
        except (OSError, ssl.SSLError) as exc:
            raise KubeconfigError(f"{config.path}: cannot load its certificates ({exc}): check the CA and the "
                                  "client certificate and key it names") from None
        self._lock = threading.Lock()
        self._connection: HttpConnection | None = None

    def _connect(self, timeout: float | None) -> HttpConnection:
        return HttpConnection(self._host, self._port, self._context, timeout, self.config.tls_server_name)

    def _headers(self, body: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "gpu-dra-driver"}
        token = self.config.token
        if self.config.token_file:
            with contextlib.suppress(OSError), open(self.config.token_file, encoding="utf-8") as f:
                token = f.read().strip()  # read each time: projected tokens rotate
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        return headers

    def _target(self, path: str, query: Mapping[str, str] | None) -> str:
        return self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None) -> Any:
        """One call; the decoded JSON answer, or ApiError (status 0: the server could not be reached)."""
        data = json.dumps(body).encode() if body is not None else None
        target = self._target(path, query)
        with self._lock:
            for attempt in (1, 2):
                reused = self._connection is not None
                try:
                    if self._connection is None:
                        self._connection = self._connect(self.timeout)
                    response = self._connection.send(method, target, self._headers(data), data)
                    payload = self._connection.read_body(response)
                    if not self._connection.reusable:
                        self._drop()
                    break
                except OSError as exc:
                    self._drop()
                    # a kept-alive connection the server closed meanwhile (it answered nothing) gets one retry
                    stale = reused and (isinstance(exc, (BrokenPipeError, ConnectionResetError)) or
                                        (isinstance(exc, HttpError) and "before answering" in str(exc)))
                    if attempt == 2 or not stale:
                        raise ApiError(0, "Unreachable", f"{method} {self.config.server}{path}: {exc}") from None
        return _decode(response.status, response.reason, payload, method, path)

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def watch(self, path: str, query: Mapping[str, str]) -> ApiWatch:
        """A watch request (`watch=true` is added); iterate the ApiWatch for its events."""
        try:
            connection = self._connect(None)  # a watch waits as long as the server keeps it open
        except OSError as exc:
            raise ApiError(0, "Unreachable", f"watch {self.config.server}{path}: {exc}") from None
        try:
            response = connection.send("GET", self._target(path, {**query, "watch": "true"}), self._headers(None),
                                       None)
            if response.status != 200:
                payload = connection.read_body(response)
                connection.close()
                _decode(response.status, response.reason, payload, "GET", path)
        except OSError as exc:
            connection.close()
            raise ApiError(0, "Unreachable", f"watch {self.config.server}{path}: {exc}") from None
        return ApiWatch(connection, response)


def _decode(status: int, reason: str, payload: bytes, method: str, path: str) -> Any:
    try:
        document = json.loads(payload) if payload else {}
    except ValueError:
        document = {"message": payload[:200].decode(errors="replace")}
    if 200 <= status < 300:
        return document
    message = document.get("message", "") if isinstance(document, dict) else ""
    raise ApiError(status, reason, f"{method} {path}: {message or reason}")


class ApiWatch:
    """The events of one watch, as (type, object) pairs, until the server ends it or `close()`."""

    def __init__(self, connection: HttpConnection, response: Response) -> None:
        self._connection = connection
        self._response = response
        self.closed = False

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        try:
            for line in self._connection.lines(self._response):
                if self.closed:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                yield str(event.get("type", "")), event.get("object") or {}
        except (OSError, ValueError):
            if not self.closed:
                raise
        finally:
            self.closed = True
            self._connection.close()

    def close(self) -> None:
        """From any thread: ends the iteration (the socket is shut down under the blocked read; the reading
        thread closes the connection)."""
        self.closed = True
        self._connection.shutdown()
