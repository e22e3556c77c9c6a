"""Supervisor behaviour on the real runtime: order, restarts, give-up, escalation, API, reports."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

import otp
from supervisors import (
    ChildSpec,
    ChildSpecError,
    Supervisor,
    SupFlags,
    check_childspecs,
    count_children,
    delete_child,
    get_childspec,
    restart_child,
    start_child,
    terminate_child,
    which_children,
)

from .helpers import Failing, Worker, alive, pid_of, settle, worker


def specs(log: list[Any], *names: str, **kwargs: Any) -> list[ChildSpec]:
    return [ChildSpec(n, (Worker.start_link, n, log), **kwargs) for n in names]


async def test_children_start_in_order_and_stop_in_reverse(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(SupFlags(), specs(log, "a", "b", "c"))
        assert [row[0] for row in await which_children(sup)] == ["c", "b", "a"]
        otp.exit(sup, otp.SHUTDOWN)
        assert await otp.receive(otp.Exit) == otp.Exit(sup, otp.SHUTDOWN)
        assert log == [
            ("start", "a"),
            ("start", "b"),
            ("start", "c"),
            ("terminate", "c", "shutdown"),
            ("terminate", "b", "shutdown"),
            ("terminate", "a", "shutdown"),
        ]
        assert otp.processes() == [otp.self()]


async def test_one_for_one_restarts_only_the_crashed_child(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        sup = await Supervisor.start_link(SupFlags(), specs(log, "a", "b"))
        before = await which_children(sup)
        otp.cast(pid_of(before, "b"), ("stop", "boom"))
        await settle()
        after = await which_children(sup)
        assert pid_of(after, "a") == pid_of(before, "a")
        assert pid_of(after, "b") != pid_of(before, "b")
        assert await otp.call(pid_of(after, "b"), "ping") == "pong"


async def test_supervisor_gives_up_past_intensity_and_escalates(autojump_clock: Any) -> None:
    log: list[Any] = []

    class Sub(Supervisor):
        def init(self) -> Any:
            return SupFlags(intensity=0), specs(log, "w1", "w2")

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        root = await Supervisor.start_link(
            SupFlags(intensity=0), [ChildSpec("sub", Sub), *specs(log, "other")]
        )
        sub = pid_of(await which_children(root), "sub")
        w1 = pid_of(await which_children(sub), "w1")
        otp.cast(w1, ("stop", "boom"))
        assert await otp.receive(otp.Exit) == otp.Exit(root, otp.SHUTDOWN)
        assert log[-3:] == [
            ("terminate", "w1", "boom"),
            ("terminate", "w2", "shutdown"),
            ("terminate", "other", "shutdown"),
        ]
        assert otp.processes() == [otp.self()]


async def test_failed_child_at_init_fails_the_start(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        children = [
            *specs(log, "a"),
            ChildSpec("b", (Failing.start_link, "nope")),
            *specs(log, "c"),
        ]
        with pytest.raises(otp.StartError) as info:
            await Supervisor.start_link(SupFlags(), children)
        assert info.value.reason == otp.Shutdown(("failed_to_start_child", "b", "nope"))
        assert log == [("start", "a"), ("terminate", "a", "shutdown")]
        await settle()
        assert otp.processes() == [otp.self()]


@pytest.mark.parametrize(
    ("flags", "children", "reason"),
    [
        (
            SupFlags(),
            [ChildSpec("a", Worker), ChildSpec("a", Worker)],
            ("start_spec", ("duplicate_child_name", "a")),
        ),
        ({"strategy": "bad"}, [], ("supervisor_data", ("invalid_strategy", "bad"))),
        ("nonsense", [], ("supervisor_data", ("invalid_type", "nonsense"))),
        (
            SupFlags(),
            [ChildSpec("s", Worker, restart="transient", significant=True)],
            (
                "start_spec",
                ("bad_combination", [("auto_shutdown", "never"), ("significant", True)]),
            ),
        ),
        (SupFlags(strategy="simple_one_for_one"), [], ("bad_start_spec", [])),
    ],
)
async def test_invalid_configuration_fails_the_start(
    flags: Any, children: Any, reason: Any, autojump_clock: Any
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        with pytest.raises(otp.StartError) as info:
            await Supervisor.start_link(flags, children)
        assert info.value.reason == reason


async def test_init_returning_ignore_ignores_the_start(autojump_clock: Any) -> None:
    class Nope(Supervisor):
        def init(self) -> Any:
            return otp.Ignore()

    async with otp.open_node():
        with pytest.raises(otp.StartIgnored):
            await Nope.start_link()


async def test_failed_restart_is_retried_through_the_mailbox(autojump_clock: Any) -> None:
    attempts: list[int] = []

    async def flaky_start() -> otp.Pid:
        attempts.append(len(attempts))
        if len(attempts) in (2, 3):
            raise otp.StartError("not_yet")
        return await Worker.start_link("f")

    async with otp.open_node():
        sup = await Supervisor.start_link(SupFlags(intensity=3), [ChildSpec("f", flaky_start)])
        otp.cast(pid_of(await which_children(sup), "f"), ("stop", "boom"))
        await settle()
        assert len(attempts) == 4
        assert await count_children(sup) == {
            "specs": 1,
            "active": 1,
            "supervisors": 0,
            "workers": 1,
        }


async def test_start_function_exception_is_a_start_error(autojump_clock: Any) -> None:
    async def broken() -> otp.Pid:
        raise RuntimeError("bad config")

    async with otp.open_node():
        sup = await Supervisor.start_link(SupFlags(), [])
        result = await start_child(sup, ChildSpec("x", broken))
        assert result[0] == "error"
        reason, spec = result[1]
        assert isinstance(reason, otp.Crash) and str(reason.exception) == "bad config"
        assert spec.id == "x"


async def test_child_api_return_values(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        sup = await Supervisor.start_link(SupFlags(), specs(log, "a"))
        started = await start_child(sup, ChildSpec("b", (Worker.start_link, "b", log)))
        assert started[0] == "ok" and isinstance(started[1], otp.Pid)
        assert await start_child(sup, {"id": "b", "start": Worker}) == (
            "error",
            ("already_started", started[1]),
        )
        assert await restart_child(sup, "b") == ("error", "running")
        assert await delete_child(sup, "b") == ("error", "running")
        assert await terminate_child(sup, started[1]) == "ok"
        assert await start_child(sup, {"id": "b", "start": Worker}) == ("error", "already_present")
        ok, spec = await get_childspec(sup, "b")
        assert ok == "ok" and spec.id == "b"
        assert await delete_child(sup, "b") == "ok"
        assert await get_childspec(sup, "b") == ("error", "not_found")
        assert await terminate_child(sup, "b") == ("error", "not_found")
        assert await start_child(sup, ChildSpec("i", (Failing.start_link, None))) == ("ok", None)
        assert next(row[:2] for row in await which_children(sup)) == ("i", None)


async def test_simple_one_for_one_appends_extra_args(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags(strategy="simple_one_for_one"), [ChildSpec("t", (Worker.start_link,))]
        )
        _, one = await start_child(sup, ["one", log])
        _ok, _two = await start_child(sup, ["two", log])
        assert await otp.call(one, "name") == "one"
        assert [row[0] for row in await which_children(sup)] == [None, None]
        assert await terminate_child(sup, "t") == ("error", "simple_one_for_one")
        assert await terminate_child(sup, one) == "ok"
        assert await count_children(sup) == {
            "specs": 1,
            "active": 1,
            "supervisors": 0,
            "workers": 1,
        }
        otp.exit(sup, otp.SHUTDOWN)
        await otp.receive(otp.Exit)
        assert ("terminate", "two", "shutdown") in log


async def test_slow_child_is_killed_after_its_shutdown_time(autojump_clock: Any) -> None:
    class Slow(Worker):
        async def terminate(self, reason: Any, state: Any) -> None:
            await trio.sleep(10)

    async with otp.open_node():
        sup = await Supervisor.start_link(
            SupFlags(), [ChildSpec("s", (Slow.start_link, "s"), shutdown=1)]
        )
        child = pid_of(await which_children(sup), "s")
        ref = otp.monitor(child)
        start = trio.current_time()
        assert await terminate_child(sup, "s") == "ok"
        assert await otp.receive(otp.Down) == otp.Down(ref, child, otp.KILLED)
        assert trio.current_time() - start == pytest.approx(1.0)


async def test_reports_are_logged(autojump_clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="supervisors")
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags(intensity=1), [ChildSpec("a", (Worker.start_link, "a"))]
        )
        for _ in range(2):
            otp.cast(pid_of(await which_children(sup), "a"), ("stop", "boom"))
            await settle()
        await otp.receive(otp.Exit)
    contexts = [
        r.otp_report.get("errorContext") for r in caplog.records if hasattr(r, "otp_report")
    ]
    assert contexts.count("child_terminated") == 2
    assert "shutdown" in contexts
    give_up = [
        r for r in caplog.records if getattr(r, "otp_report", {}).get("errorContext") == "shutdown"
    ]
    assert give_up[0].otp_report["reason"] == "reached_max_restart_intensity"
    started = [r for r in caplog.records if "started" in getattr(r, "otp_report", {})]
    assert len(started) == 2


async def test_call_to_dead_supervisor_raises_call_error(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await Supervisor.start(SupFlags(), [])
        await otp.GenServer.stop(sup, otp.SHUTDOWN)
        with pytest.raises(otp.CallError) as info:
            await which_children(sup)
        assert info.value.reason == otp.NOPROC


async def test_registered_name(autojump_clock: Any) -> None:
    async with otp.open_node():
        await Supervisor.start_link(SupFlags(), [], name="top")
        assert await count_children("top") == {
            "specs": 0,
            "active": 0,
            "supervisors": 0,
            "workers": 0,
        }
        with pytest.raises(otp.StartError) as info:
            await Supervisor.start_link(SupFlags(), [], name="top")
        assert info.value.reason[0] == "already_started"


async def test_cancelled_waiter_does_not_break_the_supervisor(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await Supervisor.start_link(SupFlags(), [])
        with trio.move_on_after(0):
            await which_children(sup)
        assert await which_children(sup) == []
        await trio.testing.wait_all_tasks_blocked()


async def test_bad_modules_in_start_child_is_an_error_value_not_a_supervisor_crash(
    autojump_clock: Any,
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(SupFlags(), [worker("a")])
        a = pid_of(await which_children(sup), "a")
        result = await start_child(sup, {"id": "b", "start": Worker, "modules": 5})
        assert result[0] == "error"
        assert alive(sup) and alive(a)
        assert check_childspecs([{"id": "b", "start": Worker, "modules": 5}])[0] == "error"
        with pytest.raises(ChildSpecError, match="modules"):
            ChildSpec("b", Worker, modules=5)  # type: ignore[arg-type]


async def test_one_for_all_restarts_a_transient_sibling_that_had_ended_normally(
    autojump_clock: Any,
) -> None:
    # OTP's start_children starts every remaining spec, stopped ones included.
    log: list[Any] = []
    async with otp.open_node():
        sup = await Supervisor.start_link(
            SupFlags(strategy="one_for_all", intensity=5),
            [worker("a", log), worker("t", log, restart="transient"), worker("c", log)],
        )
        otp.cast(pid_of(await which_children(sup), "t"), ("stop", "normal"))
        await settle()
        assert [row[:2] for row in await which_children(sup)][1] == ("t", None)
        log.clear()
        otp.cast(pid_of(await which_children(sup), "a"), ("stop", "boom"))
        await settle()
        assert log == [
            ("terminate", "a", "boom"),
            ("terminate", "c", "shutdown"),
            ("start", "a"),
            ("start", "t"),
            ("start", "c"),
        ]
        assert all(isinstance(row[1], otp.Pid) for row in await which_children(sup))


async def test_terminate_child_of_a_restarting_child_cancels_the_retry(
    autojump_clock: Any,
) -> None:
    attempts: list[int] = []
    gate = trio.Event()

    async def flaky() -> Any:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            return await Worker.start_link("f")
        await gate.wait()
        raise otp.StartError("down")

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(SupFlags(intensity=3), [ChildSpec("f", flaky)])
        otp.cast(pid_of(await which_children(sup), "f"), ("stop", "boom"))
        await settle()
        gate.set()  # the first restart fails: a retry is now queued behind our call
        assert await terminate_child(sup, "f") == "ok"
        await settle()
        assert [row[:2] for row in await which_children(sup)] == [("f", None)]
        assert len(attempts) == 2  # the queued retry found the child stopped and did nothing
        assert await restart_child(sup, "f") == ("error", "down")
        assert alive(sup)


async def test_all_significant_counts_an_ignored_significant_child_as_stopped(
    autojump_clock: Any,
) -> None:
    class Nope(otp.GenServer):
        async def init(self) -> Any:
            return otp.Ignore()

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags(auto_shutdown="all_significant"),
            [
                ChildSpec("i", Nope, restart="transient", significant=True),
                worker("s", restart="transient", significant=True),
            ],
        )
        assert [row[:2] for row in await which_children(sup)][1] == ("i", None)
        otp.cast(pid_of(await which_children(sup), "s"), ("stop", otp.Shutdown("done")))
        assert await otp.receive(otp.Exit, timeout=30, default=None) == otp.Exit(sup, otp.SHUTDOWN)


@pytest.mark.parametrize(("second_crash_at", "survives"), [(5.99, False), (6.0, True)])
async def test_intensity_window_is_inclusive_in_whole_seconds_on_the_clock(
    autojump_clock: Any, second_crash_at: float, survives: bool
) -> None:
    # intensity 1, period 5: a restart in second 0 still counts in second 5 (Now - Period <= 0),
    # not in second 6 (OTP's add_restart on erlang:monotonic_time(second)).
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(SupFlags(intensity=1, period=5), [worker("w")])
        await trio.sleep_until(0.5)
        otp.cast(pid_of(await which_children(sup), "w"), ("stop", "boom"))
        await settle()
        await trio.sleep_until(second_crash_at)
        otp.cast(pid_of(await which_children(sup), "w"), ("stop", "boom"))
        await settle()
        assert alive(sup) is survives


@pytest.mark.parametrize(("intensity", "survives"), [(1, False), (2, True)])
async def test_rest_for_one_failed_restart_is_retried_from_the_failed_child_and_counted(
    autojump_clock: Any, intensity: int, survives: bool
) -> None:
    # a crashes; c and b are stopped (newest first); a starts, b fails: b is "restarting" and c
    # unstarted. The retry (a second restart in the count) starts b then c, or gives up.
    log: list[Any] = []
    b_starts: list[int] = []

    async def start_b() -> Any:
        b_starts.append(len(b_starts))
        if len(b_starts) == 2:
            raise otp.StartError("not_yet")
        return await Worker.start_link("b", log)

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags("rest_for_one", intensity, 5),
            [worker("a", log), ChildSpec("b", start_b), worker("c", log)],
        )
        log.clear()
        otp.cast(pid_of(await which_children(sup), "a"), ("stop", "boom"))
        await settle()
        stopped = [("terminate", "a", "boom"), ("terminate", "c", "shutdown")]
        stopped.append(("terminate", "b", "shutdown"))
        if survives:
            assert log == [*stopped, ("start", "a"), ("start", "b"), ("start", "c")]
            assert all(isinstance(row[1], otp.Pid) for row in await which_children(sup))
        else:
            assert log == [*stopped, ("start", "a"), ("terminate", "a", "shutdown")]
            assert await otp.receive(otp.Exit, timeout=30, default=None) == otp.Exit(
                sup, otp.SHUTDOWN
            )
        assert len(b_starts) == (3 if survives else 2)
