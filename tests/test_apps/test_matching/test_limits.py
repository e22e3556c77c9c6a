"""The matching limits as a worker and a client meet them (seed, 容量和关闭; issue "Limits"): a
real server with small limits and real SDKs. Each refusal is typed and names the setting."""

from __future__ import annotations

import pytest
import trio

from apps.matching import (
    ClientOptions,
    Flow,
    LimitError,
    PullRegistrationError,
    PullWorkerOptions,
    Registry,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    step,
)
from apps.matching._dispatch import MatchingLimits

from ._in_process import BOUND, matching_server


def _flow(name: str) -> type[Flow]:
    async def work(self, ctx):
        return name

    return type(f"Flow_{len(name)}_{name[:8]}", (Flow,), {"name": name, "work": step(work)})


async def _registration_error(address: str, flows, **options) -> BaseException:
    """What ``wait_pull_registered`` raises for a worker of ``flows``."""
    worker = TrioWorker(
        Registry(flows, allow_async_handlers=True),
        None,
        WorkerOptions(server_address=address, **options),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.start)
        with trio.fail_after(BOUND), pytest.raises(Exception) as caught:
            await worker.wait_pull_registered(timeout=BOUND / 2)
        await worker.close()
    return caught.value


def test_the_limits_default_to_the_seeds_numbers():
    limits = MatchingLimits()
    assert limits.max_streams == 100_000
    assert limits.max_streams_per_worker == 256
    assert (limits.max_flow_types, limits.max_flow_type_length, limits.max_queue_length) == (
        256,
        256,
        256,
    )


async def test_a_flow_type_name_over_the_limit_fails_registration_naming_the_limit(
    store_kind, autojump_clock
):
    async with matching_server(
        store_kind, limits=MatchingLimits(max_flow_type_length=8)
    ) as address:
        error = await _registration_error(address, [_flow("x" * 20)])
    assert isinstance(error, PullRegistrationError)
    assert isinstance(error.cause, LimitError)
    assert error.queue.startswith(("flow:", "worker:")) and error.queue in str(error)
    assert "matching.max_flow_type_length=8" in str(error)


async def test_too_many_flow_types_fail_registration_naming_the_limit(store_kind, autojump_clock):
    async with matching_server(store_kind, limits=MatchingLimits(max_flow_types=2)) as address:
        error = await _registration_error(address, [_flow("a1"), _flow("a2"), _flow("a3")])
    assert isinstance(error, PullRegistrationError)
    assert isinstance(error.cause, LimitError)
    assert "the worker registers 3 flow types, the most matching.max_flow_types=2" in str(error)


async def test_an_app_worker_id_over_the_limit_fails_registration_naming_the_limit(
    store_kind, autojump_clock
):
    async with matching_server(store_kind, limits=MatchingLimits(max_queue_length=16)) as address:
        error = await _registration_error(address, [_flow("a1")], app_worker_id="w" * 40)
    assert isinstance(error, PullRegistrationError)
    assert "has 40 characters" in str(error) and "matching.max_queue_length=16" in str(error)


async def test_the_nodes_stream_limit_leaves_the_queue_unregistered_and_names_the_limit(
    store_kind, caplog, autojump_clock
):
    async with matching_server(store_kind, limits=MatchingLimits(max_streams=2)) as address:
        error = await _registration_error(address, [_flow("a1"), _flow("a2")])
    # retryable: the worker keeps trying; the wait names the queue left without a stream
    assert type(error).__name__ == "CallTimeout"
    assert "worker:" in str(error) or "flow:" in str(error)
    assert "matching.max_streams=2 allows" in caplog.text


async def test_the_per_worker_stream_limit_refuses_streams_beyond_it_naming_the_limit(
    store_kind, caplog, autojump_clock
):
    pull = PullWorkerOptions(max_concurrent_tasks=4, idle_streams_per_queue=4)
    async with matching_server(
        store_kind, limits=MatchingLimits(max_streams_per_worker=4)
    ) as address:
        worker = TrioWorker(
            Registry([_flow("a1")], allow_async_handlers=True),
            None,
            WorkerOptions(server_address=address, pull=pull),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.start)
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()  # within the limit: ready
                while "matching.max_streams_per_worker=4" not in caplog.text:
                    await trio.sleep(0.002)
                # The streams the server holds for it (a retried one may be on its way to
                # its rejection meanwhile: that one is not held).
                stats = worker.statistics()
                assert sum(stats.idle_streams.values()) + stats.busy <= 4 + 1 + 1
            await worker.close()


async def test_starting_a_flow_of_a_type_name_over_the_limit_is_refused_at_once(
    store_kind, autojump_clock
):
    flow = _flow("y" * 20)
    limits = MatchingLimits(max_flow_type_length=8, dispatch_wait=0.5)
    async with matching_server(store_kind, limits=limits) as address:
        options = ClientOptions(server_address=address)
        async with TrioClient(Registry([flow], allow_async_handlers=True), None, options) as c:
            with trio.fail_after(BOUND), pytest.raises(LimitError, match="max_flow_type_length"):
                await c.start_flow(flow)
