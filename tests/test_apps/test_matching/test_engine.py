"""The ``matching_engine`` GenServer against the real ``StoreServer`` (on each kind of store:
SQLite and PostgreSQL, the ``store_kind`` fixture) and a scripted matcher: steps in order,
arguments, retries and their backoff, failures, lost workers, RPCs, result waiters,
describe/list, cancellation, recovery, and that nothing happens before its commit.

The matcher is a stand-in ``GenServer`` registered as ``matching_matcher`` (the name the engine
submits to), answering each ``Dispatch`` with the outcomes a script gives. The store runs its
database calls on trio's own thread here (``threads=False``): ``MockClock``'s autojump would
otherwise jump while a worker thread ran, and fire every timer early.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import otp
from apps.matching import _engine_handoff as handoff
from apps.matching._dispatch import (
    CancelCall,
    Completed,
    Dispatch,
    ErrorInfo,
    Failed,
    Lost,
    MatchingLimits,
    NotDispatched,
    Routed,
    StreamIdle,
    Task,
)
from apps.matching._engine import (
    ENGINE,
    EngineOptions,
    EngineStatistics,
    FlowEngine,
    parse_definition,
)
from apps.matching._engine_direct import _new_routed as _direct_routed
from apps.matching._engine_ids import new_flow_id
from apps.matching._engine_rpcs import _NO_NAMES, _new_dispatch, _new_task
from apps.matching._engine_steps import _new_dispatch as _step_dispatch
from apps.matching._engine_steps import _new_task as _step_task
from apps.matching._errors import (
    CallTimeout,
    Cancelled,
    ConfigurationError,
    FlowExists,
    FlowFailed,
    FlowNotFound,
    HandlerError,
    NoWorkerAvailable,
    Unavailable,
    UnknownFlowType,
    UnknownName,
)
from apps.matching._matcher import MATCHER
from apps.matching._matcher_routes import publish_route, routes_table
from apps.matching._model import FlowDescription, FlowStatus, FlowSummary
from apps.matching._queue import QueueHandle, start_queue
from apps.matching._store import SERVER_NAME, StoreConflict, StoreServer
from apps.matching._stream import _new_completed, _new_stream_idle
from apps.matching._stream import _new_routed as _stream_routed
from otp import ets

from ._stores import StoreKind

T = TypeVar("T")


# -- the store, the matcher, the engine ------------------------------------------------------------


class GatedStore:
    """A real store (either kind, its calls on trio's thread: see the module docstring).
    ``gate``, when set and not yet set(), holds every commit until it is."""

    gate: trio.Event | None = None

    def __init__(self, store: Any) -> None:
        self.store = store
        #: Every batch committed, in order.
        self.batches: list[Any] = []
        #: Flows whose next batch is refused as another server's conflict (then forgotten).
        self.conflicts: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def commit_many(self, batches: Sequence[Any]) -> Any:
        if self.gate is not None:
            await self.gate.wait()
        for flow_id in list(self.conflicts):
            if any(r.flow_id == flow_id for b in batches for r in b.flows_upserted):
                self.conflicts.discard(flow_id)
                conflict = StoreConflict("another server wrote it", details={"flow_id": flow_id})
                return [conflict] * len(batches)
        self.batches += batches
        return await self.store.commit_many(batches)


Script = Callable[[Task], Sequence[Callable[[int], Any]]]


def ok(value: Any = None, *, worker: str = "w1", set: Any = None, delete: Any = ()) -> Any:
    patch = {"set": dict(set or {}), "delete": list(delete)}

    def outcomes(delivery: int) -> list[Any]:
        return [
            Routed(delivery, f"worker:{worker}", "delivered", worker),
            Completed(delivery, worker, value, patch),
        ]

    return outcomes


def fail(type_: str = "ValueError", message: str = "boom", *, retryable: bool = True) -> Any:
    def outcomes(delivery: int) -> list[Any]:
        return [
            Routed(delivery, "worker:w1", "delivered", "w1"),
            Failed(delivery, "w1", ErrorInfo(type_, message, retryable)),
        ]

    return outcomes


def not_dispatched(reason: str, message: str = "nobody") -> Any:
    return lambda delivery: [NotDispatched(delivery, reason, message)]


def lost(after_output: bool) -> Any:
    return lambda delivery: [
        Routed(delivery, "worker:w1", "delivered", "w1"),
        Lost(delivery, "w1", after_output),
    ]


def hang() -> Any:
    return lambda delivery: [Routed(delivery, "worker:w1", "delivered", "w1")]


def not_yet() -> Any:
    """A WaitFor check's answer "not yet" (M_RESULT with ``not_yet``)."""
    return lambda delivery: [
        Routed(delivery, "worker:w1", "delivered", "w1"),
        Completed(delivery, "w1", None, {}, True),
    ]


@attrs.define
class _MatcherState:
    script: Callable[[Task], Any]
    log: list[tuple[float, Dispatch]] = attrs.field(factory=list)


class FakeMatcher(otp.GenServer):
    """Registered as ``matching_matcher``: logs each dispatch with the time it came and answers
    it with what ``script(task)`` returns (a list of outcome builders, or a plain list)."""

    def init(self, script: Callable[[Task], Any]) -> otp.Ok:
        return otp.Ok(_MatcherState(script))

    def handle_cast(self, dispatch: Dispatch, state: _MatcherState) -> otp.NoReply:
        state.log.append((trio.current_time(), dispatch))
        routed = Routed(dispatch.task.delivery, "flow:T", "flow_queue")
        otp.send(dispatch.reply_to, routed)
        for build in state.script(dispatch.task) or ():
            for outcome in build(dispatch.task.delivery):
                otp.send(dispatch.reply_to, outcome)
        return otp.NoReply(state)

    def handle_call(self, request: Any, from_: otp.From, state: _MatcherState) -> otp.Reply:
        if request == "log":
            return otp.Reply(list(state.log), state)
        state.script = request[1]
        state.log.clear()
        return otp.Reply(None, state)


async def dispatches() -> list[tuple[float, Dispatch]]:
    return await otp.call(MATCHER, "log", None)


async def set_script(script: Callable[[Task], Any]) -> None:
    """Answer dispatches with ``script`` from now on, and forget those logged."""
    await otp.call(MATCHER, ("script", script), None)


def by_step(**plans: list[Any]) -> Callable[[Task], Any]:
    """A script: each step's or RPC's attempts, in order, get the next outcome of its plan
    (the last one repeats)."""
    seen: dict[str, int] = {}

    def script(task: Task) -> Any:
        plan = plans[task.name]
        n = seen.get(task.name, 0)
        seen[task.name] = n + 1
        return [plan[min(n, len(plan) - 1)]]

    return script


def echo(task: Task) -> Any:
    """Every step returns its arguments."""
    return [ok(task.args)]


def step(name: str, **retry: Any) -> dict[str, Any]:
    return {
        "name": name,
        "max_attempts": retry.get("max_attempts", 3),
        "initial_backoff": retry.get("initial_backoff", 1.0),
        "backoff_coefficient": retry.get("backoff_coefficient", 2.0),
        "max_backoff": retry.get("max_backoff", 60.0),
        "timeout": retry.get("timeout"),
    }


def wait_for_step(name: str, **retry: Any) -> dict[str, Any]:
    return {**step(name, **retry), "kind": "wait_for"}


def definition(*steps: dict[str, Any], rpcs: Sequence[str] = ()) -> dict[str, Any]:
    return {"steps": list(steps), "rpcs": list(rpcs)}


@asynccontextmanager
async def server(
    store_kind: StoreKind,
    script: Callable[[Task], Any] = echo,
    path: str | None = None,
    **options: Any,
) -> AsyncIterator[GatedStore]:
    """The store (on ``path``, default the kind's own location), the fake matcher and the
    engine, started in this node."""
    store = GatedStore(store_kind.store(path))
    await StoreServer.start_link(store, name=SERVER_NAME)
    await FakeMatcher.start_link(script, name=MATCHER)
    await FlowEngine.start(EngineOptions(first_delivery=1, **options), name=ENGINE)
    yield store


async def spawn_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> otp.Ref:
    """Run ``await fn(*args, **kwargs)`` in a process of its own; ``outcome(tag)`` gets it."""
    me, tag = otp.self(), otp.make_ref()

    async def run() -> None:
        try:
            value: Any = ("ok", await fn(*args, **kwargs))
        except Exception as exc:
            value = ("error", exc)
        otp.send(me, (tag, value))

    otp.spawn(run)
    return tag


async def outcome(tag: otp.Ref, timeout: float | None = None) -> Any:
    _, (kind, value) = await otp.receive(
        lambda m: isinstance(m, tuple) and len(m) == 2 and m[0] == tag, timeout=timeout
    )
    if kind == "error":
        raise value
    return value


async def describe(flow_id: str) -> FlowDescription:
    return FlowDescription.from_wire(await FlowEngine.describe(flow_id))


# -- steps ----------------------------------------------------------------------------------------


async def test_steps_run_in_order_each_getting_the_previous_return_value(
    store_kind: StoreKind,
) -> None:
    def script(task: Task) -> Any:
        return [ok({"step": task.name, "got": task.args})]

    async with otp.open_node(), server(store_kind, script):
        spec = definition(step("a"), step("b"), step("c"))
        flow_id = await FlowEngine.start_flow("T", [1, 2], spec, "f1")
        result = await FlowEngine.result("f1")
        tasks = [d.task for _, d in await dispatches()]
    assert flow_id == "f1"
    assert [(t.name, t.execution_id, t.attempt, t.kind) for t in tasks] == [
        ("a", "f1/0/a", 1, "step"),
        ("b", "f1/1/b", 1, "step"),
        ("c", "f1/2/c", 1, "step"),
    ]
    assert tasks[0].args == [1, 2]
    assert tasks[1].args == [{"step": "a", "got": [1, 2]}]
    assert tasks[2].args == [{"step": "b", "got": [{"step": "a", "got": [1, 2]}]}]
    assert result == {"step": "c", "got": tasks[2].args}


async def test_a_flow_deletes_only_the_pending_rows_it_put(store_kind: StoreKind) -> None:
    # (its last step's outcome deletes that step's row, and no row past its last step)
    async with otp.open_node(), server(store_kind, by_step(a=[ok()], b=[fail(), ok(2)])) as store:
        await FlowEngine.start_flow("T", [], definition(step("a"), step("b")), "f1")
        assert await FlowEngine.result("f1") == 2
    put = [step.key for batch in store.batches for step in batch.pending_put]
    done = [key for batch in store.batches for key in batch.pending_done]
    assert put == [("f1", 0), ("f1", 1), ("f1", 1)]
    assert done == [("f1", 0), ("f1", 1)]


async def test_a_flow_without_steps_completes_at_once_with_result_none(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind):
        flow_id = await FlowEngine.start_flow("T", [], definition())
        assert await FlowEngine.result(flow_id) is None
        assert (await describe(flow_id)).status is FlowStatus.COMPLETED
        assert await dispatches() == []


async def test_start_flow_without_an_id_makes_a_time_ordered_uuid7_hex(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind):
        first = await FlowEngine.start_flow("T", [], definition(step("a")))
        second = await FlowEngine.start_flow("T", [], definition(step("a")))
    assert len(first) == 32 and int(first, 16) >= 0 and first != second
    assert uuid.UUID(first).version == uuid.UUID(second).version == 7
    assert first[:12] <= second[:12]  # (their milliseconds: in the order they started)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.binary(min_size=10, max_size=10), st.sampled_from([bytes(10), b"\xff" * 10])),
    st.one_of(st.integers(0, 2**48 - 1), st.sampled_from([0, 2**48 - 1])),
)
def test_a_new_flow_id_is_the_uuid7_of_its_time_and_random_bytes(random: bytes, ms: int) -> None:
    # RFC 9562's layout, byte by byte: 48 bits of milliseconds, version 7, variant 0b10.
    expected = bytearray(ms.to_bytes(6, "big") + random)
    expected[6] = expected[6] & 0x0F | 0x70
    expected[8] = expected[8] & 0x3F | 0x80
    assert new_flow_id(random, ms) == bytes(expected).hex()
    assert uuid.UUID(bytes=bytes(expected)).variant == uuid.RFC_4122
    before = time.time_ns() // 1_000_000
    fresh = new_flow_id()
    after = time.time_ns() // 1_000_000
    assert uuid.UUID(fresh).version == 7 and uuid.UUID(fresh).hex == fresh
    assert before <= int(fresh[:12], 16) <= after


def test_new_flow_ids_of_one_millisecond_are_distinct_across_pools_and_threads() -> None:
    # (_engine_ids: their random bytes come from a pool of os.urandom, 400 ids a pool)
    ids: list[str] = []

    def make() -> None:
        ids.extend(new_flow_id(ms=1) for _ in range(1000))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == len(ids) == 4000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_makes_flow_ids_of_its_own_random_bytes() -> None:
    new_flow_id()  # (a pool both would share)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, new_flow_id(ms=1).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as child:
        theirs = child.read()
    assert len(theirs) == 32 and theirs != new_flow_id(ms=1)


async def test_start_flow_with_a_taken_id_raises_flow_exists_running_or_ended(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f1")
        with pytest.raises(FlowExists, match="'f1' exists already"):
            await FlowEngine.start_flow("T", [], definition(step("a")), "f1")
        await FlowEngine.start_flow("T", [], definition(), "done")  # ends at once
        with pytest.raises(FlowExists):
            await FlowEngine.start_flow("T", [], definition(), "done")


async def test_a_bad_definition_is_refused_naming_the_field(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind):
        with pytest.raises(ConfigurationError) as info:
            await FlowEngine.start_flow("T", [], {"steps": [{"name": "a", "timeout": -1}]})
        assert str(info.value) == (
            "start_flow definition: steps[0].timeout must be a number of seconds > 0 or None"
            " (got -1); send the flow type's definition as the client's Registry builds it"
        )
        with pytest.raises(ConfigurationError, match=r"RetryPolicy\.max_attempts"):
            await FlowEngine.start_flow("T", [], {"steps": [{"name": "a", "max_attempts": 0}]})
        with pytest.raises(ConfigurationError, match=r"steps\[1\].name must be unique"):
            await FlowEngine.start_flow("T", [], definition(step("a"), step("a")))


async def test_start_known_uses_the_newest_definition_given_start_flow_or_advertised(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, by_step(a=[ok("A")], b=[ok("B")])):
        with pytest.raises(UnknownFlowType, match="knows no definition of flow type 'T'"):
            await FlowEngine.start_known("T", [])
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=7)), "first")
        assert await FlowEngine.start_known("T", ["x"], "second") == "second"
        assert await FlowEngine.result("second") == "A"
        FlowEngine.advertise({"T": parse_definition(definition(step("b"), rpcs=["r"]))})
        third = await FlowEngine.start_known("T", [])
        assert await FlowEngine.result(third) == "B"
        second, third_d = await describe("second"), await FlowEngine.describe(third)
        with pytest.raises(FlowExists):
            await FlowEngine.start_known("T", [], "first")
    assert second.args == ("x",)
    assert [a["step"] for a in second.attempts] == ["a"]
    assert third_d["definition"]["rpcs"] == ["r"]


async def test_start_known_after_a_restart_reads_the_newest_stored_flows_definition(
    store_kind: StoreKind,
) -> None:
    path = store_kind.durable
    async with otp.open_node(), server(store_kind, by_step(a=[ok("A")], b=[ok("B")]), path=path):
        await FlowEngine.start_flow("T", [], definition(step("a")), "old")
        await FlowEngine.result("old")
        await FlowEngine.start_flow("T", [], definition(step("b")), "new")
        await FlowEngine.result("new")
        await otp.GenServer.stop(ENGINE)
        # a new engine knows no definition in memory (both flows ended): the store's newest
        await FlowEngine.start(EngineOptions(first_delivery=1000), name=ENGINE)
        flow_id = await FlowEngine.start_known("T", [])
        assert await FlowEngine.result(flow_id) == "B"
        with pytest.raises(UnknownFlowType):
            await FlowEngine.start_known("Other", [])


def test_parse_definition_round_trips_its_wire_form() -> None:
    spec = parse_definition(definition(step("a", max_attempts=5, timeout=2), rpcs=["r"]))
    assert parse_definition(spec.to_wire()) == spec
    assert spec.steps[0].retry.max_attempts == 5 and spec.steps[0].timeout == 2.0


@pytest.mark.parametrize("kind, step_kind", [("rpc", None), ("step", "execute")])
def test_the_engines_task_and_dispatch_builders_equal_the_checked_constructors(
    kind: str, step_kind: str | None
) -> None:
    # (the engine builds each Task and Dispatch it submits with these: no frozen __init__;
    # a Step's and an RPC's are the same builders)
    assert (_step_task, _step_dispatch) == (_new_task, _new_dispatch)
    values = (7, kind, "T", "f1", "a", "f1/rpc/7", 1, [1, "x"], {"n": 2}, 12.5, step_kind)
    task = _new_task(*values)
    checked = Task(*values)
    assert type(task) is Task and repr(task) == repr(checked)
    assert attrs.astuple(task, recurse=False) == attrs.astuple(checked, recurse=False) == values
    pid = object()
    dispatch = _new_dispatch(task, pid, "w1", 3.0, _NO_NAMES, False, _NO_NAMES, 0)
    expected = Dispatch(task, pid, "w1", 3.0)  # type: ignore[arg-type]
    assert type(dispatch) is Dispatch
    assert attrs.astuple(dispatch, recurse=False) == attrs.astuple(expected, recurse=False)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        task.name = "b"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        dispatch.wait = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "build, cls, values",
    [
        (_direct_routed, Routed, (7, "worker:w1", "sticky", "w1", None)),
        (_stream_routed, Routed, (7, "flow:T", "delivered", "w1", "stream")),
        (_new_completed, Completed, (7, "w1", {"v": [1]}, {"set": {"n": 1}}, False, None)),
        (_new_stream_idle, StreamIdle, ("stream", "w1", "caps", "handle", 7)),
    ],
)
def test_the_call_messages_built_on_the_rpc_path_equal_the_checked_ones(
    build: Callable[..., Any], cls: type, values: tuple[Any, ...]
) -> None:
    # (the direct route's Routed, and the stream's at a call's end, skip the frozen __init__)
    built, checked = build(*values), cls(*values)
    assert type(built) is cls and repr(built) == repr(checked)
    assert attrs.astuple(built, recurse=False) == attrs.astuple(checked, recurse=False) == values
    if cls is Routed:
        assert built == checked and hash(built) == hash(checked)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.delivery = 8


async def test_a_step_sees_the_state_its_predecessors_patched_and_sticks_to_their_worker(
    store_kind: StoreKind,
) -> None:
    script = by_step(
        a=[ok(1, worker="w1", set={"x": 1, "y": 2})],
        b=[ok(2, worker="w2", set={"z": 3}, delete=["y"])],
        c=[ok(3)],
    )
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), step("b"), step("c")), "f")
        await FlowEngine.result("f")
        log = [d for _, d in await dispatches()]
        described = await describe("f")
    assert [d.task.state for d in log] == [{}, {"x": 1, "y": 2}, {"x": 1, "z": 3}]
    assert [d.sticky_worker for d in log] == [None, "w1", "w2"]
    assert described.state == {"x": 1, "z": 3}
    assert described.sticky_worker == "w1"


# -- retries --------------------------------------------------------------------------------------


async def test_retries_wait_their_backoff(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[fail(), fail(), fail(), ok("done")])
    spec = definition(step("a", max_attempts=4, initial_backoff=1, backoff_coefficient=3))
    async with otp.open_node(), server(store_kind, script):
        start = trio.current_time()
        await FlowEngine.start_flow("T", [], spec, "f")
        assert await FlowEngine.result("f") == "done"
        log = await dispatches()
    assert [round(at - start, 6) for at, _ in log] == [0, 1, 4, 13]
    assert [d.task.attempt for _, d in log] == [1, 2, 3, 4]
    assert len({d.task.delivery for _, d in log}) == 4
    assert {d.task.execution_id for _, d in log} == {"f/0/a"}


async def test_the_backoff_stops_at_max_backoff(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[fail(), fail(), fail(), ok()])
    spec = definition(step("a", max_attempts=4, initial_backoff=2, max_backoff=3))
    async with otp.open_node(), server(store_kind, script):
        start = trio.current_time()
        await FlowEngine.start_flow("T", [], spec, "f")
        await FlowEngine.result("f")
        log = await dispatches()
    assert [round(at - start, 6) for at, _ in log] == [0, 2, 5, 8]


async def test_when_attempts_run_out_the_flow_fails_with_the_last_error(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[fail("KeyError", "first"), fail("OSError", "last")])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=2), step("b")), "f")
        with pytest.raises(FlowFailed) as info:
            await FlowEngine.result("f")
        described = await describe("f")
        names = [d.task.name for _, d in await dispatches()]
    assert info.value.details == {"flow_id": "f", "type": "OSError", "message": "last"}
    assert str(info.value) == "flow 'f' (T) failed: OSError: last"
    assert described.status is FlowStatus.FAILED
    assert described.error == {"type": "OSError", "message": "last"}
    assert [(a["attempt"], a["status"], a["error"]["type"]) for a in described.attempts] == [
        (1, "failed", "KeyError"),
        (2, "failed", "OSError"),
    ]
    assert names == ["a", "a"]


async def test_a_non_retryable_failure_fails_the_flow_at_once(store_kind: StoreKind) -> None:
    script = by_step(a=[fail("Fatal", "no", retryable=False)])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=5)), "f")
        with pytest.raises(FlowFailed, match="Fatal: no"):
            await FlowEngine.result("f")
        assert len(await dispatches()) == 1


async def test_an_error_type_the_policy_names_non_retryable_fails_the_flow_at_once(
    store_kind: StoreKind,
) -> None:
    script = by_step(a=[fail("Fatal", "no", retryable=True)])
    spec = definition({**step("a", max_attempts=5), "non_retryable_errors": ["Fatal"]})
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], spec, "f")
        with pytest.raises(FlowFailed, match="Fatal: no"):
            await FlowEngine.result("f")
        assert len(await dispatches()) == 1


async def test_not_dispatched_consumes_an_attempt_and_is_retried(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(
        a=[not_dispatched("unavailable"), not_dispatched("no_worker_available"), ok("x")]
    )
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        assert await FlowEngine.result("f") == "x"
        attempts = (await describe("f")).attempts
    assert [(a["attempt"], a["status"], a["error"]) for a in attempts] == [
        (1, "not_dispatched", {"type": "unavailable", "message": "nobody"}),
        (2, "not_dispatched", {"type": "no_worker_available", "message": "nobody"}),
        (3, "completed", None),
    ]


async def test_unknown_name_not_dispatched_runs_out_like_a_failure(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[not_dispatched("unknown_name", "no worker has step 'a'")])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=2)), "f")
        with pytest.raises(FlowFailed, match="unknown_name: no worker has step 'a'"):
            await FlowEngine.result("f")


async def test_lost_before_output_is_dispatched_again_as_the_same_attempt(
    store_kind: StoreKind,
) -> None:
    script = by_step(a=[lost(after_output=False), ok("x")])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=1)), "f")
        assert await FlowEngine.result("f") == "x"
        log = [d for _, d in await dispatches()]
        described = await describe("f")
    assert [d.task.attempt for d in log] == [1, 1]
    assert log[0].task.delivery != log[1].task.delivery
    assert [(a["attempt"], a["status"]) for a in described.attempts] == [(1, "completed")]
    redispatched = [d for d in described.dispatches if d["reason"] == "redispatch_lost"]
    assert redispatched == [
        {
            "delivery": log[1].task.delivery,
            "kind": "step",
            "name": "a",
            "attempt": 1,
            "queue": "worker:w1",
            "reason": "redispatch_lost",
            "worker_id": "w1",
            "at": redispatched[0]["at"],
        }
    ]


async def _holds_what_it_gets(test: otp.Pid) -> None:
    """A queue that never acts: tells ``test`` of each message it gets, and keeps it."""
    while True:
        otp.send(test, ("queued", await otp.receive()))


@pytest.mark.parametrize("handed", [False, True], ids=["sent", "handed_over"])
async def test_a_step_sent_straight_to_a_queue_that_dies_is_dispatched_again_as_the_same_attempt(
    store_kind: StoreKind,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
    handed: bool,
) -> None:
    # The matcher publishes the queues a fresh dispatch goes to (``_matcher_routes``): the
    # engine sends there without waking it, and watches the queue; one that dies with the
    # dispatch in it makes it Lost before output. Sent to a stand-in that keeps it, or handed
    # over to a queue published with its handle (as the matcher publishes them), where it
    # waits (no stream).
    async with otp.open_node(), server(store_kind, by_step(a=[ok("x")])):
        handle = QueueHandle() if handed else None
        if handle is not None:
            queue = await start_queue("flow", "T", MatchingLimits(), MATCHER, handle)
            otp.unlink(queue)
        else:
            queue = otp.spawn(_holds_what_it_gets, otp.self())
        routes = ets.new(routes_table(MATCHER), named=True)
        publish_route(routes, "flow:T", queue, handle)
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=1)), "f")
        if handle is None:
            _, sent = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "queued")
            assert isinstance(sent, Dispatch)
        else:
            assert handle.state is not None and handle.state.book.statistics().waiting == 1
        assert await dispatches() == []
        ets.delete(routes, "flow:T")  # (as the matcher does when it hears of the death)
        otp.exit(queue, otp.KILL)
        with trio.fail_after(60):
            assert await FlowEngine.result("f") == "x"
        log = [d for _, d in await dispatches()]
        described = await describe("f")
    lost = re.search(r"queue flow:T went down \(killed\) with delivery (\d+)", caplog.text)
    assert lost is not None
    if handle is None:
        assert int(lost[1]) == sent.task.delivery
    assert [d.task.attempt for d in log] == [1]
    assert log[0].task.delivery != int(lost[1])
    assert [(a["attempt"], a["status"]) for a in described.attempts] == [(1, "completed")]
    reasons = [(d["queue"], d["reason"], d["worker_id"]) for d in described.dispatches]
    assert reasons[:2] == [("flow:T", "flow_queue", None), ("flow:T", "redispatch_lost", "flow:T")]


async def test_an_rpc_handed_over_goes_through_the_matcher_to_a_queue_the_engine_does_not_watch(
    store_kind: StoreKind,
) -> None:
    # The engine's monitor of a queue it sends to straight must be its own: an RPC handed over
    # (run in another process's task) whose queue it does not watch yet goes through the
    # matcher; once the engine watches the queue, handed over or not, it goes straight.
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        queue = otp.spawn(_holds_what_it_gets, otp.self())
        publish_route(ets.new(routes_table(MATCHER), named=True), "flow:T", queue, None)
        await trio.testing.wait_all_tasks_blocked()
        take = handoff.call_taker(ENGINE)

        def handed_over(arg: str) -> None:
            otp.send_request(ENGINE, ("call_rpc", "f", "r", [arg], None), hand_over=take)

        handed_over("unwatched")
        await trio.testing.wait_all_tasks_blocked()
        assert [d.task.args for _, d in await dispatches()][-1] == ["unwatched"]
        await spawn_call(FlowEngine.call_rpc, "f", "r", ["sent"])  # (the engine's own task)
        _, first = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "queued")
        handed_over("watched")
        _, second = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "queued")
        assert [first.task.args, second.task.args] == [["sent"], ["watched"]]
        assert len(await dispatches()) == 2  # (the step and the first RPC)


def forwarded(node: str, worker: str) -> Any:
    """Forwarded to another server's matcher, which then says nothing more (that server's
    node goes down)."""
    return lambda delivery: [Routed(delivery, f"node:{node}", "forwarded", worker)]


async def test_a_step_forwarded_to_a_server_that_goes_down_is_dispatched_again_as_the_same_attempt(
    store_kind: StoreKind, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # The engine watches the node a forwarded delivery runs on; "gone@localhost" is no node
    # this one can reach, so its NodeDown comes at once, and the step is Lost before output.
    script = by_step(a=[forwarded("gone@localhost", "w2"), ok("x")])
    async with otp.open_node("a@localhost"), server(store_kind, script):
        await otp.start_distribution(otp.DistConfig(cookie=b"engine-test-cookie"))
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=1)), "f")
        with trio.fail_after(60):
            assert await FlowEngine.result("f") == "x"
        log = [d for _, d in await dispatches()]
        described = await describe("f")
    assert [d.task.attempt for d in log] == [1, 1]
    assert [(a["attempt"], a["status"]) for a in described.attempts] == [(1, "completed")]
    reasons = [(d["queue"], d["reason"], d["worker_id"]) for d in described.dispatches]
    assert ("node:gone@localhost", "forwarded", "w2") in reasons
    assert ("node:gone@localhost", "redispatch_lost", "w2") in reasons
    assert "the server on node gone@localhost went down (noconnection) with delivery" in caplog.text
    assert "redelivery" in caplog.text


async def test_a_lost_step_is_logged_as_a_redelivery_once(
    store_kind: StoreKind, caplog: Any
) -> None:
    # The chaos run counts these lines against the handler runs (test_chaos_run.py).
    script = by_step(a=[lost(after_output=False), lost(after_output=False), ok("x")])
    with caplog.at_level(logging.INFO, logger="apps.matching"):
        async with otp.open_node(), server(store_kind, script):
            await FlowEngine.start_flow("T", [], definition(step("a")), "f")
            await FlowEngine.result("f")
    lines = [r.getMessage() for r in caplog.records if "redelivery" in r.getMessage()]
    line = "matching engine: redelivery of step 0 attempt 1 of flow f (worker w1 went away with it)"
    assert lines == [line, line]


async def test_lost_after_output_consumes_an_attempt(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[lost(after_output=True), ok("x")])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        assert await FlowEngine.result("f") == "x"
        attempts = (await describe("f")).attempts
    assert [(a["attempt"], a["status"], a["worker_id"]) for a in attempts] == [
        (1, "lost", "w1"),
        (2, "completed", "w1"),
    ]
    assert attempts[0]["error"]["type"] == "lost"


async def test_an_attempt_past_its_timeout_fails_and_its_late_outcome_is_ignored(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[hang(), ok("second")])
    spec = definition(step("a", timeout=5, initial_backoff=1))
    async with otp.open_node(), server(store_kind, script, dispatch_wait=10):
        start = trio.current_time()
        await FlowEngine.start_flow("T", [], spec, "f")
        first = (await dispatches())[0][1]
        assert first.wait == 5
        assert first.task.deadline == start + 5
        assert await FlowEngine.result("f") == "second"
        otp.send(ENGINE, Completed(first.task.delivery, "w1", "late", {"set": {"late": 1}}))
        log = await dispatches()
        described = await describe("f")
    assert [round(at - start, 6) for at, _ in log] == [0, 6]
    assert described.result == "second" and described.state == {}
    assert [(a["status"], a["error"]) for a in described.attempts] == [
        (
            "failed",
            {"type": "timeout", "message": "step 'a' attempt 1 did not finish within its"
             " timeout of 5.0 s"},
        ),
        ("completed", None),
    ]  # fmt: skip


async def test_every_routed_outcome_becomes_a_dispatch_record(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        await FlowEngine.result("f")
        (_, d), *_ = await dispatches()
        records = (await describe("f")).dispatches
    assert [(r["delivery"], r["kind"], r["name"], r["queue"], r["reason"]) for r in records] == [
        (d.task.delivery, "step", "a", "flow:T", "flow_queue"),
        (d.task.delivery, "step", "a", "worker:w1", "delivered"),
    ]


async def test_an_outcome_carrying_its_delivered_routing_counts_as_both(
    store_kind: StoreKind,
) -> None:
    """``Completed.delivered`` (the stream read the worker's ACCEPT and RESULT at once) is
    recorded and counted as its own ``Routed`` would be, before the outcome; a late one (the
    flow was cancelled meanwhile) tells the stream nothing, the call being over."""
    async with otp.open_node(), server(store_kind, lambda task: []):
        await FlowEngine.start_flow("T", [], definition(step("a"), step("b")), "f")
        await FlowEngine.start_flow("T", [], definition(step("a")), "late")
        await trio.testing.wait_all_tasks_blocked()
        (_, d), (_, late) = await dispatches()
        me = otp.self()
        delivery = d.task.delivery
        delivered = Routed(delivery, "worker:w1", "delivered", "w1", me)
        otp.send(
            ENGINE, Completed(delivery, "w1", "x", {"set": {}, "delete": []}, False, delivered)
        )
        await trio.testing.wait_all_tasks_blocked()
        (_, d), (_, _), (_, second) = await dispatches()
        assert second.sticky_worker == "w1"  # (the worker it was delivered to)
        await FlowEngine.cancel("late")
        late_delivered = Routed(late.task.delivery, "worker:w2", "delivered", "w2", me)
        otp.send(
            ENGINE, Failed(late.task.delivery, "w2", ErrorInfo("E", "m", True), late_delivered)
        )
        await trio.testing.wait_all_tasks_blocked()
        assert (
            await otp.receive(lambda m: isinstance(m, CancelCall), timeout=0, default=None) is None
        )
        records = (await describe("f")).dispatches
        stats = await FlowEngine.statistics()
    assert [(r["delivery"], r["name"], r["queue"], r["reason"]) for r in records] == [
        (delivery, "a", "flow:T", "flow_queue"),
        (delivery, "a", "worker:w1", "delivered"),
        (second.task.delivery, "b", "flow:T", "flow_queue"),
    ]
    assert stats.dispatch_reasons["delivered"] == 2


# -- WaitFor steps --------------------------------------------------------------------------------


def wait_for_script(answers: list[Any], rpc_sets: list[dict[str, Any]]) -> Callable[[Task], Any]:
    """Step "w" answers ``answers`` in turn (the last repeats), other steps their args; each
    RPC call sets the next of ``rpc_sets`` (an empty one changes nothing)."""
    plan = by_step(w=answers)
    rpc_calls = iter(rpc_sets)

    def script(task: Task) -> Any:
        if task.kind == "rpc":
            return [ok(None, set=next(rpc_calls))]
        return plan(task) if task.name == "w" else echo(task)

    return script


async def test_a_wait_for_is_checked_again_after_each_committed_state_change(
    store_kind: StoreKind,
) -> None:
    script = wait_for_script([not_yet(), not_yet(), ok("ready")], [{"n": 1}, {}, {"n": 2}])
    spec = definition(wait_for_step("w"), step("after"), rpcs=["r"])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", ["in"], spec, "f")
        await trio.testing.wait_all_tasks_blocked()
        assert len(await dispatches()) == 1  # checked at its start, parked: nothing in flight
        assert (await FlowEngine.statistics()).dispatches_in_flight == 0
        await FlowEngine.call_rpc("f", "r")  # a change: checked again
        await FlowEngine.call_rpc("f", "r")  # no change: not checked
        await trio.testing.wait_all_tasks_blocked()
        assert len(await dispatches()) == 4  # (w, r, w, r)
        await FlowEngine.call_rpc("f", "r")  # a change: checked again, answers
        assert await FlowEngine.result("f") == ["ready"]
        log = [d.task for _, d in await dispatches()]
        described = await describe("f")
    checks = [t for t in log if t.name == "w"]
    assert [(t.attempt, t.args, t.state, t.step_kind) for t in checks] == [
        (1, ["in"], {}, "wait_for"),
        (1, ["in"], {"n": 1}, "wait_for"),
        (1, ["in"], {"n": 2}, "wait_for"),
    ]
    assert len({t.delivery for t in checks}) == 3
    assert [t.step_kind for t in log if t.name == "after"] == ["execute"]
    assert [(a["step"], a["attempt"], a["status"]) for a in described.attempts] == [
        ("w", 1, "completed"),
        ("after", 1, "completed"),
    ]
    assert [(c["step"], c["attempt"], c["not_yet"]) for c in described.checks] == [("w", 1, 2)]
    assert [d["reason"] for d in described.dispatches].count("not_yet") == 2


async def test_a_change_while_a_check_runs_makes_it_check_again_once_it_answers(
    store_kind: StoreKind,
) -> None:
    script = wait_for_script([hang(), ok("seen")], [{"n": 1}])
    spec = definition(wait_for_step("w"), rpcs=["r"])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], spec, "f")
        await trio.testing.wait_all_tasks_blocked()
        await FlowEngine.call_rpc("f", "r")  # while the first check runs (it read no "n")
        await trio.testing.wait_all_tasks_blocked()
        (_, first), _ = await dispatches()
        otp.send(ENGINE, Completed(first.task.delivery, "w1", None, {}, True))
        assert await FlowEngine.result("f") == "seen"
        checks = [d.task for _, d in await dispatches() if d.task.name == "w"]
    assert [t.state for t in checks] == [{}, {"n": 1}]


async def test_a_wait_for_past_its_timeout_fails_its_attempt_and_retries(
    store_kind: StoreKind,
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = wait_for_script([not_yet()], [{"n": 1}])
    spec = definition(wait_for_step("w", timeout=10, max_attempts=2, initial_backoff=1), rpcs=["r"])
    async with otp.open_node(), server(store_kind, script):
        start = trio.current_time()
        await FlowEngine.start_flow("T", [], spec, "f")
        await trio.sleep(4)
        await FlowEngine.call_rpc("f", "r")
        with pytest.raises(FlowFailed) as info:
            await FlowEngine.result("f")
        log = [(round(at - start, 6), d.task) for at, d in await dispatches()]
        described = await describe("f")
    assert [(at, t.attempt) for at, t in log if t.name == "w"] == [(0, 1), (4, 1), (11, 2)]
    assert [a["error"]["message"] for a in described.attempts] == [
        "WaitFor step 'w' attempt 1: its condition did not hold within its timeout of 10.0 s"
        " (2 checks answered not yet)",
        "WaitFor step 'w' attempt 2: its condition did not hold within its timeout of 10.0 s"
        " (1 checks answered not yet)",
    ]
    assert info.value.details["type"] == "timeout"
    assert [(c["attempt"], c["not_yet"]) for c in described.checks] == [(1, 2), (2, 1)]


async def test_an_execute_step_answering_not_yet_fails_the_flow_at_once(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, by_step(a=[not_yet()])):
        await FlowEngine.start_flow("T", [], definition(step("a", max_attempts=3)), "f")
        with pytest.raises(FlowFailed, match="declare it with @wait_for"):
            await FlowEngine.result("f")
        assert len(await dispatches()) == 1


# -- RPCs -----------------------------------------------------------------------------------------


async def test_an_rpc_answers_with_its_value_after_its_patch_is_stored(
    store_kind: StoreKind,
) -> None:
    def script(task: Task) -> Any:
        if task.kind == "rpc":
            return [ok(["rpc", task.args, task.state], worker="w9", set={"seen": True})]
        return [ok("s", set={"greeting": "hi"})]

    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), step("b"), rpcs=["r"]), "f")
        await FlowEngine.result("f")
        value = await FlowEngine.call_rpc("f", "r", [7], timeout=30)
        assert value == ["rpc", [7], {"greeting": "hi"}]
        rpc = next(d for _, d in await dispatches() if d.task.kind == "rpc")
        described = await describe("f")
    assert rpc.sticky_worker == "w1"
    assert rpc.task.name == "r" and rpc.task.flow_id == "f"
    assert rpc.wait == 10 and rpc.task.deadline is not None
    assert described.state == {"greeting": "hi", "seen": True}
    assert described.sticky_worker == "w1"  # RPCs do not move a flow's stickiness
    assert [(r["kind"], r["name"], r["reason"]) for r in described.dispatches][-2:] == [
        ("rpc", "r", "flow_queue"),
        ("rpc", "r", "delivered"),
    ]


async def test_an_rpc_that_changes_nothing_answers_without_waiting_for_a_commit(
    store_kind: StoreKind,
) -> None:
    def script(task: Task) -> Any:
        if task.kind == "step":
            return [hang()]
        return [ok(task.args[0], set={"n": 1} if task.args[0] == "patch" else None)]

    def answered(tag: otp.Ref) -> Any:
        return otp.receive(lambda m: isinstance(m, tuple) and m[0] == tag, timeout=0, default=None)

    async with otp.open_node(), server(store_kind, script) as store:
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        await trio.testing.wait_all_tasks_blocked()
        store.gate = trio.Event()  # every commit waits from now on
        tag = await spawn_call(FlowEngine.call_rpc, "f", "r", ["plain"])
        await trio.testing.wait_all_tasks_blocked()
        assert await answered(tag) == (tag, ("ok", "plain"))  # its dispatch records wait
        assert (await FlowEngine.statistics()).commit_in_flight is False

        patched = await spawn_call(FlowEngine.call_rpc, "f", "r", ["patch"])
        await trio.testing.wait_all_tasks_blocked()
        after = await spawn_call(FlowEngine.call_rpc, "f", "r", ["after"])
        await trio.testing.wait_all_tasks_blocked()
        assert await answered(patched) is None  # its patch is not stored yet
        assert await answered(after) is None  # it saw that patch: it waits for it too
        store.gate.set()
        assert await outcome(patched) == "patch"
        assert await outcome(after) == "after"
        described = await describe("f")
    assert described.state == {"n": 1}
    rpc_records = [r["reason"] for r in described.dispatches if r["kind"] == "rpc"]
    assert rpc_records == ["flow_queue", "delivered"] * 3  # committed later, all of them


async def test_an_rpc_outcome_handed_over_is_handled_in_the_handing_task_while_nothing_waits(
    store_kind: StoreKind,
) -> None:
    """``_engine_handoff.to_engine``: the engine handles an RPC's outcome in the task that
    hands it over (nothing reaches its mailbox, its caller is answered), unless something
    waits in its mailbox already (then it is sent, and handled after that); a Step's outcome
    is always sent."""
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        engine = otp.whereis(ENGINE)
        assert engine is not None
        for queued in (False, True):
            tag = await spawn_call(FlowEngine.call_rpc, "f", "r", [])
            await trio.testing.wait_all_tasks_blocked()
            delivery = (await dispatches())[-1][1].task.delivery
            if queued:
                otp.send(engine, "timeout")  # (what a zero timeout gives it: a commit, if due)
            handoff.to_engine(engine, Completed(delivery, "w1", queued, {}))
            assert otp.message_queue_len(engine) == (2 if queued else 0)
            assert await outcome(tag) is queued
        step_delivery = (await dispatches())[0][1].task.delivery
        waiting = otp.message_queue_len(engine)
        handoff.to_engine(engine, Completed(step_delivery, "w1", "done", {}))
        assert otp.message_queue_len(engine) == waiting + 1
        assert await FlowEngine.result("f") == "done"


async def test_an_rpc_call_handed_over_is_dispatched_in_the_handing_task_if_its_flow_is_here(
    store_kind: StoreKind,
) -> None:
    """``_engine_handoff.call_taker``: the engine takes an RPC of a flow in memory in the task
    that hands it over (``otp.send_request``'s ``hand_over``): nothing reaches its mailbox,
    the dispatch is submitted at once, and the answer goes to ``on_response``; one of a flow
    not in memory, or any other request, is sent."""
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        await trio.testing.wait_all_tasks_blocked()
        engine = otp.whereis(ENGINE)
        take = handoff.call_taker(ENGINE)
        assert engine is not None and take is not None
        seen: list[otp.Response] = []
        ref = otp.send_request(
            ENGINE, ("call_rpc", "f", "r", [1], None), on_response=seen.append, hand_over=take
        )
        assert otp.message_queue_len(engine) == 0  # (taken: not sent)
        await trio.testing.wait_all_tasks_blocked()
        rpc = (await dispatches())[-1][1]
        assert rpc.task.kind == "rpc" and rpc.task.args == [1]
        handoff.to_engine(engine, Completed(rpc.task.delivery, "w1", "answered", {}))
        assert seen == [otp.Response(ref, ("ok", "answered"), None)]
        for request in (("call_rpc", "missing", "r", [], None), ("result", "f", None)):
            waiting = otp.message_queue_len(engine)
            otp.send_request(ENGINE, request, on_response=seen.append, hand_over=take)
            assert otp.message_queue_len(engine) == waiting + 1
        with pytest.raises(FlowNotFound):
            await FlowEngine.call_rpc("missing", "r")


async def test_an_engine_failing_on_an_outcome_handed_over_ends_alone(
    store_kind: StoreKind, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the engine's handling of an outcome handed over ends the engine (its
    supervisor recovers it), not the task that handed it over."""
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        engine = otp.whereis(ENGINE)
        assert engine is not None
        ref = otp.monitor(engine)
        tag = await spawn_call(FlowEngine.call_rpc, "f", "r", [])
        await trio.testing.wait_all_tasks_blocked()
        delivery = (await dispatches())[-1][1].task.delivery
        with caplog.at_level(logging.ERROR, logger="apps.matching"):
            # (a patch that is not a dict: wire never gives one, so nothing checks it)
            handoff.to_engine(engine, Completed(delivery, "w1", None, ["not", "a", "patch"]))
        down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
        assert down.reason == (
            "engine_failed",
            "AttributeError(\"'list' object has no attribute 'get'\")",
        )
        assert "failed on" in caplog.text
        with pytest.raises(otp.CallError):
            await outcome(tag)


async def test_an_rpc_on_a_running_flow_patches_its_state(store_kind: StoreKind) -> None:
    def script(task: Task) -> Any:
        return [ok(None, set={"k": "v"})] if task.kind == "rpc" else [hang()]

    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        assert await FlowEngine.call_rpc("f", "r") is None
        assert (await describe("f")).state == {"k": "v"}


async def test_an_rpc_patch_that_changes_nothing_is_not_applied_one_of_another_shape_fails(
    store_kind: StoreKind,
) -> None:
    # (wire gives the engine only patches of state_patch's shape; these come from the script:
    # an empty one is not even looked at, a non-empty one of another shape fails the RPC)
    patches = iter([{}, {"set": [], "delete": ()}, {"set": {"k": 1}, "delete": "k"}])

    def script(task: Task) -> Any:
        if task.kind != "rpc":
            return [hang()]
        patch = next(patches)
        return [lambda delivery: [Completed(delivery, "w1", "done", patch)]]

    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        assert await FlowEngine.call_rpc("f", "r") == "done"
        assert await FlowEngine.call_rpc("f", "r") == "done"
        with pytest.raises(HandlerError, match="the RPC's state patch") as info:
            await FlowEngine.call_rpc("f", "r")
        assert info.value.error_type == "bad_patch"
        assert (await describe("f")).state == {}


@pytest.mark.parametrize(
    ("reason", "error"),
    [
        ("unavailable", Unavailable),
        ("no_worker_available", NoWorkerAvailable),
        ("unknown_name", UnknownName),
    ],
)
async def test_an_rpc_not_dispatched_raises_the_matching_error(
    store_kind: StoreKind, reason: str, error: type[Exception]
) -> None:
    def script(task: Task) -> Any:
        if task.kind == "rpc":
            return [not_dispatched(reason, f"no worker: {reason}")]
        return [hang()]

    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        with pytest.raises(error, match=f"no worker: {reason}"):
            await FlowEngine.call_rpc("f", "r")


async def test_an_rpc_that_raises_is_a_handler_error_with_its_type(store_kind: StoreKind) -> None:
    def script(task: Task) -> Any:
        return [fail("KeyError", "'x'", retryable=False)] if task.kind == "rpc" else [hang()]

    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        with pytest.raises(HandlerError) as info:
            await FlowEngine.call_rpc("f", "r")
        assert info.value.error_type == "KeyError"
        assert (await describe("f")).state == {}


async def test_an_rpc_the_definition_lacks_or_of_no_flow_fails_without_a_dispatch(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        with pytest.raises(UnknownName, match="has no RPC named 'nope' \\(it has: r\\)"):
            await FlowEngine.call_rpc("f", "nope")
        with pytest.raises(FlowNotFound):
            await FlowEngine.call_rpc("missing", "r")
        assert [d.task.kind for _, d in await dispatches()] == ["step"]


async def test_an_rpc_lost_before_output_is_dispatched_again(store_kind: StoreKind) -> None:
    plans = by_step(a=[hang()], r=[lost(after_output=False), ok("again")])
    async with otp.open_node(), server(store_kind, plans):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        assert await FlowEngine.call_rpc("f", "r") == "again"
        rpcs = [d for _, d in await dispatches() if d.task.kind == "rpc"]
        reasons = [r["reason"] for r in (await describe("f")).dispatches if r["kind"] == "rpc"]
    assert len(rpcs) == 2 and rpcs[0].task.delivery != rpcs[1].task.delivery
    assert "redispatch_lost" in reasons


async def test_an_rpc_lost_after_output_is_a_handler_error(store_kind: StoreKind) -> None:
    plans = by_step(a=[hang()], r=[lost(after_output=True)])
    async with otp.open_node(), server(store_kind, plans):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        with pytest.raises(HandlerError) as info:
            await FlowEngine.call_rpc("f", "r")
        assert info.value.error_type == "lost"


async def test_an_rpc_past_its_timeout_raises_call_timeout(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "f")
        start = trio.current_time()
        with pytest.raises(CallTimeout, match=r"did not answer within 3\.0 s"):
            await FlowEngine.call_rpc("f", "r", [], timeout=3)
        assert trio.current_time() - start == pytest.approx(3)
        rpc = next(d for _, d in await dispatches() if d.task.kind == "rpc")
        assert rpc.wait == 3
        assert (await FlowEngine.statistics()).rpcs_in_flight == 0


# -- waiting, describing, listing, cancelling -----------------------------------------------------


async def test_result_waiters_all_get_the_result_once_the_flow_ends(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        tags = [await spawn_call(FlowEngine.result, "f") for _ in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        assert (await FlowEngine.statistics()).waiters == 3
        (_, d), *_ = await dispatches()
        otp.send(ENGINE, Completed(d.task.delivery, "w1", 42, {}))
        assert [await outcome(tag) for tag in tags] == [42, 42, 42]
        assert await FlowEngine.result("f") == 42


async def test_result_of_a_flow_that_ended_here_is_answered_without_reading_the_store(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    """A ``result`` asked after its flow ended and was let go (a lone caller's short flow has
    often ended by then) is answered from what the engine kept of that end, even while a
    commit is in flight (a read of the store waits for that commit); a failure too."""
    script = by_step(a=[ok("x")], b=[fail("Fatal", "no", retryable=False)])
    async with otp.open_node(), server(store_kind, script) as store:
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        await FlowEngine.start_flow("T", [], definition(step("b")), "g")
        await trio.testing.wait_all_tasks_blocked()
        assert (await FlowEngine.statistics()).flows_resident == 0
        store.gate = trio.Event()  # every commit waits from now on
        started = await spawn_call(FlowEngine.start_flow, "T", [], definition(step("a")), "h")
        await trio.testing.wait_all_tasks_blocked()
        assert (await FlowEngine.statistics()).commit_in_flight is True
        with trio.fail_after(1):
            assert await FlowEngine.result("f") == "x"
            with pytest.raises(FlowFailed, match="Fatal: no"):
                await FlowEngine.result("g")
        store.gate.set()
        assert await outcome(started) == "h"


async def test_result_of_a_flow_whose_end_another_server_refused_is_not_kept(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    """An end whose commit was refused for a conflict (another server took the flow over) is
    not kept for ``result``: the flow is that server's, and so is its answer (here, on one
    store, this engine takes the flow back from the store, its step not done)."""
    async with otp.open_node(), server(store_kind, lambda task: [hang()]) as store:
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        (_, d), *_ = await dispatches()
        store.conflicts.add("f")
        otp.send(ENGINE, Completed(d.task.delivery, "w1", 42, {}))
        await trio.testing.wait_all_tasks_blocked()
        assert (await FlowEngine.statistics()).moved == 1
        with pytest.raises(CallTimeout, match="still running"):
            await FlowEngine.result("f", 1.0)


async def test_result_raises_call_timeout_when_its_timeout_passes(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        start = trio.current_time()
        with pytest.raises(CallTimeout, match="still running"):
            await FlowEngine.result("f", 2.5)
        assert trio.current_time() - start == pytest.approx(2.5)
        assert (await FlowEngine.statistics()).waiters == 0


async def test_one_caller_waiting_for_many_results_is_monitored_once_and_each_times_out_alone(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    """A connection passes its clients' ``result`` calls on as requests of its own: the
    engine monitors it once however many it waits for, each waiter still times out at its own
    timeout (one answered first never does), and the caller's death drops the rest."""
    script = {"f1": [hang()], "f2": [hang()], "f3": [hang()]}
    async with otp.open_node(), server(store_kind, lambda task: script[task.flow_id]):
        for flow_id in script:
            await FlowEngine.start_flow("T", [], definition(step("a")), flow_id)
        me, start = otp.self(), trio.current_time()
        engine = otp.whereis(ENGINE)
        first = otp.send_request(ENGINE, ("result", "f1", 5.0))
        second = otp.send_request(ENGINE, ("result", "f2", 3.0))
        await trio.testing.wait_all_tasks_blocked()
        info = otp.process_info(engine)
        assert info is not None
        assert [target for _, target in info.monitors].count(me) == 1
        by_flow = {d.task.flow_id: d for _, d in await dispatches()}
        await trio.sleep(1)
        otp.send(ENGINE, Completed(by_flow["f2"].task.delivery, "w1", 42, {}))
        answer = await otp.receive(lambda m: isinstance(m, otp.Response), timeout=10)
        assert (answer.request_id, answer.value) == (second, ("ok", 42))
        answer = await otp.receive(lambda m: isinstance(m, otp.Response), timeout=10)
        assert answer.request_id == first and answer.value[1] == "timeout"
        assert trio.current_time() - start == pytest.approx(5.0)
        late = await otp.receive(lambda m: isinstance(m, otp.Response), timeout=10, default=None)
        assert late is None  # (f2's answered waiter never times out)
        info = otp.process_info(engine)
        assert info is not None and me not in [target for _, target in info.monitors]

        async def waits_then_dies() -> None:
            otp.send_request(ENGINE, ("result", "f3", 60.0))
            otp.send_request(ENGINE, ("result", "f3", None))
            await trio.sleep(1)

        otp.spawn(waits_then_dies)
        await trio.sleep(0.5)
        assert (await FlowEngine.statistics()).waiters == 2
        await trio.sleep(1)
        assert (await FlowEngine.statistics()).waiters == 0


async def test_result_of_no_flow_raises_flow_not_found(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind):
        with pytest.raises(FlowNotFound, match="no flow has id 'x'"):
            await FlowEngine.result("x")
        with pytest.raises(FlowNotFound):
            await FlowEngine.describe("x")
        with pytest.raises(FlowNotFound):
            await FlowEngine.cancel("x")


async def test_a_waiter_that_dies_is_forgotten(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")

        async def wait() -> None:
            await FlowEngine.result("f")

        pid = otp.spawn(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert (await FlowEngine.statistics()).waiters == 1
        otp.exit(pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        assert (await FlowEngine.statistics()).waiters == 0


async def test_describe_reads_as_a_flow_description_with_attempts_and_dispatches(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    script = by_step(a=[fail("E", "once"), ok("A", set={"n": 1})], b=[ok("B")])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", ["in"], definition(step("a"), step("b")), "f")
        await FlowEngine.result("f")
        d = await describe("f")
        raw = await FlowEngine.describe("f")
    assert (d.flow_id, d.flow_type, d.status, d.args, d.result, d.error) == (
        "f", "T", FlowStatus.COMPLETED, ("in",), "B", None,
    )  # fmt: skip
    assert d.state == {"n": 1} and d.step_index == 2 and d.sticky_worker == "w1"
    assert d.created_at <= d.updated_at
    assert [(a["step"], a["attempt"], a["execution_id"], a["status"]) for a in d.attempts] == [
        ("a", 1, "f/0/a", "failed"),
        ("a", 2, "f/0/a", "completed"),
        ("b", 1, "f/1/b", "completed"),
    ]
    assert {a["worker_id"] for a in d.attempts} == {"w1"}
    assert len(d.dispatches) == 6
    assert raw["definition"] == parse_definition(definition(step("a"), step("b"))).to_wire()


async def test_list_flows_filters_by_type_and_status_newest_first(store_kind: StoreKind) -> None:
    def script(task: Task) -> Any:
        return [hang()] if task.flow_id.startswith("run") else [ok()]

    async with otp.open_node(), server(store_kind, script):
        for flow_id, flow_type in [("run1", "A"), ("done1", "A"), ("run2", "B"), ("done2", "B")]:
            await FlowEngine.start_flow(flow_type, [], definition(step("s")), flow_id)
            if flow_id.startswith("done"):
                await FlowEngine.result(flow_id)
        every = [FlowSummary.from_wire(s) for s in await FlowEngine.list_flows()]
        running = await FlowEngine.list_flows(status="running")
        of_a = await FlowEngine.list_flows("A")
        limited = await FlowEngine.list_flows(limit=1)
        with pytest.raises(ConfigurationError, match="status must be one of"):
            await FlowEngine.list_flows(status="sleeping")
    assert [s.flow_id for s in every] == ["done2", "run2", "done1", "run1"]
    assert {s.status for s in every} == {FlowStatus.RUNNING, FlowStatus.COMPLETED}
    assert [s["flow_id"] for s in running] == ["run2", "run1"]
    assert [s["flow_id"] for s in of_a] == ["done1", "run1"]
    assert [s["flow_id"] for s in limited] == ["done2"]


async def test_cancel_ignores_the_running_attempt_and_waiters_get_cancelled(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a"), step("b")), "f")
        tag = await spawn_call(FlowEngine.result, "f")
        await trio.testing.wait_all_tasks_blocked()
        await FlowEngine.cancel("f")
        with pytest.raises(Cancelled, match="'f' was cancelled"):
            await outcome(tag)
        (_, d), *_ = await dispatches()
        otp.send(ENGINE, Completed(d.task.delivery, "w1", "late", {}))
        await trio.testing.wait_all_tasks_blocked()
        described = await describe("f")
        with pytest.raises(Cancelled):
            await FlowEngine.result("f")
        await FlowEngine.cancel("f")  # ended: nothing changes
        assert len(await dispatches()) == 1
    assert described.status is FlowStatus.CANCELLED
    assert described.error == {"type": "cancelled", "message": "the flow was cancelled"}
    assert described.step_index == 0 and described.attempts == ()


async def test_cancel_tells_the_stream_running_the_attempt_and_one_delivered_too_late(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind, lambda task: []):
        await FlowEngine.start_flow("T", [], definition(step("a")), "running")
        await FlowEngine.start_flow("T", [], definition(step("a")), "offered")
        await trio.testing.wait_all_tasks_blocked()
        (_, running), (_, offered) = await dispatches()
        me = otp.self()  # (as the stream process that owns the call)
        otp.send(ENGINE, Routed(running.task.delivery, "worker:w1", "delivered", "w1", me))
        await FlowEngine.cancel("running")
        told = await otp.receive(lambda m: isinstance(m, CancelCall), timeout=5)
        await FlowEngine.cancel("offered")  # cancelled while offered: told once delivered
        assert await otp.receive(timeout=0, default=None) is None
        otp.send(ENGINE, Routed(offered.task.delivery, "worker:w2", "delivered", "w2", me))
        late = await otp.receive(lambda m: isinstance(m, CancelCall), timeout=5)
    assert told == CancelCall(running.task.delivery)
    assert late == CancelCall(offered.task.delivery)


async def test_cancel_stops_a_retry_waiting_for_its_backoff(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(), server(store_kind, by_step(a=[fail()])):
        await FlowEngine.start_flow("T", [], definition(step("a", initial_backoff=10)), "f")
        await trio.sleep(1)
        assert (await FlowEngine.statistics()).retries_waiting == 1
        await FlowEngine.cancel("f")
        await trio.sleep(60)
        assert len(await dispatches()) == 1
        assert (await FlowEngine.statistics()).flows_running == 0


# -- durability -----------------------------------------------------------------------------------


async def test_nothing_happens_before_its_commit(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind, lambda task: []) as store:
        store.gate = trio.Event()
        tag = await spawn_call(
            FlowEngine.start_flow, "T", [], definition(step("a"), step("b")), "f", timeout=None
        )
        await trio.testing.wait_all_tasks_blocked()
        assert await dispatches() == []  # not dispatched, not answered: not stored yet
        assert await otp.receive(timeout=0, default=None) is None
        stats = await FlowEngine.statistics()  # the mailbox is read during the commit
        assert stats.commit_in_flight and stats.commits == 0
        store.gate.set()
        assert await outcome(tag) == "f"
        await trio.testing.wait_all_tasks_blocked()
        (_, first), *_ = await dispatches()

        store.gate = trio.Event()
        otp.send(ENGINE, Completed(first.task.delivery, "w1", 1, {}))
        await trio.testing.wait_all_tasks_blocked()
        assert len(await dispatches()) == 1  # step b waits for step a's completion to be stored
        store.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        _, (_, second) = await dispatches()
        assert second.task.name == "b"

        store.gate = trio.Event()
        otp.send(ENGINE, Completed(second.task.delivery, "w1", 2, {}))
        tag = await spawn_call(FlowEngine.result, "f")
        await trio.testing.wait_all_tasks_blocked()
        assert await otp.receive(timeout=0, default=None) is None  # the result is not stored
        store.gate.set()
        assert await outcome(tag) == 2


async def test_a_pass_over_the_mailbox_is_committed_as_few_batches(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind):
        before = (await FlowEngine.statistics()).commits
        tags = [
            await spawn_call(FlowEngine.start_flow, "T", [i], definition(step("a"), step("b")))
            for i in range(50)
        ]
        ids = [await outcome(tag) for tag in tags]
        assert [await FlowEngine.result(i) for i in ids] == [[[i]] for i in range(50)]
        stats = await FlowEngine.statistics()
    # 50 flows x (create, step a, step b) in far fewer than 150 commits
    assert stats.commits - before <= 12
    assert stats.largest_batch >= 50
    assert isinstance(stats, EngineStatistics) and stats.flows_running == 0


async def test_64_concurrent_one_step_flows_share_a_few_group_commits(
    store_kind: StoreKind,
) -> None:
    async def run(i: int) -> Any:
        return await FlowEngine.result(await FlowEngine.start_flow("T", [i], one_step))

    one_step = definition(step("a"))
    async with otp.open_node(), server(store_kind):
        before = await StoreServer.statistics()
        tags = [await spawn_call(run, i) for i in range(64)]
        assert [await outcome(tag) for tag in tags] == [[i] for i in range(64)]
        after = await StoreServer.statistics()
        engine = await FlowEngine.statistics()
    # each flow needs two commits (started, then its step's outcome): 64 flows share a few
    transactions = after.store.transactions - before.store.transactions
    assert transactions <= 4
    assert after.groups - before.groups == transactions
    assert engine.largest_batch >= 64 * 2  # (a flow and its pending step, in one batch)


class _Passes(trio.abc.Instrument):
    """Counts the tasks the run schedules (each made runnable again once)."""

    def __init__(self) -> None:
        self.count = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def test_a_lone_calls_batch_is_committed_without_another_pass_over_the_empty_mailbox(
    store_kind: StoreKind,
) -> None:
    """The engine commits once its mailbox is empty, as Erlang's ``after 0`` looks at it:
    a lone call's batch goes to the store at once, not after one more pass of the scheduler
    (a wake-up of the engine a commit, two a Step, on the path of every lone caller)."""
    async with otp.open_node(), server(store_kind):
        await FlowEngine.start_flow("T", [], definition())  # (the first run's costs)
        passes = _Passes()
        trio.lowlevel.add_instrument(passes)
        try:
            await FlowEngine.start_flow("T", [], definition())
        finally:
            trio.lowlevel.remove_instrument(passes)
    # the caller's call, the engine's pass over it, the store's commit (a cast, its reply),
    # the engine's pass over that, the reply: 7 (8 with a pass over the empty mailbox)
    assert passes.count <= 7


@asynccontextmanager
async def idle_sqlite_server(store_kind: StoreKind) -> AsyncIterator[Any]:
    """``server`` on a store with threads (SQLite: an idle server's groups commit on
    trio's thread, handed over by the engine, ``_store_group.StoreHandle``); yields the
    store."""
    if store_kind.name == "postgresql":
        pytest.skip("PostgreSQL commits only in a thread (SqlStore._INLINE_RECORDS)")
    store = store_kind.store(threads=True)
    await StoreServer.start(store, name=SERVER_NAME)  # (not linked: a test crashes it)
    await FakeMatcher.start_link(echo, name=MATCHER)
    await FlowEngine.start(EngineOptions(first_delivery=1), name=ENGINE)
    await FlowEngine.start_flow("T", [], definition())  # (the first run's costs)
    yield store


def _handled(pid: Any) -> int:
    info = otp.process_info(otp.whereis(pid) if isinstance(pid, str) else pid)
    assert info is not None
    return info.messages_handled


async def test_on_an_idle_sqlite_server_the_engine_commits_in_its_own_task(
    store_kind: StoreKind,
) -> None:
    """The engine hands an idle server its batch (``StoreServer.commit_nowait``): committed
    and answered in the engine's task, its ``BatchCommitted`` taken in the same pass: the
    StoreServer's task is not woken, nor the engine's once more."""
    async with otp.open_node(), idle_sqlite_server(store_kind):
        handled = _handled(SERVER_NAME)
        passes = _Passes()
        trio.lowlevel.add_instrument(passes)
        try:
            flow_id = await FlowEngine.start_flow("T", [], definition())
        finally:
            trio.lowlevel.remove_instrument(passes)
        assert _handled(SERVER_NAME) == handled
        assert (await FlowEngine.describe(flow_id))["status"] == "completed"
    # the caller's call, the engine's pass over it (and its commit), the reply: 3 (7 by
    # message: the store's pass over the commit and the engine's over its answer)
    assert passes.count <= 3


async def test_a_bug_in_a_commit_the_engine_handed_over_crashes_the_store_not_the_engine(
    store_kind: StoreKind,
) -> None:
    bug = RuntimeError("a bug in the store")

    def commit_many(conn: Any, batches: Any) -> Any:
        raise bug

    async with otp.open_node(), idle_sqlite_server(store_kind) as store:
        engine, server_pid = otp.whereis(ENGINE), otp.whereis(SERVER_NAME)
        assert engine is not None and server_pid is not None
        engine_ref, store_ref = otp.monitor(engine), otp.monitor(server_pid)
        store._commit_many = commit_many
        await spawn_call(FlowEngine.start_flow, "T", [], definition(), "f")
        store_down = await otp.receive(
            lambda m: isinstance(m, otp.Down) and m.ref == store_ref, timeout=5
        )
        engine_down = await otp.receive(
            lambda m: isinstance(m, otp.Down) and m.ref == engine_ref, timeout=5
        )
    assert store_down.reason == otp.Crash(bug)
    assert engine_down.reason == otp.Shutdown(("store_down", otp.Crash(bug)))


async def test_a_killed_engine_recovers_its_running_flows_from_the_store(
    store_kind: StoreKind, autojump_clock: trio.testing.MockClock
) -> None:
    path = store_kind.durable
    script = by_step(
        a=[ok("A", worker="w7", set={"n": 1})],
        b=[hang()],
        c=[fail()],
    )
    spec = definition(step("a"), step("b"), rpcs=["r"])
    async with otp.open_node(), server(store_kind, script, path=path):
        await FlowEngine.start_flow("T", ["x"], spec, "f")
        await FlowEngine.start_flow("T", [], definition(step("c", initial_backoff=30)), "g")
        await FlowEngine.start_flow("T", [], definition(), "done")
        await trio.sleep(5)
        assert [d.task.name for _, d in await dispatches()] == ["a", "b", "c"]
        engine = otp.whereis(ENGINE)
        assert engine is not None
        otp.exit(engine, otp.KILL)  # mid-flow: b running, c backing off
        await otp.GenServer.stop(SERVER_NAME)

        # the server again, on the same database
        await StoreServer.start_link(GatedStore(store_kind.store(path)), name=SERVER_NAME)
        await set_script(by_step(b=[ok("B")], c=[ok("C")]))
        start = trio.current_time()
        await FlowEngine.start(EngineOptions(first_delivery=1000), name=ENGINE)
        assert await FlowEngine.result("f") == "B"
        assert await FlowEngine.result("g") == "C"
        log = await dispatches()
        described = await describe("f")
        stats = await FlowEngine.statistics()
    b, c = log[0][1], log[1][1]
    assert (b.task.name, b.task.attempt, b.task.args, b.task.state) == ("b", 1, ["A"], {"n": 1})
    assert b.sticky_worker == "w7"
    assert log[0][0] == start
    assert (c.task.name, c.task.attempt) == ("c", 2)
    assert 20 < log[1][0] - start <= 30  # the rest of its 30 s backoff
    assert described.status is FlowStatus.COMPLETED and described.state == {"n": 1}
    assert [a["step"] for a in described.attempts] == ["a", "b"]
    assert stats.flows_running == 0


async def test_the_engine_stops_when_its_store_goes_away(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind):
        engine = otp.whereis(ENGINE)
        assert engine is not None
        ref = otp.monitor(engine)
        await otp.GenServer.stop(SERVER_NAME)
        down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref, timeout=5)
    assert down.reason == otp.Shutdown(("store_down", "normal"))


async def test_start_flow_pins_the_definition_it_was_given(store_kind: StoreKind) -> None:
    script = by_step(a=[hang()], b=[ok("b")])
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "old")
        await FlowEngine.start_flow("T", [], definition(step("b"), rpcs=["q"]), "new")
        assert await FlowEngine.result("new") == "b"
        with pytest.raises(UnknownName):
            await FlowEngine.call_rpc("old", "q")
        assert (await FlowEngine.describe("old"))["definition"]["rpcs"] == ["r"]
        # the same type's definitions given again, alternately, pin each its own
        await FlowEngine.start_flow("T", [], definition(step("a"), rpcs=["r"]), "old2")
        await FlowEngine.start_flow("T", [], definition(step("b"), rpcs=["q"]), "new2")
        assert (await FlowEngine.describe("old2"))["definition"]["rpcs"] == ["r"]
        assert await FlowEngine.result("new2") == "b"


async def test_statistics_count_flows_dispatches_and_commits(store_kind: StoreKind) -> None:
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("T", [], definition(step("a")), "f")
        await trio.testing.wait_all_tasks_blocked()
        stats = await FlowEngine.statistics()
    assert stats.flows_running == 1 and stats.flows_resident == 1
    assert stats.dispatches_in_flight == 1 and stats.rpcs_in_flight == 0
    assert stats.commits >= 1 and stats.records_committed >= 2
    assert stats.commit_in_flight is False


def test_the_known_definitions_are_bounded_the_least_recently_given_going_first() -> None:
    from apps.matching._engine_definitions import MAX_KNOWN, remember

    state = attrs.make_class("S", {"known": attrs.field(factory=dict)})()
    spec = parse_definition(definition(step("a")))
    for i in range(MAX_KNOWN):
        remember(state, f"T{i}", spec)
    remember(state, "T0", spec)  # given again: now the most recent
    remember(state, "new", spec)
    assert len(state.known) == MAX_KNOWN
    assert "T0" in state.known and "new" in state.known and "T1" not in state.known
