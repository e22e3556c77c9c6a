"""Scale to zero (seed: there is no wake-up hook). With no worker running, a Step waits its
dispatch wait, fails that attempt as ``unavailable`` and is retried by its ``RetryPolicy``;
when the dispatch waits and the retries' backoff together cover a worker's start time, Steps
started while no worker ran complete once one starts, and ``describe_flow`` shows why."""

from __future__ import annotations

import pytest
import trio

from apps.matching import (
    ClientOptions,
    Flow,
    FlowFailed,
    FlowStatus,
    PullWorkerOptions,
    Registry,
    RetryPolicy,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    step,
)
from apps.matching._dispatch import MatchingLimits

from ._in_process import matching_server

#: A worker's start time the retry policy below covers: attempts at 0, 5+2, 12+4, 21+8 ... s
WORKER_STARTS_AFTER = 30.0


class Nightly(Flow):
    name = "Nightly"

    @step(retry=RetryPolicy(max_attempts=6, initial_backoff=2.0, backoff_coefficient=2.0))
    async def run(self, ctx, n):
        return n * 10


REGISTRY = Registry([Nightly], allow_async_handlers=True)


async def test_steps_started_with_no_worker_complete_once_one_starts(store_kind, autojump_clock):
    limits = MatchingLimits(dispatch_wait=5.0)
    async with (
        matching_server(store_kind, limits=limits) as address,
        trio.open_nursery() as nursery,
    ):
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            flow_ids = [await client.start_flow(Nightly, n) for n in range(3)]
            await trio.sleep(WORKER_STARTS_AFTER)  # nobody serves the queue meanwhile
            for flow_id in flow_ids:
                assert (await client.describe_flow(flow_id)).status is FlowStatus.RUNNING
            worker = TrioWorker(
                REGISTRY,
                None,
                WorkerOptions(
                    server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=4)
                ),
            )
            nursery.start_soon(worker.start)
            with trio.fail_after(120):
                results = [await client.result(flow_id) for flow_id in flow_ids]
            description = await client.describe_flow(flow_ids[0])
        await worker.close()
    assert results == [0, 10, 20]
    statuses = [(a["attempt"], a["status"]) for a in description.attempts]
    *waited, (last, done) = statuses
    assert waited and all(status == "not_dispatched" for _, status in waited)
    assert done == "completed" and last == len(waited) + 1
    first = description.attempts[0]["error"]
    assert first["type"] == "unavailable" and "start a pull worker" in first["message"]


async def test_without_enough_retries_a_step_fails_unavailable_naming_the_queue(
    store_kind, autojump_clock
):
    class Once(Flow):
        name = "Once"

        @step(retry=RetryPolicy(max_attempts=1))
        async def run(self, ctx):
            return None

    registry = Registry([Once], allow_async_handlers=True)
    async with matching_server(store_kind, limits=MatchingLimits(dispatch_wait=5.0)) as address:
        async with TrioClient(registry, None, ClientOptions(server_address=address)) as client:
            flow_id = await client.start_flow(Once)
            with trio.fail_after(60), pytest.raises(FlowFailed) as failure:
                await client.result(flow_id)
            description = await client.describe_flow(flow_id)
    assert description.status is FlowStatus.FAILED
    assert "flow type 'Once'" in str(failure.value)
