"""Reserved RPC capacity end to end (seed, 为 RPC 预留容量): a real server and a real pull worker
with ``max_concurrent_tasks=2, reserved_rpc_tasks=1``. With the one Step slot busy an RPC still
runs in the reserved slot; a Step declined for the reserved slot counts in
``pull_reserved_rpc_declines``, one declined because every slot is busy does not."""

from __future__ import annotations

import trio

from apps.matching import (
    ClientOptions,
    Flow,
    PullWorkerOptions,
    Registry,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    rpc,
    step,
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


REGISTRY = Registry([Busy], allow_async_handlers=True)


def _worker(address: str) -> TrioWorker:
    pull = PullWorkerOptions(max_concurrent_tasks=2, reserved_rpc_tasks=1)
    return TrioWorker(REGISTRY, None, WorkerOptions(server_address=address, pull=pull))


def _reasons(description) -> list[str]:
    return [d["reason"] for d in description.dispatches]


async def test_an_rpc_runs_in_the_reserved_slot_while_the_step_slot_is_busy(
    store_kind, autojump_clock
):
    for key in ("a", "b"):
        GATES[key] = trio.Event()
    async with matching_server(store_kind) as address, trio.open_nursery() as nursery:
        worker = _worker(address)
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
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
        await worker.close()
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
    async with matching_server(store_kind) as address, trio.open_nursery() as nursery:
        worker = _worker(address)
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
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
        await worker.close()
