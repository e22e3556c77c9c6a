"""supervisors.observe(): the supervision tree from the running applications down, with each
supervisor's flags, children and restart history, and each application's own view."""

from __future__ import annotations

from typing import Any

import trio

import otp
from supervisors import (
    Application,
    ChildSpec,
    ChildType,
    DynamicSupervisor,
    Restart,
    Strategy,
    Supervisor,
    observe,
    observe_supervisor,
    start_application,
    start_child,
)

from .helpers import Worker, settle


class _Inner(Supervisor):
    def init(self) -> Any:
        return {"strategy": "one_for_all"}, [ChildSpec("leaf", (Worker.start_link, "leaf"))]


class _Root(Supervisor):
    def init(self) -> Any:
        return {"strategy": "rest_for_one", "intensity": 3, "period": 10}, [
            ChildSpec("worker", (Worker.start_link, "worker"), restart="transient"),
            ChildSpec("inner", (_Inner.start_link,), type="supervisor"),
        ]


async def test_the_tree_shows_flags_children_and_nested_supervisors(autojump_clock: Any) -> None:
    async with otp.open_node():
        root = await _Root.start_link(name="root")
        view = await observe_supervisor("root")
        assert view is not None
        assert (view.pid, view.name) == (root, "root")
        assert (view.strategy, view.intensity, view.period) == (Strategy.REST_FOR_ONE, 3, 10)
        worker, inner = view.children
        assert (worker.id, worker.type, worker.restart) == (
            "worker",
            ChildType.WORKER,
            Restart.TRANSIENT,
        )
        assert isinstance(worker.pid, otp.Pid) and worker.supervisor is None
        assert inner.type is ChildType.SUPERVISOR
        assert inner.supervisor is not None
        assert inner.supervisor.pid == inner.pid
        assert inner.supervisor.strategy is Strategy.ONE_FOR_ALL
        assert [c.id for c in inner.supervisor.children] == ["leaf"]
        assert (view.restarts_in_window, view.restarts_total, view.last_restart_at) == (0, 0, None)


async def test_restarts_are_counted_in_the_window_and_in_total_with_the_last_reason(
    autojump_clock: Any,
) -> None:
    async with otp.open_node():
        await _Root.start_link(name="root")
        for n in range(2):
            view = await observe_supervisor("root")
            assert view is not None
            otp.cast(view.children[0].pid, ("stop", f"crash {n}"))
            await settle()
        crashed_at = trio.current_time()
        view = await observe_supervisor("root")
        assert view is not None
        assert (view.restarts_in_window, view.restarts_total) == (2, 2)
        assert view.last_restart_reason == "crash 1"
        assert view.last_restart_at == crashed_at
        # Past the period the window forgets them; the total does not.
        await trio.sleep(11)
        view = await observe_supervisor("root")
        assert view is not None
        assert (view.restarts_in_window, view.restarts_total) == (0, 2)
        assert view.last_restart_reason == "crash 1"


async def test_a_dynamic_supervisor_shows_its_children_without_ids(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await DynamicSupervisor.start_link(name="dyn")
        child = await start_child(
            sup, ChildSpec("x", (Worker.start_link, "x"), restart="temporary")
        )
        view = await observe_supervisor(sup)
        assert view is not None
        assert view.strategy is None
        (only,) = view.children
        assert (only.id, only.pid, only.restart) == (None, child[1], Restart.TEMPORARY)


async def test_what_is_not_a_supervisor_gives_none(autojump_clock: Any) -> None:
    async with otp.open_node():
        gone = otp.spawn(settle)
        await settle()
        assert await observe_supervisor(gone) is None
        assert await observe_supervisor("nobody") is None


async def test_observe_walks_every_application_with_its_own_view(autojump_clock: Any) -> None:
    calls: list[str] = []

    async def view() -> dict[str, Any]:
        calls.append("view")
        return {"answered": True}

    def broken() -> dict[str, Any]:
        raise RuntimeError("no view today")

    async with otp.open_node():
        await start_application(Application("first", _Root, observer_view=view))
        await start_application(Application("second", _Inner, observer_view=broken))
        await start_application(Application("third", _Inner, description="plain"))
        first, second, third = await observe()
        assert [a.name for a in (first, second, third)] == ["first", "second", "third"]
        assert first.view == {"answered": True} and calls == ["view"]
        assert first.root is not None and first.root.strategy is Strategy.REST_FOR_ONE
        assert second.view == {"error": "RuntimeError: no view today"}
        assert second.root is not None
        assert third.view is None and third.description == "plain"
