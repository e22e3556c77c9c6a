"""The stash, server side: shared tables as ``otp.ets`` tables, one owner actor per table.

Owner actors are temporary children of the ``dirty_stash_tables`` DynamicSupervisor; the
``dirty_stash`` GenServer creates and deletes tables (so two clients creating one table race
safely). Reads and writes run in the connection process, directly on the public ETS table, each
atomic. Gunicorn's ten operations keep its semantics, except that a missing key is reported as
``StashKeyNotFoundError`` (so ``get(table, key, default)`` returns the default, with Gunicorn's
own client too); ours add ``INCR`` (update_counter), ``INSERT_NEW``, ``CAS`` and ``PUT`` with a
time to live.
"""

from __future__ import annotations

import enum
import fnmatch
import math
import re
import time
from typing import Any

import trio

import otp
import supervisors
from otp import ets

from ._errors import StashError, StashKeyNotFoundError, StashTableNotFoundError

__all__ = ["StashExtOp", "StashManager", "stash_operation"]

MANAGER = "dirty_stash"
TABLES = "dirty_stash_tables"
_PREFIX = "apps.dirty.stash:"
#: The longest KEYS glob pattern accepted, in characters: longer ones are refused (a pattern
#: is compiled on the node; a 256K-character one took seconds and its compiled form stayed
#: cached).
MAX_PATTERN = 1024
#: A KEYS scan yields to the node's other tasks after matching for this long (seconds), so a
#: long scan answers other clients' calls meanwhile.
SCAN_SLICE = 0.005
#: The ints GD v1 carries (its only int TLV is 8-byte signed).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class StashExtOp(enum.IntEnum):
    """Our STASH op codes beyond Gunicorn's 1..10; ``value`` is a dict of their arguments."""

    INCR = 11
    INSERT_NEW = 12
    CAS = 13
    PUT_TTL = 14


_EXT_OPS = frozenset(StashExtOp)


def _ets_name(table: str) -> str:
    return _PREFIX + table


def _freeze(key: Any) -> Any:
    if isinstance(key, list | tuple):
        return tuple(_freeze(k) for k in key)
    if isinstance(key, dict):
        raise StashError(
            f"a stash key must be hashable: a str, number, bytes or list (got {key!r})"
        )
    if isinstance(key, float) and math.isnan(key):
        # NaN != NaN: the entry could never be read or deleted, and each put would add one.
        raise StashError(
            f"a stash key cannot be or hold NaN, which never equals itself (got {key!r})"
        )
    return key


class _TableOwner(otp.GenServer):
    """Owns one stash table; the table lives as long as this process."""

    def init(self, name: str) -> Any:
        try:
            ets.new(_ets_name(name), access=ets.PUBLIC, named=True)
        except ets.NameTaken:
            return otp.Ignore()
        return otp.Ok(name)


class StashManager(otp.GenServer):
    """Creates (``ensure``) and deletes stash tables; registered as ``dirty_stash``."""

    async def init(self, initial: tuple[str, ...]) -> Any:
        for name in initial:
            await _create(name)
        return otp.Ok(None)

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        match request:
            case ("ensure", name):
                return otp.Reply(await _create(name), state)
            case ("delete", name):
                info = ets.info(_ets_name(name))
                if info is None:
                    return otp.Reply(False, state)
                await supervisors.terminate_child(TABLES, info.owner)
                return otp.Reply(True, state)
        return otp.Reply(None, state)


async def _create(name: str) -> bool:
    if ets.whereis(_ets_name(name)) is not None:
        return True
    spec = supervisors.ChildSpec(
        ("stash", name), (_TableOwner.start_link, name), restart="temporary"
    )
    await supervisors.start_child(TABLES, spec)
    return True


def _tables() -> list[str]:
    return sorted(
        t[len(_PREFIX) :] for t in ets.all() if isinstance(t, str) and t.startswith(_PREFIX)
    )


async def stash_operation(
    op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
) -> Any:
    """Run one STASH operation; returns the RESPONSE result.

    Raises:
        StashError: (or its subclasses) the operation failed; the ERROR frame carries it.
    """
    name = _ets_name(table)
    exists = ets.whereis(name) is not None
    if op in (1, 7, 11, 12, 13, 14) and not exists:
        if op != 7:  # A write refused for its key or arguments creates no table either.
            _freeze(key)
            if op in _EXT_OPS:
                _ext_args(op, value)
        await otp.call(MANAGER, ("ensure", table))
    if op == 1:  # PUT
        ets.insert(name, (_freeze(key), value))
        return True
    # A bad key is refused whether or not its table exists (a refused write creates none).
    if op == 2:  # GET
        k = _freeze(key)
        rows = ets.lookup(name, k) if exists else []
        if not rows:
            raise StashKeyNotFoundError(table, key)
        return rows[0][1]
    if op == 3:  # DELETE
        k = _freeze(key)
        return bool(ets.take(name, k)) if exists else False
    if op == 4:  # KEYS
        glob = None if pattern is None or pattern == "" else _glob(pattern)
        if not exists:
            return []
        keys = [row[0] for row in ets.tab2list(name)]
        return keys if glob is None else await _matching(keys, glob)
    if op == 5:  # CLEAR
        if exists:
            ets.delete_all_objects(name)
        return True
    if op == 6:  # INFO
        info = ets.info(name)
        if info is None:
            raise StashTableNotFoundError(table)
        return {"size": info.size, "table": table}
    if op == 7:  # ENSURE
        return True
    if op == 8:  # DELETE_TABLE
        return bool(await otp.call(MANAGER, ("delete", table)))
    if op == 9:  # TABLES
        return _tables()
    if op == 10:  # EXISTS
        if key is None:
            return exists
        k = _freeze(key)
        return ets.member(name, k) if exists else False
    if op not in _EXT_OPS:
        raise StashError(f"Unknown stash operation: {op}")
    args = _ext_args(op, value)
    k = _freeze(key)
    ttl = args.get("ttl")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0):
        raise StashError(f"ttl must be a number of seconds > 0 (got {ttl!r})")
    expire: Any = ttl if ttl is not None else ets.DEFAULT
    if op == StashExtOp.INCR:
        incr = args.get("incr", 1)
        default = args.get("default", 0)
        if isinstance(incr, bool) or not isinstance(incr, int):
            raise StashError(f"update_counter: incr must be an int (got {incr!r})")
        rows = ets.lookup(name, k)
        current = rows[0][1] if rows else default
        if isinstance(current, bool) or not isinstance(current, int):
            where = f"the value of {key!r} in {table}" if rows else "default"
            raise StashError(f"update_counter: {where} is {current!r}, not an int")
        if not _INT64_MIN <= current + incr <= _INT64_MAX:
            # Refused before the write: GD v1 carries int64 only, so a counter past it could
            # neither be answered nor read back.
            raise StashError(
                f"update_counter: {current!r} + {incr!r} for {key!r} in {table} is outside"
                " int64, the range the dirty protocol carries; the counter is unchanged"
            )
        return ets.update_counter(name, k, (1, incr), default=(k, default))
    if op == StashExtOp.INSERT_NEW:
        return ets.insert_new(name, (k, args.get("value")), expire_after=expire)
    if op == StashExtOp.CAS:
        rows = ets.lookup(name, k)
        if args.get("absent"):
            if rows:
                return False
        elif not rows or not _same(rows[0][1], args.get("expected")):
            return False
        ets.insert(name, (k, args.get("value")), expire_after=expire)
        return True
    ets.insert(name, (k, args.get("value")), expire_after=expire)  # PUT_TTL
    return True


def _glob(pattern: Any) -> re.Pattern[str]:
    """``pattern`` (fnmatch syntax) compiled for this scan only: not kept in fnmatch's cache of
    up to 32,768 compiled patterns (``re``'s own cache holds at most 512)."""
    if not isinstance(pattern, str):
        raise StashError(f"a KEYS pattern must be a str glob such as 'user:*' (got {pattern!r})")
    if len(pattern) > MAX_PATTERN:
        raise StashError(
            f"a KEYS pattern of {len(pattern)} characters exceeds MAX_PATTERN={MAX_PATTERN};"
            " use a shorter glob (or filter the keys in the caller)"
        )
    return re.compile(fnmatch.translate(pattern))


async def _matching(keys: list[Any], glob: re.Pattern[str]) -> list[Any]:
    """The keys whose ``str`` the glob matches, in slices of ``SCAN_SLICE`` seconds between
    which the node's other tasks run."""
    match = glob.match
    found: list[Any] = []
    clock = time.perf_counter
    deadline = clock() + SCAN_SLICE
    for first in range(0, len(keys), 64):
        found.extend(k for k in keys[first : first + 64] if match(str(k)))
        if clock() >= deadline:
            await trio.lowlevel.checkpoint()
            deadline = clock() + SCAN_SLICE
    return found


def _ext_args(op: int, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StashError(
            f"op {op} ({StashExtOp(op).name}): value must be a dict of its arguments, such"
            f" as {{'value': ..., 'ttl': ...}} (got {value!r})"
        )
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal as the wire tells values apart: ``True``, ``1`` and ``1.0`` differ (Python's ``==``
    says they are equal), in nested lists, tuples and dicts too."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    return bool(a == b)
