"""Snapshots of a running node for observers (Erlang's ``observer`` and ``recon``): its processes,
ETS tables, ports and connections, as frozen records of plain values.

Everything here reads the state the runtime keeps anyway; nothing is counted per message for it.
A snapshot is taken in one go, without yielding, so it is consistent: no process runs meanwhile.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import attrs
import trio

from ._ids import Pid
from ._info import status_of
from ._node import NamedMonitor, Node, current_node
from ._port import open_ports
from ._process import Process, current_process_or_none
from .ets import TableInfo
from .ets import all as all_tables
from .ets import info as table_info

#: A mailbox's memory is estimated from the sizes of this many of its oldest messages.
MAILBOX_SAMPLE = 16

_PROCESS_SIZE = sys.getsizeof(Process.__new__(Process))


@attrs.frozen
class ProcessSnapshot:
    """One process as an observer sees it.

    Attributes:
        pid: The process.
        registered_name: Its registered name, or None.
        status: ``"running"`` (the caller), ``"waiting"`` (parked in a receive or a call),
            ``"exiting"`` (an exit signal is unwinding it) or ``"runnable"``.
        message_queue_len: Messages in its mailbox.
        messages_handled: Messages it has taken from its mailbox so far (receives and flushes).
            Messages sent are not counted: that would cost every send.
        links: The pids it is linked to, sorted.
        monitors: What it monitors: pids, or the names it monitors by (``(name, node)``).
        monitored_by: The pids monitoring it.
        trap_exit: Whether it traps exits.
        behaviour: Its behaviour (``"GenServer module.Class"``, ``"Port argv"``, ...), or None.
        initial_call: ``module.qualname`` of the function it was spawned with (None for a
            task adopted as a process, such as ``open_node``'s body).
        parent: The process that spawned it, or None.
        start_time: When it started, on trio's clock.
        memory: An estimate in bytes: the process record, its link and monitor tables and its
            mailbox (the deque plus the shallow size of its messages, from a sample). The
            task's stack frames are not counted.
    """

    pid: Pid
    registered_name: Any
    status: str
    message_queue_len: int
    messages_handled: int
    links: tuple[Pid, ...]
    monitors: tuple[Any, ...]
    monitored_by: tuple[Pid, ...]
    trap_exit: bool
    behaviour: str | None
    initial_call: str | None
    parent: Pid | None
    start_time: float
    memory: int


@attrs.frozen
class PortSnapshot:
    """One open port.

    Attributes:
        port: The port's pid.
        owner: The process that opened it, which gets its data.
        command: The argv of its OS program.
        os_pid: The OS pid of the program (None until it has started).
    """

    port: Pid
    owner: Pid | None
    command: tuple[str, ...]
    os_pid: int | None


@attrs.frozen
class NodeConnection:
    """One distribution connection of this node.

    Attributes:
        node: The peer's name.
        state: ``"up"``, ``"connecting"`` while the handshake runs, or ``"down"`` as it goes.
        bytes_written: Bytes written to the peer so far.
        bytes_queued: Bytes waiting to be written.
        bytes_received: Bytes read from the peer so far.
        hidden: Whether the connection is hidden (a remote observer's: in no node list).
    """

    node: str
    state: str
    bytes_written: int
    bytes_queued: int
    bytes_received: int = 0
    hidden: bool = False


@attrs.frozen
class NodeSnapshot:
    """Everything :func:`snapshot` sees at one moment.

    Attributes:
        node: This node's name.
        time: When it was taken, on trio's clock.
        processes: Every live process, oldest first.
        tables: Every ETS table (``otp.ets.TableInfo``, with owner, type, size and memory).
        ports: Every open port.
        connections: Every distribution connection, by peer name.
    """

    node: str
    time: float
    processes: tuple[ProcessSnapshot, ...]
    tables: tuple[TableInfo, ...]
    ports: tuple[PortSnapshot, ...]
    connections: tuple[NodeConnection, ...]


def observe_processes() -> list[ProcessSnapshot]:
    """A snapshot of every live process on this node, oldest first."""
    node = current_node()
    running = current_process_or_none()
    return [_process(proc, running) for proc in node.processes.values() if proc.alive]


def observe_process(pid: Pid) -> ProcessSnapshot | None:
    """A snapshot of the local process ``pid``, or None if it is not alive here."""
    proc = current_node().resolve(pid)
    return None if proc is None else _process(proc, current_process_or_none())


def observe_tables() -> list[TableInfo]:
    """``otp.ets.info`` of every table on this node (each one costs O(its size), for memory)."""
    found = []
    for table in all_tables():
        info = table_info(table)
        if info is not None:
            found.append(info)
    return found


def observe_ports() -> list[PortSnapshot]:
    """Every open port of this node, in the order they were opened."""
    return [
        PortSnapshot(
            port=proc.pid,
            # open_port spawns the port from its owner, so the owner is its parent.
            owner=proc.parent,
            command=record.argv,
            os_pid=record.os_pid,
        )
        for proc, record in open_ports().items()
        if proc.alive
    ]


def observe_connections() -> list[NodeConnection]:
    """Every distribution connection of this node, sorted by peer (empty if it is not
    distributed)."""
    return _connections(current_node())


def snapshot() -> NodeSnapshot:
    """Processes, tables, ports and connections of this node, taken at one moment."""
    node = current_node()
    return NodeSnapshot(
        node=node.name,
        time=trio.current_time(),
        processes=tuple(observe_processes()),
        tables=tuple(observe_tables()),
        ports=tuple(observe_ports()),
        connections=tuple(_connections(node)),
    )


def _process(proc: Process, running: Process | None) -> ProcessSnapshot:
    links = proc.links
    monitors = proc.monitors
    watchers = proc.monitored_by
    return ProcessSnapshot(
        pid=proc.pid,
        registered_name=proc.name,
        status=status_of(proc, running),
        message_queue_len=proc.message_queue_len,
        messages_handled=proc.handled,
        links=tuple(sorted(links)) if links else (),
        monitors=tuple(
            target.label if target.__class__ is NamedMonitor else target
            for target in monitors.values()
        )
        if monitors
        else (),
        monitored_by=tuple(watchers.values()) if watchers else (),
        trap_exit=proc.trap_exit,
        behaviour=proc.behaviour,
        initial_call=_call_name(proc.initial_call),
        parent=proc.parent,
        start_time=proc.started_at,
        memory=_memory(proc),
    )


def _call_name(fn: Callable[..., Any] | None) -> str | None:
    if fn is None:
        return None
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name


def _memory(proc: Process) -> int:
    size = _PROCESS_SIZE
    for part in (proc.links, proc.monitors, proc.monitored_by, proc.aliases, proc.timers):
        if part:
            size += sys.getsizeof(part)
    mailbox = proc._mailbox
    if mailbox:
        size += sys.getsizeof(mailbox)
        sample = [sys.getsizeof(mailbox[i]) for i in range(min(len(mailbox), MAILBOX_SAMPLE))]
        size += sum(sample) * len(mailbox) // len(sample)
    return size


def _connections(node: Node) -> list[NodeConnection]:
    dist = node.distribution
    if dist is None:
        return []
    return [
        NodeConnection(
            node=name,
            state=conn.state,
            bytes_written=conn.written,
            bytes_queued=conn.queued,
            bytes_received=conn.received,
            hidden=conn.hidden,
        )
        for name, conn in sorted(dist.connections.items())
    ]
