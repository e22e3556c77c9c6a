"""A new flow's id (a UUIDv7, RFC 9562) and the random bytes it takes from a pool filled by
``os.urandom`` a page at a time: a ``getrandom`` system call per flow cost the engine more
than the rest of the id (~1 us, several under load)."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator

__all__ = ["new_flow_id"]

#: A UUIDv7's version (7) and variant (RFC 9562) bits, over its 80 bits below the timestamp.
_UUID7_KEEP = ~((0xF << 76) | (0x3 << 62))
_UUID7_SET = (0x7 << 76) | (0x2 << 62)

#: Random bytes read at once: the pool serves this many ids (10 bytes each).
_POOL_BYTES = 4000
#: The pool and the offsets of its ids not yet given out. Replaced whole (one assignment), and
#: an offset is taken with ``next()`` (atomic under the GIL), so no two callers, even in
#: separate threads, get the same bytes; a forked child starts a pool of its own.
_pool: tuple[bytes, Iterator[int]] = (b"", iter(()))


def _new_pool() -> None:
    global _pool
    _pool = (os.urandom(_POOL_BYTES), itertools.count(0, 10))


os.register_at_fork(after_in_child=_new_pool)


def _random10() -> bytes:
    """10 bytes of ``os.urandom`` that no caller got before."""
    while True:
        data, offsets = _pool
        offset = next(offsets, _POOL_BYTES)
        if offset < _POOL_BYTES:
            return data[offset : offset + 10]
        _new_pool()


def new_flow_id(random: bytes | None = None, ms: int | None = None) -> str:
    """A new flow's id: a UUIDv7 (RFC 9562) as 32 hex digits: the Unix time in milliseconds
    (``ms``, now by default) in its first 48 bits, then 74 random bits (of ``random``, 10
    bytes, when given; else from ``os.urandom``, through the pool) around its version and
    variant bits.

    Time-ordered, not uuid4: the stores' indexes on flow ids (the flows, their attempts and
    dispatch records) then grow at their right edge, so a group commit of tens of new flows
    writes a few index pages instead of a random page per flow and index (measured on SQLite:
    the store's CPU per Step about halved, 120-140 -> 67-74 us). 74 random bits keep ids of
    one millisecond apart, across servers too. Built from one integer, without ``uuid.UUID``
    (one per flow started)."""
    if ms is None:
        ms = time.time_ns() // 1_000_000
    n = int.from_bytes(_random10() if random is None else random, "big")
    return f"{(ms & 0xFFFF_FFFF_FFFF) << 80 | n & _UUID7_KEEP | _UUID7_SET:032x}"
