"""Pages built to make a page converter or a body reader slow.

Shared by tests/test_visit_hostile.py and the benchmark of the worst event-loop
stall (benchmarks/hostile.py). Each HTML page is a short unit repeated; at the
sizes given here CPython's HTMLParser, or a reader that copies the text inside
every nesting level again, takes seconds (quadratic or worse); `scaled` builds
the same page at any size (up to the download cap).
"""

from __future__ import annotations

import gzip
import zlib

# name: (repeated unit, repetitions): 15-112 kB, the sizes that cost seconds.
HOSTILE_UNITS: dict[str, tuple[bytes, int]] = {
    "nested tables": (b"<table><tr><td>x", 1300),  # ~n^3 nesting copies
    "repeated <a ": (b"<a ", 5000),  # HTMLParser rescans the open tag
    "nested links": (b"<a href='/x'>y", 8000),
    "nested lists": (b"<ul><li>x", 5000),  # indents grow with depth
    "unterminated quotes": (b"<a b='", 3000),
    "unterminated attributes": (b"<a b=", 3000),
}


def hostile_page(name: str) -> bytes:
    """The hostile page `name` at the size that costs seconds."""
    unit, count = HOSTILE_UNITS[name]
    return unit * count


def scaled(name: str, size: int) -> bytes:
    """The hostile page `name` repeated to exactly `size` bytes."""
    unit = HOSTILE_UNITS[name][0]
    return (unit * (size // len(unit) + 1))[:size]


def gzip_then_junk(page: bytes, junk_bytes: int) -> list[bytes]:
    """One gzip member of `page` followed by `junk_bytes` of junk, as chunks."""
    junk = b"junk after the gzip stream " * 2400  # ~64 kB
    chunks = [gzip.compress(page)]
    sent = 0
    while sent < junk_bytes:
        chunks.append(junk[: junk_bytes - sent])
        sent += len(chunks[-1])
    return chunks


def empty_deflate_blocks(page: bytes, wire_bytes: int) -> bytes:
    """A gzip stream of `page` and then empty blocks: big on the wire, tiny inflated.

    After a full flush the stream is byte-aligned, where an empty stored block
    is 5 bytes (not final, type 0, length 0 and its complement) and inflates to
    nothing.
    """
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(page), compressor.flush(zlib.Z_FULL_FLUSH)]
    parts.append(b"\x00\x00\x00\xff\xff" * (wire_bytes // 5))
    parts.append(compressor.flush())
    return b"".join(parts)
