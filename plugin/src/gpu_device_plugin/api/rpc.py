"""grpcio wiring for the v1beta1 services without generated stubs, for Python clients and
test doubles (the tests' kubelet). The plugin itself does not use grpcio: it serves with
`grpc_server` and calls with `grpc_client`.

grpcio's generic handler and multi-callable APIs are stable from 1.45 to today.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from . import pb
from .schema import PACKAGE, SERVICES

_CLASSES = {name: getattr(pb, name) for name in dir(pb) if isinstance(getattr(pb, name), type)}


def method_path(service: str, method: str) -> str:
    return f"/{PACKAGE}.{service}/{method}"


def generic_handler(service: str, implementation: Any) -> grpc.GenericRpcHandler:
    """Expose `implementation`'s methods (named as the RPCs) as `service`."""
    handlers = {}
    for method, req, resp, streaming in SERVICES[service]:
        make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
        handlers[method] = make(
            getattr(implementation, method),
            request_deserializer=_CLASSES[req].FromString,
            response_serializer=_CLASSES[resp].SerializeToString,
        )
    return grpc.method_handlers_generic_handler(f"{PACKAGE}.{service}", handlers)


class Stub:
    """Client for one service: `Stub(channel, "Registration").Register(request, timeout=5)`."""

    def __init__(self, channel: grpc.Channel, service: str) -> None:
        for method, req, resp, streaming in SERVICES[service]:
            factory: Callable[..., Any] = channel.unary_stream if streaming else channel.unary_unary
            setattr(
                self,
                method,
                factory(
                    method_path(service, method),
                    request_serializer=_CLASSES[req].SerializeToString,
                    response_deserializer=_CLASSES[resp].FromString,
                ),
            )
