"""Audit of OS ports (otp/_port.py) against OTP 25's open_port/port_command/port_close/port_info
and what a production user expects (typed errors for bad input, no hangs, no leaked programs).

Tests that run real OS programs use trio's real clock and wait on messages with short bounds;
tests that stay inside the runtime use the autojump clock.
"""

from __future__ import annotations

import os
import random
import sys
import tracemalloc
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer
from otp._port import _LineSplitter

from .test_ports import _gone

PY = sys.executable
#: Generous bound on waits for a real OS program (a busy 2-core CI machine); every wait ends on
#: the message it waits for, so a passing test never takes this long.
BOUND = 10.0


async def _idle() -> None:
    await otp.receive(lambda m: m == "stop")


# -- port_command / port_close / port_info on something that is not an open port ----------------


async def test_port_command_and_port_close_to_a_closed_port_raise_badarg() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["true"])
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)
        assert otp.process_info(port) is None
        with pytest.raises(otp.BadArg, match="port_command"):
            otp.port_command(port, b"lost\n")
        with pytest.raises(otp.BadArg, match="port_close"):
            otp.port_close(port)


async def test_port_command_and_port_close_to_a_process_that_is_not_a_port_raise_badarg(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = otp.spawn(_idle)
        with pytest.raises(otp.BadArg, match="port_command"):
            otp.port_command(pid, b"data")
        with pytest.raises(otp.BadArg, match="port_close"):
            otp.port_close(pid)
        info = otp.process_info(pid)
        assert info is not None and info.message_queue_len == 0
        otp.send(pid, "stop")


class Plain(GenServer):
    """A GenServer with no handle_call, as most servers that are not asked calls."""


async def test_port_os_pid_of_a_gen_server_fails_and_leaves_it_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        server = await Plain.start()
        ref = otp.monitor(server)
        with pytest.raises(otp.OtpError):
            await otp.port_os_pid(server)
        assert await otp.receive(otp.Down, timeout=1.0, default=None) is None
        assert otp.process_info(server) is not None
        otp.demonitor(ref)


# -- bad input: typed errors naming the field, never a hang or a dead caller --------------------


async def test_port_command_rejects_an_int_instead_of_writing_zero_bytes() -> None:
    async with otp.open_node():
        port = await otp.open_port(["cat"], link=False)
        try:
            with pytest.raises((TypeError, ValueError), match="port_command"):
                otp.port_command(port, 3)  # type: ignore[arg-type]
            otp.port_command(port, b"ok")
            received = b""
            with trio.fail_after(BOUND):
                while len(received) < 2:
                    received += (await otp.receive(otp.PortData)).data
            assert received == b"ok"
        finally:
            otp.exit(port, otp.KILL)


def test_a_str_argv_is_refused_or_taken_as_one_program() -> None:
    try:
        spec = otp.PortSpec(argv="cat")  # type: ignore[arg-type]
    except ValueError as exc:
        assert "argv" in str(exc)
    else:
        assert spec.argv == ("cat",)


async def test_open_port_with_a_bad_env_value_does_not_hang_a_trapping_caller() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with trio.fail_after(BOUND):
            with pytest.raises((otp.StartError, TypeError, ValueError)) as info:
                await otp.open_port(["true"], env={"A": 1})  # type: ignore[dict-item]
        assert "env" in str(info.value)


@pytest.mark.parametrize(
    ("field", "options"),
    [
        ("env", {"argv": ["true"], "env": {"A": 1}}),
        ("env", {"argv": ["true"], "env": {"A=B": "x"}}),
        ("argv", {"argv": ["tr\0ue"]}),
        ("pass_fds", {"argv": ["true"], "pass_fds": ["x"]}),
    ],
)
async def test_open_port_with_a_bad_value_raises_a_typed_error_naming_the_field(
    field: str, options: dict[str, Any]
) -> None:
    async with otp.open_node():
        with pytest.raises((otp.StartError, TypeError, ValueError)) as info:
            await otp.open_port(**options)
        assert field in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"argv": "cat"}, "PortSpec.argv must be a non-empty list of str (got the str 'cat')"),
        ({"argv": ("a", 1)}, "PortSpec.argv must be a non-empty list of str without NUL"),
        ({"argv": ("x",), "env": {"": "v"}}, "PortSpec.env names must be non-empty str"),
        ({"argv": ("x",), "env": {"A": "\0"}}, "PortSpec.env values must be str without NUL"),
        ({"argv": ("x",), "env": [("A", "1")]}, "PortSpec.env must be a mapping of str to str"),
        ({"argv": ("x",), "cwd": b"/tmp"}, "PortSpec.cwd must be a str path without NUL"),
        ({"argv": ("x",), "pass_fds": (-1,)}, "PortSpec.pass_fds must be a list of int"),
        ({"argv": ("x",), "pass_fds": 3}, "PortSpec.pass_fds must be a list of int"),
        ({"argv": ("x",), "pass_fds": (True,)}, "PortSpec.pass_fds must be a list of int"),
    ],
)
def test_port_spec_names_the_field_what_it_expects_and_what_it_got(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        otp.PortSpec(**options)
    assert str(info.value).startswith(message)


def test_port_spec_takes_lists_and_tuples_alike() -> None:
    spec = otp.PortSpec(argv=["cat", "-u"], env={"A": "1"}, pass_fds=[3], cwd="/")
    assert spec.argv == ("cat", "-u") and spec.pass_fds == (3,)


async def test_port_command_takes_bytearray_and_memoryview() -> None:
    async with otp.open_node():
        port = await otp.open_port(["cat"], link=False)
        try:
            otp.port_command(port, bytearray(b"o"))
            otp.port_command(port, memoryview(b"k"))
            received = b""
            with trio.fail_after(BOUND):
                while len(received) < 2:
                    received += (await otp.receive(otp.PortData)).data
            assert received == b"ok"
        finally:
            otp.exit(port, otp.KILL)


async def test_a_closed_port_is_closed_at_once_for_command_close_and_os_pid() -> None:
    # OTP's port_close is synchronous: the port is closed when it returns, while its program
    # still gets its SIGTERM.
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["sleep", "60"])
        otp.port_close(port)
        with pytest.raises(otp.BadArg, match="port_command"):
            otp.port_command(port, b"late")
        with pytest.raises(otp.BadArg, match="port_close"):
            otp.port_close(port)
        with pytest.raises(otp.BadArg, match="port_os_pid"):
            await otp.port_os_pid(port)
        with trio.fail_after(BOUND):
            assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)


async def test_a_port_follows_an_unlinked_owner_that_crashes_with_its_reason() -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"], link=False)
            otp.send(me, (port, await otp.port_os_pid(port)))
            await otp.receive(lambda m: m == "exit")
            otp.exit_self("owner gone")

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        try:
            otp.send(owner_pid, "exit")
            down = await otp.receive(otp.Down, timeout=BOUND, default=None)
            assert down == otp.Down(ref, port, "owner gone")
            assert _gone(os_pid)
        finally:
            otp.exit(port, otp.KILL)


# -- the owner and the port's lifetime ----------------------------------------------------------


@pytest.mark.parametrize("how", ["link=False", "unlinked"])
async def test_a_port_closes_when_its_owner_exits_even_without_a_link(how: str) -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"], link=how != "link=False")
            if how == "unlinked":
                otp.unlink(port)
            otp.send(me, (port, await otp.port_os_pid(port)))
            await otp.receive(lambda m: m == "exit")

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        try:
            otp.send(owner_pid, "exit")
            down = await otp.receive(otp.Down, timeout=BOUND, default=None)
            assert down == otp.Down(ref, port, otp.NORMAL)
            assert _gone(os_pid)
        finally:
            otp.exit(port, otp.KILL)


async def test_a_cancelled_open_port_leaves_no_port_or_program_behind() -> None:
    async with otp.open_node():
        with trio.move_on_after(0) as scope:
            await otp.open_port(["sleep", "60"])
        assert scope.cancelled_caught
        leftovers = [pid for pid in otp.processes() if pid != otp.self()]
        refs = {otp.monitor(pid): pid for pid in leftovers}
        try:
            with trio.move_on_after(BOUND):
                while refs:
                    down = await otp.receive(otp.Down)
                    refs.pop(down.ref, None)
            assert not refs, f"still running: {list(refs.values())}"
        finally:
            for pid in leftovers:
                otp.exit(pid, otp.KILL)


async def test_a_command_to_a_program_that_closed_its_stdin_ends_the_port() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(
            ["sh", "-c", "exec 0<&-; echo ready; exec sleep 60"], mode="line"
        )
        try:
            assert (await otp.receive(otp.PortData)).data == b"ready"
            os_pid = await otp.port_os_pid(port)
            otp.port_command(port, b"nobody reads this\n")
            exit_ = await otp.receive(otp.Exit, timeout=BOUND, default=None)
            assert exit_ is not None and exit_.pid == port and otp.is_abnormal(exit_.reason)
            assert _gone(os_pid)
        finally:
            otp.exit(port, otp.KILL)


# -- output -------------------------------------------------------------------------------------


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


# -- resources ----------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_no_descriptor_is_leaked_by_any_way_a_port_ends() -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["true"])  # warm up trio's process machinery
        await otp.receive(otp.Exit)
        before = open_fds()
        with trio.fail_after(4):
            for _ in range(3):
                port = await otp.open_port(["true"])
                assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)
                port = await otp.open_port(["sleep", "60"])
                otp.exit(port, otp.KILL)
                assert await otp.receive(otp.Exit) == otp.Exit(port, otp.KILLED)
                port = await otp.open_port(["sleep", "60"])
                otp.port_close(port)
                assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)
                with pytest.raises(otp.StartError):
                    await otp.open_port(["/nonexistent/program"])
                with pytest.raises(otp.StartError):
                    await otp.open_port(["true"], cwd="/nonexistent/dir")
        assert open_fds() == before
