"""Optional HTTP listener: /healthz for liveness probes and /metrics for Prometheus.

Off unless --metrics-address is set (loopback is the documented default). /metrics carries
the plugin's own figures and, when a telemetry source is given, the GPUs' metrics under
dcgm-exporter's names (the `metrics` package). Routing and rendering are pure; the server
is a few lines on socketserver, started only when asked for.
"""

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

log = logging.getLogger(__name__)


class Status(NamedTuple):
    version: str
    backend: str
    resource: str
    healthy_devices: int
    unhealthy_devices: int
    registered: bool
    streams: int  # open ListAndWatch streams from the kubelet
    monitor_alive: bool
    registrations: int
    registration_failures: int
    kubelet_restarts: int
    allocations: int
    health_events: int
    config_reloads: int
    config_rejections: int
    state: str = ""  # what the session is doing or waiting for (readiness' STATUS= line)
    node: str = ""  # the Hostname label on every series, as on the GPUs' (observability.node)


def health_status(status: Status) -> tuple[int, str]:
    """HTTP code and a one-line reason: 200 only when the kubelet is really being served."""
    if status.healthy_devices + status.unhealthy_devices == 0:
        return 200, "ok: no GPUs on this node, nothing to serve"
    problems = []
    if not status.registered:
        problems.append("not registered with the kubelet")
    elif status.streams == 0:
        problems.append("registered but the kubelet holds no ListAndWatch stream")
    if not status.monitor_alive:
        problems.append("health monitor stopped")
    if problems and status.state:
        problems.append(status.state)
    return (503, "unhealthy: " + "; ".join(problems)) if problems else (200, "ok")


def _labels(*pairs: tuple[str, str]) -> str:
    """{key="value",...} of the pairs with a value, escaped as the exposition format wants."""
    escaped = ((key, value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"'))
               for key, value in pairs if value)
    inside = ",".join(f'{key}="{value}"' for key, value in escaped)
    return f"{{{inside}}}" if inside else ""


def render_metrics(status: Status) -> str:
    """The plugin's own figures, each with the node's `Hostname` (so a dashboard's node filter
    selects them with the GPUs' series)."""
    prefix = "gpu_device_plugin"
    node = ("Hostname", status.node)
    resource = ("resource", status.resource)
    lines = [
        f"# HELP {prefix}_info Build and discovery facts.",
        f"# TYPE {prefix}_info gauge",
        f"{prefix}_info{_labels(('version', status.version), ('backend', status.backend), node)} 1",
        f"# HELP {prefix}_devices Advertised devices by health.",
        f"# TYPE {prefix}_devices gauge",
        f"{prefix}_devices{_labels(resource, ('health', 'healthy'), node)} {status.healthy_devices}",
        f"{prefix}_devices{_labels(resource, ('health', 'unhealthy'), node)} {status.unhealthy_devices}",
        f"# HELP {prefix}_registered 1 while registered with the kubelet.",
        f"# TYPE {prefix}_registered gauge",
        f"{prefix}_registered{_labels(resource, node)} {int(status.registered)}",
        f"# HELP {prefix}_list_and_watch_streams Open ListAndWatch streams.",
        f"# TYPE {prefix}_list_and_watch_streams gauge",
        f"{prefix}_list_and_watch_streams{_labels(node)} {status.streams}",
    ]
    counters = {
        "registrations": (status.registrations, "Successful registrations with the kubelet."),
        "registration_failures": (status.registration_failures, "Failed registration attempts."),
        "kubelet_restarts": (status.kubelet_restarts, "Kubelet restarts seen (kubelet.sock re-created)."),
        "allocations": (status.allocations, "Containers given GPUs by Allocate."),
        "health_events": (status.health_events, "GPU health changes (to unhealthy or back)."),
        "config_reloads": (status.config_reloads, "Configuration changes applied."),
        "config_rejections": (status.config_rejections, "Configuration changes rejected as invalid."),
    }
    for name, (value, help_text) in counters.items():
        lines += [f"# HELP {prefix}_{name}_total {help_text}", f"# TYPE {prefix}_{name}_total counter",
                  f"{prefix}_{name}_total{_labels(node)} {value}"]
    return "\n".join(lines) + "\n"


class GpuMetrics(Protocol):
    """The GPUs' own metrics (metrics.telemetry.Telemetry): Prometheus text, read on each scrape."""

    def render(self) -> str: ...

    def close(self) -> None: ...


def metrics_body(status: Status, gpu_metrics: GpuMetrics | None) -> str:
    """The plugin's figures, then the GPUs'; a failing GPU read never costs the plugin's own."""
    body = render_metrics(status)
    if gpu_metrics is None:
        return body
    try:
        return body + gpu_metrics.render()
    except Exception:
        log.exception("reading GPU metrics failed; serving the plugin's own metrics only")
        return body


TEXT = "text/plain; charset=utf-8"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}
MAX_REQUEST_HEAD = 16384  # request line and headers; Prometheus sends a few hundred bytes
REQUEST_TIMEOUT_S = 10.0  # a client that stops sending mid-request frees its thread after this


def route(method: str, target: str, status: Callable[[], Status],
          gpu_metrics: GpuMetrics | None) -> tuple[int, str, str]:
    """(HTTP code, content type, body) for one request."""
    if method not in ("GET", "HEAD"):
        return 405, TEXT, f"{method} is not served here: GET /healthz or /metrics\n"
    path = target.split("?", 1)[0]
    if path == "/healthz":
        code, body = health_status(status())
        return code, TEXT, body + "\n"
    if path == "/metrics":
        return 200, PROMETHEUS_TEXT, metrics_body(status(), gpu_metrics)
    return 404, TEXT, "not found: try /healthz or /metrics\n"


def http_response(code: int, content_type: str, body: str, head_only: bool = False) -> bytes:
    data = body.encode()
    head = (f"HTTP/1.1 {code} {_REASONS.get(code, '')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode("ascii")
    return head if head_only else head + data


def parse_request_line(line: bytes) -> tuple[str, str] | None:
    """("GET", "/metrics") from b"GET /metrics HTTP/1.1\\r\\n", or None for anything else."""
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[1].startswith("/"):
        return None
    return parts[0], parts[1]


class StatusServer:
    """A small HTTP/1.1 server for the two paths, one short-lived thread per connection.

    Not the standard library's http.server: importing it pulls in http.client, and with it ssl
    and OpenSSL, about 7 MiB of the plugin's resident memory for two plain-text paths.
    """

    def __init__(self, address: str, status: Callable[[], Status], gpu_metrics: GpuMetrics | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]") or "127.0.0.1", int(port)
        self._status = status
        self._gpu_metrics = gpu_metrics
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import socketserver  # only when asked for

        status = self._status
        gpu_metrics = self._gpu_metrics

        class Handler(socketserver.StreamRequestHandler):
            timeout = REQUEST_TIMEOUT_S

            def handle(self) -> None:
                try:
                    request = self._read_head()
                except OSError:  # timed out or reset: nobody to answer
                    return
                if request is None:
                    answer = http_response(400, TEXT, "bad request: GET /healthz or /metrics\n")
                else:
                    method, target = request
                    answer = http_response(*route(method, target, status, gpu_metrics), head_only=method == "HEAD")
                with contextlib.suppress(OSError):
                    self.wfile.write(answer)

            def _read_head(self) -> tuple[str, str] | None:
                """The request line, once the whole head is read (closing with unread bytes resets the
                connection before the client reads the answer)."""
                request = parse_request_line(self.rfile.readline(MAX_REQUEST_HEAD))
                size = 0
                while size < MAX_REQUEST_HEAD:
                    line = self.rfile.readline(MAX_REQUEST_HEAD)
                    size += len(line)
                    if line in (b"\r\n", b"\n", b""):
                        return request
                return None

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 3600},
                                        name="status-http", daemon=True)
        self._thread.start()
        log.info("serving /healthz and /metrics on http://%s:%d", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            # serve_forever sleeps in select() for up to poll_interval; a connection wakes it now.
            stopper = threading.Thread(target=self._server.shutdown, daemon=True)
            stopper.start()
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1):
                pass
            stopper.join(5)
            self._server.server_close()
            self._server = None
        if self._gpu_metrics is not None:  # after the last scrape: it ends NVML's session
            self._gpu_metrics.close()
