"""A server-requested reconnect (seed, 容量和关闭: when the server asks a worker to reconnect,
the worker first finishes its running calls; ARCHITECTURE.md's M_RECONNECT). The worker's side
is tested against a fake server in test_worker_engine.py; these tests ask the real server to
send it when it stops gracefully."""

from __future__ import annotations

import trio

import supervisors
import wire
from apps.matching import (
    ClientOptions,
    Flow,
    Registry,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    step,
)
from apps.matching._application import application
from apps.matching._config import MatchingConfig

from ._in_process import BOUND, matching_server, until
from ._peers import Peer

DEFINITION = {
    "steps": [
        {
            "name": "write",
            "max_attempts": 1,
            "initial_backoff": 1.0,
            "backoff_coefficient": 2.0,
            "max_backoff": 10.0,
            "timeout": None,
        }
    ],
    "rpcs": [],
}


async def test_a_graceful_stop_asks_workers_with_running_calls_to_reconnect(
    store_kind, autojump_clock
):
    async with matching_server(store_kind) as address:
        path = address.removeprefix("unix:")
        worker, client = await Peer.unix(path), await Peer.unix(path)
        await worker.hello("worker", worker_id="w1", flows={"G": {"steps": ["write"], "rpcs": []}})
        await worker.send(wire.MatchRegister("flow", "G", rid=1))
        assert type(await worker.receive_not_ping()) is wire.MatchRegistered
        await client.hello("client")
        started = await client.call(
            1, "start_flow", flow_type="G", flow_id="f1", args=[], definition=DEFINITION
        )
        assert started.value == "f1"
        task = await worker.receive_not_ping()
        assert type(task) is wire.MatchTask
        await worker.send(wire.MatchAccept(task.delivery, rid=1))
        received = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisors.stop_application, "matching")
            with trio.fail_after(BOUND):
                while (msg := await worker.receive()) is not None:
                    received.append(msg)
                    if type(msg) is wire.MatchReconnect:
                        # the running call finishes on this connection before it closes
                        await worker.send(
                            wire.MatchResult(task.delivery, "ok", {"set": {}, "delete": []}, rid=1)
                        )
        await worker.aclose()
        await client.aclose()
    assert any(type(m) is wire.MatchReconnect for m in received)


GATE: dict[str, trio.Event] = {}
RUNS: list[int] = []


class Slow(Flow):
    """One Step that runs until the test opens its gate."""

    name = "Slow"

    @step
    async def work(self, ctx, key):
        RUNS.append(ctx.attempt)
        await GATE[key].wait()
        ctx.state["worked"] = key
        return key


REGISTRY = Registry([Slow], allow_async_handlers=True)


async def test_a_step_running_across_a_graceful_stop_completes_exactly_once(store_kind):
    GATE["a"] = trio.Event()
    RUNS.clear()
    store = store_kind.durable
    async with matching_server(store_kind, store=store) as address, trio.open_nursery() as nursery:
        worker = TrioWorker(REGISTRY, None, WorkerOptions(server_address=address))
        nursery.start_soon(worker.start)
        with trio.fail_after(BOUND):
            async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as c:
                await worker.wait_pull_registered()
                flow_id = await c.start_flow(Slow, "a")
                await until(lambda: worker.statistics().busy == 1)
            idle = worker.statistics().streams - 1
            assert idle >= 1
            stopped = trio.Event()

            async def stop() -> None:
                await supervisors.stop_application("matching")
                stopped.set()

            nursery.start_soon(stop)
            # The drain closes the idle streams (after M_RECONNECT): the busy one stays.
            await until(lambda: worker.statistics().streams == 1)
            assert not stopped.is_set()
            GATE["a"].set()  # the Step ends while the server drains
            await stopped.wait()
            # The same store, a new server: the outcome was committed before the store stopped.
            config = MatchingConfig(listen=[address], store=store)
            await supervisors.start_application(application(matching_config=config))
            async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as c:
                assert await c.result(flow_id) == "a"
                description = await c.describe_flow(flow_id)
        await worker.close()
    assert RUNS == [1]
    assert [(a["status"], a["attempt"]) for a in description.attempts] == [("completed", 1)]
    assert "redispatch_lost" not in [d["reason"] for d in description.dispatches]


async def test_a_client_waiting_for_a_result_gets_a_retryable_draining_error_on_a_stop(
    store_kind, autojump_clock
):
    async with matching_server(store_kind) as address:
        client = await Peer.unix(address.removeprefix("unix:"))
        await client.hello("client")
        started = await client.call(
            1, "start_flow", flow_type="G", flow_id="f1", args=[], definition=DEFINITION
        )
        assert started.value == "f1"
        await client.send(wire.MatchCall("result", {"flow_id": "f1", "timeout": None}, rid=2))
        received = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisors.stop_application, "matching")
            with trio.fail_after(BOUND):
                while (msg := await client.receive()) is not None:
                    received.append(msg)
        await client.aclose()
    [error] = [m for m in received if type(m) is wire.MatchError]
    assert (error.rid, error.code, error.retryable) == (2, "draining", True)
    assert "retry it once it is back" in error.message
