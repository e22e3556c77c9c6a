"""The node's lifetime: what ``otp.run`` and ``open_node`` return and raise."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import trio
import trio.testing

import otp


class Boom(Exception):
    pass


def test_run_returns_the_result_of_main() -> None:
    async def main(x: int) -> int:
        return x + 1

    assert otp.run(main, 41) == 42


def test_an_error_of_main_surfaces_from_run_as_itself_with_the_node_as_a_note() -> None:
    # As trio.run raises a lone error of its main task: no ExceptionGroup from the node's
    # nurseries around it, and the traceback still reaches the line that raised.
    async def main() -> None:
        raise Boom("in main")

    with pytest.raises(Boom) as info:
        otp.run(main, name="n1@host")
    error = info.value
    assert type(error) is Boom
    (note,) = error.__notes__
    assert note.startswith("raised in the main process <n1@host.")
    assert note.endswith("of node 'n1@host'")
    assert traceback.extract_tb(error.__traceback__)[-1].name == "main"
    assert error.__context__ is None


async def test_an_error_in_the_body_of_open_node_surfaces_as_itself() -> None:
    with pytest.raises(Boom) as info:
        async with otp.open_node():
            raise Boom("in the body")
    assert type(info.value) is Boom
    assert len(info.value.__notes__) == 1


async def test_the_bodys_own_exception_group_surfaces_whole_and_unwrapped() -> None:
    with pytest.raises(ExceptionGroup) as info:
        async with otp.open_node():
            async with trio.open_nursery() as nursery:

                async def fail(n: int) -> None:
                    raise Boom(n)

                nursery.start_soon(fail, 1)
                nursery.start_soon(fail, 2)
    assert sorted(exc.args[0] for exc in info.value.exceptions) == [1, 2]
    assert all(type(exc) is Boom for exc in info.value.exceptions)


async def _failing_service() -> None:
    """A task of the node's own (as timers and listeners are) that fails."""
    raise Boom("service")


async def test_a_failed_service_task_of_the_node_surfaces_as_itself_with_a_note() -> None:
    with pytest.raises(Boom) as info:
        async with otp.open_node() as node:
            node.system_nursery.start_soon(_failing_service)
            await trio.sleep_forever()
    assert info.value.__notes__ == ["raised in node 'nonode@nohost', outside its main process"]


async def test_errors_of_the_body_and_a_service_at_once_stay_an_exception_group() -> None:
    with pytest.raises(BaseExceptionGroup) as info:
        async with otp.open_node() as node:
            node.system_nursery.start_soon(_failing_service)
            try:
                await trio.sleep_forever()
            finally:
                raise KeyError("cleanup")  # (an error while unwinding, on purpose)
    # One flat group naming the node, not one group per nursery.
    assert "node 'nonode@nohost'" in str(info.value)
    assert {type(exc) for exc in info.value.exceptions} == {Boom, KeyError}


async def test_a_node_cancelled_from_outside_stops_every_process_and_raises_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.move_on_after(5) as scope:
        async with otp.open_node():
            otp.spawn(otp.receive)
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() == 5


async def test_links_and_exit_hooks_of_the_main_process_see_its_crash() -> None:
    seen: list[Any] = []
    with pytest.raises(Boom):
        async with otp.open_node():
            otp.add_exit_hook(lambda pid, reason: seen.append(reason))
            raise Boom("in the body")
    (reason,) = seen
    assert isinstance(reason, otp.Crash)
    assert isinstance(reason.exception, Boom)


def test_exit_self_in_main_makes_run_raise_process_exited() -> None:
    async def main() -> None:
        otp.exit_self("done")

    with pytest.raises(otp.ProcessExited) as info:
        otp.run(main)
    assert info.value.reason == "done"


async def test_a_process_spawned_while_the_node_stops_dies_at_once() -> None:
    # A peer may dial in after kill_all ran: its connection process must not keep the
    # stopping node waiting (the node waited on it for ever).
    async with otp.open_node() as node:
        node.closing = True  # (what kill_all sets)
        try:
            pid = otp.spawn(trio.sleep_forever)
        finally:
            node.closing = False
        ref = otp.monitor(pid)
        with trio.fail_after(1):
            assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.KILLED)
