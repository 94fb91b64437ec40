"""What the gRPC server holds at most, whatever its peers do: one place for every cap, budget and
timeout, so a reader (and a test) sees them together. Sizes in bytes, times in seconds.

Why these numbers: the kubelet keeps one connection with one ListAndWatch stream and makes one
unary call at a time; a debugging client or the watchdog's self-probe adds a connection now
and then. Everything beyond that is a peer we owe correctness but not memory: the totals below
keep the process under the design's 64 MiB with hostile peers on every connection.
"""

from __future__ import annotations

from typing import NamedTuple

MIB = 1024 * 1024
MAX_HEADER_LIST = 16 * 1024  # what we advertise; larger lists are answered 431 (RFC 9113 10.5.1)


class Limits(NamedTuple):  # a NamedTuple: dataclasses cost start-up time (imports inspect)
    # the largest request message (gRPC's default receive limit). The largest real one is a
    # GetPreferredAllocation naming every device: 64 GPUs x 256 replicas, under 1 MiB
    max_message: int = 4 * MIB
    # the largest unary answer; above it the call ends RESOURCE_EXHAUSTED (also gRPC's default
    # receive limit, so a client would refuse it anyway)
    max_answer: int = 4 * MIB
    max_connections: int = 64  # beyond it the oldest connection that is not the kubelet's is closed
    max_streams_per_connection: int = 100  # SETTINGS_MAX_CONCURRENT_STREAMS
    # open streams across all connections; past it a connection may still open one stream (so a
    # new kubelet connection is always answered), others are refused with REFUSED_STREAM
    max_streams: int = 400
    # request bytes buffered and answers queued, all connections together; past it no new request
    # credit is granted (but to the oldest waiting stream) and connections other than the
    # kubelet's are not read until it drops
    max_buffered: int = 16 * MIB
    # each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): credit for more is given back as
    # the request's bytes arrive, so a message of any allowed size gets through
    stream_window: int = 64 * 1024
    # the connection's receive window, given back as DATA arrives: flow control, not a size limit
    connection_window: int = 1 * MIB
    # output queued for one connection before it stops reading (a peer that does not read)
    out_limit: int = 256 * 1024
    idle_timeout: float = 300.0  # a connection with no open stream and nothing received is closed
    # a connection with output queued that moved no byte for this long is closed (a zero window or
    # a peer that never reads); the kubelet's connection is exempt
    stall_timeout: float = 60.0
    frames_per_turn: int = 64  # frames one connection may have handled before the loop serves others
    # peer resets of streams we had not finished: a burst this large, then this many a second
    resets_burst: int = 1000
    resets_per_second: float = 100.0
    close_grace: float = 1.0  # seconds a connection ended by an error has to take its GOAWAY
    accept_retry: float = 1.0  # out of file descriptors: accepting is retried after this long


DEFAULT = Limits()
