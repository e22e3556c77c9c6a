"""SubFlows across matching servers on one PostgreSQL: a parent held by one server whose
child another server holds. The child's end reaches the parent's owner (a ``child_ended``
notice, forwarded as calls are): the parent completes, or its waiting Step sees the child's
failure, while its owner still holds it (no lease expires, nothing is recovered), and the
child's server never writes the parent; cancelling the parent cancels the child on its server
(``cancel_child``). When the parent's owner dies, the notice reaches the server that took the
parent over; a server that lost the parent and still holds it in memory tells the new owner
of the child it ended (its own write is refused); and a parent whose owner died as its child
ended is found by the server that takes it over (as before the notices: recovery reads the
child from the store).

Server m1 runs in this test's node (its engine, store and cluster are this node's), m2 and m3
in threads of this process (each its own node and ``trio.run``, connected by otp's
distribution); all run on the wall clock, every wait on an event, bounded. The child is stored
once the servers started, leased to one of them (what its keeper does when it claims the step
of a server that died): the parent's server finds it running there, and the child's server
takes it when the first call names it (a keeper claims only steps whose lease is free or
expired). The tests ask that call of the parent's server, which forwards it: so the child's
step runs only once the parent's server has found it running and parked the parent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import otp
from apps.matching import (
    CallTimeout,
    Cancelled,
    ClientOptions,
    Flow,
    FlowFailed,
    FlowStatus,
    Registry,
    RetryPolicy,
    TrioClient,
    TrioWorker,
    Unavailable,
    WorkerOptions,
    step,
    subflow,
)
from apps.matching._cluster import CLUSTER, Cluster
from apps.matching._engine import FlowEngine
from apps.matching._engine_family import PARENT_KEY, child_flow_id
from apps.matching._postgres_store import PostgresStore
from apps.matching._store import FlowRecord, PendingStep, WriteBatch

from ._cluster import PeerServer, cluster_directory, clustered_server

M1, M2 = "m1@localhost", "m2@localhost"
#: The bound on every wait (the tests take a second or two when all is well; the dead-owner
#: test waits for a 3 s lease to expire).
BOUND = 30.0

#: Per child flow id: set when its step starts; released to let it finish; its step's end.
STARTED: dict[str, trio.Event] = {}
GATE: dict[str, trio.Event] = {}
STOPPED: list[str] = []


class Part(Flow):
    """The child: makes part ``n`` (fails for good for a negative one)."""

    name = "Part"

    @step(retry=RetryPolicy(max_attempts=1))
    async def make(self, ctx, n):
        STARTED.setdefault(ctx.flow_id, trio.Event()).set()
        try:
            if ctx.flow_id in GATE:
                await GATE[ctx.flow_id].wait()
        finally:
            STOPPED.append(ctx.flow_id)
        if n < 0:
            raise ValueError(f"there is no part {n}")
        return n * 10


class Assembly(Flow):
    """The parent: a SubFlow of ``Part``, then a Step on the part it made."""

    name = "Assembly"

    part = subflow(Part, retry=RetryPolicy(max_attempts=1))

    @step
    async def finish(self, ctx, made):
        return f"assembled {made}"


REGISTRY = Registry([Assembly, Part], allow_async_handlers=True)
PARENT = "order-1"
CHILD = child_flow_id(f"{PARENT}/0/part", 1)


async def _store_child(url: str, n: int, owner: str, lease: float) -> None:
    """``PARENT``'s child, running its first step, its pending step leased to ``owner``."""
    definition = REGISTRY.definitions()["Part"]
    definition[PARENT_KEY] = {"flow_id": PARENT, "step_index": 0, "step": "part", "attempt": 1}
    now = time.time()
    record = FlowRecord(
        flow_id=CHILD, flow_type="Part", status="running", args=[n], state={}, step_index=0,
        step_input=[n], result=None, error=None, sticky_worker=None, created_at=now,
        updated_at=now, version=1, definition=definition,
    )  # fmt: skip
    row = PendingStep(CHILD, 0, "make", f"{CHILD}/0/make", 1, owner, now + lease)
    await _commit(url, WriteBatch(flows_created=[record], pending_put=[row]))


async def _commit(url: str, batch: WriteBatch) -> None:
    """Commit ``batch`` on ``url``'s database, as another server's store would."""
    store = PostgresStore(url)
    await store.open()
    try:
        await store.commit(batch)
    finally:
        await store.close()


async def _sees(cluster: Any, server_id: str) -> None:
    """Until ``cluster`` (a server's ``matching_cluster``) can reach ``server_id`` (it
    connects on its beat)."""
    with trio.fail_after(BOUND):
        while await Cluster.owner_node(server_id, server=cluster) is None:
            await trio.sleep(0.05)


@attrs.frozen
class _Servers:
    """A client of each server, by short name (``"m1"``, ...), and the peers' threads."""

    clients: dict[str, TrioClient]
    peers: dict[str, PeerServer]


@asynccontextmanager
async def _servers(url: str, **leases: float) -> AsyncIterator[_Servers]:
    """Server m1 (this node) and peers (``m2``, ``m3``) on ``url``, each with its lease
    seconds, each reaching every other, each with a worker of ``REGISTRY`` and a client."""
    async with AsyncExitStack() as stack:
        directory = await stack.enter_async_context(cluster_directory())
        peers = {}
        for name, lease in leases.items():
            if name != "m1":
                peer = PeerServer(directory, name, store=url, lease_seconds=lease)
                peers[name] = await stack.enter_async_context(peer)
        m1 = await stack.enter_async_context(
            clustered_server(directory, "m1", store=url, lease_seconds=leases["m1"])
        )
        addresses = {"m1": m1} | {name: peer.matching for name, peer in peers.items()}
        for peer in peers.values():
            assert await otp.connect(peer.name, peer.address)
        clusters = {"m1": CLUSTER} | {name: (CLUSTER, peer.name) for name, peer in peers.items()}
        for name, cluster in clusters.items():
            for other in clusters.keys() - {name}:
                await _sees(cluster, f"{other}@localhost")
        workers = [
            TrioWorker(REGISTRY, None, WorkerOptions(server_address=address))
            for address in addresses.values()
        ]
        clients = {
            name: await stack.enter_async_context(
                TrioClient(REGISTRY, None, ClientOptions(server_address=address))
            )
            for name, address in addresses.items()
        }
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(worker.start)
            with trio.fail_after(BOUND):
                for worker in workers:
                    await worker.wait_pull_registered()
            yield _Servers(clients, peers)
            GATE.setdefault(CHILD, trio.Event()).set()  # (a step still waiting ends)
            for worker in workers:
                await worker.close()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    STARTED.clear()
    GATE.clear()
    STOPPED.clear()


@asynccontextmanager
async def _child_on_m2_parent_on_m1(postgres: Any, n: int) -> AsyncIterator[_Servers]:
    url = postgres.url()
    async with _servers(url, m1=600, m2=600) as servers:  # (no lease expires in these tests)
        await _store_child(url, n, M2, 600)
        await servers.clients["m1"].start_flow(Assembly, n, flow_id=PARENT)  # m1 holds it
        yield servers


async def _child_result(client: TrioClient) -> Any:
    """The child's result, asked of m1: m1 reads the child (so its parent, parked, has found
    it running on m2: the same read serves both) and forwards the call to m2, which takes the
    child and runs its step."""
    try:
        return await client.result(CHILD)
    except (FlowFailed, Cancelled) as exc:
        return exc


async def test_a_child_ending_on_another_server_completes_its_parent_where_it_is_held(
    postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apps.matching")
    async with _child_on_m2_parent_on_m1(postgres, 4) as servers:
        with trio.fail_after(BOUND):
            assert await _child_result(servers.clients["m1"]) == 40
        await _assembled(servers.clients["m1"])
        on_m1 = await FlowEngine.statistics()
    # m1 held the parent throughout (nothing expired, nothing was taken over) and m2 never
    # wrote it (no write of a flow it does not hold, fenced and dropped; m2 logs in this
    # process too)
    assert (on_m1.takeovers, on_m1.moved, on_m1.flows_running) == (0, 0, 0)
    assert _logged(caplog, "took over", "belongs to another server") == []


async def test_a_child_failing_on_another_server_fails_its_parents_waiting_step(
    postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apps.matching")
    async with _child_on_m2_parent_on_m1(postgres, -1) as servers:
        with trio.fail_after(BOUND):
            failed = await _child_result(servers.clients["m1"])
            with pytest.raises(FlowFailed) as info:
                await servers.clients["m1"].result(PARENT)
            parent = await servers.clients["m1"].describe_flow(PARENT)
    assert isinstance(failed, FlowFailed)
    assert info.value.details["type"] == "ValueError"
    assert info.value.details["message"] == (
        f"child flow {CHILD!r} (Part) failed: there is no part -1"
    )
    assert [(a["step"], a["status"]) for a in parent.attempts] == [("part", "failed")]
    assert _logged(caplog, "belongs to another server") == []


async def test_cancelling_a_parent_cancels_its_child_on_the_server_that_holds_it(
    postgres: Any,
) -> None:
    GATE[CHILD] = trio.Event()  # the child's step runs until cancelled
    async with _child_on_m2_parent_on_m1(postgres, 4) as servers:
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def wait_child() -> None:
                answers.append(await _child_result(servers.clients["m1"]))

            nursery.start_soon(wait_child)
            with trio.fail_after(BOUND):
                await STARTED.setdefault(CHILD, trio.Event()).wait()  # (on m2's worker)
                await servers.clients["m1"].cancel_flow(PARENT)
        with trio.fail_after(BOUND):
            child = await servers.clients["m2"].describe_flow(CHILD)
            with pytest.raises(Cancelled):
                await servers.clients["m1"].result(PARENT)
    [cancelled] = answers
    assert isinstance(cancelled, Cancelled)
    assert child.status is FlowStatus.CANCELLED
    assert child.error == {
        "type": "cancelled",
        "message": f"the parent flow {PARENT!r} no longer waits for it",
    }
    assert STOPPED == [CHILD]  # its step was cancelled on the worker, not let finish


async def test_a_child_ending_as_its_parents_owner_dies_completes_the_parent_once(
    postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The parent's owner (m2) dies, its lease held, while the child runs on m1; the child
    ends: m1 tells m2, cannot reach it, and tries again until the parent's lease expires, when
    m1 takes the parent (its notice, or its keeper, whichever is first), finds the ended child,
    and the parent goes on. (The keeper's takeover found the ended child before the notices
    too: this test keeps it so.)"""
    caplog.set_level(logging.INFO, "apps.matching")
    url = postgres.url()
    lease = 3.0
    GATE[CHILD] = trio.Event()
    async with _servers(url, m1=600, m2=lease) as servers:
        await _store_child(url, 4, M1, 600)
        await servers.clients["m2"].start_flow(Assembly, 4, flow_id=PARENT)  # m2 holds the parent
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def wait_child() -> None:
                answers.append(await _child_result(servers.clients["m1"]))

            nursery.start_soon(wait_child)  # (m1 takes the child)
            with trio.fail_after(BOUND):
                await STARTED.setdefault(CHILD, trio.Event()).wait()
            servers.peers["m2"].stop()  # m2 dies, holding the parent's lease
            GATE[CHILD].set()  # the child ends on m1
        assert answers == [40]
        await _assembled(servers.clients["m1"])
        on_m1 = await FlowEngine.statistics()
    assert on_m1.takeovers == 1  # the parent, once m2's lease expired
    assert on_m1.moved == 0  # m1 never wrote the parent while m2's lease held it
    assert _logged(caplog, "took over flow", "belongs to another server") == [
        f"matching engine: took over flow {PARENT} from {M2} (redelivery of step 0 attempt 1)"
    ]


async def _assembled(client: TrioClient) -> None:
    """Until the parent completed (asked of ``client``'s server): its SubFlow step took the
    child's result, then its last step ran, each once."""
    with trio.fail_after(BOUND):
        assert await client.result(PARENT) == "assembled 40"
        parent = await client.describe_flow(PARENT)
    assert [(a["step"], a["status"]) for a in parent.attempts] == [
        ("part", "completed"),
        ("finish", "completed"),
    ]


def _logged(caplog: pytest.LogCaptureFixture, *parts: str) -> list[str]:
    """The log lines of either server holding one of ``parts``."""
    lines = [r.getMessage() for r in caplog.records]
    return [line for line in lines if any(part in line for part in parts)]


async def test_a_child_ending_after_its_parent_moved_tells_the_parents_new_owner(
    postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The parent's owner (m2) dies; m3 takes the parent over (a call names it there once m2's
    lease expired) and finds the child running on m1; then the child ends on m1: m1 tells m3,
    the parent's owner now, and the parent goes on there."""
    caplog.set_level(logging.INFO, "apps.matching")
    url = postgres.url()
    async with _servers(url, m1=600, m2=2, m3=600) as servers:
        await _store_child(url, 4, M1, 600)
        m2, m3 = servers.clients["m2"], servers.clients["m3"]
        await m2.start_flow(Assembly, 4, flow_id=PARENT)  # m2 holds the parent
        servers.peers["m2"].stop()  # m2 dies, holding the parent's lease
        with trio.fail_after(BOUND):
            while True:  # m3 forwards the call to m2, unreachable, until its lease expires
                try:
                    await m3.result(PARENT, timeout=0.5)
                except Unavailable:
                    continue
                except CallTimeout:
                    break  # m3 holds the parent: it timed the call out itself
            # (m3 reads the child once for its parked parent and this call: so the child's
            # step runs only after m3 found it running)
            assert await _child_result(m3) == 40
        await _assembled(m3)
        on_m1 = await FlowEngine.statistics()
    assert (on_m1.takeovers, on_m1.moved, on_m1.flows_running) == (0, 0, 0)
    assert _logged(caplog, "took over flow", "belongs to another server") == [
        f"matching engine: took over flow {PARENT} from {M2} (redelivery of step 0 attempt 1)"
    ]


async def test_a_server_that_lost_the_parent_tells_its_new_owner_of_the_child_it_ended(
    postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """m1 started the parent and its child; m2 took the parent over (m1 was silent past its
    lease: the parent's step is leased to m2 now) and found the child running on m1. The child
    ends on m1, which still holds the parent in memory: its write of the child's outcome into
    the parent is refused (the parent is m2's), and m1 tells m2, which takes the outcome."""
    caplog.set_level(logging.INFO, "apps.matching")
    url = postgres.url()
    GATE[CHILD] = trio.Event()
    async with _servers(url, m1=600, m2=600) as servers:
        m1, m2 = servers.clients["m1"], servers.clients["m2"]
        await m1.start_flow(Assembly, 4, flow_id=PARENT)  # m1 holds the parent and the child
        with trio.fail_after(BOUND):
            await STARTED.setdefault(CHILD, trio.Event()).wait()
        moved = PendingStep(PARENT, 0, "part", f"{PARENT}/0/part", 1, M2, time.time() + 600)
        await _commit(url, WriteBatch(pending_put=[moved]))  # what m2's claim wrote
        with pytest.raises(CallTimeout):  # m2 holds the parent: it timed the call out itself
            await m2.result(PARENT, timeout=0.5)
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def wait_child() -> None:
                answers.append(await _child_result(m2))  # (forwarded to m1)

            nursery.start_soon(wait_child)
            with trio.fail_after(BOUND):  # (so m2 has read the child for its parked parent)
                while (await FlowEngine.statistics()).waiters < 1:
                    await trio.sleep(0.01)
            GATE[CHILD].set()  # the child ends on m1
        await _assembled(m2)
        on_m1 = await FlowEngine.statistics()
    assert answers == [40]
    assert (on_m1.moved, on_m1.flows_running) == (1, 0)
    assert _logged(caplog, "belongs to another server") == [
        f"matching engine: flow {PARENT} belongs to another server now (it took the flow over:"
        " this one lost its lease); dropped here"
    ]
