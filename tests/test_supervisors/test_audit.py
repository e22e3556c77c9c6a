"""Audit of supervisors/: bugs against OTP_SEMANTICS section 5 and OTP's application controller
(now fixed; these tests guard them), plus a few tricky edges checked and found right."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import trio

import otp
import supervisors
from supervisors import (
    Application,
    ApplicationError,
    ChildSpec,
    ChildSpecError,
    DynamicSupervisor,
    DynamicSupFlags,
    Restart,
    Supervisor,
    SupervisorError,
    SupFlags,
    check_childspecs,
    count_children,
    restart_child,
    start_child,
    terminate_child,
    which_children,
)

from .helpers import Worker, pid_of, settle


def worker(name: str, log: list[Any] | None = None, **kwargs: Any) -> ChildSpec:
    return ChildSpec(name, (Worker.start_link, name, log), **kwargs)


def alive(pid: otp.Pid) -> bool:
    return otp.process_info(pid) is not None


# -- bugs -------------------------------------------------------------------------------------


async def test_simple_one_for_one_start_child_with_non_list_args_keeps_the_supervisor(
    autojump_clock: Any,
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await Supervisor.start_link(
            SupFlags(strategy="simple_one_for_one"), [ChildSpec("t", (Worker.start_link,))]
        )
        _, one = await start_child(sup, ["one"])
        result = await start_child(sup, 5)  # today: CallError, the supervisor crashed
        assert result[0] == "error"
        assert alive(sup) and alive(one)
        assert (await count_children(sup))["active"] == 1


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


async def test_transient_application_root_giving_up_stops_the_node(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        await supervisors.start_application(
            Application("other", (SupFlags(), [worker("o", log)])), "temporary"
        )
        await supervisors.start_application(
            Application("core", (SupFlags(intensity=0), [worker("w", log)])), "transient"
        )
        root = supervisors.application_supervisor("core")
        assert root is not None
        otp.cast(pid_of(await which_children(root), "w"), ("stop", "boom"))
        result = None
        with trio.move_on_after(30):
            result = await supervisors.wait_node_stop()
        assert not alive(root)  # the root did give up (exit shutdown)
        assert result == supervisors.ApplicationExit("core", "shutdown", Restart.TRANSIENT)
        assert await supervisors.which_applications() == []


async def test_failed_application_start_leaves_no_running_root(autojump_clock: Any) -> None:
    started: list[otp.Pid] = []

    async def start_root() -> Any:
        pid = await Supervisor.start_link(SupFlags(), [worker("w")])
        started.append(pid)
        return ("ok", pid)

    async with otp.open_node():
        with contextlib.suppress(ApplicationError):
            await supervisors.start_application(Application("app", (start_root,)))
        await settle()
        running = [row[0] for row in await supervisors.which_applications()]
        # Either the application runs, or nothing of it is left behind.
        assert "app" in running or not alive(started[0])


def test_application_dependencies_given_as_a_str_are_rejected() -> None:
    with pytest.raises(ApplicationError, match="applications"):
        Application("web", (SupFlags(), []), applications="db")


def test_dynamic_extra_arguments_given_as_a_str_are_rejected() -> None:
    with pytest.raises(SupervisorError, match="extra_arguments"):
        DynamicSupFlags(extra_arguments="cfg")


async def test_bad_application_restart_type_is_an_application_error(autojump_clock: Any) -> None:
    async with otp.open_node():
        with pytest.raises(ApplicationError, match="restart_type"):
            await supervisors.start_application(
                Application("a", (SupFlags(), [worker("w")])), "perm"
            )


async def _start_dynamic(mode: str, start: Any) -> tuple[otp.Pid, otp.Pid]:
    """A DynamicSupervisor or a simple_one_for_one supervisor with one child from ``start``."""
    if mode == "dynamic":
        sup = await DynamicSupervisor.start_link(intensity=3)
        result = await DynamicSupervisor.start_child(sup, ChildSpec("f", start))
    else:
        sup = await Supervisor.start_link(
            SupFlags(strategy="simple_one_for_one", intensity=3), [ChildSpec("f", start)]
        )
        result = await start_child(sup, [])
    assert result[0] == "ok"
    return sup, result[1]


@pytest.mark.parametrize("mode", ["dynamic", "simple_one_for_one"])
async def test_terminate_child_stops_a_dynamic_child_stuck_restarting(
    autojump_clock: Any, mode: str
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
        sup, old = await _start_dynamic(mode, flaky)
        otp.exit(old, otp.KILL)
        await settle()  # the first restart is blocked in its start function
        answer: list[Any] = []

        async def stop_it() -> None:
            answer.append(await terminate_child(sup, old))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_it)
            await settle()
            gate.set()  # that restart fails; the retry is queued behind our call
        await settle()
        assert answer == ["ok"]
        assert len(attempts) == 2
        assert alive(sup) and await which_children(sup) == []


async def test_simple_one_for_one_terminate_child_of_a_stopped_pid_is_ok(
    autojump_clock: Any,
) -> None:
    async with otp.open_node():
        sup, one = await _start_dynamic("simple_one_for_one", (Worker.start_link, "one"))
        assert await terminate_child(sup, one) == "ok"
        assert await terminate_child(sup, one) == "ok"
        other = otp.spawn(lambda: trio.sleep_forever())
        assert await terminate_child(sup, other) == ("error", "not_found")


async def test_simple_one_for_one_start_child_with_a_str_is_bad_extra_args(
    autojump_clock: Any,
) -> None:
    async with otp.open_node():
        sup = await Supervisor.start_link(
            SupFlags(strategy="simple_one_for_one"), [ChildSpec("t", (Worker.start_link,))]
        )
        assert await start_child(sup, "one") == ("error", ("bad_extra_args", "one"))
        assert (await start_child(sup, ("one",)))[0] == "ok"


def test_bad_module_names_are_child_spec_errors() -> None:
    with pytest.raises(ChildSpecError, match=r"ChildSpec\.modules must hold module names") as info:
        ChildSpec("b", Worker, modules=["ok", 5])
    assert info.value.reason == ("invalid_module", 5)
    assert ChildSpec("b", Worker, modules=["m1", "m2"]).modules == ("m1", "m2")
    assert check_childspecs([{"id": "b", "start": Worker, "modules": 5}]) == (
        "error",
        ("invalid_modules", 5),
    )


async def test_root_start_returning_its_pid_in_an_unknown_form_is_stopped(
    autojump_clock: Any,
) -> None:
    started: list[otp.Pid] = []

    async def start_root() -> Any:
        pid = await Supervisor.start_link(SupFlags(), [worker("w")])
        started.append(pid)
        return ("started", pid)

    async with otp.open_node():
        with pytest.raises(ApplicationError) as info:
            await supervisors.start_application(Application("app", (start_root,)))
        assert info.value.reason == ("bad_return", ("started", started[0]))
        assert not alive(started[0])
        assert await supervisors.which_applications() == []


async def test_root_start_returning_an_error_tuple_fails_with_its_reason(
    autojump_clock: Any,
) -> None:
    async def start_root() -> Any:
        return ("error", "no_db")

    async with otp.open_node():
        with pytest.raises(ApplicationError) as info:
            await supervisors.start_application(Application("app", (start_root,)))
        assert info.value.reason == "no_db"


def test_application_dependencies_must_be_names() -> None:
    with pytest.raises(ApplicationError, match=r"Application\.applications must be") as info:
        Application("web", (SupFlags(), []), applications=["db", 5])
    assert info.value.reason == ("bad_applications", ["db", 5])
    assert Application("web", (SupFlags(), []), applications=["db"]).applications == ("db",)


def test_dynamic_sup_flags_errors_name_dynamic_sup_flags() -> None:
    with pytest.raises(SupervisorError, match=r"^DynamicSupFlags\.intensity must be"):
        DynamicSupFlags(intensity=-1)
    with pytest.raises(SupervisorError, match=r"^DynamicSupFlags\.period must be"):
        DynamicSupFlags(period=0)
    with pytest.raises(SupervisorError, match=r"^DynamicSupFlags\.extra_arguments") as info:
        DynamicSupFlags(extra_arguments=None)  # type: ignore[arg-type]
    assert info.value.reason == ("invalid_extra_arguments", None)
    with pytest.raises(SupervisorError, match=r"^SupFlags\.intensity must be"):
        SupFlags(intensity=-1)
    assert DynamicSupFlags(extra_arguments=["cfg"]).extra_arguments == ("cfg",)


async def test_dynamic_supervisor_rejects_a_significant_child(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await DynamicSupervisor.start_link()
        spec = worker("s", restart="transient", significant=True)
        assert await DynamicSupervisor.start_child(sup, spec) == (
            "error",
            ("bad_combination", [("auto_shutdown", "never"), ("significant", True)]),
        )


async def test_dynamic_supervisor_terminate_child_of_a_stopped_pid_is_not_found(
    autojump_clock: Any,
) -> None:
    # Elixir's DynamicSupervisor, unlike OTP 25's simple_one_for_one.
    async with otp.open_node():
        sup, one = await _start_dynamic("dynamic", (Worker.start_link, "one"))
        assert await terminate_child(sup, one) == "ok"
        assert await terminate_child(sup, one) == ("error", "not_found")


# -- tricky edges checked and found right -----------------------------------------------------


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


async def test_dynamic_supervisor_restarting_child_counts_toward_max_children(
    autojump_clock: Any,
) -> None:
    attempts: list[tuple[Any, ...]] = []
    gate = trio.Event()

    async def flaky(*args: Any) -> Any:
        attempts.append(args)
        if len(attempts) == 1:
            return await Worker.start_link("f")
        await gate.wait()
        raise otp.StartError("down")

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await DynamicSupervisor.start_link(
            max_children=1, intensity=2, extra_arguments=("x",)
        )
        _, pid = await DynamicSupervisor.start_child(sup, ChildSpec("f", (flaky, "y")))
        otp.exit(pid, otp.KILL)
        await settle()  # the first restart is blocked in its start function
        answer: list[Any] = []

        async def second() -> None:
            answer.append(await DynamicSupervisor.start_child(sup, worker("g")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await settle()
            gate.set()
        # The call was served while the failed child was "restarting": it still holds a slot.
        assert answer == [("error", "max_children")]
        # The retries go through the mailbox: restarts 1 and 2 fail, the 3rd gives up.
        assert await otp.receive(otp.Exit, timeout=30, default=None) == otp.Exit(sup, otp.SHUTDOWN)
        assert attempts == [("x", "y")] * 3


async def test_stop_all_applications_stops_them_in_reverse_start_order(
    autojump_clock: Any,
) -> None:
    log: list[Any] = []
    async with otp.open_node():
        for name in ("a", "b", "c"):
            await supervisors.start_application(
                Application(name, (SupFlags(), [worker(name + "1", log), worker(name + "2", log)]))
            )
        log.clear()
        await supervisors.stop_all_applications()
        assert [entry[1] for entry in log] == ["c2", "c1", "b2", "b1", "a2", "a1"]
        assert otp.processes() == [otp.self(), otp.whereis(supervisors.CONTROLLER_NAME)]


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
