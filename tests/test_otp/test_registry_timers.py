"""The name registry, timers and introspection."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import otp
from otp import GenServer

from .helpers import Sleepy


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
