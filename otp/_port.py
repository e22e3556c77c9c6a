"""Ports: an OS program as a process (Erlang's ``open_port({spawn_executable, ...})``).

A port is a process that starts an OS program with trio's process API, forwards what the program
writes to stdout as :class:`PortData` messages to its owner, and writes what it is sent
(``port_command``) to the program's stdin. The program's exit is the port's exit: reason
``"normal"`` for status 0, :class:`ExitStatus` for another status, :class:`Signaled` for a
signal. An exit signal to the port (its owner dying, a supervisor shutting it down) stops the
program with SIGTERM, then SIGKILL after ``kill_timeout``; a port killed outright (``kill``)
SIGKILLs the program on its way out, so no path leaks an OS process.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from ._api import receive, send, unlink
from ._errors import StartError
from ._gen_server import _Call, call, reply
from ._ids import Pid
from ._messages import Exit, From
from ._process import CallWaiter, ProcessExit, current_process
from ._reasons import NORMAL, ExitStatus, Signaled

logger = logging.getLogger("otp.port")

#: After its program exits, how long a port waits for the rest of its output (seconds).
OUTPUT_GRACE = 1.0


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


@attrs.frozen
class PortSpec:
    """What a port runs: the program, its arguments and environment, all explicit."""

    argv: tuple[str, ...] = attrs.field(converter=tuple)
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    pass_fds: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    mode: str = attrs.field(default="stream")
    stderr_to_stdout: bool = False
    kill_timeout: float = attrs.field(default=5.0)

    @argv.validator
    def _check_argv(self, _attribute: Any, value: tuple[str, ...]) -> None:
        if not value or not all(isinstance(part, str) for part in value):
            raise ValueError(f"PortSpec.argv must be a non-empty list of str (got {value!r})")

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
    as Erlang links a port to its owner), the port's exit signal. ``env`` replaces the
    environment when given (None inherits this process's); ``pass_fds`` are the only descriptors
    the program inherits besides stdin/stdout/stderr (every other is closed on exec).

    Returns once the program has been started. Raises :class:`~otp.StartError` if it cannot be
    (``reason`` is the ``OSError``, e.g. the program does not exist).
    """
    spec = PortSpec(
        argv=argv,  # type: ignore[arg-type]
        env=dict(env) if env is not None else None,
        cwd=os.fspath(cwd) if cwd is not None else None,
        pass_fds=pass_fds,  # type: ignore[arg-type]
        mode=mode,
        stderr_to_stdout=stderr_to_stdout,
        kill_timeout=kill_timeout,
    )
    me = current_process()
    node = me.node
    ref = node.make_ref()
    waiter = CallWaiter()
    if me.aliases is None:
        me.aliases = {}
    me.aliases[ref] = waiter
    try:
        port = node.spawn(_run_port, (spec, From(me.pid, ref)), me, link=link, trap_exit=True)
        port.behaviour = "Port " + " ".join(spec.argv)[:80]
        await waiter.wait()
    finally:
        me.aliases.pop(ref, None)
    if isinstance(waiter.value, BaseException):
        if link:
            # No port came to be (as Erlang's open_port raising enoent): no exit signal either,
            # not even an Exit message for a caller that traps exits.
            unlink(port.pid)
            await receive(lambda m: type(m) is Exit and m.pid == port.pid, timeout=0, default=None)
        raise StartError(waiter.value) from waiter.value
    return port.pid


def port_command(port: Pid, data: bytes) -> None:
    """Write ``data`` to the port's program's stdin (asynchronously, in order)."""
    send(port, _Command(bytes(data)))


async def port_os_pid(port: Pid) -> int:
    """The OS pid of the port's program (Erlang's ``port_info(Port, os_pid)``).

    Raises :class:`~otp.CallError` if the port is not alive.
    """
    return int(await call(port, "os_pid"))


def port_close(port: Pid) -> None:
    """Close the port: its program gets SIGTERM (then SIGKILL after ``kill_timeout``) and the
    port exits ``normal``."""
    send(port, _Close())


def _acknowledge(starter: From, value: Any) -> None:
    node = current_process().node
    caller = node.resolve(starter.pid)
    if caller is not None and caller.aliases is not None:
        waiter = caller.aliases.get(starter.tag)
        if waiter is not None:
            waiter.resolve(value, False)


async def _run_port(spec: PortSpec, starter: From) -> None:
    me = current_process()
    owner = starter.pid
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
    except OSError as exc:
        _acknowledge(starter, exc)
        raise ProcessExit(NORMAL) from None
    _acknowledge(starter, None)
    reason: Any = None
    try:
        async with trio.open_nursery() as nursery:
            eof = trio.Event()
            nursery.start_soon(_forward_output, program, spec.mode, me.pid, owner, eof)
            reason = await _serve_port(program, spec, owner, nursery, eof)
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
    raise ProcessExit(reason)


async def _forward_output(
    program: trio.Process, mode: str, port: Pid, owner: Pid, eof: trio.Event
) -> None:
    assert program.stdout is not None
    pending = b""
    while True:
        chunk = await program.stdout.receive_some(65536)
        if not chunk:
            break
        if mode == "stream":
            send(owner, PortData(port, bytes(chunk)))
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            send(owner, PortData(port, bytes(line)))
    if pending:
        send(owner, PortData(port, bytes(pending)))
    eof.set()


async def _serve_port(
    program: trio.Process, spec: PortSpec, owner: Pid, nursery: trio.Nursery, eof: trio.Event
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
        nursery.start_soon(_feed_stdin, program.stdin, to_write, me.pid)
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
                pass  # the program closed its stdin (or has none): the data is dropped
        elif isinstance(message, _Close):
            await _stop_program(program, spec.kill_timeout)
            return NORMAL
        elif isinstance(message, _Call) and message.request == "os_pid":
            reply(message.from_, program.pid)
        elif isinstance(message, Exit):
            if message.reason == NORMAL and message.pid != owner:
                continue
            await _stop_program(program, spec.kill_timeout)
            return message.reason
        else:
            logger.warning("port %r ignores unexpected message %r", me.pid, message)


async def _feed_stdin(
    stdin: trio.abc.SendStream, to_write: trio.MemoryReceiveChannel[bytes], port: Pid
) -> None:
    """Write the port's commands to its program's stdin, in order, as it reads them."""
    async with to_write:
        async for data in to_write:
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                logger.debug("port %r: program closed its stdin", port)
                return


class _ProgramExited:
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
