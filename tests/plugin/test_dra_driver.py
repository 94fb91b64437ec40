"""The DRA driver end to end on its real sockets: registration as the plugin watcher sees it, the
ResourceSlices it keeps on an API server, NodePrepareResources / NodeUnprepareResources in both
versions as the kubelet calls them (grpcio here; the Go harness runs the kubelet's own code), the
health stream, restarts, and a clean stop."""

from __future__ import annotations

import json
import os

import grpc
import pytest
from dra_helpers import (
    DRIVER,
    NODE,
    KubeletSide,
    RunningDriver,
    StubMonitor,
    allocated_claim,
    driver_env,
    make_driver,
    result,
    wait_until,
)
from gpu_device_plugin.api import dra
from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.discovery.simulated import SimulatedBackend
from gpu_device_plugin.model import Health
from helpers import remove_watched_tree


def test_the_plugin_watcher_finds_a_dra_plugin_with_both_services_and_our_name() -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        kubelet = KubeletSide(running.daemon.dra.registration_socket)
        try:
            info = kubelet.get_info()
            assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, f"{dirs.plugin}/dra.sock")
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            assert os.path.basename(running.daemon.dra.registration_socket) == f"{DRIVER}-reg.sock"
            kubelet.notify(True)
            assert running.daemon.registration.registered.is_set()
            kubelet.notify(False, "version not supported")
            assert not running.daemon.registration.registered.is_set()
            assert running.daemon.registration.last_error == "version not supported"
        finally:
            kubelet.close()


def test_slices_are_published_owned_by_the_node_and_come_back_when_someone_deletes_them() -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})
        [obj] = api.slice_list()
        spec = obj["spec"]
        assert (spec["driver"], spec["nodeName"], spec["pool"]["name"], spec["pool"]["resourceSliceCount"]) == (
            DRIVER, NODE, NODE, 1)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-node-a"
        first_generation = spec["pool"]["generation"]
        api.delete_slice(obj["metadata"]["name"])  # the kubelet wipes a driver's slices it cannot reach
        api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})
        assert api.slice_list()[0]["spec"]["pool"]["generation"] >= first_generation
        assert running.daemon.publisher.published.wait(10)


def test_an_unchanged_driver_restart_writes_no_slice() -> None:
    with driver_env() as (api, dirs):
        with RunningDriver(make_driver(api, dirs)) as running:
            assert running.daemon.publisher.published.wait(10)
        before = api.slice_list()
        with RunningDriver(make_driver(api, dirs)) as running:
            assert running.daemon.publisher.published.wait(10)
            assert running.daemon.publisher.writes == 0
        assert api.slice_list() == before


def claim_spec_file(dirs, uid: str) -> str:
    return os.path.join(dirs.cdi, f"k8s.{DRIVER}-claim_{uid}.json")


@pytest.mark.parametrize("version", [dra.DRA_V1, dra.DRA_V1BETA1], ids=["v1", "v1beta1"])
def test_prepare_writes_one_cdi_spec_per_claim_and_unprepare_removes_it(version) -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        api.put_claim(allocated_claim("train", "uid-1", result("gpu-1")))
        kubelet = KubeletSide(running.daemon.dra.dra_socket)
        try:
            response = kubelet.prepare(("default", "uid-1", "train"), api=version)
            claim = response.claims["uid-1"]
            assert claim.error == ""
            [device] = claim.devices
            assert (list(device.request_names), device.pool_name, device.device_name) == (["gpu"], NODE, "gpu-1")
            assert list(device.cdi_device_ids) == [f"k8s.{DRIVER}/claim=uid-1-gpu-1"]
            with open(claim_spec_file(dirs, "uid-1")) as f:
                spec = json.load(f)
            assert spec["kind"] == f"k8s.{DRIVER}/claim"
            assert [d["name"] for d in spec["devices"]] == ["uid-1-gpu-1"]
            assert spec["devices"][0]["containerEdits"]["env"] == ["SIMULATED_GPU_1=sim-gpu-1"]
            again = kubelet.prepare(("default", "uid-1", "train"), api=version)  # the kubelet retries
            assert again == response
            assert kubelet.unprepare(("default", "uid-1", "train"), api=version).claims["uid-1"].error == ""
            assert not os.path.exists(claim_spec_file(dirs, "uid-1"))
            assert kubelet.unprepare(("default", "uid-1", "train"), api=version).claims["uid-1"].error == ""
        finally:
            kubelet.close()


def test_one_claims_failure_is_its_own_error_and_the_others_are_prepared() -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        api.put_claim(allocated_claim("good", "uid-good", result("gpu-0")))
        api.put_claim(allocated_claim("stale", "uid-new", result("gpu-1")))
        api.put_claim(allocated_claim("elsewhere", "uid-else", result("gpu-0", pool="node-b")))
        kubelet = KubeletSide(running.daemon.dra.dra_socket)
        try:
            response = kubelet.prepare(("default", "uid-good", "good"), ("default", "uid-old", "stale"),
                                       ("default", "uid-else", "elsewhere"), ("default", "uid-gone", "gone"))
            assert response.claims["uid-good"].error == ""
            assert "deleted and made again" in response.claims["uid-old"].error
            assert "node-b/gpu-0" in response.claims["uid-else"].error
            assert "not found" in response.claims["uid-gone"].error
            assert sorted(os.listdir(dirs.cdi)) == [f"k8s.{DRIVER}-claim_uid-good.json"]
        finally:
            kubelet.close()


def test_a_prepared_claim_survives_a_driver_restart_without_the_api_server() -> None:
    with driver_env() as (api, dirs):
        api.put_claim(allocated_claim("train", "uid-1", result("gpu-0")))
        with RunningDriver(make_driver(api, dirs)) as running:
            kubelet = KubeletSide(running.daemon.dra.dra_socket)
            first = kubelet.prepare(("default", "uid-1", "train"))
            kubelet.close()
        os.unlink(claim_spec_file(dirs, "uid-1"))  # /var/run/cdi is a tmpfs: gone after a reboot
        api.claims.clear()
        with RunningDriver(make_driver(api, dirs)) as running:
            kubelet = KubeletSide(running.daemon.dra.dra_socket)
            try:
                again = kubelet.prepare(("default", "uid-1", "train"))
                assert again == first
                assert os.path.exists(claim_spec_file(dirs, "uid-1"))
                assert kubelet.unprepare(("default", "uid-1", "train")).claims["uid-1"].error == ""
            finally:
                kubelet.close()


def test_an_unhealthy_gpu_is_tainted_in_its_slice_and_on_the_health_stream_until_it_recovers() -> None:
    monitor = StubMonitor()
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs, monitor=monitor)) as running:
        api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})
        kubelet = KubeletSide(running.daemon.dra.dra_socket)
        stream = kubelet.health_stream()
        try:
            first = next(stream)
            assert {(d.device.device_name, d.health) for d in first.devices} == {
                ("gpu-0", dra.HEALTHY), ("gpu-1", dra.HEALTHY)}
            monitor.report("sim-gpu-1", Health(False, "Xid 79: GPU has fallen off the bus"))
            api.wait_for(lambda a: bool(a.devices()["gpu-1"].get("taints")))
            taint = api.devices()["gpu-1"]["taints"][0]
            assert (taint["key"], taint["effect"]) == (f"{DRIVER}/unhealthy", "NoSchedule")
            assert taint["value"] == "Xid-79-GPU-has-fallen-off-the-bus"
            assert "taints" not in api.devices()["gpu-0"]
            update = next(stream)
            assert {(d.device.device_name, d.health) for d in update.devices} == {
                ("gpu-0", dra.HEALTHY), ("gpu-1", dra.UNHEALTHY)}
            assert [d.message for d in update.devices if d.device.device_name == "gpu-1"] == [
                "Xid 79: GPU has fallen off the bus"]
            monitor.report("sim-gpu-1", Health(True))
            api.wait_for(lambda a: "taints" not in a.devices()["gpu-1"])
            assert {d.health for d in next(stream).devices} == {dra.HEALTHY}
            assert {d.health_check_timeout_seconds for d in first.devices} == {60}
            running.daemon.device_health.refresh()  # what the loop does every 20 s: the kubelet's 30 s of silence
            running.daemon.dra_server.wake()
            assert {d.health for d in next(stream).devices} == {dra.HEALTHY}
        finally:
            stream.cancel()
            kubelet.close()


def test_without_device_taints_in_the_api_server_an_unhealthy_gpu_is_withdrawn_and_comes_back() -> None:
    monitor = StubMonitor()
    with driver_env(gates={"DRADeviceTaints": False}) as (api, dirs), \
            RunningDriver(make_driver(api, dirs, monitor=monitor)):
        api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})
        monitor.report("sim-gpu-0", Health(False, "device node gone"))
        api.wait_for(lambda a: set(a.devices()) == {"gpu-1"})
        monitor.report("sim-gpu-0", Health(True))
        api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})


def test_a_deleted_registration_socket_is_served_again_and_sigterm_removes_both() -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        registration = running.daemon.dra.registration_socket
        os.unlink(registration)
        wait_until(lambda: os.path.exists(registration), what="the registration socket served again")
        kubelet = KubeletSide(registration)
        try:
            assert kubelet.get_info().name == DRIVER
        finally:
            kubelet.close()
        assert running.stop() == 0
        assert not os.path.exists(registration)
        assert not os.path.exists(running.daemon.dra.dra_socket)
        assert api.slice_list(), "slices stay for the restart (the kubelet wipes them if the driver stays away)"


def test_a_bad_request_gets_a_grpc_error_not_a_crash() -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        channel = grpc.insecure_channel(f"unix://{running.daemon.dra.dra_socket}")
        try:
            call = channel.unary_unary(dra.DRA_V1.method_path("DRAPlugin", "NodePrepareResources"),
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as failure:
                call(b"\x0a\x05\x0a\x03", timeout=5)  # a Claim cut short
            assert failure.value.code() == grpc.StatusCode.INTERNAL
        finally:
            channel.close()
        kubelet = KubeletSide(running.daemon.dra.registration_socket)
        try:
            assert kubelet.get_info().name == DRIVER  # still serving
        finally:
            kubelet.close()


@pytest.mark.parametrize(("api_choice", "mapped"), [("dra", False), ("both", True)])
def test_only_a_node_that_chose_both_offers_its_gpus_to_nvidia_com_gpu_requests(api_choice: str, mapped: bool) -> None:
    settings = Settings(device_discovery_strategy="simulated", simulated_gpus=2, allocation_api=api_choice)
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs, settings=settings)):
        api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})
        assert {d["attributes"]["extendedResource"]["bool"] for d in api.devices().values()} == {mapped}


def test_a_gpu_that_appears_or_goes_changes_the_pool_and_its_generation() -> None:
    found = [SimulatedBackend(1).discover()]
    with driver_env() as (api, dirs):
        daemon = make_driver(api, dirs, SimulatedBackend(1).discover())
        daemon.rediscover = lambda: found[0]
        with RunningDriver(daemon) as running:
            api.wait_for(lambda a: set(a.devices()) == {"gpu-0"})
            generation = api.slice_list()[0]["spec"]["pool"]["generation"]
            found[0] = SimulatedBackend(3).discover()  # a driver loaded late, a GPU hot-plugged
            running.daemon.request_discovery()  # what SIGHUP and the minute's timer do
            api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1", "gpu-2"})
            assert api.slice_list()[0]["spec"]["pool"]["generation"] == generation + 1
            found[0] = SimulatedBackend(2).discover()
            running.daemon.request_discovery()
            api.wait_for(lambda a: set(a.devices()) == {"gpu-0", "gpu-1"})


def test_a_deleted_dra_socket_or_registry_directory_is_served_again() -> None:
    with driver_env() as (api, dirs), RunningDriver(make_driver(api, dirs)) as running:
        dra_socket = running.daemon.dra.dra_socket
        registration = running.daemon.dra.registration_socket
        servers = (running.daemon.dra_server, running.daemon.registration_server)
        assert [s.starts for s in servers] == [1, 1]
        os.unlink(dra_socket)
        # the DRA socket comes back, and the registration socket is made afresh so the plugin watcher
        # registers (and dials) again
        wait_until(lambda: [s.starts for s in servers] == [2, 2] and os.path.exists(registration),
                   what="both sockets served afresh")
        remove_watched_tree(dirs.registry)  # the whole plugin watcher directory
        wait_until(lambda: os.path.exists(registration), what="the registry directory and socket back")
        for path in (dra_socket, registration):
            kubelet = KubeletSide(path)
            try:
                if path == registration:
                    assert kubelet.get_info().endpoint == dra_socket
                else:
                    assert kubelet.unprepare(("default", "uid-x", "x")).claims["uid-x"].error == ""
            finally:
                kubelet.close()
