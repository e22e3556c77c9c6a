"""Supervised OS-process ports: port children restarted by their exit status, killed by
terminate_child and shutdown, and gen_servers that own a port (OTP 25 as the oracle).

Port tests run real OS programs on trio's real clock and wait on messages (never on sleeps);
tests that stay inside the runtime use the autojump clock.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer, NoReply, Ok, Reply
from supervisors import (
    BRUTAL_KILL,
    INFINITY,
    ChildSpec,
    Supervisor,
    SupFlags,
    count_children,
    restart_child,
    start_child,
    terminate_child,
    which_children,
)

from .helpers import pid_of

PY = sys.executable
#: Generous bound on waits for real OS programs (a noisy 2-core machine).
BOUND = 4.0

EXIT_ON_INPUT = ["sh", "-c", "read x; exit $x"]
IGNORE_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _gone(os_pid: int) -> bool:
    try:
        os.kill(os_pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _down_of(pid: otp.Pid) -> otp.Down:
    ref = otp.monitor(pid)
    with trio.fail_after(BOUND):
        down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
    assert isinstance(down, otp.Down)
    return down


async def start_ready_port(argv: list[str], kill_timeout: float = 30.0) -> otp.Pid:
    """A child start function: open a line-mode port and return once it printed its first
    line (so a SIGTERM handler it installs first is in place)."""
    port = await otp.open_port(argv, mode="line", kill_timeout=kill_timeout)
    await otp.receive(lambda m: isinstance(m, otp.PortData) and m.port == port, timeout=BOUND)
    return port


async def _exit_status_child(restart: str, status: int) -> tuple[otp.Pid, otp.Pid, Any]:
    """A supervisor with one port child of ``restart`` type whose program exits with
    ``status``; returns the supervisor, the old port and the row after the exit."""
    sup = await Supervisor.start_link(
        SupFlags(), [ChildSpec("prog", (otp.open_port, EXIT_ON_INPUT), restart=restart)]
    )
    port = pid_of(await which_children(sup), "prog")
    ref = otp.monitor(port)
    otp.port_command(port, b"%d\n" % status)
    with trio.fail_after(BOUND):
        down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
    expected = otp.NORMAL if status == 0 else otp.ExitStatus(status)
    assert down.reason == expected
    # The port's exit signal reached the supervisor when the port died, before this call.
    return sup, port, await which_children(sup)


# -- restart types with port children -----------------------------------------------------------


async def test_a_permanent_port_child_is_restarted_after_a_non_zero_exit_status() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        _sup, old, rows = await _exit_status_child("permanent", 3)
        new = pid_of(rows, "prog")
        assert new != old
        assert otp.process_info(new) is not None


async def test_a_temporary_port_child_is_dropped_after_its_program_exits() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup, _old, rows = await _exit_status_child("temporary", 3)
        assert rows == []
        assert (await count_children(sup))["specs"] == 0


async def test_a_transient_port_child_is_kept_stopped_after_exit_status_zero() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup, _old, rows = await _exit_status_child("transient", 0)
        assert [(row[0], row[1]) for row in rows] == [("prog", None)]
        assert await count_children(sup) == {
            "specs": 1,
            "active": 0,
            "supervisors": 0,
            "workers": 1,
        }
        # restart_child brings the stopped port back.
        result = await restart_child(sup, "prog")
        assert result[0] == "ok" and isinstance(result[1], otp.Pid)
        assert pid_of(await which_children(sup), "prog") == result[1]


async def test_a_transient_port_child_is_restarted_after_a_non_zero_exit_status() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        _sup, old, rows = await _exit_status_child("transient", 3)
        assert pid_of(rows, "prog") != old


async def test_which_and_count_children_with_port_children() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags(),
            [
                ChildSpec("a", (otp.open_port, ["sleep", "60"])),
                ChildSpec("b", (otp.open_port, ["sleep", "60"])),
            ],
        )
        rows = await which_children(sup)
        assert [row[0] for row in rows] == ["b", "a"]
        assert all(isinstance(row[1], otp.Pid) for row in rows)
        assert await count_children(sup) == {
            "specs": 2,
            "active": 2,
            "supervisors": 0,
            "workers": 2,
        }
        assert await start_child(sup, ChildSpec("a", (otp.open_port, ["sleep", "60"]))) == (
            "error",
            ("already_started", pid_of(rows, "a")),
        )


# -- intensity ----------------------------------------------------------------------------------


async def test_a_crash_looping_program_makes_the_supervisor_give_up_and_stop_the_others() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        me = otp.self()

        async def steady() -> otp.Pid:
            port = await otp.open_port(["sleep", "60"])
            otp.send(me, ("steady", await otp.port_os_pid(port)))
            return port

        async def looper() -> otp.Pid:
            otp.send(me, "looper started")
            return await otp.open_port(["sh", "-c", "exit 3"])

        sup = await Supervisor.start_link(
            SupFlags(intensity=2, period=5),
            [ChildSpec("steady", steady), ChildSpec("looper", looper)],
        )
        with trio.fail_after(BOUND):
            exit_ = await otp.receive(lambda m: isinstance(m, otp.Exit) and m.pid == sup)
        assert exit_.reason == otp.SHUTDOWN
        _, os_pid = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "steady")
        assert _gone(os_pid)
        starts = 0
        while await otp.receive(lambda m: m == "looper started", timeout=0, default=None):
            starts += 1
        assert starts == 3  # the first start and exactly `intensity` restarts
        assert otp.processes() == [otp.self()]


# -- stopping port children ---------------------------------------------------------------------


async def _terminate_port_child(shutdown: Any, kill_timeout: float) -> tuple[float, int]:
    sup = await Supervisor.start_link(
        SupFlags(),
        [
            ChildSpec(
                "prog",
                (start_ready_port, [PY, "-c", IGNORE_TERM], kill_timeout),
                shutdown=shutdown,
            )
        ],
    )
    port = pid_of(await which_children(sup), "prog")
    os_pid = await otp.port_os_pid(port)
    start = trio.current_time()
    with trio.fail_after(BOUND):
        assert await terminate_child(sup, "prog") == "ok"
    elapsed = trio.current_time() - start
    assert otp.process_info(port) is None
    assert _gone(os_pid)
    assert [(row[0], row[1]) for row in await which_children(sup)] == [("prog", None)]
    return elapsed, os_pid


async def test_terminate_child_kills_a_program_ignoring_sigterm_after_the_shutdown_time() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        elapsed, _ = await _terminate_port_child(0.3, kill_timeout=30.0)
        assert 0.3 <= elapsed < BOUND


async def test_terminate_child_brutal_kill_kills_the_program_at_once() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        elapsed, _ = await _terminate_port_child(BRUTAL_KILL, kill_timeout=30.0)
        assert elapsed < BOUND


async def test_terminate_child_infinity_relies_on_the_ports_kill_timeout() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        elapsed, _ = await _terminate_port_child(INFINITY, kill_timeout=0.3)
        assert 0.3 <= elapsed < BOUND


async def test_one_for_all_restart_stops_and_restarts_a_sibling_program() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags(strategy="one_for_all", intensity=3),
            [
                ChildSpec("steady", (otp.open_port, ["sleep", "60"])),
                ChildSpec("trigger", (otp.open_port, EXIT_ON_INPUT)),
            ],
        )
        rows = await which_children(sup)
        steady, trigger = pid_of(rows, "steady"), pid_of(rows, "trigger")
        os_pid = await otp.port_os_pid(steady)
        steady_ref = otp.monitor(steady)
        otp.port_command(trigger, b"3\n")
        with trio.fail_after(BOUND):
            down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == steady_ref)
        assert down.reason == otp.SHUTDOWN
        assert _gone(os_pid)
        after = await which_children(sup)
        assert pid_of(after, "steady") != steady and pid_of(after, "trigger") != trigger


# -- a supervisor stopped while a child is starting ----------------------------------------------


class Gate(GenServer):
    """A worker whose init waits for the message ``"open"`` (a child mid-start)."""

    async def init(self, report_to: otp.Pid) -> Ok:
        otp.send(report_to, ("gate", otp.self()))
        await otp.receive(lambda m: m == "open")
        return Ok(None)


async def _start_port_then_gate(me: otp.Pid, link: bool) -> None:
    async def port_child() -> otp.Pid:
        port = await otp.open_port(["sleep", "60"])
        otp.send(me, ("port", otp.self(), port, await otp.port_os_pid(port)))
        return port

    flags = SupFlags()
    children = [ChildSpec("port", port_child), ChildSpec("gate", (Gate.start_link, me))]
    try:
        await (Supervisor.start_link if link else Supervisor.start)(flags, children)
    except otp.StartError as exc:
        otp.send(me, ("start_error", exc.reason))


async def test_a_supervisor_killed_mid_start_takes_its_port_childs_program_with_it() -> None:
    async with otp.open_node():
        me = otp.self()
        otp.spawn(_start_port_then_gate, me, False)
        with trio.fail_after(BOUND):
            _, sup, port, os_pid = await otp.receive(lambda m: m[0] == "port")
            await otp.receive(lambda m: m[0] == "gate")
        otp.exit(sup, otp.KILL)
        assert (await _down_of(port)).reason == otp.KILLED
        assert _gone(os_pid)


async def test_a_supervisor_shut_down_mid_start_finishes_then_stops_its_port_child() -> None:
    async with otp.open_node():
        me = otp.self()
        parent = otp.spawn(_start_port_then_gate, me, True)
        with trio.fail_after(BOUND):
            _, sup, port, os_pid = await otp.receive(lambda m: m[0] == "port")
            _, gate = await otp.receive(lambda m: m[0] == "gate")
        sup_ref = otp.monitor(sup)
        port_ref = otp.monitor(port)
        # The parent dies: its Exit is queued while the supervisor (trapping) is in init.
        otp.exit(parent, otp.SHUTDOWN)
        otp.send(gate, "open")
        with trio.fail_after(BOUND):
            port_down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == port_ref)
            sup_down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == sup_ref)
        assert port_down.reason == otp.SHUTDOWN
        assert sup_down.reason == otp.SHUTDOWN
        assert _gone(os_pid)


# -- GenServers that own ports ------------------------------------------------------------------


class PortOwner(GenServer):
    """Owns a port; reports what reaches ``handle_info`` and ``terminate``."""

    async def init(self, report_to: otp.Pid, argv: list[str], trap: bool) -> Ok:
        otp.process_flag(trap_exit=trap)
        port = await otp.open_port(argv, mode="line")
        otp.send(report_to, ("port", port, await otp.port_os_pid(port)))
        return Ok((report_to, port))

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        otp.port_command(state[1], request)
        return Reply("sent", state)

    async def handle_info(self, message: Any, state: Any) -> Any:
        otp.send(state[0], ("info", message))
        return NoReply(state)

    async def terminate(self, reason: Any, state: Any) -> None:
        otp.send(state[0], ("terminate", reason))


async def test_a_trapping_gen_server_gets_its_ports_data_and_exit_status_in_handle_info() -> None:
    async with otp.open_node():
        me = otp.self()
        script = "import sys; print(sys.stdin.readline().strip().upper(), flush=True); sys.exit(3)"
        pid = await PortOwner.start(me, [PY, "-c", script], True)
        _, port, _ = await otp.receive(lambda m: m[0] == "port")
        assert await otp.call(pid, b"hi\n") == "sent"
        with trio.fail_after(BOUND):
            assert await otp.receive() == ("info", otp.PortData(port, b"HI"))
            assert await otp.receive() == ("info", otp.Exit(port, otp.ExitStatus(3)))
        assert otp.process_info(pid) is not None


@pytest.mark.parametrize("trap", [True, False])
async def test_supervisor_shutdown_runs_terminate_only_when_trapping_and_stops_the_program(
    trap: bool,
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        me = otp.self()
        sup = await Supervisor.start_link(
            SupFlags(), [ChildSpec("owner", (PortOwner.start_link, me, ["sleep", "60"], trap))]
        )
        _, port, os_pid = await otp.receive(lambda m: m[0] == "port")
        port_ref = otp.monitor(port)
        otp.exit(sup, otp.SHUTDOWN)
        with trio.fail_after(BOUND):
            assert await otp.receive(otp.Exit) == otp.Exit(sup, otp.SHUTDOWN)
            # The port follows its owner asynchronously, as an Erlang port closes after its
            # owner's death: wait for it before looking at the program.
            down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == port_ref)
        assert down.reason == otp.SHUTDOWN
        terminated = await otp.receive(
            lambda m: isinstance(m, tuple) and m[0] == "terminate", timeout=0, default=None
        )
        assert terminated == (("terminate", otp.SHUTDOWN) if trap else None)
        assert _gone(os_pid)


async def test_a_brutally_killed_port_owner_takes_the_program_with_it() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        me = otp.self()
        sup = await Supervisor.start_link(
            SupFlags(),
            [
                ChildSpec(
                    "owner",
                    (PortOwner.start_link, me, ["sleep", "60"], True),
                    shutdown=BRUTAL_KILL,
                )
            ],
        )
        _, port, os_pid = await otp.receive(lambda m: m[0] == "port")
        port_ref = otp.monitor(port)
        assert await terminate_child(sup, "owner") == "ok"
        with trio.fail_after(BOUND):
            down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == port_ref)
        assert down.reason == otp.KILLED
        assert _gone(os_pid)
        assert await otp.receive(lambda m: m[0] == "terminate", timeout=0, default=None) is None


# -- open_port failure --------------------------------------------------------------------------


async def test_a_port_child_whose_program_is_missing_fails_the_supervisor_start() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with pytest.raises(otp.StartError) as info:
            await Supervisor.start_link(
                SupFlags(),
                [
                    ChildSpec("ok", (otp.open_port, ["sleep", "60"])),
                    ChildSpec("missing", (otp.open_port, ["/nonexistent/program"])),
                ],
            )
        reason = info.value.reason
        assert isinstance(reason, otp.Shutdown)
        assert reason.detail[:2] == ("failed_to_start_child", "missing")
        assert isinstance(reason.detail[2], FileNotFoundError)
        await trio.testing.wait_all_tasks_blocked()
        assert otp.processes() == [otp.self()]


# -- DynamicSupervisor: each child's own shutdown -----------------------------------------------


# -- GenServer edges ----------------------------------------------------------------------------


# -- timers -------------------------------------------------------------------------------------
