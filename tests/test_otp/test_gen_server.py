"""OTP_SEMANTICS.md section 4: gen_server."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer, NoReply, Ok, Reply, Stop

from .helpers import Sleepy


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
