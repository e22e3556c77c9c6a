"""``safe_fixtable/2``: fix a set or bag so a ``first``/``next`` traversal survives deletes.

OTP keeps deleted objects in place while a table is fixed; here the fixation keeps the key
order of the moment the table became fixed, so ``next`` of a key deleted since continues from
where that key was. Each key present when the table was fixed and still present when the
traversal reaches it is visited exactly once; keys inserted while it is fixed may be visited
or not (OTP's guarantee). An ordered_set needs no fixation (``next`` follows term order), nor
do continuations (see :class:`~otp.ets.Continuation`); both can still be fixed, as in OTP,
and ``info`` reports who fixed a table.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from .._ids import Pid
from .._process import Process, current_process
from ._access import reader
from ._errors import EtsError, brief
from ._table import Tab, add_hook, describe
from ._types import END_OF_TABLE, TableRef


@attrs.define
class Fixation:
    """Who holds a table fixed, since when, and the key order traversals follow meanwhile."""

    keys: list[Any]
    positions: dict[Any, int]
    since: float
    wall_since: float
    counts: dict[Pid, int] = attrs.field(factory=dict)
    hooks: dict[Pid, tuple[Process, Callable[[Process, Any], None]]] = attrs.field(factory=dict)


def safe_fixtable(table: TableRef, fix: bool) -> None:
    """Fix (``fix=True``) or release (``False``) the table for the calling process
    (Erlang's ``ets:safe_fixtable/2``).

    Fixes count per process: N fixes need N releases, and a process that exits releases its
    own. While any process holds it fixed, ``next`` accepts a key deleted since the table was
    fixed. Releasing a table the process has not fixed does nothing, as in OTP.

    Raises:
        AccessDenied: the table is private and the caller is not its owner.
        NotAProcess: the caller is not a process (a fixation is released when its process
            exits).
        EtsError: ``fix`` is not a bool.
    """
    tab = reader(table, "safe_fixtable")
    if fix.__class__ is not bool:
        raise EtsError(
            f"ets.safe_fixtable({describe(table)}): fix must be True or False (got {brief(fix)})",
            table=table,
            operation="safe_fixtable",
        )
    proc = current_process()
    if fix:
        _fix(tab, proc)
    else:
        _release(tab, proc.pid, 1)


def _fix(tab: Tab, proc: Process) -> None:
    fixation = tab.fix
    if fixation is None:
        keys, positions = ([], {}) if tab.ordered else tab.key_snapshot()
        fixation = tab.fix = Fixation(keys, positions, trio.current_time(), time.time())
    pid = proc.pid
    fixation.counts[pid] = fixation.counts.get(pid, 0) + 1
    if pid not in fixation.hooks:

        def released_on_exit(_proc: Process, _reason: Any) -> None:
            _release(tab, pid, None)

        fixation.hooks[pid] = (proc, released_on_exit)
        add_hook(proc, released_on_exit)


def _release(tab: Tab, pid: Pid, times: int | None) -> None:
    """Drop ``times`` of ``pid``'s fixes (all of them for None); unfix when none are left."""
    fixation = tab.fix
    if fixation is None or pid not in fixation.counts:
        return
    left = 0 if times is None else fixation.counts[pid] - times
    if left > 0:
        fixation.counts[pid] = left
        return
    del fixation.counts[pid]
    proc, hook = fixation.hooks.pop(pid)
    if times is not None and proc.exit_hooks is not None:
        try:
            proc.exit_hooks.remove(hook)
        except ValueError:
            pass
    if not fixation.counts:
        tab.fix = None


def fixed_next(tab: Tab, key: Any, operation: str) -> Any:
    """``next`` in a fixed set or bag: the order of the fixation, which holds deleted keys."""
    fixation: Fixation = tab.fix
    try:
        at = fixation.positions.get(key)
    except TypeError:
        raise tab.bad_key(key, operation) from None
    if at is None:
        # A key inserted since the fixation: the current order goes on from it.
        return tab.next(key, operation)
    data = tab.data
    for candidate in itertools.islice(fixation.keys, at + 1, None):
        if candidate in data:
            return candidate
    return END_OF_TABLE


def fixed_keys(tab: Tab) -> list[Any]:
    """The keys a set or bag's ``slot`` numbers: the fixation's while fixed, else today's."""
    fixation: Fixation | None = tab.fix
    return fixation.keys if fixation is not None else tab.key_snapshot()[0]


def fix_info(tab: Tab, monotonic: bool) -> Any:
    """``info(t, "safe_fixed")``: ``(since, [(pid, count), ...])`` or False."""
    fixation: Fixation | None = tab.fix
    if fixation is None:
        return False
    since = fixation.since if monotonic else fixation.wall_since
    return (since, list(fixation.counts.items()))
