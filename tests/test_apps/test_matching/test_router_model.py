"""A Hypothesis model of matching's routing: a worker (sticky) queue and a flow-type queue
(two ``QueueBook``s, the harness forwarding between them as the matcher does) driven by random
workers connecting streams, declining, accepting, finishing, disconnecting and draining while
the clock advances, against a small model of every dispatch and stream.

What passes between a queue and a stream is a message, in flight until a rule delivers it:
the queue's offers to each stream, each stream's ``StreamIdle`` (carrying its ``Accepted``
when the worker's ACCEPT and outcome came at once), ``Accepted``, ``Declined`` and its end
(the queue's monitor), and the ``WorkerFreed`` notices the matcher passes on. Each pair's
messages keep their order and nothing else does (OTP's rule, which the runtime follows): so
the model explores a stream's idle notice crossing an offer, an answer arriving after other
senders' dispatches, timers and frees, a stream dying with messages in flight. A stream
does what ``_stream.py`` does: it tells its queue it is idle only once it is.

Invariants: every dispatch ends exactly once; it is never ``NotDispatched`` before its whole
wait is over (declines and re-routes consume no attempt); a stream is offered a dispatch only
while it is idle (never a second offer: ``_stream._refuse`` never runs) and the queue never
takes a stream's idle notice for the answer to an offer it has not seen; excluded, draining
and unable workers are never offered anything; once nothing is in flight, each book agrees
with its streams.

The engine sends a fresh dispatch straight to the queue the matcher would pick at once
(``_matcher_routes``) and watches it: the model keeps which dispatches are there so, until they
leave that queue. A queue may die (killed) while it holds only such dispatches: each is ``Lost``
and dispatched again as a new delivery (the engine's rule), its streams close, and a new queue
takes its place. A queue without streams may be told to stop: it hands back what waits in it
(a dispatch sent straight to it after it said it was unused) and a new queue takes its place.
"""

from __future__ import annotations

from collections import deque
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
    """A stream as its process sees itself (its queue's book may not know yet)."""

    worker: str
    queue: str  # "flow" or "worker"
    delivery: int | None = None
    state: str = "idle"  # idle | offered | busy | gone
    #: Offers (deliveries) the queue sent it, not yet received.
    inbox: deque[int] = attrs.Factory(deque)
    #: What it told its queue, not yet received: ("idle", accepted delivery or None),
    #: ("accepted", delivery), ("declined", delivery, reason), ("gone",).
    outbox: deque[tuple[Any, ...]] = attrs.Factory(deque)
    #: Handed over (``StreamHandle``, ``QueueHandle.from_stream``): an offer is taken, and
    #: what it tells its queue heard, at once, inside the sender's handling, while nothing
    #: of that way waits before it (and, towards the queue, the queue is not handling
    #: something, and knows the stream).
    handed: bool = False


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
        #: The draining workers each queue has been told of (it offers them nothing).
        self.told: dict[str, set[str]] = {"flow": set(), "worker": set()}
        #: ``WorkerFreed`` notices on their way to each queue (through the matcher).
        self.freed: dict[str, deque[str]] = {"flow": deque(), "worker": deque()}
        #: Deliveries the engine sent straight to a queue and still watched there.
        self.direct: dict[int, str] = {}
        #: The queues handling a stream's message now (what is handed to them waits).
        self.handling: set[str] = set()
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
                assert model.status == "waiting", model
                assert stream.worker not in model.excluded, "offered to an excluded worker"
                assert stream.worker not in self.told[queue], "offered to a draining worker"
                assert CAPS[stream.worker].can(task.flow_type, task.kind, task.name)
                assert task.deadline is None or task.deadline > self.clock.now
                model.status, model.stream = "offered", action.stream
                if stream.state != "gone":  # (a dead process's mail goes nowhere)
                    stream.inbox.append(task.delivery)
                    if stream.handed and len(stream.inbox) == 1:
                        self.receive(action.stream)
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
        self.freed[queue].clear()  # (the matcher's notices to the old queue went with it)
        self.told[queue] = set(self.draining)
        for worker in self.draining:
            # (the matcher tells a queue of a draining worker's stream as it registers)
            assert book.worker_draining(worker) == []
        return book

    def end(self, model: DispatchModel, status: str) -> None:
        self.direct.pop(model.dispatch.task.delivery, None)
        model.ends += 1
        assert model.ends == 1, "a dispatch ends exactly once"
        model.status = status

    def tell_queue(self, key: int, *message: Any) -> None:
        stream = self.streams[key]
        stream.outbox.append(message)
        if (
            stream.handed
            and len(stream.outbox) == 1
            and message[0] != "gone"  # (a monitor's DOWN)
            and stream.queue not in self.handling
            and self.books[stream.queue].stream_state(key) is not None
        ):
            self.hear(key)

    def receive(self, key: int) -> None:
        """The stream takes the next offer sent to it."""
        stream = self.streams[key]
        delivery = stream.inbox.popleft()
        assert stream.state == "idle", f"stream {key} got a second offer ({delivery})"
        stream.state, stream.delivery = "offered", delivery

    def call_over(self, key: int, accepted: int | None) -> None:
        """The stream's call ended (its outcome went to the engine): it is idle, then tells its
        queue, and its worker's queues hear ``WorkerFreed`` through the matcher."""
        stream = self.streams[key]
        assert stream.delivery is not None
        self.end(self.dispatches[stream.delivery], "completed")
        stream.state, stream.delivery = "idle", None
        self.tell_queue(key, "idle", accepted)
        for queue in self.books:
            self.freed[queue].append(stream.worker)

    # -- rules: the worker's side --------------------------------------------------------------

    @rule(
        worker=st.sampled_from(sorted(CAPS)),
        queue=st.sampled_from(["flow", "worker"]),
        handed=st.booleans(),
    )
    def connect(self, worker: str, queue: str, handed: bool) -> None:
        if queue == "worker" and worker != STICKY:
            queue = "flow"
        key = self.next_stream
        self.next_stream += 1
        self.streams[key] = StreamModel(worker, queue, handed=handed)
        self.tell_queue(key, "idle", None)  # (its first StreamIdle, by message)

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

    def _in(self, state: str) -> list[int]:
        return sorted(k for k, s in self.streams.items() if s.state == state)

    def _receiving(self) -> list[int]:
        return sorted(k for k, s in self.streams.items() if s.inbox)

    def _telling(self) -> list[int]:
        return sorted(k for k, s in self.streams.items() if s.outbox)

    @precondition(lambda self: self._receiving())
    @rule(data=st.data())
    def stream_gets_its_offer(self, data: st.DataObject) -> None:
        self.receive(data.draw(st.sampled_from(self._receiving())))

    @precondition(lambda self: self._in("offered"))
    @rule(
        data=st.data(),
        answer=st.sampled_from(["accept", "served", "no_capacity", "unknown_name", "draining"]),
    )
    def answer(self, data: st.DataObject, answer: str) -> None:
        key = data.draw(st.sampled_from(self._in("offered")))
        stream = self.streams[key]
        delivery = stream.delivery
        assert delivery is not None
        model = self.dispatches[delivery]
        if answer == "accept":
            stream.state = "busy"
            self.direct.pop(delivery, None)  # (its stream's Routed "delivered", to the engine)
            model.status = "running"
            self.tell_queue(key, "accepted", delivery)
        elif answer == "served":  # (ACCEPT and outcome read at once: one StreamIdle)
            stream.state = "busy"
            self.call_over(key, delivery)
        else:
            if answer == "draining":
                # (its connection tells the matcher, which tells every queue of the worker)
                self.drain(stream.worker)
            stream.state, stream.delivery = "idle", None
            self.tell_queue(key, "declined", delivery, answer)

    @precondition(lambda self: self._in("busy"))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self.call_over(data.draw(st.sampled_from(self._in("busy"))), None)

    @precondition(lambda self: any(s.state != "gone" for s in self.streams.values()))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        """The stream's process ends (its connection died): a call it owns is its to report
        as ``Lost``; its queue's monitor tells the queue, after what it told it before."""
        live = sorted(k for k, s in self.streams.items() if s.state != "gone")
        key = data.draw(st.sampled_from(live))
        stream = self.streams[key]
        if stream.state == "busy":
            assert stream.delivery is not None
            self.end(self.dispatches[stream.delivery], "lost")
        stream.state, stream.delivery = "gone", None
        stream.inbox.clear()
        self.tell_queue(key, "gone")

    # (one worker at least never drains of its own accord: else most runs soon offer nothing)
    @precondition(lambda self: len(self.draining) < len(CAPS) - 1)
    @rule(worker=st.sampled_from(sorted(CAPS)))
    def drain(self, worker: str) -> None:
        self.draining.add(worker)
        for queue, book in self.books.items():
            self.told[queue].add(worker)
            self.apply(queue, book.worker_draining(worker))

    # -- rules: what reaches a queue -----------------------------------------------------------

    @precondition(lambda self: self._telling())
    @rule(data=st.data())
    def queue_hears_its_stream(self, data: st.DataObject) -> None:
        self.hear(data.draw(st.sampled_from(self._telling())))

    def hear(self, key: int) -> None:
        queue = self.streams[key].queue
        self.handling.add(queue)
        try:
            self._hear(key)
        finally:
            self.handling.discard(queue)

    def _hear(self, key: int) -> None:
        stream = self.streams[key]
        message = stream.outbox.popleft()
        book = self.books[stream.queue]
        was = book.stream_state(key)
        offered = book.offered().get(key)
        kind = message[0]
        if kind == "idle":
            _, accepted = message
            if accepted is not None:
                assert was == "offered" and offered is not None
                assert offered.task.delivery == accepted
                assert book.accepted(key, accepted) == []
            else:
                # (the stream answered every offer the queue made it before it was idle)
                assert was != "offered", "a StreamIdle taken for the answer to an offer"
            self.apply(stream.queue, book.stream_idle(key, stream.worker, CAPS[stream.worker]))
        elif kind == "accepted":
            assert was == "offered" and offered is not None
            assert offered.task.delivery == message[1]
            assert book.accepted(key, message[1]) == []
        elif kind == "declined":
            _, delivery, reason = message
            assert was == "offered" and offered is not None
            assert offered.task.delivery == delivery
            model = self.dispatches[delivery]
            model.status = "waiting"
            if reason == "unknown_name":
                model.excluded.add(stream.worker)
            elif reason == "draining":
                self.told[stream.queue].add(stream.worker)
            self.apply(stream.queue, book.declined(key, delivery, reason))
        else:
            assert kind == "gone" and not stream.outbox
            if offered is not None:  # (offered, unanswered: it waits again)
                self.dispatches[offered.task.delivery].status = "waiting"
            self.apply(stream.queue, book.stream_gone(key))

    @precondition(lambda self: any(self.freed.values()))
    @rule(queue=st.sampled_from(["flow", "worker"]))
    def queue_hears_a_worker_freed(self, queue: str) -> None:
        if self.freed[queue]:
            worker = self.freed[queue].popleft()
            self.apply(queue, self.books[queue].worker_freed(worker))

    def _held(self, queue: str) -> list[int]:
        book = self.books[queue]
        held = [d.task.delivery for d in book.waiting()]
        return held + [d.task.delivery for d in book.offered().values()]

    def _killable(self) -> list[str]:
        return [
            q
            for q in ("flow", "worker")
            if self._held(q) and all(self.direct.get(d) == q for d in self._held(q))
        ]

    @precondition(lambda self: self._killable())
    @rule(data=st.data())
    def kill_queue(self, data: st.DataObject) -> None:
        """A queue dies holding only dispatches the engine sent it straight (those the matcher
        routed on are not the engine's to watch)."""
        queue = data.draw(st.sampled_from(self._killable()))
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
            stream.inbox.clear()
            stream.outbox.clear()
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

    def _stoppable(self) -> list[str]:
        # (it said it was unused: no stream of its own book, and none on its way to it)
        return [
            q
            for q in ("flow", "worker")
            if not self._live(q) and not self.books[q].statistics().streams
        ]

    @precondition(lambda self: self._stoppable())
    @rule(data=st.data())
    def stop_unused(self, data: st.DataObject) -> None:
        """A queue without streams is told to stop (it said it was unused; a dispatch may have
        come straight to it since)."""
        queue = data.draw(st.sampled_from(self._stoppable()))
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
    def streams_agree_with_the_books_once_nothing_is_in_flight(self) -> None:
        for key, stream in self.streams.items():
            if stream.inbox or stream.outbox:
                continue
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
            assert delivery not in waiting or delivery not in offered, model
            if model.status == "waiting":
                assert delivery in waiting, model
            elif model.status == "offered":
                assert offered.get(delivery) == model.stream, model
            else:
                # (running or over: its queue may not have heard its stream's answer yet)
                assert delivery not in waiting, model
                assert offered.get(delivery, model.stream) == model.stream, model

    def teardown(self) -> None:
        # Let every wait run out, every message arrive and every worker answer: then every
        # dispatch has ended.
        self.clock.now += 1000.0
        for queue in ("worker", "flow"):
            self.apply(queue, self.books[queue].expire())
        for _ in range(200):
            for key in self._receiving():
                self.receive(key)
            for key in self._telling():
                while self.streams[key].outbox:
                    self.hear(key)
            for queue, notices in self.freed.items():
                while notices:
                    self.apply(queue, self.books[queue].worker_freed(notices.popleft()))
            if self._receiving() or self._telling():
                continue
            offered, busy = self._in("offered"), self._in("busy")
            if not offered and not busy:
                break
            for key in offered:
                stream = self.streams[key]
                delivery = stream.delivery
                stream.state, stream.delivery = "idle", None
                self.tell_queue(key, "declined", delivery, "x")
            for key in busy:
                self.call_over(key, None)
        for model in self.dispatches.values():
            assert model.ends == 1, model


TestRouterModel = RouterModel.TestCase
TestRouterModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
