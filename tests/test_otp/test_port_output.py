"""A port's output: line mode (long lines, lines split across reads, odd bytes) and stream mode,
whole and in order, with bounded copies."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import trio
import trio.testing

import otp
from otp._port import _LineSplitter

from .helpers import BOUND, PY


async def _drain(port: otp.Pid) -> tuple[list[bytes], Any]:
    """Every PortData of ``port`` until its Exit; returns the data and the exit reason."""
    data: list[bytes] = []
    while True:
        message = await otp.receive(
            lambda m: (
                isinstance(m, otp.PortData | otp.Exit)
                and (m.port if isinstance(m, otp.PortData) else m.pid) == port
            )
        )
        if isinstance(message, otp.Exit):
            return data, message.reason
        data.append(message.data)


def _bytes_allocated_while_feeding(chunks: list[bytes]) -> tuple[list[bytes], int]:
    """Feed ``chunks`` to a port's line splitter; returns the lines and the bytes it allocated
    on top of what it held before each feed (each copy of a byte allocates it once more), a
    count of work that does not depend on the machine's speed."""
    splitter = _LineSplitter()
    lines: list[bytes] = []
    allocated = 0
    tracemalloc.start()
    try:
        for chunk in chunks:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            lines += splitter.feed(chunk)
            allocated += tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return lines, allocated


def test_line_mode_copies_a_long_line_a_bounded_number_of_times() -> None:
    # A splitter that re-copies the unfinished line on every read allocates about n^2 / 2 / chunk
    # bytes (64 times the line here); one that grows it in place, about twice the line.
    size, chunk = 4 << 20, 32 << 10
    line = b"x" * size
    chunks = [line[i : i + chunk] for i in range(0, size, chunk)] + [b"\n"]
    lines, allocated = _bytes_allocated_while_feeding(chunks)
    assert lines == [line]
    assert allocated < 4 * size, f"{allocated / size:.1f} bytes allocated per byte of the line"


def test_line_mode_splits_lines_across_reads_of_any_size() -> None:
    text = b"".join(b"line %d\n" % i + b"y" * (i % 7) * 50 + b"\n\n" for i in range(100))
    for size in (1, 2, 7, 64, 4096, len(text)):
        splitter = _LineSplitter()
        lines = [
            line for i in range(0, len(text), size) for line in splitter.feed(text[i : i + size])
        ]
        assert lines == text.split(b"\n")[:-1]
        assert splitter.rest() == b""
    splitter = _LineSplitter()
    assert splitter.feed(b"a\nb") == [b"a"]
    assert splitter.feed(b"c") == []
    assert splitter.rest() == b"bc"


async def test_line_mode_delivers_a_long_line_whole_and_the_lines_after_it() -> None:
    size = 8 << 20
    script = f"import sys; sys.stdout.buffer.write(b'x' * {size} + b'\\nafter\\n')"
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port([PY, "-c", script], mode="line")
        with trio.fail_after(BOUND):
            data, reason = await _drain(port)
        assert [len(line) for line in data] == [size, 5]
        assert data[1] == b"after"
        assert reason == otp.NORMAL


async def test_line_mode_keeps_non_utf8_bytes_carriage_returns_and_empty_lines() -> None:
    script = "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\r\\n\\n\\x00z\\r\\nend')"
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port([PY, "-c", script], mode="line")
        with trio.fail_after(4):
            data, reason = await _drain(port)
        assert data == [b"\xff\xfe\r", b"", b"\x00z\r", b"end"]
        assert reason == otp.NORMAL


async def test_a_large_stream_output_arrives_whole_and_in_order() -> None:
    size = 8 << 20
    script = f"import random, sys; sys.stdout.buffer.write(random.Random(7).randbytes({size}))"
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port([PY, "-c", script])
        with trio.fail_after(4):
            data, reason = await _drain(port)
        assert reason == otp.NORMAL
        assert b"".join(data) == random.Random(7).randbytes(size)


async def test_a_program_that_closes_its_stdout_keeps_the_port_until_it_exits() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["sh", "-c", "echo bye; exec >&-; read x; exit 4"], mode="line")
        assert (await otp.receive(otp.PortData)).data == b"bye"
        # stdout is at EOF, the program still runs: the port must still be there to take input.
        assert await otp.port_os_pid(port) > 0
        otp.port_command(port, b"\n")
        with trio.fail_after(4):
            assert await otp.receive(otp.Exit) == otp.Exit(port, otp.ExitStatus(4))
