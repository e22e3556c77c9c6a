"""Ports: an OS program as a process (Erlang's ``open_port({spawn_executable, ...})``).

A port is a process that starts an OS program with trio's process API, forwards what the program
writes to stdout as :class:`PortData` messages to its owner, and writes what it is sent
(``port_command``) to the program's stdin. The program's exit is the port's exit: reason
``"normal"`` for status 0, :class:`ExitStatus` for another status, :class:`Signaled` for a
signal; a command the program can no longer read (it closed its stdin) ends the port with
``"epipe"``, as in Erlang. An exit signal to the port (a supervisor shutting it down), or its
owner's exit (linked or not: a port always closes with its owner) stops the program with SIGTERM,
then SIGKILL after ``kill_timeout``; a port killed outright (``kill``) SIGKILLs the program on
its way out, so no path leaks an OS process. ``port_command``, ``port_close`` and
``port_os_pid`` on anything but an open port raise :class:`~otp.BadArg`, as Erlang's do.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from ._api import demonitor, monitor, receive, send, unlink
from ._errors import BadArg, StartError
from ._gen_server import call, reply
from ._gen_server_core import GenCall, kill_flush, unwatch, watch
from ._ids import Pid, Ref
from ._messages import Down, Exit, From
from ._node import current_node
from ._process import CallWaiter, Process, ProcessExit, current_process
from ._reasons import NORMAL, ExitStatus, Signaled

logger = logging.getLogger("otp.port")

#: After its program exits, how long a port waits for the rest of its output (seconds).
OUTPUT_GRACE = 1.0

#: How long a cancelled ``open_port`` waits for the port it abandons to reap its program.
ABANDON_WAIT = 5.0

#: The exit reason of a port whose program closed its stdin while commands were still coming.
EPIPE = "epipe"


@attrs.define(eq=False)
class OpenPort:
    """What a node knows of one open port: its program's argv and, once started, its OS pid."""

    argv: tuple[str, ...]
    os_pid: int | None = None


#: The ports of this trio run's node that are open: started, neither closed nor exited.
_OPEN_PORTS: trio.lowlevel.RunVar[dict[Process, OpenPort]] = trio.lowlevel.RunVar("otp_open_ports")


@attrs.frozen
class PortData:
    """Bytes the port's program wrote to stdout (or a line, in ``"line"`` mode)."""

    port: Pid
    data: bytes


@attrs.frozen
class _Command:
    data: bytes


@attrs.frozen
class _Close:
    pass


def _as_tuple(value: Any) -> Any:
    """A list-like value as a tuple; a str, bytes or non-iterable is left for the validator to
    refuse (``tuple("cat")`` would silently be ``("c", "a", "t")``)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return value
    return tuple(value)


def _is_fd(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@attrs.frozen
class PortSpec:
    """What a port runs: the program, its arguments and environment, all explicit.

    Every field is checked here, so a bad value is a ``ValueError`` naming the field when the
    spec is built, never a crash of the port while it starts the program.
    """

    argv: tuple[str, ...] = attrs.field(converter=_as_tuple)
    env: Mapping[str, str] | None = attrs.field(default=None)
    cwd: str | None = attrs.field(default=None)
    pass_fds: tuple[int, ...] = attrs.field(default=(), converter=_as_tuple)
    mode: str = attrs.field(default="stream")
    stderr_to_stdout: bool = False
    kill_timeout: float = attrs.field(default=5.0)

    @argv.validator
    def _check_argv(self, _attribute: Any, value: Any) -> None:
        if isinstance(value, str):
            raise ValueError(
                f"PortSpec.argv must be a non-empty list of str (got the str {value!r}): write"
                f" [{value!r}] for a program run with no arguments"
            )
        if (
            not isinstance(value, tuple)
            or not value
            or not all(isinstance(part, str) and "\0" not in part for part in value)
        ):
            raise ValueError(
                f"PortSpec.argv must be a non-empty list of str without NUL characters"
                f" (got {value!r})"
            )

    @env.validator
    def _check_env(self, _attribute: Any, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, Mapping):
            raise ValueError(
                f"PortSpec.env must be a mapping of str to str, or None (got {value!r})"
            )
        for name, text in value.items():
            if not (isinstance(name, str) and name and "=" not in name and "\0" not in name):
                raise ValueError(
                    f"PortSpec.env names must be non-empty str without '=' or NUL (got {name!r})"
                )
            if not (isinstance(text, str) and "\0" not in text):
                raise ValueError(
                    f"PortSpec.env values must be str without NUL (got {name!r}: {text!r});"
                    " convert numbers with str()"
                )

    @cwd.validator
    def _check_cwd(self, _attribute: Any, value: Any) -> None:
        if value is not None and not (isinstance(value, str) and "\0" not in value):
            raise ValueError(
                f"PortSpec.cwd must be a str path without NUL, or None (got {value!r})"
            )

    @pass_fds.validator
    def _check_pass_fds(self, _attribute: Any, value: Any) -> None:
        if not isinstance(value, tuple) or not all(_is_fd(fd) for fd in value):
            raise ValueError(
                f"PortSpec.pass_fds must be a list of int descriptors >= 0 (got {value!r})"
            )

    @mode.validator
    def _check_mode(self, _attribute: Any, value: str) -> None:
        if value not in ("stream", "line"):
            raise ValueError(f'PortSpec.mode must be "stream" or "line" (got {value!r})')

    @kill_timeout.validator
    def _check_kill_timeout(self, _attribute: Any, value: float) -> None:
        if not (isinstance(value, int | float) and value >= 0):
            raise ValueError(f"PortSpec.kill_timeout must be a number >= 0 (got {value!r})")


def exit_reason_of(returncode: int) -> Any:
    """The port exit reason for a program's return code (negative = killed by that signal)."""
    if returncode == 0:
        return NORMAL
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"SIG{-returncode}"
        return Signaled(name)
    return ExitStatus(returncode)


async def open_port(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    pass_fds: Sequence[int] = (),
    mode: str = "stream",
    stderr_to_stdout: bool = False,
    kill_timeout: float = 5.0,
    link: bool = True,
) -> Pid:
    """Start ``argv`` as an OS program owned by a new port process; return the port's pid.

    The caller is the owner: it gets :class:`PortData` messages and, with ``link`` (the default,
    as Erlang links a port to its owner), the port's exit signal. Linked or not, the port closes
    when its owner exits. ``env`` replaces the environment when given (None inherits this
    process's); ``pass_fds`` are the only descriptors the program inherits besides
    stdin/stdout/stderr (every other is closed on exec).

    Returns once the program has been started. Raises ``ValueError`` naming the field for a bad
    argument (see :class:`PortSpec`; nothing is started), and :class:`~otp.StartError` if the
    program cannot be started (``reason`` is the error, e.g. the ``OSError`` of a program that
    does not exist). If the call is cancelled, the port and its program are killed; unless the
    caller's process is exiting anyway, the call waits (shielded, up to :data:`ABANDON_WAIT`
    seconds) until the program is reaped.
    """
    spec = PortSpec(
        argv=argv,
        env=dict(env) if isinstance(env, Mapping) else env,
        cwd=os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd,
        pass_fds=pass_fds,
        mode=mode,
        stderr_to_stdout=stderr_to_stdout,
        kill_timeout=kill_timeout,
    )
    me = current_process()
    node = me.node
    ref = node.make_ref()
    waiter = CallWaiter()
    port = node.spawn(_run_port, (spec, From(me.pid, ref)), me, link=link, trap_exit=True)
    port.behaviour = "Port " + " ".join(spec.argv)[:80]
    # Watched as a call watches its server: a port that dies before it answers (killed, say)
    # ends the wait instead of leaving the caller parked for ever.
    watch(me, port, ref, waiter)
    try:
        await waiter.wait()
    except BaseException:
        unwatch(me, port, ref)
        await _abandon(me, port, link)
        raise
    unwatch(me, port, ref)
    if waiter.is_down or isinstance(waiter.value, BaseException):
        if link:
            # No port came to be (as Erlang's open_port raising enoent): no exit signal either,
            # not even an Exit message for a caller that traps exits.
            unlink(port.pid)
            await receive(lambda m: type(m) is Exit and m.pid == port.pid, timeout=0, default=None)
        if waiter.is_down:
            raise StartError(waiter.value)
        raise StartError(waiter.value) from waiter.value
    return port.pid


async def _abandon(me: Process, port: Process, link: bool) -> None:
    """Kill the port of a cancelled ``open_port`` (nobody will get its pid), and wait until its
    program is reaped unless the caller is exiting (then the caller must not be held up)."""
    ref = monitor(port.pid)
    kill_flush(me, port, link)
    if not me.exiting:
        with trio.move_on_after(ABANDON_WAIT, shield=True):
            await receive(lambda m: type(m) is Down and m.ref == ref)
    demonitor(ref, flush=True)


def port_command(port: Pid, data: bytes) -> None:
    """Write ``data`` (bytes, bytearray or memoryview) to the port's program's stdin
    (asynchronously, in order).

    Raises:
        TypeError: ``data`` is not bytes-like (an int is not taken as a count of zero bytes).
        BadArg: ``port`` is not an open port of this node (closed, exited, or not a port).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(
            f"port_command: data must be bytes-like: bytes, bytearray or memoryview"
            f" (got {type(data).__name__}); encode a str first"
        )
    _open_port(port, "port_command").deliver(_Command(bytes(data)))


async def port_os_pid(port: Pid) -> int:
    """The OS pid of the port's program (Erlang's ``port_info(Port, os_pid)``).

    Raises :class:`~otp.BadArg` if ``port`` is not an open port of this node (nothing is sent
    to it), and :class:`~otp.CallError` if the port exits during the call.
    """
    try:
        _open_port(port, "port_os_pid")
    except BadArg:
        await trio.lowlevel.checkpoint()
        raise
    return int(await call(port, "os_pid"))


def port_close(port: Pid) -> None:
    """Close the port: it is closed at once for ``port_command``, ``port_close`` and
    ``port_os_pid`` (they raise :class:`~otp.BadArg`), its program gets SIGTERM (then SIGKILL
    after ``kill_timeout``) and the port exits ``normal``.

    Raises:
        BadArg: ``port`` is not an open port of this node (closed, exited, or not a port).
    """
    proc = _open_port(port, "port_close")
    open_ports().pop(proc, None)
    proc.deliver(_Close())


def open_ports() -> dict[Process, OpenPort]:
    """The node's open ports (a port leaves it when closed or when its process ends)."""
    try:
        return _OPEN_PORTS.get()
    except LookupError:
        ports: dict[Process, OpenPort] = {}
        _OPEN_PORTS.set(ports)
        return ports


def _open_port(port: Pid, where: str) -> Process:
    """The open port ``port`` names; raises BadArg for anything else (as Erlang's port BIFs do,
    which also take only ports of their own node)."""
    if port.__class__ is not Pid:
        proc = None
    else:
        proc = port._proc or current_node().resolve(port)
    if proc is None or proc not in open_ports():
        raise BadArg(
            f"{where}({port!r}): not an open port of this node (it was closed, it has exited,"
            " or it is not a port); a port's owner learns of its exit by its link or a monitor"
        )
    return proc


def _acknowledge(starter: From, value: Any) -> None:
    node = current_process().node
    caller = node.resolve(starter.pid)
    if caller is not None and caller.aliases is not None:
        waiter = caller.aliases.get(starter.tag)
        if waiter is not None:
            waiter.resolve(value, False)


async def _run_port(spec: PortSpec, starter: From) -> None:
    me = current_process()
    ports = open_ports()
    ports[me] = OpenPort(spec.argv)
    try:
        reason = await _run_program(me, spec, starter)
    finally:
        ports.pop(me, None)
    raise ProcessExit(reason)


async def _run_program(me: Process, spec: PortSpec, starter: From) -> Any:
    """Start the program, serve the port until it ends; returns the port's exit reason."""
    owner = starter.pid
    # Linked or not, a port closes when its owner exits (OTP: "if the port owner terminates, so
    # does the port"); the monitor covers ``link=False`` and an owner that unlinked.
    owner_ref = monitor(owner)
    try:
        program = await trio.lowlevel.open_process(
            list(spec.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if spec.stderr_to_stdout else None,
            env=spec.env,
            cwd=spec.cwd,
            pass_fds=spec.pass_fds,
            close_fds=True,
            start_new_session=False,
        )
    except Exception as exc:
        # Any failure (a missing program, or an error Popen raises for a value the spec let
        # through) is the caller's StartError: the caller always gets an answer.
        _acknowledge(starter, exc)
        return NORMAL
    record = open_ports().get(me)
    if record is not None:
        record.os_pid = program.pid
    _acknowledge(starter, None)
    reason: Any = None
    try:
        async with trio.open_nursery() as nursery:
            eof = trio.Event()
            nursery.start_soon(_forward_output, program, spec.mode, me.pid, owner, eof)
            reason = await _serve_port(program, spec, owner, owner_ref, nursery, eof)
            nursery.cancel_scope.cancel()
    finally:
        # Whatever ends the port (its program's exit, an exit signal, a kill), the program must
        # not outlive it.
        if program.returncode is None:
            program.kill()
            with trio.CancelScope(shield=True):
                await program.wait()
        for stream in (program.stdin, program.stdout):
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
    return reason


class _LineSplitter:
    """Cuts a byte stream into lines (without their ``b"\\n"``).

    Only the new bytes are searched, and the unfinished line grows in place, so a long line
    costs time linear in its length (a rescan of it on every read would stall the node's event
    loop for seconds on a few MiB).
    """

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes; the rest is kept for the next chunk."""
        if chunk.find(b"\n") < 0:
            self._partial += chunk
            return []
        if self._partial:
            self._partial += chunk
            chunk = bytes(self._partial)
            self._partial.clear()
        *lines, rest = chunk.split(b"\n")
        self._partial += rest
        return lines

    def rest(self) -> bytes:
        """The unfinished last line (empty if the stream ended with a newline)."""
        return bytes(self._partial)


async def _forward_output(
    program: trio.Process, mode: str, port: Pid, owner: Pid, eof: trio.Event
) -> None:
    assert program.stdout is not None
    lines = _LineSplitter() if mode == "line" else None
    while True:
        chunk = await program.stdout.receive_some(65536)
        if not chunk:
            break
        if lines is None:
            send(owner, PortData(port, bytes(chunk)))
            continue
        for line in lines.feed(bytes(chunk)):
            send(owner, PortData(port, line))
    rest = lines.rest() if lines is not None else b""
    if rest:
        send(owner, PortData(port, rest))
    eof.set()


async def _serve_port(
    program: trio.Process,
    spec: PortSpec,
    owner: Pid,
    owner_ref: Ref,
    nursery: trio.Nursery,
    eof: trio.Event,
) -> Any:
    """Run the port's mailbox until the program exits or the port is told to stop; returns the
    port's exit reason."""
    me = current_process()

    async def wait_for_program() -> None:
        await program.wait()
        # Deliver what the program wrote before it exited first (a descendant that keeps its
        # stdout open must not hold the port up for long).
        with trio.move_on_after(OUTPUT_GRACE):
            await eof.wait()
        me.deliver(_ProgramExited())

    nursery.start_soon(wait_for_program)
    # Commands queue for a writer task, as they queue in an Erlang port: a program that does
    # not read its stdin must never keep the port from its mailbox (close, exit signals).
    commands, to_write = trio.open_memory_channel[bytes](math.inf)
    if program.stdin is not None:
        nursery.start_soon(_feed_stdin, program.stdin, to_write, me)
    else:
        to_write.close()
    while True:
        message = await me.receive()
        if isinstance(message, _ProgramExited):
            return exit_reason_of(program.returncode or 0)
        if isinstance(message, _Command):
            try:
                commands.send_nowait(message.data)
            except trio.BrokenResourceError:
                pass  # the writer has stopped: a _StdinClosed is queued and ends the port
        elif isinstance(message, _Close):
            await _stop_program(program, spec.kill_timeout)
            return NORMAL
        elif isinstance(message, _StdinClosed):
            if program.returncode is not None:
                continue  # it exited (closing its stdin): _ProgramExited brings its reason
            # As an Erlang port: a write the program can no longer read ends the port with
            # epipe, so its owner learns that its data was lost.
            await _stop_program(program, spec.kill_timeout)
            return EPIPE
        elif isinstance(message, GenCall) and message.request == "os_pid":
            reply(message.from_, program.pid)
        elif isinstance(message, Exit):
            if message.reason == NORMAL and message.pid != owner:
                continue
            await _stop_program(program, spec.kill_timeout)
            return message.reason
        elif isinstance(message, Down) and message.ref == owner_ref:
            await _stop_program(program, spec.kill_timeout)
            return message.reason
        else:
            logger.warning("port %r ignores unexpected message %r", me.pid, message)


async def _feed_stdin(
    stdin: trio.abc.SendStream, to_write: trio.MemoryReceiveChannel[bytes], port: Process
) -> None:
    """Write the port's commands to its program's stdin, in order, as it reads them; tell the
    port if the program closed its stdin."""
    async with to_write:
        async for data in to_write:
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                logger.debug("port %r: program closed its stdin", port.pid)
                port.deliver(_StdinClosed())
                return


class _ProgramExited:
    __slots__ = ()


class _StdinClosed:
    __slots__ = ()


async def _stop_program(program: trio.Process, kill_timeout: float) -> None:
    if program.returncode is not None:
        return
    program.terminate()
    with trio.move_on_after(kill_timeout):
        await program.wait()
    if program.returncode is None:
        program.kill()
        await program.wait()
