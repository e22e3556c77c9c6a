"""QueueBook: the sans-IO rules of one matching queue (seed: 路由和可用性, 容量和关闭)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from apps.matching._dispatch import Capabilities, Dispatch, MatchingLimits, Task
from apps.matching._queue_book import ForwardToFlow, OfferStream, QueueBook, Reject, Route

CAPS = Capabilities({"Greet": ({"write"}, {"read"})})
NO_WRITE = Capabilities({"Greet": ((), {"read"})})
OTHER_FLOW = Capabilities({"Other": ({"write"}, ())})


@attrs.define
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


#: The book never looks at ``reply_to``: a stand-in for the engine's pid.
REPLY_TO: Any = object()


def task(
    delivery: int = 1, *, name: str = "write", kind: str = "step", deadline: Any = None
) -> Task:
    return Task(delivery, kind, "Greet", "f1", name, f"f1/0/{name}", 1, [], {}, deadline)


def dispatch(
    delivery: int = 1, *, wait: float = 10.0, sticky: str | None = None, **kw: Any
) -> Dispatch:
    return Dispatch(task(delivery, **kw), REPLY_TO, sticky, wait)


def book(kind: str = "flow", name: str = "Greet", **limits: Any) -> tuple[QueueBook, Clock]:
    clock = Clock()
    return QueueBook(kind, name, clock=clock, limits=MatchingLimits(**limits)), clock


def offers(actions: list[Any]) -> list[tuple[Any, int]]:
    return [(a.stream, a.dispatch.task.delivery) for a in actions if isinstance(a, OfferStream)]


def rejects(actions: list[Any]) -> list[tuple[int, str]]:
    return [(a.dispatch.task.delivery, a.reason) for a in actions if isinstance(a, Reject)]


def message(actions: list[Any]) -> str:
    """The message of the one Reject among ``actions``."""
    (found,) = [a.message for a in actions if isinstance(a, Reject)]
    return found


def forwards(actions: list[Any]) -> list[ForwardToFlow]:
    return [a for a in actions if isinstance(a, ForwardToFlow)]


# -- streams and offers ---------------------------------------------------------------------


def test_idle_stream_gets_a_waiting_dispatch() -> None:
    b, _ = book()
    assert b.dispatch(dispatch(1)) == []
    assert offers(b.stream_idle("s1", "w1", CAPS)) == [("s1", 1)]
    assert b.stream_state("s1") == "offered"


def test_dispatch_goes_to_the_longest_idle_stream_first() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s2", "w2", CAPS)
    assert offers(b.dispatch(dispatch(1))) == [("s1", 1)]
    assert offers(b.dispatch(dispatch(2))) == [("s2", 2)]


def test_a_stream_carries_one_call_at_a_time() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    assert offers(b.dispatch(dispatch(1))) == [("s1", 1)]
    assert b.dispatch(dispatch(2)) == []
    assert b.accepted("s1", 1) == []
    assert b.stream_state("s1") == "busy"
    assert b.waiting()[0].task.delivery == 2
    assert offers(b.stream_idle("s1", "w1", CAPS)) == [("s1", 2)]


def test_an_accept_for_another_delivery_is_ignored() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    assert b.accepted("s1", 99) == []
    assert b.stream_state("s1") == "offered"


def test_stream_lacking_the_name_is_never_offered_it() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", NO_WRITE)
    b.stream_idle("s2", "w2", OTHER_FLOW)
    assert b.dispatch(dispatch(1)) == []
    assert offers(b.dispatch(dispatch(2, kind="rpc", name="read"))) == [("s1", 2)]


def test_stream_gone_while_offered_reoffers_the_dispatch_elsewhere() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.stream_idle("s2", "w2", CAPS)
    assert offers(b.stream_gone("s1")) == [("s2", 1)]
    assert b.stream_state("s1") is None


def test_stream_gone_while_busy_leaves_the_call_to_the_stream() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.accepted("s1", 1)
    assert b.stream_gone("s1") == []
    assert b.backlog == 0


# -- declines -------------------------------------------------------------------------------


def test_no_capacity_keeps_the_stream_idle_and_tries_other_workers() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s2", "w2", CAPS)
    b.dispatch(dispatch(1))
    actions = b.declined("s1", 1, "no_capacity")
    assert [(a.reason, a.worker_id) for a in actions if isinstance(a, Route)] == [
        ("declined_no_capacity", "w1")
    ]
    assert offers(actions) == [("s2", 1)]
    assert b.stream_state("s1") == "idle"


def test_no_capacity_skips_other_streams_of_the_same_worker() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s1b", "w1", CAPS)
    b.dispatch(dispatch(1))
    assert offers(b.declined("s1", 1, "no_capacity")) == []
    assert [d.task.delivery for d in b.waiting()] == [1]


def test_no_capacity_dispatch_waits_until_the_worker_is_freed() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.declined("s1", 1, "no_capacity")
    assert b.worker_freed("w2") == []
    assert offers(b.worker_freed("w1")) == [("s1", 1)]


def test_a_worker_freed_while_its_decline_was_on_the_way_is_offered_the_dispatch_again() -> None:
    # The worker's WorkerFreed (through the matcher) overtook its DECLINE (from its stream):
    # the decline may have been read while it was still full, so it is not held for a
    # WorkerFreed that already came.
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s1b", "w1", CAPS)
    b.dispatch(dispatch(1))
    assert b.worker_freed("w1") == []  # (the offer to s1 is out: nothing to offer)
    assert offers(b.declined("s1", 1, "no_capacity")) == [("s1b", 1)]
    # A decline with no WorkerFreed since its offer holds the worker as before.
    assert offers(b.declined("s1b", 1, "no_capacity")) == []
    assert offers(b.worker_freed("w1")) == [("s1", 1)]


def test_no_capacity_dispatch_goes_to_a_new_worker_stream() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.declined("s1", 1, "no_capacity")
    assert offers(b.stream_idle("s2", "w2", CAPS)) == [("s2", 1)]


def test_a_stream_declined_for_one_dispatch_may_take_another() -> None:
    b, _ = book()
    b.dispatch(dispatch(1))
    b.dispatch(dispatch(2, kind="rpc", name="read"))
    assert offers(b.stream_idle("s1", "w1", CAPS)) == [("s1", 1)]
    assert offers(b.declined("s1", 1, "no_capacity")) == [("s1", 2)]


def test_all_busy_for_the_whole_wait_is_no_worker_available() -> None:
    b, clock = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.declined("s1", 1, "no_capacity")
    assert b.next_expiry() == 110.0
    clock.now = 110.0
    actions = b.expire()
    assert rejects(actions) == [(1, "no_worker_available")]
    assert "declined it for capacity" in message(actions)
    assert b.backlog == 0


def test_unknown_name_in_a_flow_queue_excludes_the_worker_and_tries_others() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s1b", "w1", CAPS)
    b.stream_idle("s2", "w2", CAPS)
    b.dispatch(dispatch(1))
    assert offers(b.declined("s1", 1, "unknown_name")) == [("s2", 1)]
    b.declined("s2", 1, "no_capacity")
    # w1 stays excluded, even after it is freed.
    assert offers(b.worker_freed("w1")) == []


def test_unknown_name_from_every_worker_ends_as_unknown_name() -> None:
    b, clock = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.declined("s1", 1, "unknown_name")
    clock.now += 10
    actions = b.expire()
    assert rejects(actions) == [(1, "unknown_name")]
    assert "'write'" in message(actions) and "'Greet'" in message(actions)


def test_workers_lacking_the_name_by_their_caps_end_as_unknown_name() -> None:
    b, clock = book()
    b.stream_idle("s1", "w1", NO_WRITE)
    b.dispatch(dispatch(1))
    clock.now += 10
    assert rejects(b.expire()) == [(1, "unknown_name")]


def test_no_worker_for_the_whole_wait_is_unavailable() -> None:
    b, clock = book()
    b.dispatch(dispatch(1))
    clock.now += 9.9
    assert b.expire() == []
    clock.now += 0.1
    actions = b.expire()
    assert rejects(actions) == [(1, "unavailable")]
    text = message(actions)
    assert "'Greet'" in text and "'write'" in text and "start a pull worker" in text


def test_draining_worker_is_never_offered_anything() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.worker_draining("w1")
    assert b.dispatch(dispatch(1)) == []
    assert offers(b.stream_idle("s2", "w2", CAPS)) == [("s2", 1)]


def test_decline_draining_marks_the_worker_draining() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s1b", "w1", CAPS)
    b.dispatch(dispatch(1))
    assert offers(b.declined("s1", 1, "draining")) == []
    assert b.dispatch(dispatch(2)) == []


def test_a_decline_after_the_wait_ended_ends_the_dispatch() -> None:
    b, clock = book()
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    clock.now += 20
    assert b.expire() == []  # offered: waits for the answer
    assert rejects(b.declined("s1", 1, "no_capacity")) == [(1, "no_worker_available")]


# -- waits and deadlines --------------------------------------------------------------------


def test_wait_never_passes_the_task_deadline() -> None:
    b, clock = book()
    b.dispatch(dispatch(1, deadline=103.0))
    assert b.next_expiry() == 103.0
    clock.now = 103.0
    assert rejects(b.expire()) == [(1, "unavailable")]


def test_a_dispatch_past_its_deadline_is_not_offered() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    actions = b.dispatch(dispatch(1, deadline=99.0))
    assert offers(actions) == [] and rejects(actions) == [(1, "unavailable")]


def test_backlog_limit_rejects_with_the_limit_named() -> None:
    b, _ = book(max_backlog=2)
    b.dispatch(dispatch(1))
    b.dispatch(dispatch(2))
    actions = b.dispatch(dispatch(3))
    assert rejects(actions) == [(3, "unavailable")]
    assert "matching.max_backlog=2" in message(actions)


# -- worker (sticky) queues -----------------------------------------------------------------


def test_worker_queue_waits_the_sticky_wait_then_forwards_the_rest() -> None:
    b, clock = book("worker", "w1")
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s1b", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.declined("s1", 1, "no_capacity")
    b.dispatch(dispatch(2))
    b.declined("s1b", 2, "no_capacity")
    assert b.next_expiry() == 105.0
    clock.now = 105.0
    found = forwards(b.expire())
    assert [(f.dispatch.task.delivery, f.reason, f.worker_id) for f in found] == [
        (1, "fallback_timeout", "w1"),
        (2, "fallback_timeout", "w1"),
    ]
    assert found[0].dispatch.wait == pytest.approx(5.0)
    assert found[0].dispatch.declined_no_capacity


def test_worker_queue_unknown_name_reroutes_at_once_excluding_the_worker() -> None:
    b, clock = book("worker", "w1")
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    clock.now += 1
    found = forwards(b.declined("s1", 1, "unknown_name"))
    assert [(f.reason, f.dispatch.excluded) for f in found] == [
        ("reroute_unknown_name", frozenset({"w1"}))
    ]
    assert found[0].dispatch.wait == pytest.approx(9.0)
    assert b.stream_state("s1") == "idle"


def test_worker_queue_without_the_name_reroutes_without_offering() -> None:
    b, _ = book("worker", "w1")
    b.stream_idle("s1", "w1", NO_WRITE)
    found = forwards(b.dispatch(dispatch(1)))
    assert [(f.reason, f.dispatch.excluded) for f in found] == [
        ("reroute_unknown_name", frozenset({"w1"}))
    ]


def test_worker_queue_without_streams_forwards_at_once() -> None:
    b, _ = book("worker", "w1")
    assert [f.reason for f in forwards(b.dispatch(dispatch(1)))] == ["fallback_no_stream"]


def test_worker_queue_forwards_when_its_last_stream_goes() -> None:
    b, _ = book("worker", "w1")
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1))
    found = forwards(b.stream_gone("s1"))
    assert [(f.dispatch.task.delivery, f.reason) for f in found] == [(1, "fallback_no_stream")]


def test_worker_queue_forwards_when_its_worker_drains() -> None:
    b, _ = book("worker", "w1")
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s1b", "w1", CAPS)
    b.dispatch(dispatch(1))
    b.accepted("s1", 1)
    b.dispatch(dispatch(2))
    b.accepted("s1b", 2)
    b.dispatch(dispatch(3))
    assert [f.dispatch.task.delivery for f in forwards(b.worker_draining("w1"))] == [3]


def test_worker_queue_with_no_wait_left_ends_instead_of_forwarding() -> None:
    b, clock = book("worker", "w1")
    b.stream_idle("s1", "w1", CAPS)
    b.dispatch(dispatch(1, wait=3.0))
    b.declined("s1", 1, "no_capacity")
    clock.now += 3.0
    assert rejects(b.expire()) == [(1, "no_worker_available")]


def test_a_stopping_queue_hands_back_its_waiting_dispatches_with_the_wait_left() -> None:
    # (a dispatch the engine sent straight to the queue after it said it was unused)
    flow, clock = book()
    flow.dispatch(dispatch(1, wait=10.0))
    flow.dispatch(dispatch(2, wait=4.0))
    clock.now += 3.0
    found = forwards(flow.hand_back())
    assert [(f.dispatch.task.delivery, f.reason, f.worker_id) for f in found] == [
        (1, "flow_queue", None),
        (2, "flow_queue", None),
    ]
    assert [f.dispatch.wait for f in found] == [7.0, 1.0]
    assert flow.backlog == 0 and flow.unused
    worker, _ = book("worker", "w1")
    worker.stream_idle("s1", "w1", CAPS)
    worker.dispatch(dispatch(3))
    worker.accepted("s1", 3)
    worker.dispatch(dispatch(4))
    found = forwards(worker.hand_back())
    assert [(f.dispatch.task.delivery, f.reason, f.worker_id) for f in found] == [
        (4, "fallback_no_stream", "w1")
    ]


def test_forwarded_exclusions_hold_in_the_flow_queue() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    rerouted = attrs.evolve(dispatch(1), excluded={"w1"})
    assert b.dispatch(rerouted) == []
    assert offers(b.stream_idle("s2", "w2", CAPS)) == [("s2", 1)]


def test_statistics_count_streams_and_backlog() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s2", "w2", CAPS)
    b.dispatch(dispatch(1))
    b.dispatch(dispatch(2, kind="rpc", name="nope"))
    stats = b.statistics()
    assert (stats.streams, stats.idle, stats.offered, stats.waiting, stats.workers) == (
        2,
        1,
        1,
        1,
        2,
    )


def test_statistics_count_the_declines_the_queue_was_answered() -> None:
    b, _ = book()
    b.stream_idle("s1", "w1", CAPS)
    b.stream_idle("s2", "w2", CAPS)
    assert offers(b.dispatch(dispatch(1))) == [("s1", 1)]
    assert offers(b.declined("s1", 1, "no_capacity")) == [("s2", 1)]
    b.declined("s2", 1, "unknown_name")
    b.declined("s2", 1, "unknown_name")  # (not offered any more: not a decline of an offer)
    assert b.statistics().declines == 2


def test_limits_are_validated_with_the_field_named() -> None:
    with pytest.raises(
        ValueError, match=r"MatchingLimits.max_backlog must be an int >= 1 \(got 0\)"
    ):
        MatchingLimits(max_backlog=0)
    with pytest.raises(ValueError, match=r"MatchingLimits.sticky_wait must be a number of seconds"):
        MatchingLimits(sticky_wait=-1)


def test_capabilities_can_answers_none_for_an_unadvertised_flow_type() -> None:
    caps = Capabilities.from_wire({"Greet": {"steps": ["write"], "rpcs": ["read"]}})
    assert caps.can("Greet", "step", "write") is True
    assert caps.can("Greet", "step", "read") is False
    assert caps.can("Greet", "rpc", "read") is True
    assert caps.can("Other", "step", "write") is None


def test_a_book_is_unused_only_without_streams_waiting_or_offered_dispatches() -> None:
    b, clock = book()
    assert b.unused
    b.dispatch(dispatch(1))
    assert not b.unused  # waiting
    b.stream_idle("s1", "w1", CAPS)
    assert not b.unused  # offered, and a stream
    b.accepted("s1", 1)
    b.stream_gone("s1")
    assert b.unused
    b.dispatch(dispatch(2, wait=1.0))
    clock.now += 2.0
    b.expire()
    assert b.unused
