"""The node: one per ``trio.run``, owning the process table, the name registry and the nursery
every process runs in.

It is held in a trio ``RunVar``, so several nodes can live in one OS process (one per
``trio.run``), as tests need. Processes are flat children of the node's nursery, as Erlang
processes are independent of their spawner; the task wrapper turns each task's outcome into an
exit reason and fires links and monitors, in OTP's order (names and tables first).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from inspect import isawaitable
from types import CoroutineType
from typing import Any

import trio

from ._errors import ProcessExited
from ._ids import Pid, Ref
from ._logger import log_report, reason_text
from ._messages import Down, Exit
from ._process import CURRENT_PROCESS, Process, ProcessExit
from ._reasons import KILL, KILLED, NORMAL, Crash
from ._timers import TimerService

crash_logger = logging.getLogger("otp.crash")

#: What a process's nursery may raise while an exit signal unwinds it, besides a ProcessExit.
_UNWINDING = (Exception, trio.Cancelled)

_NODE: trio.lowlevel.RunVar[Node] = trio.lowlevel.RunVar("otp_node")

DEFAULT_NODE_NAME = "nonode@nohost"

#: When a node stops, how long it waits for its connections to write what is queued (seconds).
FLUSH_ON_STOP = 1.0


class Node:
    """The runtime state of one node. Reach it with :func:`current_node`."""

    def __init__(self, name: str, nursery: trio.Nursery) -> None:
        self.name = name
        # Erlang's creation tells pids of a restarted node from the old ones.
        self.creation = (os.getpid() ^ int(trio.current_time() * 1000)) & 0xFFFFFFFF
        self.processes: dict[int, Process] = {}
        self.names: dict[Any, Process] = {}
        self._pid_ids = itertools.count(1)
        self._ref_ids = itertools.count(1)
        self.nursery = nursery
        self.timers = TimerService(self)
        self.closing = False
        #: Set by the distribution layer; without it, messages to other nodes are dropped.
        self.distribution: Any = None
        #: Process groups (``otp.pg``), created on first use.
        self.pg: Any = None
        #: Where the node's own long-lived tasks run (timers, listeners); not processes.
        self.system_nursery: trio.Nursery = nursery

    def __repr__(self) -> str:
        return f"<Node {self.name} processes={len(self.processes)}>"

    def new_pid(self, proc: Process) -> Pid:
        return Pid._make(self.name, next(self._pid_ids), self.creation, proc)

    def make_ref(self) -> Ref:
        return Ref._make(self.name, next(self._ref_ids), self.creation)

    def resolve(self, pid: Pid) -> Process | None:
        """The live local process behind ``pid``, or None."""
        proc = pid._proc
        if proc is None:
            if pid.node != self.name or pid.creation != self.creation:
                return None
            proc = self.processes.get(pid.id)
            if proc is None:
                return None
        return proc if proc.alive else None

    # -- spawning ----------------------------------------------------------------------------

    def spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        parent: Process | None,
        *,
        link: bool = False,
        trap_exit: bool = False,
    ) -> Process:
        proc = Process(self, parent.pid if parent is not None else None)
        proc.trap_exit = trap_exit
        proc.initial_call = fn
        self.processes[proc.pid.id] = proc
        if link and parent is not None:
            proc.links = {parent.pid}
            parent.add_link(proc.pid)
        if self.closing:
            # The node is stopping (kill_all has run): a latecomer, say the connection process
            # of a peer dialling in now, goes the same way at once, or the node would wait on it.
            proc.die(KILLED)
        self.nursery.start_soon(_run_process, proc, fn, args, name=proc.pid)
        return proc

    def adopt_current_task(self, parent: Process | None = None) -> Process:
        """Make the running task a process (the main process of ``open_node`` and ``run``)."""
        proc = Process(self, parent.pid if parent is not None else None)
        self.processes[proc.pid.id] = proc
        return proc

    # -- signals -----------------------------------------------------------------------------

    def exit_signal(self, target: Process, sender: Pid, reason: Any, via_link: bool) -> None:
        """Apply an exit signal to ``target`` by OTP's table (OTP_SEMANTICS.md section 1)."""
        if not target.alive or target.exiting:
            return
        atom = reason if reason.__class__ is str else None
        if atom == KILL and not via_link:
            target.die(KILLED)
        elif target.trap_exit:
            target.deliver(Exit(sender, reason))
        elif atom == NORMAL:
            if not via_link and sender == target.pid:
                target.die(NORMAL)
        else:
            target.die(reason)

    def link_exit(self, target: Process, sender: Pid, reason: Any) -> None:
        """``sender``, linked to ``target``, is gone with ``reason`` (``noconnection`` if the
        link broke with its node): the link goes and the exit signal applies. Without a link
        (unlinked meanwhile) nothing happens, as an unlink drops the signals it crosses."""
        if target.remove_link(sender):
            self.exit_signal(target, sender, reason, True)

    def deliver_down(self, watcher_pid: Pid, ref: Ref, pid: Pid, reason: Any) -> None:
        """Tell the watcher behind ``ref`` that ``pid`` is gone (a DOWN message or a call's
        alias)."""
        watcher = self.resolve(watcher_pid)
        if watcher is None:
            dist = self.distribution
            if dist is not None and watcher_pid._proc is None and watcher_pid.node != self.name:
                dist.send_down(watcher_pid, ref, pid, reason)
            return
        label: Any = pid
        monitors = watcher.monitors
        if monitors is not None:
            target = monitors.pop(ref, None)
            if isinstance(target, NamedMonitor):
                label = target.label
        aliases = watcher.aliases
        if aliases is not None:
            waiter = aliases.get(ref)
            if waiter is not None:
                waiter.resolve(reason, True)
                return
        watcher.deliver(Down(ref, label, reason))

    def process_exited(self, proc: Process, reason: Any) -> None:
        """Release the dead process's resources in OTP's order, then fire links and monitors."""
        if not proc.alive:
            return
        proc.alive = False
        proc.exit_reason = reason
        proc._waiter = None
        # Directly visible resources first: names, then owned tables (exit hooks).
        if proc.name is not None:
            self.names.pop(proc.name, None)
        hooks = proc.exit_hooks
        if hooks:
            proc.exit_hooks = None
            for hook in hooks:
                try:
                    hook(proc, reason)
                except Exception:
                    crash_logger.exception("exit hook of %r failed", proc.pid)
        self.processes.pop(proc.pid.id, None)
        if proc.timers:
            self.timers.cancel_all(proc)
        pid = proc.pid
        links = proc.links
        if links:
            proc.links = None
            for other_pid in links:
                other = self.resolve(other_pid)
                if other is not None:
                    self.link_exit(other, pid, reason)
                elif other_pid._proc is None and self.distribution is not None:
                    self.distribution.send_link_exit(pid, other_pid, reason)
        watched_by = proc.monitored_by
        if watched_by:
            proc.monitored_by = None
            for ref, watcher_pid in watched_by.items():
                self.deliver_down(watcher_pid, ref, pid, reason)
        held = proc.monitors
        if held:
            proc.monitors = None
            for ref, target in held.items():
                target_pid = target.pid if isinstance(target, NamedMonitor) else target
                target_proc = self.resolve(target_pid)
                if target_proc is not None:
                    target_proc.remove_monitored_by(ref)
                elif target_pid._proc is None and self.distribution is not None:
                    self.distribution.send_demonitor(pid, target, ref)
        proc.aliases = None
        proc._mailbox = None

    # -- teardown ----------------------------------------------------------------------------

    def kill_all(self) -> None:
        """Terminate every process untrappably (the last step of stopping a node)."""
        self.closing = True
        for proc in list(self.processes.values()):
            proc.die(KILLED)


class NamedMonitor:
    """What a watcher remembers of a monitor made by name: the pid and the name to report."""

    __slots__ = ("label", "pid")

    def __init__(self, pid: Pid, label: Any) -> None:
        self.pid = pid
        self.label = label


async def _run_process(
    proc: Process, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
) -> None:
    """The task of a process: run ``fn(*args)`` and turn its outcome into an exit reason.

    Every live process holds this frame twice (the coroutine and the frame object trio makes of
    it at spawn), so it keeps few locals: the outcome is read by :func:`_exit_reason`.
    """
    CURRENT_PROCESS.set(proc)
    reason: Any = NORMAL
    try:
        with proc.scope:
            try:
                await _call(fn, args)
            except BaseException as exc:
                reason = _exit_reason(proc, exc)
                if reason is _RERAISE:
                    raise
    except BaseException:
        # Cancelled by the node's own teardown, or KeyboardInterrupt: record and re-raise.
        proc.node.process_exited(proc, proc.pending_reason if proc.exiting else KILLED)
        raise
    proc.node.process_exited(proc, proc.pending_reason if proc.exiting else reason)


#: What :func:`_exit_reason` returns for an exception that must go on up (the process's own
#: Cancelled, which its scope catches, or a KeyboardInterrupt for the node).
_RERAISE: Any = object()


def _exit_reason(proc: Process, exc: BaseException) -> Any:
    """The exit reason of ``proc`` whose function raised ``exc``, logging a crash; or
    ``_RERAISE``."""
    if isinstance(exc, ProcessExit):
        return exc.reason
    if isinstance(exc, BaseExceptionGroup):
        reason = _reason_of_group(exc)
        if reason is None:
            # A process killed while a task of its own failed on the way out (the group holds
            # our Cancelled and that error) dies of the exit signal; anything else
            # (KeyboardInterrupt, say) goes on up to the node.
            if not proc.exiting or exc.split(_UNWINDING)[1] is not None:
                return _RERAISE
            return NORMAL  # (replaced by the pending reason)
        if isinstance(reason, Crash) and not proc.exiting:
            log_crash(proc, reason)
        return reason
    if isinstance(exc, Exception):
        reason = Crash(exc)
        if not proc.exiting:
            log_crash(proc, reason)
        return reason
    return _RERAISE


def _call(fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> Awaitable[Any]:
    """``fn(*args)``, checked to be awaitable (in a helper, to keep every process's frame small)."""
    awaitable = fn(*args)
    if awaitable.__class__ is not CoroutineType and not isawaitable(awaitable):
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise TypeError(
            f"spawn({name}): calling it returned {awaitable!r}, not an awaitable: a process runs"
            f" an async function, so define {name} with 'async def'"
        )
    return awaitable


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``'s nested groups (``[exc]`` if it is not a group)."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]


def _process_exit_in(exc: BaseException) -> ProcessExit | None:
    """The ProcessExit that ``exc`` is or holds, if any (a task of the process exited it)."""
    for leaf in _leaves(exc):
        if isinstance(leaf, ProcessExit):
            return leaf
    return None


def _reason_of_group(group: BaseExceptionGroup[Any]) -> Any:
    """The exit reason of a process whose nursery raised a group, or None to re-raise it."""
    process_exit = _process_exit_in(group)
    if process_exit is not None:
        return process_exit.reason
    leaves = _leaves(group)
    if all(isinstance(leaf, Exception) for leaf in leaves):
        return Crash(group if len(leaves) != 1 else leaves[0])
    return None


def log_crash(proc: Process, reason: Any, *, last_message: Any = None, state: Any = None) -> None:
    """Log one structured crash report for ``proc`` (OTP's crash/error report); the handlers
    that write it format it (:func:`otp.log_report`)."""
    if not crash_logger.isEnabledFor(logging.ERROR):
        return
    report = {
        "process": proc.pid,
        "name": proc.name,
        "behaviour": proc.behaviour,
        "reason": reason,
        "last_message": last_message if last_message is not None else proc.last_message,
    }
    if state is not None:
        report["state"] = state
    log_report(
        crash_logger,
        logging.ERROR,
        "process %r%s (%s) crashed: %s",
        (
            proc.pid,
            f" ({proc.name})" if proc.name is not None else "",
            proc.behaviour or "process",
            reason_text(reason),
        ),
        report,
        exc_info=reason.exception if isinstance(reason, Crash) else None,
    )


#: ``current_process_or_none`` without its call (``current_node`` runs on every send_reply,
#: is_process_alive and cast).
_current_process = CURRENT_PROCESS.get


def current_node() -> Node:
    """The node of the running ``trio.run``; raises ``RuntimeError`` if none was opened."""
    proc = _current_process(None)
    if proc is not None:
        return proc.node
    try:
        return _NODE.get()
    except (LookupError, RuntimeError):
        raise RuntimeError(
            "no otp node is running here: wrap the code in 'async with otp.open_node():' or"
            " start it with otp.run(main)"
        ) from None


@asynccontextmanager
async def open_node(name: str = DEFAULT_NODE_NAME) -> AsyncIterator[Node]:
    """Start a node for the body of the ``async with``; the enclosing task becomes a process.

    Leaving the block terminates every process still alive (untrappably, as Erlang's ``halt``)
    and waits for them. If the block's own process is ended by an exit signal (say, a linked
    process crashed and it was not trapping exits) or by ``otp.exit_self``, leaving the block
    raises :class:`~otp.ProcessExited` with that reason.

    An error raised in the block comes out as itself, with a note naming the main process and
    the node (as ``trio.run`` raises a lone error of its main task), not wrapped in the node's
    nurseries' exception groups; so does a lone failure of one of the node's own tasks. Only
    several failures at once come out as one ``BaseExceptionGroup``.

    Raises:
        RuntimeError: a node is already open in this ``trio.run``.
    """
    try:
        _NODE.get()
    except LookupError:
        pass
    else:
        raise RuntimeError("a node is already open in this trio.run: one node per trio.run")
    body_error: BaseException | None = None
    exited = False
    try:
        async with trio.open_nursery() as system:
            async with trio.open_nursery() as nursery:
                node = Node(name, nursery)
                node.system_nursery = system
                _NODE.set(node)
                system.start_soon(node.timers.run)
                main = node.adopt_current_task()
                token = CURRENT_PROCESS.set(main)
                reason: Any = NORMAL
                try:
                    with main.scope:
                        yield node
                except BaseException as exc:
                    # Held until the nurseries have closed and raised from there, so that it
                    # surfaces as itself rather than inside one exception group per nursery.
                    process_exit = _process_exit_in(exc)
                    if process_exit is not None:
                        exited, reason = True, process_exit.reason
                    else:
                        body_error = exc
                        reason = Crash(exc) if isinstance(exc, Exception) else KILLED
                finally:
                    CURRENT_PROCESS.reset(token)
                    node.process_exited(main, main.pending_reason if main.exiting else reason)
                    if node.distribution is not None:
                        with trio.CancelScope(shield=True):
                            await node.distribution.flush(FLUSH_ON_STOP)
                    node.kill_all()
                exited = exited or main.exiting
            system.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        failure = _failure(_leaves(group), body_error, main, name)
    else:
        if body_error is None:
            if exited:
                raise ProcessExited(main.exit_reason)
            return
        failure = _note_main(body_error, main, name)
    # Outside the except clause, so that the nurseries' group does not become its context.
    raise failure


def _failure(
    errors: list[BaseException], body_error: BaseException | None, main: Process, name: str
) -> BaseException:
    """What leaves ``open_node`` when a task of the node's own failed (a service, or a process's
    task that raised what is not an exit): that error alone as itself, or with the body's error
    one flat group."""
    for error in errors:
        if isinstance(error, Exception):
            error.add_note(f"raised in node {name!r}, outside its main process")
    if body_error is not None and all(isinstance(e, trio.Cancelled) for e in _leaves(body_error)):
        body_error = None  # (the body was cancelled because of that failure)
    if body_error is None and len(errors) == 1:
        return errors[0]
    if body_error is not None:
        errors.insert(0, _note_main(body_error, main, name))
    return BaseExceptionGroup(f"several failures at once in node {name!r}", errors)


def _note_main(error: BaseException, main: Process, name: str) -> BaseException:
    if isinstance(error, Exception):
        error.add_note(f"raised in the main process {main.pid!r} of node {name!r}")
    return error


def run(
    main: Callable[..., Awaitable[Any]],
    *args: Any,
    name: str = DEFAULT_NODE_NAME,
    clock: trio.abc.Clock | None = None,
) -> Any:
    """Run ``main(*args)`` as the main process of a new node inside ``trio.run``; return its
    result. Every other process is terminated when ``main`` returns.

    What ``main`` raises comes out as itself, as from :func:`open_node`; ``main`` ended by an
    exit signal or ``otp.exit_self`` raises :class:`~otp.ProcessExited`.
    """

    async def _main() -> Any:
        async with open_node(name):
            return await main(*args)

    return trio.run(_main, clock=clock)
