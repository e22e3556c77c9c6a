"""Sticky routing end to end (seed, 路由和可用性; issue "Beyond the seed"): a real server, real
pull workers and a client. A flow's next call goes to the app worker id queue of the worker that
last served it, a draining worker loses that stickiness at once, and ``describe_flow`` shows
why every dispatch went where it went, with its delivery id."""

from __future__ import annotations

import logging

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

HOLD: dict[str, trio.Event] = {}


class Relay(Flow):
    """Two Steps and an RPC; a Step whose argument names an event in HOLD waits for it."""

    name = "Relay"

    @step
    async def first(self, ctx, key):
        if key in HOLD:
            await HOLD[key].wait()
        return key

    @step
    async def second(self, ctx, key):
        return f"{key} done"

    @rpc
    async def ping(self, ctx):
        return "pong"


REGISTRY = Registry([Relay], allow_async_handlers=True)


def _worker(address: str, worker_id: str) -> TrioWorker:
    options = WorkerOptions(
        server_address=address,
        app_worker_id=worker_id,
        pull=PullWorkerOptions(max_concurrent_tasks=4),
    )
    return TrioWorker(REGISTRY, None, options)


async def test_a_flows_next_calls_go_to_its_workers_own_queue_as_sticky_hits(
    store_kind, autojump_clock
):
    async with matching_server(store_kind) as address, trio.open_nursery() as nursery:
        worker = _worker(address, "w-sticky")
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                flow_id = await client.start_flow(Relay, "x")
                assert await client.result(flow_id) == "x done"
                assert await client.call_rpc(flow_id, "ping") == "pong"
                description = await client.describe_flow(flow_id)
        await worker.close()
    assert description.sticky_worker == "w-sticky"
    routed = [(d["kind"], d["name"], d["queue"], d["reason"]) for d in description.dispatches]
    assert routed == [
        ("step", "first", "flow:Relay", "flow_queue"),  # nobody served the flow yet
        ("step", "first", "flow:Relay", "delivered"),
        ("step", "second", "worker:w-sticky", "sticky"),
        ("step", "second", "worker:w-sticky", "delivered"),
        ("rpc", "ping", "worker:w-sticky", "sticky"),
        ("rpc", "ping", "worker:w-sticky", "delivered"),
    ]
    # every record names its delivery; a step's delivery is its attempt's
    deliveries = [d["delivery"] for d in description.dispatches]
    assert all(type(d) is int for d in deliveries)
    assert len(set(deliveries)) == 3
    by_step = {a["step"]: a["delivery"] for a in description.attempts}
    assert by_step == {"first": deliveries[0], "second": deliveries[2]}
    assert {d["worker_id"] for d in description.dispatches if d["reason"] == "delivered"} == {
        "w-sticky"
    }


async def test_a_draining_worker_loses_its_sticky_flows_at_once(store_kind, caplog):
    caplog.set_level(logging.INFO, logger="apps.matching")
    HOLD["hold"] = trio.Event()
    async with matching_server(store_kind) as address, trio.open_nursery() as nursery:
        old, new = _worker(address, "w-old"), _worker(address, "w-new")
        nursery.start_soon(old.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await old.wait_pull_registered()
                sticky = await client.start_flow(Relay, "x")
                await client.result(sticky)
                held = await client.start_flow(Relay, "hold")  # keeps the old worker draining
                await until(lambda: old.statistics().busy == 1)
                nursery.start_soon(new.start)
                await new.wait_pull_registered()
                nursery.start_soon(old.close)  # sends M_DRAINING, then waits for "hold"
                await until(
                    lambda: "worker 'w-old'" in caplog.text and "is draining" in caplog.text
                )
                assert await client.call_rpc(sticky, "ping") == "pong"
                description = await client.describe_flow(sticky)
                HOLD["hold"].set()
                assert await client.result(held) == "hold done"
        await new.close()
    [rpc_delivery] = {d["delivery"] for d in description.dispatches if d["kind"] == "rpc"}
    routed = [
        (d["queue"], d["reason"], d["worker_id"])
        for d in description.dispatches
        if d["delivery"] == rpc_delivery
    ]
    # straight to the flow-type queue (no sticky wait), and the new worker answered
    assert routed == [
        ("flow:Relay", "fallback_no_stream", "w-old"),
        ("flow:Relay", "delivered", "w-new"),
    ]
