"""Optional HTTP listener: /healthz for liveness probes and /metrics for Prometheus.

Off unless --metrics-address is set (loopback is the documented default). /metrics carries
the plugin's own figures and, when a telemetry source is given, the GPUs' metrics under
dcgm-exporter's names (the `metrics` package). Rendering is pure; the server is the
standard library's, started only when asked for.
"""

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import NamedTuple, Protocol

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


def render_metrics(status: Status) -> str:
    prefix = "gpu_device_plugin"
    resource = f'resource="{status.resource}"'
    lines = [
        f"# HELP {prefix}_info Build and discovery facts.",
        f"# TYPE {prefix}_info gauge",
        f'{prefix}_info{{version="{status.version}",backend="{status.backend}"}} 1',
        f"# HELP {prefix}_devices Advertised devices by health.",
        f"# TYPE {prefix}_devices gauge",
        f'{prefix}_devices{{{resource},health="healthy"}} {status.healthy_devices}',
        f'{prefix}_devices{{{resource},health="unhealthy"}} {status.unhealthy_devices}',
        f"# HELP {prefix}_registered 1 while registered with the kubelet.",
        f"# TYPE {prefix}_registered gauge",
        f"{prefix}_registered{{{resource}}} {int(status.registered)}",
        f"# HELP {prefix}_list_and_watch_streams Open ListAndWatch streams.",
        f"# TYPE {prefix}_list_and_watch_streams gauge",
        f"{prefix}_list_and_watch_streams {status.streams}",
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
                  f"{prefix}_{name}_total {value}"]
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


class StatusServer:
    def __init__(self, address: str, status: Callable[[], Status], gpu_metrics: GpuMetrics | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]") or "127.0.0.1", int(port)
        self._status = status
        self._gpu_metrics = gpu_metrics
        self._httpd = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # only when asked for

        status = self._status
        gpu_metrics = self._gpu_metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    code, body = health_status(status())
                    ctype = "text/plain; charset=utf-8"
                elif path == "/metrics":
                    code, body = 200, metrics_body(status(), gpu_metrics)
                    ctype = "text/plain; version=0.0.4; charset=utf-8"
                else:
                    code, body, ctype = 404, "not found: try /healthz or /metrics\n", "text/plain"
                data = body.encode() if body.endswith("\n") else (body + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:  # scrapes are not events worth a log line
                pass

        self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 3600},
                                        name="status-http", daemon=True)
        self._thread.start()
        log.info("serving /healthz and /metrics on http://%s:%d", self.host, self.port)

    def stop(self) -> None:
        if self._httpd is not None:
            # serve_forever sleeps in select() for up to poll_interval; a connection wakes it now.
            stopper = threading.Thread(target=self._httpd.shutdown, daemon=True)
            stopper.start()
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1):
                pass
            stopper.join(5)
            self._httpd.server_close()
            self._httpd = None
        if self._gpu_metrics is not None:  # after the last scrape: it ends NVML's session
            self._gpu_metrics.close()
