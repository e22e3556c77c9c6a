"""The matching server's store records: flows, attempts, dispatch records and pending steps as
stored, the ``WriteBatch`` committed atomically, the store's errors and statistics.

Values, as the rows of a Temporal history store: frozen attrs classes, validated when built, so
a store implementation (``SqliteStore``, PostgreSQL later) gets only well-formed records.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from . import _errors as errors
from ._errors import MatchingError

__all__ = [
    "ATTEMPT_STATUSES",
    "DEFAULT_TIMEOUT",
    "DISPATCH_KINDS",
    "FLOW_STATUSES",
    "SERVER_NAME",
    "AttemptRecord",
    "BatchCommitted",
    "Claim",
    "DispatchRecord",
    "FlowExists",
    "FlowRecord",
    "PendingStep",
    "StoreConflict",
    "StoreError",
    "StoreServerStatistics",
    "StoreStatistics",
    "WriteBatch",
    "check_batch",
    "trusted",
]

FLOW_STATUSES = ("running", "completed", "failed", "cancelled")
ATTEMPT_STATUSES = ("completed", "failed", "not_dispatched", "lost")
DISPATCH_KINDS = ("step", "rpc")
#: The name ``StoreServer`` registers by default.
SERVER_NAME = "matching_store"
#: The default timeout of the ``StoreServer`` client functions (seconds).
DEFAULT_TIMEOUT = 30.0


_R = TypeVar("_R")


# -- errors ---------------------------------------------------------------------------------------


class StoreError(MatchingError):
    """The store refused or failed an operation (the message says which and why)."""

    def __str__(self) -> str:  # KeyError's own __str__ (FlowExists) would quote the message
        return self.message


class FlowExists(StoreError, errors.FlowExists, KeyError):
    """A flow with that ``flow_id`` is stored already (``details["flow_id"]``): the package's
    :class:`~apps.matching.FlowExists`, raised by the store."""

    code = "flow_exists"


class StoreConflict(StoreError):
    """An update expected another stored version (optimistic concurrency): read the flow again.

    ``details`` holds ``flow_id``, ``expected`` (``record.version - 1``) and ``stored``.
    """

    code = "conflict"
    retryable_default = True


# -- validation -----------------------------------------------------------------------------------


def _where(inst: Any, attribute: attrs.Attribute[Any]) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def _text(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{_where(inst, attribute)} must be a non-empty str (got {value!r})")


def _text_or_none(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _text(inst, attribute, value)


def _count(minimum: int) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"{_where(inst, attribute)} must be an int >= {minimum} (got {value!r})"
            )

    return check


def _int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_where(inst, attribute)} must be an int (got {value!r})")


def _time(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(
            f"{_where(inst, attribute)} must be a finite number of seconds (got {value!r})"
        )


def _time_or_none(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _time(inst, attribute, value)


def _one_of(choices: tuple[str, ...]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices or not isinstance(value, str):
            names = ", ".join(f'"{c}"' for c in choices)
            raise ValueError(f"{_where(inst, attribute)} must be one of {names} (got {value!r})")

    return check


def _error(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("type"), str)
        or not isinstance(value.get("message"), str)
    ):
        raise TypeError(
            f'{_where(inst, attribute)} must be None or a dict with str "type" and "message"'
            f" (got {value!r})"
        )


# -- records --------------------------------------------------------------------------------------

#: Per record class, the function :func:`trusted` builds its records with.
_BUILDERS: dict[type, Callable[..., Any]] = {}


def _builder(cls: type) -> Callable[..., Any]:
    """A function of ``cls``'s fields (in order) that builds its record without running the
    validators: each slot set by its member descriptor, one generated line per field (a loop
    over ``object.__setattr__`` costs three times as much, and a Step builds six records)."""
    names = [a.name for a in attrs.fields(cls)]
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = [f"def trusted_{cls.__name__}({', '.join(names)}):", "    record = new(cls)"]
    for name in names:
        namespace[f"set_{name}"] = cls.__dict__[name].__set__
        lines.append(f"    set_{name}(record, {name})")
    lines.append("    return record")
    exec("\n".join(lines), namespace)  # (names are the class's own attributes)
    built: Callable[..., Any] = namespace[f"trusted_{cls.__name__}"]
    return built


def trusted(cls: type[_R], *values: Any) -> _R:
    """A record of ``cls`` (``FlowRecord``, ``AttemptRecord``, ``PendingStep``) from ``values``
    in field order (all of them), built without running the validators: for the engine's own
    records, made of values it checked already (it builds several per Step). Equal to
    ``cls(*values)`` for valid values.

    Raises:
        TypeError: ``values`` are not one per field (the message names the missing one).
    """
    record: _R = trusted_builder(cls)(*values)
    return record


def trusted_builder(cls: type[_R]) -> Callable[..., _R]:
    """The function :func:`trusted` builds ``cls``'s records with (its fields, in order, as
    its arguments): for the engine's modules to call without ``trusted``'s own call and
    look-up, once per record of every Step."""
    build = _BUILDERS.get(cls)
    if build is None:
        build = _BUILDERS[cls] = _builder(cls)
    return build


@attrs.frozen
class FlowRecord:
    """One flow instance as stored.

    ``step_index`` is the next step to run (0-based) and ``step_input`` the argument list it
    gets; ``version`` grows by one with each update (optimistic concurrency, see
    :class:`WriteBatch`). Times are wall-clock unix seconds.
    """

    flow_id: str = attrs.field(validator=_text)
    flow_type: str = attrs.field(validator=_text)
    status: str = attrs.field(validator=_one_of(FLOW_STATUSES))
    args: tuple[Any, ...] | list[Any] = attrs.field(
        validator=attrs.validators.instance_of((tuple, list))
    )
    state: dict[str, Any] = attrs.field(validator=attrs.validators.instance_of(dict))
    step_index: int = attrs.field(validator=_count(0))
    step_input: Any
    result: Any
    error: dict[str, Any] | None = attrs.field(validator=_error)
    sticky_worker: str | None = attrs.field(validator=_text_or_none)
    created_at: float = attrs.field(validator=_time)
    updated_at: float = attrs.field(validator=_time)
    version: int = attrs.field(validator=_count(1))
    #: The flow type's definition the flow was started with (the engine pins it: steps with
    #: their retry policies and timeouts, RPC names), so it runs to its end with that one.
    definition: dict[str, Any] = attrs.field(
        factory=dict, validator=attrs.validators.instance_of(dict)
    )


@attrs.frozen
class AttemptRecord:
    """One finished attempt of a step (appended; read back in the order written)."""

    flow_id: str = attrs.field(validator=_text)
    step_index: int = attrs.field(validator=_count(0))
    step: str = attrs.field(validator=_text)
    execution_id: str = attrs.field(validator=_text)
    attempt: int = attrs.field(validator=_count(1))
    delivery: int = attrs.field(validator=_int)
    worker_id: str | None = attrs.field(validator=_text_or_none)
    status: str = attrs.field(validator=_one_of(ATTEMPT_STATUSES))
    error: dict[str, Any] | None = attrs.field(validator=_error)
    started_at: float = attrs.field(validator=_time)
    finished_at: float = attrs.field(validator=_time)


@attrs.frozen
class DispatchRecord:
    """One routing decision (``Routed``) for a flow's step or RPC (appended)."""

    flow_id: str = attrs.field(validator=_text)
    delivery: int = attrs.field(validator=_int)
    kind: str = attrs.field(validator=_one_of(DISPATCH_KINDS))
    name: str = attrs.field(validator=_text)
    attempt: int = attrs.field(validator=_count(1))
    queue: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    worker_id: str | None = attrs.field(validator=_text_or_none)
    at: float = attrs.field(validator=_time)

    @classmethod
    def trusted(
        cls,
        flow_id: str,
        delivery: int,
        kind: str,
        name: str,
        attempt: int,
        queue: str,
        reason: str,
        worker_id: str | None,
        at: float,
    ) -> DispatchRecord:
        """The record of values the engine checked already (its own task and a routing
        decision of the server's queues), built without running the validators again (one
        is built per routing decision)."""
        return trusted(cls, flow_id, delivery, kind, name, attempt, queue, reason, worker_id, at)


@attrs.frozen
class PendingStep:
    """A step waiting to be dispatched, or running: the at-least-once record, kept until the
    step's outcome is committed (``WriteBatch.pending_done``).

    ``(flow_id, step_index)`` is its key. A claim leases it to ``lease_owner`` until
    ``lease_expires`` (both None while it is free); ``not_before`` delays it (retry backoff).

    Raises:
        ValueError: ``lease_owner`` and ``lease_expires`` are not both None or both set.
    """

    flow_id: str = attrs.field(validator=_text)
    step_index: int = attrs.field(validator=_count(0))
    step: str = attrs.field(validator=_text)
    execution_id: str = attrs.field(validator=_text)
    attempt: int = attrs.field(validator=_count(1))
    lease_owner: str | None = attrs.field(default=None, validator=_text_or_none)
    lease_expires: float | None = attrs.field(default=None, validator=_time_or_none)
    not_before: float = attrs.field(default=0.0, validator=_time)

    def __attrs_post_init__(self) -> None:
        if (self.lease_owner is None) != (self.lease_expires is None):
            raise ValueError(
                "PendingStep.lease_owner and PendingStep.lease_expires must both be None (free)"
                f" or both be set (leased) (got {self.lease_owner!r} and {self.lease_expires!r})"
            )

    @property
    def key(self) -> tuple[str, int]:
        """``(flow_id, step_index)``."""
        return (self.flow_id, self.step_index)


@attrs.frozen
class Claim:
    """A pending step as a claim left it (``Store.claim_steps``, ``claim_flow``,
    ``adopt_leases``).

    ``step`` is the row with its lease now: leased to the claimer when the claim took it, else
    (``claim_flow`` of a step another owner's live lease holds) as that owner holds it.
    ``previous_owner`` held the lease before the claim (None: the step was free); a claimer
    that finds another server there took the step over from it.
    """

    step: PendingStep
    previous_owner: str | None

    def held_by(self, owner: str) -> bool:
        """Whether ``owner`` holds the step's lease now."""
        return self.step.lease_owner == owner


@attrs.define
class WriteBatch:
    """Writes committed together, atomically: all of them or none.

    Applied in this order: ``flows_created`` (insert only: :class:`FlowExists` if the id is
    stored), ``flows_upserted`` (insert when the id is new, whatever its version; else an update
    that needs the stored version to be ``record.version - 1``, or :class:`StoreConflict`; the
    record replaces the stored one), ``attempts`` and ``dispatches`` (appended),
    ``pending_put`` (insert or replace by key, lease fields included), then ``pending_done``
    (deleted by ``(flow_id, step_index)``; a missing key is no error). With ``owner`` set, a
    flow update also needs no other owner's lease on the flow's pending step (a server that lost
    its lease cannot write the flow the new owner holds). Attempts, dispatches and
    pending steps must name a flow stored once the batch's flows are applied (else
    :class:`StoreError`).
    """

    flows_upserted: list[FlowRecord] = attrs.field(factory=list)
    attempts: list[AttemptRecord] = attrs.field(factory=list)
    dispatches: list[DispatchRecord] = attrs.field(factory=list)
    pending_put: list[PendingStep] = attrs.field(factory=list)
    pending_done: list[tuple[str, int]] = attrs.field(factory=list)
    flows_created: list[FlowRecord] = attrs.field(factory=list)
    #: The server writing (fencing): when set, an update of a flow whose pending step another
    #: owner's lease holds (live or expired) is refused with :class:`StoreConflict`.
    owner: str | None = None

    def __len__(self) -> int:
        return (
            len(self.flows_upserted)
            + len(self.attempts)
            + len(self.dispatches)
            + len(self.pending_put)
            + len(self.pending_done)
            + len(self.flows_created)
        )


def check_batch(batch: Any) -> None:
    """Refuse anything but a :class:`WriteBatch` of the right records, before any I/O.

    Raises:
        TypeError: naming the field and the item that is wrong.
    """
    if not isinstance(batch, WriteBatch):
        raise TypeError(f"a WriteBatch is needed (got {batch!r})")
    fields: tuple[tuple[str, Any, type], ...] = (
        ("flows_created", batch.flows_created, FlowRecord),
        ("flows_upserted", batch.flows_upserted, FlowRecord),
        ("attempts", batch.attempts, AttemptRecord),
        ("dispatches", batch.dispatches, DispatchRecord),
        ("pending_put", batch.pending_put, PendingStep),
    )
    for field, items, cls in fields:
        if not isinstance(items, list) or (items and not all([isinstance(i, cls) for i in items])):
            raise TypeError(f"WriteBatch.{field} must be a list of {cls.__name__} (got {items!r})")
    if batch.owner is not None and (not isinstance(batch.owner, str) or not batch.owner):
        raise TypeError(f"WriteBatch.owner must be None or a non-empty str (got {batch.owner!r})")
    done = batch.pending_done
    if not isinstance(done, list) or not all(
        [
            isinstance(k, tuple)
            and len(k) == 2
            and isinstance(k[0], str)
            and isinstance(k[1], int)
            and not isinstance(k[1], bool)
            for k in done
        ]
    ):
        raise TypeError(
            f"WriteBatch.pending_done must be a list of (flow_id: str, step_index: int) tuples"
            f" (got {done!r})"
        )


@attrs.frozen
class BatchCommitted:
    """What ``StoreServer.commit_nowait`` sends back: the batch tagged ``tag`` is durable
    (``error`` None), or was refused or lost with a failed transaction (``error`` the
    :class:`StoreError`, :class:`StoreConflict` or :class:`FlowExists`; the batch left no trace).
    """

    tag: Any
    error: StoreError | None


@attrs.frozen
class StoreStatistics:
    """Counters of one open ``Store`` (``statistics()``).

    Attributes:
        transactions: Write transactions run (each ``commit_many`` is one, committed or not).
        batches: Batches committed.
        refused: Batches refused (conflict, duplicate flow, bad reference or value) or lost with
            a failed transaction.
        claimed: Pending steps handed out by ``claim_pending``.
        inline: Transactions ``commit_soon`` ran on trio's own thread (a group of up to
            ``INLINE_RECORDS`` records, ``SqlStore.commit_soon``), not in a thread of its own.
    """

    transactions: int
    batches: int
    refused: int
    claimed: int
    inline: int = 0


@attrs.frozen
class StoreServerStatistics:
    """Counters of a ``StoreServer`` (``StoreServer.statistics``).

    Attributes:
        groups: Group commits run (one transaction each).
        batches: Batches answered through group commits (committed or refused).
        largest_group: The most batches one transaction carried.
        queued: Batches waiting for the next group now.
        in_flight: Batches in the transaction running now.
        store: The store's own counters.
    """

    groups: int
    batches: int
    largest_group: int
    queued: int
    in_flight: int
    store: StoreStatistics
