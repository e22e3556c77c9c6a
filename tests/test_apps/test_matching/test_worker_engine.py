"""The pull worker engine against a scripted server on a real Unix socket (fake_server.py):
registration and readiness, capacity and the RPC reservation, handlers and their outcomes,
keepalive, drain, stream bounds, reconnects. Time is trio's MockClock."""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import tempfile
import threading
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import wire
from apps.matching import (
    NOT_YET,
    AuthenticationError,
    BlobCache,
    CallTimeout,
    Flow,
    MatchingError,
    PullRegistrationError,
    PullWorkerOptions,
    Registry,
    WorkerOptions,
    WorkerStopped,
    _worker_threads,
    rpc,
    step,
    subflow,
    wait_for,
)
from apps.matching._blobs import blob_key
from apps.matching._readiness import PullRegistrationState, QueueRegistrationState
from apps.matching._worker_engine import WorkerEngine
from apps.matching._worker_quick import MAX_PROOF, QUICK_AFTER, QUICK_SECONDS, QuickHandlers
from apps.matching._worker_threads import HandlerThreads

from .fake_server import FakeConn, FakeServer


class Greeting(Flow):
    @step
    async def greet(self, ctx, who):
        ctx.state["greeting"] = f"Hello, {who}!"
        ctx.output("half way")
        return ctx.state["greeting"]

    @step
    async def slow(self, ctx, seconds):
        await trio.sleep(seconds)
        return seconds

    @step
    async def forever(self, ctx):
        await trio.sleep_forever()

    @step
    async def fail(self, ctx, retryable):
        if retryable is None:
            raise ValueError("bad input")
        raise MatchingError("no way", retryable=retryable)

    @rpc
    async def greeting(self, ctx):
        return ctx.state.get("greeting")

    @rpc
    async def slow_rpc(self, ctx, seconds):
        await trio.sleep(seconds)
        return "rpc done"


class Other(Flow):
    @step
    async def noop(self, ctx):
        return None


class Kinds(Flow):
    """A WaitFor, an RPC answering NOT_YET (which it may not) and a SubFlow step."""

    @wait_for
    async def ready(self, ctx):
        ctx.state["touched"] = True  # (dropped: a check that answers "not yet" changes nothing)
        return ctx.state.get("value", NOT_YET)

    @rpc
    async def wrong(self, ctx):
        return NOT_YET

    child = subflow(Other)


FLOW = "flow:Greeting"
WORKER = "worker:w1"


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="mw", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def server(sock_dir, nursery):
    fake = FakeServer(f"{sock_dir}/s.sock")
    await nursery.start(fake.serve)
    return fake


def make_engine(server: FakeServer, flows=(Greeting,), *, cache=None, **pull: Any) -> WorkerEngine:
    pull.setdefault("max_concurrent_tasks", 4)
    options = WorkerOptions(
        server_address=server.address, app_worker_id="w1", pull=PullWorkerOptions(**pull)
    )
    return WorkerEngine(Registry(flows, allow_async_handlers=True), cache, options)


async def started(engine: WorkerEngine, nursery: trio.Nursery) -> WorkerEngine:
    nursery.start_soon(engine.run)
    await engine.wait_pull_registered(timeout=30)
    return engine


async def eventually(predicate) -> None:
    """Poll engine-side state (the fake server's events do not wake on it)."""
    while not predicate():
        await trio.sleep(0.1)


def registers(conn: FakeConn) -> list[tuple[str, str]]:
    return [(m.queue, m.name) for m in conn.of_type(wire.MatchRegister)]


# -- registration and readiness -------------------------------------------------------------


async def test_registers_every_flow_type_queue_and_the_app_worker_id_queue(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, (Greeting, Other)), nursery)
    assert sorted(registers(server.conn)) == [
        ("flow", "Greeting"),
        ("flow", "Other"),
        ("worker", "w1"),
    ]
    state = engine.pull_registration_state()
    assert state == PullRegistrationState(
        {
            q: QueueRegistrationState(q, True, None)
            for q in ("flow:Greeting", "flow:Other", "worker:w1")
        },
        True,
    )
    assert engine.is_ready()
    hello = server.conn.hello
    assert hello.worker_id == "w1"
    assert hello.flows["Greeting"]["rpcs"] == ["greeting", "slow_rpc"]
    await engine.close()


async def test_wait_before_start_and_concurrent_waiters_all_return(server, nursery, autojump_clock):
    engine = make_engine(server)
    returned = []

    async def wait(i: int) -> None:
        await engine.wait_pull_registered(timeout=30)
        returned.append(i)
        server.kick()

    for i in range(3):
        nursery.start_soon(wait, i)
    await trio.testing.wait_all_tasks_blocked()
    assert not engine.is_ready()
    nursery.start_soon(engine.run)
    await server.wait_for(lambda: len(returned) == 3)
    await engine.wait_pull_registered(timeout=1)  # at once, ever after
    await engine.close()


async def test_wait_times_out_naming_the_queues_without_acknowledgement(
    server, nursery, autojump_clock
):
    server.policy = lambda conn, m: (
        None if m.queue == "worker" else wire.MatchRegistered(queue=m.queue, name=m.name, rid=m.rid)
    )
    engine = make_engine(server)
    nursery.start_soon(engine.run)
    with pytest.raises(CallTimeout, match="worker:w1"):
        await engine.wait_pull_registered(timeout=5)
    await engine.close()


async def test_cancelling_a_wait_raises_the_cancellation(server, autojump_clock):
    engine = make_engine(server)
    with trio.move_on_after(3) as scope:
        await engine.wait_pull_registered()
    assert scope.cancelled_caught


async def test_stop_before_ready_fails_waiters_with_worker_stopped(server, nursery, autojump_clock):
    server.policy = lambda conn, m: None
    engine = make_engine(server)
    nursery.start_soon(engine.run)
    failed = trio.Event()

    async def wait():
        with pytest.raises(WorkerStopped):
            await engine.wait_pull_registered()
        failed.set()

    nursery.start_soon(wait)
    await server.wait_conns(1)
    await engine.close()
    await failed.wait()
    with pytest.raises(WorkerStopped):
        await engine.wait_pull_registered()


async def test_close_before_run_makes_run_return_at_once(server, autojump_clock):
    engine = make_engine(server)
    await engine.close()
    await engine.run()
    await engine.close()
    assert server.conns == []


def _reject(code: str = "limit", permanent: bool = True):
    def answer(m: wire.MatchRegister) -> wire.MatchRejected:
        return wire.MatchRejected(
            code=code, message=f"{code} says no", permanent=permanent, rid=m.rid
        )

    return answer


async def test_permanent_rejection_before_ready_raises_pull_registration_error(
    server, nursery, autojump_clock
):
    ok = lambda m: wire.MatchRegistered(queue=m.queue, name=m.name, rid=m.rid)  # noqa: E731
    server.policy = lambda conn, m: _reject()(m) if m.queue == "flow" else ok(m)
    engine = make_engine(server)
    nursery.start_soon(engine.run)
    with pytest.raises(PullRegistrationError) as info:
        await engine.wait_pull_registered(timeout=30)
    assert info.value.queue == FLOW
    assert info.value.cause.code == "limit" and "limit says no" in str(info.value)
    state = engine.pull_registration_state()
    assert not state.is_ready
    assert state.queues[FLOW].last_permanent_error is not None
    assert not state.queues[FLOW].has_registered_stream
    # the default keeps retrying, with backoff
    await server.wait_for(lambda: registers(server.conn).count(("flow", "Greeting")) >= 3)
    await engine.close()


async def test_permanent_rejection_with_another_registered_stream_is_only_retried(
    server, nursery, autojump_clock
):
    seen = []

    def policy(conn, m):
        seen.append(m.queue)
        if m.queue == "flow" and seen.count("flow") == 2:
            return _reject()(m)
        return wire.MatchRegistered(queue=m.queue, name=m.name, rid=m.rid)

    server.policy = policy
    engine = await started(make_engine(server, idle_streams_per_queue=2), nursery)
    await server.wait_for(lambda: len(server.conn.streams_of(FLOW)) == 2)
    state = engine.pull_registration_state()
    assert state.is_ready
    assert state.queues[FLOW].last_permanent_error is None
    assert seen.count("flow") == 3
    await engine.close()


async def test_transient_rejection_is_retried_with_backoff(server, nursery, autojump_clock):
    rejected_at = []

    def policy(conn, m):
        if m.queue == "flow" and not rejected_at:
            rejected_at.append(trio.current_time())
            return _reject("limit", permanent=False)(m)
        return wire.MatchRegistered(queue=m.queue, name=m.name, rid=m.rid)

    server.policy = policy
    engine = make_engine(server, reconnect_initial_backoff=2.0)
    nursery.start_soon(engine.run)
    await engine.wait_pull_registered(timeout=30)
    assert trio.current_time() - rejected_at[0] == pytest.approx(2.0)
    assert engine.pull_registration_state().queues[FLOW].last_permanent_error is None
    await engine.close()


async def test_successful_reregistration_clears_the_permanent_error(
    server, nursery, autojump_clock
):
    attempts = []

    def policy(conn, m):
        if m.queue == "flow":
            attempts.append(m.rid)
            if len(attempts) == 1:
                return _reject()(m)
        return wire.MatchRegistered(queue=m.queue, name=m.name, rid=m.rid)

    server.policy = policy
    engine = make_engine(server)
    nursery.start_soon(engine.run)
    with pytest.raises(PullRegistrationError):
        await engine.wait_pull_registered()
    await server.wait_for(lambda: len(attempts) == 2 and bool(server.conn.streams_of(FLOW)))
    await engine.wait_pull_registered(timeout=1)
    state = engine.pull_registration_state()
    assert state.is_ready and state.queues[FLOW].last_permanent_error is None
    await engine.close()


async def test_stop_on_permanent_rejection_ends_run_with_the_error_after_draining(
    server, nursery, autojump_clock
):
    engine = make_engine(server, stop_on_permanent_stream_rejection=True)
    outcome: list[BaseException] = []
    ended = trio.Event()

    async def run():
        try:
            await engine.run()
        except PullRegistrationError as exc:
            outcome.append(exc)
        ended.set()

    nursery.start_soon(run)
    await engine.wait_pull_registered(timeout=30)
    conn = server.conn
    start = trio.current_time()  # (the handler starts at once; its ACCEPT is held a while)
    _, delivery, answer = await conn.offer(WORKER, flow_type="Greeting", name="slow", args=[10])
    assert isinstance(answer, wire.MatchAccept)
    server.policy = lambda conn, m: _reject("already_registered")(m)
    await conn.send(wire.MatchClose(rid=conn.streams_of(FLOW)[0]))
    await ended.wait()
    assert outcome[0].queue == FLOW
    assert isinstance(conn.outcome_of(delivery), wire.MatchResult)  # drained first
    assert trio.current_time() - start == pytest.approx(10)
    assert not engine.is_ready()  # a queue with no stream and a permanent error
    await engine.wait_pull_registered(timeout=1)  # but it was ready once
    await engine.close()  # safe after run ended


async def test_start_error_reaches_run_and_the_waiters(server, nursery, autojump_clock):
    server.welcome_error = wire.MatchError(code="unauthenticated", message="bad token")
    engine = make_engine(server)
    failed = trio.Event()

    async def run():
        with pytest.raises(AuthenticationError):
            await engine.run()
        failed.set()

    nursery.start_soon(run)
    with pytest.raises(AuthenticationError, match="bad token"):
        await engine.wait_pull_registered(timeout=30)
    await failed.wait()


async def test_stop_does_not_clear_readiness(server, nursery, autojump_clock):
    engine = await started(make_engine(server), nursery)
    await engine.close()
    assert engine.is_ready()
    await engine.wait_pull_registered(timeout=1)


async def test_reconnects_with_backoff_and_stays_ready(server, nursery, autojump_clock):
    def policy(conn, m):
        if len(server.conns) == 2:  # the second connection registers nothing
            return None
        return wire.MatchRegistered(queue=m.queue, name=m.name, rid=m.rid)

    server.policy = policy
    engine = await started(make_engine(server, reconnect_initial_backoff=1.0), nursery)
    first = server.conn
    dropped = trio.current_time()
    await first.drop()
    await trio.sleep(0.5)  # within the backoff
    assert not engine.statistics().connected
    state = engine.pull_registration_state()
    assert state.is_ready and not state.queues[FLOW].has_registered_stream
    second = await server.wait_conns(2)
    assert trio.current_time() - dropped == pytest.approx(1.0)
    await server.wait_for(lambda: len(second.registers) == 2)
    dropped = trio.current_time()
    await second.drop()
    third = await server.wait_conns(3)
    assert trio.current_time() - dropped == pytest.approx(2.0)  # nothing registered: doubled
    await server.wait_for(lambda: len(third.registered) == 2)
    await eventually(lambda: engine.pull_registration_state().queues[FLOW].has_registered_stream)
    assert engine.is_ready()
    await engine.close()


async def test_server_reconnect_request_finishes_running_calls_first(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server), nursery)
    first = server.conn
    _, delivery, _ = await first.offer(FLOW, flow_type="Greeting", name="slow", args=[10])
    start = trio.current_time()
    await first.send(wire.MatchReconnect(reason="rebalance"))
    _, _, declined = await first.offer(FLOW, flow_type="Greeting", name="greet", args=["x"])
    assert isinstance(declined, wire.MatchDecline) and declined.reason == "draining"
    second = await server.wait_conns(2)
    assert isinstance(first.outcome_of(delivery), wire.MatchResult)
    assert trio.current_time() - start >= 10
    await server.wait_for(lambda: len(second.registered) == 2)
    await engine.close()


# -- tasks ------------------------------------------------------------------------------------


async def test_step_result_carries_value_patch_and_output_first(server, nursery, autojump_clock):
    engine = await started(make_engine(server), nursery)
    conn = server.conn
    stream, delivery, answer = await conn.offer(
        FLOW, flow_type="Greeting", name="greet", args=["world"], state={"keep": 1}
    )
    assert answer == wire.MatchAccept(delivery=delivery, rid=stream)
    result = await conn.wait_outcome(delivery)
    assert result == wire.MatchResult(
        delivery=delivery,
        value="Hello, world!",
        patch={"set": {"greeting": "Hello, world!"}, "delete": []},
        rid=stream,
    )
    frames = [m for m in conn.received if getattr(m, "rid", None) == stream]
    assert frames.index(wire.MatchOutput(delivery=delivery, value="half way", rid=stream)) < (
        frames.index(result)
    )
    _, delivery, _ = await conn.offer(
        WORKER, flow_type="Greeting", name="greeting", kind="rpc", state={"greeting": "hi"}
    )
    reply = await conn.wait_outcome(delivery)
    assert reply.value == "hi" and reply.patch == {"set": {}, "delete": []}
    await engine.close()


@pytest.mark.parametrize(
    ("arg", "kind", "retryable"),
    [(None, "ValueError", True), (True, "MatchingError", True), (False, "MatchingError", False)],
)
async def test_handler_exception_becomes_failure(
    server, nursery, autojump_clock, arg, kind, retryable
):
    engine = await started(make_engine(server), nursery)
    _, delivery, _ = await server.conn.offer(FLOW, flow_type="Greeting", name="fail", args=[arg])
    failure = await server.conn.wait_outcome(delivery)
    assert isinstance(failure, wire.MatchFailure)
    assert (failure.type, failure.retryable) == (kind, retryable)
    await engine.close()


async def test_unknown_flow_type_step_or_rpc_is_declined_unknown_name(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server), nursery)
    conn = server.conn
    # (the step "greet" served first: the worker keeps the handlers it found, by flow type,
    # kind and name, and nothing for a name it declined, which is declined again)
    _, served, _ = await conn.offer(WORKER, flow_type="Greeting", name="greet", args=["a"])
    assert (await conn.wait_outcome(served)).value == "Hello, a!"
    for flow_type, name, kind in [
        ("Nope", "greet", "step"),
        ("Greeting", "nope", "step"),
        ("Greeting", "nope", "rpc"),
        ("Greeting", "greet", "rpc"),  # a step's name is no RPC
    ] * 2:
        _, _, answer = await conn.offer(WORKER, flow_type=flow_type, name=name, kind=kind)
        assert isinstance(answer, wire.MatchDecline)
        assert answer.reason == "unknown_name"
        assert repr(name if flow_type == "Greeting" else flow_type) in answer.message
    assert [m.delivery for m in conn.of_type(wire.MatchResult)] == [served]
    assert engine.pull_reserved_rpc_declines == 0
    await engine.close()


async def test_a_wait_for_answers_not_yet_without_a_patch_until_its_condition_holds(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, (Kinds,)), nursery)
    conn = server.conn
    _, first, _ = await conn.offer("flow:Kinds", flow_type="Kinds", name="ready")
    assert await conn.wait_outcome(first) == wire.MatchResult(
        delivery=first, value=None, not_yet=True, rid=conn.answer_to(first).rid
    )
    _, second, _ = await conn.offer(
        "flow:Kinds", flow_type="Kinds", name="ready", state={"value": 7}
    )
    result = await conn.wait_outcome(second)
    assert (result.value, result.not_yet, result.patch["set"]) == (7, None, {"touched": True})
    _, third, _ = await conn.offer("worker:w1", flow_type="Kinds", name="wrong", kind="rpc")
    failure = await conn.wait_outcome(third)
    assert (failure.type, failure.retryable) == ("ConfigurationError", False)
    assert "only a @wait_for Step may" in failure.message
    _, _, answer = await conn.offer("flow:Kinds", flow_type="Kinds", name="child")
    assert isinstance(answer, wire.MatchDecline) and answer.reason == "unknown_name"
    await engine.close()


async def test_m_cancel_cancels_a_running_async_handler_and_answers_cancelled(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server), nursery)
    conn = server.conn
    stream, delivery, _ = await conn.offer(FLOW, flow_type="Greeting", name="forever")
    await eventually(lambda: engine.statistics().busy == 1)
    await conn.send(wire.MatchCancel(delivery + 1, rid=stream))  # not its call: ignored
    await trio.sleep(1)
    assert engine.statistics().busy == 1
    await conn.send(wire.MatchCancel(delivery, rid=stream))
    failure = await conn.wait_outcome(delivery)
    assert (failure.type, failure.retryable) == ("Cancelled", False)
    assert "was cancelled by the server" in failure.message
    assert engine.statistics().busy == 0
    await engine.close()


async def test_m_cancel_cannot_interrupt_a_blocking_handler_whose_result_still_comes(
    server, nursery, caplog
):
    caplog.set_level(logging.INFO, "apps.matching.worker")
    release = threading.Event()
    entered = threading.Event()

    class Blocking(Flow):
        @step
        def work(self, ctx):
            entered.set()
            release.wait(10)
            return "done anyway"

    engine = make_engine(server, (Blocking,))
    with trio.fail_after(20):
        await started(engine, nursery)
        conn = server.conn
        stream, delivery, _ = await conn.offer("flow:Blocking", flow_type="Blocking", name="work")
        await trio.to_thread.run_sync(entered.wait)
        await conn.send(wire.MatchCancel(delivery, rid=stream))
        await eventually(lambda: "cancelled by the server" in caplog.text)
        assert conn.outcome_of(delivery) is None  # (the thread runs on)
        release.set()
        result = await conn.wait_outcome(delivery)
        assert result.value == "done anyway"
        await engine.close()


async def test_reserved_slots_decline_steps_count_and_rpcs_use_all_capacity(
    server, nursery, autojump_clock, caplog
):
    caplog.set_level(logging.DEBUG, logger="apps.matching.worker")
    engine = await started(
        make_engine(server, max_concurrent_tasks=3, reserved_rpc_tasks=1), nursery
    )
    conn = server.conn

    async def offer(name, kind="step", queue=FLOW):
        _, _, answer = await conn.offer(
            queue, flow_type="Greeting", name=name, kind=kind, args=[100]
        )
        return answer

    assert isinstance(await offer("slow"), wire.MatchAccept)
    assert isinstance(await offer("slow"), wire.MatchAccept)
    declined = await offer("slow")  # 2 busy of 3, 1 reserved
    assert (declined.reason, engine.pull_reserved_rpc_declines) == ("no_capacity", 1)
    assert "flow type Greeting" in caplog.text
    assert isinstance(await offer("slow_rpc", "rpc"), wire.MatchAccept)
    full = await offer("slow")  # all 3 busy: not a reserved decline
    assert full.reason == "no_capacity"
    full_rpc = await offer("slow_rpc", "rpc")
    assert full_rpc.reason == "no_capacity"
    assert engine.pull_reserved_rpc_declines == 1
    await engine.close()
    assert engine.pull_reserved_rpc_declines == 1  # readable after close


async def test_cap_of_one_without_reservation_warns_once_naming_both_options(
    server, nursery, autojump_clock, caplog
):
    engine = await started(make_engine(server, max_concurrent_tasks=1), nursery)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "max_concurrent_tasks" in warnings[0].message
    assert "reserved_rpc_tasks" in warnings[0].message
    _, _, answer = await server.conn.offer(FLOW, flow_type="Greeting", name="slow", args=[1])
    assert isinstance(answer, wire.MatchAccept)  # no reservation: the step takes the slot
    await engine.close()


async def test_running_task_sends_pong_every_20_seconds(server, nursery, autojump_clock):
    engine = await started(make_engine(server), nursery)
    conn = server.conn
    start = trio.current_time()  # (the call starts at once; its ACCEPT is held a while)
    stream, delivery, _ = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[65])
    times = []

    def pongs():
        n = len(conn.of_type(wire.MatchPong, stream))
        if len(times) < n:
            times.append(trio.current_time() - start)
        return n

    await server.wait_for(lambda: pongs() == 3)
    assert times == pytest.approx([20, 40, 60])
    await conn.wait_outcome(delivery)
    assert len(conn.of_type(wire.MatchPong, stream)) == 3
    await engine.close()


async def test_pings_are_answered_with_pongs(server, nursery, autojump_clock):
    engine = await started(make_engine(server), nursery)
    conn = server.conn
    stream = conn.streams_of(FLOW)[0]
    await conn.send(wire.MatchPing(rid=stream))
    await conn.send(wire.MatchPing())
    await server.wait_for(lambda: len(conn.of_type(wire.MatchPong)) == 2)
    assert conn.of_type(wire.MatchPong) == [wire.MatchPong(rid=stream), wire.MatchPong()]
    await engine.close()


async def test_sync_handlers_run_in_threads(server, nursery):
    main = threading.get_ident()

    class Sync(Flow):
        @step
        def work(self, ctx, n):
            ctx.output("from a thread")
            ctx.state["n"] = n
            return [n * 2, threading.get_ident() != main]

    options = WorkerOptions(
        server_address=server.address,
        app_worker_id="w1",
        pull=PullWorkerOptions(max_concurrent_tasks=2),
    )
    engine = WorkerEngine(Registry((Sync,)), None, options)
    with trio.fail_after(10):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        stream, delivery, _ = await conn.offer("flow:Sync", flow_type="Sync", name="work", args=[3])
        result = await conn.wait_outcome(delivery)
        assert result.value == [6, True]
        assert result.patch == {"set": {"n": 3}, "delete": []}
        assert conn.of_type(wire.MatchOutput, stream)[0].value == "from a thread"
        await engine.close()


class _Spawns(trio.abc.Instrument):
    """Counts the trio tasks spawned while installed."""

    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


def _sync_engine(server: FakeServer, flows: tuple[type[Flow], ...], **kw: Any) -> WorkerEngine:
    options = WorkerOptions(
        server_address=server.address,
        app_worker_id="w1",
        pull=PullWorkerOptions(max_concurrent_tasks=2),
    )
    return WorkerEngine(Registry(flows), kw.pop("cache", None), options)


async def test_a_blocking_call_runs_with_no_task_of_its_own(server, nursery):
    class Sync(Flow):
        @step
        def work(self, ctx, n):
            ctx.state["n"] = n
            return n + 1

        @rpc
        def fail(self, ctx):
            raise ValueError("no")

    engine = _sync_engine(server, (Sync,))
    with trio.fail_after(10):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        spawns = _Spawns()
        trio.lowlevel.add_instrument(spawns)
        try:
            _, delivery, _ = await conn.offer("flow:Sync", flow_type="Sync", name="work", args=[1])
            result = await conn.wait_outcome(delivery)
            _, delivery, _ = await conn.offer(WORKER, flow_type="Sync", name="fail", kind="rpc")
            failure = await conn.wait_outcome(delivery)
        finally:
            trio.lowlevel.remove_instrument(spawns)
        assert (result.value, result.patch) == (2, {"set": {"n": 1}, "delete": []})
        assert (failure.type, failure.message, failure.retryable) == ("ValueError", "no", True)
        assert spawns.count == 0
        await engine.close()


async def test_blocking_outputs_come_in_order_before_the_outcome(server, nursery):
    class Sync(Flow):
        @step
        def work(self, ctx):
            for i in range(3):
                ctx.output(i)
            return "done"

    engine = _sync_engine(server, (Sync,))
    with trio.fail_after(10):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        stream, delivery, _ = await conn.offer("flow:Sync", flow_type="Sync", name="work")
        result = await conn.wait_outcome(delivery)
        frames = [m for m in conn.received if getattr(m, "rid", None) == stream]
        outputs = [m.value for m in frames if isinstance(m, wire.MatchOutput)]
        assert outputs == [0, 1, 2]
        assert frames.index(result) > max(
            i for i, m in enumerate(frames) if isinstance(m, wire.MatchOutput)
        )
        await engine.close()


async def test_a_blocking_handler_past_its_timeout_fails_with_timeout_error(server, nursery):
    class Sync(Flow):
        @step
        def work(self, ctx):
            threading.Event().wait(0.3)
            return "late"

    engine = _sync_engine(server, (Sync,))
    with trio.fail_after(10):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        _, delivery, _ = await conn.offer("flow:Sync", flow_type="Sync", name="work", timeout=0.05)
        failure = await conn.wait_outcome(delivery)
        assert (failure.type, failure.retryable) == ("TimeoutError", True)
        assert "timeout of 0.05s" in failure.message
        assert engine.statistics().busy == 0
        await engine.close()


async def test_a_blocking_handler_with_blobs_fetches_and_uploads_them(server, nursery, tmp_path):
    class Sync(Flow):
        @step
        def echo(self, ctx, data):
            return data + b"!"

    cache = BlobCache(tmp_path / "blobs", inline_limit=4)
    engine = _sync_engine(server, (Sync,), cache=cache)
    stored: dict[str, bytes] = {}
    sent = b"0123456789"
    stored[blob_key(sent)] = sent

    async def blob_service(conn):
        answered = 0
        while True:
            await server.wait_for(lambda n=answered: len(conn.of_type(wire.MatchCall)) > n)
            call = conn.of_type(wire.MatchCall)[answered]
            answered += 1
            if call.op == "get_blob":
                await conn.send(wire.MatchReply(value=stored[call.args["key"]], rid=call.rid))
            elif call.op == "put_blob":
                key = blob_key(call.args["data"])
                stored[key] = call.args["data"]
                await conn.send(wire.MatchReply(value=key, rid=call.rid))

    with trio.fail_after(10):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        nursery.start_soon(blob_service, conn)
        ref = {"$blob": blob_key(sent), "size": len(sent)}
        _, delivery, _ = await conn.offer("flow:Sync", flow_type="Sync", name="echo", args=[ref])
        result = await conn.wait_outcome(delivery)
        assert stored[result.value["$blob"]] == sent + b"!"
        assert [c.op for c in conn.of_type(wire.MatchCall)][-2:] == ["get_blob", "put_blob"]
        await engine.close()


async def test_blocking_handlers_run_at_once_up_to_the_cap_and_never_stall_pings(server, nursery):
    # Each Step blocks its thread until all three run: they finish only if no blocking
    # handler waits behind another one. Meanwhile the engine still answers pings.
    release = threading.Event()
    barrier = threading.Barrier(3, timeout=10)

    class Blocking(Flow):
        @step
        def work(self, ctx, n):
            barrier.wait()
            release.wait(10)
            return n

    options = WorkerOptions(
        server_address=server.address,
        app_worker_id="w1",
        pull=PullWorkerOptions(max_concurrent_tasks=3, reserved_rpc_tasks=0),
    )
    engine = WorkerEngine(Registry((Blocking,)), None, options)
    with trio.fail_after(20):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        deliveries = []
        for n in range(3):
            _, delivery, answer = await conn.offer(
                "flow:Blocking", flow_type="Blocking", name="work", args=[n]
            )
            assert isinstance(answer, wire.MatchAccept)
            deliveries.append(delivery)
        await eventually(lambda: barrier.n_waiting == 0 and engine.statistics().busy == 3)
        await conn.send(wire.MatchPing())
        await server.wait_for(lambda: wire.MatchPong() in conn.of_type(wire.MatchPong))
        release.set()
        values = [(await conn.wait_outcome(d)).value for d in deliveries]
        assert values == [0, 1, 2]
        assert engine.statistics().busy == 0
        await engine.close()


async def test_a_cancelled_blocking_handler_is_waited_for_before_its_slot_frees(server, nursery):
    # A thread cannot be interrupted: at the drain timeout the call is cancelled, but run()
    # returns only once the function has returned (the slot is not freed under it).
    returned = threading.Event()
    entered = threading.Event()

    class Stuck(Flow):
        @step
        def work(self, ctx):
            entered.set()
            threading.Event().wait(0.3)
            returned.set()

    options = WorkerOptions(
        server_address=server.address,
        app_worker_id="w1",
        pull=PullWorkerOptions(max_concurrent_tasks=2, stop_drain_timeout=0.05),
    )
    engine = WorkerEngine(Registry((Stuck,)), None, options)
    with trio.fail_after(20):
        nursery.start_soon(engine.run)
        await engine.wait_pull_registered()
        conn = server.conn
        await conn.offer("flow:Stuck", flow_type="Stuck", name="work")
        await trio.to_thread.run_sync(entered.wait)
        await engine.close()
        assert returned.is_set()
        assert engine.statistics().busy == 0


async def test_cancelling_run_waits_for_a_running_blocking_handler(server, nursery):
    release = threading.Event()
    entered = threading.Event()

    class Stuck(Flow):
        @step
        def work(self, ctx):
            entered.set()
            release.wait(10)

    engine = _sync_engine(server, (Stuck,))
    returned = trio.Event()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await engine.run()
        returned.set()

    with trio.fail_after(20):
        scope = await nursery.start(run)
        await engine.wait_pull_registered()
        await server.conn.offer("flow:Stuck", flow_type="Stuck", name="work")
        await trio.to_thread.run_sync(entered.wait)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert not returned.is_set()  # the function still runs in its thread
        release.set()
        await returned.wait()
        assert engine.statistics().busy == 0


async def test_a_job_for_an_idle_handler_thread_is_handed_over_when_the_trio_loop_sleeps():
    # Woken while the trio thread still runs, the thread would only wait for the GIL.
    threads = HandlerThreads()
    assert await threads.run(lambda: 1) == 1  # (one thread, idle now)
    ran = threading.Event()
    threads.submit(ran.set, lambda result: None)
    assert not ran.wait(0.2)  # (the trio thread has not slept since: the job is held)
    assert await trio.to_thread.run_sync(ran.wait, 10)
    assert threads.started == 1


async def test_the_instrument_handing_jobs_over_goes_when_idle_and_comes_back_with_a_job(
    monkeypatch,
):
    # (a worker whose calls all run on the trio thread pays nothing for it on each pass)
    monkeypatch.setattr(_worker_threads, "IDLE_PASSES", 3)
    threads = HandlerThreads()
    assert await threads.run(lambda: 1) == 1  # (one thread, idle now)
    for _ in range(2):
        assert await threads.run(lambda: 2) == 2  # (held, then handed over)
        assert threads._instrument is not None
        for _ in range(4):
            await trio.sleep(0)  # (a pass of the trio loop each, with no job to hand over)
        assert threads._instrument is None
    assert threads.started == 1


# -- quick plain-function handlers on the trio thread (_worker_quick.py) --------------------


class Proven(Flow):
    #: The engine's clock for timing handlers (a run takes as long as it moves it on).
    now = 0.0

    @step
    def work(self, ctx, n=None):
        if n == "output":
            ctx.output("first")
        if n == "slow":
            Proven.now += QUICK_SECONDS * 3  # (blocking work, as its clock sees it)
        return threading.get_ident()


def _proven_engine(server: FakeServer, **pull: Any) -> WorkerEngine:
    options = WorkerOptions(
        server_address=server.address,
        app_worker_id="w1",
        pull=PullWorkerOptions(max_concurrent_tasks=2, **pull),
    )
    engine = WorkerEngine(Registry((Proven,)), None, options)
    engine._quick.clock = lambda: Proven.now  # (no wall clock: a loaded machine is slow)
    return engine


async def _run_proven(conn: FakeConn, n: Any = None) -> tuple[int, Any]:
    """One Step of Proven (one at a time); (its stream, its M_RESULT)."""
    stream, delivery = await conn.offer_nowait(
        "flow:Proven", flow_type="Proven", name="work", args=[n]
    )
    return stream, await conn.wait_outcome(delivery)


async def _proven(server: FakeServer, nursery: trio.Nursery) -> tuple[WorkerEngine, FakeConn]:
    """A started engine whose Proven Step proved quick: each of those runs in a thread."""
    engine = await started(_proven_engine(server), nursery)
    conn = server.conn
    for _ in range(QUICK_AFTER):
        _, result = await _run_proven(conn)
        assert result.value != threading.get_ident()
    return engine, conn


async def test_a_handler_quick_in_threads_runs_on_the_trio_thread_with_no_hand_off(server, nursery):
    here = threading.get_ident()
    with trio.fail_after(10):
        engine, conn = await _proven(server, nursery)
        threads = engine._threads
        assert threads is not None
        started_threads = threads.started
        stream, result = await _run_proven(conn)
        assert result.value == here
        accept = wire.MatchAccept(delivery=result.delivery, rid=stream)
        assert conn.read_together(accept, result)
        assert threads.started == started_threads
        assert engine.statistics().busy == 0
        await engine.close()


async def test_an_output_on_the_trio_thread_comes_after_the_accept_and_before_the_outcome(
    server, nursery
):
    with trio.fail_after(10):
        engine, conn = await _proven(server, nursery)
        stream, result = await _run_proven(conn, "output")
        assert result.value == threading.get_ident()
        frames = [m for m in conn.received if getattr(m, "rid", None) == stream]
        delivery = result.delivery
        mine = [m for m in frames if getattr(m, "delivery", None) == delivery]
        assert [type(m) for m in mine] == [wire.MatchAccept, wire.MatchOutput, wire.MatchResult]
        assert mine[1].value == "first"
        assert engine.statistics().busy == 0
        await engine.close()


async def test_a_slow_run_on_the_trio_thread_sends_the_handler_back_to_the_threads(server, nursery):
    here = threading.get_ident()
    with trio.fail_after(10):
        engine, conn = await _proven(server, nursery)
        _, result = await _run_proven(conn, "slow")
        assert result.value == here  # (it ran here: only its time tells it blocked)
        for _ in range(QUICK_AFTER * 2):
            _, result = await _run_proven(conn)
            assert result.value != here
        _, result = await _run_proven(conn)
        assert result.value == here
        await engine.close()


async def test_handlers_stay_in_threads_when_inline_quick_handlers_is_off(server, nursery):
    engine = _proven_engine(server, inline_quick_handlers=False)
    with trio.fail_after(10):
        await started(engine, nursery)
        conn = server.conn
        for _ in range(QUICK_AFTER + 2):
            _, result = await _run_proven(conn)
            assert result.value != threading.get_ident()
        await engine.close()


def test_a_handler_must_prove_itself_twice_as_long_after_each_slow_run_up_to_a_bound():
    quick = QuickHandlers()
    handler = object()
    for proof in (QUICK_AFTER, QUICK_AFTER * 2, QUICK_AFTER * 4):
        for _ in range(proof - 1):
            quick.ran_in_thread(handler, 0.0)
        assert not quick.is_quick(handler)
        quick.ran_in_thread(handler, 0.0)
        assert quick.is_quick(handler)
        quick.ran_inline(handler, QUICK_SECONDS / 2)  # (quick: it stays)
        assert quick.is_quick(handler)
        quick.ran_inline(handler, QUICK_SECONDS * 2)
        assert not quick.is_quick(handler)
    quick.ran_in_thread(handler, QUICK_SECONDS * 2)  # a slow run in a thread starts over
    assert quick.demoted == 3
    for _ in range(20):
        quick.ran_inline(handler, 1.0)
    assert quick._proof[id(handler)] == MAX_PROOF


def test_quick_runs_on_the_trio_thread_halve_what_a_sent_back_handler_must_prove():
    quick = QuickHandlers()
    handler = object()
    for _ in range(QUICK_AFTER):
        quick.ran_in_thread(handler, 0.0)
    quick.ran_inline(handler, QUICK_SECONDS * 2)  # (a preempted thread, say)
    quick.ran_inline(handler, QUICK_SECONDS * 2)
    assert quick._proof[id(handler)] == QUICK_AFTER * 4
    for _ in range(QUICK_AFTER * 4):
        quick.ran_in_thread(handler, 0.0)
    for _ in range(MAX_PROOF - 1):
        quick.ran_inline(handler, 0.0)
    assert quick._proof[id(handler)] == QUICK_AFTER * 4
    quick.ran_inline(handler, 0.0)
    assert quick._proof[id(handler)] == QUICK_AFTER * 2
    assert quick.is_quick(handler)
    for _ in range(MAX_PROOF * 3):
        quick.ran_inline(handler, 0.0)
    assert quick._proof[id(handler)] == QUICK_AFTER
    assert quick.is_quick(handler)


class _Cache:
    """BlobCache's async interface: ``blob:<key>`` args are fetched, bytes results uploaded."""

    async def unpack_async(self, value, fetch):
        return [
            (await fetch(v[5:])) if isinstance(v, str) and v.startswith("blob:") else v
            for v in value
        ]

    async def pack_async(self, value, upload):
        return f"blob:{await upload(value)}" if isinstance(value, bytes) else value


class Blobs(Flow):
    @step
    async def echo(self, ctx, data):
        return data + b"!"


async def test_blobs_are_fetched_before_and_uploaded_after_the_handler(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, (Blobs,), cache=_Cache()), nursery)
    conn = server.conn

    async def blob_service():
        answered = 0
        while True:
            await server.wait_for(lambda n=answered: len(conn.of_type(wire.MatchCall)) > n)
            call = conn.of_type(wire.MatchCall)[answered]
            answered += 1
            if call.op == "define_flows":  # (the fake server answers it)
                continue
            if call.op == "get_blob":
                await conn.send(
                    wire.MatchReply(value=b"data-" + call.args["key"].encode(), rid=call.rid)
                )
            else:
                await conn.send(wire.MatchReply(value="k2", rid=call.rid))

    nursery.start_soon(blob_service)
    _, delivery, _ = await conn.offer(
        "flow:Blobs", flow_type="Blobs", name="echo", args=["blob:k1"]
    )
    result = await conn.wait_outcome(delivery)
    assert result.value == "blob:k2"
    put = [c for c in conn.of_type(wire.MatchCall) if c.op == "put_blob"]
    assert put[0].args == {"data": b"data-k1!"}
    await engine.close()


# -- drain ------------------------------------------------------------------------------------


async def test_close_drains_running_handlers_and_declines_new_tasks(
    server, nursery, autojump_clock
):
    engine = make_engine(server)
    ran = trio.Event()

    async def run():
        await engine.run()
        ran.set()

    nursery.start_soon(run)
    await engine.wait_pull_registered()
    conn = server.conn
    start = trio.current_time()  # (the handler starts at once; its ACCEPT is held a while)
    _, delivery, _ = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[10])
    closed = trio.Event()

    async def close():
        await engine.close()
        closed.set()

    nursery.start_soon(close)
    await server.wait_for(lambda: bool(conn.of_type(wire.MatchDraining)))
    _, _, answer = await conn.offer(WORKER, flow_type="Greeting", name="greet", args=["x"])
    assert (answer.reason, answer.message) == ("draining", "worker w1 is stopping")
    await closed.wait()
    assert trio.current_time() - start == pytest.approx(10)
    assert isinstance(conn.outcome_of(delivery), wire.MatchResult)
    await ran.wait()
    await server.wait_for(lambda: not conn.open)
    await engine.close()  # again


async def test_a_handler_past_its_task_timeout_is_cancelled_and_its_slot_freed(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server), nursery)
    conn = server.conn
    start = trio.current_time()
    _, delivery, answer = await conn.offer(FLOW, flow_type="Greeting", name="forever", timeout=3.0)
    assert isinstance(answer, wire.MatchAccept)
    with trio.fail_after(60):
        outcome = await conn.wait_outcome(delivery)
    assert trio.current_time() - start == pytest.approx(3.0)
    assert isinstance(outcome, wire.MatchFailure)
    assert (outcome.type, outcome.retryable) == ("TimeoutError", True)
    assert "'forever'" in outcome.message and "timeout of 3.0s" in outcome.message
    assert engine.statistics().busy == 0
    # a handler that finishes in time is not affected
    _, delivery, _ = await conn.offer(
        FLOW, flow_type="Greeting", name="slow", args=[2], timeout=3.0
    )
    assert (await conn.wait_outcome(delivery)).value == 2
    await engine.close()


async def test_close_cancels_handlers_after_stop_drain_timeout(server, nursery, autojump_clock):
    engine = await started(make_engine(server, stop_drain_timeout=5), nursery)
    conn = server.conn
    _, delivery, _ = await conn.offer(FLOW, flow_type="Greeting", name="forever")
    start = trio.current_time()
    await engine.close()
    assert trio.current_time() - start == pytest.approx(5)
    assert conn.outcome_of(delivery) is None  # cancelled: the server re-dispatches it
    assert engine.statistics().busy == 0


async def test_results_of_a_lost_connection_are_dropped_and_slots_freed(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, reconnect_initial_backoff=1.0), nursery)
    first = server.conn
    _, delivery, _ = await first.offer(FLOW, flow_type="Greeting", name="slow", args=[10])
    await first.drop()
    second = await server.wait_conns(2)
    await eventually(lambda: engine.statistics().busy == 0)
    assert first.outcome_of(delivery) is None
    assert second.of_type(wire.MatchResult) == []
    await engine.close()


# -- the held ACCEPT (PullWorkerOptions.accept_delay) -----------------------------------------


class _LoopWakes(trio.abc.Instrument):
    """Counts the wake-ups of the worker's tasks whose name ends with ``suffix`` (a loop)."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.count = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(self.suffix):
            self.count += 1


async def test_a_handler_ending_within_the_accept_delay_sends_accept_and_result_in_one_write(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, accept_delay=0.005), nursery)
    conn = server.conn
    start = trio.current_time()
    stream, delivery = await conn.offer_nowait(
        WORKER, flow_type="Greeting", name="greeting", kind="rpc", state={"greeting": "hi"}
    )
    result = await conn.wait_outcome(delivery)
    accept = conn.answer_to(delivery)
    assert accept == wire.MatchAccept(delivery=delivery, rid=stream)
    assert result.value == "hi"
    assert conn.read_together(accept, result)  # ACCEPT first, in the RESULT's write
    assert conn.time_of(result) - start < 0.005
    await trio.sleep(1)  # the delay passes: nothing more is sent for the call
    assert conn.of_type(wire.MatchAccept) == [accept]
    await engine.close()


@pytest.fixture
def frozen_clock() -> trio.testing.MockClock:
    """Trio's clock standing still: a handler thread always ends "within" any delay."""
    return trio.testing.MockClock()


async def test_a_blocking_handler_ending_within_the_accept_delay_sends_one_write(
    server, nursery, frozen_clock
):
    class Sync(Flow):
        @rpc
        def read(self, ctx):
            return "fast"

        @step
        def fail(self, ctx):
            raise ValueError("no")

    engine = make_engine(server, (Sync,), accept_delay=0.005)
    await started(engine, nursery)
    conn = server.conn
    stream, delivery = await conn.offer_nowait(WORKER, flow_type="Sync", name="read", kind="rpc")
    result = await conn.wait_outcome(delivery)
    assert result.value == "fast"
    assert conn.read_together(wire.MatchAccept(delivery=delivery, rid=stream), result)
    stream, delivery = await conn.offer_nowait("flow:Sync", flow_type="Sync", name="fail")
    failure = await conn.wait_outcome(delivery)
    assert failure.type == "ValueError"
    assert conn.read_together(wire.MatchAccept(delivery=delivery, rid=stream), failure)
    assert engine.statistics().busy == 0
    await engine.close()


async def test_calls_ending_within_the_accept_delay_never_wake_the_timer_loop(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, accept_delay=0.005), nursery)
    conn = server.conn
    steps = _LoopWakes("._timer_loop")
    trio.lowlevel.add_instrument(steps)
    try:
        for _ in range(3):
            _, delivery = await conn.offer_nowait(
                WORKER, flow_type="Greeting", name="greeting", kind="rpc"
            )
            await conn.wait_outcome(delivery)
        await trio.sleep(1)  # past every delay: the ACCEPTs went with their RESULTs
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.count == 0
    await engine.close()


async def test_a_slower_handler_is_accepted_when_the_accept_delay_passes(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, accept_delay=0.005), nursery)
    conn = server.conn
    start = trio.current_time()
    stream, delivery, accept = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[2])
    assert accept == wire.MatchAccept(delivery=delivery, rid=stream)
    assert conn.time_of(accept) - start == pytest.approx(0.005)
    result = await conn.wait_outcome(delivery)
    assert result.value == 2
    assert conn.time_of(result) - start == pytest.approx(2)
    assert not conn.read_together(accept, result)
    await engine.close()


async def test_an_output_within_the_accept_delay_sends_the_accept_first(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, accept_delay=0.005), nursery)
    conn = server.conn
    start = trio.current_time()
    stream, delivery = await conn.offer_nowait(
        FLOW, flow_type="Greeting", name="greet", args=["world"]
    )
    result = await conn.wait_outcome(delivery)
    frames = [type(m) for m in conn.received if getattr(m, "rid", None) == stream]
    assert frames[-3:] == [wire.MatchAccept, wire.MatchOutput, wire.MatchResult]
    assert conn.time_of(result) - start < 0.005
    await engine.close()


async def test_an_m_cancel_within_the_accept_delay_gets_accept_and_cancelled_in_one_write(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, accept_delay=0.005), nursery)
    conn = server.conn
    start = trio.current_time()
    stream, delivery = await conn.offer_nowait(FLOW, flow_type="Greeting", name="forever")
    await conn.send(wire.MatchCancel(delivery, rid=stream))
    failure = await conn.wait_outcome(delivery)
    assert (failure.type, failure.retryable) == ("Cancelled", False)
    assert conn.read_together(wire.MatchAccept(delivery=delivery, rid=stream), failure)
    assert conn.time_of(failure) - start < 0.005
    assert engine.statistics().busy == 0
    await engine.close()


async def test_a_connection_lost_within_the_accept_delay_drops_its_accept_and_outcome(
    server, nursery, autojump_clock
):
    engine = await started(
        make_engine(server, accept_delay=0.005, reconnect_initial_backoff=1.0), nursery
    )
    first = server.conn
    start = trio.current_time()
    _, delivery = await first.offer_nowait(FLOW, flow_type="Greeting", name="slow", args=[3])
    await trio.testing.wait_all_tasks_blocked()
    assert (engine.statistics().busy, trio.current_time()) == (1, start)  # held: not sent
    await first.drop()
    second = await server.wait_conns(2)
    await eventually(lambda: engine.statistics().busy == 0)
    assert first.answer_to(delivery) is None and first.outcome_of(delivery) is None
    assert second.of_type(wire.MatchAccept) == second.of_type(wire.MatchResult) == []
    # The new connection's calls are held and sent as before.
    stream, delivery = await second.offer_nowait(
        WORKER, flow_type="Greeting", name="greeting", kind="rpc"
    )
    result = await second.wait_outcome(delivery)
    assert second.read_together(wire.MatchAccept(delivery=delivery, rid=stream), result)
    await engine.close()


async def test_a_drain_cancelling_a_call_sends_its_held_accept_alone(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, accept_delay=0.5, stop_drain_timeout=0.1), nursery)
    conn = server.conn
    start = trio.current_time()
    stream, delivery = await conn.offer_nowait(FLOW, flow_type="Greeting", name="forever")
    await trio.testing.wait_all_tasks_blocked()
    await engine.close()  # cancels the handler after 0.1 s, within the delay: no outcome
    accept = conn.answer_to(delivery)
    assert accept == wire.MatchAccept(delivery=delivery, rid=stream)
    assert conn.time_of(accept) - start == pytest.approx(0.1)  # (at the cancel, not at 0.5 s)
    assert conn.outcome_of(delivery) is None


# -- a blocking handler's outcome written by its own thread -----------------------------------


class Quick(Flow):
    """Blocking handlers for the handler threads' own writes (the outcome leaves from there)."""

    release = threading.Event()

    @rpc
    def read(self, ctx):
        return "fast"

    @step
    def held(self, ctx):
        Quick.release.wait(10)
        return "released"

    @step
    def chatty(self, ctx):
        for i in range(2):
            ctx.output(i)
        return "done"


def _quick_engine(server: FakeServer, **pull: Any) -> WorkerEngine:
    Quick.release = threading.Event()
    pull.setdefault("accept_delay", 0.005)
    return make_engine(server, (Quick,), **pull)


async def _offer_quick(conn: FakeConn, name: str = "read", **kw: Any) -> tuple[int, int]:
    if name == "read":
        return await conn.offer_nowait(WORKER, flow_type="Quick", name=name, kind="rpc", **kw)
    return await conn.offer_nowait("flow:Quick", flow_type="Quick", name=name, **kw)


async def test_a_blocking_outcome_leaves_from_its_thread_without_waking_the_trio_loop(
    server, nursery, frozen_clock
):
    engine = await started(_quick_engine(server), nursery)
    conn = server.conn
    threads = engine._runner.threads
    assert threads is not None
    stream, delivery = await _offer_quick(conn)
    result = await conn.wait_outcome(delivery)
    assert conn.read_together(wire.MatchAccept(delivery=delivery, rid=stream), result)
    assert threads.handed_back == 0  # (the thread wrote both frames)
    # The trio side freed the slot exactly once: the stream takes the next task.
    for _ in range(20):
        _, delivery = await _offer_quick(conn, stream_id=stream)
        assert (await conn.wait_outcome(delivery)).value == "fast"
        assert isinstance(conn.answer_to(delivery), wire.MatchAccept)
    assert (threads.handed_back, engine.statistics().busy) == (0, 0)
    await engine.close()


async def test_the_timer_and_a_thread_send_a_held_accept_exactly_once_before_the_outcome(
    server, nursery, frozen_clock
):
    engine = await started(_quick_engine(server), nursery)
    conn = server.conn
    # The delay passes while the handler runs: the timer loop sends the ACCEPT alone, the
    # thread then the outcome alone.
    stream, delivery = await _offer_quick(conn, "held")
    await trio.testing.wait_all_tasks_blocked()  # (the worker took it)
    frozen_clock.jump(0.01)
    await server.wait_for(lambda: conn.answer_to(delivery) is not None)
    Quick.release.set()
    result = await conn.wait_outcome(delivery)
    accept = wire.MatchAccept(delivery=delivery, rid=stream)
    assert [m for m in conn.received if getattr(m, "delivery", None) == delivery] == [
        accept,
        result,
    ]
    # The handler ends within the delay: its thread sends both; when the delay passes the
    # timer loop frees the slot and sends nothing more (no second ACCEPT, no PONG).
    stream, delivery = await _offer_quick(conn, "held")
    result = await conn.wait_outcome(delivery)
    assert conn.read_together(wire.MatchAccept(delivery=delivery, rid=stream), result)
    frozen_clock.jump(0.01)
    await trio.testing.wait_all_tasks_blocked()
    assert engine.statistics().busy == 0
    assert len(conn.of_type(wire.MatchAccept)) == 2 and conn.of_type(wire.MatchPong) == []
    await engine.close()


async def test_a_blocking_handlers_outputs_come_after_its_held_accept_and_before_its_outcome(
    server, nursery, frozen_clock
):
    engine = await started(_quick_engine(server), nursery)
    conn = server.conn
    stream, delivery = await _offer_quick(conn, "chatty")
    await conn.wait_outcome(delivery)
    frames = [type(m) for m in conn.received if getattr(m, "rid", None) == stream]
    assert frames[-4:] == [wire.MatchAccept, wire.MatchOutput, wire.MatchOutput, wire.MatchResult]
    await engine.close()


async def test_an_m_cancel_crossing_a_threads_outcome_is_ignored_and_frees_the_slot_once(
    server, nursery, frozen_clock
):
    engine = _quick_engine(server, max_concurrent_tasks=2, reserved_rpc_tasks=0)
    await started(engine, nursery)
    conn = server.conn
    stream, delivery = await _offer_quick(conn)
    await conn.wait_outcome(delivery)
    await conn.send(wire.MatchCancel(delivery, rid=stream))  # (its slot not yet taken back)
    await trio.testing.wait_all_tasks_blocked()
    assert [type(m) for m in conn.received if getattr(m, "delivery", None) == delivery] == [
        wire.MatchAccept,
        wire.MatchResult,
    ]
    # Exactly two slots: two calls run, a third is declined.
    answers = []
    for _ in range(3):
        _, delivery = await _offer_quick(conn, "held")
        await trio.testing.wait_all_tasks_blocked()  # (the worker took it)
        frozen_clock.jump(0.01)  # (a held ACCEPT goes when its delay passes)
        await server.wait_for(lambda d=delivery: conn.answer_to(d) is not None)
        answers.append(type(conn.answer_to(delivery)))
    assert answers == [wire.MatchAccept, wire.MatchAccept, wire.MatchDecline]
    Quick.release.set()
    await engine.close()


async def test_a_drain_is_woken_by_a_blocking_call_whose_thread_sent_its_outcome(
    server, nursery, frozen_clock
):
    # The clock stands still (no timer fires): only the thread's wake-up ends the drain.
    engine = await started(_quick_engine(server), nursery)
    conn = server.conn
    stream, delivery = await _offer_quick(conn, "held")
    closed = threading.Event()

    async def close() -> None:
        await engine.close()
        closed.set()

    nursery.start_soon(close)
    await trio.testing.wait_all_tasks_blocked()
    assert not closed.is_set()
    Quick.release.set()
    assert await trio.to_thread.run_sync(closed.wait, 10)
    result = conn.outcome_of(delivery)
    assert conn.read_together(wire.MatchAccept(delivery=delivery, rid=stream), result)
    assert engine.statistics().busy == 0


async def test_a_blocking_outcome_after_the_connection_was_lost_is_dropped_and_its_slot_freed(
    server, nursery, autojump_clock, caplog
):
    engine = await started(_quick_engine(server, reconnect_initial_backoff=1.0), nursery)
    first = server.conn
    _, delivery = await _offer_quick(first, "held")
    await first.drop()
    second = await server.wait_conns(2)
    Quick.release.set()
    await eventually(lambda: engine.statistics().busy == 0)
    assert "is dropped" in caplog.text
    assert first.outcome_of(delivery) is None and second.of_type(wire.MatchResult) == []
    await engine.close()


async def test_a_stream_to_open_on_a_connection_just_lost_is_left_to_the_next_connection(
    server, nursery, autojump_clock
):
    # A write in the stream loop's pass (an ACCEPT held with an outcome, a REGISTER) can lose
    # the connection before the pass opens its next stream: that must not end the worker.
    engine = await started(make_engine(server), nursery)
    link = engine._link
    assert link is not None
    await link.conn.aclose()
    streams = dict(link.streams)
    engine._open_stream(link, engine._queues[0])  # (raised ClientClosed, which ended run)
    assert link.streams == streams
    await server.wait_conns(2)
    await eventually(engine.is_ready)
    await engine.close()


async def test_an_accept_delay_of_zero_accepts_each_task_at_once(server, nursery, autojump_clock):
    engine = await started(make_engine(server, accept_delay=0), nursery)
    conn = server.conn
    start = trio.current_time()
    _, delivery, accept = await conn.offer(
        WORKER, flow_type="Greeting", name="slow_rpc", kind="rpc", args=[1]
    )
    assert isinstance(accept, wire.MatchAccept)
    assert conn.time_of(accept) == start
    await conn.wait_outcome(delivery)
    await engine.close()


async def test_the_accept_delay_is_at_most_a_tenth_of_the_servers_peer_timeout(
    server, nursery, autojump_clock
):
    server.peer_timeout = 0.01
    engine = await started(make_engine(server, accept_delay=0.5), nursery)
    conn = server.conn
    start = trio.current_time()
    _, _, accept = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[1])
    assert conn.time_of(accept) - start == pytest.approx(0.001)
    await engine.close()


# -- stream bounds ----------------------------------------------------------------------------


async def test_streams_fall_back_to_the_idle_target_after_load(server, nursery, autojump_clock):
    engine = await started(
        make_engine(server, max_concurrent_tasks=3, reserved_rpc_tasks=0), nursery
    )
    conn = server.conn
    deliveries = []
    for seconds in (10, 10, 10):
        _, delivery, answer = await conn.offer(
            FLOW, flow_type="Greeting", name="slow", args=[seconds]
        )
        assert isinstance(answer, wire.MatchAccept)
        deliveries.append(delivery)
    await server.wait_for(lambda: len(conn.idle_of(FLOW)) == 1)
    # at the peak: cap + (F + 1) * idle_streams_per_queue
    assert len(conn.registered) == 3 + 2 * 1
    for delivery in deliveries:
        await conn.wait_outcome(delivery)
    await server.wait_for(lambda: len(conn.registered) == 2)
    assert len(conn.of_type(wire.MatchClose)) == 3
    assert engine.is_ready()
    assert engine.statistics().idle_streams == {FLOW: 1, WORKER: 1}
    await engine.close()


async def test_a_call_wakes_the_stream_loop_only_when_its_queue_needs_a_stream(
    server, nursery, autojump_clock
):
    engine = await started(make_engine(server, idle_stream_linger=1000), nursery)
    conn = server.conn
    wakes = _LoopWakes("._manage_loop")
    trio.lowlevel.add_instrument(wakes)
    # The first call takes the queue's only idle stream: one more is opened.
    _, delivery, _ = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[0])
    await conn.wait_outcome(delivery)
    await server.wait_for(lambda: len(conn.idle_of(FLOW)) == 2)
    assert wakes.count >= 1
    # Later calls find an idle stream to spare and give it back: nothing to open or close.
    wakes.count = 0
    for _ in range(3):
        _, delivery, _ = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[0])
        await conn.wait_outcome(delivery)
    await trio.testing.wait_all_tasks_blocked()
    trio.lowlevel.remove_instrument(wakes)
    assert wakes.count == 0
    assert len(conn.idle_of(FLOW)) == 2 and engine.statistics().idle_streams[FLOW] == 2
    # ... and the extra one still closes after the linger.
    await server.wait_for(lambda: len(conn.idle_of(FLOW)) == 1)
    await engine.close()


async def test_reserved_decline_keeps_one_extra_idle_stream_for_30_seconds(
    server, nursery, autojump_clock
):
    engine = await started(
        make_engine(server, max_concurrent_tasks=2, reserved_rpc_tasks=1), nursery
    )
    conn = server.conn
    await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[1000])
    await server.wait_for(lambda: len(conn.idle_of(FLOW)) == 1)
    _, _, declined = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[1])
    assert declined.reason == "no_capacity"
    declined_at = trio.current_time()
    await server.wait_for(lambda: len(conn.idle_of(FLOW)) == 2)
    assert len(conn.idle_of(WORKER)) == 1  # other queues keep their target
    await server.wait_for(lambda: len(conn.idle_of(FLOW)) == 1)
    assert trio.current_time() - declined_at == pytest.approx(30)
    # with every slot busy no extra stream is opened
    await conn.offer(WORKER, flow_type="Greeting", name="slow_rpc", kind="rpc", args=[1000])
    _, _, full = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[1])
    assert full.reason == "no_capacity"
    await trio.sleep(1)
    assert len(conn.idle_of(FLOW)) == 1
    assert engine.pull_reserved_rpc_declines == 1
    await engine.close()


async def test_generated_app_worker_id_names_host_and_pid(server):
    options = WorkerOptions(server_address=server.address)
    a = WorkerEngine(Registry(()), None, options)
    b = WorkerEngine(Registry(()), None, options)
    assert a.app_worker_id.startswith(f"{socket.gethostname()}-{os.getpid()}-")
    assert a.app_worker_id != b.app_worker_id


async def test_a_loaded_worker_reuses_its_streams_and_closes_extras_after_the_linger(
    server, nursery, autojump_clock
):
    engine = await started(
        make_engine(server, max_concurrent_tasks=2, reserved_rpc_tasks=0, idle_stream_linger=10),
        nursery,
    )
    conn = server.conn
    start = trio.current_time()
    for _ in range(5):
        _, delivery, answer = await conn.offer(FLOW, flow_type="Greeting", name="slow", args=[1])
        assert isinstance(answer, wire.MatchAccept)
        await conn.wait_outcome(delivery)
    # one replacement stream was registered for the first task; later tasks reuse the two
    assert len(registers(conn)) == 2 + 1
    assert conn.of_type(wire.MatchClose) == []
    await server.wait_for(lambda: len(conn.registered) == 2)
    # the replacement stream, idle since the first task, closes once idle for the linger
    assert trio.current_time() - start == pytest.approx(10)
    assert len(conn.of_type(wire.MatchClose)) == 1
    await engine.close()


async def test_a_stream_is_never_closed_under_a_call_nor_answers_after_its_close(
    server, nursery, autojump_clock, monkeypatch
):
    """Closing extra idle streams while the CLOSE writes wait: a task offered meanwhile on
    another stream (the server still sees it idle) is either not answered, on a stream the
    worker closed, or accepted and completed; no frame follows a stream's CLOSE."""
    from apps.matching._sdk_connection import SdkConnection

    original = SdkConnection.send
    gates: list[trio.Event] = []
    held: list[int] = []
    hit = trio.Event()

    async def send(self, message):
        if isinstance(message, wire.MatchClose) and len(held) < len(gates):
            gate = gates[len(held)]
            held.append(message.rid)
            hit.set()
            await gate.wait()
        await original(self, message)

    monkeypatch.setattr(SdkConnection, "send", send)
    engine = await started(
        make_engine(server, max_concurrent_tasks=3, reserved_rpc_tasks=0), nursery
    )
    conn = server.conn
    slow = []
    for seconds in (10, 20, 20):
        _, delivery, answer = await conn.offer(
            FLOW, flow_type="Greeting", name="slow", args=[seconds]
        )
        assert isinstance(answer, wire.MatchAccept)
        slow.append(delivery)
    gates.append(trio.Event())
    for delivery in slow:
        await conn.wait_outcome(delivery)
    await trio.sleep(30)  # every extra idle stream has lingered: closes are due
    await hit.wait()
    hit = trio.Event()
    gates.append(trio.Event())
    gates[0].set()  # the first CLOSE goes; the next one waits
    await hit.wait()
    await server.wait_for(lambda: held[0] not in conn.registered)
    offered = []
    for stream in conn.idle_of(FLOW):
        if stream in held:
            continue
        delivery = next(server.deliveries)
        conn.busy.add(stream)
        await conn.send(
            wire.MatchTask(
                delivery=delivery,
                kind="step",
                flow_type="Greeting",
                flow_id=f"flow-{delivery}",
                name="slow",
                execution_id=f"flow-{delivery}/0/slow",
                attempt=1,
                args=[1],
                state={},
                rid=stream,
            )
        )
        offered.append((stream, delivery))
    assert offered
    await trio.testing.wait_all_tasks_blocked()
    gates[1].set()
    await trio.sleep(5)
    for _stream, delivery in offered:
        if conn.answer_to(delivery) is not None:
            assert isinstance(conn.answer_to(delivery), wire.MatchAccept)
            assert conn.outcome_of(delivery) is not None, f"delivery {delivery} lost"
    for close in conn.of_type(wire.MatchClose):
        frames = [m for m in conn.received if getattr(m, "rid", None) == close.rid]
        assert frames[-1] == close, f"stream {close.rid} sent {frames[-1]} after its CLOSE"
    await engine.close()


# -- the stream plan (sans-IO) ----------------------------------------------------------------


def _plan_fixture(states: list[tuple[str, float]]):
    from apps.matching._worker_streams import QueueState, Stream

    q = QueueState(FLOW, "flow", "Greeting", 0.1)
    link: Any = None
    streams = [
        Stream(i, q, link, state=state, idle_since=since)
        for i, (state, since) in enumerate(states, 1)
    ]
    return q, streams


def test_plan_closes_the_longest_idle_extras_once_they_have_lingered():
    from apps.matching._worker_streams import plan_streams

    q, streams = _plan_fixture([("idle", 9.0), ("idle", 2.0), ("idle", 4.0), ("busy", 0.0)])
    plan = plan_streams([q], streams, now=10.0, target=1, linger=5.0, may_open=True, slot_free=True)
    assert [s.id for s in plan.closes] == [2, 3]  # stream 1 is kept (idle the shortest)
    assert plan.opens == ()
    plan = plan_streams([q], streams, now=8.0, target=1, linger=5.0, may_open=True, slot_free=True)
    assert [s.id for s in plan.closes] == [2]
    assert plan.wake == 9.0  # stream 3 lingers until 4 + 5: one timer for the earliest


@given(
    st.lists(
        st.tuples(st.sampled_from(["idle", "busy", "registering"]), st.integers(0, 20)),
        max_size=12,
    ),
    st.integers(0, 30),
    st.integers(0, 3),
)
def test_plan_closes_and_wakes_as_sorting_every_idle_stream_would(states, now, target):
    # (the plan finds the earliest linger without sorting when no stream is due yet; the
    # reference below is the rule itself: the longest-idle extras, each closed once due)
    from apps.matching._worker_streams import plan_streams

    q, streams = _plan_fixture([(state, float(since)) for state, since in states])
    linger = 5.0
    plan = plan_streams(
        [q], streams, now=float(now), target=target, linger=linger, may_open=True,
        slot_free=True,
    )  # fmt: skip
    idle = sorted((s for s in streams if s.state == "idle"), key=lambda s: s.idle_since)
    pending = sum(s.state == "registering" for s in streams)
    excess = min(len(idle) + pending - target, len(idle) - 1)
    extras = idle[:excess] if excess > 0 else []
    assert list(plan.closes) == [s for s in extras if s.idle_since + linger <= now]
    dues = [s.idle_since + linger for s in extras if s.idle_since + linger > now]
    assert plan.wake == min(dues, default=math.inf)


@given(
    st.lists(
        st.tuples(st.sampled_from(["idle", "busy", "registering", "closed"]), st.integers(0, 20)),
        max_size=12,
    ),
    st.integers(0, 30),
    st.integers(0, 3),
    st.sampled_from([-math.inf, 5.0, 12.0, 40.0]),
    st.sampled_from([-math.inf, 5.0, 12.0, 40.0]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([-math.inf, 0.0, 11.0, 17.0, 30.0, math.inf]),
)
def test_plan_changes_asks_for_the_loop_exactly_when_the_queues_plan_would(
    states, now, target, extra_until, retry_at, may_open, slot_free, wake_by
):
    # (each call's start and end ask plan_changes, not the full plan, whether to wake the
    # stream-managing loop; it must answer as the plan does, another queue's streams aside)
    from apps.matching._worker_streams import QueueState, Stream, plan_changes, plan_streams

    q, streams = _plan_fixture([(state, float(since)) for state, since in states])
    q.extra_until, q.retry_at = extra_until, retry_at
    other = QueueState("flow:Other", "flow", "Other", 0.1)
    streams += [Stream(99, other, None, state="idle", idle_since=0.0)]
    inputs = dict(now=float(now), target=target, linger=5.0, may_open=may_open, slot_free=slot_free)
    plan = plan_streams([q], streams, **inputs)
    expected = bool(plan.opens or plan.closes or plan.wake < wake_by)
    assert plan_changes(q, streams, **inputs, wake_by=wake_by) is expected


def test_plan_opens_up_to_the_target_and_keeps_one_registered_while_others_register():
    from apps.matching._worker_streams import plan_streams

    q, streams = _plan_fixture([("registering", 0.0), ("registering", 0.0), ("idle", 0.0)])
    plan = plan_streams(
        [q], streams, now=100.0, target=1, linger=5.0, may_open=True, slot_free=True
    )
    assert plan.closes == () and plan.opens == ()
    q, streams = _plan_fixture([("busy", 0.0)])
    plan = plan_streams([q], streams, now=0.0, target=2, linger=5.0, may_open=True, slot_free=True)
    assert plan.opens == (q, q)
    assert (
        plan_streams(
            [q], streams, now=0.0, target=2, linger=5.0, may_open=False, slot_free=True
        ).opens
        == ()
    )
