"""Ports: OS programs as processes, tested with real OS processes."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer

from .helpers import BOUND

PY = sys.executable


def _gone(os_pid: int) -> bool:
    try:
        os.kill(os_pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_port_forwards_stdout_to_its_owner_and_writes_commands_to_stdin() -> None:
    async with otp.open_node():
        port = await otp.open_port(["cat"])
        otp.port_command(port, b"hello ")
        otp.port_command(port, b"port")
        received = b""
        while received != b"hello port":
            message = await otp.receive(otp.PortData)
            assert message.port == port
            received += message.data
        otp.unlink(port)
        otp.port_close(port)


async def test_line_mode_delivers_one_message_per_line() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port([PY, "-c", "print('one'); print('two', end='')"], mode="line")
        assert (await otp.receive(otp.PortData)).data == b"one"
        assert (await otp.receive(otp.PortData)).data == b"two"
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)


async def test_program_exit_status_is_the_ports_exit_reason() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["sh", "-c", "exit 3"])
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.ExitStatus(3))


async def test_a_program_killed_by_a_signal_names_the_signal() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sh", "-c", "kill -9 $$"], link=False)
        ref = otp.monitor(port)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.Signaled("SIGKILL"))


async def test_output_written_before_exit_arrives_before_the_exit() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port([PY, "-c", "import sys; sys.stdout.write('x' * 200000)"])
        total = 0
        while True:
            message = await otp.receive()
            if isinstance(message, otp.Exit):
                break
            total += len(message.data)
        assert total == 200000
        assert message == otp.Exit(port, otp.NORMAL)


async def test_a_shutdown_signal_stops_the_program_with_sigterm() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        script = (
            "import signal, sys, time\n"
            "def on_term(*_):\n"
            "    print('got TERM', flush=True)\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, on_term)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        port = await otp.open_port([PY, "-c", script], mode="line")
        assert (await otp.receive(otp.PortData)).data == b"ready"
        os_pid = await otp.port_os_pid(port)
        otp.exit(port, otp.SHUTDOWN)
        assert (await otp.receive(otp.PortData)).data == b"got TERM"
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.SHUTDOWN)
        assert _gone(os_pid)


async def test_a_program_ignoring_sigterm_is_killed_after_kill_timeout() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        script = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        port = await otp.open_port([PY, "-c", script], mode="line", kill_timeout=0.2)
        await otp.receive(otp.PortData)
        os_pid = await otp.port_os_pid(port)
        otp.exit(port, otp.SHUTDOWN)
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.SHUTDOWN)
        assert _gone(os_pid)


async def test_killing_the_port_kills_its_program() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        os_pid = await otp.port_os_pid(port)
        ref = otp.monitor(port)
        otp.exit(port, otp.KILL)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.KILLED)
        assert _gone(os_pid)


async def test_a_port_that_loses_its_owner_kills_its_program() -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"])
            otp.send(me, (port, await otp.port_os_pid(port)))
            await otp.receive()
            raise RuntimeError("owner crashes")

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        otp.send(owner_pid, "crash now")
        down = await otp.receive(otp.Down)
        assert down.ref == ref and isinstance(down.reason, otp.Crash)
        assert _gone(os_pid)


async def test_environment_and_working_directory_are_explicit(tmp_path: object) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        await otp.open_port(
            [PY, "-c", "import os; print(os.environ.get('ONLY'), os.getcwd(), len(os.environ))"],
            env={"ONLY": "this"},
            cwd=str(tmp_path),
            mode="line",
        )
        line = (await otp.receive(otp.PortData)).data.decode()
        only, cwd, count = line.split()
        assert only == "this"
        assert os.path.samefile(cwd, str(tmp_path))
        assert int(count) <= 2  # ONLY, plus LC_CTYPE that Python may add
        await otp.receive(otp.Exit)


async def test_a_missing_program_fails_to_start_with_a_typed_error() -> None:
    async with otp.open_node():
        with pytest.raises(otp.StartError) as info:
            await otp.open_port(["/nonexistent/program"])
        assert isinstance(info.value.reason, FileNotFoundError)


async def test_port_spec_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="argv must be a non-empty list of str"):
        otp.PortSpec(argv=())
    with pytest.raises(ValueError, match='mode must be "stream" or "line"'):
        otp.PortSpec(argv=("x",), mode="packet")
    with pytest.raises(ValueError, match="kill_timeout must be a number >= 0"):
        otp.PortSpec(argv=("x",), kill_timeout=-1)
    await trio.lowlevel.checkpoint()


async def test_a_failed_open_port_leaves_no_exit_message_for_a_trapping_caller() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with pytest.raises(otp.StartError):
            await otp.open_port(["/nonexistent/program"])
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def _idle() -> None:
    await otp.receive(lambda m: m == "stop")


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


async def _wait_gone(os_pid: int, within: float = 3.0) -> bool:
    # The OS reaps asynchronously from our view only through polling: there is no event for
    # "some other process's pid vanished". Poll briefly, bounded.
    with trio.move_on_after(within):
        while not _gone(os_pid):
            await trio.sleep(0.01)
    return _gone(os_pid)


async def test_a_port_closes_even_while_its_program_does_not_read_stdin() -> None:
    # Erlang queues port commands in the port: port_close/exit signals are never held up by a
    # program that does not read its stdin.
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        os_pid = await otp.port_os_pid(port)
        ref = otp.monitor(port)
        otp.port_command(port, b"x" * 1_000_000)  # far more than a pipe buffer holds
        otp.port_close(port)
        with trio.fail_after(2):
            down = await otp.receive(otp.Down)
        assert down == otp.Down(ref, port, otp.NORMAL)
        assert await _wait_gone(os_pid)


async def test_a_port_whose_owner_dies_kills_a_program_that_does_not_read_stdin() -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"])
            otp.send(me, (port, await otp.port_os_pid(port)))
            otp.port_command(port, b"x" * 1_000_000)
            await otp.receive()
            otp.exit_self("owner gone")

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        otp.send(owner_pid, "die")
        with trio.fail_after(2):
            down = await otp.receive(otp.Down)
        assert down == otp.Down(ref, port, "owner gone")
        assert await _wait_gone(os_pid)


async def test_a_port_answers_os_pid_while_its_program_does_not_read_stdin() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        otp.port_command(port, b"x" * 1_000_000)
        with trio.fail_after(2):
            os_pid = await otp.port_os_pid(port)
        assert os_pid > 0
        otp.exit(port, otp.KILL)


async def test_a_program_killed_by_sigterm_names_sigterm() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sh", "-c", "kill -TERM $$"], link=False)
        ref = otp.monitor(port)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.Signaled("SIGTERM"))


async def test_a_high_exit_status_is_an_exit_status_not_a_signal() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sh", "-c", "exit 137"], link=False)
        ref = otp.monitor(port)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.ExitStatus(137))


async def test_a_non_trapping_owner_dies_of_its_ports_exit_status() -> None:
    async with otp.open_node():

        async def owner() -> None:
            await otp.open_port(["sh", "-c", "exit 5"])
            await otp.receive()

        pid, ref = otp.spawn_monitor(owner)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.ExitStatus(5))


async def test_argv_is_passed_literally_without_a_shell() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        args = ["a b", "$HOME", "*", "'q'", ""]
        port = await otp.open_port(
            [PY, "-c", "import sys; print(repr(sys.argv[1:]))", *args], mode="line"
        )
        assert (await otp.receive(otp.PortData)).data.decode() == repr(args)
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)


async def test_other_descriptors_are_closed_on_exec_unless_passed() -> None:
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, True)
    os.set_inheritable(write_fd, True)
    script = (
        "import os, sys\n"
        "for fd in map(int, sys.argv[1:]):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        print(fd, 'open')\n"
        "    except OSError:\n"
        "        print(fd, 'closed')\n"
    )
    try:
        async with otp.open_node():
            otp.process_flag(trap_exit=True)
            await otp.open_port(
                [PY, "-c", script, str(read_fd), str(write_fd)], mode="line", pass_fds=[write_fd]
            )
            lines = {(await otp.receive(otp.PortData)).data.decode() for _ in range(2)}
            assert lines == {f"{read_fd} closed", f"{write_fd} open"}
            assert (await otp.receive(otp.Exit)).reason == otp.NORMAL
    finally:
        os.close(read_fd)
        os.close(write_fd)


async def test_stderr_goes_to_stdout_only_when_asked() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        script = "import sys; sys.stderr.write('err\\n'); sys.stderr.flush(); print('out')"
        await otp.open_port([PY, "-c", script], mode="line", stderr_to_stdout=True)
        got = {(await otp.receive(otp.PortData)).data for _ in range(2)}
        assert got == {b"err", b"out"}
        await otp.receive(otp.Exit)


async def test_a_normal_exit_signal_from_a_non_owner_is_ignored_by_a_port() -> None:
    async with otp.open_node():
        port = await otp.open_port(["cat"], mode="line", link=False)

        async def stranger() -> None:
            otp.exit(port, otp.NORMAL)

        otp.spawn_monitor(stranger)
        await otp.receive(otp.Down)
        otp.port_command(port, b"still here\n")
        assert (await otp.receive(otp.PortData)).data == b"still here"
        port_ref = otp.monitor(port)
        otp.port_close(port)
        assert await otp.receive(otp.Down) == otp.Down(port_ref, port, otp.NORMAL)


async def test_a_port_whose_owner_exits_normally_kills_its_program() -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"])
            otp.send(me, (port, await otp.port_os_pid(port)))
            await otp.receive()

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        otp.send(owner_pid, "return normally")
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.NORMAL)
        assert await _wait_gone(os_pid)


async def test_a_supervisor_style_shutdown_then_kill_never_leaks_the_program() -> None:
    # shutdown first; the program ignores SIGTERM and the port's kill_timeout is long; the
    # "supervisor" then kills the port outright after its own shutdown time.
    async with otp.open_node():
        script = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        port = await otp.open_port([PY, "-c", script], mode="line", kill_timeout=30, link=False)
        await otp.receive(otp.PortData)
        os_pid = await otp.port_os_pid(port)
        ref = otp.monitor(port)
        otp.exit(port, otp.SHUTDOWN)
        assert await otp.receive(otp.Down, timeout=0.3, default=None) is None
        assert not _gone(os_pid)
        otp.exit(port, otp.KILL)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.KILLED)
        assert await _wait_gone(os_pid)


async def test_port_commands_reach_the_program_in_order() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["cat"], mode="line")
        for i in range(200):
            otp.port_command(port, f"{i}\n".encode())
        got = [int((await otp.receive(otp.PortData)).data) for _ in range(200)]
        assert got == list(range(200))
        otp.port_close(port)
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)


async def test_stopping_the_node_kills_its_ports_programs() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        os_pid = await otp.port_os_pid(port)
    assert await _wait_gone(os_pid)
