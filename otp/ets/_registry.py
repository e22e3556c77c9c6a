"""The tables of one node, by id and by name, and who an operation is done for.

ERTS keeps a node's tables in its own table registry (``ets:all/0``, ``ets:whereis/1``); here
it lives in a trio ``RunVar``, so each ``trio.run`` (each node) has its own.
"""

from __future__ import annotations

import itertools
from contextvars import ContextVar
from typing import TYPE_CHECKING

import trio

from .._ids import Pid
from .._process import current_process_or_none

if TYPE_CHECKING:
    from ._table import Tab

#: The process an operation runs for when it is not the current one: the table actor sets it
#: while it serves a request from another node (or from ``rpc``), so access is checked against
#: the requester, not the actor.
ON_BEHALF_OF: ContextVar[Pid | None] = ContextVar("otp_ets_on_behalf_of", default=None)


def caller_pid() -> Pid | None:
    """The process an operation is done for: the requester when the table actor serves a
    request, else the current process (None for a task that is not a process)."""
    pid = ON_BEHALF_OF.get()
    if pid is not None:
        return pid
    proc = current_process_or_none()
    return proc.pid if proc is not None else None


class Registry:
    """The tables of one node: by id and by name (named tables only)."""

    __slots__ = ("by_id", "ids", "names")

    def __init__(self) -> None:
        self.by_id: dict[int, Tab] = {}
        self.names: dict[str, Tab] = {}
        self.ids = itertools.count(1)


_REGISTRY: trio.lowlevel.RunVar[Registry] = trio.lowlevel.RunVar("otp_ets_registry")


def registry() -> Registry:
    """The table registry of the running node (one per ``trio.run``, created on first use)."""
    try:
        return _REGISTRY.get()
    except LookupError:
        reg = Registry()
        _REGISTRY.set(reg)
        return reg
    except RuntimeError:
        raise RuntimeError(
            "otp.ets needs a running node: wrap the code in 'async with otp.open_node():' or"
            " start it with otp.run(main)"
        ) from None
