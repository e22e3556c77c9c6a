"""The matching server's routing actors on the real runtime: matcher, queues and streams, with
fake worker connections (seed: 路由和可用性, 容量和关闭). Time is trio's MockClock."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import otp
import supervisors
import wire
from apps.matching import _engine_handoff as handoff
from apps.matching._dispatch import (
    Accepted,
    Capabilities,
    Completed,
    Dispatch,
    ErrorInfo,
    Failed,
    Lost,
    MatchingLimits,
    NotDispatched,
    Offer,
    Routed,
    StreamGone,
    StreamIdle,
    StreamRejection,
    Task,
    WorkerDraining,
    WorkerFreed,
)
from apps.matching._engine_direct import DirectDeliveries
from apps.matching._matcher import (
    MATCHER,
    QUEUES,
    notify_worker,
    register_stream,
    start_matcher,
    statistics,
    submit,
)
from apps.matching._queue import Forward, Queue, QueueHandle, QueueIdle, StopIdle, start_queue
from apps.matching._stream import FreedNotices, StreamHandle, open_stream

CAPS = Capabilities({"Greet": ({"write"}, {"read"})})
FINAL = (Completed, Failed, NotDispatched, Lost)

Policy = Callable[[wire.MatchTask], list[Any]]


def accept_and_finish(task: wire.MatchTask) -> list[Any]:
    return [
        wire.MatchAccept(delivery=task.delivery, rid=task.rid),
        wire.MatchResult(delivery=task.delivery, value="hello", rid=task.rid),
    ]


def accept_only(task: wire.MatchTask) -> list[Any]:
    return [wire.MatchAccept(delivery=task.delivery, rid=task.rid)]


def decline(reason: str) -> Policy:
    def answer(task: wire.MatchTask) -> list[Any]:
        return [wire.MatchDecline(delivery=task.delivery, reason=reason, rid=task.rid)]

    return answer


def silent(task: wire.MatchTask) -> list[Any]:
    return []


@attrs.define(eq=False)
class FakeConn:
    """A worker connection: records what the stream writes and answers TASKs by ``policy``
    (and PINGs with PONG), as the connection would forward the worker's frames."""

    worker_id: str
    policy: Policy
    sent: list[Any] = attrs.Factory(list)
    stream: otp.Pid | None = None
    pid: otp.Pid | None = None

    def send_message(self, message: Any) -> None:
        self.sent.append(message)
        assert self.stream is not None
        if isinstance(message, wire.MatchTask):
            for answer in self.policy(message):
                otp.send(self.stream, answer)
        elif isinstance(message, wire.MatchPing):
            otp.send(self.stream, wire.MatchPong(rid=message.rid))

    def tasks(self) -> list[wire.MatchTask]:
        return [m for m in self.sent if isinstance(m, wire.MatchTask)]


def _registered(m: Any) -> bool:
    return isinstance(m, StreamRejection) or (isinstance(m, tuple) and m[0] == "stream")


async def _connection(
    conn: FakeConn, session: str, queue: str, name: str, caps: Capabilities, report: otp.Pid
) -> None:
    result = await register_stream(session, conn.worker_id, queue, name, caps)
    if isinstance(result, StreamRejection):
        otp.send(report, result)
        return
    conn.stream = open_stream(conn, 1, conn.worker_id, caps, result).pid
    otp.send(report, ("stream", conn.stream))
    await otp.receive(lambda m: m == "stop")


async def connect(
    worker_id: str,
    policy: Policy = accept_and_finish,
    *,
    queue: str = "flow",
    name: str = "Greet",
    caps: Capabilities = CAPS,
    session: str | None = None,
) -> FakeConn:
    """A worker stream registered on ``queue:name`` and idle there."""
    conn = FakeConn(worker_id, policy)
    conn.pid = otp.spawn(
        _connection, conn, session or f"session-{worker_id}", queue, name, caps, otp.self()
    )
    answer = await otp.receive(_registered)
    if isinstance(answer, StreamRejection):
        raise AssertionError(answer)
    await trio.testing.wait_all_tasks_blocked()
    return conn


async def rejected(worker_id: str, **kw: Any) -> StreamRejection:
    conn = FakeConn(worker_id, silent)
    session = kw.pop("session", f"session-{worker_id}")
    queue = kw.pop("queue", "flow")
    name = kw.pop("name", "Greet")
    caps = kw.pop("caps", CAPS)
    otp.spawn(_connection, conn, session, queue, name, caps, otp.self())
    answer = await otp.receive(_registered)
    assert isinstance(answer, StreamRejection), answer
    return answer


_deliveries = iter(range(1, 1_000_000))


def dispatch(
    *,
    sticky: str | None = None,
    wait: float = 10.0,
    name: str = "write",
    kind: str = "step",
    deadline: float | None = None,
) -> Dispatch:
    delivery = next(_deliveries)
    task = Task(delivery, kind, "Greet", "f1", name, f"f1/0/{name}", 1, ["x"], {}, deadline)
    return Dispatch(task, otp.self(), sticky, wait)


async def outcome(d: Dispatch, *, submitted: bool = False) -> tuple[list[Routed], Any, float]:
    """Submit ``d`` (unless ``submitted``); its routing decisions, its final outcome and how
    long it took."""
    start = trio.current_time()
    if not submitted:
        submit(d)
    routes: list[Routed] = []
    delivery = d.task.delivery

    def ours(m: Any) -> bool:
        return isinstance(m, (Routed, *FINAL)) and m.delivery == delivery

    while True:
        message = await otp.receive(ours, timeout=1000)
        if isinstance(message, Routed):
            routes.append(message)
        else:
            return routes, message, trio.current_time() - start


def reasons(routes: list[Routed]) -> list[tuple[str, str]]:
    return [(r.queue, r.reason) for r in routes]


@asynccontextmanager
async def server(**limits: Any) -> AsyncIterator[None]:
    async with otp.open_node():
        await supervisors.DynamicSupervisor.start_link(name=QUEUES)
        await start_matcher(MatchingLimits(**limits))
        yield


# -- routing --------------------------------------------------------------------------------


async def test_sticky_worker_with_a_stream_gets_the_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        other = await connect("w2")
        sticky = await connect("w1", queue="worker", name="w1")
        routes, final, took = await outcome(dispatch(sticky="w1"))
        assert reasons(routes) == [("worker:w1", "sticky"), ("worker:w1", "delivered")]
        assert isinstance(final, Completed) and final.worker_id == "w1"
        assert final.value == "hello" and took == 0
        assert other.tasks() == [] and len(sticky.tasks()) == 1


async def test_sticky_worker_without_a_stream_falls_back_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        await connect("w2")
        routes, final, took = await outcome(dispatch(sticky="w9"))
        assert reasons(routes) == [
            ("flow:Greet", "fallback_no_stream"),
            ("flow:Greet", "delivered"),
        ]
        assert routes[0].worker_id == "w9"
        assert isinstance(final, Completed) and final.worker_id == "w2" and took == 0


async def test_no_sticky_worker_goes_to_the_flow_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        await connect("w2")
        routes, final, _ = await outcome(dispatch())
        assert reasons(routes)[0] == ("flow:Greet", "flow_queue")
        assert isinstance(final, Completed)


async def test_busy_sticky_worker_falls_back_after_the_sticky_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        await connect("w1", decline("no_capacity"), queue="worker", name="w1")
        await connect("w2")
        routes, final, took = await outcome(dispatch(sticky="w1"))
        assert reasons(routes) == [
            ("worker:w1", "sticky"),
            ("worker:w1", "declined_no_capacity"),
            ("flow:Greet", "fallback_timeout"),
            ("flow:Greet", "delivered"),
        ]
        assert isinstance(final, Completed) and final.worker_id == "w2"
        assert took == pytest.approx(5.0)


async def test_unknown_name_reroutes_at_once_and_excludes_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        own = await connect("w1", decline("unknown_name"), queue="worker", name="w1")
        flow = await connect("w1", decline("unknown_name"))
        await connect("w2")
        routes, final, took = await outcome(dispatch(sticky="w1"))
        assert reasons(routes) == [
            ("worker:w1", "sticky"),
            ("flow:Greet", "reroute_unknown_name"),
            ("flow:Greet", "delivered"),
        ]
        assert isinstance(final, Completed) and final.worker_id == "w2" and took == 0
        assert len(own.tasks()) == 1 and flow.tasks() == []


async def test_no_capacity_tries_other_workers(autojump_clock: trio.testing.MockClock) -> None:
    async with server():
        busy = await connect("w1", decline("no_capacity"))
        await connect("w2")
        routes, final, _ = await outcome(dispatch())
        assert ("flow:Greet", "declined_no_capacity") in reasons(routes)
        assert isinstance(final, Completed) and final.worker_id == "w2"
        assert len(busy.tasks()) == 1


async def test_all_workers_busy_for_the_whole_wait_is_no_worker_available(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        await connect("w1", decline("no_capacity"))
        await connect("w2", decline("no_capacity"))
        _, final, took = await outcome(dispatch())
        assert isinstance(final, NotDispatched) and final.reason == "no_worker_available"
        assert took == pytest.approx(10.0)


async def test_no_worker_is_unavailable_after_the_dispatch_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        routes, final, took = await outcome(dispatch())
        assert reasons(routes) == [("flow:Greet", "flow_queue")]
        assert isinstance(final, NotDispatched) and final.reason == "unavailable"
        assert "'Greet'" in final.message and "'write'" in final.message
        assert took == pytest.approx(10.0)


async def test_a_worker_connecting_during_the_wait_gets_the_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        d = dispatch()
        submit(d)
        await trio.sleep(4)
        await connect("w1")
        _, final, _ = await outcome_of(d)
        assert isinstance(final, Completed)


async def outcome_of(d: Dispatch) -> tuple[list[Routed], Any, float]:
    start = trio.current_time()
    routes: list[Routed] = []

    def ours(m: Any) -> bool:
        return isinstance(m, (Routed, *FINAL)) and m.delivery == d.task.delivery

    while True:
        message = await otp.receive(ours, timeout=1000)
        if not isinstance(message, Routed):
            return routes, message, trio.current_time() - start
        routes.append(message)


async def test_the_wait_never_passes_the_task_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        now = trio.current_time()
        _, final, took = await outcome(dispatch(deadline=now + 3.0))
        assert isinstance(final, NotDispatched) and took == pytest.approx(3.0)


async def test_task_timeout_is_the_time_left_to_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        conn = await connect("w1")
        _, final, _ = await outcome(dispatch(deadline=trio.current_time() + 30.0))
        assert isinstance(final, Completed)
        assert conn.tasks()[0].timeout == pytest.approx(30.0)


async def test_draining_worker_gets_no_sticky_routing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        own = await connect("w1", queue="worker", name="w1")
        await connect("w2")
        notify_worker(WorkerDraining("w1"))
        await trio.testing.wait_all_tasks_blocked()
        routes, final, _ = await outcome(dispatch(sticky="w1"))
        assert reasons(routes)[0] == ("flow:Greet", "fallback_no_stream")
        assert isinstance(final, Completed) and final.worker_id == "w2"
        assert own.tasks() == []


async def test_the_matcher_is_in_the_pg_groups_of_the_queues_it_holds_streams_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # (what other servers' matchers route by: dispatch across servers)
    flow, own = ("matching", "flow", "Greet"), ("matching", "worker", "w1")
    async with server():
        matcher = otp.whereis(MATCHER)
        assert otp.pg.get_local_members(flow) == []
        w1_own = await connect("w1", queue="worker", name="w1")
        assert otp.pg.get_local_members(own) == [matcher]
        notify_worker(WorkerDraining("w1"))
        await trio.testing.wait_all_tasks_blocked()
        assert otp.pg.get_local_members(own) == []  # no sticky routing from other servers
        # A flow-type queue's first stream is a draining worker's: the group counts it, and
        # stays joined while any worker's stream is there.
        w1_flow = await connect("w1")
        w2_flow = await connect("w2")
        assert otp.pg.get_local_members(flow) == [matcher]
        for conn in (w1_flow, w1_own):
            otp.send(conn.pid, "stop")
        await trio.testing.wait_all_tasks_blocked()
        assert otp.pg.get_local_members(flow) == [matcher]
        otp.send(w2_flow.pid, "stop")
        await trio.testing.wait_all_tasks_blocked()
        assert otp.pg.get_local_members(flow) == []
        assert otp.pg.which_groups() == []


async def test_failure_reaches_reply_to(autojump_clock: trio.testing.MockClock) -> None:
    def fail(task: wire.MatchTask) -> list[Any]:
        return [
            wire.MatchAccept(delivery=task.delivery, rid=task.rid),
            wire.MatchFailure(
                delivery=task.delivery, type="ValueError", message="no", retryable=True, rid=1
            ),
        ]

    async with server():
        await connect("w1", fail)
        _, final, _ = await outcome(dispatch())
        assert isinstance(final, Failed) and final.error.type == "ValueError"
        assert final.error.retryable


async def test_a_stream_takes_the_next_call_after_finishing_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        conn = await connect("w1")
        for _ in range(3):
            _, final, _ = await outcome(dispatch())
            assert isinstance(final, Completed)
        assert len(conn.tasks()) == 3


async def test_a_call_end_frees_the_worker_for_its_queues_only_after_a_capacity_decline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """WorkerFreed (to the matcher, which tells the worker's queues) follows a call's end only
    when a stream of the connection declined for capacity since the last one: the queues hold
    nothing of the worker otherwise. The first call's end always sends one (a reconnected
    worker's queues may hold declines of its old connection)."""
    async with otp.open_node():
        me = otp.self()
        conn = FakeConn("w1", silent)
        notices = FreedNotices()
        conn.stream = open_stream(conn, 1, "w1", CAPS, me, matcher=me, notices=notices).pid
        frees: list[WorkerFreed] = []

        async def call(answer: Callable[[int], Any]) -> None:
            d = dispatch()
            otp.send(conn.stream, Offer(d, "flow:Greet"))
            await trio.testing.wait_all_tasks_blocked()
            reply = answer(d.task.delivery)
            if isinstance(reply, wire.MatchDecline):
                notices.note_decline(reply)  # (what the connection does as it reads one)
            otp.send(conn.stream, reply)
            if not isinstance(reply, wire.MatchDecline):
                otp.send(conn.stream, wire.MatchResult(d.task.delivery, None, rid=1))
            await trio.testing.wait_all_tasks_blocked()
            while (m := await otp.receive(timeout=0, default=None)) is not None:
                request = getattr(m, "request", None)  # (a cast to the matcher)
                if isinstance(request, WorkerFreed):
                    frees.append(request)

        def accept(delivery: int) -> Any:
            return wire.MatchAccept(delivery=delivery, rid=1)

        def no_capacity(delivery: int) -> Any:
            return wire.MatchDecline(delivery=delivery, reason="no_capacity", rid=1)

        def unknown_name(delivery: int) -> Any:
            return wire.MatchDecline(delivery=delivery, reason="unknown_name", rid=1)

        await call(accept)
        assert frees == [WorkerFreed("w1")]  # (the first call's end)
        await call(accept)
        await call(unknown_name)
        await call(accept)
        assert len(frees) == 1  # no capacity decline: nothing to free
        await call(no_capacity)
        await call(accept)
        assert len(frees) == 2 and not notices.declined
        await call(accept)
        assert len(frees) == 2


async def test_a_call_ending_before_its_streams_decline_is_handled_still_frees_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The worker writes a capacity DECLINE (stream 2) before the RESULT that frees its slot
    (stream 1), and the connection reads them in that order; stream 1 may handle its RESULT
    before stream 2 handles the DECLINE. The call's end must still send WorkerFreed, or the
    queue holds the declined dispatch until its dispatch wait runs out."""
    async with otp.open_node():
        me = otp.self()
        notices = FreedNotices()
        one, two = FakeConn("w1", silent), FakeConn("w1", silent)
        one.stream = open_stream(one, 1, "w1", CAPS, me, matcher=me, notices=notices).pid
        two.stream = open_stream(two, 2, "w1", CAPS, me, matcher=me, notices=notices).pid
        first, second = dispatch(), dispatch()

        async def frees() -> list[WorkerFreed]:
            await trio.testing.wait_all_tasks_blocked()
            found = []
            while (m := await otp.receive(timeout=0, default=None)) is not None:
                request = getattr(m, "request", None)  # (a cast to the matcher)
                if isinstance(request, WorkerFreed):
                    found.append(request)
            return found

        otp.send(one.stream, Offer(first, "flow:Greet"))
        await trio.testing.wait_all_tasks_blocked()
        otp.send(one.stream, wire.MatchAccept(delivery=first.task.delivery, rid=1))
        otp.send(one.stream, wire.MatchResult(first.task.delivery, None, rid=1))
        assert await frees() == [WorkerFreed("w1")]  # (the first call's end: notices reset)
        second_call = dispatch()
        otp.send(one.stream, Offer(second_call, "flow:Greet"))
        otp.send(two.stream, Offer(second, "flow:Greet"))
        await trio.testing.wait_all_tasks_blocked()
        otp.send(one.stream, wire.MatchAccept(delivery=second_call.task.delivery, rid=1))
        decline = wire.MatchDecline(delivery=second.task.delivery, reason="no_capacity", rid=2)
        notices.note_decline(decline)  # the connection reads the DECLINE first ...
        otp.send(one.stream, wire.MatchResult(second_call.task.delivery, None, rid=1))
        assert await frees() == [WorkerFreed("w1")]  # ... stream 1's call ends first ...
        otp.send(two.stream, decline)  # ... and stream 2 handles the DECLINE last
        assert await frees() == []


# -- handing over (StreamHandle: the stream's work done in its connection's or queue's task) --


async def _idle_stream() -> tuple[FakeConn, StreamHandle]:
    """A stream process of a silent worker, with this process as its connection, queue and
    matcher, idle (its ``StreamIdle`` received)."""
    me = otp.self()
    conn = FakeConn("w1", silent)
    handle = open_stream(conn, 1, "w1", CAPS, me, matcher=me, notices=FreedNotices())
    conn.stream = handle.pid
    await trio.testing.wait_all_tasks_blocked()
    idle = await otp.receive(lambda m: isinstance(m, StreamIdle))
    assert idle.handle is handle  # (the queue hands its offers over too)
    return conn, handle


async def test_an_offer_and_the_workers_frames_handed_over_are_handled_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A running stream with nothing queued takes what is handed to it in the caller's task:
    the TASK is written, and the worker's ACCEPT and RESULT reach ``reply_to``, before the
    caller yields (the stream's own task is not woken for them)."""
    async with otp.open_node():
        conn, handle = await _idle_stream()
        d = dispatch()
        handle.offer(Offer(d, "flow:Greet"))
        assert [t.delivery for t in conn.tasks()] == [d.task.delivery]  # (no checkpoint yet)
        handle.deliver(wire.MatchAccept(delivery=d.task.delivery, rid=1))
        handle.deliver(wire.MatchResult(d.task.delivery, "hi", rid=1))
        routed = await otp.receive(lambda m: isinstance(m, Routed), timeout=0)
        assert routed == Routed(d.task.delivery, "flow:Greet", "delivered", "w1", handle.pid)
        final = await otp.receive(lambda m: isinstance(m, Completed), timeout=0)
        assert (final.delivery, final.value) == (d.task.delivery, "hi")


async def test_the_task_written_for_an_offer_is_the_wire_message_of_its_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The TASK a stream writes (built without wire's per-field validators) is the message
    ``wire.MatchTask`` makes of the dispatch's task: the same fields, equal, as wire encodes."""
    async with otp.open_node():
        conn, handle = await _idle_stream()
        d = dispatch(deadline=trio.current_time() + 30)
        handle.offer(Offer(d, "flow:Greet"))
        [task] = conn.tasks()
        t = d.task
        assert task == wire.MatchTask(
            delivery=t.delivery,
            kind=t.kind,
            flow_type=t.flow_type,
            flow_id=t.flow_id,
            name=t.name,
            execution_id=t.execution_id,
            attempt=t.attempt,
            args=t.args,
            state=t.state,
            timeout=30.0,
            step_kind=None,
            rid=1,
        )


async def test_an_offer_whose_task_cannot_be_written_fails_it_and_the_stream_stays_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A task the wire cannot carry (an empty step name) is answered ``Failed`` with wire's own
    message (its queue is told it was taken, then the stream is idle again), and nothing is
    written; the stream takes the next offer."""
    async with otp.open_node():
        conn, handle = await _idle_stream()
        bad = dispatch(name="")
        handle.offer(Offer(bad, "flow:Greet"))
        assert conn.tasks() == []
        failed = await otp.receive(lambda m: isinstance(m, Failed), timeout=0)
        assert failed.delivery == bad.task.delivery
        assert failed.error == ErrorInfo(
            "InvalidTask", "MatchTask.name must be a non-empty str (got '')", False
        )
        accepted = await otp.receive(lambda m: isinstance(m, Accepted), timeout=0)
        assert accepted == Accepted(handle.pid, bad.task.delivery)
        assert await otp.receive(lambda m: isinstance(m, StreamIdle), timeout=0)
        good = dispatch()
        handle.offer(Offer(good, "flow:Greet"))
        assert [t.delivery for t in conn.tasks()] == [good.task.delivery]


async def test_an_accept_and_its_outcome_handed_over_at_once_make_one_message_each_way(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``deliver_served`` (the connection read a call's ACCEPT and its outcome together): the
    call's ``reply_to`` gets the outcome carrying its ``Routed`` "delivered", and the queue a
    ``StreamIdle`` carrying its ``Accepted``, one message each; an ACCEPT that answers no
    offer of the stream is taken as ``deliver`` would take it."""
    async with otp.open_node():
        _, handle = await _idle_stream()
        for outcome in (
            lambda delivery: wire.MatchResult(delivery, "hi", rid=1),
            lambda delivery: wire.MatchFailure(delivery, "ValueError", "bad", False, rid=1),
        ):
            d = dispatch()
            delivery = d.task.delivery
            handle.offer(Offer(d, "flow:Greet"))
            handle.deliver_served(wire.MatchAccept(delivery, rid=1), outcome(delivery))
            got = []
            while (message := await otp.receive(timeout=0, default=None)) is not None:
                if isinstance(message, Completed | Failed | Routed | StreamIdle | Accepted):
                    got.append(message)  # (not the casts to the matcher, also ``me`` here)
            final, idle = got
            assert isinstance(final, Completed | Failed) and final.delivery == delivery
            assert final.delivered == Routed(delivery, "flow:Greet", "delivered", "w1", handle.pid)
            assert isinstance(idle, StreamIdle) and idle.accepted == delivery
        d = dispatch()
        handle.offer(Offer(d, "flow:Greet"))
        other = d.task.delivery + 1000
        handle.deliver_served(
            wire.MatchAccept(other, rid=1), wire.MatchResult(other, "hi", rid=1)
        )  # (nothing the stream offered: ignored, as each frame alone would be)
        assert await otp.receive(timeout=0, default=None) is None
        assert handle.state.offered is d


async def test_a_calls_outcome_goes_to_the_engine_that_takes_it_else_by_message(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A ``reply_to`` registered with ``_engine_handoff`` (an engine) is handed the call's
    outcome in the task that read it, when it takes it; one it refuses is sent, as is any
    outcome to a ``reply_to`` not registered."""
    async with otp.open_node():
        _, handle = await _idle_stream()
        taken: list[Any] = []
        answers = iter([True, False])

        def take(outcome: Completed | Failed) -> bool:
            taken.append(outcome)
            return next(answers)

        handoff.register(otp.self(), handoff.Takers(take, lambda from_, request: False))
        for answer in (True, False):
            d = dispatch()
            delivery = d.task.delivery
            handle.offer(Offer(d, "flow:Greet"))
            handle.deliver_served(
                wire.MatchAccept(delivery, rid=1), wire.MatchResult(delivery, answer, rid=1)
            )
            assert taken[-1].delivery == delivery and taken[-1].value is answer
            sent = [
                m
                for m in await _drain_mailbox()
                if isinstance(m, Completed) and m.delivery == delivery
            ]
            assert len(sent) == (0 if answer else 1)
        assert len(taken) == 2


async def _drain_mailbox() -> list[Any]:
    got = []
    while (message := await otp.receive(timeout=0, default=None)) is not None:
        got.append(message)
    return got


async def test_a_stream_idle_carrying_its_accepted_frees_the_stream_without_an_offer_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A queue told ``StreamIdle(accepted=delivery)`` by the stream it offered ``delivery``
    to takes it as ``Accepted`` and then ``StreamIdle``: the call is over, nothing is offered
    again; without ``accepted`` the offer was unanswered and goes to the stream again."""
    async with otp.open_node():
        me = otp.self()
        queue = await start_queue("flow", "Greet", MatchingLimits(), me)
        otp.send(queue, StreamIdle(me, "w1", CAPS))
        d = dispatch()
        otp.send(queue, d)
        offer = await otp.receive(lambda m: isinstance(m, Offer), timeout=1)
        assert offer.dispatch is d
        otp.send(queue, StreamIdle(me, "w1", CAPS, accepted=d.task.delivery))
        stats = await Queue.statistics(queue)
        assert (stats.idle, stats.offered, stats.busy, stats.waiting) == (1, 0, 0, 0)
        assert await otp.receive(lambda m: isinstance(m, Offer), timeout=0, default=None) is None
        d2 = dispatch()
        otp.send(queue, d2)
        assert (await otp.receive(lambda m: isinstance(m, Offer), timeout=1)).dispatch is d2
        otp.send(queue, StreamIdle(me, "w1", CAPS))  # (no answer: the offer is taken back)
        assert (await otp.receive(lambda m: isinstance(m, Offer), timeout=1)).dispatch is d2


async def test_what_is_handed_over_follows_what_still_waits_in_the_streams_mailbox(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Handed over before the stream's process first ran (or while anything handed over
    still waits in its mailbox), an offer and the worker's answers queue up in their order:
    the ACCEPT is not taken before the offer it answers."""
    async with otp.open_node():
        me = otp.self()
        conn = FakeConn("w1", silent)
        handle = open_stream(conn, 1, "w1", CAPS, me, matcher=me, notices=FreedNotices())
        conn.stream = handle.pid
        d = dispatch()
        handle.offer(Offer(d, "flow:Greet"))
        handle.deliver(wire.MatchAccept(delivery=d.task.delivery, rid=1))
        handle.deliver(wire.MatchResult(d.task.delivery, "hi", rid=1))
        assert conn.tasks() == []  # (queued: the process has not run yet)
        final = await otp.receive(lambda m: isinstance(m, Completed | Lost), timeout=5)
        assert isinstance(final, Completed) and final.value == "hi"
        assert handle.state.mailed == 0


async def test_an_offer_to_a_stream_whose_connection_is_doomed_is_not_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its connection killed (the stream's end not yet seen), the stream gets the offer by
    message, as before it ends: no TASK goes to a worker that is gone."""
    async with otp.open_node():
        me = otp.self()
        conn = FakeConn("w1", silent)

        async def connection() -> None:
            handle = open_stream(conn, 1, "w1", CAPS, me, matcher=me, notices=FreedNotices())
            conn.stream = handle.pid
            otp.send(me, ("handle", handle))
            await otp.receive(lambda m: m == "stop")

        owner = otp.spawn(connection)
        _, handle = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "handle")
        await trio.testing.wait_all_tasks_blocked()
        otp.exit(owner, otp.KILL)
        handle.offer(Offer(dispatch(), "flow:Greet"))
        assert conn.tasks() == [] and handle.state.mailed == 1


async def test_a_frame_handed_over_that_ends_the_stream_ends_its_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with otp.open_node():
        me = otp.self()
        conn = FakeConn("w1", silent)
        handle = open_stream(conn, 1, "w1", CAPS, me, matcher=me, notices=FreedNotices())
        conn.stream = handle.pid
        await trio.testing.wait_all_tasks_blocked()
        ref = otp.monitor(handle.pid)
        handle.deliver(wire.MatchClose(rid=1))  # (the worker closed its idle stream)
        assert await otp.receive(lambda m: isinstance(m, StreamGone), timeout=0)
        down = await otp.receive(lambda m: isinstance(m, otp.Down), timeout=5)
        assert down.ref == ref and down.reason == otp.NORMAL
        d = dispatch()
        handle.offer(Offer(d, "flow:Greet"))  # (too late: it goes to the dead process)
        assert conn.tasks() == []


async def test_a_stream_failing_on_what_is_handed_over_ends_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stream that fails on something handed to it ends with the error, as it would in its
    own task; the caller (here the queue's stand-in) goes on."""

    @attrs.define(eq=False)
    class BrokenConn(FakeConn):
        def send_message(self, message: Any) -> None:
            if isinstance(message, wire.MatchTask):
                raise RuntimeError("broken")
            super().send_message(message)

    async with otp.open_node():
        otp.process_flag(trap_exit=True)  # (the stream is linked to its starter)
        me = otp.self()
        conn = BrokenConn("w1", silent)
        handle = open_stream(conn, 1, "w1", CAPS, me, matcher=me, notices=FreedNotices())
        conn.stream = handle.pid
        await trio.testing.wait_all_tasks_blocked()
        ref = otp.monitor(handle.pid)
        handle.offer(Offer(dispatch(), "flow:Greet"))
        down = await otp.receive(lambda m: isinstance(m, otp.Down), timeout=5)
        assert down.ref == ref and down.reason == ("stream_failed", "RuntimeError('broken')")
        exit_ = await otp.receive(lambda m: isinstance(m, otp.Exit), timeout=0)
        assert exit_.pid == handle.pid


async def test_a_dispatch_handed_to_its_queue_is_handled_in_the_callers_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``QueueHandle.dispatch`` (the engine's direct route): the queue's handling runs at once
    in the caller's task, without waking the queue: the offer is made before it returns; one
    that waits is timed by the queue's own timer, as if it had come by message."""
    async with otp.open_node():
        me = otp.self()  # (it stands for the matcher and for the queue's one stream)
        handle = QueueHandle()
        queue = await start_queue("flow", "Greet", MatchingLimits(), me, handle)
        assert handle.pid == queue
        otp.send(queue, StreamIdle(me, "w1", CAPS))
        await trio.testing.wait_all_tasks_blocked()
        d = dispatch()
        handle.dispatch(d)
        offer = await otp.receive(lambda m: isinstance(m, Offer), timeout=0, default=None)
        assert offer is not None and offer.dispatch is d
        waits = dispatch(wait=5.0)  # (the one stream has its offer: this one waits)
        handle.dispatch(waits)
        assert (await Queue.statistics(queue)).waiting == 1
        final = await otp.receive(lambda m: isinstance(m, NotDispatched), timeout=10)
        assert final.delivery == waits.task.delivery
        assert (await Queue.statistics(queue)).waiting == 0


async def test_a_dispatch_handed_to_a_queue_told_to_stop_goes_back_to_the_matcher(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Handed over while the queue's ``StopIdle`` still waits in its mailbox, a dispatch is
    handed back to the matcher when the queue stops, as one that came by message is; once
    the queue is gone, a dispatch handed to it is sent (and goes nowhere, as before)."""
    async with otp.open_node():
        me = otp.self()
        handle = QueueHandle()
        queue = await start_queue("flow", "Greet", MatchingLimits(), me, handle)
        ref = otp.monitor(queue)
        await trio.testing.wait_all_tasks_blocked()
        otp.send(queue, StopIdle())
        late = dispatch(wait=50.0)
        handle.dispatch(late)
        forward = lambda m: isinstance(getattr(m, "request", None), Forward)  # noqa: E731
        cast = await otp.receive(forward, timeout=5)
        assert cast.request.dispatch.task == late.task
        down = await otp.receive(lambda m: isinstance(m, otp.Down), timeout=5)
        assert down.ref == ref and down.reason == otp.NORMAL
        handle.dispatch(dispatch())
        assert handle.state is not None and handle.state.received == 1


async def _queue_with_stream() -> tuple[QueueHandle, FakeConn, StreamHandle]:
    """A queue started with its handle (this process its matcher), and a stream of a silent
    worker (this process its connection) idle in it, the queue's handle given to it."""
    me = otp.self()
    handle = QueueHandle()
    queue = await start_queue("flow", "Greet", MatchingLimits(), me, handle)
    conn = FakeConn("w1", silent)
    stream = open_stream(conn, 1, "w1", CAPS, queue, matcher=me, notices=FreedNotices())
    conn.stream = stream.pid
    await trio.testing.wait_all_tasks_blocked()
    assert stream.state.queue_handle is handle  # (given as the queue heard of the stream)
    return handle, conn, stream


def _states(handle: QueueHandle) -> tuple[int, int, int]:
    """The queue's streams idle, offered and busy now (read without yielding)."""
    assert handle.state is not None
    stats = handle.state.book.statistics()
    return stats.idle, stats.offered, stats.busy


async def test_a_streams_messages_are_handed_to_its_queue_once_the_queue_knows_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once the queue has heard of a stream (its first ``StreamIdle``, by message), what the
    stream tells it is handled in the stream's caller's task: a call's end frees the stream
    in the queue before the connection's reader yields, and a decline too."""
    async with otp.open_node():
        handle, conn, stream = await _queue_with_stream()
        d = dispatch()
        handle.dispatch(d)
        assert [t.delivery for t in conn.tasks()] == [d.task.delivery]
        assert _states(handle) == (0, 1, 0)
        delivery = d.task.delivery
        stream.deliver_served(
            wire.MatchAccept(delivery, rid=1), wire.MatchResult(delivery, "hi", rid=1)
        )
        assert _states(handle) == (1, 0, 0)
        assert (await otp.receive(lambda m: isinstance(m, Completed), timeout=0)).value == "hi"
        d = dispatch()
        handle.dispatch(d)
        stream.deliver(wire.MatchAccept(d.task.delivery, rid=1))
        assert _states(handle) == (0, 0, 1)
        stream.deliver(wire.MatchResult(d.task.delivery, "hi", rid=1))
        assert _states(handle) == (1, 0, 0)
        declined = dispatch(wait=5.0)
        handle.dispatch(declined)
        stream.deliver(wire.MatchDecline(declined.task.delivery, "no_capacity", "", rid=1))
        assert handle.state is not None and handle.state.book.statistics().waiting == 1
        assert handle.state.mailed == {}


async def test_a_stream_answering_its_queue_while_the_queue_works_is_heard_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stream that answers an offer while the queue is still making it (a task it cannot
    write is taken and failed at once) tells the queue by message, and so does the stream
    until the queue has heard those: the queue takes them in their order, after it is done."""
    async with otp.open_node():
        handle, conn, stream = await _queue_with_stream()
        assert handle.state is not None
        d = dispatch()
        bad = attrs.evolve(d, task=attrs.evolve(d.task, flow_id=""))  # (wire refuses it)
        handle.dispatch(bad)
        assert handle.state.mailed == {stream.pid: 2}  # (its Accepted, then its StreamIdle)
        assert _states(handle) == (0, 1, 0)
        failed = await otp.receive(lambda m: isinstance(m, Failed), timeout=0)
        assert failed.delivery == bad.task.delivery
        await trio.testing.wait_all_tasks_blocked()
        assert handle.state.mailed == {} and _states(handle) == (1, 0, 0)
        good = dispatch()
        handle.dispatch(good)
        assert [t.delivery for t in conn.tasks()] == [good.task.delivery]


async def test_a_stream_declining_is_idle_when_its_queue_offers_it_the_next_dispatch(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The queue handed a stream's ``Declined`` may offer it the next waiting dispatch at once,
    in the same task (issue 15's hand-overs): the stream is idle by then, so it writes that
    TASK. (It told the queue before it was idle: the offer found it still holding the one it
    declined and sent it back as a second offer, and the queue then held the worker full for
    it, so an RPC waiting behind a declined Step was refused for capacity until its wait ran
    out.)"""
    async with otp.open_node():
        handle, conn, stream = await _queue_with_stream()
        assert handle.state is not None
        step, call = dispatch(wait=5.0), dispatch(wait=5.0, kind="rpc", name="read")
        handle.dispatch(step)
        handle.dispatch(call)  # (the one stream has its offer: the RPC waits)
        assert _states(handle) == (0, 1, 0)
        with caplog.at_level(logging.WARNING, logger="apps.matching"):
            stream.deliver(wire.MatchDecline(step.task.delivery, "no_capacity", "", rid=1))
        assert [t.delivery for t in conn.tasks()] == [step.task.delivery, call.task.delivery]
        assert stream.state.offered is call and _states(handle) == (0, 1, 0)
        assert handle.state.book.offered() == {stream.pid: call}
        assert "second offer" not in caplog.text
        await trio.testing.wait_all_tasks_blocked()
        assert handle.state.mailed == {} and handle.state.book.offered() == {stream.pid: call}
        stream.deliver_served(
            wire.MatchAccept(call.task.delivery, rid=1),
            wire.MatchResult(call.task.delivery, "hi", rid=1),
        )
        final = await otp.receive(
            lambda m: isinstance(m, Completed | NotDispatched) and m.delivery == call.task.delivery,
            timeout=1,
        )
        assert isinstance(final, Completed) and final.value == "hi"


@pytest.mark.parametrize("first", ["step", "rpc"])
async def test_an_rpc_and_a_step_sharing_one_idle_stream_both_complete_and_the_books_agree(
    autojump_clock: trio.testing.MockClock, first: str
) -> None:
    """A Step and an RPC handed to a queue whose worker keeps one idle stream (as with
    ``idle_streams_per_queue=1``): the first is offered, the second waits; the first's ACCEPT
    and RESULT handed over free the stream, which the queue offers the second in the same
    task; both complete with their own values, and the queue's book and the stream agree
    afterwards: one idle stream, nothing offered, busy or waiting, nothing mailed."""
    async with otp.open_node():
        handle, conn, stream = await _queue_with_stream()
        assert handle.state is not None
        step = dispatch(wait=5.0)
        call = dispatch(wait=5.0, kind="rpc", name="read")
        ordered = [step, call] if first == "step" else [call, step]
        for d in ordered:
            handle.dispatch(d)
        assert [t.delivery for t in conn.tasks()] == [ordered[0].task.delivery]
        assert _states(handle) == (0, 1, 0) and handle.state.book.statistics().waiting == 1
        for n, d in enumerate(ordered):
            delivery = d.task.delivery
            stream.deliver_served(
                wire.MatchAccept(delivery, rid=1),
                wire.MatchResult(delivery, f"{d.task.kind}-{delivery}", rid=1),
            )
            # (the next one is offered inside, before the reader would yield)
            assert [t.delivery for t in conn.tasks()] == [o.task.delivery for o in ordered[: n + 2]]
        tasks = conn.tasks()
        assert [(t.kind, t.name) for t in tasks] == [(d.task.kind, d.task.name) for d in ordered]
        for d in ordered:
            final = await otp.receive(
                lambda m, d=d: isinstance(m, FINAL) and m.delivery == d.task.delivery, timeout=1
            )
            assert isinstance(final, Completed)
            assert final.value == f"{d.task.kind}-{d.task.delivery}"
        await trio.testing.wait_all_tasks_blocked()
        stats = handle.state.book.statistics()
        assert (stats.streams, stats.idle, stats.offered, stats.busy, stats.waiting) == (
            1, 1, 0, 0, 0,
        )  # fmt: skip
        assert handle.state.book.offered() == {} and handle.state.mailed == {}
        assert handle.state.book.stream_state(stream.pid) == "idle"
        assert stream.state.phase == "idle"
        assert stream.state.offered is None and stream.state.call is None
        assert not stream.state.ended and stream.state.mailed == 0
        assert (await Queue.statistics(handle.pid)) == stats  # (its own task agrees)


async def test_a_queue_failing_on_a_dispatch_handed_to_it_ends_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A queue that fails on a dispatch handed to it ends with the error, as it would in its
    own task; the caller (here the engine's stand-in) goes on."""

    @attrs.define(eq=False)
    class BrokenStream:
        def bind_queue(self, queue_handle: QueueHandle) -> None:
            pass

        def offer(self, offer: Offer) -> None:
            raise RuntimeError("broken")

    async with otp.open_node():
        otp.process_flag(trap_exit=True)  # (the queue is linked to its starter)
        me = otp.self()
        handle = QueueHandle()
        queue = await start_queue("flow", "Greet", MatchingLimits(), me, handle)
        ref = otp.monitor(queue)
        otp.send(queue, StreamIdle(me, "w1", CAPS, BrokenStream()))
        await trio.testing.wait_all_tasks_blocked()
        handle.dispatch(dispatch())
        down = await otp.receive(lambda m: isinstance(m, otp.Down), timeout=5)
        assert down.ref == ref and down.reason == ("queue_failed", "RuntimeError('broken')")


# -- losing streams -------------------------------------------------------------------------


async def test_stream_killed_mid_call_reports_lost(autojump_clock: trio.testing.MockClock) -> None:
    async with server():
        conn = await connect("w1", accept_only)
        d = dispatch()
        submit(d)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.stream is not None
        otp.exit(conn.stream, otp.KILL)
        _, final, _ = await outcome_of(d)
        assert final == Lost(d.task.delivery, "w1", False)


async def test_connection_gone_mid_call_after_output_reports_lost_after_output(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def output(task: wire.MatchTask) -> list[Any]:
        return [
            wire.MatchAccept(delivery=task.delivery, rid=task.rid),
            wire.MatchOutput(delivery=task.delivery, value=1, rid=task.rid),
        ]

    async with server():
        conn = await connect("w1", output)
        d = dispatch()
        submit(d)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.pid is not None
        otp.exit(conn.pid, "connection_closed")
        _, final, _ = await outcome_of(d)
        assert final == Lost(d.task.delivery, "w1", True)


async def test_stream_killed_while_offered_is_reoffered_to_another(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apps.matching")
    async with server():
        first = await connect("w1", silent)
        second = await connect("w2")
        d = dispatch()
        submit(d)
        await trio.testing.wait_all_tasks_blocked()
        assert len(first.tasks()) == 1 and second.tasks() == []
        assert first.stream is not None
        otp.exit(first.stream, otp.KILL)
        _, final, _ = await outcome_of(d)
        assert isinstance(final, Completed) and final.worker_id == "w2"
    # (its ACCEPT may have died unread with it: the worker may have run it, so it is logged as
    # a possible redelivery, which the chaos run counts)
    task = d.task
    index = task.execution_id.rsplit("/", 2)[-2]
    assert (
        f"matching queue: redelivery of step {index} attempt {task.attempt} of flow"
        f" {task.flow_id} (offered to a worker that went away" in caplog.text
    )


async def test_worker_silent_on_an_offer_is_dropped_and_the_dispatch_reoffered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(dispatch_wait=100.0):
        first = await connect("w1", silent)
        await connect("w2")
        _, final, took = await outcome(dispatch(wait=100.0))
        assert isinstance(final, Completed) and final.worker_id == "w2"
        assert took == pytest.approx(60.0)
        assert isinstance(first.sent[-1], wire.MatchClose)


async def test_worker_silent_mid_call_is_lost_after_the_peer_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        await connect("w1", accept_only)
        _, final, took = await outcome(dispatch())
        assert isinstance(final, Lost) and took == pytest.approx(60.0)


async def test_idle_streams_are_pinged_every_ping_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        conn = await connect("w1")
        await trio.sleep(65)
        pings = [m for m in conn.sent if isinstance(m, wire.MatchPing)]
        assert len(pings) == 3 and pings[0].rid == 1
        # The worker answered each ping, so the stream is still there.
        assert not any(isinstance(m, wire.MatchClose) for m in conn.sent)


# -- limits ---------------------------------------------------------------------------------


async def test_streams_per_worker_limit_names_the_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(max_streams_per_worker=1):
        for _ in range(3):  # 1 + F (1 flow type) + 1
            await connect("w1")
        rejection = await rejected("w1")
        assert rejection.code == "limit" and not rejection.permanent
        assert "matching.max_streams_per_worker=1" in rejection.message


async def test_total_streams_limit_names_the_limit(autojump_clock: trio.testing.MockClock) -> None:
    async with server(max_streams=1):
        await connect("w1")
        rejection = await rejected("w2")
        assert rejection.code == "limit" and "matching.max_streams=1" in rejection.message


async def test_flow_type_name_too_long_is_rejected_permanently(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(max_flow_type_length=8):
        caps = Capabilities({"VeryLongFlowType": ({"write"}, ())})
        rejection = await rejected("w1", name="VeryLongFlowType", caps=caps)
        assert rejection.code == "limit" and rejection.permanent
        assert "matching.max_flow_type_length=8" in rejection.message


async def test_worker_id_too_long_is_rejected_permanently(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(max_queue_length=4):
        rejection = await rejected("worker-long", queue="worker", name="worker-long")
        assert rejection.permanent and "matching.max_queue_length=4" in rejection.message


async def test_too_many_flow_types_is_rejected(autojump_clock: trio.testing.MockClock) -> None:
    async with server(max_flow_types=1):
        caps = Capabilities({"Greet": ({"write"}, ()), "Other": ((), ())})
        rejection = await rejected("w1", caps=caps)
        assert rejection.permanent and "matching.max_flow_types=1" in rejection.message


async def test_worker_id_held_by_another_session_is_already_registered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        await connect("w1", session="a")
        rejection = await rejected("w1", session="b")
        assert rejection.code == "already_registered" and rejection.permanent


async def test_worker_id_is_free_again_once_its_streams_are_gone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server():
        conn = await connect("w1", session="a")
        assert conn.pid is not None
        otp.exit(conn.pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        await connect("w1", session="b")


async def test_statistics_show_streams_and_backlog(autojump_clock: trio.testing.MockClock) -> None:
    async with server():
        await connect("w1", decline("no_capacity"))
        submit(dispatch())
        await trio.testing.wait_all_tasks_blocked()
        stats = await statistics()
        assert stats.streams == 1 and stats.workers == {"w1": 1}
        queue = stats.queues["flow:Greet"]
        assert queue is not None and queue.waiting == 1 and queue.idle == 1


# -- unused queues stop -----------------------------------------------------------------------


async def _queue_names() -> list[str]:
    return sorted((await statistics()).queues)


async def test_an_unused_queue_stops_after_its_idle_timeout_and_starts_again_on_demand(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(queue_idle_timeout=30.0):
        routes, final, _ = await outcome(dispatch(wait=1.0))
        assert isinstance(final, NotDispatched) and final.reason == "unavailable"
        [first] = [p for _, p, _, _ in await supervisors.which_children(QUEUES)]
        assert await _queue_names() == ["flow:Greet"]
        await trio.sleep(29.0)
        assert await _queue_names() == ["flow:Greet"]
        await trio.sleep(2.0)
        await trio.testing.wait_all_tasks_blocked()
        assert await _queue_names() == []
        assert await supervisors.which_children(QUEUES) == []
        # The next dispatch starts the queue again, and is served by a worker there.
        await connect("w1")
        routes, final, _ = await outcome(dispatch())
        assert reasons(routes) == [("flow:Greet", "flow_queue"), ("flow:Greet", "delivered")]
        assert isinstance(final, Completed)
        [second] = [p for _, p, _, _ in await supervisors.which_children(QUEUES)]
        assert second != first


async def test_a_queue_with_a_stream_or_a_backlog_is_not_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(queue_idle_timeout=5.0):
        await connect("w1")
        submit(dispatch(wait=100.0, name="nope"))  # waits: w1 lacks the name
        await trio.sleep(50.0)
        assert await _queue_names() == ["flow:Greet"]
        routes, final, _ = await outcome(dispatch())
        assert isinstance(final, Completed) and routes[0].queue == "flow:Greet"
        assert len(await supervisors.which_children(QUEUES)) == 1


async def test_a_queue_told_to_stop_hands_back_a_dispatch_sent_to_it_straight_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The engine sends a dispatch straight to a queue with a stream (``_matcher_routes``); in
    # a race it may reach the queue after the queue said it was unused, and so after the
    # matcher's StopIdle is on its way: it goes back to the matcher, not down with the queue.
    async with server(queue_idle_timeout=1000.0):
        routes, final, _ = await outcome(dispatch(wait=1.0))  # starts the queue: unavailable
        [first] = [p for _, p, _, _ in await supervisors.which_children(QUEUES)]
        late = dispatch(wait=50.0)
        otp.send(first, late)  # (as the engine sends it straight)
        otp.cast(MATCHER, QueueIdle(first, 1))  # (what it said before the dispatch came)
        await trio.sleep(10.0)
        assert first not in [p for _, p, _, _ in await supervisors.which_children(QUEUES)]
        await connect("w1")
        routes, final, _ = await outcome(late, submitted=True)
        assert reasons(routes) == [("flow:Greet", "flow_queue"), ("flow:Greet", "delivered")]
        assert isinstance(final, Completed) and final.worker_id == "w1"


async def test_the_matcher_publishes_the_queues_a_fresh_dispatch_goes_to_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # What the engine submits with: a direct route wakes no matcher, and records the routing
    # decision the matcher would have sent.
    async with server():
        direct = DirectDeliveries(MATCHER)
        other = await connect("w2")
        sticky = await connect("w1", queue="worker", name="w1")
        d = dispatch(sticky="w1")
        routed = direct.submit(d, {})
        assert routed == Routed(d.task.delivery, "worker:w1", "sticky", "w1")
        routes, final, _ = await outcome(d, submitted=True)
        assert reasons(routes) == [("worker:w1", "delivered")]
        assert isinstance(final, Completed) and final.worker_id == "w1"
        d = dispatch()
        assert direct.submit(d, {}) == Routed(d.task.delivery, "flow:Greet", "flow_queue")
        _, final, _ = await outcome(d, submitted=True)
        assert isinstance(final, Completed) and final.worker_id == "w2"
        # No stream of the sticky worker, an excluded one: through the matcher, as before.
        d = dispatch(sticky="w9")
        assert direct.submit(d, {}) is None
        routes, _, _ = await outcome(d, submitted=True)
        assert reasons(routes)[0] == ("flow:Greet", "fallback_no_stream")
        excluded = attrs.evolve(dispatch(sticky="w1"), excluded={"w1"})
        assert direct.submit(excluded, {}) is None
        await outcome(excluded, submitted=True)
        # A draining worker's queue, and a queue whose streams went, are no routes any more.
        notify_worker(WorkerDraining("w1"))
        await trio.testing.wait_all_tasks_blocked()
        assert direct.submit(dispatch(sticky="w1"), {}) is None
        assert other.pid is not None
        otp.exit(other.pid, otp.KILL)
        await trio.testing.wait_all_tasks_blocked()
        assert direct.submit(dispatch(), {}) is None
        assert len(sticky.tasks()) == 1 and len(other.tasks()) == 3


async def test_a_queue_killed_with_a_dispatch_sent_to_it_straight_reports_it_lost(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with server():
        conn = await connect("w1")
        direct = DirectDeliveries(MATCHER)
        [(_, queue, _, _)] = await supervisors.which_children(QUEUES)
        # It dies; the matcher has not heard yet, so its route still stands.
        otp.exit(queue, otp.KILL)
        d = dispatch()
        in_flight = {d.task.delivery: d}
        assert direct.submit(d, in_flight) is not None
        assert direct.where[d.task.delivery] == (queue, "flow:Greet")
        down = await otp.receive(lambda m: isinstance(m, otp.Down), timeout=10)
        assert direct.down(down.ref, down.reason, in_flight) == [
            Lost(d.task.delivery, "flow:Greet", after_output=False)
        ]
        assert conn.tasks() == [] and direct.where == {}
        assert f"queue flow:Greet went down (killed) with delivery {d.task.delivery}" in (
            caplog.text
        )
        # The matcher forgot the queue: the next dispatch goes through it, to a new queue.
        await trio.testing.wait_all_tasks_blocked()
        assert direct.submit(dispatch(), {}) is None


async def test_a_queue_that_stops_normally_loses_no_dispatch_sent_to_it_straight() -> None:
    # (it handed them back to the matcher first: the engine forgets them, no redelivery)
    async with otp.open_node():
        direct = DirectDeliveries(MATCHER)
        queue = otp.spawn(otp.receive)
        d = dispatch()
        direct.where[d.task.delivery] = (queue, "flow:Greet")
        ref = direct.watched[queue] = otp.monitor(queue)
        direct.monitors[ref] = queue
        otp.send(queue, "stop")
        down = await otp.receive(lambda m: isinstance(m, otp.Down))
        assert direct.down(down.ref, otp.NORMAL, {d.task.delivery: d}) == []
        assert direct.where == {} and direct.watched == {}


async def test_queues_left_by_gone_workers_stop(autojump_clock: trio.testing.MockClock) -> None:
    async with server(queue_idle_timeout=10.0):
        conns = [await connect(f"w{i}", queue="worker", name=f"w{i}") for i in range(5)]
        assert len(await _queue_names()) == 5
        for conn in conns:
            assert conn.pid is not None
            otp.exit(conn.pid, otp.KILL)
        await trio.sleep(11.0)
        await trio.testing.wait_all_tasks_blocked()
        assert await _queue_names() == []
        assert (await statistics()).streams == 0
