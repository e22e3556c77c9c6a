"""Audit of the local core runtime (otp/) against OTP_SEMANTICS.md sections 1-4 and OTP 25.

The first section holds the bugs the audit proved, now fixed (each test names the behaviour it
guards), with tests for the edges those fixes touched; the second guards tricky edges that were
checked and found right.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer, NoReply, Ok, Stop


async def idle() -> None:
    await otp.receive(lambda m: m == "never")


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


async def _fails_while_unwinding() -> None:
    async def helper() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise ValueError("cleanup failed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(helper)
        await trio.sleep_forever()


# -- bugs found by the audit, now fixed -----------------------------------------------------------


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


async def test_a_nan_receive_timeout_is_refused_and_leaves_the_mailbox_usable() -> None:
    async with otp.open_node():
        me = otp.self()

        async def child() -> None:
            with pytest.raises(ValueError):
                await otp.receive(timeout=math.nan)
            otp.send(me, "ready")
            otp.send(me, ("got", await otp.receive()))

        pid, _ref = otp.spawn_monitor(child)
        assert await otp.receive() == "ready"
        otp.send(pid, "hello")
        assert await otp.receive() == ("got", "hello")


async def test_send_to_an_unregistered_name_at_this_node_is_dropped() -> None:
    async with otp.open_node() as node:
        otp.send(("nobody", node.name), "lost")
        otp.send(otp.self(), "after")
        assert await otp.receive(timeout=0) == "after"


@pytest.mark.parametrize(
    "arm",
    [lambda: otp.send_after(1, 5, "m"), lambda: otp.exit_after(1, 5, "boom")],  # type: ignore[arg-type]
    ids=["send_after", "exit_after"],
)
async def test_a_timer_with_a_bad_destination_never_takes_the_node_down(
    autojump_clock: trio.testing.MockClock, arm: Callable[[], object]
) -> None:
    async with otp.open_node():
        with contextlib.suppress(TypeError):  # refusing it at the call is the better fix
            arm()
        await trio.sleep(2)
        otp.send_after(1, otp.self(), "still ticking")
        assert await otp.receive(timeout=5) == "still ticking"


async def test_a_killed_process_whose_task_fails_while_unwinding_does_not_crash_the_node() -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(_fails_while_unwinding)
        await trio.testing.wait_all_tasks_blocked()
        otp.exit(pid, otp.SHUTDOWN)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.SHUTDOWN)
        survivor, survivor_ref = otp.spawn_monitor(idle)
        await trio.testing.wait_all_tasks_blocked()
        assert otp.process_info(survivor) is not None
        otp.exit(survivor, otp.KILL)
        assert await otp.receive(otp.Down) == otp.Down(survivor_ref, survivor, otp.KILLED)


async def test_a_second_reader_never_makes_the_woken_reader_crash() -> None:
    async with otp.open_node():
        got: list[Any] = []

        async def first_reader() -> None:
            got.append(await otp.receive())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_reader)
            await trio.testing.wait_all_tasks_blocked()
            otp.send(otp.self(), "m")
            try:
                stolen = await otp.receive(timeout=0)
            except otp.OtpError:
                stolen = None
            await trio.testing.wait_all_tasks_blocked()  # the woken reader runs now
            otp.send(otp.self(), "n")
        assert got == (["m"] if stolen is None else ["n"])


@pytest.mark.parametrize(
    "use",
    [
        lambda: otp.exit("worker", "boom"),  # type: ignore[arg-type]
        lambda: otp.link("worker"),  # type: ignore[arg-type]
        lambda: otp.unlink("worker"),  # type: ignore[arg-type]
        lambda: otp.register("alias", "worker"),  # type: ignore[arg-type]
    ],
    ids=["exit", "link", "unlink", "register"],
)
async def test_a_name_where_a_pid_is_needed_is_a_typed_error(use: Callable[[], object]) -> None:
    async with otp.open_node():
        otp.register("worker", otp.spawn(idle))
        with pytest.raises((TypeError, otp.BadArg)):
            use()


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


async def test_a_timer_action_that_fails_when_it_fires_is_logged_and_the_others_still_fire(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Unhashable(str):
        __hash__ = None  # type: ignore[assignment]

    async with otp.open_node() as node:
        # A name that passes every check when armed, and fails only when looked up.
        otp.send_after(1, (Unhashable("worker"), node.name), "m")
        otp.send_after(1, otp.self(), "same deadline")
        assert await otp.receive(timeout=5) == "same deadline"
        otp.send_after(1, otp.self(), "later")
        assert await otp.receive(timeout=5) == "later"
    assert any("failed when it fired" in r.getMessage() for r in caplog.records)


async def test_a_take_by_another_task_never_hides_a_message_from_a_parked_selective_receive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        otp.send(otp.self(), "older")
        got: list[Any] = []

        async def selective_reader() -> None:
            got.append(await otp.receive(lambda m: m == "wanted"))

        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(selective_reader)
                await trio.testing.wait_all_tasks_blocked()
                assert await otp.receive(timeout=0) == "older"
                otp.send(otp.self(), "wanted")
        assert got == ["wanted"]


async def test_a_receive_woken_for_a_message_another_task_took_keeps_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        ended: list[float] = []

        async def reader() -> None:
            await otp.receive(timeout=5, default=None)
            ended.append(trio.current_time())

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.sleep(3)
            otp.send(otp.self(), "m")
            assert await otp.receive(timeout=0) == "m"
        assert ended == [pytest.approx(start + 5)]


# -- edges checked and found right ----------------------------------------------------------------


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


async def test_a_timer_to_a_pid_dies_with_it_but_a_timer_to_a_name_outlives_the_holder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        me = otp.self()
        first = otp.spawn(idle)
        otp.register("slot", first)
        by_pid = otp.send_after(5, first, "to pid")
        by_name = otp.send_after(5, "slot", "to name")
        otp.monitor(first)
        otp.exit(first, otp.KILL)
        await otp.receive(otp.Down)
        assert otp.cancel_timer(by_pid) is None
        assert otp.read_timer(by_name) == pytest.approx(5)

        async def holder() -> None:
            otp.send(me, await otp.receive())

        otp.register("slot", otp.spawn(holder))
        assert await otp.receive() == "to name"
        assert otp.cancel_timer(by_name) is None


async def test_a_flush_by_another_task_never_hides_a_message_from_a_parked_selective_receive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(idle)
        otp.exit(pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()  # the Down is queued, unmatched below
        got: list[Any] = []

        async def selective_reader() -> None:
            got.append(await otp.receive(lambda m: m == "wanted"))

        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(selective_reader)
                await trio.testing.wait_all_tasks_blocked()
                assert otp.demonitor(ref, flush=True) is False
                otp.send(otp.self(), "wanted")
        assert got == ["wanted"]


def _not_async(log: list[str]) -> None:
    log.append("ran")


async def test_spawning_a_plain_function_is_a_clear_error_naming_it() -> None:
    async with otp.open_node():
        log: list[str] = []
        try:
            otp.spawn_monitor(_not_async, log)  # type: ignore[arg-type]
        except TypeError as exc:
            message = str(exc)
        else:
            down = await otp.receive(otp.Down)
            assert isinstance(down.reason, otp.Crash)
            message = str(down.reason.exception)
        assert "_not_async" in message


async def test_a_process_blocked_in_a_call_is_waiting() -> None:
    async with otp.open_node():
        server = await _Plain.start()

        async def caller() -> None:
            await otp.call(server, "hang", timeout=None)

        pid = otp.spawn(caller)
        await trio.testing.wait_all_tasks_blocked()
        info = otp.process_info(pid)
        assert info is not None and info.status == "waiting"


async def test_a_name_whose_init_refused_is_free_when_the_start_returns() -> None:
    # OTP's init_it unregisters the name before init_ack: an immediate retry must not see it.
    attempts: list[str] = []

    class RefusesOnce(GenServer):
        def init(self) -> Any:
            attempts.append("init")
            return Stop("not_yet") if len(attempts) == 1 else Ok(None)

    async with otp.open_node():
        with pytest.raises(otp.StartError) as info:
            await RefusesOnce.start(name="svc")
        assert info.value.reason == "not_yet"
        assert otp.whereis("svc") is None
        pid = await RefusesOnce.start(name="svc")
        assert otp.whereis("svc") == pid


@pytest.mark.parametrize("how", ["send", "monitor", "send_after"])
async def test_a_name_that_is_not_a_str_is_refused_at_once(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    async with otp.open_node():
        for node in (otp.current_node().name, "other@host"):
            dest = (["worker"], node)
            with pytest.raises(TypeError, match=r"\(name: str, node\)"):
                if how == "send":
                    otp.send(dest, "hi")
                elif how == "monitor":
                    otp.monitor(dest)
                else:
                    otp.send_after(1.0, dest, "hi")
