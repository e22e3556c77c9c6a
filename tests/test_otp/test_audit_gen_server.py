"""Audit of GenServer (otp/_gen_server.py) and timers (otp/_timers.py, the timer functions of
otp/_api.py) against OTP_SEMANTICS.md section 4 and OTP 25's gen_server, gen and proc_lib.

The first section holds the bugs the audit proved (now fixed, kept as regression tests); the
second guards tricky edges that were checked and found right.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer, NoReply, Ok, Reply, Stop

from .peer import COOKIE, PeerNode


class _Recorder(GenServer):
    """Reports every request, info and terminate to the process given at start."""

    def init(self, report_to: otp.Pid, trap: bool = False) -> Ok:
        otp.process_flag(trap_exit=trap)
        return Ok(report_to)

    def handle_call(self, request: Any, from_: otp.From, state: otp.Pid) -> Any:
        otp.send(state, ("call", request))
        if request == "hang":
            return NoReply(state)
        return Reply(request, state)

    def handle_info(self, message: Any, state: otp.Pid) -> Any:
        otp.send(state, ("info", message))
        return NoReply(state)

    def terminate(self, reason: Any, state: otp.Pid) -> None:
        otp.send(state, ("terminate", reason))


class _SlowInit(GenServer):
    async def init(self) -> Ok:
        await trio.sleep(10)
        return Ok(None)


def _monitors(pid: otp.Pid) -> tuple[Any, Any]:
    """(who monitors ``pid``, what ``pid`` monitors)."""
    info = otp.process_info(pid)
    assert info is not None
    return info.monitored_by, info.monitors


# -- bugs -----------------------------------------------------------------------------------------


async def test_a_call_timeout_that_is_not_a_number_is_refused_before_the_request_is_sent() -> None:
    async with otp.open_node():
        me = otp.self()
        pid = await _Recorder.start(me)
        with pytest.raises(TypeError, match="timeout"):
            await otp.call(pid, "x", timeout="5")  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default="nothing") == "nothing"
        assert _monitors(pid) == ((), ())
        assert _monitors(me) == ((), ())


async def test_a_nan_call_timeout_is_refused_before_the_request_is_sent() -> None:
    async with otp.open_node():
        pid = await _Recorder.start(otp.self())
        with pytest.raises(ValueError, match="timeout"):
            await otp.call(pid, "x", timeout=math.nan)
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default="nothing") == "nothing"


@pytest.mark.parametrize("link", [False, True], ids=["start", "start_link"])
async def test_a_start_timeout_that_is_not_a_number_starts_nothing(link: bool) -> None:
    async with otp.open_node():
        start = _Recorder.start_link if link else _Recorder.start
        with pytest.raises(TypeError, match="timeout"):
            await start(otp.self(), timeout="1")  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert otp.processes() == [otp.self()]


async def test_a_stop_timeout_that_is_not_a_number_leaves_the_server_running() -> None:
    async with otp.open_node():
        pid = await _Recorder.start(otp.self())
        with pytest.raises(TypeError, match="timeout"):
            await GenServer.stop(pid, timeout="1")  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert otp.process_info(pid) is not None
        assert await otp.receive(timeout=0, default="nothing") == "nothing"


@pytest.mark.parametrize("link", [False, True], ids=["start", "start_link"])
async def test_a_cancelled_start_leaves_no_server_behind(
    autojump_clock: trio.testing.MockClock, link: bool
) -> None:
    async with otp.open_node():
        with trio.move_on_after(1):
            await (_SlowInit.start_link() if link else _SlowInit.start())
        await trio.sleep(20)  # long after init would have returned
        assert otp.processes() == [otp.self()]
        assert await otp.receive(timeout=0, default="nothing") == "nothing"


@pytest.mark.parametrize(
    ("arm", "delay", "error"),
    [
        ("send_after", math.nan, ValueError),
        ("send_after", "1", TypeError),
        ("exit_after", math.nan, ValueError),
    ],
    ids=["send_after_nan", "send_after_str", "exit_after_nan"],
)
async def test_a_timer_delay_that_is_not_a_number_of_seconds_is_refused(
    autojump_clock: trio.testing.MockClock, arm: str, delay: Any, error: type[Exception]
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with pytest.raises(error, match="delay"):
            if arm == "send_after":
                otp.send_after(delay, otp.self(), "fired")
            else:
                otp.exit_after(delay, otp.self(), "fired")
        assert await otp.receive(timeout=10, default="nothing") == "nothing"


@pytest.mark.parametrize(
    "build",
    [
        lambda: Ok(None, timeout="hibernate"),  # type: ignore[arg-type]
        lambda: Reply(1, None, timeout="hibernate"),  # type: ignore[arg-type]
        lambda: NoReply(None, timeout="hibernate"),  # type: ignore[arg-type]
        lambda: NoReply(None, timeout=math.nan),
    ],
    ids=["Ok", "Reply", "NoReply", "NoReply_nan"],
)
def test_a_callback_return_with_a_bad_timeout_is_refused_when_built(
    build: Callable[[], object],
) -> None:
    with pytest.raises((TypeError, ValueError), match="timeout"):
        build()


@pytest.mark.parametrize("use", [otp.cancel_timer, otp.read_timer], ids=["cancel", "read"])
async def test_a_timer_function_given_something_other_than_a_ref_is_a_typed_error(
    use: Callable[[Any], object],
) -> None:
    async with otp.open_node():
        with pytest.raises(TypeError, match="Ref"):
            use(otp.self())


async def test_stop_reaches_a_server_on_another_node(tmp_path: Path) -> None:
    b_address = f"unix:{tmp_path / 'b'}.sock"
    async with PeerNode("b@localhost", b_address):
        async with otp.open_node("a@localhost"):
            config = otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path / 'a'}.sock",))
            await otp.start_distribution(config)
            assert await otp.connect("b@localhost", b_address)
            remote = ("echo", "b@localhost")
            await GenServer.stop(remote, otp.NORMAL, timeout=5)
            with pytest.raises(otp.CallError) as info:
                await otp.call(remote, "x")
            assert info.value.reason == otp.NOPROC


async def test_a_start_whose_caller_is_killed_leaves_the_server_to_the_link(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Only a cancel scope of the caller kills the half-started server; a caller that dies
    # leaves it to OTP's rules: unlinked, it lives on; linked, the caller's exit kills it.
    async with otp.open_node():
        me = otp.self()
        starters = {
            link: otp.spawn(_SlowInit.start_link if link else _SlowInit.start)
            for link in (False, True)
        }
        await trio.testing.wait_all_tasks_blocked()
        info = otp.process_info(starters[True])
        assert info is not None
        (linked,) = info.links
        (unlinked,) = [p for p in otp.processes() if p not in (me, linked, *starters.values())]
        refs = {otp.monitor(linked): "linked", otp.monitor(unlinked): "unlinked"}
        for starter in starters.values():
            otp.exit(starter, otp.KILL)
        down = await otp.receive(otp.Down)
        assert (refs[down.ref], down.reason) == ("linked", otp.KILLED)
        await trio.sleep(20)  # long after init returned
        assert otp.process_info(unlinked) is not None


async def test_stop_of_a_name_nobody_holds_on_another_node_is_noproc(tmp_path: Path) -> None:
    b_address = f"unix:{tmp_path / 'b'}.sock"
    async with PeerNode("b@localhost", b_address):
        async with otp.open_node("a@localhost"):
            config = otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path / 'a'}.sock",))
            await otp.start_distribution(config)
            assert await otp.connect("b@localhost", b_address)
            me = otp.self()
            with pytest.raises(otp.NoProc, match="nobody"):
                await GenServer.stop(("nobody", "b@localhost"), timeout=5)
            assert _monitors(me) == ((), ())
            assert await otp.call(("echo", "b@localhost"), "still here") == "still here"


async def test_a_bad_call_timeout_to_another_node_is_refused_before_anything_is_sent() -> None:
    async with otp.open_node("a@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=()))
        me = otp.self()
        with pytest.raises(TypeError, match=r"GenServer\.call\(timeout=\.\.\.\) must be a number"):
            await otp.call(("echo", "b@localhost"), "x", timeout="5")  # type: ignore[arg-type]
        assert _monitors(me) == ((), ())
        assert otp.nodes() == []


async def test_timeouts_and_delays_may_be_int_or_float_subclasses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Seconds(float):
        pass

    async with otp.open_node():
        me = otp.self()
        pid = await _Recorder.start(me, timeout=Seconds(1))
        assert await otp.call(pid, "x", timeout=Seconds(1)) == "x"
        otp.send_after(Seconds(1), me, "fired")
        assert await otp.receive(lambda m: m == "fired") == "fired"
        await GenServer.stop(pid, timeout=Seconds(1))


def test_a_bad_timeout_error_names_the_class_the_field_and_the_value() -> None:
    with pytest.raises(
        TypeError,
        match=r"^NoReply\.timeout must be a number of seconds or None \(got 'hibernate'\)$",
    ):
        NoReply(None, timeout="hibernate")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Ok\.timeout .*\(got True\)$"):
        Ok(None, timeout=True)
    assert Reply(1, None, timeout=0).timeout == 0


# -- edges checked and found right ----------------------------------------------------------------


async def test_a_call_cancelled_by_the_caller_leaves_no_monitor_and_drops_the_late_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    captured: list[otp.From] = []

    class Holds(GenServer):
        def handle_call(self, request: Any, from_: otp.From, state: Any) -> NoReply:
            captured.append(from_)
            return NoReply(state)

    async with otp.open_node():
        me = otp.self()
        pid = await Holds.start()
        with trio.move_on_after(1):
            await otp.call(pid, "x", timeout=None)
        assert _monitors(pid) == ((), ())
        assert _monitors(me) == ((), ())
        otp.reply(captured[0], "too late")
        otp.exit(pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_noreply_timeout_is_cancelled_by_any_message_and_rearmed_only_by_the_return(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Idle(GenServer):
        def init(self, report_to: otp.Pid) -> Ok:
            return Ok(report_to, timeout=5)

        def handle_cast(self, timeout: float | None, state: otp.Pid) -> NoReply:
            return NoReply(state, timeout=timeout)

        def handle_info(self, message: Any, state: otp.Pid) -> NoReply:
            otp.send(state, (message, trio.current_time()))
            return NoReply(state)

    async with otp.open_node():
        t0 = trio.current_time()
        pid = await Idle.start(otp.self())
        await trio.sleep(3)
        otp.cast(pid, None)  # cancels the 5 s timeout and arms none
        assert await otp.receive(timeout=60, default="none") == "none"
        otp.cast(pid, 2)
        assert await otp.receive() == ("timeout", pytest.approx(t0 + 63 + 2))


async def test_a_stop_that_times_out_leaves_the_server_running_and_no_monitor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class SlowTerminate(GenServer):
        async def terminate(self, reason: Any, state: Any) -> None:
            await trio.sleep(100)

    async with otp.open_node():
        me = otp.self()
        pid = await SlowTerminate.start()
        with pytest.raises(TimeoutError):
            await GenServer.stop(pid, timeout=1)
        assert otp.process_info(pid) is not None
        assert _monitors(pid) == ((), ())
        assert _monitors(me) == ((), ())
        ref = otp.monitor(pid)
        assert await otp.receive() == otp.Down(ref, pid, otp.NORMAL)  # terminate goes on
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_trapping_server_runs_terminate_when_its_parent_exits_normal() -> None:
    async with otp.open_node():
        me = otp.self()

        async def parent() -> None:
            await _Recorder.start_link(me, True)
            otp.send(me, "started")

        otp.spawn(parent)
        assert await otp.receive() == "started"
        assert await otp.receive() == ("terminate", otp.NORMAL)


async def test_a_stop_with_reply_still_replies_when_terminate_raises() -> None:
    class Bye(GenServer):
        def handle_call(self, request: Any, from_: otp.From, state: Any) -> Stop:
            return Stop(otp.NORMAL, state, reply="bye")

        def terminate(self, reason: Any, state: Any) -> None:
            raise RuntimeError("terminate failed")

    async with otp.open_node():
        pid = await Bye.start()
        ref = otp.monitor(pid)
        assert await otp.call(pid, "stop") == "bye"
        down = await otp.receive()
        assert down.ref == ref and isinstance(down.reason, otp.Crash)
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_timer_to_a_pid_that_is_already_dead_never_fires_and_reads_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        me = otp.self()
        pid = await _Recorder.start(me)
        await GenServer.stop(pid)
        assert await otp.receive() == ("terminate", otp.NORMAL)
        ref = otp.send_after(1, pid, "never")
        assert isinstance(ref, otp.Ref)
        assert otp.read_timer(ref) is None
        assert otp.cancel_timer(ref) is None
        await trio.sleep(2)
        assert await otp.receive(timeout=0, default="empty") == "empty"
