"""Two matching servers on one PostgreSQL, each a real ``python -m otp.node --name ... --listen
... --cookie-file ... --app apps.matching --store postgresql://...`` process: a client connected
to server 1 calls an RPC on, awaits the result of, and cancels flows server 2 owns (their
pending row leased to it), and gets the owner's answers through node distribution; when the
owner's node is SIGKILLed mid-call the call is re-resolved (once the lease expires, server 1
takes the flow over and answers) or fails with a clear retryable ``unavailable`` (an RPC, which
may have run: a retryable ``handler_error`` of type ``lost``), never hangs.

Until the engine leases the rows it writes (part A, ``match-leases``), the tests lease them to
server 2 by hand, as its engine will."""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from test_node.test_node_cli import Node

import otp
import supervisors
from apps.matching import (
    Cancelled,
    ClientOptions,
    Flow,
    FlowStatus,
    HandlerError,
    PullWorkerOptions,
    Registry,
    TrioClient,
    TrioWorker,
    Unavailable,
    WorkerOptions,
    rpc,
    step,
)
from apps.matching._application import application
from apps.matching._cluster import CLUSTER, Cluster
from apps.matching._config import MatchingConfig
from apps.matching._engine import ENGINE

COOKIE = b"matching-cluster-cookie-7"
M1, M2 = "m1@localhost", "m2@localhost"

#: Each flow's step runs: the first run of a step waits for its flow's release.
RUNS: dict[str, int] = {}
RELEASE: dict[str, trio.Event] = {}
RUNNING: dict[str, trio.Event] = {}


class Orders(Flow):
    name = "Orders"

    @step
    async def work(self, ctx, n):
        RUNS[ctx.flow_id] = RUNS.get(ctx.flow_id, 0) + 1
        if RUNS[ctx.flow_id] == 1:
            RUNNING.setdefault(ctx.flow_id, trio.Event()).set()
            await RELEASE.setdefault(ctx.flow_id, trio.Event()).wait()
        return n * 2

    @rpc
    async def hold(self, ctx):
        RUNNING.setdefault(f"{ctx.flow_id}/hold", trio.Event()).set()
        await RELEASE.setdefault(f"{ctx.flow_id}/hold", trio.Event()).wait()
        return "held"

    @rpc
    async def peek(self, ctx, x):
        ctx.state["peeked"] = x
        return {"flow_id": ctx.flow_id, "x": x}


REGISTRY = Registry([Orders], allow_async_handlers=True)


class _Server:
    def __init__(self, tmp_path: Path, name: str, url: str, cookie: Path) -> None:
        short = name.split("@")[0]
        self.name = name
        self.dist = f"unix:{tmp_path}/{short}-dist.sock"
        self.address = f"unix:{tmp_path}/{short}.sock"
        self.node = Node(
            "--name", name, "--listen", self.dist, "--cookie-file", str(cookie),
            "--app", "apps.matching", "--store", url, "--matching-listen", self.address,
            "--liveness-timeout", "2",
        )  # fmt: skip


def _cookie(tmp_path: Path) -> Path:
    cookie = tmp_path / "cookie"
    cookie.write_bytes(COOKIE)
    cookie.chmod(0o600)
    return cookie


async def _connected(to: str) -> None:
    """Until this node's cluster (``matching_cluster`` here, or on ``M1``) reaches ``to``."""
    cluster = CLUSTER if otp.node_name() == M1 else (CLUSTER, M1)
    with trio.fail_after(30):  # (the cluster connects on its next beat)
        while await Cluster.owner_node(to, server=cluster) != to:
            await trio.sleep(0.05)


@pytest.fixture
async def cluster(tmp_path: Path, postgres: Any) -> AsyncIterator[tuple[_Server, _Server, str]]:
    """Servers m1 and m2 on a fresh schema, both live and connected to each other; the test
    runs as node t@localhost, connected to both."""
    cookie, url = _cookie(tmp_path), postgres.url()
    m1, m2 = _Server(tmp_path, M1, url, cookie), _Server(tmp_path, M2, url, cookie)
    async with otp.open_node("t@localhost"), m1.node, m2.node:
        await m1.node.line_with("application matching", timeout=60)
        await m2.node.line_with("application matching", timeout=60)
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=()))
        assert await otp.connect(M1, m1.dist) and await otp.connect(M2, m2.dist)
        await _connected(M2)
        yield m1, m2, url


@pytest.fixture
async def m1_here(tmp_path: Path, postgres: Any) -> AsyncIterator[tuple[str, _Server, str]]:
    """Server m1 in this test's own node (so the test sees its processes), m2 a real process
    on the same fresh schema; yields m1's address, m2, the database URL."""
    cookie, url = _cookie(tmp_path), postgres.url()
    m2 = _Server(tmp_path, M2, url, cookie)
    address = f"unix:{tmp_path}/m1.sock"
    async with otp.open_node(M1), m2.node:
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/m1-dist.sock",))
        )
        config = MatchingConfig(listen=[address], store=url)
        await supervisors.start_application(application(matching_config=config))
        try:
            await m2.node.line_with("application matching", timeout=60)
            await _connected(M2)
            yield address, m2, url
        finally:
            await supervisors.stop_application("matching")


def _forwarders_calling(node: str) -> int:
    """How many of this node's engine's forwarding helpers wait in a call to ``node``."""
    engine = otp.whereis(ENGINE)
    assert engine is not None
    count = 0
    for pid in otp.process_info(engine).links:
        info = otp.process_info(pid)
        if info is not None and any(node in repr(target) for _, target in info.monitors):
            count += 1
    return count


async def _lease(url: str, flow_id: str, owner: str, seconds: float) -> None:
    """Lease the flow's pending row to ``owner`` (what part A's engine does for its flows)."""
    import psycopg

    def run() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            done = conn.execute(
                "UPDATE pending SET lease_owner = %s, lease_expires = %s WHERE flow_id = %s",
                (owner, time.time() + seconds, flow_id),
            )
            assert done.rowcount == 1

    await trio.to_thread.run_sync(run)


def _worker(address: str) -> TrioWorker:
    options = WorkerOptions(server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=4))
    return TrioWorker(REGISTRY, None, options)


async def _started_on(client: TrioClient, url: str, n: int, lease: float) -> str:
    """A flow started on m2 (its step running on m2's worker), leased to m2."""
    flow_id = await client.start_flow(Orders, n)
    with trio.fail_after(30):
        await RUNNING.setdefault(flow_id, trio.Event()).wait()
    await _lease(url, flow_id, M2, lease)
    return flow_id


async def test_a_client_of_server_1_reaches_a_flow_server_2_owns(cluster: Any) -> None:
    m1, m2, url = cluster
    on_m1 = TrioClient(REGISTRY, None, ClientOptions(server_address=m1.address))
    on_m2 = TrioClient(REGISTRY, None, ClientOptions(server_address=m2.address))
    worker = _worker(m2.address)
    async with on_m1, on_m2, trio.open_nursery() as nursery:
        nursery.start_soon(worker.start)
        flow_id = await _started_on(on_m2, url, 21, lease=600)
        with trio.fail_after(30):
            # the RPC runs on m2's worker (m1 has none) and its state change is m2's to write
            assert await on_m1.call_rpc(flow_id, "peek", 5) == {"flow_id": flow_id, "x": 5}
            description = await on_m1.describe_flow(flow_id)  # (a local read)
            assert description.status is FlowStatus.RUNNING
            assert description.state == {"peeked": 5}
            waiting: list[Any] = []

            async def wait_result() -> None:
                waiting.append(await on_m1.result(flow_id))

            async with trio.open_nursery() as inner:
                inner.start_soon(wait_result)
                RELEASE[flow_id].set()  # m2's step finishes; m2 answers the forwarded result
            assert waiting == [42]
            assert RUNS[flow_id] == 1  # m1 never ran it: it forwarded, it did not take over
            other = await _started_on(on_m2, url, 1, lease=600)
            await on_m1.cancel_flow(other)
            with pytest.raises(Cancelled):
                await on_m2.result(other)
            RELEASE[other].set()
        await worker.close()


async def test_the_owner_killed_mid_result_is_re_resolved_and_answered(m1_here: Any) -> None:
    m1_address, m2, url = m1_here
    on_m1 = TrioClient(REGISTRY, None, ClientOptions(server_address=m1_address))
    on_m2 = TrioClient(REGISTRY, None, ClientOptions(server_address=m2.address))
    workers = [_worker(m2.address), _worker(m1_address)]
    async with on_m1, on_m2, trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(worker.start)
        taken = await _started_on(on_m2, url, 4, lease=4)  # m1 may take it over in 4 s
        stuck = await _started_on(on_m2, url, 5, lease=600)  # nobody may before 10 min
        with trio.fail_after(60):
            answers: dict[str, Any] = {}

            async def wait_result(flow_id: str, timeout: float | None) -> None:
                try:
                    answers[flow_id] = await on_m1.result(flow_id, timeout=timeout)
                except Unavailable as exc:
                    answers[flow_id] = exc

            async def hold() -> None:
                try:
                    answers["hold"] = await on_m1.call_rpc(stuck, "hold")
                except HandlerError as exc:
                    answers["hold"] = exc

            async with trio.open_nursery() as inner:
                inner.start_soon(wait_result, taken, None)
                inner.start_soon(wait_result, stuck, 5.0)
                inner.start_soon(hold)
                await RUNNING.setdefault(f"{stuck}/hold", trio.Event()).wait()  # (on m2)
                while _forwarders_calling(M2) < 3:
                    await trio.sleep(0.01)  # (until the three calls are forwarded to m2)
                m2.node.signal(signal.SIGKILL)  # mid-call; its step never finishes there
        assert answers[taken] == 8  # re-resolved: m1 took the flow over and ran the step again
        assert RUNS[taken] == 2
        error = answers[stuck]
        assert isinstance(error, Unavailable) and error.retryable
        assert f"flow {stuck!r} is owned by another matching server" in error.message
        assert M2 in error.message
        # the RPC may have run: it is not sent again, its caller may retry it
        lost = answers["hold"]
        assert isinstance(lost, HandlerError) and lost.retryable
        assert lost.details["type"] == "lost"
        assert f"server {M2}, which runs flow {stuck!r}, went away while it ran RPC 'hold'" in str(
            lost
        )
        for held in (taken, stuck, f"{stuck}/hold"):  # (what the dead server's worker holds)
            RELEASE[held].set()
        for worker in workers:
            await worker.close()
