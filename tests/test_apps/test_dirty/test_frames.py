"""The frame splitter: frames of any size, fed in pieces of any size, come out whole."""

from __future__ import annotations

import random

import pytest

from apps.dirty import _frames
from apps.dirty._errors import DirtyProtocolError


def _stream() -> tuple[list[tuple[int, int, bytes]], bytes]:
    rng = random.Random(7)
    frames = [
        (1, i, rng.randbytes(rng.choice([0, 5, 100, 65535, 65536, 70000, 300000])))
        for i in range(1, 40)
    ]
    return frames, b"".join(_frames.header(t, len(p), r) + p for t, r, p in frames)


@pytest.mark.parametrize("sizes", [(1,), (7, 16), (1000,), (65536,), (200000, 3), (1 << 22,)])
def test_splitter_reassembles_frames_fed_in_pieces(sizes: tuple[int, ...]) -> None:
    frames, data = _stream()
    splitter = _frames.FrameSplitter()
    got = []
    pos = 0
    turn = 0
    while pos < len(data):
        n = sizes[turn % len(sizes)]
        turn += 1
        assert splitter.read_size() >= 262144
        got += splitter.feed(data[pos : pos + n])
        pos += n
    assert got == frames
    assert splitter.buffered == 0


def test_splitter_asks_for_the_rest_of_a_large_frame() -> None:
    payload = b"x" * (1 << 20)
    data = _frames.header(2, len(payload), 9) + payload
    splitter = _frames.FrameSplitter()
    assert splitter.feed(data[:1000]) == []
    assert splitter.read_size() == len(payload) - (1000 - 16)
    assert splitter.buffered == 1000 - 16
    assert splitter.feed(data[1000:] + _frames.header(5, 0, 9)) == [(2, 9, payload), (5, 9, b"")]


def test_splitter_rejects_garbage_after_a_large_frame() -> None:
    payload = b"x" * 100000
    splitter = _frames.FrameSplitter()
    with pytest.raises(DirtyProtocolError):
        splitter.feed(_frames.header(2, len(payload), 1) + payload + b"XX" + b"\0" * 14)
