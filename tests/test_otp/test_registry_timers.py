"""The name registry, timers and introspection."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer, Ok, Stop

from .helpers import Sleepy, _Recorder


async def idle() -> None:
    await otp.receive(lambda m: m == "never")


async def test_register_whereis_registered_and_send_by_name() -> None:
    async with otp.open_node():
        otp.register("me", otp.self())
        assert otp.whereis("me") == otp.self()
        assert otp.registered() == ["me"]
        otp.send("me", "by name")
        otp.send(("me", otp.current_node().name), "by name and node")
        assert await otp.receive() == "by name"
        assert await otp.receive() == "by name and node"
        otp.unregister("me")
        assert otp.whereis("me") is None


async def test_a_name_is_unique_per_node() -> None:
    async with otp.open_node():
        otp.register("svc", otp.self())
        other = otp.spawn(idle)
        with pytest.raises(otp.BadArg, match="the name is taken"):
            otp.register("svc", other)
        with pytest.raises(otp.BadArg, match="already registered as 'svc'"):
            otp.register("second", otp.self())
        otp.exit(other, otp.KILL)


async def test_a_dead_process_loses_its_name() -> None:
    async with otp.open_node():
        pid, _ = otp.spawn_monitor(idle)
        otp.register("temp", pid)
        otp.exit(pid, otp.KILL)
        await otp.receive(otp.Down)
        assert otp.whereis("temp") is None
        with pytest.raises(otp.BadArg, match="not alive"):
            otp.register("temp", pid)


async def test_unregister_of_an_unknown_name_is_badarg() -> None:
    async with otp.open_node():
        with pytest.raises(otp.BadArg, match="no process is registered"):
            otp.unregister("ghost")


async def test_send_after_delivers_on_trios_clock(autojump_clock: trio.testing.MockClock) -> None:
    async with otp.open_node():
        start = trio.current_time()
        otp.send_after(2.0, otp.self(), "late")
        otp.send_after(1.0, otp.self(), "early")
        assert await otp.receive() == "early"
        assert trio.current_time() - start == pytest.approx(1.0)
        assert await otp.receive() == "late"
        assert trio.current_time() - start == pytest.approx(2.0)


async def test_cancel_timer_returns_the_time_left_or_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        ref = otp.send_after(5.0, otp.self(), "never")
        await trio.sleep(2.0)
        assert otp.read_timer(ref) == pytest.approx(3.0)
        assert otp.cancel_timer(ref) == pytest.approx(3.0)
        assert otp.cancel_timer(ref) is None
        fired = otp.send_after(1.0, otp.self(), "fired")
        assert await otp.receive() == "fired"
        assert otp.cancel_timer(fired) is None
        await trio.sleep(10)
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_exit_after_sends_an_exit_signal(autojump_clock: trio.testing.MockClock) -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(idle)
        otp.exit_after(3.0, pid, "timeout_exit")
        start = trio.current_time()
        assert await otp.receive() == otp.Down(ref, pid, "timeout_exit")
        assert trio.current_time() - start == pytest.approx(3.0)


async def test_many_cancelled_timers_do_not_pile_up(autojump_clock: trio.testing.MockClock) -> None:
    async with otp.open_node():
        node = otp.current_node()
        for _ in range(5000):
            otp.cancel_timer(otp.send_after(60, otp.self(), "x"))
        assert len(node.timers) == 0
        assert len(node.timers._heap) <= 2048


async def test_message_queue_len_counts_what_waits_in_the_callers_mailbox() -> None:
    async with otp.open_node():
        assert otp.message_queue_len() == 0
        otp.send(otp.self(), "one")
        otp.send(otp.self(), "two")
        assert otp.message_queue_len() == 2
        assert await otp.receive() == "one"
        assert otp.message_queue_len() == 1
    with pytest.raises(otp.NotAProcess):
        otp.message_queue_len()


async def test_message_queue_len_of_another_process_counts_its_mailbox() -> None:
    async with otp.open_node():
        pid = otp.spawn(idle)
        assert otp.message_queue_len(pid) == 0
        otp.send(pid, "one")
        otp.send(pid, "two")
        assert otp.message_queue_len(pid) == 2
        assert otp.message_queue_len(otp.self()) == 0
        otp.exit(pid, "kill")
        await trio.testing.wait_all_tasks_blocked()
        assert otp.message_queue_len(pid) == 0  # (not alive: nothing waits for it)
        with pytest.raises(otp.BadArg):
            otp.message_queue_len("not a pid")  # type: ignore[arg-type]


async def test_processes_and_process_info() -> None:
    async with otp.open_node():
        me = otp.self()
        pid = otp.spawn_link(idle)
        ref = otp.monitor(pid)
        otp.register("worker", pid)
        otp.send(pid, "queued")
        await trio.testing.wait_all_tasks_blocked()
        assert otp.processes() == [me, pid]
        info = otp.process_info(pid)
        assert info is not None
        assert info.status == "waiting"
        assert info.message_queue_len == 1
        assert info.links == (me,)
        assert info.monitored_by == (me,)
        assert info.registered_name == "worker"
        assert info.trap_exit is False
        assert info.parent == me
        mine = otp.process_info(me)
        assert mine is not None
        assert mine.status == "running"
        assert mine.monitors == ((ref, pid),)
        otp.unlink(pid)
        otp.exit(pid, otp.KILL)
        await otp.receive(otp.Down)
        assert otp.process_info(pid) is None


async def test_is_process_alive_is_false_once_an_exit_signal_dooms_the_process() -> None:
    async with otp.open_node():
        pid = otp.spawn(idle)
        assert otp.is_process_alive(pid) and otp.is_process_alive(otp.self())
        otp.exit(pid, otp.KILL)
        assert not otp.is_process_alive(pid)  # (doomed: not unwound yet)
        await trio.testing.wait_all_tasks_blocked()
        assert not otp.is_process_alive(pid)
        with pytest.raises(otp.BadArg, match="not a Pid"):
            otp.is_process_alive("worker")  # type: ignore[arg-type]


async def test_gen_server_info_names_its_behaviour_and_counts_messages() -> None:
    async with otp.open_node():

        class Echo(otp.GenServer):
            def handle_call(self, request: object, from_: otp.From, state: object) -> otp.Reply:
                return otp.Reply(request, state)

        pid = await Echo.start()
        for i in range(3):
            assert await otp.call(pid, i) == i
        info = otp.process_info(pid)
        assert info is not None
        assert info.behaviour is not None and "Echo" in info.behaviour
        assert info.messages_handled == 3


async def test_pid_and_ref_have_no_public_constructor_and_never_pickle() -> None:
    import pickle

    async with otp.open_node():
        with pytest.raises(TypeError, match="no public constructor"):
            otp.Pid()
        with pytest.raises(TypeError, match="no public constructor"):
            otp.Ref()
        with pytest.raises(TypeError, match="never pickled"):
            pickle.dumps(otp.self())
        with pytest.raises(TypeError, match="never pickled"):
            pickle.dumps(otp.make_ref())
        assert otp.make_ref() != otp.make_ref()


async def test_run_returns_the_main_functions_result() -> None:
    async def main(x: int) -> int:
        pid = otp.spawn(idle)
        assert otp.process_info(pid) is not None
        return x * 2

    assert await trio.to_thread.run_sync(otp.run, main, 21) == 42


async def test_a_node_leaves_no_process_behind() -> None:
    async with otp.open_node() as node:
        for _ in range(10):
            otp.spawn(idle)
        otp.process_flag(trap_exit=True)

        async def trapping() -> None:
            otp.process_flag(trap_exit=True)
            await idle()

        otp.spawn(trapping)
    assert node.processes == {}


async def test_exit_hooks_run_after_the_name_is_freed_and_before_links_fire() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        seen: list[object] = []

        async def owner() -> None:
            otp.register("owner", otp.self())
            otp.add_exit_hook(
                lambda pid, reason: seen.append(("hook", reason, otp.whereis("owner")))
            )
            await otp.receive()
            otp.exit_self("done")

        pid = otp.spawn_link(owner)
        await trio.testing.wait_all_tasks_blocked()
        otp.send(pid, "go")
        exit_message = await otp.receive(otp.Exit)
        seen.append(("exit", exit_message.reason))
        assert seen == [("hook", "done", None), ("exit", "done")]


async def test_a_failing_exit_hook_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with otp.open_node():
        ran: list[str] = []

        def broken(pid: otp.Pid, reason: object) -> None:
            raise RuntimeError("hook bug")

        async def owner() -> None:
            otp.add_exit_hook(broken)
            otp.add_exit_hook(lambda pid, reason: ran.append("second"))

        _, ref = otp.spawn_monitor(owner)
        await otp.receive(otp.Down)
        assert ran == ["second"]
        assert any("exit hook" in r.getMessage() for r in caplog.records)
        assert ref is not None


async def test_a_timer_to_a_process_is_cancelled_when_the_process_exits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        ref = otp.send_after(10.0, pid, "later")
        assert otp.read_timer(ref) == pytest.approx(10.0)
        await GenServer.stop(pid)
        assert otp.read_timer(ref) is None
        assert otp.cancel_timer(ref) is None


async def test_a_timer_to_a_dead_pid_is_cancelled_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        pid = await Sleepy.start()
        await GenServer.stop(pid)
        ref = otp.send_after(10.0, pid, "never")
        assert otp.read_timer(ref) is None


async def test_a_timer_to_a_name_is_resolved_when_it_fires(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        me = otp.self()

        async def relay() -> None:
            otp.send(me, ("relayed", await otp.receive()))

        ref = otp.send_after(2.0, "relay", "hello")
        await trio.sleep(1.0)
        otp.register("relay", otp.spawn(relay))
        assert otp.read_timer(ref) == pytest.approx(1.0)
        assert await otp.receive() == ("relayed", "hello")
        assert otp.cancel_timer(ref) is None


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


@pytest.mark.parametrize("use", [otp.cancel_timer, otp.read_timer], ids=["cancel", "read"])
async def test_a_timer_function_given_something_other_than_a_ref_is_a_typed_error(
    use: Callable[[Any], object],
) -> None:
    async with otp.open_node():
        with pytest.raises(TypeError, match="Ref"):
            use(otp.self())


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
