"""HPACK (RFC 7541), the header compression of HTTP/2: a full decoder, a minimal encoder.

The decoder handles everything a gRPC client may send: indexed fields, literals with and
without indexing, the dynamic table and its size updates, Huffman-coded strings. The
encoder writes literals without indexing and no Huffman, which every decoder accepts and
which keeps no state per connection.
"""

from __future__ import annotations

from collections.abc import Iterable


class HpackError(Exception):
    """A header block that cannot be decoded: a COMPRESSION_ERROR for the connection."""


# RFC 7541 Appendix A: index 1..61
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.encode(), value.encode()) for name, value in (
        (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
        (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
        (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
        (":status", "404"), (":status", "500"), ("accept-charset", ""), ("accept-encoding", "gzip, deflate"),
        ("accept-language", ""), ("accept-ranges", ""), ("accept", ""), ("access-control-allow-origin", ""),
        ("age", ""), ("allow", ""), ("authorization", ""), ("cache-control", ""),
        ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
        ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
        ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""),
        ("from", ""), ("host", ""), ("if-match", ""), ("if-modified-since", ""),
        ("if-none-match", ""), ("if-range", ""), ("if-unmodified-since", ""), ("last-modified", ""),
        ("link", ""), ("location", ""), ("max-forwards", ""), ("proxy-authenticate", ""),
        ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
        ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
        ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""),
        ("www-authenticate", ""),
    )
)

# RFC 7541 Appendix B: the code length of each symbol 0..256 (256 is EOS). The code is
# canonical: codes of one length are consecutive in symbol order, each length's first code
# following the previous length's last, so the lengths alone define it.
HUFFMAN_LENGTHS: tuple[int, ...] = (
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
)
EOS = 256


def _canonical_tables() -> tuple[dict[int, int], dict[int, int], dict[int, list[int]]]:
    """Per code length: its first code, how many codes it has, and their symbols in order."""
    first: dict[int, int] = {}
    count: dict[int, int] = {}
    symbols: dict[int, list[int]] = {}
    code, previous = 0, 0
    for symbol in sorted(range(len(HUFFMAN_LENGTHS)), key=lambda s: (HUFFMAN_LENGTHS[s], s)):
        length = HUFFMAN_LENGTHS[symbol]
        code <<= length - previous
        previous = length
        if length not in first:
            first[length] = code
            symbols[length] = []
        symbols[length].append(symbol)
        count[length] = count.get(length, 0) + 1
        code += 1
    return first, count, symbols


_FIRST, _COUNT, _SYMBOLS = _canonical_tables()
_MAX_LENGTH = max(HUFFMAN_LENGTHS)


def huffman_decode(data: bytes) -> bytes:
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            offset = code - _FIRST.get(length, 1 << 31)
            if 0 <= offset < _COUNT.get(length, 0):
                symbol = _SYMBOLS[length][offset]
                if symbol == EOS:
                    raise HpackError("Huffman string contains EOS")
                out.append(symbol)
                code = length = 0
            elif length >= _MAX_LENGTH:
                raise HpackError("invalid Huffman code")
    # what is left must be padding: fewer than 8 bits, all ones (a prefix of EOS)
    if length >= 8 or code != (1 << length) - 1:
        raise HpackError("invalid Huffman padding")
    return bytes(out)


def huffman_encode(data: bytes) -> bytes:
    """For tests and clients that want it; the encoder below does not use Huffman."""
    codes = {}
    for length, syms in _SYMBOLS.items():
        for offset, symbol in enumerate(syms):
            codes[symbol] = (_FIRST[length] + offset, length)
    value = bits = 0
    for byte in data:
        code, length = codes[byte]
        value = (value << length) | code
        bits += length
    pad = -bits % 8
    value = (value << pad) | ((1 << pad) - 1)
    return (value).to_bytes((bits + pad) // 8, "big") if bits else b""


def encode_integer(value: int, prefix_bits: int, first_byte: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first_byte | value,))
    out = bytearray((first_byte | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return encode_integer(len(value), 7) + value


_STATIC_NAMES = {name: index for index, (name, _) in reversed(list(enumerate(STATIC_TABLE, 1)))}
_STATIC_PAIRS = {pair: index for index, pair in enumerate(STATIC_TABLE, 1)}


def encode(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A header block: static-table matches indexed, the rest literal without indexing."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC_PAIRS.get((name, value))
        if index is not None:
            out += encode_integer(index, 7, 0x80)
            continue
        name_index = _STATIC_NAMES.get(name)
        if name_index is not None:
            out += encode_integer(name_index, 4)
        else:
            out += b"\x00" + _string(name)
        out += _string(value)
    return bytes(out)


class Decoder:
    """One per connection and direction: the dynamic table lives as long as the connection."""

    def __init__(self, max_table_size: int = 4096, max_header_list: int = 65536) -> None:
        self.limit = max_table_size  # what our SETTINGS_HEADER_TABLE_SIZE allows
        self.max_size = max_table_size  # what the encoder last chose (<= limit)
        self.max_header_list = max_header_list
        self._table: list[tuple[bytes, bytes]] = []  # newest first
        self._size = 0
        self.generation = 0  # moves whenever the dynamic table changes: decoded blocks may be reused until then

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        total = 0
        pos, end = 0, len(block)
        try:
            while pos < end:
                byte = block[pos]
                if byte & 0x80:  # indexed field
                    index, pos = self._integer(block, pos, 7)
                    header = self._entry(index)
                elif byte & 0x40:  # literal with incremental indexing
                    header, pos = self._literal(block, pos, 6)
                    self._add(header)
                elif byte & 0x20:  # dynamic table size update
                    if headers:
                        raise HpackError("table size update after a header field")
                    size, pos = self._integer(block, pos, 5)
                    if size > self.limit:
                        raise HpackError(f"table size {size} above the {self.limit} allowed")
                    self.max_size = size
                    self.generation += 1
                    self._evict()
                    continue
                else:  # literal without indexing (0000) or never indexed (0001)
                    header, pos = self._literal(block, pos, 4)
                total += len(header[0]) + len(header[1]) + 32
                if total > self.max_header_list:
                    raise HpackError(f"header list larger than {self.max_header_list} bytes")
                headers.append(header)
        except IndexError:
            raise HpackError("header block ends inside a field") from None
        return headers

    @staticmethod
    def _integer(block: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
        limit = (1 << prefix_bits) - 1
        value = block[pos] & limit
        pos += 1
        if value < limit:
            return value, pos
        shift = 0
        while True:
            byte = block[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, pos
            if shift > 28:
                raise HpackError("integer too large")

    def _string(self, block: bytes, pos: int) -> tuple[bytes, int]:
        huffman = block[pos] & 0x80
        length, pos = self._integer(block, pos, 7)
        if pos + length > len(block):
            raise HpackError("string runs past the header block")
        raw = bytes(block[pos:pos + length])
        return (huffman_decode(raw) if huffman else raw), pos + length

    def _literal(self, block: bytes, pos: int, prefix_bits: int) -> tuple[tuple[bytes, bytes], int]:
        index, pos = self._integer(block, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return (name, value), pos

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dynamic = index - len(STATIC_TABLE) - 1
        if index == 0 or dynamic >= len(self._table):
            raise HpackError(f"header index {index} is not in the table")
        return self._table[dynamic]

    def _add(self, header: tuple[bytes, bytes]) -> None:
        self.generation += 1
        size = len(header[0]) + len(header[1]) + 32
        if size > self.max_size:  # an entry larger than the table empties it (RFC 7541 4.4)
            self._table.clear()
            self._size = 0
            return
        self._table.insert(0, header)
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self.max_size:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + 32
