"""Applications and the application controller."""

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
    Restart,
    Supervisor,
    SupFlags,
    which_children,
)

from .helpers import Worker, alive, pid_of, settle, worker


def app(name: str, log: list[Any] | None = None, **kwargs: Any) -> Application:
    children = [ChildSpec("w", (Worker.start_link, name, log))]
    return Application(name, (SupFlags(), children), **kwargs)


async def test_start_which_stop(autojump_clock: Any) -> None:
    async with otp.open_node():
        await supervisors.start_application(app("a", env={"port": 1}, version="1.0"))
        await supervisors.start_application(app("b", applications=("a",)))
        assert await supervisors.which_applications() == [("b", "", ""), ("a", "", "1.0")]
        assert supervisors.get_env("a", "port") == 1
        assert supervisors.get_env("a", "missing", 7) == 7
        root = supervisors.application_supervisor("a")
        assert root is not None and await supervisors.count_children(root) == {
            "specs": 1,
            "active": 1,
            "supervisors": 0,
            "workers": 1,
        }
        await supervisors.stop_application("b")
        assert [a[0] for a in await supervisors.which_applications()] == ["a"]
        await supervisors.stop_all_applications()
        assert await supervisors.which_applications() == []
        assert supervisors.get_env("a", "port") is None
        assert supervisors.application_supervisor("a") is None


async def test_application_of_finds_a_processs_application_through_its_parents(
    autojump_clock: Any,
) -> None:
    assert supervisors.application_of() is None  # no node: None, never an error
    async with otp.open_node():
        assert supervisors.application_of() is None  # no application runs
        await supervisors.start_application(app("a"))
        root = supervisors.application_supervisor("a")
        assert root is not None
        worker = pid_of(await supervisors.which_children(root), "w")
        assert supervisors.application_of(worker) == "a"
        assert supervisors.application_of(root) == "a"
        assert supervisors.application_of() is None  # the main process is in none
        stray = otp.spawn(otp.receive)
        assert supervisors.application_of(stray) is None
        otp.exit(stray, "kill")
        await supervisors.stop_application("a")
        assert supervisors.application_of(worker) is None


async def test_start_errors(autojump_clock: Any) -> None:
    async with otp.open_node():
        await supervisors.start_application(app("a"))
        with pytest.raises(ApplicationError) as info:
            await supervisors.start_application(app("a"))
        assert info.value.reason == ("already_started", "a")
        with pytest.raises(ApplicationError) as info:
            await supervisors.start_application(app("c", applications=("zz",)))
        assert info.value.reason == ("not_started", "zz")
        with pytest.raises(ApplicationError) as info:
            await supervisors.stop_application("zz")
        assert info.value.reason == ("not_started", "zz")
        await supervisors.stop_all_applications()


async def test_permanent_application_death_stops_the_node(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        await supervisors.start_application(app("first", log), "temporary")
        await supervisors.start_application(
            Application(
                "core", (SupFlags(intensity=0), [ChildSpec("w", (Worker.start_link, "core", log))])
            ),
            "permanent",
        )
        await supervisors.start_application(app("last", log), "temporary")
        async with trio.open_nursery() as nursery:
            result: list[Any] = []

            async def wait() -> None:
                result.append(await supervisors.wait_node_stop())

            nursery.start_soon(wait)
            await settle()
            root = otp.whereis(supervisors.CONTROLLER_NAME)
            assert root is not None
            rows = await supervisors.which_applications()
            assert [r[0] for r in rows] == ["last", "core", "first"]
            core_root = [p for p in otp.process_info(root).links]  # type: ignore[union-attr]
            assert len(core_root) == 3
            # crash core's worker: its root gives up (intensity 0) and the app ends.
            for sup in core_root:
                children = await supervisors.which_children(sup)
                if await otp.call(pid_of(children, "w"), "name") == "core":
                    otp.cast(pid_of(children, "w"), ("stop", "boom"))
        assert result == [
            supervisors.ApplicationExit("core", "shutdown", supervisors.Restart.PERMANENT)
        ]
        assert await supervisors.which_applications() == []
        terminated = [entry[1] for entry in log if entry[0] == "terminate"]
        assert terminated == ["core", "last", "first"]
        assert await supervisors.wait_node_stop() == result[0]


async def test_transient_normal_end_does_not_stop_the_node(autojump_clock: Any) -> None:
    async with otp.open_node():
        await supervisors.start_application(app("t"), "transient")
        await supervisors.start_application(app("other"), "permanent")
        (root,) = [
            p
            for p in otp.process_info(otp.whereis(supervisors.CONTROLLER_NAME)).links  # type: ignore[union-attr]
            if pid_of(await supervisors.which_children(p), "w")
            and await otp.call(pid_of(await supervisors.which_children(p), "w"), "name") == "t"
        ]
        otp.exit(root, otp.SHUTDOWN)  # not from its parent: ignored by a supervisor
        await settle()
        assert len(await supervisors.which_applications()) == 2
        await otp.GenServer.stop(root, otp.NORMAL)
        await settle()
        assert [a[0] for a in await supervisors.which_applications()] == ["other"]
        with trio.move_on_after(1) as scope:
            await supervisors.wait_node_stop()
        assert scope.cancelled_caught


def test_application_validation() -> None:
    with pytest.raises(ApplicationError, match=r"Application\.name must be a non-empty str"):
        Application("", (SupFlags(), []))
    with pytest.raises(ApplicationError, match=r"Application\.root must be"):
        Application("x", 42)


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


async def test_bad_application_restart_type_is_an_application_error(autojump_clock: Any) -> None:
    async with otp.open_node():
        with pytest.raises(ApplicationError, match="restart_type"):
            await supervisors.start_application(
                Application("a", (SupFlags(), [worker("w")])), "perm"
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
