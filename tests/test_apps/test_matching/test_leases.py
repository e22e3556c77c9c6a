"""Flows owned by leases (MULTISERVER.md, part A): the server whose lease holds a running flow's
pending step holds the flow; ``matching_leases`` renews, claims and releases; a server takes
over the flows of one that died (their leases expired) or stopped (it released them), and
dispatches their current steps again; a call for a flow another server holds is answered
``unavailable`` naming it.

The engine-level tests run on SQLite (calls on trio's thread) and trio's MockClock, with the
keeper told the store is shared; leases are wall-clock times, so "a dead server's lease" is one
written already expired. The PostgreSQL tests use real time: two engines on two
``StoreServer``s of one database in one run, and two ``python -m otp.node`` servers SIGKILLed or
stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from test_node.test_node_cli import Node

import otp
import supervisors
from apps.matching import Client, ClientOptions, FlowStatus, Registry
from apps.matching._application import application
from apps.matching._config import MatchingConfig
from apps.matching._dispatch import Completed, Dispatch, Routed
from apps.matching._engine import ENGINE, EngineOptions, FlowEngine
from apps.matching._engine_state import Claimed, _Loaded
from apps.matching._errors import ConfigurationError, Unavailable
from apps.matching._leases import LEASES, LeaseKeeper
from apps.matching._matcher import MATCHER
from apps.matching._postgres_store import PostgresStore
from apps.matching._server_id import local_server_id, server_id
from apps.matching._store import (
    SERVER_NAME,
    FlowRecord,
    PendingStep,
    StoreServer,
    WriteBatch,
)

from ._stores import StoreKind
from .crash_worker import Crashy
from .test_engine import (
    by_step,
    definition,
    dispatches,
    hang,
    ok,
    outcome,
    server,
    set_script,
    spawn_call,
    step,
)
from .test_real_processes import _WorkerProcess

LEASE = 30.0  # (a third of it, 10 s, is the keeper's period)


def foreign_flow(flow_id: str, owner: str | None, expires: float | None, **kw: Any) -> WriteBatch:
    """A flow another server started, at its step b (index 1) attempt 2, with state, a
    sticky worker, and its pending step leased to ``owner`` until ``expires`` (wall clock)."""
    spec = definition(step("a"), step("b"), rpcs=["r"])
    record = FlowRecord(
        flow_id=flow_id, flow_type="T", status="running", args=["x"], state={"n": 1},
        step_index=1, step_input=["A"], result=None, error=None, sticky_worker="w7",
        created_at=1.0, updated_at=2.0, version=3, definition=spec,
    )  # fmt: skip
    row = PendingStep(
        flow_id=flow_id, step_index=1, step="b", execution_id=f"{flow_id}/1/b", attempt=2,
        lease_owner=owner, lease_expires=expires, **kw,
    )  # fmt: skip
    return WriteBatch(flows_created=[record], pending_put=[row])


async def keeper(**options: Any) -> None:
    """``matching_leases`` of the engine the test started, as on a shared store."""
    await LeaseKeeper.start(EngineOptions(**options), ENGINE, True, name=LEASES)


# -- the server's id


def test_the_server_id_is_the_nodes_name_when_distributed_else_this_processs() -> None:
    async def in_node(*name: str) -> str:
        async with otp.open_node(*name):
            return server_id()

    unnamed = trio.run(in_node)
    named = trio.run(in_node, "m1@host")
    host, pid, tail = unnamed.split("/")
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert len(tail) == 8 and int(tail, 16) >= 0
    assert unnamed == local_server_id() == EngineOptions().server_id  # made once per process
    assert named == "m1@host"
    with pytest.raises(ConfigurationError, match=r"EngineOptions\.server_id must be a non-empty"):
        EngineOptions(server_id="")


# -- one engine: what it writes, what it recovers --------------------------------------------------


async def test_every_pending_step_the_engine_writes_is_leased_to_its_server(
    store_kind: StoreKind,
) -> None:
    async with (
        otp.open_node(),
        server(store_kind, by_step(a=[hang()]), server_id="me", lease_seconds=LEASE),
    ):
        before = time.time()
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        [row] = await StoreServer.pending("f")
    assert row.lease_owner == "me"
    assert before + LEASE <= row.lease_expires <= time.time() + LEASE


async def test_a_restart_on_sqlite_takes_back_at_once_the_steps_another_run_held(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    path = str(tmp_path / "matching.sqlite3")
    sqlite = StoreKind("sqlite", ":memory:", path)  # (what this test is about: one server a file)
    async with (
        otp.open_node(),
        server(sqlite, hang_all, path=path, server_id="run1", lease_seconds=3600),
    ):
        await FlowEngine.start_flow("T", ["x"], definition(step("a")), "f")
        await trio.testing.wait_all_tasks_blocked()
        engine = otp.whereis(ENGINE)
        assert engine is not None
        otp.exit(engine, otp.KILL)  # its lease has an hour to run
        await otp.GenServer.stop(SERVER_NAME)

        await StoreServer.start_link(sqlite.store(path), name=SERVER_NAME)
        await set_script(by_step(a=[ok("A")]))
        start = trio.current_time()
        options = EngineOptions(first_delivery=1000, server_id="run2", lease_seconds=3600)
        await FlowEngine.start(options, name=ENGINE)
        assert await FlowEngine.result("f") == "A"
        [(at, _)] = await dispatches()
        stats = await FlowEngine.statistics()
    assert at == start  # at once: one server per SQLite file, so the lease was a previous run's
    assert (stats.takeovers, stats.redeliveries) == (0, 0)  # a recovery, not a takeover


def hang_all(task: Any) -> Any:
    return [hang()]


# -- the keeper: renewals, takeovers, releases -----------------------------------------------------


async def test_a_step_whose_lease_expired_is_taken_over_and_dispatched_again(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apps.matching")
    async with (
        otp.open_node(),
        server(store_kind, by_step(b=[ok("B")]), server_id="me", lease_seconds=LEASE),
    ):
        await keeper(server_id="me", lease_seconds=LEASE)
        dead = time.time() - 1  # the dead server's lease: expired
        await StoreServer.commit(foreign_flow("f", "dead", dead))
        written = trio.current_time()
        await trio.sleep(LEASE / 3 + 1)
        [(at, sent)] = await dispatches()
        assert await FlowEngine.result("f", timeout=3600) == "B"
        stats = await FlowEngine.statistics()
    # expired leases wake nobody: the keeper's next poll (a third of the lease) found it
    assert written < at <= written + LEASE / 3
    task = sent.task
    assert (task.name, task.attempt, task.args, task.state) == ("b", 2, ["A"], {"n": 1})
    assert sent.sticky_worker == "w7"
    assert (stats.takeovers, stats.redeliveries) == (1, 1)
    assert "matching engine: took over flow f from dead (redelivery of step 1 attempt 2)" in [
        r.getMessage() for r in caplog.records
    ]


@pytest.mark.parametrize("keeper_first", [True, False], ids=["keeper-first", "call-first"])
async def test_a_takeover_is_told_when_a_call_takes_the_flow_before_the_keepers_claim_does(
    store_kind: StoreKind,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    keeper_first: bool,
) -> None:
    """The keeper claims a dead server's step for this server and tells the engine
    (``Claimed``), which then reads the flow; a call naming the flow meanwhile claims the step
    itself (``_with_flow``) and finds it leased here already. Whichever the engine takes first,
    the takeover is told as a redelivery once: the step may have run on the dead server. (The
    3-server chaos run found Steps run twice with nothing logged: the call's claim had taken
    them as this server's own.)"""
    caplog.set_level(logging.INFO, "apps.matching")
    async with (
        otp.open_node(),
        server(store_kind, by_step(b=[ok("B")]), server_id="me", lease_seconds=LEASE),
    ):
        await StoreServer.commit(foreign_flow("f", "dead", time.time() - 1))
        claims = await StoreServer.claim_steps("me", time.time(), LEASE, 10)  # the keeper's
        assert [claim.previous_owner for claim in claims] == ["dead"]
        mine = await StoreServer.claim_flow("f", "me", time.time(), LEASE)  # the call's
        assert mine is not None and mine.previous_owner == "me"
        # what the call's load tells the engine (``_load``), in the order under test
        loaded = _Loaded("f", await StoreServer.get_flow("f"), mine)
        engine = otp.whereis(ENGINE)
        assert engine is not None
        told = [Claimed(tuple(claims)), loaded]
        for message in told if keeper_first else reversed(told):
            otp.send(engine, message)
        assert await FlowEngine.result("f", timeout=3600) == "B"
        [(_, sent)] = await dispatches()
        stats = await FlowEngine.statistics()
    assert (sent.task.name, sent.task.attempt) == ("b", 2)
    assert (stats.takeovers, stats.redeliveries) == (1, 1)
    took = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert took == ["matching engine: took over flow f from dead (redelivery of step 1 attempt 2)"]


async def test_steps_a_stopping_server_released_are_claimed_at_once(
    store_kind: StoreKind,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        otp.open_node(),
        server(store_kind, by_step(b=[hang()]), server_id="me", lease_seconds=LEASE),
    ):
        await keeper(server_id="me", lease_seconds=LEASE)
        await StoreServer.commit(foreign_flow("f", "other", time.time() + 3600))
        await trio.sleep(2 * LEASE)  # polls pass: the other server's live lease holds it
        assert await dispatches() == []
        released = trio.current_time()
        assert await StoreServer.release_leases("other") == 1  # it stopped cleanly
        with trio.fail_after(LEASE / 10):
            while not await dispatches():
                await trio.testing.wait_all_tasks_blocked()
        [(at, sent)] = await dispatches()
        stats = await FlowEngine.statistics()
        [row] = await StoreServer.pending("f")
    assert at == released  # woken by the release, not by a poll
    assert (sent.task.name, sent.task.attempt) == ("b", 2)
    assert (stats.takeovers, stats.redeliveries) == (1, 0)  # its step was not running
    assert row.lease_owner == "me"


async def test_the_keeper_renews_the_leases_of_the_servers_flows(store_kind: StoreKind) -> None:
    lease = 0.3
    async with otp.open_node(), server(store_kind, hang_all, server_id="me", lease_seconds=lease):
        await keeper(server_id="me", lease_seconds=lease)
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        await trio.sleep(4 * lease)  # what is tested is that time passes: leases outlive it
        [row] = await StoreServer.pending("f")
        assert row.lease_owner == "me" and row.lease_expires > time.time()
        assert await StoreServer.claim_steps("other", time.time(), 60.0, 10) == []


async def test_a_clean_stop_releases_the_servers_leases(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind, hang_all, server_id="me", lease_seconds=LEASE):
        await keeper(server_id="me", lease_seconds=LEASE)
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        await otp.GenServer.stop(LEASES)
        [row] = await StoreServer.pending("f")
    assert (row.lease_owner, row.lease_expires) == (None, None)


async def test_on_sqlite_the_whole_server_makes_no_lease_calls(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    sock = f"unix:{tmp_path / 'm.sock'}"
    config = MatchingConfig(listen=[sock], store=":memory:", lease_seconds=3.0)
    async with otp.open_node():
        await supervisors.start_application(application(matching_config=config))
        before = await StoreServer.statistics()
        await trio.sleep(60)  # twenty lease periods
        after = await StoreServer.statistics()
        await supervisors.stop_application("matching")
    assert after.store.transactions == before.store.transactions  # no renewals, no claims


# -- calls for flows this engine does not hold -----------------------------------------------------


async def test_a_call_for_a_flow_another_server_holds_is_unavailable_naming_it(
    store_kind: StoreKind,
) -> None:
    async with (
        otp.open_node(),
        server(store_kind, by_step(b=[ok("B")]), server_id="me", lease_seconds=LEASE),
    ):
        await StoreServer.commit(foreign_flow("f", "other", time.time() + 3600))
        for call in (
            FlowEngine.result("f", timeout=5),
            FlowEngine.call_rpc("f", "r"),
            FlowEngine.cancel("f"),
        ):
            with pytest.raises(Unavailable) as caught:
                await call
            assert caught.value.retryable
            assert caught.value.details == {"flow_id": "f", "owner": "other"}
            assert "flow 'f' is run by matching server 'other', not by this one ('me')" in str(
                caught.value
            )
        stats = await FlowEngine.statistics()
        assert (stats.flows_resident, await dispatches()) == (0, [])
        # once that lease expires, a call claims the flow here, which runs it
        expired = foreign_flow("f", "other", time.time() - 1).pending_put  # (it died)
        await StoreServer.commit(WriteBatch(pending_put=expired))
        assert await FlowEngine.result("f", timeout=5) == "B"
        stats = await FlowEngine.statistics()
    assert (stats.takeovers, stats.redeliveries) == (1, 1)


async def test_a_running_flow_no_server_holds_is_claimed_by_the_call_that_names_it(
    store_kind: StoreKind,
) -> None:
    async with (
        otp.open_node(),
        server(store_kind, by_step(b=[ok("B")]), server_id="me", lease_seconds=LEASE),
    ):
        await StoreServer.commit(foreign_flow("f", None, None))  # released, not yet claimed
        assert await FlowEngine.result("f", timeout=5) == "B"
        [(_, sent)] = await dispatches()
    assert (sent.task.name, sent.task.attempt) == ("b", 2)


# -- fencing: a flow another server wrote meanwhile


async def test_a_flow_another_server_wrote_meanwhile_is_dropped_and_the_rest_committed(
    store_kind: StoreKind,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = definition(step("a"), step("b"), rpcs=["r"])
    async with otp.open_node(), server(store_kind, hang_all, server_id="me", lease_seconds=LEASE):
        engine = otp.whereis(ENGINE)
        assert engine is not None
        await FlowEngine.start_flow("T", [], spec, "f")
        await FlowEngine.start_flow("T", [], spec, "g")
        waiting = await spawn_call(FlowEngine.result, "f", 60)
        calling = await spawn_call(FlowEngine.call_rpc, "f", "r")
        await trio.testing.wait_all_tasks_blocked()
        delivery = {(d.task.flow_id, d.task.kind): d.task.delivery for _, d in await dispatches()}
        await set_script(hang_all)  # (and forget those dispatches)
        # this server was silent past its lease: another one took f and ran its step a
        stored = await StoreServer.get_flow("f")
        assert stored is not None
        theirs = attrs.evolve(stored, step_index=1, step_input=["theirs"], version=2)
        row = PendingStep("f", 1, "b", "f/1/b", 1, "other", time.time() + 3600)
        await StoreServer.commit(
            WriteBatch(flows_upserted=[theirs], pending_put=[row], pending_done=[("f", 0)])
        )
        # f's and g's outcomes reach this engine in one pass: one batch, which f's conflict
        # refuses
        patch = {"set": {}, "delete": []}
        otp.send(engine, Completed(delivery["f", "step"], "w1", "mine", patch))
        otp.send(engine, Completed(delivery["g", "step"], "w1", "G", patch))
        with pytest.raises(Unavailable):
            await outcome(waiting)  # f's waiter is told it moved
        # an RPC of f that was running: its patch is not kept, and its caller told so
        changed = {"set": {"x": 1}, "delete": []}
        otp.send(engine, Completed(delivery["f", "rpc"], "w1", "value", changed))
        with pytest.raises(Unavailable):
            await outcome(calling)
        await trio.testing.wait_all_tasks_blocked()
        after = [(d.task.flow_id, d.task.name) for _, d in await dispatches()]
        stats = await FlowEngine.statistics()
        assert otp.whereis(ENGINE) == engine  # not crashed
        assert await StoreServer.get_flow("f") == theirs
        assert (await StoreServer.get_flow("g")).step_input == ["G"]  # type: ignore[union-attr]
    assert after == [("g", "b")]  # g went on; f is the other server's
    assert (stats.moved, stats.flows_resident) == (1, 1)
    assert any("flow f belongs to another server now" in r.getMessage() for r in caplog.records)


async def test_a_flow_whose_step_another_server_claimed_is_dropped_at_its_next_commit(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, hang_all, server_id="me", lease_seconds=LEASE):
        engine = otp.whereis(ENGINE)
        assert engine is not None
        await FlowEngine.start_flow("T", [], definition(step("a"), step("b")), "f")
        [(_, sent)] = await dispatches()
        await set_script(hang_all)
        # this server was silent past its lease: another one claimed f's step (and has not
        # written f yet)
        [row] = await StoreServer.pending("f")
        theirs = attrs.evolve(row, lease_owner="other", lease_expires=time.time() + 3600)
        await StoreServer.commit(WriteBatch(pending_put=[theirs]))
        patch = {"set": {}, "delete": []}
        otp.send(engine, Completed(sent.task.delivery, "w1", "mine", patch))
        await trio.testing.wait_all_tasks_blocked()
        stats = await FlowEngine.statistics()
        assert otp.whereis(ENGINE) == engine
        stored = await StoreServer.get_flow("f")
        assert await StoreServer.pending("f") == [theirs]
        assert await dispatches() == []  # f's step b is not this server's to dispatch
    assert stored is not None and (stored.step_index, stored.version) == (0, 1)
    assert (stats.moved, stats.flows_resident) == (1, 0)


# -- several servers on one PostgreSQL database ---------------------------------------------------


class Recorder(otp.GenServer):
    """A matcher that tells ``watcher`` of every dispatch (and routes it nowhere: the step
    hangs), so a test waits for dispatches as events."""

    def init(self, watcher: otp.Pid) -> otp.Ok:
        return otp.Ok(watcher)

    def handle_cast(self, dispatch: Dispatch, watcher: otp.Pid) -> otp.NoReply:
        otp.send(dispatch.reply_to, Routed(dispatch.task.delivery, "flow:T", "flow_queue"))
        otp.send(watcher, ("dispatched", dispatch.reply_to, dispatch.task.flow_id))
        return otp.NoReply(watcher)


async def _dispatched(n: int, timeout: float = 30) -> list[tuple[otp.Pid, str]]:
    seen = []
    with trio.fail_after(timeout):
        for _ in range(n):
            _, engine, flow_id = await otp.receive(
                lambda m: isinstance(m, tuple) and m[0] == "dispatched"
            )
            seen.append((engine, flow_id))
    return seen


async def test_two_engines_on_one_postgres_share_the_flows_and_take_over_a_dead_ones(
    postgres: Any,
) -> None:
    url = postgres.url()
    setup = PostgresStore(url)
    await setup.open()
    ids = [f"f{i:02}" for i in range(20)]
    for flow_id in ids:  # running flows no server holds yet
        await setup.commit(foreign_flow(flow_id, None, None))
    await setup.close()
    async with otp.open_node():
        await Recorder.start(otp.self(), name=MATCHER)
        engines: dict[str, otp.Pid] = {}

        async def start(n: int) -> None:
            store = await StoreServer.start(PostgresStore(url), name=f"store{n}")
            options = EngineOptions(
                store=f"store{n}", server_id=f"server{n}", lease_seconds=3.0, first_delivery=n
            )
            engines[f"engine{n}"] = await FlowEngine.start(options, name=f"engine{n}")
            await LeaseKeeper.start(options, f"engine{n}", True, name=f"leases{n}")
            assert store is not None

        async with trio.open_nursery() as nursery:  # both start, and claim, at once
            nursery.start_soon(start, 1)
            nursery.start_soon(start, 2)
        first = await _dispatched(len(ids))
        # every flow is run by exactly one of them
        assert sorted(flow_id for _, flow_id in first) == ids
        held = {n: sorted(f for e, f in first if e == engines[f"engine{n}"]) for n in (1, 2)}
        assert sorted(held[1] + held[2]) == ids
        # one of them (the one that claimed more) dies without a word (no release): the other
        # takes its flows when their leases expire, and dispatches their current steps again
        dead, alive = (1, 2) if len(held[1]) >= len(held[2]) else (2, 1)
        otp.exit(otp.whereis(f"leases{dead}"), otp.KILL)  # type: ignore[arg-type]
        otp.exit(engines[f"engine{dead}"], otp.KILL)
        again = await _dispatched(len(held[dead]))
        assert {e for e, _ in again} == {engines[f"engine{alive}"]}
        assert sorted(f for _, f in again) == held[dead]
        stats = await FlowEngine.statistics(server=f"engine{alive}")
        assert stats.flows_running == len(ids)
        assert (stats.takeovers, stats.redeliveries) == (len(held[dead]), len(held[dead]))


async def test_a_server_restarted_under_its_name_takes_back_its_flows_at_once(
    postgres: Any,
) -> None:
    url = postgres.url()
    async with otp.open_node():
        await Recorder.start(otp.self(), name=MATCHER)
        await StoreServer.start(PostgresStore(url), name=SERVER_NAME)
        first = await FlowEngine.start(EngineOptions(server_id="m1@host", lease_seconds=600))
        for flow_id in ("f", "g"):
            await FlowEngine.start_flow("T", [], definition(step("a")), flow_id, server=first)
        assert sorted(f for _, f in await _dispatched(2)) == ["f", "g"]
        otp.exit(first, otp.KILL)  # no release: its leases have ten minutes to run
        # another server does not take them: their leases are alive
        other = await FlowEngine.start(EngineOptions(server_id="m2@host", lease_seconds=600))
        assert (await FlowEngine.statistics(server=other)).flows_running == 0
        # the same server, restarted under its node's name, owns them again at once
        again = await FlowEngine.start(EngineOptions(server_id="m1@host", lease_seconds=600))
        redispatched = await _dispatched(2)
        stats = await FlowEngine.statistics(server=again)
    assert sorted(redispatched) == [(again, "f"), (again, "g")]
    assert (stats.flows_running, stats.takeovers) == (2, 0)  # its own: not a takeover


def _pg_server(tmp_path: Any, name: str, url: str, *flags: str) -> tuple[Node, str]:
    address = f"unix:{tmp_path / f'{name}.sock'}"
    node = Node(
        "--app", "apps.matching", "--matching-listen", address, "--matching-store", url, *flags,
    )  # fmt: skip
    return node, address


@attrs.frozen
class _TwoServers:
    a: Node
    b: Node
    client_b: Client
    flow_ids: list[str]
    hanging: _WorkerProcess


@asynccontextmanager
async def _flows_hanging_on_a(
    tmp_path: Any, url: str, n: int, flags_a: Sequence[str], flags_b: Sequence[str]
) -> AsyncIterator[_TwoServers]:
    """Servers a and b on one database; ``n`` flows started on a, their first steps hanging
    in a worker of a; a fast worker connected to b."""
    a, address_a = _pg_server(tmp_path, "a", url, *flags_a)
    b, address_b = _pg_server(tmp_path, "b", url, *flags_b)
    log = tmp_path / "handler.log"
    client_a = Client(Registry((Crashy,)), None, ClientOptions(server_address=address_a))
    client_b = Client(Registry((Crashy,)), None, ClientOptions(server_address=address_b))
    try:
        async with a, b:
            await a.line_with("application matching")
            await b.line_with("application matching")
            async with _WorkerProcess(address_a, log, "hang") as hanging:
                flow_ids = [
                    await trio.to_thread.run_sync(client_a.start_flow, Crashy, i) for i in range(n)
                ]
                started = {await hanging.line() for _ in flow_ids}
                assert started == {f"started {f}/0/work" for f in flow_ids}
                async with _WorkerProcess(address_b, log, "fast"):
                    yield _TwoServers(a, b, client_b, flow_ids, hanging)
    finally:
        await trio.to_thread.run_sync(client_a.close)
        await trio.to_thread.run_sync(client_b.close)


async def _results(servers: _TwoServers) -> list[Any]:
    client = servers.client_b
    return [
        await trio.to_thread.run_sync(lambda f=f: client.result(f, timeout=60))
        for f in servers.flow_ids
    ]


async def test_a_killed_servers_flows_are_taken_over_by_another_server(
    tmp_path: Any, postgres: Any
) -> None:
    lease = ["--matching-lease-seconds", "4"]
    async with _flows_hanging_on_a(tmp_path, postgres.url(), 3, lease, lease) as servers:
        servers.a.signal(signal.SIGKILL)  # the server dies mid-step, its leases held
        await servers.a.exit_code()
        servers.hanging.kill()
        flow_ids = servers.flow_ids
        took = [await servers.b.line_with("took over flow", timeout=30) for _ in flow_ids]
        results = await _results(servers)
        described = [
            await trio.to_thread.run_sync(servers.client_b.describe_flow, f) for f in flow_ids
        ]
    assert sorted(line.split("took over flow ")[1].split()[0] for line in took) == sorted(flow_ids)
    assert all("(redelivery of step 0 attempt 1)" in line for line in took)
    assert results == [1, 3, 5]
    for description in described:
        assert description.status is FlowStatus.COMPLETED
        completed = [x["step"] for x in description.attempts if x["status"] == "completed"]
        assert sorted(completed) == ["finish", "work"]  # each step's outcome recorded once
    runs: dict[str, int] = {}
    for line in (tmp_path / "handler.log").read_text().splitlines():
        runs[line.split()[0]] = runs.get(line.split()[0], 0) + 1
    # at least once: each step the dead server had dispatched ran again, on the other server
    assert runs == {f"{f}/0/work": 2 for f in flow_ids}


async def test_a_stopping_server_hands_its_flows_over_at_once(tmp_path: Any, postgres: Any) -> None:
    lease = ["--matching-lease-seconds", "600"]  # only the release can explain a takeover
    flags_a = [*lease, "--matching-stop-drain-timeout", "1"]
    flags_b = [*lease, "--log-level", "info"]
    async with _flows_hanging_on_a(tmp_path, postgres.url(), 2, flags_a, flags_b) as servers:
        servers.a.signal(signal.SIGTERM)
        assert await servers.a.exit_code() == 0
        took = [await servers.b.line_with("took over flow", timeout=30) for _ in servers.flow_ids]
        results = await _results(servers)
    assert all("released by a server that stopped" in line for line in took)
    assert results == [1, 3]
