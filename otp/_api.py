"""The process primitives of Erlang's ``erlang`` module: spawn, send, receive, links, monitors,
exit signals, the name registry, references and timers.

Every function here acts on the node of the calling task. Those that act on the caller itself
(``self``, ``receive``, ``link``, ``monitor``, ``process_flag``) need a current process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ._errors import BadArg, NoProc
from ._ids import Pid, Ref
from ._messages import Down, Exit
from ._node import NamedMonitor, Node, current_node
from ._process import (
    _NO_DEFAULT,
    KilledBySignal,
    Match,
    Process,
    ProcessExit,
    current_process,
    current_process_or_none,
)
from ._reasons import NOPROC
from ._timers import checked_seconds

Dest = Pid | str | tuple[str, str]


def self() -> Pid:
    """The pid of the calling process (Erlang's ``self()``)."""
    return current_process().pid


def make_ref() -> Ref:
    """A new unique reference (Erlang's ``make_ref()``)."""
    return current_node().make_ref()


# -- spawning ---------------------------------------------------------------------------------


def _parent() -> tuple[Node, Process | None]:
    proc = current_process_or_none()
    if proc is not None:
        return proc.node, proc
    return current_node(), None


def spawn(fn: Callable[..., Awaitable[Any]], *args: Any) -> Pid:
    """Start ``fn(*args)`` as a new process and return its pid at once.

    The new process runs independently of the caller: it outlives it and its crash does not
    affect it. Returning from ``fn`` exits with reason ``normal``; an exception exits with a
    :class:`~otp.Crash` carrying it (logged once); ``otp.exit_self(reason)`` exits with ``reason``.
    """
    node, parent = _parent()
    return node.spawn(fn, args, parent).pid


def spawn_link(fn: Callable[..., Awaitable[Any]], *args: Any) -> Pid:
    """Like :func:`spawn`, linked to the caller in the same step (Erlang's ``spawn_link``)."""
    parent = current_process()
    return parent.node.spawn(fn, args, parent, link=True).pid


def spawn_monitor(fn: Callable[..., Awaitable[Any]], *args: Any) -> tuple[Pid, Ref]:
    """Like :func:`spawn`, monitored by the caller in the same step; returns ``(pid, ref)``."""
    parent = current_process()
    proc = parent.node.spawn(fn, args, parent)
    return proc.pid, _add_monitor(parent, proc, proc.pid)


# -- messages ---------------------------------------------------------------------------------


def resolve_dest(node: Node, dest: Any) -> Process | None:
    """The live local process ``dest`` names, or None. Raises BadArg for an unregistered bare
    name (Erlang's ``Name ! Msg``); an unregistered ``(name, node)`` is None, as Erlang drops
    ``{Name, Node} ! Msg``."""
    if dest.__class__ is Pid:
        return node.resolve(dest)
    if isinstance(dest, str):
        proc = node.names.get(dest)
        if proc is None:
            raise BadArg(f"send to {dest!r}: no process is registered under that name")
        return proc
    _check_dest(dest)
    name, node_name = dest
    return node.names.get(name) if node_name == node.name else None


def _check_dest(dest: Any) -> None:
    """Raise TypeError unless ``dest`` has the shape of a destination."""
    if not (
        dest.__class__ is Pid
        or isinstance(dest, str)
        or (isinstance(dest, tuple) and len(dest) == 2 and isinstance(dest[0], str))
    ):
        raise TypeError(
            f"a destination is a Pid, a registered name (str) or (name: str, node) (got {dest!r})"
        )


def _not_a_pid(pid: Any, where: str) -> TypeError:
    hint = f"; for a registered name use whereis({pid!r})" if isinstance(pid, str) else ""
    return TypeError(f"{where}: pid must be a Pid (got {pid!r}){hint}")


def send(dest: Dest, message: Any) -> None:
    """Send ``message`` to a pid, a registered name or ``(name, node)``; never blocks.

    Sending to a dead pid does nothing, as in Erlang. Sending to a name nobody registered raises
    :class:`~otp.BadArg`, as Erlang's ``Name ! Msg`` does; ``(name, node)`` with a name nobody
    registered is dropped, as ``{Name, Node} ! Msg`` is. Messages to another node go through the
    distribution layer, and are dropped if it cannot reach that node.
    """
    if dest.__class__ is Pid:
        proc = dest._proc
        if proc is not None:
            if proc.alive:
                proc.deliver(message)
            return
    node = current_node()
    proc = resolve_dest(node, dest)
    if proc is not None:
        proc.deliver(message)
    elif node.distribution is not None:
        node.distribution.send(dest, message)


def receive(
    match: Match = None, *, timeout: float | None = None, default: Any = _NO_DEFAULT
) -> Coroutine[Any, Any, Any]:
    """Take the oldest message in the caller's mailbox that ``match`` accepts (await it).

    ``match`` is None (any message), a type or tuple of types (``isinstance``) or a predicate.
    Messages it does not accept stay in the mailbox in their order. With ``timeout`` (seconds),
    gives up after that long: returns ``default`` if given, else raises
    :class:`~otp.ReceiveTimeout`; ``timeout=0`` only looks at what is already there.

    It is a checkpoint. Cancellation leaves the mailbox untouched.
    """
    # A plain function returning the process's coroutine: one coroutine frame less per waiting
    # process, which is most of them.
    if match is None and timeout is None:
        return current_process().receive_any()
    return current_process().receive(match, timeout, default)


# -- links and exit signals -------------------------------------------------------------------


def link(pid: Pid) -> None:
    """Link the caller and ``pid`` (bidirectional, idempotent, a no-op for self).

    If ``pid`` is not alive: a caller that traps exits gets ``Exit(pid, "noproc")``; otherwise
    :class:`~otp.NoProc` is raised, as Erlang's ``link/1`` does.
    """
    me = current_process()
    if pid.__class__ is not Pid:
        raise _not_a_pid(pid, "link")
    if pid == me.pid:
        return
    node = me.node
    other = node.resolve(pid)
    if other is None:
        if pid._proc is None and pid.node != node.name and node.distribution is not None:
            me.add_link(pid)
            node.distribution.link(me.pid, pid)
            return
        if me.trap_exit:
            me.deliver(Exit(pid, NOPROC))
            return
        raise NoProc(f"link to {pid!r}: no such process")
    me.add_link(pid)
    other.add_link(me.pid)


def unlink(pid: Pid) -> None:
    """Remove the link between the caller and ``pid``, if any.

    After it returns no exit signal due to that link reaches the caller; an ``Exit`` message
    already in the mailbox stays there (flush it with ``receive(..., timeout=0)``).
    """
    me = current_process()
    if pid.__class__ is not Pid:
        raise _not_a_pid(pid, "unlink")
    me.remove_link(pid)
    other = me.node.resolve(pid)
    if other is not None:
        other.remove_link(me.pid)
    elif pid._proc is None and me.node.distribution is not None and pid.node != me.node.name:
        me.node.distribution.unlink(me.pid, pid)


def exit(pid: Pid, reason: Any) -> None:
    """Send an exit signal with ``reason`` to ``pid`` (Erlang's ``exit/2``).

    ``"kill"`` kills untrappably (the target exits ``"killed"``); a trapping target gets
    ``Exit(caller, reason)``; ``"normal"`` is ignored by a non-trapping target unless it is the
    caller itself. Any other reason kills a non-trapping target with that reason.

    A signal that kills the caller itself ends it before ``exit`` returns, as in OTP: it raises
    a :class:`~otp.ProcessExit` (a ``BaseException``), so the code after the call never runs, a
    GenServer runs no ``terminate`` for it, and the caller's links and monitors see the reason
    OTP gives (``"killed"`` for ``"kill"``).
    A trapping caller that sends itself any other reason gets the ``Exit`` message and goes on.
    """
    if pid.__class__ is not Pid:
        raise _not_a_pid(pid, "exit")
    node = current_node()
    me = current_process_or_none()
    sender = me.pid if me is not None else Pid._make(node.name, 0, node.creation)
    target = node.resolve(pid)
    if target is not None:
        node.exit_signal(target, sender, reason, False)
        if target is me and me.exiting:
            # Also when an earlier signal doomed it: in OTP it would already be gone.
            raise KilledBySignal(me.pending_reason)
    elif pid._proc is None and pid.node != node.name and node.distribution is not None:
        node.distribution.exit(sender, pid, reason)


def exit_self(reason: Any) -> None:
    """End the calling process now with ``reason`` (Erlang's ``exit/1``); never returns."""
    raise ProcessExit(reason)


def add_exit_hook(hook: Callable[[Pid, Any], None]) -> None:
    """Run ``hook(pid, reason)`` when the calling process exits, for any reason.

    Hooks run synchronously at the moment of death, after the process's registered name is
    freed and before its links and monitors fire (OTP's order for "directly visible resources",
    which ETS tables and process groups use too), so whoever receives its ``Exit`` or ``Down``
    already sees what the hook did. A hook must not block; one that raises is logged and the
    others still run.
    """
    me = current_process()

    def run(proc: Process, reason: Any) -> None:
        hook(proc.pid, reason)

    if me.exit_hooks is None:
        me.exit_hooks = [run]
    else:
        me.exit_hooks.append(run)


def process_flag(*, trap_exit: bool) -> bool:
    """Set the caller's ``trap_exit`` flag; returns the old value.

    A process that traps exits receives exit signals as :class:`~otp.Exit` messages instead of
    dying of them (except an ``exit(pid, "kill")``).
    """
    me = current_process()
    old = me.trap_exit
    me.trap_exit = bool(trap_exit)
    return old


# -- monitors ---------------------------------------------------------------------------------


def _add_monitor(me: Process, target: Process, label: Any) -> Ref:
    ref = me.node.make_ref()
    target.add_monitored_by(ref, me.pid)
    me.add_monitor(ref, target.pid if label is target.pid else NamedMonitor(target.pid, label))
    return ref


def monitor(target: Dest) -> Ref:
    """Monitor a process by pid, registered name or ``(name, node)``; returns the monitor ref.

    When the target exits the caller gets ``Down(ref, target, reason)``; if it does not exist the
    ``Down`` (reason ``"noproc"``) is sent at once. Monitors stack: each call is one more DOWN.
    A monitor across nodes also fires, with ``"noconnection"``, when the connection is lost.
    """
    if target.__class__ is not Pid:
        _check_dest(target)
    me = current_process()
    node = me.node
    remote = _remote_node(node, target)
    if remote is not None and node.distribution is not None:
        ref = node.make_ref()
        me.add_monitor(
            ref,
            target if target.__class__ is Pid else NamedMonitor(Pid._make(remote, 0, 0), target),
        )
        node.distribution.monitor(me.pid, target, ref)
        return ref
    try:
        proc = resolve_dest(node, target)
    except BadArg:
        proc = None
    if proc is None:
        ref = node.make_ref()
        me.deliver(Down(ref, target, NOPROC))
        return ref
    return _add_monitor(me, proc, target)


def _remote_node(node: Node, target: Any) -> str | None:
    """The node ``target`` lives on if that is another node, else None."""
    if target.__class__ is Pid:
        return target.node if target._proc is None and target.node != node.name else None
    if isinstance(target, tuple) and len(target) == 2 and target[1] != node.name:
        return str(target[1])
    return None


def demonitor(ref: Ref, *, flush: bool = False) -> bool:
    """Remove the monitor ``ref``; returns True if it was active, False if it had already fired.

    A ``Down`` already in the mailbox stays, unless ``flush=True`` removes it.
    """
    me = current_process()
    found = False
    if me.monitors is not None:
        target = me.monitors.pop(ref, None)
        if target is not None:
            found = True
            target_pid = target.pid if isinstance(target, NamedMonitor) else target
            node = me.node
            proc = node.resolve(target_pid)
            if proc is not None:
                proc.remove_monitored_by(ref)
            elif target_pid._proc is None and node.distribution is not None:
                node.distribution.send_demonitor(me.pid, target, ref)
    if flush:
        me.remove_messages(lambda m: m.__class__ is Down and m.ref == ref)
    return found


# -- registry ---------------------------------------------------------------------------------


def register(name: str, pid: Pid) -> None:
    """Register ``pid`` under ``name`` on this node (Erlang's ``register/2``).

    Raises:
        BadArg: the name is taken, the process already has a name, or it is not alive.
    """
    if not isinstance(name, str) or not name:
        raise BadArg(f"register: a name is a non-empty str (got {name!r})")
    if pid.__class__ is not Pid:
        raise _not_a_pid(pid, f"register({name!r}, ...)")
    node = current_node()
    proc = node.resolve(pid)
    if proc is None:
        raise BadArg(f"register({name!r}, {pid!r}): the process is not alive")
    holder = node.names.get(name)
    if holder is not None:
        raise BadArg(f"register({name!r}, {pid!r}): the name is taken by {holder.pid!r}")
    if proc.name is not None:
        raise BadArg(
            f"register({name!r}, {pid!r}): the process is already registered as {proc.name!r}"
        )
    node.names[name] = proc
    proc.name = name


def unregister(name: str) -> None:
    """Remove the registered ``name``. Raises :class:`~otp.BadArg` if it is not registered."""
    node = current_node()
    proc = node.names.pop(name, None)
    if proc is None:
        raise BadArg(f"unregister({name!r}): no process is registered under that name")
    proc.name = None


def whereis(name: str) -> Pid | None:
    """The pid registered under ``name``, or None."""
    proc = current_node().names.get(name)
    return proc.pid if proc is not None else None


def registered() -> list[str]:
    """Every registered name on this node, sorted."""
    return sorted(current_node().names)


# -- timers -----------------------------------------------------------------------------------


def send_after(delay: float, dest: Dest, message: Any) -> Ref:
    """Send ``message`` to ``dest`` after ``delay`` seconds of trio's clock; returns a timer ref.

    A name is resolved when the timer fires; if nothing is registered then, nothing is sent. A
    timer aimed at a local pid is cancelled when that process exits (at once if it is not
    alive), as Erlang's are: ``read_timer`` then says None.

    Raises:
        TypeError: ``delay`` is not a number, or ``dest`` is not a destination.
        ValueError: ``delay`` is NaN.
    """
    if not (delay.__class__ is float or delay.__class__ is int) or delay != delay:
        delay = checked_seconds(delay, "send_after(delay=...)")
    _check_dest(dest)
    node = current_node()
    if dest.__class__ is Pid and dest.node == node.name:
        target = node.resolve(dest)
        if target is None:
            return node.make_ref()  # (a dead target: nothing will ever be sent)
        return node.timers.start_to(delay, target, lambda: target.deliver(message))

    def fire() -> None:
        try:
            proc = resolve_dest(node, dest)
        except BadArg:
            return
        if proc is not None:
            proc.deliver(message)
        elif node.distribution is not None:
            node.distribution.send(dest, message)

    return node.timers.start(delay, fire)


def exit_after(delay: float, pid: Pid, reason: Any) -> Ref:
    """Send an exit signal ``reason`` to ``pid`` after ``delay`` seconds, as from the caller.

    Raises:
        TypeError: ``delay`` is not a number, or ``pid`` is not a Pid.
        ValueError: ``delay`` is NaN.
    """
    if not (delay.__class__ is float or delay.__class__ is int) or delay != delay:
        delay = checked_seconds(delay, "exit_after(delay=...)")
    if pid.__class__ is not Pid:
        raise _not_a_pid(pid, "exit_after")
    node = current_node()
    me = current_process_or_none()
    sender = me.pid if me is not None else Pid._make(node.name, 0, node.creation)

    def fire() -> None:
        target = node.resolve(pid)
        if target is not None:
            node.exit_signal(target, sender, reason, False)

    return node.timers.start(delay, fire)


def cancel_timer(ref: Ref) -> float | None:
    """Cancel a timer; returns the seconds it had left, or None if it fired or never existed.

    Raises:
        TypeError: ``ref`` is not a Ref (Erlang's ``badarg``).
    """
    if ref.__class__ is not Ref:
        raise _not_a_timer_ref(ref, "cancel_timer")
    return current_node().timers.cancel(ref)


def read_timer(ref: Ref) -> float | None:
    """Seconds left on a timer, or None if it fired, was cancelled or never existed.

    Raises:
        TypeError: ``ref`` is not a Ref (Erlang's ``badarg``).
    """
    if ref.__class__ is not Ref:
        raise _not_a_timer_ref(ref, "read_timer")
    return current_node().timers.read(ref)


def _not_a_timer_ref(ref: Any, where: str) -> TypeError:
    return TypeError(
        f"{where}: ref must be the Ref that send_after or exit_after returned (got {ref!r})"
    )
