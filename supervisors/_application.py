"""``Application`` and the application controller (OTP's ``application`` module).

An application is a root supervisor plus configuration (``env``). The controller is a process
registered as ``application_controller`` (started on first use, one per node): it starts each
application's root supervisor linked to itself, stops them on request (``shutdown``, waiting for
the whole tree) and watches them. When an application's root ends on its own, the controller
applies OTP's restart types: ``temporary`` is only reported; ``transient`` stops the node for any
reason but ``normal`` (a root supervisor that gives up exits ``shutdown``, which counts);
``permanent`` stops the node for any reason. "Stopping the node" means: the
controller stops every other application in reverse start order and :func:`wait_node_stop`
returns, so the node's boot can exit.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

import otp

from . import _reports as reports
from ._spec import Restart, SupervisorError
from ._supervisor import Supervisor

CONTROLLER_NAME = "application_controller"


class ApplicationError(SupervisorError):
    """An application could not be started or stopped; ``reason`` is OTP's error term."""


def _check_name(_app: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ApplicationError(
            f"Application.name must be a non-empty str (got {value!r})", ("bad_name", value)
        )


def _convert_root(value: Any) -> tuple[Any, ...]:
    start_link = getattr(value, "start_link", None)
    if isinstance(value, type) and callable(start_link):
        return (start_link,)
    if isinstance(value, tuple) and value and callable(value[0]):
        return value
    if isinstance(value, tuple) and len(value) == 2 and not callable(value[0]):
        return (Supervisor.start_link, value[0], list(value[1]))
    raise ApplicationError(
        "Application.root must be a Supervisor class, a tuple (start_fn, *args) that starts the"
        f" root supervisor linked to the caller, or (flags, children) (got {value!r})",
        ("bad_root", value),
    )


def _convert_applications(value: Any) -> tuple[str, ...]:
    # A str is iterable: "db" would become the dependencies ("d", "b").
    if isinstance(value, list | tuple) and all(isinstance(name, str) for name in value):
        return tuple(value)
    raise ApplicationError(
        "Application.applications must be a list of application names (str)"
        f" (got {value!r}): write applications=['db'] for one dependency",
        ("bad_applications", value),
    )


def _to_restart_type(value: Any) -> Restart:
    try:
        return Restart(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in Restart)
        raise ApplicationError(
            f"start_application's restart_type must be one of {choices} (got {value!r})",
            ("bad_restart_type", value),
        ) from None


def _freeze_env(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ApplicationError(
            f"Application.env must be a mapping of str keys (got {value!r})", ("bad_env", value)
        )
    return types.MappingProxyType(dict(value))


@attrs.frozen
class Application:
    """An OTP application: a named root supervisor plus its configuration.

    Args:
        name: Unique on the node.
        root: How to start the root supervisor, linked to the caller: a :class:`Supervisor`
            subclass (its ``start_link()``), ``(start_fn, *args)`` (returning the root's pid,
            ``("ok", pid[, info])`` or ``("error", reason)``) or ``(flags, children)`` for
            ``Supervisor.start_link(flags, children)``.
        env: Configuration, read with :func:`get_env` while the application runs.
        applications: Names of applications that must be running before this one starts (a
            list or tuple of str).
        description, version: Shown by :func:`which_applications`.
        observer_view: What the application shows an observer besides its tree
            (:func:`observe`): a function of no arguments, sync or async, returning a dict of
            plain values. It runs in the observer's process, so it should read state cheaply
            (an ETS table, a call with a short timeout), not wait on work.
        ready: Whether the application is ready to serve, past having started (a readiness
            probe such as ``/readyz``; :func:`check_readiness`): a function of no arguments,
            sync or async, returning None when ready or a short sentence saying what it
            waits for. None: ready once started.
    """

    name: str = attrs.field(validator=_check_name)
    root: tuple[Any, ...] = attrs.field(converter=_convert_root)
    env: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_env, kw_only=True)
    applications: tuple[str, ...] = attrs.field(
        default=(), converter=_convert_applications, kw_only=True
    )
    description: str = attrs.field(default="", kw_only=True)
    version: str = attrs.field(default="", kw_only=True)
    observer_view: Callable[[], Any] | None = attrs.field(default=None, kw_only=True)
    ready: Callable[[], Any] | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class ApplicationExit:
    """What :func:`wait_node_stop` returns: the application whose end stops the node."""

    application: str
    reason: Any
    restart_type: Restart


@attrs.define(eq=False)
class _Running:
    app: Application
    restart_type: Restart
    pid: otp.Pid


@attrs.define(eq=False)
class _ControllerState:
    running: dict[str, _Running] = attrs.Factory(dict)
    node_stop: ApplicationExit | None = None
    waiters: list[otp.From] = attrs.Factory(list)


_ENV: trio.lowlevel.RunVar[dict[str, Mapping[str, Any]]] = trio.lowlevel.RunVar("supervisors_env")
_ROOTS: trio.lowlevel.RunVar[dict[str, _Running]] = trio.lowlevel.RunVar("supervisors_roots")


def _env_table() -> dict[str, Mapping[str, Any]]:
    try:
        return _ENV.get()
    except LookupError:
        table: dict[str, Mapping[str, Any]] = {}
        _ENV.set(table)
        return table


def _roots_table() -> dict[str, _Running]:
    try:
        return _ROOTS.get()
    except LookupError:
        table: dict[str, _Running] = {}
        _ROOTS.set(table)
        return table


async def _start_root(app: Application) -> Any:
    fn, *args = app.root
    try:
        ret = fn(*args)
        if inspect.isawaitable(ret):
            ret = await ret
    except otp.StartIgnored:
        return ("error", "ignore")
    except otp.StartError as exc:
        return ("error", exc.reason)
    except Exception as exc:
        return ("error", otp.Crash(exc))
    if isinstance(ret, otp.Pid):
        return ("ok", ret)
    if isinstance(ret, tuple) and ret:
        # The forms ChildSpec accepts (OTP's {ok, Pid} | {ok, Pid, State} | {error, Reason}).
        if ret[0] == "ok" and len(ret) in (2, 3) and isinstance(ret[1], otp.Pid):
            return ("ok", ret[1])
        if ret[0] == "error" and len(ret) == 2:
            return ret
    # A tree started but returned in another form would run linked to the controller and
    # owned by no application: stop it before failing the start.
    if isinstance(ret, tuple | list):
        for pid in ret:
            if isinstance(pid, otp.Pid):
                await _stop_root(pid)
    return ("error", ("bad_return", ret))


async def _stop_root(pid: otp.Pid) -> Any:
    ref = otp.monitor(pid)
    otp.exit(pid, otp.SHUTDOWN)
    down = await otp.receive(lambda m: m.__class__ is otp.Down and m.ref == ref)
    otp.unlink(pid)
    await otp.receive(lambda m: m.__class__ is otp.Exit and m.pid == pid, timeout=0, default=None)
    return down.reason


class _Controller(otp.GenServer):
    """The application controller: one per node, registered as ``application_controller``."""

    def init(self) -> Any:
        otp.process_flag(trap_exit=True)
        return otp.Ok(_ControllerState())

    async def handle_call(self, request: Any, from_: otp.From, state: _ControllerState) -> Any:
        op = request[0]
        if op == "start":
            return otp.Reply(await self._start(state, request[1], request[2]), state)
        if op == "stop":
            return otp.Reply(await self._stop(state, request[1]), state)
        if op == "stop_all":
            for name in reversed(list(state.running)):
                await self._stop(state, name)
            return otp.Reply("ok", state)
        if op == "which":
            rows = [
                (r.app.name, r.app.description, r.app.version)
                for r in reversed(state.running.values())
            ]
            return otp.Reply(rows, state)
        if op == "wait_node_stop":
            if state.node_stop is not None:
                return otp.Reply(state.node_stop, state)
            state.waiters.append(from_)
            return otp.NoReply(state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    async def _start(self, state: _ControllerState, app: Application, restart: Restart) -> Any:
        if app.name in state.running:
            return ("error", ("already_started", app.name))
        for dependency in app.applications:
            if dependency not in state.running:
                return ("error", ("not_started", dependency))
        env = _env_table()
        env[app.name] = app.env
        result = await _start_root(app)
        if result[0] != "ok":
            env.pop(app.name, None)
            return result
        running = state.running[app.name] = _Running(app, restart, result[1])
        _roots_table()[app.name] = running
        reports.logger.info(
            "application %s started (type %s)",
            app.name,
            restart,
            extra={"otp_report": {"application": app.name, "started_at": otp.self()}},
        )
        return "ok"

    async def _stop(self, state: _ControllerState, name: str) -> Any:
        running = state.running.pop(name, None)
        if running is None:
            return ("error", ("not_started", name))
        _roots_table().pop(name, None)
        await _stop_root(running.pid)
        _env_table().pop(name, None)
        self._report_exit(name, "stopped", running.restart_type)
        return "ok"

    def _report_exit(self, name: str, reason: Any, restart: Restart) -> None:
        reports.logger.info(
            "application %s exited: %s (type %s)",
            name,
            otp.format_reason(reason),
            restart,
            extra={"otp_report": {"application": name, "exited": reason, "type": str(restart)}},
        )

    async def handle_info(self, message: Any, state: _ControllerState) -> Any:
        if message.__class__ is not otp.Exit:
            return otp.NoReply(state)
        name = next((n for n, r in state.running.items() if r.pid == message.pid), None)
        if name is None:
            return otp.NoReply(state)
        running = state.running.pop(name)
        _env_table().pop(name, None)
        _roots_table().pop(name, None)
        reason = message.reason
        self._report_exit(name, reason, running.restart_type)
        restart = running.restart_type
        if restart is Restart.PERMANENT or (
            # OTP's application_controller spares a transient application only for normal.
            restart is Restart.TRANSIENT and reason != otp.NORMAL
        ):
            if state.node_stop is None:
                reports.logger.error(
                    "application %s (%s) exited with reason %s: stopping the node",
                    name,
                    restart,
                    otp.format_reason(reason),
                )
                for other in reversed(list(state.running)):
                    await self._stop(state, other)
                state.node_stop = ApplicationExit(name, reason, restart)
                for waiter in state.waiters:
                    otp.reply(waiter, state.node_stop)
                state.waiters.clear()
        return otp.NoReply(state)

    async def terminate(self, reason: Any, state: _ControllerState) -> None:
        for name in reversed(list(state.running)):
            await self._stop(state, name)


async def _controller() -> otp.Pid:
    pid = otp.whereis(CONTROLLER_NAME)
    if pid is not None:
        return pid
    try:
        return await _Controller.start(name=CONTROLLER_NAME)
    except otp.StartError as exc:
        reason = exc.reason
        if isinstance(reason, tuple) and reason[0] == "already_started":
            return reason[1]
        raise


async def start_application(app: Application, restart_type: Any = Restart.TEMPORARY) -> None:
    """Start ``app``'s root supervisor under the application controller (OTP's
    ``application:start/2``). Returns once the whole tree has started.

    Args:
        restart_type: ``permanent`` (its end, for any reason, stops the node), ``transient``
            (its end for any reason but ``normal`` stops the node, ``shutdown`` included) or
            ``temporary`` (default; its end is reported).

    Raises:
        ApplicationError: ``("bad_restart_type", value)``, ``("already_started", name)``,
            ``("not_started", dependency)`` or the root supervisor's start failure (``reason``
            is ``("error", reason)``'s reason; a root that started but returned something other
            than its pid is stopped first, and ``reason`` is ``("bad_return", value)``).
    """
    restart = _to_restart_type(restart_type)
    result = await otp.call(await _controller(), ("start", app, restart), timeout=None)
    if result != "ok":
        raise ApplicationError(
            f"application {app.name!r} did not start: {otp.format_reason(result[1])}", result[1]
        )


async def stop_application(name: str) -> None:
    """Stop a running application: its root supervisor gets ``shutdown`` and the whole tree is
    stopped in reverse start order before this returns. The node keeps running.

    Raises:
        ApplicationError: ``("not_started", name)``.
    """
    result = await otp.call(await _controller(), ("stop", name), timeout=None)
    if result != "ok":
        raise ApplicationError(f"application {name!r} is not running", result[1])


async def stop_all_applications() -> None:
    """Stop every running application, in reverse start order (a node's orderly shutdown)."""
    if otp.whereis(CONTROLLER_NAME) is None:
        await trio.lowlevel.checkpoint()
        return
    await otp.call(CONTROLLER_NAME, ("stop_all",), timeout=None)


async def which_applications() -> list[tuple[str, str, str]]:
    """``(name, description, version)`` of each running application, newest first."""
    if otp.whereis(CONTROLLER_NAME) is None:
        await trio.lowlevel.checkpoint()
        return []
    return await otp.call(CONTROLLER_NAME, ("which",), timeout=None)


async def wait_node_stop() -> ApplicationExit:
    """Wait until an application's end requires the node to stop (a permanent application
    ended, or a transient one ended with any reason but ``normal``); by then the controller has
    stopped the other applications in reverse start order. Returns at once if that already
    happened.

    Cancellation leaves nothing behind but a dropped reply.
    """
    return await otp.call(await _controller(), ("wait_node_stop",), timeout=None)


def application_supervisor(application: str) -> otp.Pid | None:
    """The pid of a running application's root supervisor, or None (no controller call)."""
    running = _roots_table().get(application)
    return running.pid if running is not None else None


def running_applications() -> list[tuple[Application, otp.Pid]]:
    """Each running application and its root's pid, in start order (no controller call)."""
    return [(running.app, running.pid) for running in _roots_table().values()]


def application_of(pid: otp.Pid | None = None) -> str | None:
    """The running application whose supervision tree ``pid`` (default: the caller) runs in,
    or None (OTP's ``application:get_application/1``, found through the process's parents as
    OTP finds it through the group leader). Never raises: outside a node or a process, None.
    """
    try:
        roots = {running.pid: name for name, running in _roots_table().items()}
        if not roots:
            return None
        if pid is None:
            pid = otp.self()
    except (RuntimeError, otp.OtpError):  # (no trio run, no node, not a process)
        return None
    for _ in range(_MAX_ANCESTORS):
        name = roots.get(pid)
        if name is not None:
            return name
        info = otp.process_info(pid)
        if info is None or info.parent is None:
            return None
        pid = info.parent
    return None


#: How far up its parents ``application_of`` looks (trees are a few levels deep).
_MAX_ANCESTORS = 64


def get_env(application: str, key: str, default: Any = None) -> Any:
    """The value of ``key`` in a running application's ``env`` (OTP's
    ``application:get_env/3``), or ``default``."""
    return _env_table().get(application, {}).get(key, default)


def get_all_env(application: str) -> Mapping[str, Any]:
    """A running application's whole ``env`` (empty if it is not running)."""
    return _env_table().get(application, types.MappingProxyType({}))
