"""The ``StoreServer``'s group commit: a group started (``flush``), its senders answered, and
its ``StoreHandle``, through which the engine's own task commits a batch on an idle server (as
``QueueHandle`` hands a queue its dispatches): a message there and one back saved a commit.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

import attrs
import outcome
import trio

import otp

from ._engine_handoff import committed_to
from ._store_records import (
    BatchCommitted,
    FlowExists,
    StoreConflict,
    StoreError,
    WriteBatch,
    check_batch,
)

if TYPE_CHECKING:
    from ._store_server import _State

__all__ = [
    "ERRORS",
    "Committed",
    "Crashed",
    "Group",
    "Notify",
    "StoreHandle",
    "To",
    "answer",
    "count",
    "error_reply",
    "flush",
    "handle_of",
    "register",
]

#: The tag of each store error in a call's ``("error", tag, message, details)`` reply.
ERRORS: dict[str, type[StoreError]] = {
    "exists": FlowExists,
    "conflict": StoreConflict,
    "error": StoreError,
}
_TAGS = {cls: tag for tag, cls in ERRORS.items()}


@attrs.frozen
class Notify:
    """Where the outcome of a ``commit_nowait`` batch goes."""

    pid: otp.Pid
    tag: Any


To = otp.From | Notify


@attrs.frozen
class Group:
    entries: list[tuple[WriteBatch, To]]


@attrs.frozen
class Committed:
    size: int


@attrs.frozen
class Crashed:
    """A group's transaction raised what is not a :class:`StoreError`, or answering its senders
    raised (a bug): the server crashes with it, as with its worker's."""

    error: BaseException


def error_reply(exc: StoreError) -> tuple[str, str, str, dict[str, Any]]:
    return ("error", _TAGS.get(type(exc), "error"), exc.message, exc.details)


def flush(state: _State) -> None:
    """Start every queued batch as one group (one transaction): in the store's thread at once
    when its connection is free (``Store.commit_soon``: no pass of the worker before the thread
    starts, nor after it ends; on SQLite a group of up to ``INLINE_RECORDS`` records runs here,
    to its end), else through the worker, behind the reads it runs."""
    group, state.queued = state.queued, []
    state.in_flight = len(group)
    batches = [batch for batch, _ in group]
    if not state.store.commit_soon(batches, functools.partial(_ended, state.me, group)):
        state.jobs.send_nowait(Group(group))


def count(state: _State, size: int) -> None:
    """A group of ``size`` batches ended: the connection is the server's again."""
    state.groups += 1
    state.batches += size
    state.largest_group = max(state.largest_group, size)
    state.in_flight = 0


def _ended(
    server: otp.Pid,
    group: list[tuple[WriteBatch, To]],
    result: outcome.Outcome[list[StoreError | None]],
) -> None:
    """(On trio's thread: a group ``commit_soon`` started ended, in its thread or in the
    server's own ``flush``.) Answer its senders and tell the server, as the worker does after
    a group. Once the server died nobody is told (its
    senders learn it by its DOWN, as when the worker dies with it mid-transaction)."""
    if not otp.is_process_alive(server):
        return
    bug = _answered(group, result)
    otp.send(server, Committed(len(group)) if bug is None else Crashed(bug))


def _answered(
    group: list[tuple[WriteBatch, To]], result: outcome.Outcome[list[StoreError | None]]
) -> BaseException | None:
    """Tell a group's senders its outcome; the bug the server must crash with instead (a
    transaction that raised what is not a :class:`StoreError`, or the answering), else None."""
    outcomes: list[StoreError | None]
    if isinstance(result, outcome.Error):
        error = result.error
        if not isinstance(error, StoreError):
            return error
        outcomes = [error] * len(group)
    else:
        outcomes = result.unwrap()
    try:
        answer(group, outcomes)
    except Exception as exc:  # (in no process, or in another's: raising here ends that)
        return exc
    return None


def answer(group: list[tuple[WriteBatch, To]], outcomes: list[StoreError | None]) -> None:
    """Tell each sender of a group its batch's outcome."""
    for (_, to), outcome_ in zip(group, outcomes, strict=True):
        if isinstance(to, Notify):  # (the engine may take it where it is: _engine_handoff)
            committed_to(to.pid, BatchCommitted(to.tag, outcome_))
        else:
            otp.reply(to, ("ok", None) if outcome_ is None else error_reply(outcome_))


@attrs.define(eq=False)
class StoreHandle:
    """A hold on one ``StoreServer``'s state, made by its ``init`` and found by its pid
    (:func:`handle_of`), for :meth:`StoreServer.commit_nowait`.

    :meth:`commit` runs the server's handling of a ``commit_nowait`` batch in the caller's task
    (the engine's), on the server's state, when that handling would run the transaction to its
    end on trio's thread (``Store.commits_here``, then ``commit_soon(..., here_only=True)``:
    SQLite, up to ``INLINE_RECORDS`` records, the connection free): while the server's
    mailbox is empty, no group of its is in flight (its handling of anything ended: its
    callbacks never wait) and it is not stopping. The
    outcome goes to the sender as ``BatchCommitted`` as before: sent to itself, the engine takes
    it in the same pass. Neither the server's task nor the engine's is woken for it (two
    wake-ups less a commit, four a Step; issue 15). Order holds: a read or commit still in the
    mailbox, a group in flight or a read holding the connection sends it by message, behind
    them; what comes after it sees it committed. A transaction that raises what is not a
    :class:`StoreError`, or a bug answering it, crashes the server (``Crashed``, raised in its
    own task: its exit reason is what it would be there), not the caller; the caller learns it
    by its monitor, as before. PostgreSQL never commits here (a network round trip).
    """

    state: _State

    def commit(self, batch: WriteBatch, reply_to: otp.Pid, tag: Any) -> bool:
        """Commit ``batch`` here (True, its sender answered), or nothing (False: send it)."""
        state = self.state
        me = state.me
        if (
            batch.__class__ is not WriteBatch  # (the server refuses it, by message)
            or state.in_flight
            or state.stopped
            or otp.message_queue_len(me)
            or not otp.is_process_alive(me)
            or not state.store.commits_here(len(batch))  # (before the check: under load, no)
        ):
            return False
        try:
            check_batch(batch)
        except TypeError:
            return False  # (the server refuses it, by message)
        group: list[tuple[WriteBatch, To]] = [(batch, Notify(reply_to, tag))]
        state.in_flight = 1
        try:
            done = functools.partial(_ended_here, state, group)
            if state.store.commit_soon([batch], done, here_only=True):
                return True
        except Exception as exc:  # a bug: it ends the server (as it would in its own task)
            _crash(state, exc)
            return True
        state.in_flight = 0
        return False


def _ended_here(
    state: _State,
    group: list[tuple[WriteBatch, To]],
    result: outcome.Outcome[list[StoreError | None]],
) -> None:
    bug = _answered(group, result)
    if bug is None:
        count(state, len(group))
    else:
        _crash(state, bug)


def _crash(state: _State, bug: BaseException) -> None:
    state.stopped = True
    otp.send(state.me, Crashed(bug))


#: This run's ``StoreHandle`` of each live ``StoreServer`` (weak: its state holds it).
_HANDLES = trio.lowlevel.RunVar[weakref.WeakValueDictionary[otp.Pid, StoreHandle]]("store_handles")


def register(state: _State) -> StoreHandle:
    """(The server's ``init``.) Make its handle, found by its pid from now on."""
    handle = StoreHandle(state)
    try:
        handles = _HANDLES.get()
    except LookupError:
        handles = weakref.WeakValueDictionary()
        _HANDLES.set(handles)
    handles[state.me] = handle
    return handle


def handle_of(server: Any) -> StoreHandle | None:
    """The handle of the live ``StoreServer`` ``server`` (its pid or registered name) of this
    node, if it has one."""
    pid = server if server.__class__ is otp.Pid else None
    if pid is None and isinstance(server, str):
        pid = otp.whereis(server)
    if pid is None:
        return None
    try:
        return _HANDLES.get().get(pid)
    except LookupError:  # (no server started in this run)
        return None
