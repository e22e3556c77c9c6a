"""Bounded fan-out: :func:`gather_bounded` dispatches a batch of :class:`Call` values with at
most ``limit`` running at once, each to its end, in the shape of ``gather`` (results in call
order or the first error), or as one :class:`Outcome` each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, overload

import attrs
import trio

import otp

from ._breaker import Budget
from ._config import DEFAULT_NAME
from ._errors import ConfigurationError, DispatchError
from ._state import _find
from ._validation import check_options, timeout_of


@attrs.frozen
class Call:
    """One call for :func:`gather_bounded` (a ``(name, args)`` tuple works too); ``timeout``
    in seconds or ``timeout_ms`` (as the seed's registry records it), as for :func:`dispatch`."""

    name: str
    args: Mapping[str, Any] = attrs.field(factory=dict)
    idempotency_key: str | None = None
    timeout: float | None = None
    timeout_ms: float | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Outcome:
    """The end of one call of :func:`gather_bounded`: a ``value`` or a :class:`DispatchError`."""

    value: Any = None
    error: DispatchError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """The value, or the error raised."""
        if self.error is not None:
            raise self.error
        return self.value


def _as_call(call: Any) -> Call:
    """``call`` as a :class:`Call`, checked before any call of the batch runs.

    Raises:
        ConfigurationError: ``call`` is malformed (:class:`InvalidOption` for its options).
    """
    if isinstance(call, tuple) and len(call) in (1, 2) and isinstance(call[0], str):
        call = Call(*call)
    if not isinstance(call, Call) or not isinstance(call.name, str):
        raise ConfigurationError(
            "gather_bounded: each call is a Call(name, args, ...) or a (name, args) tuple"
            f" (got {call!r})"
        )
    if call.timeout_ms is not None:
        seconds = timeout_of(call.name, call.timeout, call.timeout_ms)
        call = attrs.evolve(call, timeout=seconds, timeout_ms=None)
    check_options(call.name, call.idempotency_key, call.timeout, None)
    return call


@overload
async def gather_bounded(
    calls: Iterable[Call | tuple[str, Mapping[str, Any]]],
    limit: int = ...,
    *,
    return_outcomes: Literal[False] = ...,
    budget: Budget | None = ...,
    dispatcher: str | otp.Pid = ...,
) -> list[Any]: ...


@overload
async def gather_bounded(
    calls: Iterable[Call | tuple[str, Mapping[str, Any]]],
    limit: int = ...,
    *,
    return_outcomes: Literal[True],
    budget: Budget | None = ...,
    dispatcher: str | otp.Pid = ...,
) -> list[Outcome]: ...


async def gather_bounded(
    calls: Iterable[Call | tuple[str, Mapping[str, Any]]],
    limit: int = 8,
    *,
    return_outcomes: bool = False,
    budget: Budget | None = None,
    dispatcher: str | otp.Pid = DEFAULT_NAME,
) -> list[Any] | list[Outcome]:
    """Dispatch ``calls`` with at most ``limit`` of them running at once, in the shape of
    ``gather``: their results in call order, or the first error raised.

    Every call runs to its end whatever the others do (as the seed's ``asyncio.gather`` of
    bounded calls lets them run): none is cancelled halfway because another failed, which would
    leave a non-idempotent call's outcome unknown. Then, if any failed, the
    :class:`DispatchError` of the first to fail is raised, with a note naming the others.
    ``return_outcomes=True`` returns every call's :class:`Outcome` (a result or an error) in call
    order instead, and raises nothing for a failed call.

    ``budget`` (shared by every call) and the dispatcher's and tools' own concurrency limits
    apply on top of ``limit``. Cancellation cancels every call still running (keyed calls'
    shared runs go on, as with :func:`dispatch`).

    Raises:
        DispatchError: a call failed (unless ``return_outcomes``).
        ConfigurationError: ``limit`` is not an int >= 1, or a call is malformed
            (:class:`InvalidOption` for a malformed option or ``budget``).
        DispatcherNotRunning: no dispatcher runs as ``dispatcher``.
    """
    if limit.__class__ is not int or limit < 1:
        raise ConfigurationError(f"gather_bounded: limit must be an int >= 1 (got {limit!r})")
    if not isinstance(return_outcomes, bool):
        raise ConfigurationError(
            f"gather_bounded: return_outcomes must be True or False (got {return_outcomes!r})"
        )
    todo = [_as_call(call) for call in calls]
    check_options("gather_bounded", None, None, budget)
    state = _find(dispatcher)
    outcomes: list[Outcome | None] = [None] * len(todo)
    failed: list[int] = []  # indices, in the order the calls failed
    queue = iter(enumerate(todo))

    async def worker() -> None:
        for index, call in queue:
            try:
                value = await state.dispatch(
                    call.name, call.args, call.idempotency_key, call.timeout, budget
                )
            except DispatchError as error:
                outcomes[index] = Outcome(error=error)
                failed.append(index)
            else:
                outcomes[index] = Outcome(value=value)

    await trio.lowlevel.checkpoint_if_cancelled()
    async with trio.open_nursery() as nursery:
        for _ in range(min(limit, len(todo))):
            nursery.start_soon(worker)
    done = [outcome for outcome in outcomes if outcome is not None]
    if return_outcomes:
        return done
    if failed:
        first = outcomes[failed[0]].error  # type: ignore[union-attr]
        assert first is not None
        if len(failed) > 1:
            others = ", ".join(map(str, sorted(failed[1:])))
            first.add_note(
                f"gather_bounded: call {failed[0]} of {len(todo)} failed first; other failed"
                f" calls: {others} (pass return_outcomes=True for every outcome)"
            )
        raise first
    return [outcome.value for outcome in done]
