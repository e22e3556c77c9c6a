"""Ports: OS programs as processes, tested with real OS processes."""

from __future__ import annotations

import os
import sys

import pytest
import trio
import trio.testing

import otp

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
