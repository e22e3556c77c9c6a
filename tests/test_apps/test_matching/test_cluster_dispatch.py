"""Dispatch across servers (issue 20, MULTISERVER.md part C): two matching servers connected by
otp's distribution act as one. A flow started through one server runs its steps on workers
connected only to the other; sticky routing reaches a worker on the other server; a sticky
worker with no stream anywhere falls back at once; and a server that dies mid-step costs the
step a redelivery, not an attempt."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import otp
from apps.matching import (
    ClientOptions,
    Flow,
    FlowFailed,
    FlowStatus,
    PullWorkerOptions,
    Registry,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    rpc,
    step,
)
from apps.matching._engine import ENGINE, EngineStatistics, FlowEngine
from apps.matching._matcher import MATCHER, statistics
from apps.matching._queue_book import QueueStatistics

from ._cluster import two_servers
from ._in_process import BOUND, until

HOLD: dict[str, trio.Event] = {}


class Hop(Flow):
    """Two Steps and an RPC; a first Step whose argument names an event in HOLD waits for it."""

    name = "Hop"

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


class Deep(Flow):
    """A Step whose result the worker's connection carries, nested too deep for the
    distribution (whose messages wrap it in three more levels)."""

    name = "Deep"

    @step
    async def nest(self, ctx, depth):
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value


REGISTRY = Registry([Hop, Deep], allow_async_handlers=True)


def _worker(
    address: str, worker_id: str, slots: int = 2, *, accept_delay: float = 0.005
) -> TrioWorker:
    options = WorkerOptions(
        server_address=address,
        app_worker_id=worker_id,
        pull=PullWorkerOptions(max_concurrent_tasks=slots, accept_delay=accept_delay),
    )
    return TrioWorker(REGISTRY, None, options)


async def _group_has(group: tuple[str, ...], node: str, present: bool = True) -> None:
    """Wait until this node's view of ``group`` has (or has no) member on ``node``."""
    ref, members = otp.pg.monitor(group)
    try:
        with trio.fail_after(BOUND):
            while any(pid.node == node for pid in members) != present:
                await otp.receive(
                    lambda m: isinstance(m, otp.pg.PgJoin | otp.pg.PgLeave) and m.ref == ref
                )
                members = otp.pg.get_members(group)
    finally:
        otp.pg.demonitor(ref)


@asynccontextmanager
async def _worker_there(worker_id: str) -> AsyncIterator[tuple[Any, TrioWorker, TrioClient]]:
    """Two servers, a worker ``worker_id`` of the second (``m2``) serving Hop there, and a
    client of the first; yields ``(m2, worker, client)`` within ``BOUND``."""
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        worker = _worker(m2.matching, worker_id)
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                await _group_has(("matching", "flow", "Hop"), m2.name)
                yield m2, worker, client
        await worker.close()


def _routes(description: Any) -> list[tuple[str, str, str, str | None]]:
    return [(d["name"], d["queue"], d["reason"], d["worker_id"]) for d in description.dispatches]


async def test_a_flow_started_on_one_server_runs_on_a_worker_of_the_other_sticky_there_too() -> (
    None
):
    async with _worker_there("w2") as (m2, _, client):
        await _group_has(("matching", "worker", "w2"), m2.name)
        flow_id = await client.start_flow(Hop, "x")
        assert await client.result(flow_id) == "x done"
        assert await client.call_rpc(flow_id, "ping") == "pong"
        description = await client.describe_flow(flow_id)
    assert description.sticky_worker == "w2"
    assert _routes(description) == [
        ("first", "node:m2@localhost", "forwarded", None),  # no stream for Hop on m1
        ("first", "flow:Hop", "flow_queue", None),  # (decided on m2)
        ("first", "flow:Hop", "delivered", "w2"),
        ("second", "node:m2@localhost", "forwarded", "w2"),  # w2's queue is on m2
        ("second", "worker:w2", "sticky", "w2"),
        ("second", "worker:w2", "delivered", "w2"),
        ("ping", "node:m2@localhost", "forwarded", "w2"),
        ("ping", "worker:w2", "sticky", "w2"),
        ("ping", "worker:w2", "delivered", "w2"),
    ]
    assert [(a["step"], a["attempt"], a["status"]) for a in description.attempts] == [
        ("first", 1, "completed"),
        ("second", 1, "completed"),
    ]


async def test_a_sticky_worker_with_no_stream_anywhere_falls_back_at_once() -> None:
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        gone, other = _worker(m2.matching, "w-gone"), _worker(m1, "w-other")
        nursery.start_soon(gone.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                await gone.wait_pull_registered()
                await _group_has(("matching", "flow", "Hop"), m2.name)
                flow_id = await client.start_flow(Hop, "x")
                assert await client.result(flow_id) == "x done"
                await gone.close()
                await _group_has(("matching", "worker", "w-gone"), m2.name, present=False)
                nursery.start_soon(other.start)
                await other.wait_pull_registered()
                assert await client.call_rpc(flow_id, "ping") == "pong"
                description = await client.describe_flow(flow_id)
        await other.close()
    pings = [r for r in _routes(description) if r[0] == "ping"]
    # Not a sticky wait (fallback_timeout) on either server: straight to the flow-type queue.
    assert pings == [
        ("ping", "flow:Hop", "fallback_no_stream", "w-gone"),
        ("ping", "flow:Hop", "delivered", "w-other"),
    ]


async def test_dispatches_waiting_for_a_flow_type_go_to_the_first_server_that_gets_streams() -> (
    None
):
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        worker = _worker(m2.matching, "w-late")
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                flow_id = await client.start_flow(Hop, "x")  # no stream anywhere: it waits
                await _until_waiting("flow:Hop", 1)
                nursery.start_soon(worker.start)
                assert await client.result(flow_id) == "x done"
                description = await client.describe_flow(flow_id)
        await worker.close()
    firsts = [r for r in _routes(description) if r[0] == "first"]
    assert firsts == [
        ("first", "flow:Hop", "flow_queue", None),  # waits on m1
        ("first", "node:m2@localhost", "forwarded", None),  # handed over when m2 got streams
        ("first", "flow:Hop", "flow_queue", None),
        ("first", "flow:Hop", "delivered", "w-late"),
    ]


async def test_dispatches_waiting_where_the_last_stream_of_their_flow_type_went_go_elsewhere() -> (
    None
):
    # m1's only worker is full (the Step held) and draining when the second flow's Step comes:
    # it waits in m1's queue. When that worker's last stream goes, it goes to m2's worker at
    # once, within its first attempt, not after its dispatch wait ran out there.
    HOLD["held"] = trio.Event()
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        here, there = _worker(m1, "w-here", slots=1), _worker(m2.matching, "w-there")
        nursery.start_soon(here.start)
        nursery.start_soon(there.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                await here.wait_pull_registered()
                await there.wait_pull_registered()
                await _group_has(("matching", "flow", "Hop"), m2.name)
                held = await client.start_flow(Hop, "held")
                await until(lambda: here.statistics().busy == 1)
                waiting = await client.start_flow(Hop, "x")
                await _until_waiting("flow:Hop", 1)
                nursery.start_soon(here.close)  # (draining: it takes nothing new)
                HOLD["held"].set()
                assert await client.result(waiting) == "x done"
                assert await client.result(held) == "held done"
                description = await client.describe_flow(waiting)
        await there.close()
    firsts = [r for r in _routes(description) if r[0] == "first"]
    assert ("first", "node:m2@localhost", "forwarded", None) in firsts
    assert firsts[-1] == ("first", "flow:Hop", "delivered", "w-there")
    assert [(a["step"], a["attempt"], a["status"]) for a in description.attempts] == [
        ("first", 1, "completed"),
        ("second", 1, "completed"),
    ]


async def _until_waiting(queue: str, count: int) -> None:
    """Poll (bounded) until this server's ``queue`` holds ``count`` waiting dispatches: no
    event announces that a dispatch sits in a queue."""
    with trio.fail_after(BOUND):
        while True:
            found = (await statistics()).queues.get(queue)
            if found is not None and found.waiting == count:
                return
            await trio.sleep(0.002)


async def test_a_server_dying_mid_step_costs_a_redelivery_not_an_attempt() -> None:
    HOLD["hold"] = trio.Event()
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        # (accepting at once: its handler running means the server has its ACCEPT)
        doomed = _worker(m2.matching, "w-doomed", accept_delay=0)
        survivor = _worker(m1, "w-survivor")
        nursery.start_soon(doomed.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                await doomed.wait_pull_registered()
                await _group_has(("matching", "flow", "Hop"), m2.name)
                flow_id = await client.start_flow(Hop, "hold")
                await until(lambda: doomed.statistics().busy == 1)
                otp.monitor_node(m2.name)
                m2.stop()
                assert await otp.receive(otp.NodeDown) == otp.NodeDown(m2.name)
                HOLD["hold"].set()  # (the doomed worker's outcome has nowhere to go)
                nursery.start_soon(survivor.start)
                assert await client.result(flow_id) == "hold done"
                description = await client.describe_flow(flow_id)
        nursery.start_soon(doomed.close)
        await survivor.close()
        nursery.cancel_scope.cancel()
    firsts = [r for r in _routes(description) if r[0] == "first"]
    assert firsts[:3] == [
        ("first", "node:m2@localhost", "forwarded", None),
        ("first", "flow:Hop", "flow_queue", None),
        ("first", "flow:Hop", "delivered", "w-doomed"),
    ]
    # (named by the queue it was in last, on m2)
    assert ("first", "flow:Hop", "redispatch_lost", "w-doomed") in firsts
    assert firsts[-1] == ("first", "flow:Hop", "delivered", "w-survivor")
    assert [(a["step"], a["attempt"], a["status"]) for a in description.attempts] == [
        ("first", 1, "completed"),
        ("second", 1, "completed"),
    ]
    # (its Lost came from m1's watch of m2, or from m2's stream as it was killed, whichever
    # crossed first: the other is a late outcome, ignored)


async def test_a_step_waiting_on_a_server_whose_matcher_crashes_is_dispatched_again(
    caplog: Any,
) -> None:
    # The node stays up: the origin engine watches the other server's matcher, not only its
    # node. The worker's one slot is held, so the second flow's step waits in m2's queue, and
    # goes with the matcher (its successor stops the old queues).
    caplog.set_level(logging.INFO, logger="apps.matching")
    HOLD["held"] = trio.Event()
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        worker = _worker(m2.matching, "w-one", slots=1)
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                await _group_has(("matching", "flow", "Hop"), m2.name)
                held = await client.start_flow(Hop, "held")
                await until(lambda: worker.statistics().busy == 1)
                waiting = await client.start_flow(Hop, "x")
                while not any(
                    r[2] == "forwarded" for r in _routes(await client.describe_flow(waiting))
                ):
                    await trio.sleep(0.01)  # (records are committed within 0.1 s)
                await m2.kill_process("matching_matcher")
                HOLD["held"].set()
                assert await client.result(waiting) == "x done"
                assert await client.result(held) == "held done"
                description = await client.describe_flow(waiting)
        await worker.close()
    firsts = [r for r in _routes(description) if r[0] == "first"]
    assert firsts[0] == ("first", "node:m2@localhost", "forwarded", None)
    assert [r[2] for r in firsts].count("redispatch_lost") == 1
    assert [(a["step"], a["attempt"], a["status"]) for a in description.attempts] == [
        ("first", 1, "completed"),
        ("second", 1, "completed"),
    ]
    # No stream had it: only m1's watch of m2's matcher could tell it was lost.
    assert "the server on node m2@localhost went down (killed) with delivery" in caplog.text


async def test_cancelling_a_flow_whose_step_runs_on_another_servers_worker_stops_it_there() -> None:
    # The engine tells the stream that owns the call (CancelCall), across the nodes.
    HOLD["never"] = trio.Event()
    async with _worker_there("w-there") as (_, worker, client):
        flow_id = await client.start_flow(Hop, "never")
        await until(lambda: worker.statistics().busy == 1)
        await client.cancel_flow(flow_id)
        await until(lambda: worker.statistics().busy == 0)  # (its handler cancelled)
        assert (await client.describe_flow(flow_id)).status is FlowStatus.CANCELLED
        after = await client.start_flow(Hop, "after")
        assert await client.result(after) == "after done"


async def test_a_result_that_cannot_cross_to_the_flows_server_fails_the_step_saying_why() -> None:
    async with two_servers() as (m1, m2), trio.open_nursery() as nursery:
        worker = _worker(m2.matching, "w-deep")
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m1)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                await _group_has(("matching", "flow", "Deep"), m2.name)
                flow_id = await client.start_flow(Deep, 254)
                with pytest.raises(FlowFailed) as info:
                    await client.result(flow_id)
                # the worker's connection lived: the next flow runs on it
                assert await client.result(await client.start_flow(Deep, 2)) == [[1]]
        await worker.close()
    assert "result_cannot_cross" in str(info.value)
    assert "nests deeper than max_depth" in str(info.value)


async def test_a_servers_engine_and_queue_counters_are_read_from_another_servers_node() -> None:
    """What the observer of one server shows of another: its engine's and its matcher's
    statistics, asked across nodes, cross as registered values, and asking leaves the engine
    running (an unregistered reply used to crash the engine and restart the whole tree)."""
    async with two_servers() as (_, m2), trio.open_nursery() as nursery:
        worker = _worker(m2.matching, "w2")
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=m2.matching)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                assert await client.result(await client.start_flow(Hop, "x")) == "x done"
                remote = await FlowEngine.statistics(server=(ENGINE, m2.name))
                matcher = await statistics(matcher=(MATCHER, m2.name))
                again = await FlowEngine.statistics(server=(ENGINE, m2.name))
        await worker.close()
    assert isinstance(remote, EngineStatistics)
    assert remote.dispatch_reasons["delivered"] == 2  # both steps ran on m2's worker
    assert remote.flows_running == 0
    assert again.dispatch_reasons == remote.dispatch_reasons  # the same engine, not restarted
    flow_queue = matcher.queues["flow:Hop"]
    assert isinstance(flow_queue, QueueStatistics)
    assert (flow_queue.streams, flow_queue.workers) == (flow_queue.idle, 1)
