"""Introspection: ``processes()``, ``process_info(pid)`` and ``is_process_alive(pid)``, as
Erlang's functions of those names."""

from __future__ import annotations

from typing import Any

import attrs

from ._errors import BadArg
from ._ids import Pid, Ref
from ._node import NamedMonitor, current_node
from ._process import CURRENT_PROCESS, Process, current_process, current_process_or_none


@attrs.frozen
class ProcessInfo:
    """A snapshot of one process (Erlang's ``process_info/1``)."""

    pid: Pid
    status: str
    message_queue_len: int
    links: tuple[Pid, ...]
    monitors: tuple[tuple[Ref, Any], ...]
    monitored_by: tuple[Pid, ...]
    registered_name: str | None
    trap_exit: bool
    behaviour: str | None
    parent: Pid | None
    start_time: float
    messages_handled: int


def processes() -> list[Pid]:
    """The pids of every live process on this node, oldest first."""
    return [proc.pid for proc in current_node().processes.values() if proc.alive]


def is_process_alive(pid: Pid) -> bool:
    """Whether the process ``pid`` of this node is alive (Erlang's ``is_process_alive/1``):
    False from the moment an exit signal dooms it, before it has unwound. Cheap (no snapshot).

    Raises:
        BadArg: ``pid`` is not a Pid, or names a process of another node (as in Erlang: ask
            that node).
    """
    if pid.__class__ is not Pid:
        raise BadArg(f"is_process_alive: not a Pid: {pid!r}")
    proc = pid._proc
    if proc is not None:
        # A pid made here carries its process: asked from a process of the same node (the
        # common case), that is the answer without looking the node up.
        me = CURRENT_PROCESS.get(None)
        if me is not None and me.node is proc.node:
            return proc.alive and not proc.exiting
    node = current_node()
    if pid.node != node.name:
        raise BadArg(f"is_process_alive({pid!r}): a pid of another node (this is {node.name!r})")
    proc = node.resolve(pid)
    return proc is not None and not proc.exiting


def message_queue_len(pid: Pid | None = None) -> int:
    """How many messages wait in the mailbox of ``pid`` (None: the calling process), Erlang's
    ``process_info(Pid, message_queue_len)``, without a snapshot of the rest: cheap. A process
    that is not alive has none.

    Raises:
        NotAProcess: Called outside a process without a ``pid``.
        BadArg: ``pid`` is not a Pid, or names a process of another node (ask that node).
    """
    # (Engines ask this for every Step: a process's own mailbox, and a local pid asked from a
    # process of its node, without current_process's and the property's calls.)
    me = CURRENT_PROCESS.get(None)
    if pid is None:
        if me is None:
            return current_process().message_queue_len  # (raises NotAProcess)
        mailbox = me._mailbox
        return len(mailbox) if mailbox else 0
    if pid.__class__ is not Pid:
        raise BadArg(f"message_queue_len: not a Pid: {pid!r}")
    proc = pid._proc
    if proc is not None and me is not None and me.node is proc.node:
        mailbox = proc._mailbox
        return len(mailbox) if mailbox and proc.alive else 0
    node = current_node()
    if pid.node != node.name:
        raise BadArg(f"message_queue_len({pid!r}): a pid of another node (this is {node.name!r})")
    proc = node.resolve(pid)
    return 0 if proc is None else proc.message_queue_len


def process_info(pid: Pid) -> ProcessInfo | None:
    """A snapshot of ``pid``'s state, or None if it is not alive.

    ``status`` is ``"running"`` (it is the caller), ``"waiting"`` (parked in receive, or in a
    call, which is a receive in OTP), ``"exiting"`` (an exit signal is unwinding it) or
    ``"runnable"``.
    """
    proc = current_node().resolve(pid)
    if proc is None:
        return None
    status = status_of(proc, current_process_or_none())
    monitors = tuple(
        (ref, target.label if isinstance(target, NamedMonitor) else target)
        for ref, target in (proc.monitors or {}).items()
    )
    return ProcessInfo(
        pid=proc.pid,
        status=status,
        message_queue_len=proc.message_queue_len,
        links=tuple(sorted(proc.links or ())),
        monitors=monitors,
        monitored_by=tuple((proc.monitored_by or {}).values()),
        registered_name=proc.name,
        trap_exit=proc.trap_exit,
        behaviour=proc.behaviour,
        parent=proc.parent,
        start_time=proc.started_at,
        messages_handled=proc.handled,
    )


def status_of(proc: Process, running: Process | None) -> str:
    """``proc``'s status as :func:`process_info` reports it; ``running`` is the caller."""
    if proc.exiting:
        return "exiting"
    if proc is running:
        return "running"
    if proc._waiter is not None or _in_call(proc):
        return "waiting"
    return "runnable"


def _in_call(proc: Process) -> bool:
    """Whether a task of ``proc`` is parked on a call's reply (``call``, ``start``, ``stop``)."""
    return any(waiter.task is not None for waiter in (proc.aliases or {}).values())
