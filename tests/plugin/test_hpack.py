"""HPACK against RFC 7541's own examples (Appendix C), and malformed blocks refused."""

from __future__ import annotations

import pytest
from gpu_device_plugin.api import hpack


def test_integers_encode_as_in_the_rfc() -> None:
    assert hpack.encode_integer(10, 5) == bytes([0x0A])  # C.1.1
    assert hpack.encode_integer(1337, 5) == bytes([0x1F, 0x9A, 0x0A])  # C.1.2
    assert hpack.encode_integer(42, 8) == bytes([0x2A])  # C.1.3


@pytest.mark.parametrize("text, coded", [
    (b"www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"),
    (b"no-cache", "a8eb10649cbf"),
    (b"custom-key", "25a849e95ba97d7f"),
    (b"custom-value", "25a849e95bb8e8b4bf"),
    (b"302", "6402"),
    (b"Mon, 21 Oct 2013 20:13:21 GMT", "d07abe941054d444a8200595040b8166e082a62d1bff"),
])
def test_huffman_strings_of_the_rfc_examples(text: bytes, coded: str) -> None:
    assert hpack.huffman_decode(bytes.fromhex(coded)) == text
    assert hpack.huffman_encode(text) == bytes.fromhex(coded)


def test_every_byte_value_survives_huffman_coding() -> None:
    data = bytes(range(256))
    assert hpack.huffman_decode(hpack.huffman_encode(data)) == data


def test_requests_with_huffman_share_one_dynamic_table() -> None:  # C.4.1 - C.4.3
    decoder = hpack.Decoder()
    first = decoder.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"))
    assert first == [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
                     (b":authority", b"www.example.com")]
    second = decoder.decode(bytes.fromhex("828684be5886a8eb10649cbf"))
    assert second[-2:] == [(b":authority", b"www.example.com"), (b"cache-control", b"no-cache")]
    third = decoder.decode(bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"))
    assert third[-1] == (b"custom-key", b"custom-value")
    assert third[2] == (b":path", b"/index.html")


def test_a_small_table_evicts_the_oldest_entries() -> None:  # C.5.1 - C.5.3 (table of 256 bytes)
    decoder = hpack.Decoder(max_table_size=256)
    decoder.decode(bytes.fromhex(
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470"
        "733a2f2f7777772e6578616d706c652e636f6d"))
    decoder.decode(bytes.fromhex("4803333037c1c0bf"))
    headers = decoder.decode(bytes.fromhex(
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b"
        "48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31"))
    assert headers[0] == (b":status", b"200")
    assert headers[1] == (b"cache-control", b"private")
    assert headers[-1][0] == b"set-cookie"


def test_what_we_encode_decodes_to_the_same_fields() -> None:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"3"),
              (b"grpc-message", b"x" * 300)]
    assert hpack.Decoder().decode(hpack.encode(fields)) == fields


@pytest.mark.parametrize("block", [
    "be",  # index 62: the dynamic table is empty
    "80",  # index 0 does not exist
    "4188f1e3",  # a string that runs past the block
    "3fe21f",  # table size update to 4097, above the 4096 limit
    "8241",  # the block ends inside a field
    "4181ff",  # Huffman padding longer than 7 bits (EOS)
])
def test_malformed_blocks_are_refused(block: str) -> None:
    with pytest.raises(hpack.HpackError):
        hpack.Decoder().decode(bytes.fromhex(block))


def test_a_header_list_above_the_limit_is_refused() -> None:
    block = hpack.encode([(b"x-big", b"v" * 5000)])
    with pytest.raises(hpack.HpackError, match="header list"):
        hpack.Decoder(max_header_list=4096).decode(block)
