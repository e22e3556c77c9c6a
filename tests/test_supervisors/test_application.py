"""Applications and the application controller."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import otp
import supervisors
from supervisors import Application, ApplicationError, ChildSpec, SupFlags

from .helpers import Worker, pid_of, settle


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
