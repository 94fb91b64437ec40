"""Header blocks through h2.py's wrapper of the hpack library: blocks we build keep no state,
the decoder's generation says when a decoded block may be reused, bad blocks are a
COMPRESSION_ERROR."""

from __future__ import annotations

import pytest
from gpu_device_plugin.api import h2

# RFC 7541 C.4.1 and C.4.2: the second request reuses the dynamic entry the first one added
FIRST = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")
SECOND = bytes.fromhex("828684be5886a8eb10649cbf")


def test_what_we_encode_decodes_to_the_same_fields() -> None:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"3"),
              (b"grpc-message", b"x" * 300)]
    assert h2.HeaderDecoder().decode(h2.header_block(fields)) == fields


def test_our_blocks_add_nothing_to_the_peers_table() -> None:
    block = h2.header_block([(b"content-type", b"application/grpc"), (b"grpc-message", b"bad request")])
    decoder = h2.HeaderDecoder()
    decoder.decode(block)
    assert decoder.generation == 0, "a peer decoding it keeps an unchanged table"
    assert h2.header_block([(b"content-type", b"application/grpc"), (b"grpc-message", b"bad request")]) == block


def test_the_generation_moves_only_when_the_table_changes() -> None:
    decoder = h2.HeaderDecoder()
    assert decoder.decode(FIRST)[-1] == (b":authority", b"www.example.com")
    after_first = decoder.generation
    assert after_first > 0, "the literal with indexing added an entry"
    indexed_only = bytes.fromhex("828684be")
    assert decoder.decode(indexed_only)[-1] == (b":authority", b"www.example.com")
    assert decoder.generation == after_first, "only indexed fields: the same block may be replayed"
    assert decoder.decode(SECOND)[-1] == (b"cache-control", b"no-cache")
    assert decoder.generation > after_first
    before = decoder.generation
    decoder.decode(bytes.fromhex("3f81 1f".replace(" ", "")) + indexed_only[:1])  # table size update to 4000
    assert decoder.generation > before


@pytest.mark.parametrize("block", [
    "be",  # index 62: the dynamic table is empty
    "80",  # index 0 does not exist
    "4188f1e3",  # a string that runs past the block
    "3fe21f",  # table size update to 4097, above the 4096 we allow
    "8241",  # the block ends inside a field
    "4181ff",  # Huffman padding longer than 7 bits (EOS)
])
def test_malformed_blocks_are_a_compression_error(block: str) -> None:
    with pytest.raises(h2.CompressionError) as refused:
        h2.HeaderDecoder().decode(bytes.fromhex(block))
    assert refused.value.code == h2.COMPRESSION_ERROR


def test_a_header_list_above_the_decoding_limit_ends_the_connection_but_is_no_compression_error() -> None:
    # hpack stops mid-block, its table in an unknown state: only closing the connection is safe,
    # and the block was well-formed, so the code says "too much", not "undecodable"
    block = h2.header_block([(b"x-big", b"v" * 5000)])
    with pytest.raises(h2.ProtocolError) as refused:
        h2.HeaderDecoder(max_header_list=4096).decode(block)
    assert refused.value.code == h2.ENHANCE_YOUR_CALM
