"""A process: a trio task with a pid, an unbounded FIFO mailbox, links, monitors and an exit reason.

This is the per-process state and the mailbox (Erlang's message queue with selective receive).
Delivery is synchronous: ``send`` appends to the queue and, if the owner is parked on a receive
whose pattern the message matches, reschedules it. Because every signal between two local
processes is applied at the moment it is sent, Erlang's per-pair ordering holds by construction.
"""

from __future__ import annotations

import contextvars
import math
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

import trio
from trio.lowlevel import (
    Abort,
    Task,
    cancel_shielded_checkpoint,
    checkpoint_if_cancelled,
    current_task,
    reschedule,
    wait_task_rescheduled,
)

from ._errors import NotAProcess, OtpError, ReceiveTimeout
from ._ids import Pid, Ref

try:
    # What trio's ``wait_task_rescheduled`` yields to its scheduler. It is private to trio: if
    # a trio release moves it, ``receive`` falls back to that public coroutine.
    from trio._core._traps import WaitTaskRescheduled as _WAIT_TRAP
except ImportError:  # pragma: no cover - depends on the installed trio
    _WAIT_TRAP = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    _AsCoroutine = Coroutine[Any, Any, Any]
else:
    # ParkedReceive is registered as a Coroutine below instead of inheriting the ABC, which
    # would double the cost of making one (one per receive that waits).
    _AsCoroutine = object


if TYPE_CHECKING:
    from ._node import Node

#: A receive that finds a message waiting returns without yielding to the scheduler, but only
#: this many times in a row: then it yields once, so one busy process cannot starve the others.
FAIRNESS_BUDGET = 32

_NO_DEFAULT: Any = object()

#: The value a :class:`CallWaiter` resolves to when its timer fires first.
TIMED_OUT: Any = object()

Match = type | tuple[type, ...] | Callable[[Any], bool] | None

CURRENT_PROCESS: contextvars.ContextVar[Process] = contextvars.ContextVar("otp_current_process")


class ProcessExit(BaseException):
    """Raised to end the current process with ``reason`` (Erlang's ``exit(Reason)``).

    It derives from ``BaseException`` so that ``except Exception`` in user code does not swallow a
    deliberate exit. Raise it through ``otp.exit_self(reason)``.
    """

    def __init__(self, reason: Any) -> None:
        super().__init__(reason)
        self.reason = reason


class KilledBySignal(ProcessExit):
    """Raised in a process whose own exit signal killed it (``otp.exit(otp.self(), reason)``).

    It ends the process as an exit signal from elsewhere does, so a behaviour lets it through
    instead of treating it as ``exit/1``: a GenServer runs no ``terminate`` for it, as OTP's
    does not for a process killed by a signal.
    """


class CallWaiter:
    """A one-shot slot a caller parks on while a ``GenServer.call`` is outstanding (an alias).

    Replies and the callee's DOWN go straight here, not through the mailbox, so several tasks of
    one process can call at once and a reply after the caller gave up is dropped by its tag.
    """

    __slots__ = ("done", "is_down", "task", "value", "wake")

    def __init__(self) -> None:
        self.task: Task | None = None
        self.value: Any = None
        self.is_down = False
        self.done = False
        #: What wakes the caller when it waits elsewhere than on this slot (a remote call's
        #: caller waiting for its connection's socket: _dist_reading's wait_reply).
        self.wake: Callable[[], None] | None = None

    def resolve(self, value: Any, is_down: bool) -> None:
        if self.done:
            return
        self.done = True
        self.value = value
        self.is_down = is_down
        task = self.task
        if task is not None:
            self.task = None
            reschedule(task)
        elif self.wake is not None:
            self.wake()

    def abort(self, _raise_cancel: Any) -> Abort:
        """The abort function of a wait on this slot: cancellation leaves it unresolved."""
        self.task = None
        return Abort.SUCCEEDED

    def time_out(self) -> None:
        self.resolve(TIMED_OUT, False)

    async def wait(self) -> None:
        """Park until resolved; cancellation leaves the slot unresolved."""
        if self.done:
            await cancel_shielded_checkpoint()
            return
        self.task = current_task()
        await wait_task_rescheduled(self.abort)


def _predicate(match: Match) -> Callable[[Any], bool] | None:
    if match is None:
        return None
    if isinstance(match, type) or isinstance(match, tuple):
        kinds = match

        def is_instance(message: Any) -> bool:
            return isinstance(message, kinds)

        return is_instance
    if callable(match):
        return match
    raise TypeError(
        f"receive(match=...) takes None, a type, a tuple of types or a predicate (got {match!r})"
    )


class Process:
    """The runtime state of one process. Users hold its :class:`Pid`, never this object."""

    __slots__ = (
        "_fast",
        "_mailbox",
        "_match",
        "_waiter",
        "aliases",
        "alive",
        "behaviour",
        "exit_hooks",
        "exit_reason",
        "exiting",
        "handled",
        "initial_call",
        "last_message",
        "links",
        "monitored_by",
        "monitors",
        "name",
        "node",
        "parent",
        "pending_reason",
        "pid",
        "scope",
        "started_at",
        "suspended",
        "timers",
        "trap_exit",
    )

    def __init__(self, node: Node, parent: Pid | None) -> None:
        self.node = node
        self.pid: Pid = node.new_pid(self)
        self.parent = parent
        self._mailbox: deque[Any] | None = None
        self._waiter: Task | None = None
        self._match: Callable[[Any], bool] | None = None
        self._fast = 0
        # Links, monitors and aliases are allocated on first use: most processes have few or none.
        self.links: set[Pid] | None = None
        self.monitors: dict[Ref, Any] | None = None
        self.monitored_by: dict[Ref, Pid] | None = None
        self.aliases: dict[Ref, CallWaiter] | None = None
        self.exit_hooks: list[Callable[[Process, Any], None]] | None = None
        #: send_after timers aimed at this process: cancelled when it exits, as Erlang's are.
        self.timers: set[Ref] | None = None
        self.trap_exit = False
        self.alive = True
        self.exiting = False
        self.pending_reason: Any = None
        self.exit_reason: Any = None
        self.name: Any = None
        self.behaviour: str | None = None
        self.scope = trio.CancelScope()
        self.started_at = trio.current_time()
        self.handled = 0
        #: The function the process was spawned with (None: an adopted task), for observers.
        self.initial_call: Callable[..., Any] | None = None
        self.last_message: Any = None
        #: Set by a send to a busy distribution connection: what the next receive waits for.
        self.suspended: trio.Event | None = None

    def __repr__(self) -> str:
        return f"<Process {self.pid!r} alive={self.alive}>"

    # -- links, monitors and aliases: one side of each, its table made on first use ---------
    # (local and remote signals both edit them through these; OTP_SEMANTICS.md sections 1-2)

    def add_link(self, pid: Pid) -> None:
        links = self.links
        if links is None:
            self.links = {pid}
        else:
            links.add(pid)

    def remove_link(self, pid: Pid) -> bool:
        """Drop the link to ``pid``; whether there was one."""
        links = self.links
        if links is None or pid not in links:
            return False
        links.remove(pid)
        return True

    def add_monitor(self, ref: Ref, target: Any) -> None:
        """This process monitors ``target`` (a Pid, or a NamedMonitor) by ``ref``."""
        monitors = self.monitors
        if monitors is None:
            self.monitors = {ref: target}
        else:
            monitors[ref] = target

    def add_monitored_by(self, ref: Ref, watcher: Pid) -> None:
        monitored_by = self.monitored_by
        if monitored_by is None:
            self.monitored_by = {ref: watcher}
        else:
            monitored_by[ref] = watcher

    def remove_monitored_by(self, ref: Ref) -> None:
        if self.monitored_by is not None:
            self.monitored_by.pop(ref, None)

    def add_alias(self, ref: Ref, waiter: CallWaiter) -> None:
        """Route what comes for ``ref`` (a reply, the callee's DOWN) to ``waiter``."""
        aliases = self.aliases
        if aliases is None:
            self.aliases = {ref: waiter}
        else:
            aliases[ref] = waiter

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, message: Any) -> None:
        """Append ``message`` to the mailbox and wake the owner if it waits for such a message."""
        if not self.alive:
            return
        mailbox = self._mailbox
        if mailbox is None:
            mailbox = self._mailbox = deque()
        mailbox.append(message)
        task = self._waiter
        if task is not None:
            match = self._match
            if match is not None:
                try:
                    if not match(message):
                        return
                except Exception:
                    pass  # the receiver re-runs the pattern and raises in its own task
            self._waiter = None
            reschedule(task)

    def die(self, reason: Any) -> None:
        """Terminate this process with ``reason`` (an exit signal it cannot or does not trap).

        The process's task is cancelled; it unwinds at its next checkpoint and exits with
        ``reason`` whatever else happens on the way out.
        """
        if not self.alive or self.exiting:
            return
        self.exiting = True
        self.pending_reason = reason
        self.scope.cancel()

    @property
    def message_queue_len(self) -> int:
        return len(self._mailbox) if self._mailbox else 0

    def peek_messages(self) -> list[Any]:
        return list(self._mailbox) if self._mailbox else []

    def remove_messages(self, predicate: Callable[[Any], bool]) -> int:
        """Drop every queued message ``predicate`` accepts (used by flushes); returns how many.

        A flush is a receive, as in Erlang: the messages count as handled, which also tells a
        receive parked in another task of this process that the queue shifted under it.
        """
        mailbox = self._mailbox
        if not mailbox:
            return 0
        kept = [m for m in mailbox if not predicate(m)]
        removed = len(mailbox) - len(kept)
        if removed:
            mailbox.clear()
            mailbox.extend(kept)
            self.handled += removed
        return removed

    # -- receive -----------------------------------------------------------------------------

    def receive_any(self) -> Coroutine[Any, Any, Any]:
        """``receive()`` with no pattern and no timeout, the common case (most idle processes
        wait here).

        With nothing queued it returns a :class:`ParkedReceive`, which parks the task with no
        coroutine frame at all: an idle process's memory is mostly its parked frames.
        """
        if self._mailbox or self.suspended is not None or _WAIT_TRAP is None:
            return self._receive_any_ready()
        return ParkedReceive(self)

    def receive_any_now(self) -> Awaitable[Any]:
        """``receive_any`` for the runtime's own loops (a GenServer's), which await it at once:
        with nothing queued, one small generator frame parks the task, faster than
        :class:`ParkedReceive` (no Python-level ``send`` or ``StopIteration`` a message)."""
        if self._mailbox or self.suspended is not None:
            return self._receive_any_ready()
        return _parked_receive(self)

    def __call__(self, _raise_cancel: Any) -> Abort:
        """The abort function of a receive parked on this process (the process itself, so
        that a wait makes no bound method): the mailbox is left untouched."""
        self._waiter = None
        self._match = None
        return Abort.SUCCEEDED

    async def _receive_any_ready(self) -> Any:
        """``receive_any`` when a message may be waiting (or the task must wait for a busy
        distribution connection first)."""
        await checkpoint_if_cancelled()
        if self.suspended is not None:
            return await self.receive()
        mailbox = self._mailbox
        if mailbox:
            message = mailbox.popleft()
            if self._served_fast():
                await cancel_shielded_checkpoint()
            return message
        return await _parked_receive(self)

    def _served_fast(self) -> bool:
        """Count a receive served from the queue without yielding; True when it is time to
        yield once (``FAIRNESS_BUDGET``)."""
        self.handled += 1
        self._fast += 1
        if self._fast < FAIRNESS_BUDGET:
            return False
        self._fast = 0
        return True

    def _second_reader(self) -> OtpError:
        return OtpError(
            f"two tasks of process {self.pid!r} receive at once: a mailbox has one reader;"
            " start another process for concurrent work"
        )

    async def receive(
        self, match: Match = None, timeout: float | None = None, default: Any = _NO_DEFAULT
    ) -> Any:
        """Take the oldest message that ``match`` accepts, waiting up to ``timeout`` seconds."""
        await checkpoint_if_cancelled()
        while self.suspended is not None:
            # Erlang suspends a sender to a busy distribution port inside the send; a Python
            # send cannot block, so the sender waits here (see Connection._busy).
            resume, self.suspended = self.suspended, None
            await resume.wait()
        mailbox = self._mailbox
        predicate = _predicate(match) if match is not None else None
        if mailbox:
            if predicate is None:
                message = mailbox.popleft()
                if self._served_fast():
                    await cancel_shielded_checkpoint()
                return message
            for index, message in enumerate(mailbox):
                if predicate(message):
                    del mailbox[index]
                    self.handled += 1
                    return message
            scanned = len(mailbox)
        else:
            scanned = 0
        self._fast = 0
        deadline = math.inf
        if timeout is not None:
            if timeout <= 0:
                await cancel_shielded_checkpoint()
                return self._timed_out(timeout, default)
            if math.isnan(timeout):
                raise ValueError(
                    f"receive(timeout=...) takes a number of seconds or None (got {timeout!r})"
                )
            deadline = trio.current_time() + timeout
        while True:
            if self._waiter is not None:
                raise self._second_reader()
            self._waiter = current_task()
            self._match = predicate
            handled = self.handled
            if timeout is None:
                await wait_task_rescheduled(self)
            else:
                with trio.move_on_at(deadline) as scope:
                    await wait_task_rescheduled(self)
                if scope.cancelled_caught:
                    return self._timed_out(timeout, default)
            mailbox = self._mailbox
            # Another task of this process may have taken (a receive with timeout=0) or flushed
            # (demonitor(flush=True)) messages since we parked: the one we were woken for may be
            # gone, and the queue may have shifted under ``scanned``.
            if not mailbox:
                continue
            if predicate is None:
                self.handled += 1
                return mailbox.popleft()
            if self.handled != handled:
                scanned = 0
            for index in range(scanned, len(mailbox)):
                message = mailbox[index]
                if predicate(message):
                    del mailbox[index]
                    self.handled += 1
                    return message
            scanned = len(mailbox)

    def _timed_out(self, timeout: float | None, default: Any) -> Any:
        if default is _NO_DEFAULT:
            raise ReceiveTimeout(f"process {self.pid!r} got no matching message within {timeout} s")
        return default


class ParkedReceive(_AsCoroutine):
    """What ``receive()`` awaits when the mailbox is empty: it parks the task on trio's scheduler
    itself, with the trap ``wait_task_rescheduled`` yields, and is its own abort function.

    A waiting process (most of them) so holds this one-slot object instead of three coroutine
    frames and a bound method: about 750 bytes less per idle process. It behaves as
    ``receive_any`` does: a checkpoint, and cancellation leaves the mailbox untouched.
    """

    __slots__ = ("parked", "proc")

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.parked = False

    def __await__(self) -> Generator[Any, Any, Any]:
        proc = self.proc
        if proc._mailbox or proc.suspended is not None:
            # Something arrived between the call and the await.
            return proc._receive_any_ready().__await__()
        proc._fast = 0
        return self  # type: ignore[return-value]  # an iterator with send and throw

    def __next__(self) -> Any:
        """The first step: park."""
        proc = self.proc
        if proc._waiter is not None:
            raise proc._second_reader()
        proc._waiter = current_task()
        proc._match = None
        self.parked = True
        return _trap(self)

    def send(self, value: Any) -> Any:
        """Take the message we were woken for: ``value`` is the outcome trio resumes us with,
        an error if the wait was cancelled (the abort ran). Park again if it is gone."""
        if value is None:
            return self.__next__()
        self.parked = False
        value.unwrap()
        proc = self.proc
        mailbox = proc._mailbox
        if mailbox:
            proc.handled += 1
            raise StopIteration(mailbox.popleft())
        # Another task of this process took the message meanwhile (see receive): wait again.
        return self.__next__()

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """trio only sends; a throw (``close()``, a foreign driver) ends the wait and raises."""
        if self.parked:
            self(None)
        error = typ if val is None else val
        if isinstance(error, type):
            error = error()
        raise error.with_traceback(tb) if tb is not None else error

    def close(self) -> None:
        """Stop waiting, if parked (what closing a coroutine does)."""
        if self.parked:
            self(None)

    def __call__(self, _raise_cancel: Any) -> Abort:
        """The abort function of the wait: cancellation leaves the mailbox untouched."""
        self.parked = False
        proc = self.proc
        proc._waiter = None
        proc._match = None
        return Abort.SUCCEEDED


Coroutine.register(ParkedReceive)


@types.coroutine
def _parked_receive(proc: Process) -> Generator[Any, Any, Any]:
    """``receive_any`` with nothing queued: parks the task on trio's scheduler with the trap
    ``wait_task_rescheduled`` yields, in this one generator frame instead of three coroutine
    frames and a bound method (or through that coroutine, if trio moved its trap).
    Cancellation leaves the mailbox untouched (the process is the abort function)."""
    proc._fast = 0
    while True:
        if proc._waiter is not None:
            raise proc._second_reader()
        proc._waiter = current_task()
        proc._match = None
        if _WAIT_TRAP is not None:
            (yield _trap(proc)).unwrap()
        else:
            yield from wait_task_rescheduled(proc)  # noqa: ASYNC105 (a generator-based coroutine)
        mailbox = proc._mailbox
        if mailbox:
            proc.handled += 1
            return mailbox.popleft()
        # Another task of this process took the message meanwhile (see receive): again.


_new = object.__new__


def _trap(abort: Callable[[Any], Abort]) -> Any:
    """The trap that parks the running task until rescheduled, ``abort`` called on cancellation
    (``WaitTaskRescheduled(abort)``, made without its frozen attrs ``__init__``: a third of the
    time)."""
    trap = _new(_WAIT_TRAP)
    trap.__dict__["abort_func"] = abort
    return trap


if _WAIT_TRAP is not None and "__slots__" in vars(_WAIT_TRAP):  # pragma: no cover
    _trap = _WAIT_TRAP  # type: ignore[assignment]  # a trap without a __dict__: its __init__


def current_process() -> Process:
    """The process running the calling code; raises :class:`NotAProcess` outside one."""
    try:
        return CURRENT_PROCESS.get()
    except LookupError:
        raise NotAProcess(
            "this needs a current process: run it inside spawn(), otp.run() or"
            " 'async with otp.open_node():'"
        ) from None


def current_process_or_none() -> Process | None:
    return CURRENT_PROCESS.get(None)
