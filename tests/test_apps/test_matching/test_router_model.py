"""A Hypothesis model of matching's routing: a worker (sticky) queue and a flow-type queue
(two ``QueueBook``s, the harness forwarding between them as the matcher does) driven by random
workers connecting streams, declining, accepting, finishing, disconnecting and draining while
the clock advances, against a small model of every dispatch and stream.

Invariants: every dispatch ends exactly once; it is never ``NotDispatched`` before its whole
wait is over (declines and re-routes consume no attempt); a stream carries at most one call;
excluded, draining and unable workers are never offered anything.

The engine sends a fresh dispatch straight to the queue the matcher would pick at once
(``_matcher_routes``) and watches it: the model keeps which dispatches are there so, until they
leave that queue. A queue may die (killed) while it holds only such dispatches: each is ``Lost``
and dispatched again as a new delivery (the engine's rule), its streams close, and a new queue
takes its place. A queue without streams may be told to stop: it hands back what waits in it
(a dispatch sent straight to it after it said it was unused) and a new queue takes its place.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apps.matching._dispatch import Capabilities, Dispatch, MatchingLimits, Task
from apps.matching._queue_book import ForwardToFlow, OfferStream, QueueBook, Reject, Route

FULL = Capabilities({"Greet": ({"write", "read"}, {"peek"})})
#: w2 lacks the step "write" (so a dispatch of it must never reach w2).
PARTIAL = Capabilities({"Greet": ({"read"}, {"peek"})})
CAPS = {"w0": FULL, "w1": FULL, "w2": PARTIAL}
NAMES = [("step", "write"), ("step", "read"), ("rpc", "peek")]
STICKY = "w0"
LIMITS = MatchingLimits(sticky_wait=5.0)
#: The books never look at ``reply_to``: a stand-in for the engine's pid.
REPLY_TO: Any = object()


@attrs.define
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@attrs.define
class DispatchModel:
    dispatch: Dispatch
    submitted: float
    #: waiting | offered | running | completed | not_dispatched | lost
    status: str = "waiting"
    stream: int | None = None
    excluded: set[str] = attrs.Factory(set)
    ends: int = 0

    @property
    def wait_over(self) -> float:
        end = self.submitted + self.dispatch.wait
        deadline = self.dispatch.task.deadline
        return end if deadline is None else min(end, deadline)


@attrs.define
class StreamModel:
    worker: str
    queue: str  # "flow" or "worker"
    delivery: int | None = None
    state: str = "idle"  # idle | offered | busy


class RouterModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.books = {
            "flow": QueueBook("flow", "Greet", clock=self.clock, limits=LIMITS),
            "worker": QueueBook("worker", STICKY, clock=self.clock, limits=LIMITS),
        }
        self.streams: dict[int, StreamModel] = {}
        self.dispatches: dict[int, DispatchModel] = {}
        self.draining: set[str] = set()
        #: Deliveries the engine sent straight to a queue and still watched there.
        self.direct: dict[int, str] = {}
        self.next_stream = 1
        self.next_delivery = 1

    # -- carrying out the books' actions, checking each ---------------------------------------

    def apply(self, queue: str, actions: list[Any]) -> None:
        for action in actions:
            model = self.dispatches[action.dispatch.task.delivery]
            if isinstance(action, OfferStream):
                stream = self.streams[action.stream]
                task = action.dispatch.task
                assert stream.queue == queue
                assert stream.state == "idle", "a stream carries at most one call"
                assert model.status == "waiting", model
                assert stream.worker not in model.excluded, "offered to an excluded worker"
                assert stream.worker not in self.draining, "offered to a draining worker"
                assert CAPS[stream.worker].can(task.flow_type, task.kind, task.name)
                assert task.deadline is None or task.deadline > self.clock.now
                stream.state, stream.delivery = "offered", task.delivery
                model.status, model.stream = "offered", action.stream
            elif isinstance(action, ForwardToFlow):
                assert model.status == "waiting"
                assert action.dispatch.excluded >= model.excluded
                # (through the matcher: its Routed tells the engine it left this queue)
                self.direct.pop(action.dispatch.task.delivery, None)
                # (from a flow queue only as it stops: the new one, in place already, takes it)
                assert queue == "worker" or action.reason == "flow_queue"
                self.apply("flow", self.books["flow"].dispatch(action.dispatch))
            elif isinstance(action, Reject):
                assert model.status == "waiting", model
                assert self.clock.now >= model.wait_over - 1e-9, (
                    "not dispatched before its whole wait was over"
                )
                self.end(model, "not_dispatched")
            else:
                assert isinstance(action, Route)

    def new_book(self, queue: str) -> QueueBook:
        name = "Greet" if queue == "flow" else STICKY
        book = QueueBook(queue, name, clock=self.clock, limits=LIMITS)
        for worker in self.draining:
            # (the matcher tells a queue of a draining worker's stream as it registers)
            assert book.worker_draining(worker) == []
        return book

    def end(self, model: DispatchModel, status: str) -> None:
        self.direct.pop(model.dispatch.task.delivery, None)
        model.ends += 1
        assert model.ends == 1, "a dispatch ends exactly once"
        model.status = status
        model.stream = None

    # -- rules --------------------------------------------------------------------------------

    @rule(worker=st.sampled_from(sorted(CAPS)), queue=st.sampled_from(["flow", "worker"]))
    def connect(self, worker: str, queue: str) -> None:
        if queue == "worker" and worker != STICKY:
            queue = "flow"
        key = self.next_stream
        self.next_stream += 1
        self.streams[key] = StreamModel(worker, queue)
        self.apply(queue, self.books[queue].stream_idle(key, worker, CAPS[worker]))

    @rule(
        which=st.sampled_from(NAMES),
        sticky=st.booleans(),
        wait=st.sampled_from([0.5, 3.0, 10.0]),
        deadline=st.sampled_from([None, None, 2.0, 8.0]),
    )
    def submit(self, which: tuple[str, str], sticky: bool, wait: float, deadline: Any) -> None:
        absolute = None if deadline is None else self.clock.now + deadline
        self.dispatch(which, sticky, wait, absolute)

    def dispatch(
        self, which: tuple[str, str], sticky: bool, wait: float, deadline: float | None
    ) -> None:
        delivery = self.next_delivery
        self.next_delivery += 1
        kind, name = which
        task = Task(delivery, kind, "Greet", "f", name, f"f/0/{name}", 1, [], {}, deadline)
        dispatch = Dispatch(task, REPLY_TO, STICKY if sticky else None, wait)
        self.dispatches[delivery] = DispatchModel(dispatch, self.clock.now)
        # The matcher's rule: the sticky worker's queue while it has a stream there; and the
        # routes it publishes, which the engine sends along straight: that queue, or the flow
        # queue while it has a stream.
        connected = self._live("worker") and STICKY not in self.draining
        queue = "worker" if sticky and connected else "flow"
        if (sticky and connected) or (not sticky and self._live("flow")):
            self.direct[delivery] = queue
        self.apply(queue, self.books[queue].dispatch(dispatch))

    def _live(self, queue: str) -> bool:
        return any(s.queue == queue and s.state != "gone" for s in self.streams.values())

    def _offered(self) -> list[int]:
        return sorted(k for k, s in self.streams.items() if s.state == "offered")

    def _busy(self) -> list[int]:
        return sorted(k for k, s in self.streams.items() if s.state == "busy")

    @precondition(lambda self: self._offered())
    @rule(data=st.data(), answer=st.sampled_from(["accept", "no_capacity", "unknown_name"]))
    def answer(self, data: st.DataObject, answer: str) -> None:
        key = data.draw(st.sampled_from(self._offered()))
        stream = self.streams[key]
        delivery = stream.delivery
        assert delivery is not None
        model = self.dispatches[delivery]
        book = self.books[stream.queue]
        if answer == "accept":
            self.apply(stream.queue, book.accepted(key, delivery))
            self.direct.pop(delivery, None)  # (its stream's Routed "delivered")
            stream.state = "busy"
            model.status = "running"
            return
        stream.state, stream.delivery = "idle", None
        model.status, model.stream = "waiting", None
        if answer == "unknown_name":
            model.excluded.add(stream.worker)
        self.apply(stream.queue, book.declined(key, delivery, answer))

    @precondition(lambda self: self._offered())
    @rule(data=st.data())
    def decline_draining(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._offered()))
        stream = self.streams[key]
        delivery = stream.delivery
        assert delivery is not None
        self.draining.add(stream.worker)
        stream.state, stream.delivery = "idle", None
        model = self.dispatches[delivery]
        model.status, model.stream = "waiting", None
        self.apply(stream.queue, self.books[stream.queue].declined(key, delivery, "draining"))
        other = "flow" if stream.queue == "worker" else "worker"
        self.apply(other, self.books[other].worker_draining(stream.worker))

    @precondition(lambda self: self._busy())
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._busy()))
        stream = self.streams[key]
        assert stream.delivery is not None
        self.end(self.dispatches[stream.delivery], "completed")
        stream.state, stream.delivery = "idle", None
        caps = CAPS[stream.worker]
        self.apply(stream.queue, self.books[stream.queue].stream_idle(key, stream.worker, caps))
        for queue, book in self.books.items():
            self.apply(queue, book.worker_freed(stream.worker))

    @precondition(lambda self: any(s.state != "gone" for s in self.streams.values()))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        live = sorted(k for k, s in self.streams.items() if s.state != "gone")
        key = data.draw(st.sampled_from(live))
        stream = self.streams[key]
        if stream.state == "busy":
            assert stream.delivery is not None
            self.end(self.dispatches[stream.delivery], "lost")  # the stream reports Lost
        elif stream.state == "offered":
            assert stream.delivery is not None
            model = self.dispatches[stream.delivery]
            model.status, model.stream = "waiting", None
        stream.state, stream.delivery = "gone", None
        self.apply(stream.queue, self.books[stream.queue].stream_gone(key))

    @rule(worker=st.sampled_from(sorted(CAPS)))
    def drain(self, worker: str) -> None:
        self.draining.add(worker)
        for queue, book in self.books.items():
            self.apply(queue, book.worker_draining(worker))

    def _held(self, queue: str) -> list[int]:
        book = self.books[queue]
        held = [d.task.delivery for d in book.waiting()]
        return held + [d.task.delivery for d in book.offered().values()]

    @precondition(
        lambda self: any(
            self._held(q) and all(self.direct.get(d) == q for d in self._held(q))
            for q in ("flow", "worker")
        )
    )
    @rule(data=st.data())
    def kill_queue(self, data: st.DataObject) -> None:
        """A queue dies holding only dispatches the engine sent it straight (those the matcher
        routed on are not the engine's to watch)."""
        queue = data.draw(
            st.sampled_from(
                [
                    q
                    for q in ("flow", "worker")
                    if self._held(q) and all(self.direct.get(d) == q for d in self._held(q))
                ]
            )
        )
        held = self._held(queue)
        # Its streams close: an idle or offered one at once (an offer's answer goes nowhere),
        # a busy one after its call, whose outcome reaches the engine all the same.
        for stream in self.streams.values():
            if stream.queue != queue or stream.state == "gone":
                continue
            if stream.state == "busy":
                assert stream.delivery is not None
                self.end(self.dispatches[stream.delivery], "completed")
            stream.state, stream.delivery = "gone", None
        self.books[queue] = self.new_book(queue)
        for delivery in held:
            model = self.dispatches[delivery]
            self.end(model, "lost")  # (the engine's monitor of the queue: Lost before output)
            task = model.dispatch.task
            self.dispatch(
                (task.kind, task.name),
                model.dispatch.sticky_worker is not None,
                model.dispatch.wait,
                task.deadline,
            )

    @precondition(lambda self: any(not self._live(q) for q in ("flow", "worker")))
    @rule(data=st.data())
    def stop_unused(self, data: st.DataObject) -> None:
        """A queue without streams is told to stop (it said it was unused; a dispatch may have
        come straight to it since)."""
        queue = data.draw(st.sampled_from([q for q in ("flow", "worker") if not self._live(q)]))
        book = self.books[queue]
        assert not book.offered()
        self.books[queue] = self.new_book(queue)
        self.apply(queue, book.hand_back())

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 5.0, 10.0]))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        for queue in ("worker", "flow"):
            self.apply(queue, self.books[queue].expire())

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def streams_agree_with_the_books(self) -> None:
        for key, stream in self.streams.items():
            state = self.books[stream.queue].stream_state(key)
            assert state == (None if stream.state == "gone" else stream.state), (key, stream)
        carried = [s.delivery for s in self.streams.values() if s.delivery is not None]
        assert len(carried) == len(set(carried)), "a call on two streams"

    @invariant()
    def every_open_dispatch_is_somewhere(self) -> None:
        waiting = {d.task.delivery for book in self.books.values() for d in book.waiting()}
        offered = {
            d.task.delivery: key
            for book in self.books.values()
            for key, d in book.offered().items()
        }
        for delivery, model in self.dispatches.items():
            if model.status == "waiting":
                assert delivery in waiting and delivery not in offered, model
            elif model.status == "offered":
                assert offered.get(delivery) == model.stream, model
            else:
                assert delivery not in waiting and delivery not in offered, model

    def teardown(self) -> None:
        # Let every wait run out and every worker answer: then every dispatch has ended.
        self.clock.now += 1000.0
        for queue in ("worker", "flow"):
            self.apply(queue, self.books[queue].expire())
        for _ in range(100):
            offered, busy = self._offered(), self._busy()
            if not offered and not busy:
                break
            for key in offered:
                stream = self.streams[key]
                delivery = stream.delivery
                assert delivery is not None
                stream.state, stream.delivery = "idle", None
                model = self.dispatches[delivery]
                model.status, model.stream = "waiting", None
                self.apply(stream.queue, self.books[stream.queue].declined(key, delivery, "x"))
            for key in busy:
                stream = self.streams[key]
                assert stream.delivery is not None
                self.end(self.dispatches[stream.delivery], "completed")
                stream.state, stream.delivery = "gone", None
                self.apply(stream.queue, self.books[stream.queue].stream_gone(key))
        for model in self.dispatches.values():
            assert model.ends == 1, model


TestRouterModel = RouterModel.TestCase
TestRouterModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
