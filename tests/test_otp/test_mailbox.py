"""OTP_SEMANTICS.md section 3 and the mailbox: ordering, selective receive, timeouts."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import trio
import trio.testing

import otp

from .helpers import Sleepy, idle


async def test_message_sent_before_death_arrives_before_the_down() -> None:
    async with otp.open_node():
        me = otp.self()

        async def say_and_die() -> None:
            otp.send(me, "last words")
            raise RuntimeError("dead")

        _, ref = otp.spawn_monitor(say_and_die)
        assert await otp.receive() == "last words"
        assert (await otp.receive()).ref == ref


async def test_message_sent_before_death_arrives_before_the_exit() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        me = otp.self()

        async def say_and_die() -> None:
            otp.send(me, "last words")
            otp.exit_self("bye")

        pid = otp.spawn_link(say_and_die)
        assert await otp.receive() == "last words"
        assert await otp.receive() == otp.Exit(pid, "bye")


async def test_messages_from_one_sender_arrive_in_order() -> None:
    async with otp.open_node():
        me = otp.self()

        async def burst() -> None:
            for i in range(500):
                otp.send(me, i)

        otp.spawn(burst)
        assert [await otp.receive() for _ in range(500)] == list(range(500))


async def test_selective_receive_keeps_unmatched_messages_in_order() -> None:
    async with otp.open_node():
        me = otp.self()
        for item in ["a", 1, "b", 2, "c"]:
            otp.send(me, item)
        assert await otp.receive(int) == 1
        assert await otp.receive(lambda m: m == "c") == "c"
        assert [await otp.receive() for _ in range(3)] == ["a", "b", 2]


async def test_selective_receive_waits_only_for_a_matching_message() -> None:
    async with otp.open_node():
        me = otp.self()

        async def sender() -> None:
            otp.send(me, "noise")
            await trio.sleep(0)
            otp.send(me, ("reply", 42))

        otp.spawn(sender)
        assert await otp.receive(tuple) == ("reply", 42)
        assert await otp.receive(timeout=0) == "noise"


async def test_receive_timeout_raises_or_returns_the_default(autojump_clock: object) -> None:
    async with otp.open_node():
        start = trio.current_time()
        with pytest.raises(otp.ReceiveTimeout, match=r"no matching message within 2\.5 s"):
            await otp.receive(timeout=2.5)
        assert trio.current_time() - start == pytest.approx(2.5)
        assert await otp.receive(timeout=1, default=None) is None


async def test_receive_with_timeout_zero_only_polls() -> None:
    async with otp.open_node():
        assert await otp.receive(timeout=0, default="empty") == "empty"
        otp.send(otp.self(), "x")
        assert await otp.receive(timeout=0) == "x"


async def test_send_to_a_dead_pid_does_nothing() -> None:
    async with otp.open_node():

        async def finish() -> None:
            return

        pid, _ = otp.spawn_monitor(finish)
        await otp.receive(otp.Down)
        otp.send(pid, "into the void")


async def test_send_to_an_unregistered_name_raises_badarg() -> None:
    async with otp.open_node():
        with pytest.raises(otp.BadArg, match="no process is registered under that name"):
            otp.send("nobody", "hello")


async def test_receive_is_cancellable_and_leaves_the_mailbox_intact() -> None:
    async with otp.open_node():
        with trio.move_on_after(0.01):
            await otp.receive(int)
        otp.send(otp.self(), 7)
        assert await otp.receive(int) == 7


async def test_a_plain_receive_is_cancellable_and_leaves_the_mailbox_intact() -> None:
    async with otp.open_node():
        with trio.move_on_after(0.01):
            await otp.receive()
        otp.send(otp.self(), 7)
        assert await otp.receive() == 7


async def test_a_parked_process_killed_while_waiting_dies_killed_and_its_mailbox_goes() -> None:
    async with otp.open_node():

        async def waiter() -> None:
            await otp.receive()

        pid, ref = otp.spawn_monitor(waiter)
        await trio.testing.wait_all_tasks_blocked()
        otp.exit(pid, otp.KILL)
        otp.send(pid, "too late")
        assert await otp.receive() == otp.Down(ref, pid, otp.KILLED)


async def test_a_receive_made_before_a_message_arrives_and_awaited_after_returns_it() -> None:
    async with otp.open_node():
        pending = otp.receive()
        otp.send(otp.self(), "early")
        assert await pending == "early"


async def test_a_receive_closed_unawaited_leaves_the_parked_reader_waiting() -> None:
    async with otp.open_node():
        got: list[Any] = []

        async def reader() -> None:
            got.append(await otp.receive())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            otp.receive().close()
            otp.send(otp.self(), "kept")
        assert got == ["kept"]


async def test_a_plain_receive_works_without_trios_private_wait_trap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # receive falls back to trio's public wait_task_rescheduled if a trio release moves the trap
    import otp._process

    monkeypatch.setattr(otp._process, "_WAIT_TRAP", None)
    async with otp.open_node():

        async def echo(to: otp.Pid) -> None:
            otp.send(to, ("echo", await otp.receive()))

        pid = otp.spawn(echo, otp.self())
        await trio.testing.wait_all_tasks_blocked()
        otp.send(pid, "hi")
        pending = otp.receive()
        assert inspect.iscoroutine(pending)  # the public wait, not the object with the trap
        assert await pending == ("echo", "hi")
        server = await Sleepy.start()  # a GenServer's loop waits the same way
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.call(server, ("ping",)) == ("ping",)


async def test_a_busy_receiver_still_lets_other_tasks_run() -> None:
    async with otp.open_node():
        me = otp.self()
        for i in range(1000):
            otp.send(me, i)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            for _ in range(1000):
                await otp.receive()
            nursery.cancel_scope.cancel()
        assert ticks > 10


async def test_two_tasks_receiving_on_one_mailbox_is_a_clear_error() -> None:
    async with otp.open_node():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(otp.receive)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(otp.OtpError, match="two tasks of process"):
                await otp.receive()
            nursery.cancel_scope.cancel()


async def test_receive_outside_a_process_is_a_clear_error() -> None:
    with pytest.raises(otp.NotAProcess, match="needs a current process"):
        await otp.receive()


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
