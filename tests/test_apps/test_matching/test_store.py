"""The matching server's store: ``SqliteStore`` and ``PostgresStore`` against the ``Store``
contract (each test on both, through the ``store_kind`` fixture), ``StoreServer``'s group commit,
and a model-based property (random batches on the store and on a dict model)."""

from __future__ import annotations

import contextlib
import copy
import importlib
import re
import sqlite3
import threading
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otp
from apps.matching._postgres_store import PostgresStore
from apps.matching._sqlite_checkpoints import (
    CHECKPOINT_EVERY,
    WRITER_CHECKPOINT_PAGES,
    WalCheckpoints,
)
from apps.matching._sqlite_schema import MIGRATIONS
from apps.matching._sqlite_store import INLINE_RECORDS, SCHEMA_VERSION, SqliteStore
from apps.matching._store import (
    AttemptRecord,
    BatchCommitted,
    Claim,
    DispatchRecord,
    FlowExists,
    FlowRecord,
    PendingStep,
    ServerRecord,
    Store,
    StoreConflict,
    StoreError,
    StoreServer,
    WriteBatch,
)
from apps.matching._store_records import trusted, trusted_builder

from ._stores import StoreKind


def flow(flow_id: str = "f1", **kw: Any) -> FlowRecord:
    fields: dict[str, Any] = {
        "flow_type": "orders",
        "status": "running",
        "args": (1, "two", [3.5, None]),
        "state": {"count": 0, "blob": b"\x00\x01", "nested": {"t": (1, 2)}},
        "step_index": 0,
        "step_input": [1, "two"],
        "result": None,
        "error": None,
        "sticky_worker": None,
        "created_at": 1000.0,
        "updated_at": 1000.0,
        "version": 1,
    }
    fields.update(kw)
    return FlowRecord(flow_id=flow_id, **fields)


def attempt(flow_id: str = "f1", n: int = 1, **kw: Any) -> AttemptRecord:
    fields: dict[str, Any] = {
        "step_index": 0,
        "step": "charge",
        "execution_id": f"{flow_id}/0/charge",
        "attempt": n,
        "delivery": n,
        "worker_id": "w1",
        "status": "failed",
        "error": {"type": "ValueError", "message": "boom"},
        "started_at": 1.0,
        "finished_at": 2.0,
    }
    fields.update(kw)
    return AttemptRecord(flow_id=flow_id, **fields)


def dispatch(flow_id: str = "f1", delivery: int = 1, **kw: Any) -> DispatchRecord:
    fields: dict[str, Any] = {
        "kind": "step",
        "name": "charge",
        "attempt": 1,
        "queue": "orders",
        "reason": "flow_queue",
        "worker_id": None,
        "at": 5.0,
    }
    fields.update(kw)
    return DispatchRecord(flow_id=flow_id, delivery=delivery, **fields)


def pending(flow_id: str = "f1", index: int = 0, **kw: Any) -> PendingStep:
    kw.setdefault("step", "charge")
    kw.setdefault("execution_id", f"{flow_id}/{index}/{kw['step']}")
    kw.setdefault("attempt", 1)
    return PendingStep(flow_id=flow_id, step_index=index, **kw)


@pytest.fixture
async def store(store_kind: StoreKind) -> AsyncIterator[SqliteStore]:
    """An open store of each kind, its calls in worker threads (as a server runs it)."""
    s = store_kind.store(threads=True)
    await s.open()
    yield s
    await s.close()


# -- records ------------------------------------------------------------------------------------


def test_flow_record_refuses_an_unknown_status() -> None:
    with pytest.raises(ValueError) as info:
        flow(status="done")
    assert str(info.value) == (
        'FlowRecord.status must be one of "running", "completed", "failed", "cancelled"'
        " (got 'done')"
    )


def test_flow_record_refuses_a_version_below_one() -> None:
    with pytest.raises(ValueError, match=r"FlowRecord.version must be an int >= 1 \(got 0\)"):
        flow(version=0)


def test_flow_record_refuses_an_error_without_type_and_message() -> None:
    with pytest.raises(
        TypeError, match=r'FlowRecord\.error must be None or a dict with str "type"'
    ):
        flow(error={"message": "x"})


def test_pending_step_needs_both_lease_fields_or_neither() -> None:
    with pytest.raises(ValueError) as info:
        pending(lease_owner="n1")
    assert str(info.value) == (
        "PendingStep.lease_owner and PendingStep.lease_expires must both be None (free) or both"
        " be set (leased) (got 'n1' and None)"
    )


async def test_commit_refuses_a_batch_of_the_wrong_records(store: SqliteStore) -> None:
    with pytest.raises(TypeError, match=r"WriteBatch.attempts must be a list of AttemptRecord"):
        await store.commit(WriteBatch(attempts=[flow()]))  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"WriteBatch.pending_done must be a list of"):
        await store.commit(WriteBatch(pending_done=[("f1", "0")]))  # type: ignore[list-item]


def test_sqlite_store_implements_the_store_interface() -> None:
    store: Store = SqliteStore(":memory:")  # mypy checks the Protocol here
    assert repr(store) == "SqliteStore(':memory:')"


def test_sqlite_store_refuses_a_threads_flag_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match=r"SqliteStore.threads must be a bool \(got 'no'\)"):
        SqliteStore(":memory:", threads="no")  # type: ignore[arg-type]


class _Schedules(trio.abc.Instrument):
    """Counts how often one task is scheduled (made runnable again)."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.count += task is self.task


async def _trips_of_get_flow(store: SqliteStore) -> int:
    """How often this task goes through the scheduler in one ``get_flow`` (of no flow)."""
    counter = _Schedules(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(counter)
    try:
        assert await store.get_flow("f1") is None
    finally:
        trio.lowlevel.remove_instrument(counter)
    return counter.count


async def test_a_call_on_a_free_connection_goes_through_the_scheduler_once(
    store_kind: StoreKind,
) -> None:
    """The store's connection is taken without a checkpoint of its own when it is free: the
    call's one trip through the scheduler is its work's (here, on trio's own thread)."""
    s = store_kind.store(threads=False)
    await s.open()
    try:
        assert await _trips_of_get_flow(s) == 1
    finally:
        await s.close()


async def test_a_call_in_a_thread_is_woken_by_its_thread_through_the_scheduler_once(
    store: SqliteStore,
) -> None:
    """In a worker thread (as a server runs it) the call's thread wakes it directly: one trip
    through the scheduler, where ``trio.to_thread.run_sync`` took two (its capacity limiter's
    checkpoint, then a task of its own rescheduling the caller)."""
    assert await _trips_of_get_flow(store) == 1


async def test_a_call_cancelled_while_its_thread_runs_returns_its_work_then_takes_the_cancel(
    store: SqliteStore,
) -> None:
    """The connection is never left mid-call: the caller waits for the thread, gets what it
    returned, and the cancellation takes effect at its next checkpoint; the store still works."""
    token = trio.lowlevel.current_trio_token()
    cancelled = threading.Event()
    returned: list[str] = []

    def work(conn: Any) -> str:
        def cancel() -> None:
            scope.cancel()
            cancelled.set()

        token.run_sync_soon(cancel)
        assert cancelled.wait(10)  # (the caller's scope is cancelled while this runs)
        return "done"

    with trio.CancelScope() as scope:
        returned.append(await store._run(work))
        await trio.lowlevel.checkpoint()
        returned.append("not reached")
    assert returned == ["done"]
    assert scope.cancelled_caught
    assert await store.get_flow("f1") is None


async def test_a_store_without_threads_runs_on_the_trio_thread(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    s = store_kind.store(threads=False)
    assert repr(s).endswith(", threads=False)")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 100)  # a timer autojump would fire while a thread ran
        start = trio.current_time()
        await s.open()
        woke: list[int] = []

        async def waiter() -> None:
            woke.append(await s.wait_pending(0))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        # (PostgreSQL: the waiter listens for other servers' NOTIFY without a thread)
        assert trio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
        await s.create_flow(flow())
        assert await s.get_flow("f1") == flow()
        await s.commit(WriteBatch(pending_put=[pending()]))
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [1]
        await s.close()
        assert trio.current_time() == start  # no thread ran: the clock never jumped
        nursery.cancel_scope.cancel()
    with pytest.raises(StoreError, match=r"is closed"):
        await s.get_flow("f1")


# -- lifecycle ----------------------------------------------------------------------------------


async def test_methods_before_open_raise_store_error(store_kind: StoreKind) -> None:
    s = store_kind.store()
    with pytest.raises(StoreError, match=rf"^{re.escape(repr(s))} is not open"):
        await s.get_flow("f1")


async def test_methods_after_close_raise_store_error(store_kind: StoreKind) -> None:
    s = store_kind.store()
    await s.open()
    await s.close()
    await s.close()  # twice is a no-op
    with pytest.raises(StoreError, match=r"is closed"):
        await s.commit(WriteBatch(flows_created=[flow()]))


async def test_a_database_keeps_its_data_across_reopening(store_kind: StoreKind) -> None:
    s = store_kind.store(store_kind.durable)
    await s.open()
    await s.create_flow(flow())
    await s.close()
    again = store_kind.store(store_kind.durable)
    await again.open()  # the schema is current: nothing to migrate
    assert await again.get_flow("f1") == flow()
    await again.close()
    assert store_kind.query("SELECT version FROM schema_migrations ORDER BY version") == [
        (version,) for version in range(1, SCHEMA_VERSION + 1)
    ]


async def test_a_sqlite_file_runs_in_wal_mode(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    s = SqliteStore(path)
    await s.open()
    await s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_schema_newer_than_the_code_is_refused(store_kind: StoreKind) -> None:
    s = store_kind.store(store_kind.durable)
    await s.open()
    await s.close()
    store_kind.query(f"INSERT INTO schema_migrations VALUES ({SCHEMA_VERSION + 1}, 0)")
    newer = store_kind.store(store_kind.durable)
    with pytest.raises(StoreError) as info:
        await newer.open()
    assert str(info.value) == (
        f"{newer!r}: the database has schema version {SCHEMA_VERSION + 1}, newer"
        f" than this code's {SCHEMA_VERSION}; run a release that knows version"
        f" {SCHEMA_VERSION + 1} (nothing was changed)"
    )
    with pytest.raises(StoreError, match="is not open"):
        await newer.get_flow("f1")


# -- PostgreSQL ---------------------------------------------------------------------------------


def test_postgres_store_implements_the_store_interface_and_hides_its_password() -> None:
    store: Store = PostgresStore("postgresql://app:s3cret@db.example:5432/flows")
    assert repr(store) == "PostgresStore('postgresql://app:***@db.example:5432/flows')"
    with pytest.raises(TypeError, match=r"must be a postgresql:// URL \(got 'mysql://x'\)"):
        PostgresStore("mysql://x")


async def test_an_unreachable_postgres_is_one_clear_store_error(postgres: Any) -> None:
    url = f"postgresql://otp:pw@127.0.0.1:{postgres.port + 1}/postgres"  # nobody listens
    s = PostgresStore(url, connect_timeout=2)
    with pytest.raises(StoreError) as info:
        await s.open()
    message = str(info.value)
    assert message.startswith(
        f"PostgresStore('postgresql://otp:***@127.0.0.1:{postgres.port + 1}/postgres'): cannot"
        " connect to the database:"
    )
    assert "pw" not in message.replace("pw@", "")  # the password is never shown
    assert message.endswith("check the URL, that the server runs and that it accepts this user")


async def test_stores_sharing_one_database_never_claim_the_same_step(
    store_kind: StoreKind,
) -> None:
    stores = [store_kind.store(store_kind.durable, threads=True) for _ in range(3)]
    for s in stores:
        await s.open()  # (PostgreSQL: three servers migrating one schema, one at a time)
    flows = [flow(f"f{i:02}") for i in range(40)]
    await stores[0].commit(WriteBatch(flows_created=flows))
    await stores[0].commit(WriteBatch(pending_put=[pending(f.flow_id) for f in flows]))
    claimed: dict[str, list[str]] = {}

    async def claimer(i: int) -> None:
        mine = claimed.setdefault(f"n{i}", [])
        while batch := await stores[i].claim_pending(f"n{i}", 1.0, 60.0, 3):
            mine.extend(p.flow_id for p in batch)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(claimer, i)
    every = [flow_id for ids in claimed.values() for flow_id in ids]
    assert sorted(every) == [f.flow_id for f in flows]  # each step leased exactly once
    for s in stores:
        await s.close()


@pytest.mark.parametrize("threads", [True, False])
async def test_a_commit_on_one_server_wakes_wait_pending_on_another(
    postgres: Any, threads: bool
) -> None:
    """(PostgreSQL only: SQLite is one server's.) Without threads too: the waiter waits for
    its listening socket, never blocking trio's thread, and reads what came."""
    with postgres.schema() as url:
        here, there = PostgresStore(url), PostgresStore(url, threads=threads)
        await here.open()
        await there.open()
        await here.create_flow(flow())
        woke: list[int] = []

        async def waiter() -> None:
            woke.append(await there.wait_pending(0))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                await here.commit(WriteBatch(pending_put=[pending()]))
        assert woke == [1]
        await here.close()
        await there.close()


async def test_closing_a_store_without_threads_wakes_its_listener(postgres: Any) -> None:
    """A ``wait_pending`` waiting for the listening socket does not hold up ``close``."""
    with postgres.schema() as url:
        s = PostgresStore(url, threads=False)
        await s.open()
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.wait_pending, 0)
                await trio.testing.wait_all_tasks_blocked()
                await s.close()
                nursery.cancel_scope.cancel()


# -- flows --------------------------------------------------------------------------------------


async def test_create_flow_round_trips_every_field(store: SqliteStore) -> None:
    record = flow(sticky_worker="app-1", error={"type": "E", "message": "m"}, result=(1, [2]))
    await store.create_flow(record)
    assert await store.get_flow("f1") == record


async def test_empty_values_nones_and_args_that_are_the_step_input_round_trip(
    store_kind: StoreKind,
) -> None:
    # (_store_sql writes None and an empty map or list as blobs shared by every row, and a
    # flow's args once when its step input is the same list; sqlite binds None through an
    # adapter registered for it)
    s = store_kind.store()
    await s.open()
    args = [1, "two"]
    records = [
        flow("f1", args=args, step_input=args, state={}, result=None, sticky_worker=None),
        flow("f2", args=[], step_input=[], state={"k": []}, result={}),
        flow("f3", args=[{}], step_input=[[]], state={}, error=None, result=[]),
    ]
    await s.commit(WriteBatch(flows_created=records))
    moved = flow("f1", version=2, args=args, step_input=[], state={"n": None}, result=args)
    dispatch = DispatchRecord("f1", 1, "step", "charge", 1, "flow:orders", "queue", None, 1.0)
    await s.commit(WriteBatch(flows_upserted=[moved], dispatches=[dispatch]))
    assert [await s.get_flow(f"f{n}") for n in (1, 2, 3)] == [moved, *records[1:]]
    assert await s.dispatches("f1") == [dispatch]
    await s.close()


async def test_flows_sharing_a_definition_store_it_and_others_store_their_own(
    store: SqliteStore,
) -> None:
    # (_store_sql encodes a definition dict shared by many flows once, known by identity and
    # compared with a copy, and forgets what it knows past a few hundred definitions)
    shared = {"steps": [{"name": "charge"}], "rpcs": []}
    others = [{"steps": [{"name": f"refund{n}"}], "rpcs": ["r"]} for n in range(300)]
    batches = [WriteBatch(flows_created=[flow("a", definition=shared)])]
    batches += [
        WriteBatch(flows_created=[flow(f"o{n}", definition=d)]) for n, d in enumerate(others)
    ]
    batches.append(WriteBatch(flows_upserted=[flow("a", version=2, definition=shared)]))
    batches.append(WriteBatch(flows_created=[flow("b", definition=shared)]))
    for batch in batches:
        await store.commit(batch)
    assert await store.get_flow("a") == flow("a", version=2, definition=shared)
    assert await store.get_flow("b") == flow("b", definition=shared)
    assert [(await store.get_flow(f"o{n}")).definition for n in (0, 255, 256, 299)] == [
        others[n] for n in (0, 255, 256, 299)
    ]
    shared["rpcs"].append("refund")  # (a dict changed in place is encoded again)
    await store.commit(WriteBatch(flows_created=[flow("c", definition=shared)]))
    assert (await store.get_flow("c")).definition == {
        "steps": [{"name": "charge"}],
        "rpcs": ["refund"],
    }


async def test_get_flow_of_an_unknown_id_is_none(store: SqliteStore) -> None:
    assert await store.get_flow("nope") is None


async def test_create_flow_twice_raises_flow_exists(store: SqliteStore) -> None:
    await store.create_flow(flow())
    with pytest.raises(FlowExists) as info:
        await store.create_flow(flow(flow_type="other"))
    assert isinstance(info.value, KeyError)
    assert str(info.value) == "a flow with id 'f1' exists already"
    assert info.value.details == {"flow_id": "f1"}
    assert (await store.get_flow("f1")) == flow()


async def test_upsert_inserts_a_new_flow_whatever_its_version(store: SqliteStore) -> None:
    await store.commit(WriteBatch(flows_upserted=[flow(version=7)]))
    assert (await store.get_flow("f1")) == flow(version=7)


async def test_upsert_updates_with_the_next_version(store: SqliteStore) -> None:
    await store.create_flow(flow())
    done = flow(status="completed", result="ok", step_index=2, version=2, updated_at=1001.0)
    await store.commit(WriteBatch(flows_upserted=[done]))
    assert await store.get_flow("f1") == done


async def test_upsert_with_a_stale_version_raises_store_conflict(store: SqliteStore) -> None:
    await store.create_flow(flow())
    await store.commit(WriteBatch(flows_upserted=[flow(version=2, step_index=1)]))
    with pytest.raises(StoreConflict) as info:
        await store.commit(WriteBatch(flows_upserted=[flow(version=2, step_index=9)]))
    assert str(info.value) == (
        "flow 'f1': the update to version 2 expects stored version 1, but version 2 is stored"
        " (another writer updated it; read the flow again)"
    )
    assert info.value.details == {"flow_id": "f1", "expected": 1, "stored": 2}
    assert info.value.retryable
    assert (await store.get_flow("f1")) == flow(version=2, step_index=1)


async def test_a_refused_batch_leaves_no_trace(store: SqliteStore) -> None:
    await store.create_flow(flow())
    batch = WriteBatch(
        flows_created=[flow("f2")],
        attempts=[attempt()],
        dispatches=[dispatch()],
        pending_put=[pending()],
        flows_upserted=[flow(version=5)],  # stale: refuses the whole batch
    )
    with pytest.raises(StoreConflict):
        await store.commit(batch)
    assert await store.get_flow("f2") is None
    assert await store.attempts("f1") == []
    assert await store.dispatches("f1") == []
    assert await store.pending("f1") == []


async def test_a_refused_batch_alone_in_its_transaction_is_counted_and_leaves_no_trace(
    store: SqliteStore,
) -> None:
    await store.create_flow(flow())
    before = store.statistics()
    (outcome,) = await store.commit_many([WriteBatch(flows_created=[flow(), flow("f2")])])
    assert isinstance(outcome, FlowExists)
    assert await store.get_flow("f2") is None
    after = store.statistics()
    assert after.transactions == before.transactions + 1
    assert (after.batches, after.refused) == (before.batches, before.refused + 1)
    await store.commit(WriteBatch(flows_created=[flow("f2")]))  # the connection is usable
    assert await store.get_flow("f2") == flow("f2")


async def test_list_flows_is_newest_first_and_filters(store: SqliteStore) -> None:
    records = [
        flow("a", created_at=1.0),
        flow("b", created_at=3.0, status="completed"),
        flow("c", created_at=2.0, flow_type="mail"),
        flow("d", created_at=3.0),  # same time as b, inserted later: listed before it
        flow("e", created_at=0.5, status="failed"),
        flow("f", created_at=4.0, status="cancelled", flow_type="mail"),
    ]
    await store.commit(WriteBatch(flows_created=records))
    ids = [r.flow_id for r in await store.list_flows()]
    assert ids == ["f", "d", "b", "c", "a", "e"]
    assert await store.list_flows() == sorted(records, key=lambda r: ids.index(r.flow_id))
    assert [r.flow_id for r in await store.list_flows(limit=3)] == ["f", "d", "b"]
    orders = await store.list_flows(flow_type="orders")
    assert [r.flow_id for r in orders] == ["d", "b", "a", "e"]
    assert [r.flow_id for r in await store.list_flows(flow_type="orders", limit=2)] == ["d", "b"]
    assert [r.flow_id for r in await store.list_flows(status="running")] == ["d", "c", "a"]
    running_orders = await store.list_flows(flow_type="orders", status="running", limit=1)
    assert [r.flow_id for r in running_orders] == ["d"]
    assert await store.list_flows(limit=0) == []
    assert await store.list_flows(flow_type="none") == []


async def test_list_flows_refuses_a_negative_limit(store: SqliteStore) -> None:
    with pytest.raises(StoreError, match=r"list_flows: limit must be an int >= 0 \(got -1\)"):
        await store.list_flows(limit=-1)


async def test_a_value_without_a_wire_form_is_refused(store: SqliteStore) -> None:
    with pytest.raises(StoreError, match="FlowRecord 'f1': state has no wire form"):
        await store.create_flow(flow(state={"x": object()}))
    assert await store.get_flow("f1") is None


async def test_text_holding_a_nul_is_refused_alone_and_never_found(store: SqliteStore) -> None:
    """PostgreSQL's text cannot hold a NUL character, SQLite's could: both refuse it, the
    batch alone (the others of its group are stored), and a read naming it finds nothing."""
    await store.create_flow(flow())
    bad = [
        WriteBatch(flows_created=[flow("a\x00b")]),
        WriteBatch(flows_upserted=[flow(version=2, flow_type="x\x00")]),
        WriteBatch(attempts=[attempt(worker_id="w\x00")]),
        WriteBatch(dispatches=[dispatch(queue="flow:\x00")]),
        WriteBatch(pending_put=[pending(step="s\x00")]),
        WriteBatch(pending_done=[("f\x00", 0)]),
    ]
    outcomes = await store.commit_many([*bad, WriteBatch(flows_created=[flow("ok")])])
    for outcome in outcomes[:-1]:
        assert isinstance(outcome, StoreError)
        assert "text may not hold a NUL character" in str(outcome)
    assert outcomes[-1] is None and await store.get_flow("ok") == flow("ok")
    (alone,) = await store.commit_many(bad[:1])
    assert isinstance(alone, StoreError)
    assert await store.get_flow("f1") == flow()
    assert await store.get_flow("a\x00b") is None
    assert await store.list_flows(flow_type="x\x00") == []
    assert await store.attempts("a\x00b") == await store.pending("a\x00b") == []
    assert await store.dispatches("a\x00b") == []


# -- attempts and dispatches --------------------------------------------------------------------


async def test_attempts_come_back_in_write_order(store: SqliteStore) -> None:
    await store.create_flow(flow())
    first = attempt(n=1)
    second = attempt(n=2, status="completed", error=None, worker_id=None)
    await store.commit(WriteBatch(attempts=[first]))
    await store.commit(WriteBatch(attempts=[second, attempt(n=3, status="lost")]))
    assert await store.attempts("f1") == [first, second, attempt(n=3, status="lost")]
    assert await store.attempts("other") == []


async def test_dispatches_keep_the_last_limit_oldest_first(store: SqliteStore) -> None:
    await store.create_flow(flow())
    records = [dispatch(delivery=n, reason="sticky" if n % 2 else "delivered") for n in range(5)]
    await store.commit(WriteBatch(dispatches=records))
    assert await store.dispatches("f1") == records
    assert await store.dispatches("f1", limit=2) == records[3:]


async def test_records_of_an_unknown_flow_are_refused(store: SqliteStore) -> None:
    with pytest.raises(StoreError, match="must name a flow stored in or before their batch"):
        await store.commit(WriteBatch(attempts=[attempt("ghost")]))
    with pytest.raises(StoreError, match="must name a flow"):
        await store.commit(WriteBatch(pending_put=[pending("ghost")]))


async def test_commit_many_refuses_a_batch_alone_in_one_transaction(store: SqliteStore) -> None:
    before = store.statistics().transactions
    outcomes = await store.commit_many(
        [
            WriteBatch(flows_created=[flow("a")]),
            WriteBatch(flows_created=[flow("a")]),  # exists: the batch before created it
            WriteBatch(flows_upserted=[flow("a", version=2)]),
        ]
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], FlowExists)
    assert (await store.get_flow("a")) == flow("a", version=2)
    stats = store.statistics()
    assert stats.transactions == before + 1
    assert (stats.batches, stats.refused) == (2, 1)


async def test_a_group_of_batches_on_separate_flows_reads_back_as_committed_one_by_one(
    store: SqliteStore,
) -> None:
    # (on PostgreSQL one statement per table, _postgres_batches: the same rows as batch by batch)
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b")], pending_put=[pending("b")]))
    group = [
        WriteBatch(
            flows_created=[flow("c"), flow("d")],
            attempts=[attempt("c", 1), attempt("c", 2)],
            dispatches=[dispatch("c", 1), dispatch("d", 2)],
            pending_put=[pending("c", 0), pending("c", 1)],
            pending_done=[("c", 1), ("c", 9)],
        ),
        WriteBatch(
            flows_upserted=[flow("a", version=2, status="completed", sticky_worker="w9")],
            pending_put=[pending("a", lease_owner="s1", lease_expires=9.0)],
            owner="s1",
        ),
        WriteBatch(
            flows_upserted=[flow("b", version=2, result={"r": b"\x00"})],
            attempts=[attempt("b", 1, worker_id=None)],
            pending_done=[("b", 0)],
        ),
    ]
    assert await store.commit_many(group) == [None, None, None]
    assert await store.get_flow("a") == flow("a", version=2, status="completed", sticky_worker="w9")
    assert await store.get_flow("b") == flow("b", version=2, result={"r": b"\x00"})
    assert await store.get_flow("d") == flow("d")
    assert await store.attempts("c") == [attempt("c", 1), attempt("c", 2)]
    assert await store.attempts("b") == [attempt("b", 1, worker_id=None)]
    assert await store.dispatches("d") == [dispatch("d", 2)]
    assert await store.pending("c") == [pending("c", 0)]
    assert await store.pending("a") == [pending("a", lease_owner="s1", lease_expires=9.0)]
    assert await store.pending("b") == []


async def test_a_group_of_batches_on_separate_flows_refuses_only_the_refused_ones(
    store: SqliteStore,
) -> None:
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b")]))
    before = store.statistics()
    outcomes = await store.commit_many(
        [
            WriteBatch(flows_created=[flow("c")], attempts=[attempt("c")]),
            WriteBatch(flows_created=[flow("a")]),  # exists
            WriteBatch(flows_upserted=[flow("b", version=3)]),  # stale
            WriteBatch(attempts=[attempt("nobody")]),  # names no flow
            WriteBatch(flows_upserted=[flow("d", version=4)], dispatches=[dispatch("d")]),
        ]
    )
    assert outcomes[0] is None and outcomes[4] is None
    assert isinstance(outcomes[1], FlowExists)
    assert isinstance(outcomes[2], StoreConflict)
    assert type(outcomes[3]) is StoreError
    assert await store.attempts("c") == [attempt("c")]
    assert await store.get_flow("d") == flow("d", version=4)
    assert await store.attempts("nobody") == []
    after = store.statistics()
    assert (after.batches, after.refused) == (before.batches + 2, before.refused + 3)


def test_group_rows_go_one_by_one_when_batches_could_meet() -> None:
    # (_store_sql: only batches whose rows cannot meet go in one statement per table, on
    # SQLite and PostgreSQL alike)
    from apps.matching._store_sql import group_rows

    rows = group_rows(
        [
            WriteBatch(flows_created=[flow("a")], pending_done=[("a", 0)]),
            WriteBatch(flows_upserted=[flow("b", version=2)], owner="s1"),
        ]
    )
    assert rows is not None
    assert [r[0] for r in rows.created] == ["a"] and rows.pending_done == [("a", 0)]
    assert rows.updated[0][-3:] == ("b", 1, "s1")
    one_by_one = [
        [WriteBatch(flows_created=[flow("a")]), WriteBatch(attempts=[attempt("a")])],
        [WriteBatch(flows_created=[flow("a")], flows_upserted=[flow("a", version=2)])],
        [WriteBatch(pending_put=[pending("a"), pending("a", attempt=2)])],
        [WriteBatch(flows_created=[flow("a\x00")])],
        [WriteBatch(flows_upserted=[flow("a", version=2, sticky_worker="w\x00")])],
        [WriteBatch(attempts=[attempt("a", status="failed", step="s\x00")])],
        [WriteBatch(dispatches=[dispatch("a", reason="r\x00")])],
        [WriteBatch(pending_put=[pending("a", lease_owner="s\x00", lease_expires=1.0)])],
        [WriteBatch(pending_done=[("a\x00", 0)])],
        [WriteBatch(flows_created=[flow("a", state={"x": object()})])],
    ]
    for batches in one_by_one:
        assert group_rows(batches) is None, batches
    # (bytes and numbers hold no text: a NUL in them goes in the group)
    assert group_rows([WriteBatch(flows_created=[flow("a", state={"b": b"\x00"})])]) is not None


async def test_a_group_commit_on_sqlite_runs_one_statement_per_table() -> None:
    # (_sqlite_batches: a group's batches in at most six statements, without savepoints)
    store = SqliteStore(":memory:", threads=False)
    await store.open()
    try:
        await store.commit(WriteBatch(flows_created=[flow("a")], pending_put=[pending("a")]))
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        group = [
            WriteBatch(
                flows_created=[flow("b"), flow("c")],
                attempts=[attempt("b", 1), attempt("c", 1)],
                dispatches=[dispatch("b", 1), dispatch("c", 2)],
                pending_put=[pending("b"), pending("c")],
            ),
            WriteBatch(
                flows_upserted=[flow("a", version=2, status="completed")],
                pending_done=[("a", 0)],
                owner="s1",
            ),
        ]
        assert await store.commit_many(group) == [None, None]
        kinds = " ".join(statement.split()[0] for statement in statements)
        assert kinds == "BEGIN INSERT UPDATE INSERT INSERT INSERT DELETE COMMIT"
        assert await store.get_flow("a") == flow("a", version=2, status="completed")
        assert await store.pending("a") == [] and await store.pending("c") == [pending("c")]
        assert await store.attempts("c") == [attempt("c", 1)]
        # (a power of two rows per statement: three flows go in two, of 2 and 1 rows)
        statements.clear()
        three = [flow("x"), flow("y"), flow("z")]
        assert await store.commit_many([WriteBatch(flows_created=three)]) == [None]
        assert " ".join(statement.split()[0] for statement in statements) == (
            "BEGIN INSERT INSERT COMMIT"
        )
        assert [await store.get_flow(f.flow_id) for f in three] == three
    finally:
        await store.close()


async def test_a_threaded_sqlite_store_checkpoints_its_wal_off_the_commit_path(
    tmp_path: Path,
) -> None:
    # (_sqlite_checkpoints: a COMMIT runs SQLite's own checkpoint only past
    # WRITER_CHECKPOINT_PAGES; every CHECKPOINT_EVERY transactions one runs in a thread, on a
    # connection of its own)
    path = str(tmp_path / "store.sqlite3")
    store = SqliteStore(path)
    await store.open()
    try:
        checkpoints = store._checkpoints
        assert checkpoints is not None
        pages = store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert pages == (WRITER_CHECKPOINT_PAGES,)
        size = Path(path).stat().st_size
        for i in range(CHECKPOINT_EVERY - 1):
            await store.commit(WriteBatch(flows_created=[flow(f"f{i}")]))
        await trio.to_thread.run_sync(checkpoints.wait_idle)
        assert checkpoints.checkpoints == 0 and Path(path).stat().st_size == size
        await store.commit(WriteBatch(flows_created=[flow("last")]))
        await trio.to_thread.run_sync(checkpoints.wait_idle)
        assert checkpoints.checkpoints == 1
        assert Path(path).stat().st_size > size  # (the WAL's pages, copied into the file)
    finally:
        await store.close()
    assert store._checkpoints is None and checkpoints._conn is None
    again = SqliteStore(path, threads=False)
    await again.open()
    try:
        assert await again.get_flow("last") == flow("last")
        assert again._checkpoints is None  # (without threads, SQLite's own checkpoints)
        assert again._conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (1000,)
    finally:
        await again.close()


async def test_a_threaded_sqlite_stores_wal_starts_again_under_steady_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (a checkpoint racing the commits never finds every frame copied: the writer's own, past
    # WRITER_CHECKPOINT_PAGES, lets the WAL start again from its beginning; here with none of
    # WalCheckpoints' to race it, whose hold on the checkpoint lock only puts it off)
    monkeypatch.setattr("apps.matching._sqlite_store.WRITER_CHECKPOINT_PAGES", 16)
    monkeypatch.setattr(
        "apps.matching._sqlite_store.WalCheckpoints", partial(WalCheckpoints, every=10**9)
    )
    path = str(tmp_path / "store.sqlite3")
    store = SqliteStore(path)
    await store.open()
    try:
        await store.commit(WriteBatch(flows_created=[flow("a")]))
        for version in range(2, 300):  # (~2 pages of WAL a commit: ~600 pages in all)
            state = {"blob": bytes([version % 256]) * 6000}
            await store.commit(WriteBatch(flows_upserted=[flow("a", version=version, state=state)]))
        wal_pages = Path(path + "-wal").stat().st_size // 4096
        assert wal_pages < 40, wal_pages  # (16 and a commit's, not ~600)
        assert (await store.get_flow("a")) == flow("a", version=299, state=state)
    finally:
        await store.close()


def _on_trios_thread(store: Any) -> list[bool]:
    """Where each of ``store``'s transactions runs from now on: True for trio's thread (the
    caller's, this one), False for one of its own."""
    trio_thread, real, where = threading.get_ident(), store._commit_many, []

    def commit_many(conn: Any, batches: list[WriteBatch]) -> Any:
        where.append(threading.get_ident() == trio_thread)
        return real(conn, batches)

    store._commit_many = commit_many
    return where


async def _commit_soon(store: Any, batches: list[WriteBatch]) -> tuple[bool, Any]:
    """``store.commit_soon(batches)``: whether its outcome came before it returned, and the
    outcome (waited for otherwise)."""
    got: list[Any] = []
    ended = trio.Event()

    def done(result: Any) -> None:
        got.append(result)
        ended.set()

    assert store.commit_soon(batches, done)
    at_once = bool(got)
    await ended.wait()
    return at_once, got[0].unwrap()


async def test_commit_soon_runs_a_group_of_up_to_inline_records_on_trios_thread_busy_or_idle(
    store_kind: StoreKind,
) -> None:
    # (SqlStore.commit_soon: SQLite's groups of up to INLINE_RECORDS skip the thread's
    # hand-off, whether or not other tasks are runnable; a larger group goes to a thread, or
    # nowhere with ``here_only``, as ``commits_here`` says; PostgreSQL's always go to a thread)
    store = store_kind.store(threads=True)
    await store.open()
    try:
        where = _on_trios_thread(store)
        sqlite = store_kind.name == "sqlite"
        await trio.testing.wait_all_tasks_blocked()
        small = [WriteBatch(flows_created=[flow("a")]), WriteBatch(flows_created=[flow("b")])]
        assert await _commit_soon(store, small) == (sqlite, [None, None])
        large = [flow(f"l{i}") for i in range(INLINE_RECORDS + 1)]
        assert (store.commits_here(INLINE_RECORDS), store.commits_here(len(large))) == (
            sqlite,
            False,
        )
        assert not store.commit_soon([WriteBatch(flows_created=large)], print, here_only=True)
        assert await _commit_soon(store, [WriteBatch(flows_created=large)]) == (False, [None])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.lowlevel.checkpoint)  # (runnable now: a busy loop)
            busy = [WriteBatch(flows_created=[flow("c")])]
            assert store.commits_here(1) is sqlite
            assert await _commit_soon(store, busy) == (sqlite, [None])
        assert where == [sqlite, False, sqlite]
        assert store.statistics().inline == 2 * int(sqlite)
        assert [await store.get_flow(f) for f in "abc"] == [flow("a"), flow("b"), flow("c")]
        # (refusals come back as they do from a thread: a duplicate flow, alone)
        again = [WriteBatch(flows_created=[flow("a")]), WriteBatch(flows_created=[flow("d")])]
        await trio.testing.wait_all_tasks_blocked()
        at_once, outcomes = await _commit_soon(store, again)
        assert at_once is sqlite
        assert isinstance(outcomes[0], FlowExists) and outcomes[1] is None
    finally:
        await store.close()


async def test_commits_on_trios_thread_leave_the_wal_checkpoints_in_their_thread(
    tmp_path: Path,
) -> None:
    store = SqliteStore(str(tmp_path / "store.sqlite3"))
    await store.open()
    try:
        where = _on_trios_thread(store)
        checkpoints = store._checkpoints
        assert checkpoints is not None
        checkpointed_on: list[bool] = []
        real = checkpoints._checkpoint

        def checkpoint() -> None:
            checkpointed_on.append(threading.get_ident() == trio_thread)
            real()

        trio_thread = threading.get_ident()
        checkpoints._checkpoint = checkpoint  # type: ignore[method-assign]
        for i in range(CHECKPOINT_EVERY):
            await trio.testing.wait_all_tasks_blocked()
            assert await _commit_soon(store, [WriteBatch(flows_created=[flow(f"f{i}")])]) == (
                True,
                [None],
            )
        await trio.to_thread.run_sync(checkpoints.wait_idle)
        assert where == [True] * CHECKPOINT_EVERY
        assert checkpoints.checkpoints == 1 and checkpointed_on == [False]
    finally:
        await store.close()


async def test_a_failed_wal_checkpoint_is_logged_and_the_next_one_tries_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = WalCheckpoints(str(tmp_path), every=2)  # (a directory: it cannot open)
    for _ in range(4):
        checkpoints.committed()
        await trio.to_thread.run_sync(checkpoints.wait_idle)
    assert checkpoints.checkpoints == 0
    failed = [r for r in caplog.records if "a checkpoint of" in r.getMessage()]
    assert len(failed) == 2 and "the next one tries again" in failed[0].getMessage()
    checkpoints.close()
    checkpoints.committed()
    checkpoints.committed()
    assert checkpoints._idle.is_set()  # (closed: none starts)


async def test_a_grouped_update_of_a_flows_type_and_creation_time_is_stored(
    store: SqliteStore,
) -> None:
    # (SQLite's group update sets only what a Step changes; one that changes more is rolled
    # back and goes one by one, in one transaction all the same)
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b")]))
    before = store.statistics()
    moved = flow("a", version=2, flow_type="refunds", created_at=5.0)
    done = flow("b", version=2, status="completed")
    group = [WriteBatch(flows_upserted=[moved]), WriteBatch(flows_upserted=[done])]
    assert await store.commit_many(group) == [None, None]
    assert await store.get_flow("a") == moved and await store.get_flow("b") == done
    assert await store.list_flows(flow_type="refunds") == [moved]
    after = store.statistics()
    assert (after.transactions, after.batches) == (before.transactions + 1, before.batches + 2)


# -- pending steps, claims, leases --------------------------------------------------------------


async def test_pending_put_replaces_by_key_and_done_deletes(store: SqliteStore) -> None:
    await store.create_flow(flow())
    await store.commit(WriteBatch(pending_put=[pending(index=0), pending(index=1)]))
    retry = pending(index=0, attempt=2, not_before=50.0)
    await store.commit(WriteBatch(pending_put=[retry], pending_done=[("f1", 1), ("f1", 7)]))
    assert await store.pending("f1") == [retry]


async def test_claim_pending_leases_due_free_steps_earliest_first(store: SqliteStore) -> None:
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b")]))
    steps = [
        pending("b", 0, not_before=2.0),
        pending("a", 0, not_before=2.0),
        pending("a", 1, not_before=1.0),
        pending("b", 1, not_before=99.0),  # not due yet
    ]
    await store.commit(WriteBatch(pending_put=steps))
    claimed = await store.claim_pending("n1", now=10.0, lease_seconds=30.0, limit=2)
    assert claimed == [
        attrs.evolve(steps[2], lease_owner="n1", lease_expires=40.0),
        attrs.evolve(steps[1], lease_owner="n1", lease_expires=40.0),
    ]
    assert await store.pending("a") == claimed[::-1]
    rest = await store.claim_pending("n2", now=10.0, lease_seconds=30.0, limit=10)
    assert rest == [attrs.evolve(steps[0], lease_owner="n2", lease_expires=40.0)]
    assert await store.claim_pending("n3", now=10.0, lease_seconds=30.0, limit=10) == []
    assert store.statistics().claimed == 3


async def test_claims_due_together_go_by_flow_id_in_code_point_order(store: SqliteStore) -> None:
    """As Python sorts strings, on both stores (PostgreSQL's text is compared in the "C"
    collation: a database's own, en_US say, puts "a" before "B" and skips punctuation)."""
    ids = ["ab", "a_c", "aB", "a-b", "B", "é", "z"]
    await store.commit(WriteBatch(flows_created=[flow(i) for i in ids]))
    await store.commit(WriteBatch(pending_put=[pending(i, not_before=1.0) for i in ids]))
    claimed = await store.claim_pending("n1", now=10.0, lease_seconds=30.0, limit=len(ids))
    assert [p.flow_id for p in claimed] == sorted(ids)


async def test_an_expired_lease_can_be_claimed_by_another_owner(store: SqliteStore) -> None:
    await store.create_flow(flow())
    await store.commit(WriteBatch(pending_put=[pending()]))
    assert len(await store.claim_pending("n1", now=0.0, lease_seconds=5.0, limit=1)) == 1
    assert await store.claim_pending("n2", now=4.9, lease_seconds=5.0, limit=1) == []
    stolen = await store.claim_pending("n2", now=5.0, lease_seconds=5.0, limit=1)
    assert stolen == [pending(lease_owner="n2", lease_expires=10.0)]
    assert await store.renew_leases("n1", now=6.0, lease_seconds=5.0) == 0  # not n1's any more


async def test_renew_leases_extends_only_the_owners_leases(store: SqliteStore) -> None:
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b")]))
    await store.commit(WriteBatch(pending_put=[pending("a"), pending("b")]))
    await store.claim_pending("n1", now=0.0, lease_seconds=5.0, limit=1)
    await store.claim_pending("n2", now=0.0, lease_seconds=5.0, limit=1)
    assert await store.renew_leases("n1", now=4.0, lease_seconds=5.0) == 1
    assert await store.claim_pending("n3", now=6.0, lease_seconds=5.0, limit=5) == [
        pending("b", lease_owner="n3", lease_expires=11.0)
    ]
    assert await store.pending("a") == [pending("a", lease_owner="n1", lease_expires=9.0)]


async def test_release_leases_frees_the_owners_steps(store: SqliteStore) -> None:
    await store.create_flow(flow())
    await store.commit(WriteBatch(pending_put=[pending()]))
    await store.claim_pending("n1", now=0.0, lease_seconds=60.0, limit=1)
    assert await store.release_leases("n1") == 1
    assert await store.release_leases("n1") == 0
    assert await store.claim_pending("n2", now=1.0, lease_seconds=60.0, limit=1) == [
        pending(lease_owner="n2", lease_expires=61.0)
    ]


async def test_claim_steps_names_the_owner_each_step_was_taken_from(store: SqliteStore) -> None:
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b")]))
    dead = pending("b", lease_owner="n1", lease_expires=5.0)
    await store.commit(WriteBatch(pending_put=[pending("a"), dead]))
    claims = await store.claim_steps("n2", now=5.0, lease_seconds=10.0, limit=10)
    assert claims == [
        Claim(pending("a", lease_owner="n2", lease_expires=15.0), None),  # free
        Claim(pending("b", lease_owner="n2", lease_expires=15.0), "n1"),  # n1's lease expired
    ]
    assert all(claim.held_by("n2") for claim in claims)
    assert store.statistics().claimed == 2


async def test_claim_flow_takes_a_free_expired_or_own_step_and_names_a_live_owner(
    store: SqliteStore,
) -> None:
    await store.create_flow(flow("a"))
    assert await store.claim_flow("a", "n1", 0.0, 10.0) is None  # no pending step
    backing_off = pending("a", 2, not_before=99.0)
    await store.commit(WriteBatch(pending_put=[backing_off]))

    def leased(owner: str, expires: float) -> PendingStep:
        return attrs.evolve(backing_off, lease_owner=owner, lease_expires=expires)

    # free (whatever its not_before): n1's now
    assert await store.claim_flow("a", "n1", 0.0, 10.0) == Claim(leased("n1", 10.0), None)
    # n1's live lease: left alone, and named
    held = await store.claim_flow("a", "n2", 5.0, 10.0)
    assert held == Claim(leased("n1", 10.0), "n1") and not held.held_by("n2")
    # its own: renewed
    assert await store.claim_flow("a", "n1", 6.0, 10.0) == Claim(leased("n1", 16.0), "n1")
    # expired: taken over
    assert await store.claim_flow("a", "n2", 16.0, 10.0) == Claim(leased("n2", 26.0), "n1")
    assert await store.pending("a") == [leased("n2", 26.0)]


async def test_adopt_leases_takes_every_step_of_sqlite_and_its_own_of_postgresql(
    store: SqliteStore,
) -> None:
    await store.commit(WriteBatch(flows_created=[flow("a"), flow("b"), flow("c")]))
    steps = [
        pending("a", lease_owner="old", lease_expires=50.0),  # a previous run's, or a live peer's
        pending("b", lease_owner="me", lease_expires=50.0),  # this server's, from before
        pending("c"),
    ]
    await store.commit(WriteBatch(pending_put=steps))
    adopted = await store.adopt_leases("me", 10.0, 15.0)

    def mine(flow_id: str) -> PendingStep:
        return pending(flow_id, lease_owner="me", lease_expires=25.0)

    if isinstance(store, PostgresStore):  # shared: other owners' leases run on
        assert adopted == [Claim(mine("b"), "me")]
        assert await store.pending("a") == [steps[0]]
        assert await store.pending("c") == [steps[2]]
    else:  # SQLite: one server per file, so every lease is a previous run's
        assert adopted == [Claim(mine("a"), "old"), Claim(mine("b"), "me"), Claim(mine("c"), None)]


async def test_a_fenced_update_is_refused_while_another_owner_leases_the_flows_step(
    store: SqliteStore,
) -> None:
    await store.create_flow(flow())
    await store.commit(WriteBatch(pending_put=[pending(lease_owner="n2", lease_expires=1.0)]))
    update = WriteBatch(flows_upserted=[flow(version=2)], owner="n1")
    with pytest.raises(StoreConflict) as caught:
        await store.commit(update)  # (expired or not, n2's lease: n2 took the flow over)
    assert caught.value.details == {"flow_id": "f1", "owner": "n1", "holder": "n2"}
    assert await store.get_flow("f1") == flow()
    await store.commit(WriteBatch(flows_upserted=[flow(version=2)], owner="n2"))
    await store.commit(WriteBatch(flows_upserted=[flow(version=3)]))  # (unfenced)
    await store.commit(WriteBatch(pending_done=[("f1", 0)]))
    await store.commit(WriteBatch(flows_upserted=[flow(version=4)], owner="n1"))  # no step
    assert (await store.get_flow("f1")) == flow(version=4)
    with pytest.raises(TypeError, match=r"WriteBatch\.owner must be None or a non-empty str"):
        await store.commit(WriteBatch(owner=""))


async def test_wait_pending_wakes_when_a_commit_puts_free_steps(store: SqliteStore) -> None:
    await store.create_flow(flow())
    woke: list[int] = []

    async def waiter() -> None:
        woke.append(await store.wait_pending(0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        await store.commit(WriteBatch(attempts=[attempt()]))  # no pending step: no wake-up
        # a leased step (the engine's are leased to it): nobody else could claim it
        leased = pending(index=1, lease_owner="n1", lease_expires=9.0)
        await store.commit(WriteBatch(pending_put=[leased]))
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        await store.commit(WriteBatch(pending_put=[pending()]))
    assert woke == [1]
    assert await store.wait_pending(0) == 1  # already past: returns at once


# -- StoreServer --------------------------------------------------------------------------------


async def test_server_group_commits_concurrent_batches_durably(store_kind: StoreKind) -> None:
    path = store_kind.durable
    n = 200
    async with otp.open_node():
        await StoreServer.start_link(store_kind.store(path, threads=True), name="matching_store")

        async def writer(i: int) -> None:
            await StoreServer.create_flow(flow(f"f{i:03}", created_at=float(i)))

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(writer, i)
        stats = await StoreServer.statistics()
        assert stats.batches == n
        assert stats.store.batches == n
        assert stats.groups == stats.store.transactions < n
        assert stats.largest_group > 1
        assert (stats.queued, stats.in_flight) == (0, 0)
        await otp.GenServer.stop("matching_store")
    reopened = store_kind.store(path)
    await reopened.open()
    listed = await reopened.list_flows(limit=n + 1)
    assert [r.flow_id for r in listed] == [f"f{i:03}" for i in reversed(range(n))]
    await reopened.close()


async def test_server_commit_nowait_tells_the_sender_each_batch_is_durable_or_refused(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node():
        await StoreServer.start_link(store_kind.store(threads=True), name="matching_store")
        me = otp.self()
        StoreServer.commit_nowait(WriteBatch(flows_created=[flow()]), me, "first")
        StoreServer.commit_nowait(WriteBatch(flows_created=[flow()]), me, "again")
        StoreServer.commit_nowait(WriteBatch(attempts=[flow()]), me, "bad")  # type: ignore[list-item]
        StoreServer.commit_nowait(7, me, "not a batch")  # type: ignore[arg-type]
        got = {m.tag: m for m in [await otp.receive(timeout=5) for _ in range(4)]}
        stats = await StoreServer.statistics()
    assert got["first"] == BatchCommitted("first", None)
    assert isinstance(got["again"].error, FlowExists)
    assert isinstance(got["bad"].error, StoreError)  # refused at once, before any I/O
    assert "WriteBatch.attempts must be a list of AttemptRecord" in str(got["bad"].error)
    assert isinstance(got["not a batch"].error, StoreError)
    assert stats.batches == 2  # the bad batch never reached the store


async def test_server_commit_nowait_on_an_idle_server_is_answered_in_the_senders_own_task(
    store_kind: StoreKind,
) -> None:
    # (StoreHandle: on SQLite an idle server's group commits in the sender's task, the
    # server's not woken; PostgreSQL's commits go by message, to a thread; a message of another
    # sender still in the server's mailbox sends it by message, behind that one)
    sqlite = store_kind.name == "sqlite"
    async with otp.open_node():
        server = await StoreServer.start_link(store_kind.store(threads=True), name="matching_store")
        await trio.testing.wait_all_tasks_blocked()
        handled = _handled(server)
        StoreServer.commit_nowait(WriteBatch(flows_created=[flow("a")]), otp.self(), "a")
        answered_at_once = otp.message_queue_len() == 1
        assert await otp.receive(timeout=5) == BatchCommitted("a", None)
        assert (answered_at_once, _handled(server) == handled) == (sqlite, sqlite)
        otp.send(server, "another sender's message")
        StoreServer.commit_nowait(WriteBatch(flows_created=[flow("b")]), otp.self(), "b")
        assert otp.message_queue_len() == 0
        assert await otp.receive(timeout=5) == BatchCommitted("b", None)
        assert [r.flow_id for r in await StoreServer.list_flows()] == ["b", "a"]
        stats = await StoreServer.statistics()
    assert (stats.groups, stats.batches, stats.in_flight) == (2, 2, 0)


def _handled(server: otp.Pid) -> int:
    info = otp.process_info(server)
    assert info is not None
    return info.messages_handled


async def test_server_refuses_a_conflicting_batch_alone(store_kind: StoreKind) -> None:
    async with otp.open_node():
        await StoreServer.start_link(store_kind.store(threads=True), name="matching_store")
        await StoreServer.create_flow(flow())
        outcomes: dict[int, Any] = {}

        async def update(i: int) -> None:
            try:
                await StoreServer.commit(WriteBatch(flows_upserted=[flow(version=2, result=i)]))
            except StoreConflict as exc:
                outcomes[i] = exc
            else:
                outcomes[i] = None

        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(update, i)
        winners = [i for i, outcome in outcomes.items() if outcome is None]
        assert len(winners) == 1
        assert all(isinstance(outcomes[i], StoreConflict) for i in outcomes if i != winners[0])
        assert (await StoreServer.get_flow("f1")) == flow(version=2, result=winners[0])
        with pytest.raises(FlowExists, match="a flow with id 'f1' exists already"):
            await StoreServer.create_flow(flow())


async def test_server_answers_every_read_and_lease_call(store_kind: StoreKind) -> None:
    async with otp.open_node():
        await StoreServer.start_link(store_kind.store(threads=True), name="store2")
        s = "store2"
        batch = WriteBatch(
            flows_created=[flow("a"), flow("b", flow_type="mail", created_at=2000.0)],
            attempts=[attempt("a")],
            dispatches=[dispatch("a", 1), dispatch("a", 2)],
            pending_put=[pending("a")],
        )
        await StoreServer.commit(batch, server=s)
        assert await StoreServer.get_flow("a", server=s) == flow("a")
        assert [r.flow_id for r in await StoreServer.list_flows(server=s)] == ["b", "a"]
        mail = await StoreServer.list_flows(flow_type="mail", status="running", server=s)
        assert [r.flow_id for r in mail] == ["b"]
        assert await StoreServer.attempts("a", server=s) == [attempt("a")]
        assert await StoreServer.dispatches("a", 1, server=s) == [dispatch("a", 2)]
        assert await StoreServer.pending("a", server=s) == [pending("a")]
        leased = pending("a", lease_owner="n1", lease_expires=15.0)
        assert await StoreServer.claim_pending("n1", 10.0, 5.0, 10, server=s) == [leased]
        assert await StoreServer.renew_leases("n1", 12.0, 5.0, server=s) == 1
        assert await StoreServer.release_leases("n1", server=s) == 1
        claims = await StoreServer.claim_steps("n2", 13.0, 5.0, 10, server=s)
        assert claims == [Claim(pending("a", lease_owner="n2", lease_expires=18.0), None)]
        assert await StoreServer.claim_flow("a", "n2", 14.0, 5.0, server=s) == Claim(
            pending("a", lease_owner="n2", lease_expires=19.0), "n2"
        )
        # (SQLite is one server's alone: it adopts every lease; PostgreSQL only its own)
        adopted = [Claim(pending("a", lease_owner="n3", lease_expires=20.0), "n2")]
        assert await StoreServer.adopt_leases("n3", 15.0, 5.0, server=s) == (
            adopted if store_kind.name == "sqlite" else []
        )
        with pytest.raises(StoreError, match="limit must be an int >= 0"):
            await StoreServer.list_flows(limit=-5, server=s)


async def test_server_wait_pending_answers_after_a_put(store_kind: StoreKind) -> None:
    async with otp.open_node():
        await StoreServer.start_link(store_kind.store(threads=True), name="matching_store")
        await StoreServer.create_flow(flow())
        woke: list[int] = []

        async def waiter() -> None:
            woke.append(await StoreServer.wait_pending(0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert woke == []
            await StoreServer.commit(WriteBatch(pending_put=[pending()]))
        assert woke == [1]
        assert await StoreServer.wait_pending(0) == 1


async def test_server_start_fails_on_a_newer_schema(store_kind: StoreKind) -> None:
    s = store_kind.store(store_kind.durable)
    await s.open()
    await s.close()
    store_kind.query("INSERT INTO schema_migrations VALUES (99, 0)")
    async with otp.open_node():
        with pytest.raises(otp.StartError) as info:
            await StoreServer.start(store_kind.store(store_kind.durable), name="matching_store")
        reason = info.value.reason
        assert isinstance(reason, otp.Crash)
        assert "schema version 99, newer than this code's" in str(reason.exception)


async def test_server_closes_its_store_when_stopped(store_kind: StoreKind) -> None:
    store = store_kind.store(threads=True)
    async with otp.open_node():
        await StoreServer.start_link(store, name="matching_store")
        await StoreServer.create_flow(flow())
        await otp.GenServer.stop("matching_store")
    with pytest.raises(StoreError, match="is closed"):
        await store.get_flow("f1")


class HeldCommits:
    """Holds a threaded store's transactions in their thread (``_commit_many``) until the test
    lets each go; ``fail`` makes the next one raise instead of running. Every transaction runs
    in a thread of its own unless ``inline`` (then a group of up to ``INLINE_RECORDS`` runs on
    trio's thread, ``SqlStore.commit_soon``: let it go before it starts); ``on_trios_thread``
    says where each ran."""

    def __init__(self, store: Any, *, inline: bool = False) -> None:
        self.store = store
        self.real = store._commit_many
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.fail: BaseException | None = None
        self.server: Any = None
        self.on_trios_thread: list[bool] = []
        self._trio_thread = threading.get_ident()
        store._commit_many = self
        if not inline:
            store._inline = 0

    def __call__(self, conn: Any, batches: list[WriteBatch]) -> Any:
        self.on_trios_thread.append(threading.get_ident() == self._trio_thread)
        self.entered.release()
        assert self.go.acquire(timeout=30)
        error, self.fail = self.fail, None
        if error is not None:
            raise error
        return self.real(conn, batches)

    async def running(self) -> None:
        """Once a transaction runs in its thread."""
        assert await trio.to_thread.run_sync(self.entered.acquire, True, 30)

    @staticmethod
    def send(tag: str, flow_id: str = "f1") -> None:
        """``commit_nowait`` of a batch creating ``flow_id``, answered to the caller."""
        StoreServer.commit_nowait(WriteBatch(flows_created=[flow(flow_id)]), otp.self(), tag)

    @staticmethod
    def mail(tag: str, flow_id: str = "f1") -> None:
        """As :meth:`send`, always by message (never handed over: ``_store_group.StoreHandle``)."""
        batch = WriteBatch(flows_created=[flow(flow_id)])
        otp.GenServer.cast("matching_store", ("commit", batch, otp.self(), tag))

    async def started(self, tag: str, flow_id: str = "f1") -> None:
        """``send``, then wait until its transaction runs."""
        self.send(tag, flow_id)
        await self.running()


@contextlib.asynccontextmanager
async def held_server(store_kind: StoreKind, *, inline: bool = False) -> AsyncIterator[HeldCommits]:
    """A node running a ``StoreServer`` (not linked) on a threaded store whose transactions
    are held (``HeldCommits``)."""
    held = HeldCommits(store_kind.store(threads=True), inline=inline)
    async with otp.open_node():
        held.server = await StoreServer.start(held.store, name="matching_store")
        yield held


#: Where a crash edge's transaction runs: in a thread of its own, or (SQLite) on trio's thread,
#: in the server's own pass or handed over (in the sender's task, ``StoreHandle``).
_WHERE = pytest.mark.parametrize("where", ["in_a_thread", "on_trios_thread", "handed_over"])


def _skip_inline_on_postgresql(store_kind: StoreKind, inline: bool) -> None:
    if inline and store_kind.name == "postgresql":
        pytest.skip("PostgreSQL commits only in a thread (SqlStore._INLINE_RECORDS)")


def _send_from(held: HeldCommits, where: str, tag: str) -> None:
    """Send ``tag``'s batch so that it commits ``where`` (after its transaction is let go)."""
    held.go.release()
    if where == "handed_over":
        held.send(tag)
    else:
        held.mail(tag)


async def test_server_groups_what_came_during_a_transaction_and_tells_each_sender_its_failure(
    store_kind: StoreKind,
) -> None:
    async with held_server(store_kind) as held:
        await held.started("a", "a")
        held.send("b", "b")
        held.send("c", "c")
        await trio.testing.wait_all_tasks_blocked()
        held.go.release()  # "a" commits; "b" and "c" go in the next transaction together
        assert await otp.receive(timeout=5) == BatchCommitted("a", None)
        await held.running()
        failure = held.fail = StoreError("the transaction failed: disk I/O error")
        held.go.release()
        b, c = await otp.receive(timeout=5), await otp.receive(timeout=5)
        assert (b.tag, c.tag) == ("b", "c")
        assert b.error is c.error is failure
        held.go.release()  # (the server carries on)
        await StoreServer.create_flow(flow("d"))
        stats = await StoreServer.statistics()
        assert [r.flow_id for r in await StoreServer.list_flows()] == ["d", "a"]
    assert (stats.groups, stats.batches, stats.largest_group) == (3, 4, 2)


async def test_server_reads_between_transactions_in_the_order_they_came(
    store_kind: StoreKind,
) -> None:
    async with held_server(store_kind) as held:
        await held.started("a", "a")
        read: list[list[str]] = []

        async def reader() -> None:
            read.append([r.flow_id for r in await StoreServer.list_flows()])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # (the read waits for the connection)
            held.send("b", "b")
            await trio.testing.wait_all_tasks_blocked()
            held.go.release()
            held.go.release()
        assert read == [["a"]]  # after the transaction before it, before the one after it
        assert [await otp.receive(timeout=5) for _ in range(2)] == [
            BatchCommitted("a", None),
            BatchCommitted("b", None),
        ]


async def test_server_reads_and_commits_on_trios_thread_in_the_order_they_came(
    store_kind: StoreKind,
) -> None:
    # (a group that finds a read holding the connection waits behind it, through the worker)
    _skip_inline_on_postgresql(store_kind, True)
    async with held_server(store_kind, inline=True) as held:
        held.go.release()
        held.send("a", "a")
        assert await otp.receive(timeout=5) == BatchCommitted("a", None)
        reading, gate = threading.Event(), threading.Event()

        def slow_read(conn: Any) -> list[str]:
            reading.set()
            assert gate.wait(10)
            return [row[0] for row in conn.execute("SELECT flow_id FROM flows ORDER BY flow_id")]

        async def list_flows(**kwargs: Any) -> list[str]:
            return await held.store._run(slow_read)

        held.store.list_flows = list_flows
        read: list[list[str]] = []

        async def reader() -> None:
            read.append(await StoreServer.list_flows())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            assert await trio.to_thread.run_sync(reading.wait, 10)
            held.go.release()
            held.send("b", "b")
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert read == [["a"]]
        assert await otp.receive(timeout=5) == BatchCommitted("b", None)
        assert held.on_trios_thread == [True, False]


async def test_server_killed_with_a_commit_in_flight_tells_its_sender_nothing_but_down(
    store_kind: StoreKind,
) -> None:
    async with held_server(store_kind) as held:
        ref = otp.monitor(held.server)
        await held.started("t")
        otp.exit(held.server, otp.KILL)
        assert await otp.receive(timeout=5) == otp.Down(ref, held.server, otp.KILLED)
        held.go.release()
        # (the connection is free once the transaction ends; it had begun, so it committed)
        assert await held.store.get_flow("f1") == flow()
        assert await otp.receive(timeout=0, default=None) is None
        await held.store.close()


async def test_server_commit_nowait_while_a_group_is_in_flight_goes_by_message_behind_it(
    store_kind: StoreKind,
) -> None:
    _skip_inline_on_postgresql(store_kind, True)
    async with held_server(store_kind) as held:
        await held.started("a", "a")
        held.store._inline = INLINE_RECORDS  # ("b" could commit on trio's thread, but "a" runs)
        held.send("b", "b")
        assert otp.message_queue_len() == 0
        held.go.release()
        held.go.release()
        assert [await otp.receive(timeout=5) for _ in range(2)] == [
            BatchCommitted("a", None),
            BatchCommitted("b", None),
        ]
        assert [r.flow_id for r in await StoreServer.list_flows()] == ["b", "a"]


@_WHERE
async def test_server_whose_transaction_raises_a_bug_crashes_with_it_and_tells_nobody_else(
    store_kind: StoreKind, where: str
) -> None:
    inline = where != "in_a_thread"
    _skip_inline_on_postgresql(store_kind, inline)
    async with held_server(store_kind, inline=inline) as held:
        bug = held.fail = RuntimeError("a bug in the store")
        ref = otp.monitor(held.server)
        _send_from(held, where, "t")
        down = await otp.receive(timeout=5)
        assert (down.ref, down.pid) == (ref, held.server)
        assert isinstance(down.reason, otp.Crash)
        assert down.reason.exception is bug
        assert await otp.receive(timeout=0, default=None) is None
        assert held.on_trios_thread == [inline]
    with pytest.raises(StoreError, match="is closed"):  # (its terminate closed the store)
        await held.store.get_flow("f1")


@_WHERE
async def test_server_whose_answer_to_a_group_raises_crashes_with_it_not_the_node(
    store_kind: StoreKind, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    inline = where != "in_a_thread"
    _skip_inline_on_postgresql(store_kind, inline)
    bug = RuntimeError("a bug in the answers")

    def answer(group: Any, outcomes: Any) -> None:
        raise bug

    monkeypatch.setattr("apps.matching._store_group.answer", answer)
    async with held_server(store_kind, inline=inline) as held:
        ref = otp.monitor(held.server)
        _send_from(held, where, "t")
        down = await otp.receive(timeout=5)
        assert (down.ref, down.pid, down.reason) == (ref, held.server, otp.Crash(bug))
        assert held.on_trios_thread == [inline]


@_WHERE
async def test_server_whose_stores_after_commit_raises_crashes_with_it_not_the_node(
    store_kind: StoreKind, where: str
) -> None:
    inline = where != "in_a_thread"
    _skip_inline_on_postgresql(store_kind, inline)
    bug = RuntimeError("a bug after the commit")

    def committed() -> None:
        raise bug

    async with held_server(store_kind, inline=inline) as held:
        held.store._committed = committed
        ref = otp.monitor(held.server)
        _send_from(held, where, "t")
        down = await otp.receive(timeout=5)
        assert (down.ref, down.pid, down.reason) == (ref, held.server, otp.Crash(bug))
        assert await otp.receive(timeout=0, default=None) is None  # (no answer: only the DOWN)
        assert held.on_trios_thread == [inline]


# -- the servers sharing the database (schema version 2) ---------------------------------------


def server_record(server_id: str = "m1@host", **kw: Any) -> ServerRecord:
    fields: dict[str, Any] = {
        "node": server_id if "@" in server_id else None,
        "addresses": ("unix:/tmp/m1.sock", "tcp:127.0.0.1:4401"),
        "started_at": 100.0,
        "heartbeat_at": 100.0,
    }
    fields.update(kw)
    return ServerRecord(server_id=server_id, **fields)


def test_server_record_refuses_a_malformed_field() -> None:
    with pytest.raises(ValueError, match=r"ServerRecord\.server_id must be a non-empty str"):
        server_record("")
    with pytest.raises(ValueError, match=r"ServerRecord\.addresses must be a list of str"):
        server_record(addresses="unix:/tmp/a.sock")
    with pytest.raises(ValueError, match="at most 16 non-empty str"):
        server_record(addresses=[f"unix:/tmp/{i}" for i in range(17)])
    with pytest.raises(ValueError, match=r"ServerRecord\.heartbeat_at must be a finite number"):
        server_record(heartbeat_at=float("nan"))


async def test_a_registered_server_is_live_until_its_heartbeat_is_older_than_the_timeout(
    store: Any,
) -> None:
    await store.register_server(server_record("m1@host"))
    await store.register_server(server_record("host/42/0badc0de", heartbeat_at=103.0))
    assert await store.servers(104.0, 5.0) == [
        server_record("host/42/0badc0de", heartbeat_at=103.0),
        server_record("m1@host"),
    ]
    assert [s.server_id for s in await store.servers(105.0, 5.0)] == ["host/42/0badc0de"]
    assert await store.beat("m1@host", 106.0) is True
    assert [s.server_id for s in await store.servers(108.0, 5.0)] == ["m1@host"]
    assert (await store.servers(108.0, 5.0))[0].heartbeat_at == 106.0


async def test_registering_again_replaces_the_row_of_that_server_id(store: Any) -> None:
    await store.register_server(server_record("m1@host"))
    again = server_record("m1@host", addresses=["unix:/tmp/new.sock"], started_at=200.0)
    again = attrs.evolve(again, heartbeat_at=200.0)
    await store.register_server(again)
    assert await store.servers(201.0, 5.0) == [again]


async def test_the_rows_of_servers_silent_since_before_a_time_are_forgotten(store: Any) -> None:
    await store.register_server(server_record("dead@host", heartbeat_at=50.0))
    await store.register_server(server_record("m1@host", heartbeat_at=100.0))
    assert await store.forget_servers(100.0) == 1  # (older than that: a beat at it stays)
    assert [s.server_id for s in await store.servers(101.0, 1000.0)] == ["m1@host"]
    assert await store.forget_servers(100.0) == 0


async def test_beat_and_remove_of_an_unknown_server_say_so(store: Any) -> None:
    assert await store.beat("nobody@host", 1.0) is False
    await store.register_server(server_record("m1@host"))
    assert await store.remove_server("m1@host") is True
    assert await store.remove_server("m1@host") is False
    assert await store.beat("m1@host", 101.0) is False  # (removed: register again)
    assert await store.servers(101.0, 5.0) == []


async def test_register_server_refuses_what_is_not_a_server_record(store: Any) -> None:
    with pytest.raises(StoreError, match="register_server takes a ServerRecord"):
        await store.register_server({"server_id": "m1@host"})


async def test_a_version_1_database_migrates_to_the_servers_table_keeping_its_flows(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "v1.db")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        for statement in MIGRATIONS[0][1]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (1, 0)")
        conn.execute(
            "INSERT INTO flows (flow_id, flow_type, status, args, state, step_index, step_input,"
            " result, error, created_at, updated_at, version, definition)"
            " VALUES ('f1', 't', 'completed', x'80', x'a0', 0, x'80', x'f6', x'f6', 1, 1, 1, x'a0')"
        )
    s = SqliteStore(path)
    await s.open()
    assert (await s.get_flow("f1")) is not None
    await s.register_server(server_record())
    assert await s.servers(101.0, 5.0) == [server_record()]
    await s.close()
    with sqlite3.connect(path) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert (
            versions.fetchall()
            == [(1,), (2,), (3,)]
            == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
        )


async def _version_2(store_kind: StoreKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database of ``store_kind`` as version 2 of the schema made it, with a flow of each
    status, attempts, dispatch records and two pending steps (one leased, one free)."""
    module = (
        f"apps.matching.{'_sqlite_store' if store_kind.name == 'sqlite' else '_postgres_store'}"
    )
    with monkeypatch.context() as patch:
        patch.setattr(f"{module}.MIGRATIONS", importlib.import_module(module).MIGRATIONS[:2])
        patch.setattr(f"{module}.SCHEMA_VERSION", 2)
        old = store_kind.store(store_kind.durable)
        await old.open()
    for i, (status, kind) in enumerate(
        [("running", "orders"), ("completed", "orders"), ("failed", "mail"), ("cancelled", "mail")]
    ):
        await old.create_flow(flow(f"f{i}", status=status, flow_type=kind, created_at=10.0 + i))
    await old.commit(
        WriteBatch(
            attempts=[attempt("f0", 1), attempt("f0", 2)],
            dispatches=[dispatch("f0", 1), dispatch("f0", 2)],
            pending_put=[
                pending("f0", 1, lease_owner="me", lease_expires=50.0, not_before=3.0),
                pending("f0", 2, not_before=4.0),
            ],
        )
    )
    await old.close()
    assert store_kind.query("SELECT max(version) FROM schema_migrations") == [(2,)]


def _plans(path: str, statements: list[str]) -> dict[str, list[str]]:
    """Each of ``statements`` that reads or writes a table, with the lines of its query plan
    that scan a table of flows or pending steps whole (none when an index serves it)."""
    whole = re.compile(r"^SCAN (flows|pending|attempts|dispatches)\b")
    scans: dict[str, list[str]] = {}
    with sqlite3.connect(path) as conn:
        for sql in statements:
            if sql.split(" ", 1)[0] not in ("SELECT", "INSERT", "UPDATE", "DELETE"):
                continue
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
            scans[sql] = [line for line in plan if whole.match(line)]
    return scans


async def test_a_version_2_database_migrates_to_fewer_indexes_keeping_its_data(
    store_kind: StoreKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 3 drops two of the flows' indexes and keys the pending steps by their key
    alone (``WITHOUT ROWID`` on SQLite): the rows are all there, read and written as before,
    and on SQLite every query of the store still reads through an index."""
    await _version_2(store_kind, monkeypatch)
    s = store_kind.store(store_kind.durable, threads=True)
    await s.open()
    statements: list[str] = []
    if store_kind.name == "sqlite":
        s._conn.set_trace_callback(statements.append)
    assert [r.flow_id for r in await s.list_flows()] == ["f3", "f2", "f1", "f0"]
    assert [r.flow_id for r in await s.list_flows(flow_type="mail", limit=1)] == ["f3"]
    assert [r.flow_id for r in await s.list_flows(status="running")] == ["f0"]
    assert await s.list_flows(flow_type="orders", status="completed") == [
        flow("f1", status="completed", created_at=11.0)
    ]
    assert await s.attempts("f0") == [attempt("f0", 1), attempt("f0", 2)]
    assert await s.dispatches("f0") == [dispatch("f0", 1), dispatch("f0", 2)]
    assert await s.pending("f0") == [
        pending("f0", 1, lease_owner="me", lease_expires=50.0, not_before=3.0),
        pending("f0", 2, not_before=4.0),
    ]
    assert await s.renew_leases("me", 10.0, 30.0) == 1
    (claim,) = await s.claim_steps("you", 5.0, 30.0, 10)
    assert claim.step == pending("f0", 2, lease_owner="you", lease_expires=35.0, not_before=4.0)
    done = flow("f0", version=2, step_index=3, created_at=10.0)
    await s.commit_many([WriteBatch(flows_upserted=[done], pending_done=[("f0", 1), ("f0", 2)])])
    assert await s.get_flow("f0") == done
    await s.close()
    versions = store_kind.query("SELECT version FROM schema_migrations ORDER BY version")
    assert versions == [(1,), (2,), (3,)]
    assert store_kind.query("SELECT count(*) FROM pending") == [(0,)]
    if store_kind.name == "postgresql":
        return
    path = store_kind.durable
    with sqlite3.connect(path) as conn:
        indexes = conn.execute(
            "SELECT tbl_name, name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            " AND tbl_name IN ('flows', 'pending') ORDER BY name"
        ).fetchall()
        assert indexes == [
            ("flows", "flows_by_status"),
            ("flows", "flows_by_type_status"),
            ("pending", "pending_by_due"),
            ("pending", "pending_by_owner"),
        ]
        (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'pending'").fetchone()
        assert table.endswith("WITHOUT ROWID")
    assert [sql for sql, scans in _plans(path, statements).items() if scans] == []


async def test_the_store_server_answers_the_servers_operations() -> None:
    async with otp.open_node():
        await StoreServer.start_link(SqliteStore(":memory:"), name="store_s")
        s = "store_s"
        await StoreServer.register_server(server_record(), server=s)
        assert await StoreServer.beat("m1@host", 102.0, server=s) is True
        assert await StoreServer.servers(103.0, 5.0, server=s) == [
            server_record(heartbeat_at=102.0)
        ]
        assert await StoreServer.remove_server("m1@host", server=s) is True
        assert await StoreServer.servers(103.0, 5.0, server=s) == []


# -- the model ----------------------------------------------------------------------------------

IDS = ("a", "b", "c")
#: Records mostly name the flows every example starts with ("a", "b"): fewer refused batches.
REFS = ("a", "a", "b", "b", "c")
TYPES = ("t1", "t2")
OWNERS = ("n1", "n2")
STATUSES = ("running", "completed", "failed", "cancelled")

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
errors = st.none() | st.builds(lambda t: {"type": t, "message": "m"}, st.sampled_from("EF"))
times = st.sampled_from([0.0, 1.0, 2.0, 5.0, 7.5])

flows = st.builds(
    FlowRecord,
    flow_id=st.sampled_from(IDS),
    flow_type=st.sampled_from(TYPES),
    status=st.sampled_from(STATUSES),
    args=st.lists(values, max_size=2) | st.lists(values, max_size=2).map(tuple),
    state=st.dictionaries(st.text(max_size=3), values, max_size=2),
    step_index=st.integers(0, 3),
    step_input=values,
    result=values,
    error=errors,
    sticky_worker=st.none() | st.sampled_from(["w1", "w2"]),
    created_at=times,
    updated_at=times,
    version=st.integers(1, 4),
)
attempts_ = st.builds(
    AttemptRecord,
    flow_id=st.sampled_from(REFS),
    step_index=st.integers(0, 3),
    step=st.just("s"),
    execution_id=st.just("x"),
    attempt=st.integers(1, 3),
    delivery=st.integers(-5, 2**40),
    worker_id=st.none() | st.just("w1"),
    status=st.sampled_from(["completed", "failed", "not_dispatched", "lost"]),
    error=errors,
    started_at=times,
    finished_at=times,
)
dispatches_ = st.builds(
    DispatchRecord,
    flow_id=st.sampled_from(REFS),
    delivery=st.integers(0, 9),
    kind=st.sampled_from(["step", "rpc"]),
    name=st.just("s"),
    attempt=st.integers(1, 3),
    queue=st.just("q"),
    reason=st.sampled_from(["sticky", "delivered"]),
    worker_id=st.none() | st.just("w1"),
    at=times,
)
leases = st.none() | st.tuples(st.sampled_from(OWNERS), times)
pendings = st.builds(
    lambda f, i, a, lease, nb: PendingStep(
        f,
        i,
        "s",
        f"{f}/{i}/s",
        a,
        lease_owner=lease[0] if lease else None,
        lease_expires=lease[1] if lease else None,
        not_before=nb,
    ),
    st.sampled_from(REFS),
    st.integers(0, 2),
    st.integers(1, 3),
    leases,
    times,
)
keys = st.tuples(st.sampled_from(REFS), st.integers(0, 2))
#: A batch whose upserts are ``(record, fresh)``: a fresh one gets the next version when played.
batches = st.builds(
    WriteBatch,
    flows_upserted=st.lists(
        st.tuples(flows, st.sampled_from([True, True, True, False])), max_size=2
    ),
    attempts=st.lists(attempts_, max_size=2),
    dispatches=st.lists(dispatches_, max_size=2),
    pending_put=st.lists(pendings, max_size=3),
    pending_done=st.lists(keys, max_size=1),
    flows_created=st.one_of(st.just([]), st.just([]), st.just([]), st.lists(flows, max_size=1)),
)
operations = st.lists(
    st.tuples(st.just("commit"), st.lists(batches, min_size=1, max_size=3))
    | st.tuples(
        st.just("claim"),
        st.sampled_from(OWNERS),
        times,
        st.sampled_from([1.0, 3.0]),
        st.integers(0, 3),
    )
    | st.tuples(st.just("renew"), st.sampled_from(OWNERS), times, st.sampled_from([1.0, 3.0]))
    | st.tuples(st.just("release"), st.sampled_from(OWNERS)),
    max_size=20,
)


@attrs.define
class Model:
    """What the store must hold, as dicts."""

    flows: dict[str, tuple[int, FlowRecord]] = attrs.field(factory=dict)
    seq: int = 0
    attempts: dict[str, list[AttemptRecord]] = attrs.field(factory=dict)
    dispatches: dict[str, list[DispatchRecord]] = attrs.field(factory=dict)
    pending: dict[tuple[str, int], PendingStep] = attrs.field(factory=dict)

    def _insert(self, record: FlowRecord) -> None:
        self.seq += 1
        self.flows[record.flow_id] = (self.seq, record)

    def apply(self, batch: WriteBatch) -> type[StoreError] | None:
        """Apply ``batch`` whole, or refuse it (changing nothing) with the error it gets."""
        before = copy.deepcopy(attrs.asdict(self, recurse=False))
        refused = self._apply(batch)
        if refused is not None:
            for name, value in before.items():
                setattr(self, name, value)
        return refused

    def _apply(self, batch: WriteBatch) -> type[StoreError] | None:
        for record in batch.flows_created:
            if record.flow_id in self.flows:
                return FlowExists
            self._insert(record)
        for record in batch.flows_upserted:
            if record.flow_id not in self.flows:
                self._insert(record)
                continue
            seq, stored = self.flows[record.flow_id]
            if stored.version != record.version - 1:
                return StoreConflict
            self.flows[record.flow_id] = (seq, record)
        refs: list[str] = [
            *(a.flow_id for a in batch.attempts),
            *(d.flow_id for d in batch.dispatches),
            *(p.flow_id for p in batch.pending_put),
        ]
        if any(flow_id not in self.flows for flow_id in refs):
            return StoreError
        for a in batch.attempts:
            self.attempts.setdefault(a.flow_id, []).append(a)
        for d in batch.dispatches:
            self.dispatches.setdefault(d.flow_id, []).append(d)
        for p in batch.pending_put:
            self.pending[p.key] = p
        for key in batch.pending_done:
            self.pending.pop(key, None)
        return None

    def claim(self, owner: str, now: float, lease: float, limit: int) -> list[PendingStep]:
        due = sorted(
            (
                p
                for p in self.pending.values()
                if p.not_before <= now and (p.lease_expires is None or p.lease_expires <= now)
            ),
            key=lambda p: (p.not_before, p.flow_id, p.step_index),
        )[:limit]
        claimed = [attrs.evolve(p, lease_owner=owner, lease_expires=now + lease) for p in due]
        for p in claimed:
            self.pending[p.key] = p
        return claimed

    def set_leases(self, owner: str, expires: float | None) -> int:
        mine = [p for p in self.pending.values() if p.lease_owner == owner]
        for p in mine:
            new_owner = None if expires is None else owner
            self.pending[p.key] = attrs.evolve(p, lease_owner=new_owner, lease_expires=expires)
        return len(mine)

    def list_flows(self, flow_type: str | None, status: str | None, limit: int) -> list[Any]:
        rows = sorted(
            (
                (seq, r)
                for seq, r in self.flows.values()
                if (flow_type is None or r.flow_type == flow_type)
                and (status is None or r.status == status)
            ),
            key=lambda sr: (sr[1].created_at, sr[0]),
            reverse=True,
        )
        return [r for _, r in rows[:limit]]


async def _same_reads(store: SqliteStore, model: Model) -> None:
    for flow_id in IDS:
        stored = model.flows.get(flow_id)
        assert await store.get_flow(flow_id) == (stored[1] if stored else None)
        assert await store.attempts(flow_id) == model.attempts.get(flow_id, [])
        want = model.dispatches.get(flow_id, [])
        assert await store.dispatches(flow_id) == want
        assert await store.dispatches(flow_id, limit=1) == want[-1:]
        assert await store.pending(flow_id) == sorted(
            (p for p in model.pending.values() if p.flow_id == flow_id),
            key=lambda p: p.step_index,
        )
    for flow_type in (None, *TYPES):
        for status in (None, "running", "completed"):
            for limit in (2, 100):
                got = await store.list_flows(flow_type=flow_type, status=status, limit=limit)
                assert got == model.list_flows(flow_type, status, limit)


def _versioned(batch: WriteBatch, model: Model) -> WriteBatch:
    """``batch`` with each fresh upsert given the version after the one ``model`` holds."""
    upserts: list[FlowRecord] = []
    spec: list[tuple[FlowRecord, bool]] = batch.flows_upserted  # type: ignore[assignment]
    for record, fresh in spec:
        stored = model.flows.get(record.flow_id)
        if fresh and stored is not None:
            record = attrs.evolve(record, version=stored[1].version + 1)
        upserts.append(record)
    return attrs.evolve(batch, flows_upserted=upserts)


async def _play(ops: list[tuple[Any, ...]], url: str | None = None) -> None:
    store: Any = SqliteStore(":memory:") if url is None else PostgresStore(url)
    await store.open()
    model = Model()
    setup = WriteBatch(flows_created=[flow("a", flow_type="t1"), flow("b", flow_type="t2")])
    await store.commit(setup)
    model.apply(setup)
    for op in ops:
        match op:
            case ("commit", specs):
                scratch = copy.deepcopy(model)
                group = []
                for spec in specs:
                    group.append(_versioned(spec, scratch))
                    scratch.apply(group[-1])
                outcomes = await store.commit_many(group)
                for batch, outcome in zip(group, outcomes, strict=True):
                    expected = model.apply(batch)
                    assert type(outcome) is (type(None) if expected is None else expected)
            case ("claim", owner, now, lease, limit):
                assert await store.claim_pending(owner, now, lease, limit) == model.claim(
                    owner, now, lease, limit
                )
            case ("renew", owner, now, lease):
                assert await store.renew_leases(owner, now, lease) == model.set_leases(
                    owner, now + lease
                )
            case ("release", owner):
                assert await store.release_leases(owner) == model.set_leases(owner, None)
        await _same_reads(store, model)
    await store.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_random_batches_read_back_as_the_dict_model_says(ops: list[tuple[Any, ...]]) -> None:
    trio.run(_play, ops)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_random_batches_on_postgresql_read_back_as_the_dict_model_says(
    postgres: Any, ops: list[tuple[Any, ...]]
) -> None:
    with postgres.schema() as url:
        trio.run(_play, ops, url)


def test_a_trusted_dispatch_record_equals_the_checked_one() -> None:
    fields = dict(
        flow_id="f1", delivery=3, kind="rpc", name="read", attempt=1, queue="flow:Greet",
        reason="delivered", worker_id="w1", at=5.0,
    )  # fmt: skip
    trusted = DispatchRecord.trusted(**fields)  # type: ignore[arg-type]
    checked = DispatchRecord(**fields)  # type: ignore[arg-type]
    assert trusted == checked and hash(trusted) == hash(checked)
    assert repr(trusted) == repr(checked)


@pytest.mark.parametrize(
    "cls, values",
    [
        (FlowRecord, ("f1", "T", "running", [1], {"k": "v"}, 0, [1], None, None, None, 1.0, 2.0, 1,
                      {"steps": []})),
        (AttemptRecord, ("f1", 0, "a", "f1/0/a", 1, 3, "w1", "completed", None, 1.0, 2.0)),
        (PendingStep, ("f1", 0, "a", "f1/0/a", 1, "server", 9.0, 0.0)),
        (DispatchRecord, ("f1", 3, "step", "a", 1, "flow:T", "delivered", "w1", 5.0)),
    ],
)  # fmt: skip
def test_a_trusted_record_equals_the_checked_one(cls: Any, values: tuple[Any, ...]) -> None:
    # (the engine builds its own records with trusted(), or with the builder trusted_builder()
    # gives it: one generated builder per class)
    for build in (partial(trusted, cls), partial(trusted, cls), trusted_builder(cls)):
        # (the builder made on first use, then the one kept, and the same one given)
        built = build(*values)
        checked = cls(*values)
        assert type(built) is cls and built == checked and repr(built) == repr(checked)
        if cls in (PendingStep, DispatchRecord):  # (the others hold lists: unhashable)
            assert hash(built) == hash(checked)
        assert attrs.astuple(built, recurse=False) == values
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        trusted(cls, *values[:-1])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.flow_id = "other"
