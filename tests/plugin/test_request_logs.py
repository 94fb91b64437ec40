"""Bad requests from a local client cost one journal line each, and only a few per minute."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import grpc
import pytest
from gpu_device_plugin.api import pb, rpc
from gpu_device_plugin.observability import logs
from gpu_device_plugin.observability.logs import REQUESTS, RequestNoise
from helpers import run_simulated, wait_until


@pytest.fixture()
def journal() -> Iterator[io.StringIO]:
    """The plugin's own log setup writing to a buffer; the test runner's handlers come back after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    logs.setup("info", stream)
    yield stream
    root.handlers[:], level = saved
    root.setLevel(level)


def fuzz(socket_path: str, rounds: int) -> None:
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    raw_allocate = channel.unary_unary(rpc.method_path("DevicePlugin", "Allocate"))
    raw_preferred = channel.unary_unary(rpc.method_path("DevicePlugin", "GetPreferredAllocation"))
    stub = rpc.Stub(channel, "DevicePlugin")
    huge = pb.AllocateRequest()
    huge.container_requests.add(devices_ids=[f"gpu-{i}" for i in range(20000)])
    try:
        for _ in range(rounds):
            for call, request in ((raw_allocate, b"\xff\xff\xff\x01"), (raw_preferred, b"\x0a\xff\x7f"),
                                  (stub.Allocate, huge)):
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, timeout=5)
                assert refused.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    finally:
        channel.close()


def test_corrupt_and_absurd_requests_log_one_line_each_and_few_of_them(socket_dir: str,
                                                                       journal: io.StringIO) -> None:
    with run_simulated(socket_dir) as daemon:
        assert wait_until(lambda: daemon.server is not None)
        fuzz(daemon.socket_path, 20)  # 60 bad requests
    lines = journal.getvalue().splitlines()
    assert not any("Traceback" in line or line.startswith(" ") for line in lines), "a multi-line record"
    noisy = [line for line in lines if "deserializ" in line or "allocation refused" in line]
    assert 1 <= len(noisy) <= RequestNoise().burst, journal.getvalue()
    assert all(len(line) < 600 for line in noisy), "20 000 unknown IDs must not make a 200 kB line"


def test_the_first_line_after_a_flood_says_how_many_were_left_out() -> None:
    now = [0.0]
    noise = RequestNoise(burst=2, window_s=60, clock=lambda: now[0])

    def record(msg: str, name: str = REQUESTS) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)

    kept = [noise.filter(record(f"bad {i}")) for i in range(5)]
    assert kept == [True, True, False, False, False]
    assert noise.filter(record("other", name="gpu_device_plugin.session.daemon")), "only request noise is limited"
    now[0] = 61
    later = record("bad again")
    assert noise.filter(later)
    assert later.getMessage() == "bad again (3 similar lines left out)"


def test_a_traceback_becomes_the_end_of_the_line() -> None:
    try:
        raise ValueError("Wire format was corrupt\nsecond line")
    except ValueError:
        import sys

        record = logging.LogRecord("grpc._common", logging.ERROR, __file__, 1, "Exception deserializing message!",
                                   None, sys.exc_info())
    assert RequestNoise().filter(record)
    text = logging.Formatter("%(message)s").format(record)
    assert text == "Exception deserializing message! ValueError: Wire format was corrupt second line"
