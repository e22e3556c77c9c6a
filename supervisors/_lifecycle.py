"""Starting and stopping one child process, as ``supervisor.erl`` (OTP 25) does it.

``call_start`` is ``do_start_child_i`` (a start function's return turned into OTP's terms);
``shutdown`` is ``shutdown/2`` (monitor, ``shutdown`` or ``kill``, wait, ``kill`` after the
timeout, ``unlink_flush``); ``shutdown_many`` is ``terminate_dynamic_children`` (all at once).
"""

from __future__ import annotations

import inspect
from typing import Any

import trio

import otp

from . import _reports as reports
from ._spec import BRUTAL_KILL, INFINITY, ChildSpec, Restart

__all__ = ["call_start", "shutdown", "shutdown_many"]


async def call_start(spec: ChildSpec) -> tuple[Any, ...]:
    """Run a child's start function: ``("ok", pid[, info])``, ``("ok", None)`` for ignore or
    ``("error", reason)``, as OTP's ``do_start_child_i``."""
    fn, *args = spec.start
    try:
        ret = fn(*args)
        if inspect.isawaitable(ret):
            ret = await ret
    except otp.StartIgnored:
        return ("ok", None)
    except otp.StartError as exc:
        return ("error", exc.reason)
    except Exception as exc:
        return ("error", otp.Crash(exc))
    if isinstance(ret, otp.Pid):
        return ("ok", ret)
    if ret is None or ret == "ignore":
        return ("ok", None)
    if isinstance(ret, tuple) and ret:
        if ret[0] == "ok" and len(ret) in (2, 3) and isinstance(ret[1], otp.Pid):
            return ret
        if ret[0] == "error" and len(ret) == 2:
            return ret
    return ("error", ret)


def _is_down(ref: otp.Ref) -> Any:
    def match(message: Any) -> bool:
        return message.__class__ is otp.Down and message.ref == ref

    return match


def _is_exit_of(pid: otp.Pid) -> Any:
    def match(message: Any) -> bool:
        return message.__class__ is otp.Exit and message.pid == pid

    return match


async def _unlink_flush(pid: otp.Pid, default: Any) -> Any:
    """OTP's ``unlink_flush/2``: unlink, then take a queued ``Exit`` of ``pid`` if there is one."""
    otp.unlink(pid)
    message = await otp.receive(_is_exit_of(pid), timeout=0, default=None)
    return message.reason if message is not None else default


def _shutdown_ok(spec: ChildSpec, reason: Any, killed_ok: bool) -> bool:
    if reason == otp.SHUTDOWN or (killed_ok and reason == otp.KILLED):
        return True
    if spec.restart is not Restart.PERMANENT:
        return reason == otp.NORMAL or isinstance(reason, otp.Shutdown)
    return False


async def shutdown(sup_name: Any, spec: ChildSpec, pid: otp.Pid) -> None:
    """Stop one child as OTP's ``shutdown/1``: monitor it, send ``shutdown`` (or ``kill`` for
    brutal_kill), wait up to ``spec.shutdown`` seconds, then ``kill``; unlink and flush its
    ``Exit``. An unexpected exit reason is only reported (shutdown_error)."""
    ref = otp.monitor(pid)
    match = _is_down(ref)
    if spec.shutdown == BRUTAL_KILL:
        otp.exit(pid, otp.KILL)
        down = await otp.receive(match)
        killed_ok = True
    else:
        otp.exit(pid, otp.SHUTDOWN)
        timeout = None if spec.shutdown == INFINITY else float(spec.shutdown)
        down = await otp.receive(match, timeout=timeout, default=None)
        if down is None:
            otp.exit(pid, otp.KILL)
            down = await otp.receive(match)
        killed_ok = False
    reason = await _unlink_flush(pid, down.reason)
    if not _shutdown_ok(spec, reason, killed_ok):
        reports.report_error(reports.SHUTDOWN_ERROR, reason, sup_name, spec, pid)


async def shutdown_many(sup_name: Any, entries: list[tuple[ChildSpec, otp.Pid]]) -> None:
    """Stop dynamic children concurrently, as OTP's ``terminate_dynamic_children``: signal them
    all, wait for every one, kill those still alive when their shutdown time runs out."""
    if not entries:
        return
    waiting: dict[otp.Ref, tuple[ChildSpec, otp.Pid]] = {}
    #: When each child still timed is killed: its own spec's shutdown time (children of a
    #: DynamicSupervisor may differ, as in Elixir's); brutal_kill and infinity have none.
    deadlines: dict[otp.Ref, float] = {}
    now = trio.current_time()
    for spec, pid in entries:
        ref = otp.monitor(pid)
        waiting[ref] = (spec, pid)
        otp.exit(pid, otp.KILL if spec.shutdown == BRUTAL_KILL else otp.SHUTDOWN)
        if spec.shutdown not in (BRUTAL_KILL, INFINITY):
            deadlines[ref] = now + float(spec.shutdown)

    def is_ours(message: Any) -> bool:
        return message.__class__ is otp.Down and message.ref in waiting

    while waiting:
        timeout = None
        if deadlines:
            timeout = max(0.0, min(deadlines.values()) - trio.current_time())
        down = await otp.receive(is_ours, timeout=timeout, default=None)
        if down is None:
            now = trio.current_time()
            for ref, deadline in list(deadlines.items()):
                if deadline <= now:
                    del deadlines[ref]
                    otp.exit(waiting[ref][1], otp.KILL)
            continue
        deadlines.pop(down.ref, None)
        spec, pid = waiting.pop(down.ref)
        reason = await _unlink_flush(pid, down.reason)
        if not _shutdown_ok(spec, reason, spec.shutdown == BRUTAL_KILL):
            reports.report_error(reports.SHUTDOWN_ERROR, reason, sup_name, spec, pid)
