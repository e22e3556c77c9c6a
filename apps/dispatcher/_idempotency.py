"""Idempotency keys: calls with one key in flight share one run, in a task of the dispatcher's
runner (so a caller's cancellation never strands the callers that joined it), and its outcome
is kept in the dispatcher's ``otp.ets`` table for ``result_ttl`` seconds and replayed to later
calls with the key (see :func:`_kept` for which failures are kept). The key's arguments are
fingerprinted: the same key with other arguments is a ``conflict``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from otp import ets

from ._attempt import doubt_note, in_doubt
from ._breaker import Budget
from ._errors import DispatcherNotRunning, DispatchError, ErrorKind, fmt_seconds
from ._retry import Spending, execute
from ._runner import Job
from ._tool import Tool

if TYPE_CHECKING:
    from ._state import _State


@attrs.define(eq=False)
class KeyedRun:
    """One run shared by every caller of an idempotency key while it is in flight."""

    fingerprint: str
    done: trio.Event = attrs.Factory(trio.Event)
    value: Any = None
    error: DispatchError | None = None
    #: Whether a handler attempt has begun (a run cut short after that may have taken effect).
    started: bool = False


def _fingerprint(tool: str, args: Mapping[str, Any]) -> str | None:
    """A digest of the call, or None when its arguments are not JSON (say, a dict with keys
    of mixed types, which ``sort_keys`` cannot order)."""
    try:
        text = json.dumps([tool, args], sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        return None
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _kept(tool: Tool, error: DispatchError) -> bool:
    """Whether a keyed run's failure is kept and replayed to later calls with its key: a
    non-idempotent tool's, once its handler ran (it may have taken effect; running it again
    could do it twice). An idempotent tool's failures, and failures before any attempt
    (an open breaker, a spent budget), are not kept: the next call with the key runs."""
    return not tool.idempotent and error.attempts > 0


def _replayed(error: DispatchError, key: str) -> DispatchError:
    """The kept failure ``error`` as a later call with its key gets it."""
    copy = DispatchError.make(
        error.kind,
        f"{error.message} [replayed: the call with idempotency key {key!r} already ran and"
        " ended so; its handler was not run again (a new call needs a new key)]",
        attempts=error.attempts,
        data={**error.data, "idempotency_key": key, "replayed": True},
    )
    copy.__cause__ = error.__cause__
    return copy


def _copy(error: DispatchError) -> DispatchError:
    """A fresh envelope equal to ``error`` (an exception object is raised in one task only)."""
    copy = DispatchError.make(error.kind, error.message, attempts=error.attempts, data=error.data)
    copy.__cause__ = error.__cause__
    return copy


@attrs.frozen
class _CallsOf:
    """A caller's budget as a keyed run spends it: its calls, not its deadline (the run serves
    every caller of the key, and each of them waits by its own deadline)."""

    owner: Budget

    @property
    def calls(self) -> int | None:
        return self.owner.calls

    @property
    def deadline(self) -> float | None:
        return None

    def exhausted(self, now: float) -> bool:
        calls = self.owner.calls
        return calls is not None and calls <= 0

    def spend(self) -> None:
        self.owner.spend()

    def limit(self) -> float:
        return math.inf


async def keyed_call(
    state: _State,
    tool: Tool,
    args: Mapping[str, Any],
    key: str,
    timeout: float | None,
    budget: Budget | None,
    spent: float = 0.0,
) -> Any:
    fingerprint = _fingerprint(tool.name, args)
    if fingerprint is None:
        return await state.reject(
            DispatchError.make(
                ErrorKind.SCHEMA,
                f"tool {tool.name!r}: a call with an idempotency key needs JSON arguments"
                " (their digest tells a repeat from a conflict); these cannot be serialised"
                " (mixed-type dict keys?)",
                data={"tool": tool.name, "errors": []},
            ),
            tool.name,
        )
    try:
        cached = ets.lookup(state.table, key)
    except ets.EtsError:
        cached = []  # the dispatcher stopped: its table is gone
    if cached:
        _key, stored, value, failure = cached[0]
        if stored != fingerprint:
            return await state.reject(_conflict_error(tool, key), tool.name)
        state.event("dispatch.dedup_hit", logging.DEBUG, tool.name, key=key, source="cache")
        if failure is not None:
            return await state.reject(_replayed(failure, key), tool.name)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return value
    run = state.keyed.get(key)
    if run is not None:
        if run.fingerprint != fingerprint:
            return await state.reject(_conflict_error(tool, key), tool.name)
        state.event("dispatch.dedup_hit", logging.DEBUG, tool.name, key=key, source="in_flight")
    else:
        if not state.alive:
            raise DispatcherNotRunning(
                f"dispatcher {state.name!r} stopped; start it again to dispatch calls"
            )
        run = state.keyed[key] = KeyedRun(fingerprint)
        # The run serves every caller of the key: it spends the first caller's calls, but
        # its deadline is no one's (each caller waits by its own, below).
        shared = None if budget is None or budget.calls is None else _CallsOf(budget)
        state.submit(
            Job(
                functools.partial(_run_keyed, state, run, tool, args, key, timeout, shared, spent),
                functools.partial(_abandon_run, state, run, tool, key),
            )
        )
    return await _wait_run(state, run, tool, key, budget, timeout)


def _abandon_run(state: _State, run: KeyedRun, tool: Tool, key: str) -> None:
    """Fail a keyed run that never started (no runner took it): its waiters get an
    ``internal`` error, the next call with the key runs."""
    if state.owner is None:
        why = (
            f"dispatcher {state.name!r} has no runner (its Dispatcher was started on its own):"
            f" the call with idempotency key {key!r} was not run; start the dispatcher with"
            " start_dispatcher or the dispatcher application"
        )
    else:
        why = (
            f"the runner of dispatcher {state.name!r} stopped before the call with"
            f" idempotency key {key!r} started (it was not run); call again"
        )
    run.error = DispatchError.make(
        ErrorKind.INTERNAL,
        f"tool {tool.name!r}: {why}",
        data={"tool": tool.name, "idempotency_key": key},
    )
    if state.keyed.get(key) is run:
        del state.keyed[key]
    run.done.set()


def _conflict_error(tool: Tool, key: str) -> DispatchError:
    return DispatchError.make(
        ErrorKind.CONFLICT,
        f"idempotency key {key!r} was already used for a call of {tool.name!r} with other"
        " arguments (or of another tool); a new call needs a new key",
        data={"tool": tool.name, "idempotency_key": key},
    )


async def _run_keyed(
    state: _State,
    run: KeyedRun,
    tool: Tool,
    args: Mapping[str, Any],
    key: str,
    timeout: float | None,
    budget: Spending | None,
    spent: float = 0.0,
) -> None:
    """Run a keyed call in the runner process; keep its outcome (:func:`_kept`); wake
    every waiter.

    If the runner is cancelled (the dispatcher or the runner stopped), the waiters get an
    ``internal`` error rather than waiting forever; one that cut a non-idempotent handler
    short is in doubt, and kept."""
    finished = False
    try:
        run.value = await execute(state, tool, args, timeout, budget, run, spent)
        finished = True
        _keep(state, key, run)
    except DispatchError as error:
        run.error = error
        finished = True
        if _kept(tool, error):
            _keep(state, key, run)
    except Exception as exc:  # a bug of ours: never strand the waiters
        run.error = DispatchError.make(
            ErrorKind.INTERNAL,
            f"tool {tool.name!r}: the dispatcher failed while running it: {exc!r}",
            data={"tool": tool.name},
        )
        run.error.__cause__ = exc
        finished = True
    finally:
        if not finished:
            doubt = run.started and not tool.idempotent
            run.error = DispatchError.make(
                ErrorKind.INTERNAL,
                f"tool {tool.name!r}: dispatcher {state.name!r} (or its runner) stopped while"
                f" the call with idempotency key {key!r} ran"
                + (doubt_note(tool) if doubt else "; call again once it is restarted"),
                attempts=1 if doubt else 0,
                data={"tool": tool.name, "idempotency_key": key, **in_doubt(tool)}
                if doubt
                else {"tool": tool.name, "idempotency_key": key},
            )
            if doubt:
                _keep(state, key, run)
        if state.keyed.get(key) is run:
            del state.keyed[key]
        run.done.set()


def _keep(state: _State, key: str, run: KeyedRun) -> None:
    """Keep the run's outcome for the key, for ``result_ttl`` seconds."""
    try:
        ets.insert(state.table, (key, run.fingerprint, run.value, run.error))
    except ets.EtsError:
        pass  # the dispatcher is stopping: its table is gone


async def _wait_run(
    state: _State, run: KeyedRun, tool: Tool, key: str, budget: Budget | None, timeout: float | None
) -> Any:
    """Wait for the key's run, until this caller's own budget deadline or ``timeout`` (if
    it gave one); the run goes on without a caller that stops waiting."""
    limit = budget.limit() if budget is not None else math.inf
    until = limit if timeout is None else min(limit, trio.current_time() + timeout)
    if until == math.inf:
        await run.done.wait()  # (a scope without a deadline would cancel nothing)
    else:
        with trio.move_on_at(until):
            await run.done.wait()
    if not run.done.is_set():
        goes_on = (
            f" for the call with idempotency key {key!r} (the call goes on; its result is"
            " cached for a later call with the key)"
        )
        if until < limit:
            state.event("dispatch.timeout", logging.WARNING, tool.name, attempt=0, timeout=timeout)
            error = DispatchError.make(
                ErrorKind.TIMEOUT,
                f"tool {tool.name!r}: the caller's timeout ({fmt_seconds(timeout or 0.0)}) passed"
                f" while it waited{goes_on}",
                data={"tool": tool.name, "idempotency_key": key, "timeout": timeout},
            )
        else:
            error = DispatchError.make(
                ErrorKind.BUDGET_EXCEEDED,
                f"tool {tool.name!r}: the caller's budget deadline passed while it waited{goes_on}",
                data={"tool": tool.name, "idempotency_key": key},
            )
        return await state.reject(error, tool.name)
    if run.error is not None:
        raise _copy(run.error)
    return run.value
