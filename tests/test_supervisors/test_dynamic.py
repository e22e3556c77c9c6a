"""Dynamic children: DynamicSupervisor (Elixir's) and simple_one_for_one supervisors; start_child
with a spec or extra arguments, terminate_child by pid, limits, shutdown."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import otp
from otp import GenServer, Ok
from supervisors import (
    BRUTAL_KILL,
    ChildSpec,
    DynamicSupervisor,
    DynamicSupFlags,
    Supervisor,
    SupFlags,
    count_children,
    start_child,
    terminate_child,
    which_children,
)

from .helpers import Worker, alive, settle, worker


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


class SlowStop(GenServer):
    """Traps exits; its terminate never finishes (only a kill stops it)."""

    async def init(self) -> Ok:
        otp.process_flag(trap_exit=True)
        return Ok(None)

    async def terminate(self, reason: Any, state: Any) -> None:
        await trio.sleep_forever()


async def test_dynamic_supervisor_shutdown_honours_each_childs_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await DynamicSupervisor.start_link()
        first = await start_child(sup, ChildSpec("a", SlowStop, shutdown=BRUTAL_KILL))
        second = await start_child(sup, ChildSpec("b", SlowStop, shutdown=1.0))
        assert first[0] == "ok" and second[0] == "ok"
        start = trio.current_time()
        otp.exit(sup, otp.SHUTDOWN)
        exit_ = await otp.receive(otp.Exit, timeout=30, default=None)
        assert exit_ == otp.Exit(sup, otp.SHUTDOWN)
        assert trio.current_time() - start == pytest.approx(1.0)


async def test_dynamic_supervisor_shutdown_with_one_shutdown_time_kills_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sup = await DynamicSupervisor.start_link()
        for name in ("a", "b"):
            assert (await start_child(sup, ChildSpec(name, SlowStop, shutdown=2.0)))[0] == "ok"
        start = trio.current_time()
        otp.exit(sup, otp.SHUTDOWN)
        assert await otp.receive(otp.Exit, timeout=30) == otp.Exit(sup, otp.SHUTDOWN)
        assert trio.current_time() - start == pytest.approx(2.0)
        assert otp.processes() == [otp.self()]
