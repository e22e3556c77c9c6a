"""DynamicSupervisor (Elixir's): start_child with a spec, terminate_child by pid, limits."""

from __future__ import annotations

from typing import Any

import trio

import otp
from supervisors import ChildSpec, DynamicSupervisor, DynamicSupFlags

from .helpers import Worker, settle


async def test_start_child_prepends_extra_arguments(autojump_clock: Any) -> None:
    log: list[Any] = []
    async with otp.open_node():
        sup = await DynamicSupervisor.start_link(extra_arguments=("pool",))
        ok, pid = await DynamicSupervisor.start_child(sup, ChildSpec("w", (Worker.start_link, log)))
        assert ok == "ok"
        assert await otp.call(pid, "name") == "pool"
        assert log == [("start", "pool")]


async def test_max_children(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await DynamicSupervisor.start_link(max_children=1)
        assert (await DynamicSupervisor.start_child(sup, ChildSpec("a", (Worker.start_link, "a"))))[
            0
        ] == "ok"
        assert await DynamicSupervisor.start_child(
            sup, ChildSpec("b", (Worker.start_link, "b"))
        ) == (
            "error",
            "max_children",
        )


async def test_children_restart_by_their_own_spec(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await DynamicSupervisor.start_link()
        _, permanent = await DynamicSupervisor.start_child(
            sup, ChildSpec("p", (Worker.start_link, "p"))
        )
        _, temporary = await DynamicSupervisor.start_child(
            sup, ChildSpec("t", (Worker.start_link, "t"), restart="temporary")
        )
        otp.cast(permanent, ("stop", "boom"))
        otp.cast(temporary, ("stop", "boom"))
        await settle()
        rows = await DynamicSupervisor.which_children(sup)
        assert len(rows) == 1 and rows[0][0] is None and rows[0][1] not in (permanent, temporary)
        assert await DynamicSupervisor.count_children(sup) == {
            "specs": 1,
            "active": 1,
            "supervisors": 0,
            "workers": 1,
        }


async def test_terminate_child_by_pid(autojump_clock: Any) -> None:
    async with otp.open_node():
        sup = await DynamicSupervisor.start_link()
        _, pid = await DynamicSupervisor.start_child(sup, ChildSpec("a", (Worker.start_link, "a")))
        assert await DynamicSupervisor.terminate_child(sup, pid) == "ok"
        assert await DynamicSupervisor.terminate_child(sup, pid) == ("error", "not_found")
        assert await DynamicSupervisor.which_children(sup) == []


async def test_shutdown_stops_children_concurrently(autojump_clock: Any) -> None:
    class Slow(Worker):
        async def terminate(self, reason: Any, state: Any) -> None:
            await trio.sleep(1)

    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await DynamicSupervisor.start_link()
        for n in range(5):
            await DynamicSupervisor.start_child(sup, ChildSpec(n, (Slow.start_link, n)))
        start = trio.current_time()
        otp.exit(sup, otp.SHUTDOWN)
        assert await otp.receive(otp.Exit) == otp.Exit(sup, otp.SHUTDOWN)
        assert trio.current_time() - start < 1.5
        assert otp.processes() == [otp.self()]


async def test_intensity_defaults_to_three_in_five_seconds(autojump_clock: Any) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await DynamicSupervisor.start_link()
        await DynamicSupervisor.start_child(sup, ChildSpec("a", (Worker.start_link, "a")))
        for _ in range(4):
            rows = await DynamicSupervisor.which_children(sup)
            otp.cast(rows[0][1], ("stop", "boom"))
            await settle()
        assert await otp.receive(otp.Exit) == otp.Exit(sup, otp.SHUTDOWN)


async def test_subclass_init(autojump_clock: Any) -> None:
    class Pool(DynamicSupervisor):
        def init(self, size: int) -> Any:
            return DynamicSupFlags(max_children=size)

    async with otp.open_node():
        sup = await Pool.start_link(0)
        assert await Pool.start_child(sup, ChildSpec("a", Worker)) == ("error", "max_children")
