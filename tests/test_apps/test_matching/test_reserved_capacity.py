"""Reserved RPC capacity end to end (seed, 为 RPC 预留容量): a real server and a real pull worker
with ``max_concurrent_tasks=2, reserved_rpc_tasks=1``. With the one Step slot busy an RPC still
runs in the reserved slot; a Step declined for the reserved slot counts in
``pull_reserved_rpc_declines``, one declined because every slot is busy does not; a WaitFor's
check is a Step task like any (declined for the reserved slot too)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from apps.matching import (
    NOT_YET,
    ClientOptions,
    Flow,
    PullWorkerOptions,
    Registry,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    rpc,
    step,
    wait_for,
)

from ._in_process import BOUND, matching_server, until

GATES: dict[str, trio.Event] = {}


class Busy(Flow):
    """A Step and an RPC that each wait for the event their argument names (if any)."""

    name = "Busy"

    @step
    async def work(self, ctx, key):
        if key in GATES:
            await GATES[key].wait()
        ctx.state["worked"] = key
        return key

    @rpc
    async def peek(self, ctx, key=None):
        if key in GATES:
            await GATES[key].wait()
        return ctx.state.get("worked", "not yet")


class Waiting(Flow):
    """A WaitFor that holds once the state has "go"."""

    name = "Waiting"

    @wait_for
    async def ready(self, ctx):
        return "went" if ctx.state.get("go") else NOT_YET

    @rpc
    async def go(self, ctx):
        ctx.state["go"] = True


REGISTRY = Registry([Busy, Waiting], allow_async_handlers=True)


def _worker(address: str) -> TrioWorker:
    pull = PullWorkerOptions(max_concurrent_tasks=2, reserved_rpc_tasks=1)
    return TrioWorker(REGISTRY, None, WorkerOptions(server_address=address, pull=pull))


@asynccontextmanager
async def served(store_kind: str) -> AsyncIterator[tuple[TrioWorker, TrioClient, trio.Nursery]]:
    """A real server on a ``store_kind`` store, a ready worker of :data:`REGISTRY` (closed
    after) and a client."""
    async with matching_server(store_kind) as address, trio.open_nursery() as nursery:
        worker = _worker(address)
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
            yield worker, client, nursery
        await worker.close()


def _reasons(description) -> list[str]:
    return [d["reason"] for d in description.dispatches]


async def test_an_rpc_runs_in_the_reserved_slot_while_the_step_slot_is_busy(
    store_kind, autojump_clock
):
    for key in ("a", "b"):
        GATES[key] = trio.Event()
    async with served(store_kind) as (worker, client, _):
        with trio.fail_after(BOUND):
            first = await client.start_flow(Busy, "a")
            await until(lambda: worker.statistics().busy == 1)
            second = await client.start_flow(Busy, "b")  # 1 of 2 busy, 1 reserved: declined
            await until(lambda: worker.pull_reserved_rpc_declines >= 1)
            assert await client.call_rpc(first, "peek") == "not yet"  # the reserved slot
            GATES["a"].set()
            GATES["b"].set()
            assert [await client.result(f) for f in (first, second)] == ["a", "b"]
            description = await client.describe_flow(second)
            declines = worker.pull_reserved_rpc_declines
    assert "declined_no_capacity" in _reasons(description)
    # the decline consumed no attempt
    assert [(a["status"], a["attempt"]) for a in description.attempts] == [("completed", 1)]
    # (the Step may be re-offered and declined again while "a" runs: each decline counts)
    assert declines >= 1
    assert worker.pull_reserved_rpc_declines == declines  # never reset, readable after close


async def test_a_step_declined_with_every_slot_busy_is_not_a_reserved_decline(
    store_kind, autojump_clock
):
    for key in ("step", "rpc"):
        GATES[key] = trio.Event()
    async with served(store_kind) as (worker, client, nursery):
        with trio.fail_after(BOUND):
            first = await client.start_flow(Busy, "step")
            await until(lambda: worker.statistics().busy == 1)
            answers: list[str] = []

            async def slow_rpc() -> None:
                answers.append(await client.call_rpc(first, "peek", "rpc"))

            nursery.start_soon(slow_rpc)
            await until(lambda: worker.statistics().busy == 2)  # every slot busy
            second = await client.start_flow(Busy, "late")
            while "declined_no_capacity" not in _reasons(await client.describe_flow(second)):
                await trio.sleep(0.002)
            assert worker.pull_reserved_rpc_declines == 0  # a full-capacity decline
            GATES["rpc"].set()
            GATES["step"].set()
            assert await client.result(second) == "late"
            assert answers == ["not yet"]


async def test_a_wait_for_check_is_declined_for_the_reserved_slot_like_any_step(
    store_kind, autojump_clock
):
    GATES["held"] = trio.Event()
    async with served(store_kind) as (worker, client, _):
        with trio.fail_after(BOUND):
            busy = await client.start_flow(Busy, "held")
            await until(lambda: worker.statistics().busy == 1)  # the one Step slot
            waiting = await client.start_flow(Waiting)
            await until(lambda: worker.pull_reserved_rpc_declines >= 1)  # its check
            await client.call_rpc(waiting, "go")  # an RPC: runs in the reserved slot
            GATES["held"].set()
            assert await client.result(waiting) == "went"
            assert await client.result(busy) == "held"
            description = await client.describe_flow(waiting)
    assert "declined_no_capacity" in _reasons(description)
    assert [(a["step"], a["attempt"]) for a in description.attempts] == [("ready", 1)]
