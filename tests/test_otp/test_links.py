"""OTP_SEMANTICS.md section 1: exit signals and links, one test per rule."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import otp


async def idle() -> None:
    await otp.receive(lambda m: m == "never")


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_exit_kill_is_untrappable_and_becomes_killed() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)

        async def trapper() -> None:
            otp.process_flag(trap_exit=True)
            await idle()

        pid, ref = otp.spawn_monitor(trapper)
        await settle()
        otp.exit(pid, otp.KILL)
        down = await otp.receive(otp.Down)
        assert down == otp.Down(ref, pid, otp.KILLED)


async def test_non_trapping_process_ignores_normal_exit_signal() -> None:
    async with otp.open_node():
        pid = otp.spawn(idle)
        await settle()
        otp.exit(pid, otp.NORMAL)
        await settle()
        assert otp.process_info(pid) is not None


async def test_exit_self_normal_terminates_the_caller() -> None:
    async with otp.open_node():

        async def quit_normally() -> None:
            otp.exit(otp.self(), otp.NORMAL)
            await idle()

        pid, ref = otp.spawn_monitor(quit_normally)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.NORMAL)


@pytest.mark.parametrize(
    ("trap", "reason", "seen"),
    [
        (True, otp.KILL, otp.KILLED),
        (False, otp.KILL, otp.KILLED),
        (False, otp.NORMAL, otp.NORMAL),
        (False, "boom", "boom"),
        (False, otp.Shutdown("bye"), otp.Shutdown("bye")),
    ],
)
async def test_exit_signal_that_kills_the_caller_ends_it_before_exit_returns(
    trap: bool, reason: object, seen: object
) -> None:
    # OTP 25: the expression after exit(self(), Reason) never runs when the signal kills the
    # caller, so the send below must not go out; links and monitors see OTP's reason.
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        main = otp.self()

        async def suicide() -> None:
            otp.process_flag(trap_exit=trap)
            try:
                otp.exit(otp.self(), reason)
            except Exception:
                otp.send(main, "caught")
            otp.send(main, "ran on")
            await idle()

        pid = otp.spawn_link(suicide)
        ref = otp.monitor(pid)
        assert await otp.receive(otp.Exit) == otp.Exit(pid, seen)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, seen)
        assert await otp.receive(timeout=0, default=None) is None


@pytest.mark.parametrize("reason", [otp.NORMAL, "boom", otp.SHUTDOWN])
async def test_trapping_caller_gets_its_own_exit_signal_as_a_message_and_runs_on(
    reason: object,
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        otp.exit(otp.self(), reason)
        assert await otp.receive(otp.Exit, timeout=0) == otp.Exit(otp.self(), reason)
        assert otp.process_info(otp.self()) is not None


async def test_exit_signal_to_self_from_a_task_of_the_process_ends_every_task() -> None:
    async with otp.open_node():
        main = otp.self()

        async def two_tasks() -> None:
            async def sibling() -> None:
                await trio.sleep_forever()

            async def killer() -> None:
                otp.exit(otp.self(), "boom")
                otp.send(main, "ran on")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sibling)
                nursery.start_soon(killer)
            otp.send(main, "nursery left")

        pid, ref = otp.spawn_monitor(two_tasks)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, "boom")
        assert await otp.receive(timeout=0, default=None) is None


@pytest.mark.parametrize(("reason", "seen"), [(otp.KILL, otp.KILLED), ("boom", "boom")])
async def test_open_node_raises_when_its_own_process_signals_itself_to_death(
    reason: object, seen: object
) -> None:
    ran_on = False
    with pytest.raises(otp.ProcessExited) as info:
        async with otp.open_node():
            otp.exit(otp.self(), reason)
            ran_on = True
    assert info.value.reason == seen
    assert not ran_on


async def test_non_trapping_process_dies_with_the_signals_reason() -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(idle)
        await settle()
        otp.exit(pid, "boom")
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, "boom")


async def test_kill_arriving_via_a_link_is_not_turned_into_killed() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        results: list[object] = []

        async def dies_with_kill() -> None:
            await otp.receive()
            otp.exit_self(otp.KILL)

        async def middle() -> None:
            # Not trapping: the neighbour's "kill" (via the link) kills it with reason "kill".
            victim = otp.spawn_link(dies_with_kill)
            results.append(victim)
            otp.send(victim, "go")
            await idle()

        mid, ref = otp.spawn_monitor(middle)
        down = await otp.receive(otp.Down)
        assert down == otp.Down(ref, mid, otp.KILL)


async def test_trapping_process_gets_exit_message_for_a_kill_via_link() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)

        async def dies_with_kill() -> None:
            otp.exit_self(otp.KILL)

        pid = otp.spawn_link(dies_with_kill)
        assert await otp.receive(otp.Exit) == otp.Exit(pid, otp.KILL)


async def test_trapping_process_gets_exit_message_even_for_normal() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)

        async def finish() -> None:
            return

        pid = otp.spawn_link(finish)
        assert await otp.receive(otp.Exit) == otp.Exit(pid, otp.NORMAL)
        other = otp.spawn(idle)
        await settle()
        otp.exit(otp.self(), otp.NORMAL)
        assert await otp.receive(otp.Exit) == otp.Exit(otp.self(), otp.NORMAL)
        otp.exit(other, otp.KILL)


async def test_normal_termination_is_ignored_by_non_trapping_links() -> None:
    async with otp.open_node():

        async def finish() -> None:
            return

        async def parent() -> None:
            otp.spawn_link(finish)
            await idle()

        pid = otp.spawn(parent)
        await settle()
        assert otp.process_info(pid) is not None


async def test_link_to_a_dead_process_raises_noproc_when_not_trapping() -> None:
    async with otp.open_node():

        async def finish() -> None:
            return

        pid, _ = otp.spawn_monitor(finish)
        await otp.receive(otp.Down)
        with pytest.raises(otp.NoProc, match="no such process"):
            otp.link(pid)


async def test_link_to_a_dead_process_sends_exit_noproc_when_trapping() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)

        async def finish() -> None:
            return

        pid, _ = otp.spawn_monitor(finish)
        await otp.receive(otp.Down)
        otp.link(pid)
        assert await otp.receive(otp.Exit, timeout=0) == otp.Exit(pid, otp.NOPROC)


async def test_link_is_bidirectional_idempotent_and_a_no_op_for_self() -> None:
    async with otp.open_node():
        me = otp.self()
        otp.link(me)
        pid = otp.spawn(idle)
        otp.link(pid)
        otp.link(pid)
        mine = otp.process_info(me)
        theirs = otp.process_info(pid)
        assert mine is not None and theirs is not None
        assert mine.links == (pid,)
        assert theirs.links == (me,)
        otp.unlink(pid)
        otp.exit(pid, otp.KILL)


async def test_spawn_link_is_atomic_so_an_instant_crash_reaches_the_parent() -> None:
    async with otp.open_node():

        async def crash_now() -> None:
            raise RuntimeError("instant")

        async def parent() -> None:
            otp.spawn_link(crash_now)
            await idle()

        pid, _ = otp.spawn_monitor(parent)
        down = await otp.receive(otp.Down)
        assert down.pid == pid
        assert isinstance(down.reason, otp.Crash)
        assert str(down.reason.exception) == "instant"


async def test_unlink_stops_signals_of_the_old_link() -> None:
    async with otp.open_node():

        async def crash_on_message() -> None:
            await otp.receive()
            raise RuntimeError("late crash")

        pid = otp.spawn_link(crash_on_message)
        otp.unlink(pid)
        ref = otp.monitor(pid)
        otp.send(pid, "go")
        down = await otp.receive(otp.Down)
        assert down.ref == ref
        # Still alive: the crash did not reach us through the removed link.
        assert otp.process_info(otp.self()) is not None


async def test_exit_message_queued_before_unlink_stays_in_the_mailbox() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)

        async def finish() -> None:
            return

        pid = otp.spawn_link(finish)
        await settle()
        otp.unlink(pid)
        assert await otp.receive(otp.Exit, timeout=0) == otp.Exit(pid, otp.NORMAL)


async def test_names_are_freed_before_links_and_monitors_fire() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        seen: list[object] = []

        async def named() -> None:
            otp.register("svc", otp.self())
            await otp.receive()

        pid = otp.spawn_link(named)
        ref = otp.monitor(pid)
        await settle()
        otp.send(pid, "stop")
        await otp.receive(otp.Exit)
        seen.append(otp.whereis("svc"))
        await otp.receive(otp.Down)
        assert seen == [None]
        assert ref is not None


async def test_exit_signal_to_an_exiting_process_does_not_change_its_reason() -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(idle)
        await settle()
        otp.exit(pid, "first")
        otp.exit(pid, "second")
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, "first")


async def test_open_node_raises_when_its_own_process_is_killed() -> None:
    with pytest.raises(otp.ProcessExited) as info:
        async with otp.open_node():

            async def crash() -> None:
                raise ValueError("linked crash")

            otp.spawn_link(crash)
            await trio.sleep_forever()
    assert isinstance(info.value.reason, otp.Crash)


async def _fails_while_unwinding() -> None:
    async def helper() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise ValueError("cleanup failed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(helper)
        await trio.sleep_forever()


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
