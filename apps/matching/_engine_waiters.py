"""The engine's ``result`` waiters: who waits for which flow, until when.

A waiter is keyed by its call's ``From.tag``. Each calling process is monitored once, from
its first wait until it dies (its death drops its waiters), not once per ``result`` call; and
the waiters' timeouts share one heap and one ``send_after`` armed for the earliest (a timeout
that no longer matters is skipped when it comes up), not a timer each. A connection with many
flows waiting, or one caller waiting for one flow after another, thus costs the engine no
monitor, demonitor or timer per ``result``; and a ``result`` from a caller monitored already
may be handled in another task (``_engine_handoff``: a monitor must be the engine's own).
"""

from __future__ import annotations

import heapq

import trio

import otp

from ._engine_state import _Caller, _Flow, _State, _Waiter, _WaitTimeouts

__all__ = ["caller_down", "expired_waiters", "forget_waiter", "watch_waiter"]


def watch_waiter(state: _State, flow: _Flow, from_: otp.From, timeout: float | None) -> None:
    """``from_`` waits for ``flow`` to end, ``timeout`` seconds at most (None: no limit)."""
    key = from_.tag
    deadline = None if timeout is None else trio.current_time() + timeout
    flow.waiters[key] = _Waiter(from_, deadline)
    callers = state.callers
    caller = callers.get(from_.pid)
    if caller is None:
        caller = callers[from_.pid] = _Caller(otp.monitor(from_.pid))
        state.caller_refs[caller.ref] = from_.pid
    caller.waiters[key] = flow.flow_id
    if deadline is not None:
        state.wait_seq += 1
        heap = state.wait_heap
        heapq.heappush(heap, (deadline, state.wait_seq, flow.flow_id, key))
        if len(heap) >= state.wait_compact_at:
            # (answered waiters leave their entries behind: dropped whenever the heap doubled)
            _compact(state)
            state.wait_compact_at = max(1024, 2 * len(state.wait_heap))
        _arm(state)


def forget_waiter(state: _State, key: otp.Ref, waiter: _Waiter) -> None:
    """The waiter ``key`` (taken out of its flow's waiters) is answered: its caller stops
    waiting for it (and stays monitored, for its next ``result``, until it dies)."""
    caller = state.callers.get(waiter.from_.pid)
    if caller is not None:
        caller.waiters.pop(key, None)


def caller_down(state: _State, ref: otp.Ref) -> list[_Flow] | None:
    """A monitored caller died: its waiters are dropped; the flows they waited for (to be
    evicted if nothing else holds them). None if ``ref`` is no caller's monitor."""
    pid = state.caller_refs.pop(ref, None)
    if pid is None:
        return None
    flows = []
    for key, flow_id in state.callers.pop(pid).waiters.items():
        flow = state.flows.get(flow_id)
        if flow is not None and flow.waiters.pop(key, None) is not None:
            flows.append(flow)
    return flows


def expired_waiters(state: _State, token: int) -> list[tuple[_Flow, _Waiter]]:
    """The waiters whose timeout passed (taken out of their flows' waiters and forgotten), for
    the ``_WaitTimeouts(token)`` the engine got; the timer is armed again for the next."""
    if token != state.wait_token:
        return []
    state.wait_timer = None
    now = trio.current_time()
    heap = state.wait_heap
    out = []
    while heap and heap[0][0] <= now:
        deadline, _, flow_id, key = heapq.heappop(heap)
        flow = state.flows.get(flow_id)
        waiter = flow.waiters.get(key) if flow is not None else None
        if flow is not None and waiter is not None and waiter.deadline == deadline:
            del flow.waiters[key]
            forget_waiter(state, key, waiter)
            out.append((flow, waiter))
    _arm(state)
    return out


def _arm(state: _State) -> None:
    """One timer, for the earliest timeout in the heap."""
    heap = state.wait_heap
    if not heap:
        return
    due = heap[0][0]
    if state.wait_timer is not None:
        if due >= state.wait_due:
            return
        otp.cancel_timer(state.wait_timer)
    state.wait_token += 1
    state.wait_due = due
    delay = max(0.0, due - trio.current_time())
    state.wait_timer = otp.send_after(delay, state.me, _WaitTimeouts(state.wait_token))


def _compact(state: _State) -> None:
    """Drop the heap's entries of waiters answered already."""

    def live(entry: tuple[float, int, str, otp.Ref]) -> bool:
        flow = state.flows.get(entry[2])
        return flow is not None and entry[3] in flow.waiters

    state.wait_heap = [entry for entry in state.wait_heap if live(entry)]
    heapq.heapify(state.wait_heap)
