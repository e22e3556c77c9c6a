"""OTP_SEMANTICS.md section 4: gen_server."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import otp
from otp import GenServer, NoReply, Ok, Reply, Stop
from otp._gen_server_returns import UNSET

from .helpers import Sleepy, _Recorder
from .peer import COOKIE, PeerNode


class Counter(GenServer):
    def init(self, start: int = 0) -> Ok:
        return Ok(start)

    def handle_call(self, request: Any, from_: otp.From, state: int) -> Any:
        match request:
            case "get":
                return Reply(state, state)
            case ("add", n):
                return Reply(state + n, state + n)
            case "crash":
                raise ValueError("crash in handle_call")
            case "stop_with_reply":
                return Stop("normal", state, reply="bye")
            case "bad":
                return "not a typed return"
        raise AssertionError(request)

    def handle_cast(self, request: Any, state: int) -> NoReply:
        return NoReply(state + request)


class Recorder(GenServer):
    """Reports every terminate to the process given at start."""

    async def init(self, report_to: otp.Pid, trap: bool = False) -> Ok:
        otp.process_flag(trap_exit=trap)
        return Ok(report_to)

    async def handle_call(self, request: Any, from_: otp.From, state: otp.Pid) -> Any:
        if request == "defer":
            otp.spawn(_reply_later, from_)
            return NoReply(state)
        if request == "hang":
            return NoReply(state)
        return Reply(request, state)

    async def handle_info(self, message: Any, state: otp.Pid) -> Any:
        if isinstance(message, otp.Exit):
            return Stop(message.reason, state)
        otp.send(state, ("info", message))
        return NoReply(state)

    async def terminate(self, reason: Any, state: otp.Pid) -> None:
        otp.send(state, ("terminate", reason))


async def _reply_later(from_: otp.From) -> None:
    await trio.sleep(0)
    otp.reply(from_, "deferred answer")


async def test_start_link_returns_after_init_and_call_cast_work() -> None:
    async with otp.open_node():
        pid = await Counter.start_link(5)
        assert await otp.call(pid, "get") == 5
        otp.cast(pid, 10)
        assert await otp.call(pid, ("add", 1)) == 16


async def test_init_stop_fails_start_and_a_trapping_caller_gets_the_exit() -> None:
    class Refuses(GenServer):
        def init(self) -> Stop:
            return Stop("no_thanks")

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with pytest.raises(otp.StartError) as info:
            await Refuses.start_link()
        assert info.value.reason == "no_thanks"
        exit_message = await otp.receive(otp.Exit, timeout=0)
        assert exit_message.reason == "no_thanks"


async def test_init_ignore_returns_ignored_and_exits_normal() -> None:
    class Declines(GenServer):
        def init(self) -> otp.Ignore:
            return otp.Ignore()

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with pytest.raises(otp.StartIgnored):
            await Declines.start_link()
        assert (await otp.receive(otp.Exit, timeout=0)).reason == otp.NORMAL


async def test_init_bad_return_value_fails_start() -> None:
    class Odd(GenServer):
        def init(self) -> Any:
            return 42

    async with otp.open_node():
        with pytest.raises(otp.StartError) as info:
            await Odd.start()
        assert info.value.reason == otp.BadReturnValue(42)


async def test_init_exception_fails_start_with_a_crash_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Explodes(GenServer):
        def init(self) -> Ok:
            raise KeyError("missing")

    async with otp.open_node():
        with pytest.raises(otp.StartError) as info:
            await Explodes.start()
        assert isinstance(info.value.reason, otp.Crash)
        assert isinstance(info.value.reason.exception, KeyError)


async def test_start_with_a_taken_name_is_already_started() -> None:
    async with otp.open_node():
        first = await Counter.start(name="counter")
        with pytest.raises(otp.StartError) as info:
            await Counter.start(name="counter")
        assert info.value.reason == ("already_started", first)
        assert await otp.call("counter", "get") == 0


async def test_call_times_out_after_5_seconds_by_default_and_drops_the_late_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        me = otp.self()
        pid = await Recorder.start(me)
        start = trio.current_time()
        with pytest.raises(otp.CallTimeout) as info:
            await otp.call(pid, "hang")
        assert trio.current_time() - start == pytest.approx(5.0)
        assert info.value.reason == "timeout"
        assert isinstance(info.value, TimeoutError)


async def test_late_reply_after_timeout_is_dropped(autojump_clock: trio.testing.MockClock) -> None:
    captured: list[otp.From] = []

    class Slow(GenServer):
        def handle_call(self, request: Any, from_: otp.From, state: Any) -> NoReply:
            captured.append(from_)
            return NoReply(state)

    async with otp.open_node():
        pid = await Slow.start()
        with pytest.raises(otp.CallTimeout):
            await otp.call(pid, "x", timeout=1)
        otp.reply(captured[0], "too late")
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_calls_timeout_is_gone_once_it_returns_and_no_timer_ref_reaches_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Peeking(GenServer):
        def handle_call(self, request: Any, from_: otp.From, state: Any) -> Reply:
            # The call's tag is a ref the server sees: the caller's timeout is no timer of it.
            return Reply((otp.read_timer(from_.tag), otp.cancel_timer(from_.tag)), state)

    async with otp.open_node():
        node = otp.current_node()
        pid = await Peeking.start()
        for _ in range(3000):
            assert await otp.call(pid, "x", timeout=60) == (None, None)
        assert len(node.timers) == 0
        assert len(node.timers._heap) <= 2048


async def test_call_to_a_dead_server_raises_noproc() -> None:
    async with otp.open_node():
        pid = await Counter.start()
        await GenServer.stop(pid)
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, "get")
        assert info.value.reason == otp.NOPROC
        with pytest.raises(otp.CallError) as info:
            await otp.call("unregistered", "get")
        assert info.value.reason == otp.NOPROC


async def test_call_carries_the_servers_exit_reason_when_it_dies() -> None:
    async with otp.open_node():
        pid = await Counter.start()
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, "crash")
        reason = info.value.reason
        assert isinstance(reason, otp.Crash)
        assert str(reason.exception) == "crash in handle_call"


async def test_calling_self_fails_with_calling_self() -> None:
    class SelfCaller(GenServer):
        async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Reply:
            try:
                await otp.call(otp.self(), "again")
            except otp.CallError as exc:
                return Reply(exc.reason, state)
            return Reply("unreachable", state)

    async with otp.open_node():
        pid = await SelfCaller.start()
        assert await otp.call(pid, "go") == "calling_self"


async def test_deferred_reply_from_another_process() -> None:
    async with otp.open_node():
        pid = await Recorder.start(otp.self())
        assert await otp.call(pid, "defer") == "deferred answer"


async def test_stop_with_reply_runs_terminate_before_the_reply() -> None:
    order: list[str] = []

    class Stopper(GenServer):
        def handle_call(self, request: Any, from_: otp.From, state: Any) -> Stop:
            return Stop("normal", state, reply="bye")

        def terminate(self, reason: Any, state: Any) -> None:
            order.append("terminate")

    async with otp.open_node():
        pid = await Stopper.start()
        assert await otp.call(pid, "stop") == "bye"
        order.append("reply")
        assert order == ["terminate", "reply"]


async def test_bad_return_value_from_handle_call_exits_the_server() -> None:
    async with otp.open_node():
        pid = await Counter.start()
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, "bad")
        assert info.value.reason == otp.BadReturnValue("not a typed return")


async def test_cast_never_fails() -> None:
    async with otp.open_node():
        pid = await Counter.start()
        await GenServer.stop(pid)
        otp.cast(pid, 1)
        otp.cast("nobody", 1)


async def test_handle_info_gets_exits_from_non_parent_links() -> None:
    async with otp.open_node():
        me = otp.self()
        pid = await Recorder.start(me, True)

        async def linked_then_crash() -> None:
            otp.link(pid)
            otp.exit_self("neighbour_died")

        otp.spawn(linked_then_crash)
        assert await otp.receive() == ("terminate", "neighbour_died")


async def test_parent_exit_runs_terminate_only_when_trapping() -> None:
    async with otp.open_node():
        me = otp.self()

        async def parent(trap: bool) -> None:
            await Recorder.start_link(me, trap)
            otp.send(me, "started")
            await otp.receive()
            otp.exit_self(otp.SHUTDOWN)

        trapping = otp.spawn(parent, True)
        assert await otp.receive() == "started"
        otp.send(trapping, "go")
        assert await otp.receive() == ("terminate", otp.SHUTDOWN)

        plain = otp.spawn(parent, False)
        assert await otp.receive() == "started"
        otp.send(plain, "go")
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default="no terminate") == "no terminate"


async def test_terminate_runs_after_a_callback_exception() -> None:
    class Fragile(Recorder):
        async def handle_cast(self, request: Any, state: otp.Pid) -> NoReply:
            raise RuntimeError("cast crash")

    async with otp.open_node():
        pid = await Fragile.start(otp.self())
        otp.cast(pid, "boom")
        tag, reason = await otp.receive()
        assert tag == "terminate"
        assert isinstance(reason, otp.Crash)


async def test_terminate_is_not_run_on_kill() -> None:
    async with otp.open_node():
        pid = await Recorder.start(otp.self(), True)
        ref = otp.monitor(pid)
        otp.exit(pid, otp.KILL)
        assert await otp.receive() == otp.Down(ref, pid, otp.KILLED)


@pytest.mark.parametrize(
    ("trap", "reason", "seen"), [(True, otp.KILL, otp.KILLED), (False, "boom", "boom")]
)
async def test_a_callback_killed_by_its_own_exit_signal_runs_no_terminate(
    trap: bool, reason: object, seen: object
) -> None:
    # exit(self(), R) that kills the server is an exit signal, not exit/1: OTP's gen_server
    # never gets to catch it, so terminate does not run.
    class SelfKiller(Recorder):
        async def handle_cast(self, request: Any, state: otp.Pid) -> NoReply:
            otp.exit(otp.self(), reason)
            otp.send(state, "ran on")
            return NoReply(state)

    async with otp.open_node():
        pid = await SelfKiller.start(otp.self(), trap)
        ref = otp.monitor(pid)
        otp.cast(pid, "go")
        assert await otp.receive() == otp.Down(ref, pid, seen)
        assert await otp.receive(timeout=0, default=None) is None


async def test_normal_and_shutdown_exits_are_not_logged_abnormal_ones_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Stopper(GenServer):
        def handle_cast(self, reason: Any, state: Any) -> Stop:
            return Stop(reason, state)

    caplog.set_level(logging.INFO)
    async with otp.open_node():
        for reason in [otp.NORMAL, otp.SHUTDOWN, otp.Shutdown("x"), "boom"]:
            otp.spawn_monitor(_start_and_cast, Stopper, reason)
            await otp.receive(otp.Down)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert errors[0].otp_report["reason"] == "boom"  # type: ignore[attr-defined]
        assert errors[0].otp_report["last_message"] is not None  # type: ignore[attr-defined]


async def _start_and_cast(cls: type[GenServer], reason: Any) -> None:
    pid = await cls.start()
    ref = otp.monitor(pid)
    otp.cast(pid, reason)
    await otp.receive(otp.Down)
    assert ref is not None


async def test_a_crash_is_logged_once_as_a_structured_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with otp.open_node():

        async def crash() -> None:
            raise ZeroDivisionError("plain crash")

        otp.spawn_monitor(crash)
        await otp.receive(otp.Down)
        pid = await Counter.start()
        with pytest.raises(otp.CallError):
            await otp.call(pid, "crash")
    crashes = [r for r in caplog.records if r.name == "otp.crash"]
    assert len(crashes) == 2
    report = crashes[1].otp_report  # type: ignore[attr-defined]
    assert report["behaviour"].startswith("GenServer")
    assert report["process"] == pid
    assert crashes[1].exc_info is not None


async def test_gen_server_stop_runs_terminate_and_checks_the_reason() -> None:
    async with otp.open_node():
        pid = await Recorder.start(otp.self())
        await GenServer.stop(pid, otp.SHUTDOWN)
        assert await otp.receive() == ("terminate", otp.SHUTDOWN)
        with pytest.raises(otp.NoProc):
            await GenServer.stop(pid)


async def test_timeout_return_delivers_timeout_to_handle_info(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Idle(GenServer):
        def init(self, report_to: otp.Pid) -> Ok:
            return Ok(report_to, timeout=3)

        def handle_info(self, message: Any, state: otp.Pid) -> NoReply:
            otp.send(state, (message, trio.current_time()))
            return NoReply(state)

    async with otp.open_node():
        start = trio.current_time()
        await Idle.start(otp.self())
        message, when = await otp.receive()
        assert message == "timeout"
        assert when - start == pytest.approx(3)


async def test_continue_runs_before_the_next_message() -> None:
    class Continues(GenServer):
        def init(self) -> Ok:
            return Ok([], continue_="load")

        def handle_continue(self, continue_: Any, state: list[str]) -> NoReply:
            return NoReply([*state, continue_])

        def handle_call(self, request: Any, from_: otp.From, state: list[str]) -> Reply:
            return Reply(state, state, continue_="again")

    async with otp.open_node():
        pid = await Continues.start()
        assert await otp.call(pid, "get") == ["load"]
        assert await otp.call(pid, "get") == ["load", "again"]


async def test_start_timeout_kills_the_half_started_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class SlowInit(GenServer):
        async def init(self) -> Ok:
            await trio.sleep(10)
            return Ok(None)

    async with otp.open_node():
        with pytest.raises(otp.StartError) as info:
            await SlowInit.start(timeout=1)
        assert info.value.reason == "timeout"
        await trio.testing.wait_all_tasks_blocked()
        assert otp.processes() == [otp.self()]


async def test_a_late_reply_from_the_server_itself_never_reaches_the_caller(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        with pytest.raises(otp.CallTimeout):
            await otp.call(pid, ("sleep", 2.0), timeout=1.0)
        # The next call gets its own reply, not the stale one.
        assert await otp.call(pid, ("echo", 1)) == ("echo", 1)
        await trio.sleep(5)
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_server_dying_after_a_call_timed_out_sends_no_stray_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        with pytest.raises(otp.CallTimeout):
            await otp.call(pid, ("sleep", 2.0), timeout=1.0)
        otp.exit(pid, otp.KILL)
        await trio.sleep(5)
        assert otp.process_info(pid) is None
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_call_to_a_server_killed_mid_call_fails_with_killed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        otp.exit_after(0.5, pid, otp.KILL)
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, ("sleep", 10.0))
        assert info.value.reason == otp.KILLED
        assert not isinstance(info.value, otp.CallTimeout)


async def test_a_call_stopping_the_server_without_reply_fails_with_its_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, ("die", otp.Shutdown("bye")))
        assert info.value.reason == otp.Shutdown("bye")


class Terminator(GenServer):
    async def init(self, report_to: otp.Pid, hang: bool = False) -> Ok:
        return Ok((report_to, hang))

    async def handle_cast(self, request: Any, state: Any) -> Any:
        return request  # whatever the test sends: a bad return unless typed

    async def handle_info(self, message: Any, state: Any) -> Any:
        if message == "bad":
            return Reply("not allowed in handle_info", state)
        otp.send(state[0], ("info", message))
        return NoReply(state)

    async def terminate(self, reason: Any, state: Any) -> None:
        otp.send(state[0], ("terminate", reason))
        if state[1]:
            await trio.sleep_forever()


async def test_stop_with_a_reason_runs_terminate_with_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Terminator.start(otp.self())
        await GenServer.stop(pid, otp.Shutdown("bye"), 1.0)
        assert await otp.receive() == ("terminate", otp.Shutdown("bye"))
        assert otp.process_info(pid) is None
        with pytest.raises(otp.NoProc):
            await GenServer.stop(pid)


async def test_stop_with_a_timeout_gives_up_on_a_hanging_terminate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Terminator.start(otp.self(), True)
        start = trio.current_time()
        with pytest.raises(TimeoutError):
            await GenServer.stop(pid, "normal", 2.0)
        assert trio.current_time() - start == pytest.approx(2.0)
        assert await otp.receive() == ("terminate", "normal")


@pytest.mark.parametrize("how", ["cast", "info"])
async def test_a_bad_return_from_cast_or_info_exits_with_bad_return_value(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node():
        pid = await Terminator.start(otp.self())
        ref = otp.monitor(pid)
        if how == "cast":
            otp.cast(pid, "garbage")
            bad: Any = "garbage"
        else:
            otp.send(pid, "bad")
            bad = Reply("not allowed in handle_info", (otp.self(), False))
        assert await otp.receive(lambda m: m[0] == "terminate") == (
            "terminate",
            otp.BadReturnValue(bad),
        )
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.BadReturnValue(bad))


async def test_default_handle_info_ignores_unexpected_messages(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        otp.send(pid, ("unexpected", 1))
        assert await otp.call(pid, ("echo", 2)) == ("echo", 2)


async def test_cast_to_dead_names_and_unknown_nodes_is_silent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start(name="sleepy")
        await GenServer.stop("sleepy")
        otp.cast("sleepy", "x")
        otp.cast(pid, "x")
        otp.cast(("sleepy", "other@host"), "x")
        otp.cast(("sleepy", otp.current_node().name), "x")
        with pytest.raises(otp.CallError) as info:
            await otp.call(("sleepy", otp.current_node().name), "x")
        assert info.value.reason == otp.NOPROC


class _Plain(GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request == "hang":
            return NoReply(state)
        if request == "stop_normal":
            return Stop(otp.NORMAL, state)
        return otp.Reply(request, state)

    def handle_cast(self, request: Any, state: Any) -> Any:
        return Stop(request, state)


class _SlowInit(GenServer):
    async def init(self) -> Ok:
        await trio.sleep(10)
        return Ok(None)


class _ExitsInCallbacks(GenServer):
    """Ends itself with ``otp.exit_self`` (Erlang's ``exit/1``) from a callback."""

    def init(self, report_to: otp.Pid) -> Ok:
        return Ok(report_to)

    def handle_call(self, reason: Any, from_: otp.From, state: otp.Pid) -> Any:
        otp.exit_self(reason)

    def handle_cast(self, reason: Any, state: otp.Pid) -> Any:
        otp.exit_self(reason)

    def terminate(self, reason: Any, state: otp.Pid) -> None:
        otp.send(state, ("terminate", reason))


@pytest.mark.parametrize("trap", [False, True], ids=["not_trapping", "trapping"])
async def test_a_start_link_timeout_leaves_the_caller_alive_and_its_mailbox_clean(
    autojump_clock: trio.testing.MockClock, trap: bool
) -> None:
    async with otp.open_node():
        me = otp.self()

        async def caller() -> None:
            otp.process_flag(trap_exit=trap)
            try:
                await _SlowInit.start_link(timeout=1)
            except otp.StartError as exc:
                reason = exc.reason
            await trio.sleep(1)
            otp.send(me, (reason, await otp.receive(timeout=0, default="empty")))

        otp.spawn_monitor(caller)
        assert await otp.receive() == ("timeout", "empty")


async def test_exit_self_in_a_callback_runs_terminate_with_that_reason() -> None:
    async with otp.open_node():
        me = otp.self()
        pid = await _ExitsInCallbacks.start(me)
        ref = otp.monitor(pid)
        otp.cast(pid, "boom")
        assert await otp.receive() == ("terminate", "boom")
        assert await otp.receive() == otp.Down(ref, pid, "boom")

        pid = await _ExitsInCallbacks.start(me)
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, otp.NORMAL)
        assert info.value.reason == otp.NORMAL
        assert await otp.receive(timeout=0, default=None) == ("terminate", otp.NORMAL)


@pytest.mark.parametrize("name", ["", 5], ids=["empty", "int"])
async def test_starting_a_server_under_an_invalid_name_says_the_name_is_invalid(
    name: Any,
) -> None:
    async with otp.open_node():
        with pytest.raises((otp.BadArg, TypeError), match="name"):
            await _Plain.start(name=name)
        await trio.testing.wait_all_tasks_blocked()
        assert otp.processes() == [otp.self()]


class _ExitsInTerminate(GenServer):
    def init(self, report_to: otp.Pid) -> Ok:
        return Ok(report_to)

    def handle_cast(self, request: Any, state: otp.Pid) -> Any:
        return Stop(otp.NORMAL, state)

    def terminate(self, reason: Any, state: otp.Pid) -> None:
        otp.send(state, ("terminate", reason))
        otp.exit_self("from_terminate")


async def test_exit_self_in_terminate_ends_the_server_with_that_reason_after_one_terminate() -> (
    None
):
    async with otp.open_node():
        pid = await _ExitsInTerminate.start(otp.self())
        ref = otp.monitor(pid)
        otp.cast(pid, "stop")
        assert await otp.receive() == ("terminate", otp.NORMAL)
        assert await otp.receive() == otp.Down(ref, pid, "from_terminate")


async def test_an_invalid_server_name_or_pid_is_named_in_the_error() -> None:
    async with otp.open_node():
        with pytest.raises(
            otp.BadArg, match=r"_Plain\.start\(name=''\): a name is a non-empty str"
        ):
            await _Plain.start(name="")
        with pytest.raises(TypeError, match=r"link: pid must be a Pid \(got 'worker'\); for a"):
            otp.link("worker")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="a destination is a Pid"):
            otp.send_after(1, 5, "m")  # type: ignore[arg-type]


async def test_a_call_queued_behind_a_normal_stop_fails_with_normal_and_the_caller_lives() -> None:
    async with otp.open_node():
        pid = await _Plain.start()
        otp.cast(pid, otp.NORMAL)  # handle_cast stops with that reason before the call is read
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, "get")
        assert info.value.reason == otp.NORMAL
        assert not isinstance(info.value, otp.CallTimeout)
        pid = await _Plain.start()
        with pytest.raises(otp.CallError) as info:
            await otp.call(pid, "stop_normal")
        assert info.value.reason == otp.NORMAL
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_after_a_call_timeout_the_servers_death_leaves_no_down_and_no_monitor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await _Plain.start()
        with pytest.raises(otp.CallTimeout):
            await otp.call(pid, "hang", timeout=1)
        info = otp.process_info(pid)
        assert info is not None and info.monitored_by == ()
        mine = otp.process_info(otp.self())
        assert mine is not None and mine.monitors == ()
        watcher = otp.monitor(pid)
        otp.exit(pid, otp.KILL)
        assert await otp.receive() == otp.Down(watcher, pid, otp.KILLED)
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_a_process_blocked_in_a_call_is_waiting() -> None:
    async with otp.open_node():
        server = await _Plain.start()

        async def caller() -> None:
            await otp.call(server, "hang", timeout=None)

        pid = otp.spawn(caller)
        await trio.testing.wait_all_tasks_blocked()
        info = otp.process_info(pid)
        assert info is not None and info.status == "waiting"


def _monitors(pid: otp.Pid) -> tuple[Any, Any]:
    """(who monitors ``pid``, what ``pid`` monitors)."""
    info = otp.process_info(pid)
    assert info is not None
    return info.monitored_by, info.monitors


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


def test_a_reply_checks_its_timeout_and_is_a_frozen_attrs_value() -> None:
    with pytest.raises(TypeError, match=r"^Reply\.timeout .*\(got 'x'\)$"):
        Reply(1, None, timeout="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^Reply\.timeout .*NaN$"):
        Reply(1, None, math.nan)
    reply = Reply("v", "s")
    assert (reply.value, reply.state, reply.timeout, reply.continue_) == ("v", "s", None, UNSET)
    assert reply == Reply("v", "s") and hash(reply) == hash(Reply("v", "s"))
    assert attrs.evolve(reply, timeout=2) == Reply("v", "s", 2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        reply.value = "w"  # type: ignore[misc]


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
