"""OTP_SEMANTICS.md section 2: monitors."""

from __future__ import annotations

import trio.testing

import otp


async def idle() -> None:
    await otp.receive(lambda m: m == "never")


async def test_monitor_delivers_down_with_the_exit_reason() -> None:
    async with otp.open_node():

        async def stop() -> None:
            otp.exit_self(otp.Shutdown("bye"))

        pid, ref = otp.spawn_monitor(stop)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.Shutdown("bye"))


async def test_monitoring_a_dead_process_gives_an_immediate_noproc_down() -> None:
    async with otp.open_node():

        async def finish() -> None:
            return

        pid, _ = otp.spawn_monitor(finish)
        await otp.receive(otp.Down)
        ref = otp.monitor(pid)
        assert await otp.receive(otp.Down, timeout=0) == otp.Down(ref, pid, otp.NOPROC)


async def test_monitoring_an_unregistered_name_gives_noproc_with_the_name() -> None:
    async with otp.open_node():
        ref = otp.monitor("nobody")
        assert await otp.receive(timeout=0) == otp.Down(ref, "nobody", otp.NOPROC)


async def test_monitor_by_name_reports_the_name() -> None:
    async with otp.open_node():
        pid = otp.spawn(idle)
        otp.register("named", pid)
        ref = otp.monitor("named")
        otp.exit(pid, "gone")
        assert await otp.receive(otp.Down) == otp.Down(ref, "named", "gone")


async def test_monitors_stack_one_down_each() -> None:
    async with otp.open_node():
        pid = otp.spawn(idle)
        refs = [otp.monitor(pid) for _ in range(3)]
        otp.exit(pid, otp.KILL)
        downs = [await otp.receive(otp.Down) for _ in refs]
        assert [d.ref for d in downs] == refs
        assert all(d.reason == otp.KILLED for d in downs)


async def test_monitored_process_is_unaffected_by_the_watchers_death() -> None:
    async with otp.open_node():
        target = otp.spawn(idle)

        async def watcher() -> None:
            otp.monitor(target)
            raise RuntimeError("watcher dies")

        otp.spawn(watcher)
        await trio.testing.wait_all_tasks_blocked()
        info = otp.process_info(target)
        assert info is not None
        assert info.monitored_by == ()


async def test_demonitor_keeps_a_queued_down_unless_flushed() -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(idle)
        otp.exit(pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        assert otp.demonitor(ref) is False
        assert await otp.receive(otp.Down, timeout=0) == otp.Down(ref, pid, otp.KILLED)
        pid2, ref2 = otp.spawn_monitor(idle)
        otp.exit(pid2, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        assert otp.demonitor(ref2, flush=True) is False
        assert await otp.receive(timeout=0, default="empty") == "empty"


async def test_demonitor_of_a_live_monitor_returns_true_and_no_down_follows() -> None:
    async with otp.open_node():
        pid, ref = otp.spawn_monitor(idle)
        assert otp.demonitor(ref) is True
        otp.exit(pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default="empty") == "empty"
