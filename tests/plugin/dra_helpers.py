"""Shared pieces for the DRA driver's tests: a driver running in-process against the fake API server,
a grpcio client of its sockets (the kubelet's side), claims as the scheduler allocates them."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
from fake_apiserver import FakeApiServer
from gpu_device_plugin.api import dra, schema
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.dra.cluster import Cluster
from gpu_device_plugin.dra.daemon import DraDaemon
from gpu_device_plugin.dra.kube import KubeClient, load_kubeconfig
from gpu_device_plugin.dra.settings import DraSettings
from gpu_device_plugin.model import Gpu, Health

DRIVER = "gpu.meta-gpu-k8s.io"
NODE = "node-a"
PB = {api.package: schema.protobuf_classes(api) for api in dra.APIS}


class StubMonitor:
    """A health monitor the test drives: `report(gpu_id, health)` as a real one would from its thread."""

    def __init__(self) -> None:
        self._report: Any = None
        self.started = threading.Event()
        self.stopped = False

    def start(self, gpus: Sequence[Gpu], report: Any) -> None:
        self._report = report
        self.started.set()

    def stop(self) -> None:
        self.stopped = True

    def alive(self) -> bool:
        return True

    def report(self, gpu_id: str, health: Health) -> None:
        assert self.started.wait(10), "the driver never started its health monitor"
        self._report(gpu_id, health)


class Dirs:
    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="gdra-", dir="/tmp")  # short: socket paths <= 107 bytes
        self.registry = os.path.join(self.root, "reg")
        self.plugin = os.path.join(self.root, "plug")
        self.cdi = os.path.join(self.root, "cdi")
        self.state = os.path.join(self.root, "state")
        self.kubeconfig = os.path.join(self.root, "kubeconfig")

    def settings(self, **overrides: Any) -> DraSettings:
        return DraSettings(kubeconfig=self.kubeconfig, node_name=NODE, driver_name=DRIVER,
                           plugins_registry_dir=self.registry, plugin_dir=self.plugin, cdi_dir=self.cdi,
                           state_dir=self.state, api_timeout=5.0)._replace(**overrides)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class RunningDriver:
    def __init__(self, daemon: DraDaemon) -> None:
        self.daemon = daemon
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(daemon.run()), daemon=True)

    def __enter__(self) -> RunningDriver:
        self.thread.start()
        assert self.daemon.serving.wait(10) or self.result, "the driver did not start serving"
        return self

    def stop(self) -> int:
        self.daemon.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the driver did not stop within 10 s"
        return self.result[0]

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.stop()


def make_driver(api: FakeApiServer, dirs: Dirs, gpus: Sequence[Gpu] | None = None, *,
                settings: Settings | None = None, monitor: StubMonitor | None = None, run: Any = None,
                **dra_overrides: Any) -> DraDaemon:
    api.kubeconfig(dirs.kubeconfig)
    dra_settings = dirs.settings(**dra_overrides)
    client = KubeClient(load_kubeconfig(dirs.kubeconfig), 5.0)
    gpus = list(gpus) if gpus is not None else SimulatedBackend(2).discover()
    settings = settings or Settings(device_discovery_strategy="simulated", simulated_gpus=len(gpus))
    extra = {"run": run} if run is not None else {}
    return DraDaemon(settings, dra_settings, NODE, Cluster(client, NODE, DRIVER), gpus,
                     (lambda found: monitor) if monitor else (lambda found: None), environ={}, **extra)


@contextmanager
def driver_env(**api_options: Any) -> Iterator[tuple[FakeApiServer, Dirs]]:
    dirs = Dirs()
    try:
        with FakeApiServer(**api_options) as api:
            api.add_node(NODE)
            yield api, dirs
    finally:
        dirs.remove()


class KubeletSide:
    """What the kubelet's plugin manager and DRA manager call, through grpcio."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")

    def close(self) -> None:
        self.channel.close()

    def call(self, api: schema.Api, service: str, method: str, request: Any, timeout: float = 10.0) -> Any:
        for name, req, resp, streaming in api.services[service]:
            if name == method:
                classes = PB[api.package]
                factory = self.channel.unary_stream if streaming else self.channel.unary_unary
                stub = factory(api.method_path(service, method), request_serializer=classes[req].SerializeToString,
                               response_deserializer=classes[resp].FromString)
                return stub(request, timeout=timeout)
        raise KeyError(method)

    def get_info(self) -> Any:
        return self.call(dra.REGISTRATION, "Registration", "GetInfo", PB["pluginregistration"]["InfoRequest"]())

    def notify(self, registered: bool, error: str = "") -> Any:
        status = PB["pluginregistration"]["RegistrationStatus"](plugin_registered=registered, error=error)
        return self.call(dra.REGISTRATION, "Registration", "NotifyRegistrationStatus", status)

    def prepare(self, *claims: tuple[str, str, str], api: schema.Api = dra.DRA_V1) -> Any:
        classes = PB[api.package]
        request = classes["NodePrepareResourcesRequest"](
            claims=[classes["Claim"](namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        return self.call(api, "DRAPlugin", "NodePrepareResources", request)

    def unprepare(self, *claims: tuple[str, str, str], api: schema.Api = dra.DRA_V1) -> Any:
        classes = PB[api.package]
        request = classes["NodeUnprepareResourcesRequest"](
            claims=[classes["Claim"](namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        return self.call(api, "DRAPlugin", "NodeUnprepareResources", request)

    def health_stream(self) -> Any:
        return self.call(dra.HEALTH, "DRAResourceHealth", "NodeWatchResources",
                         PB["v1alpha1"]["NodeWatchResourcesRequest"](), timeout=30)


def allocated_claim(name: str, uid: str, *results: dict[str, Any], config: Sequence[dict[str, Any]] = (),
                    namespace: str = "default") -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: status.allocation with `results` and `config`."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": [{"name": r["request"].split("/")[0],
                                               "exactly": {"deviceClassName": "gpu.meta-gpu-k8s.io"}}
                                              for r in results]}},
            "status": {"allocation": {"devices": {"results": list(results), "config": list(config)},
                                      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                          {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}}


def result(device: str, request: str = "gpu", driver: str = DRIVER, pool: str = NODE, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def wait_until(predicate: Any, timeout: float = 10.0, what: str = "the condition") -> None:
    """Wait for a condition of the file system (a socket served again): checked every 10 ms."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.01)
