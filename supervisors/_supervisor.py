"""``Supervisor``: OTP's supervisor behaviour (``supervisor.erl``, OTP 25) on the otp runtime.

The engine is a ``GenServer`` that traps exits. Its state is data (the children in start order,
the restart window); the decisions are pure functions (``_plan.py``); this module carries them
out: start children in order, stop them in reverse (``shutdown`` then ``kill`` after the
timeout), restart by strategy, give up past the intensity, retry a failed restart through the
mailbox (``try_again_restart``). Child API calls are ``GenServer`` calls with infinite timeout.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Iterable
from typing import Any, ClassVar

import attrs
import trio

import otp

from . import _reports as reports
from ._observe import ChildView, Observe, SupervisorView
from ._plan import PLANS, add_restart, now_seconds, restarts_in_window, should_restart
from ._spec import (
    BRUTAL_KILL,
    INFINITY,
    AutoShutdown,
    ChildSpec,
    ChildSpecError,
    ChildType,
    Restart,
    Strategy,
    SupFlags,
    SupFlagsError,
    check_intensity,
    check_period,
    check_significant,
    check_startspec,
)

#: ``which_children`` shows this instead of a pid while a failed restart is being retried.
RESTARTING = "restarting"

_OK = "ok"
_SHUTDOWN = "shutdown"


# -- runtime records --------------------------------------------------------------------------


@attrs.define(slots=True, eq=False)
class _Child:
    """A static child: its spec, its pid (None: not running) and whether a restart is pending."""

    spec: ChildSpec
    pid: otp.Pid | None = None
    restarting: bool = False


class _Restarting:
    """Key of a dynamic child whose restart failed and is being retried."""

    __slots__ = ("old",)

    def __init__(self, old: Any) -> None:
        self.old = old


class _Undefined:
    """Key of a dynamic child whose restart returned ignore (OTP 25 keeps it as ``undefined``)."""

    __slots__ = ()


@attrs.define(slots=True, eq=False)
class _State:
    name: Any
    flags: SupFlags
    mode: str  # "static", "simple" (simple_one_for_one) or "dynamic" (DynamicSupervisor)
    children: dict[Hashable, _Child] = attrs.Factory(dict)
    pids: dict[otp.Pid, Hashable] = attrs.Factory(dict)
    template: ChildSpec | None = None
    dynamic: dict[Any, ChildSpec] = attrs.Factory(dict)
    dynamic_restarts: int = 0
    restarts: tuple[tuple[int, int], ...] = ()
    max_children: int | None = None
    extra_arguments: tuple[Any, ...] = ()
    #: For observers; kept on restart only, so they cost nothing otherwise.
    restarts_total: int = 0
    last_restart_at: float | None = None
    last_restart_reason: Any = None
    child_restarts: dict[Hashable, int] = attrs.Factory(dict)  # (observer-remote)

    @property
    def is_dynamic(self) -> bool:
        return self.mode != "static"


# -- requests ---------------------------------------------------------------------------------


@attrs.frozen
class _StartChild:
    spec: Any


@attrs.frozen
class _TerminateChild:
    child: Any


@attrs.frozen
class _RestartChild:
    child: Any


@attrs.frozen
class _DeleteChild:
    child: Any


@attrs.frozen
class _GetChildspec:
    child: Any


@attrs.frozen
class _WhichChildren:
    pass


@attrs.frozen
class _CountChildren:
    pass


class _TryAgain:
    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


def _check_max_children(_flags: Any, _attr: Any, value: Any) -> None:
    if value is not None and not (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ):
        raise SupFlagsError(
            f"DynamicSupFlags.max_children must be None or an int >= 0 (got {value!r})",
            ("invalid_max_children", value),
        )


def _convert_extra_arguments(value: Any) -> tuple[Any, ...]:
    # Only a sequence: a str would be split into one-letter arguments.
    if not isinstance(value, list | tuple):
        raise SupFlagsError(
            "DynamicSupFlags.extra_arguments must be a list or tuple of arguments"
            f" (got {value!r}): wrap a single argument, as extra_arguments=(config,)",
            ("invalid_extra_arguments", value),
        )
    return tuple(value)


@attrs.frozen
class DynamicSupFlags:
    """The flags of a :class:`DynamicSupervisor` (Elixir's ``DynamicSupervisor.init/1``).

    Args:
        intensity: restarts allowed within ``period`` (Elixir's ``max_restarts``, default 3).
        period: the window in whole seconds (Elixir's ``max_seconds``, default 5).
        max_children: at most this many children (None: no limit); ``start_child`` beyond it
            returns ``("error", "max_children")``.
        extra_arguments: a list or tuple, prepended to the start arguments of every child.

    Raises:
        SupFlagsError: a field is invalid; ``reason`` is the error term.
    """

    intensity: int = attrs.field(default=3, validator=check_intensity)
    period: int = attrs.field(default=5, validator=check_period)
    max_children: int | None = attrs.field(default=None, validator=_check_max_children)
    extra_arguments: tuple[Any, ...] = attrs.field(default=(), converter=_convert_extra_arguments)


# -- starting and stopping one child ----------------------------------------------------------


async def _call_start(spec: ChildSpec) -> tuple[Any, ...]:
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


async def _shutdown(sup_name: Any, spec: ChildSpec, pid: otp.Pid) -> None:
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


async def _shutdown_many(sup_name: Any, entries: list[tuple[ChildSpec, otp.Pid]]) -> None:
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


def _check_dynamic_significant(spec: ChildSpec) -> None:
    """A DynamicSupervisor has no auto_shutdown, so no child of it can be significant."""
    if spec.significant:
        raise ChildSpecError(
            f"child {spec.id!r} is significant but a DynamicSupervisor has no auto_shutdown:"
            " drop significant=True, or put the child under a Supervisor whose"
            " SupFlags.auto_shutdown is 'any_significant' or 'all_significant'",
            ("bad_combination", [("auto_shutdown", "never"), ("significant", True)]),
        )


# -- the engine -------------------------------------------------------------------------------


class _Engine(otp.GenServer):
    """The generic supervisor: a GenServer whose callbacks run the behaviour's child specs."""

    # -- init --------------------------------------------------------------------------------

    async def init(self, behaviour: Any, args: tuple[Any, ...], name: Any) -> Any:
        otp.process_flag(trap_exit=True)
        me = otp.self()
        instance = behaviour()
        ret = instance.init(*args)
        if inspect.isawaitable(ret):
            ret = await ret
        if isinstance(ret, otp.Ignore):
            return otp.Ignore()
        if isinstance(ret, otp.Stop):
            return otp.Stop(ret.reason)
        sup_name = name if name is not None else me
        if isinstance(ret, DynamicSupFlags):
            flags = SupFlags(Strategy.ONE_FOR_ONE, ret.intensity, ret.period)
            state = _State(
                sup_name,
                flags,
                "dynamic",
                max_children=ret.max_children,
                extra_arguments=ret.extra_arguments,
            )
            return otp.Ok(state)
        if not (isinstance(ret, tuple) and len(ret) == 2):
            return otp.Stop(("bad_return", (behaviour.__qualname__, "init", ret)))
        raw_flags, raw_children = ret
        try:
            flags = SupFlags.from_term(raw_flags)
        except SupFlagsError as exc:
            return otp.Stop(("supervisor_data", exc.reason))
        try:
            specs = check_startspec(raw_children, flags.auto_shutdown)
        except ChildSpecError as exc:
            return otp.Stop(("start_spec", exc.reason))
        except TypeError:
            return otp.Stop(("start_spec", ("invalid_child_spec", raw_children)))
        if flags.strategy is Strategy.SIMPLE_ONE_FOR_ONE:
            if len(specs) != 1:
                return otp.Stop(("bad_start_spec", list(raw_children)))
            return otp.Ok(_State(sup_name, flags, "simple", template=specs[0]))
        state = _State(sup_name, flags, "static")
        for spec in specs:
            state.children[spec.id] = _Child(spec)
        failure = await self._start_children(state, list(state.children))
        if failure is not None:
            await self._terminate_children(state, list(reversed(state.children)))
            failed_id, reason = failure
            return otp.Stop(otp.Shutdown(("failed_to_start_child", failed_id, reason)))
        return otp.Ok(state)

    # -- starting ----------------------------------------------------------------------------

    async def _start_one(self, state: _State, spec: ChildSpec) -> tuple[Any, ...]:
        result = await _call_start(spec)
        if result[0] == _OK and result[1] is not None:
            reports.report_progress(state.name, spec, result[1])
        return result

    def _set_pid(self, state: _State, child: _Child, pid: otp.Pid | None) -> None:
        if child.pid is not None:
            state.pids.pop(child.pid, None)
        child.pid = pid
        child.restarting = False
        if pid is not None:
            state.pids[pid] = child.spec.id

    def _remove(self, state: _State, child: _Child) -> None:
        if child.pid is not None:
            state.pids.pop(child.pid, None)
        state.children.pop(child.spec.id, None)

    def _del_child(self, state: _State, child: _Child) -> None:
        """OTP's ``del_child``: a temporary child's spec goes, any other's pid is cleared."""
        if child.spec.restart is Restart.TEMPORARY:
            self._remove(state, child)
        else:
            self._set_pid(state, child, None)

    async def _start_children(self, state: _State, ids: Iterable[Hashable]) -> Any:
        """Start ``ids`` in order (OTP's ``start_children``); on the first failure, stop and
        return ``(id, reason)``. Ignored temporary children are dropped."""
        for child_id in ids:
            child = state.children.get(child_id)
            if child is None:
                continue
            result = await self._start_one(state, child.spec)
            if result[0] == _OK:
                if result[1] is None and child.spec.restart is Restart.TEMPORARY:
                    self._remove(state, child)
                else:
                    self._set_pid(state, child, result[1])
            else:
                reports.report_error(reports.START_ERROR, result[1], state.name, child.spec)
                return child_id, result[1]
        return None

    # -- stopping ----------------------------------------------------------------------------

    async def _terminate_child(self, state: _State, child: _Child) -> None:
        """OTP's ``do_terminate``: stop the child if it runs (a no-op otherwise)."""
        pid = child.pid
        if pid is not None:
            await _shutdown(state.name, child.spec, pid)

    async def _terminate_children(self, state: _State, ids: Iterable[Hashable]) -> None:
        """OTP's ``terminate_children``: stop ``ids`` one at a time, in the order given (reverse
        start order); temporary children are dropped, the others kept with no pid."""
        for child_id in list(ids):
            child = state.children.get(child_id)
            if child is None:
                continue
            await self._terminate_child(state, child)
            if child.spec.restart is Restart.TEMPORARY:
                self._remove(state, child)
            else:
                self._set_pid(state, child, None)

    async def terminate(self, reason: Any, state: Any) -> None:
        if not isinstance(state, _State):
            return
        if state.is_dynamic:
            entries = [
                (spec, key) for key, spec in state.dynamic.items() if key.__class__ is otp.Pid
            ]
            state.dynamic.clear()
            await _shutdown_many(state.name, entries)
        else:
            await self._terminate_children(state, list(reversed(state.children)))

    # -- restarting --------------------------------------------------------------------------

    async def handle_info(self, message: Any, state: _State) -> Any:
        if message.__class__ is otp.Exit:
            if await self._child_exited(state, message.pid, message.reason) == _SHUTDOWN:
                return otp.Stop(otp.SHUTDOWN, state)
            return otp.NoReply(state)
        reports.logger.error(
            "supervisor %r received an unexpected message: %r", state.name, message
        )
        return otp.NoReply(state)

    async def handle_cast(self, request: Any, state: _State) -> Any:
        if request.__class__ is _TryAgain:
            if await self._try_again(state, request.key) == _SHUTDOWN:
                return otp.Stop(otp.SHUTDOWN, state)
            return otp.NoReply(state)
        reports.logger.error("supervisor %r received an unexpected cast: %r", state.name, request)
        return otp.NoReply(state)

    async def _child_exited(self, state: _State, pid: otp.Pid, reason: Any) -> str:
        """OTP's ``restart_child/3`` + ``do_restart/3``; returns "ok" or "shutdown"."""
        if state.is_dynamic:
            spec = state.dynamic.pop(pid, None)
            if spec is None:
                return _OK
            if should_restart(spec.restart, reason):
                reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
                state.last_restart_reason = reason
                return await self._restart_dynamic(state, pid, spec)
            if otp.is_abnormal(reason):
                reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
            return self._auto_shutdown(state, spec)
        child_id = state.pids.get(pid)
        if child_id is None:
            return _OK
        child = state.children[child_id]
        spec = child.spec
        if should_restart(spec.restart, reason):
            reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
            state.last_restart_reason = reason
            state.child_restarts[child_id] = state.child_restarts.get(child_id, 0) + 1
            return await self._restart_static(state, child)
        if otp.is_abnormal(reason):
            reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
        self._del_child(state, child)
        return self._auto_shutdown(state, spec)

    def _auto_shutdown(self, state: _State, spec: ChildSpec) -> str:
        """OTP's ``do_auto_shutdown/2``, for a significant child that was not restarted."""
        auto = state.flags.auto_shutdown
        if auto is AutoShutdown.NEVER or not spec.significant:
            return _OK
        if auto is AutoShutdown.ANY_SIGNIFICANT:
            return _SHUTDOWN
        if state.is_dynamic:
            running = any(
                s.significant for key, s in state.dynamic.items() if key.__class__ is not _Undefined
            )
        else:
            running = any(
                c.spec.significant and (c.pid is not None or c.restarting)
                for c in state.children.values()
            )
        return _OK if running else _SHUTDOWN

    def _add_restart(self, state: _State) -> bool:
        flags = state.flags
        now = trio.current_time()
        allowed, state.restarts = add_restart(
            state.restarts, now_seconds(now), flags.intensity, flags.period
        )
        state.restarts_total += 1
        state.last_restart_at = now
        return allowed

    async def _restart_static(self, state: _State, child: _Child) -> str:
        """OTP's ``restart/2`` for one_for_one, one_for_all and rest_for_one."""
        if not self._add_restart(state):
            reports.report_error(
                reports.SHUTDOWN, reports.REACHED_MAX_RESTART_INTENSITY, state.name, child.spec
            )
            self._del_child(state, child)
            return _SHUTDOWN
        failed_id = child.spec.id
        plan = PLANS[state.flags.strategy](list(state.children), failed_id)
        self._set_pid(state, child, None)
        await self._terminate_children(state, plan.terminate)
        for child_id in plan.start:
            other = state.children.get(child_id)
            if other is not None:
                self._set_pid(state, other, None)
        failure = await self._start_children(state, plan.start)
        if failure is not None:
            retry = state.children[failure[0]]
            retry.restarting = True
            otp.cast(otp.self(), _TryAgain(failure[0]))
        return _OK

    async def _restart_dynamic(self, state: _State, old_key: Any, spec: ChildSpec) -> str:
        """OTP's ``restart/2`` for simple_one_for_one (and DynamicSupervisor)."""
        if not self._add_restart(state):
            reports.report_error(
                reports.SHUTDOWN, reports.REACHED_MAX_RESTART_INTENSITY, state.name, spec
            )
            return _SHUTDOWN
        result = await self._start_one(state, spec)
        if result[0] == _OK:
            if result[1] is not None:
                state.dynamic[result[1]] = spec
            elif state.mode == "simple":
                # OTP 25 stores the ignored restart as an 'undefined' entry; Elixir drops it.
                state.dynamic[_Undefined()] = spec
            return _OK
        reports.report_error(reports.START_ERROR, result[1], state.name, spec)
        key = _Restarting(old_key)
        state.dynamic[key] = spec
        state.dynamic_restarts += 1
        otp.cast(otp.self(), _TryAgain(key))
        return _OK

    async def _try_again(self, state: _State, key: Any) -> str:
        """OTP's ``try_again_restart``: retry a failed restart (counted by the intensity)."""
        if state.is_dynamic:
            spec = state.dynamic.pop(key, None) if key.__class__ is _Restarting else None
            if spec is None:
                return _OK
            state.dynamic_restarts -= 1
            return await self._restart_dynamic(state, key.old, spec)
        child = state.children.get(key)
        if child is None or not child.restarting:
            return _OK
        return await self._restart_static(state, child)

    # -- the child API -----------------------------------------------------------------------

    async def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        kind = request.__class__
        if kind is _WhichChildren:
            return otp.Reply(self._which_children(state), state)
        if kind is _CountChildren:
            return otp.Reply(self._count_children(state), state)
        if kind is Observe:
            return otp.Reply(self._observe(state), state)
        if kind is _StartChild:
            return otp.Reply(await self._handle_start_child(state, request.spec), state)
        if kind is _TerminateChild:
            return otp.Reply(await self._handle_terminate_child(state, request.child), state)
        if kind is _RestartChild:
            return otp.Reply(await self._handle_restart_child(state, request.child), state)
        if kind is _DeleteChild:
            return otp.Reply(self._handle_delete_child(state, request.child), state)
        if kind is _GetChildspec:
            return otp.Reply(self._handle_get_childspec(state, request.child), state)
        reports.logger.error("supervisor %r received an unexpected call: %r", state.name, request)
        return otp.Reply(("error", "unexpected_call"), state)

    def _which_children(self, state: _State) -> list[tuple[Any, Any, ChildType, tuple[str, ...]]]:
        if state.is_dynamic:
            undefined, pids, restarting = [], [], []
            for key, spec in state.dynamic.items():
                if key.__class__ is otp.Pid:
                    pids.append((key, spec))
                elif key.__class__ is _Restarting:
                    restarting.append(spec)
                else:
                    undefined.append(spec)
            pids.sort(key=lambda entry: entry[0])
            rows: list[tuple[Any, Any, ChildType, tuple[str, ...]]] = []
            rows.extend((None, None, s.type, s.modules) for s in undefined)
            rows.extend((None, pid, s.type, s.modules) for pid, s in pids)
            rows.extend((None, RESTARTING, s.type, s.modules) for s in restarting)
            return rows
        return [
            (
                c.spec.id,
                RESTARTING if c.restarting else c.pid,
                c.spec.type,
                c.spec.modules,
            )
            for c in reversed(state.children.values())
        ]

    def _observe(self, state: _State) -> SupervisorView:
        if state.is_dynamic:
            children = [
                ChildView(
                    id=None,
                    pid=key if key.__class__ is otp.Pid else _dynamic_placeholder(key),
                    type=spec.type,
                    restart=spec.restart,
                )
                for key, spec in state.dynamic.items()
            ]
        else:
            children = [
                ChildView(
                    id=c.spec.id,
                    pid=RESTARTING if c.restarting else c.pid,
                    type=c.spec.type,
                    restart=c.spec.restart,
                    restarts=state.child_restarts.get(c.spec.id, 0),
                )
                for c in state.children.values()
            ]
        flags = state.flags
        return SupervisorView(
            pid=otp.self(),
            name=state.name if not isinstance(state.name, otp.Pid) else None,
            strategy=flags.strategy if state.mode != "dynamic" else None,
            intensity=flags.intensity,
            period=flags.period,
            children=tuple(children),
            restarts_in_window=restarts_in_window(
                state.restarts, now_seconds(trio.current_time()), flags.period
            ),
            restarts_total=state.restarts_total,
            last_restart_at=state.last_restart_at,
            last_restart_reason=state.last_restart_reason,
        )

    def _count_children(self, state: _State) -> dict[str, int]:
        if state.mode == "simple":
            assert state.template is not None
            size = len(state.dynamic)
            active = size - state.dynamic_restarts
            is_sup = state.template.type is ChildType.SUPERVISOR
            return {
                "specs": 1,
                "active": active,
                "supervisors": size if is_sup else 0,
                "workers": 0 if is_sup else size,
            }
        if state.mode == "dynamic":
            specs = list(state.dynamic.values())
            active = sum(1 for key in state.dynamic if key.__class__ is otp.Pid)
        else:
            specs = [c.spec for c in state.children.values()]
            active = sum(
                1
                for c in state.children.values()
                if c.pid is not None and otp.process_info(c.pid) is not None
            )
        supervisors = sum(1 for s in specs if s.type is ChildType.SUPERVISOR)
        return {
            "specs": len(specs),
            "active": active,
            "supervisors": supervisors,
            "workers": len(specs) - supervisors,
        }

    async def _handle_start_child(self, state: _State, raw: Any) -> Any:
        if state.mode == "simple":
            assert state.template is not None
            if not isinstance(raw, list | tuple):
                return ("error", ("bad_extra_args", raw))
            spec = state.template.with_args(raw)
            result = await _call_start(spec)
            if result[0] == _OK and result[1] is not None:
                state.dynamic[result[1]] = spec
            return result
        try:
            spec = ChildSpec.from_map(raw)
            if state.mode == "dynamic":
                _check_dynamic_significant(spec)
            check_significant(spec, state.flags.auto_shutdown)
        except ChildSpecError as exc:
            return ("error", exc.reason)
        except TypeError:
            # A bad spec must be an error value: raising here would crash the supervisor.
            return ("error", ("invalid_child_spec", raw))
        if state.mode == "dynamic":
            if state.max_children is not None and len(state.dynamic) >= state.max_children:
                return ("error", "max_children")
            spec = spec.with_args(state.extra_arguments, prepend=True)
            result = await self._start_one(state, spec)
            if result[0] == _OK:
                if result[1] is None:
                    return "ignore"
                state.dynamic[result[1]] = spec
            return result
        existing = state.children.get(spec.id)
        if existing is not None:
            if existing.pid is not None:
                return ("error", ("already_started", existing.pid))
            return ("error", "already_present")
        result = await self._start_one(state, spec)
        if result[0] != _OK:
            return ("error", (result[1], spec))
        if result[1] is None and spec.restart is Restart.TEMPORARY:
            return result
        child = _Child(spec)
        state.children[spec.id] = child
        self._set_pid(state, child, result[1])
        return result

    def _find_static(self, state: _State, key: Any) -> _Child | None:
        if key.__class__ is otp.Pid:
            child_id = state.pids.get(key)
            return state.children.get(child_id) if child_id is not None else None
        try:
            return state.children.get(key)
        except TypeError:
            return None

    async def _handle_terminate_child(self, state: _State, key: Any) -> Any:
        if state.is_dynamic:
            if key.__class__ is not otp.Pid:
                return ("error", "simple_one_for_one" if state.mode == "simple" else "not_found")
            spec = state.dynamic.get(key)
            if spec is None:
                return self._terminate_absent_dynamic(state, key)
            await _shutdown(state.name, spec, key)
            state.dynamic.pop(key, None)
            return _OK
        child = self._find_static(state, key)
        if child is None:
            return ("error", "not_found")
        await self._terminate_child(state, child)
        self._del_child(state, child)
        return _OK

    def _terminate_absent_dynamic(self, state: _State, pid: otp.Pid) -> Any:
        """``terminate_child`` of a pid that is not a running dynamic child. If its restart is
        being retried (OTP's ``restarting(Pid)``), drop it: the queued retry then finds
        nothing. simple_one_for_one answers ok for a pid no longer alive (OTP 25's
        ``find_child``); DynamicSupervisor answers not_found (Elixir's)."""
        if state.dynamic_restarts:
            for key in state.dynamic:
                if key.__class__ is _Restarting and key.old == pid:
                    del state.dynamic[key]
                    state.dynamic_restarts -= 1
                    return _OK
        if state.mode == "simple" and otp.process_info(pid) is None:
            return _OK
        return ("error", "not_found")

    async def _handle_restart_child(self, state: _State, key: Any) -> Any:
        if state.is_dynamic:
            return ("error", "simple_one_for_one")
        child = self._find_static(state, key)
        if child is None or key.__class__ is otp.Pid:
            return ("error", "not_found")
        if child.restarting:
            return ("error", RESTARTING)
        if child.pid is not None:
            return ("error", "running")
        result = await self._start_one(state, child.spec)
        if result[0] == _OK:
            self._set_pid(state, child, result[1])
        return result

    def _handle_delete_child(self, state: _State, key: Any) -> Any:
        if state.is_dynamic:
            return ("error", "simple_one_for_one")
        child = self._find_static(state, key)
        if child is None or key.__class__ is otp.Pid:
            return ("error", "not_found")
        if child.restarting:
            return ("error", RESTARTING)
        if child.pid is not None:
            return ("error", "running")
        self._remove(state, child)
        return _OK

    def _handle_get_childspec(self, state: _State, key: Any) -> Any:
        if state.is_dynamic:
            spec = state.dynamic.get(key) if key.__class__ is otp.Pid else None
            if spec is None:
                return ("error", "not_found")
            return (_OK, state.template if state.template is not None else spec)
        child = self._find_static(state, key)
        if child is None:
            return ("error", "not_found")
        return (_OK, child.spec)


# -- client API -------------------------------------------------------------------------------


async def start_child(supervisor: Any, spec: Any) -> Any:
    """Add a child and start it (OTP's ``supervisor:start_child/2``).

    For a static supervisor ``spec`` is a :class:`ChildSpec` (or its map form) and the child
    goes last in the start order (so it is stopped first). For simple_one_for_one ``spec`` is a
    list (or tuple) of extra arguments appended to the template's; anything else is answered
    ``("error", ("bad_extra_args", spec))``. For a :class:`DynamicSupervisor` it is a spec whose
    arguments get the supervisor's ``extra_arguments`` prepended.

    Returns:
        ``("ok", pid)``, ``("ok", pid, info)``, ``("ok", None)`` (the start returned ignore;
        ``"ignore"`` from a DynamicSupervisor), ``("error", ("already_started", pid))``,
        ``("error", "already_present")``, ``("error", (reason, spec))`` (start failed; for
        simple_one_for_one ``("error", reason)``), ``("error", "max_children")`` or
        ``("error", bad_spec_reason)``.

    Raises:
        otp.CallError: the supervisor is not alive (``"noproc"``) or died during the call.
    """
    return await otp.call(supervisor, _StartChild(spec), timeout=None)


async def terminate_child(supervisor: Any, child: Any) -> Any:
    """Stop a child by id (or pid; by pid only for dynamic supervisors); its spec is kept
    (a temporary child's is dropped) and it is not restarted. A dynamic child whose restart is
    being retried is found by its old pid, and its retries stop.

    Returns ``"ok"`` (also if it was not running; for simple_one_for_one, also for a pid no
    longer alive), ``("error", "not_found")`` or ``("error", "simple_one_for_one")`` (an id
    given to a simple_one_for_one supervisor).
    """
    return await otp.call(supervisor, _TerminateChild(child), timeout=None)


async def restart_child(supervisor: Any, child_id: Any) -> Any:
    """Start a stopped child again: ``("ok", pid)``, ``("ok", pid, info)``, ``("ok", None)``,
    ``("error", "running")``, ``("error", "restarting")``, ``("error", "not_found")``,
    ``("error", "simple_one_for_one")`` or ``("error", reason)`` if its start fails."""
    return await otp.call(supervisor, _RestartChild(child_id), timeout=None)


async def delete_child(supervisor: Any, child_id: Any) -> Any:
    """Forget a stopped child's spec: ``"ok"``, ``("error", "running")``,
    ``("error", "restarting")``, ``("error", "not_found")`` or
    ``("error", "simple_one_for_one")``."""
    return await otp.call(supervisor, _DeleteChild(child_id), timeout=None)


async def get_childspec(supervisor: Any, child: Any) -> Any:
    """``("ok", ChildSpec)`` for a child id (or pid), else ``("error", "not_found")``."""
    return await otp.call(supervisor, _GetChildspec(child), timeout=None)


async def which_children(supervisor: Any) -> list[tuple[Any, Any, ChildType, tuple[str, ...]]]:
    """One ``(id, pid | "restarting" | None, type, modules)`` per child, newest first (OTP's
    order). ``None`` is OTP's ``undefined`` (not running); dynamic children have id None."""
    return await otp.call(supervisor, _WhichChildren(), timeout=None)


async def count_children(supervisor: Any) -> dict[str, int]:
    """``{"specs": n, "active": n, "supervisors": n, "workers": n}`` (OTP's order); active
    counts children whose process is alive."""
    return await otp.call(supervisor, _CountChildren(), timeout=None)


def _dynamic_placeholder(key: Any) -> Any:
    return RESTARTING if key.__class__ is _Restarting else None


class Supervisor:
    """The supervisor behaviour. Subclass it and override :meth:`init`, or start the base class
    with ``(flags, children)`` directly::

        pid = await Supervisor.start_link(SupFlags(strategy="one_for_all"), [
            ChildSpec("db", (Db.start_link, "db.sqlite")),
            ChildSpec("web", Web),
        ])

    A supervisor is a child like any other: ``ChildSpec("sub", MySup)`` nests one (its type
    defaults to ``supervisor`` and its shutdown to infinity).
    """

    _supervisor_behaviour: ClassVar[bool] = True

    # ======================================== client side ====================================

    @classmethod
    async def start_link(cls, *args: Any, name: str | None = None) -> otp.Pid:
        """Start the supervisor linked to the caller and every child in order; return its pid.

        Raises:
            otp.StartError: a child failed to start (reason
                ``otp.Shutdown(("failed_to_start_child", id, reason))``; the children already
                started were stopped in reverse order), the flags or specs are invalid
                (``("supervisor_data", ...)`` / ``("start_spec", ...)``), ``init`` returned
                ``Stop(reason)`` or raised, or ``name`` is taken.
            otp.StartIgnored: ``init`` returned ``otp.Ignore()``.
        """
        return await _Engine.start_link(cls, args, name, name=name)

    @classmethod
    async def start(cls, *args: Any, name: str | None = None) -> otp.Pid:
        """Like :meth:`start_link`, not linked to the caller."""
        return await _Engine.start(cls, args, name, name=name)

    start_child = staticmethod(start_child)
    terminate_child = staticmethod(terminate_child)
    restart_child = staticmethod(restart_child)
    delete_child = staticmethod(delete_child)
    get_childspec = staticmethod(get_childspec)
    which_children = staticmethod(which_children)
    count_children = staticmethod(count_children)

    # ======================================== callbacks ======================================

    def init(self, *args: Any) -> Any:
        """Return ``(flags, children)``, ``otp.Ignore()`` or ``otp.Stop(reason)``; may be async.

        ``flags`` is a :class:`SupFlags` (or its map or tuple form); ``children`` a list of
        :class:`ChildSpec` (or their map form). The default takes them as its two arguments.
        """
        if len(args) != 2:
            raise TypeError(
                f"{type(self).__qualname__}.init() takes (flags, children) unless overridden"
                f" (got {len(args)} arguments)"
            )
        return args[0], args[1]


class DynamicSupervisor:
    """Elixir's ``DynamicSupervisor``: starts with no children; children are added with
    ``start_child(sup, spec)`` and removed with ``terminate_child(sup, pid)``.

    Each child is restarted by its own spec's ``restart`` (one_for_one), failed restarts are
    retried through the mailbox, and the restart intensity (default 3 in 5 s) applies to all
    of them. On shutdown every child is stopped concurrently. Subclass it and override
    :meth:`init`, or start the base class with keyword options::

        pool = await DynamicSupervisor.start_link(max_children=8, extra_arguments=(config,))
    """

    _supervisor_behaviour: ClassVar[bool] = True

    @classmethod
    async def start_link(cls, *args: Any, name: str | None = None, **options: Any) -> otp.Pid:
        """Start it linked to the caller. ``options`` go to :meth:`init` as keywords.

        Raises:
            otp.StartError / otp.StartIgnored: as :meth:`Supervisor.start_link`.
        """
        return await _Engine.start_link(_Options(cls, options), args, name, name=name)

    @classmethod
    async def start(cls, *args: Any, name: str | None = None, **options: Any) -> otp.Pid:
        """Like :meth:`start_link`, not linked to the caller."""
        return await _Engine.start(_Options(cls, options), args, name, name=name)

    @staticmethod
    async def start_child(supervisor: Any, spec: Any) -> Any:
        """Start a child from ``spec`` (with ``extra_arguments`` prepended to its arguments).

        Returns ``("ok", pid)``, ``("ok", pid, info)``, ``"ignore"``,
        ``("error", "max_children")`` or ``("error", reason)``.
        """
        return await start_child(supervisor, spec)

    @staticmethod
    async def terminate_child(supervisor: Any, pid: otp.Pid) -> Any:
        """Stop the child ``pid`` (or, by its old pid, a child whose restart is being retried):
        ``"ok"`` or ``("error", "not_found")``."""
        return await terminate_child(supervisor, pid)

    which_children = staticmethod(which_children)
    count_children = staticmethod(count_children)

    def init(self, *args: Any, **options: Any) -> Any:
        """Return :class:`DynamicSupFlags` (or ``otp.Ignore()``); may be async. The default
        builds them from the keyword options of ``start_link``."""
        if args:
            raise TypeError(
                f"{type(self).__qualname__}.init() takes keyword options unless overridden"
                f" (got positional arguments {args!r})"
            )
        return DynamicSupFlags(**options)


class _Options:
    """Calls a DynamicSupervisor's ``init`` with its keyword options (the engine's behaviour)."""

    __qualname__ = "DynamicSupervisor"

    def __init__(self, cls: type[DynamicSupervisor], options: dict[str, Any]) -> None:
        self._cls = cls
        self._options = options

    def __call__(self) -> Any:
        instance = self._cls()
        options = self._options

        def init(*args: Any) -> Any:
            return instance.init(*args, **options)

        return _Bound(init)


class _Bound:
    __slots__ = ("init",)

    def __init__(self, init: Any) -> None:
        self.init = init
