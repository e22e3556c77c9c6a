"""``Supervisor``: OTP's supervisor behaviour (``supervisor.erl``, OTP 25) on the otp runtime.

The engine is a ``GenServer`` that traps exits; this module holds its callbacks and the two
behaviours users start (``Supervisor`` and Elixir's ``DynamicSupervisor``). Its state is data
(``_children.py``: the children in start order, the restart window); the decisions are pure
functions (``_plan.py``); the restart engine carries them out (``_restart.py``: start children in
order, stop them in reverse, restart by strategy, give up past the intensity, retry a failed
restart through the mailbox), one child at a time (``_lifecycle.py``: start, ``shutdown`` then
``kill`` after the timeout). The child API calls are answered by ``_child_api.py``.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import otp

from . import _reports as reports
from ._child_api import (
    CountChildren,
    DeleteChild,
    GetChildspec,
    RestartChild,
    StartChild,
    TerminateChild,
    WhichChildren,
    count_children,
    delete_child,
    get_childspec,
    handle_count_children,
    handle_delete_child,
    handle_get_childspec,
    handle_observe,
    handle_restart_child,
    handle_start_child,
    handle_terminate_child,
    handle_which_children,
    restart_child,
    start_child,
    terminate_child,
    which_children,
)
from ._children import SHUTDOWN, Child, SupState
from ._lifecycle import shutdown_many
from ._observe import Observe
from ._restart import TryAgain, child_exited, start_children, terminate_children, try_again
from ._spec import (
    ChildSpecError,
    DynamicSupFlags,
    Strategy,
    SupFlags,
    SupFlagsError,
    check_startspec,
)

__all__ = ["DynamicSupervisor", "Supervisor"]


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
            state = SupState(
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
            return otp.Ok(SupState(sup_name, flags, "simple", template=specs[0]))
        state = SupState(sup_name, flags, "static")
        for spec in specs:
            state.children[spec.id] = Child(spec)
        failure = await start_children(state, list(state.children))
        if failure is not None:
            await terminate_children(state, list(reversed(state.children)))
            failed_id, reason = failure
            return otp.Stop(otp.Shutdown(("failed_to_start_child", failed_id, reason)))
        return otp.Ok(state)

    # -- stopping ----------------------------------------------------------------------------

    async def terminate(self, reason: Any, state: Any) -> None:
        if not isinstance(state, SupState):
            return
        if state.is_dynamic:
            entries = [
                (spec, key) for key, spec in state.dynamic.items() if key.__class__ is otp.Pid
            ]
            state.dynamic.clear()
            await shutdown_many(state.name, entries)
        else:
            await terminate_children(state, list(reversed(state.children)))

    # -- exits and retries -------------------------------------------------------------------

    async def handle_info(self, message: Any, state: SupState) -> Any:
        if message.__class__ is otp.Exit:
            if await child_exited(state, message.pid, message.reason) == SHUTDOWN:
                return otp.Stop(otp.SHUTDOWN, state)
            return otp.NoReply(state)
        reports.logger.error(
            "supervisor %r received an unexpected message: %r", state.name, message
        )
        return otp.NoReply(state)

    async def handle_cast(self, request: Any, state: SupState) -> Any:
        if request.__class__ is TryAgain:
            if await try_again(state, request.key) == SHUTDOWN:
                return otp.Stop(otp.SHUTDOWN, state)
            return otp.NoReply(state)
        reports.logger.error("supervisor %r received an unexpected cast: %r", state.name, request)
        return otp.NoReply(state)

    # -- the child API -----------------------------------------------------------------------

    async def handle_call(self, request: Any, from_: otp.From, state: SupState) -> Any:
        kind = request.__class__
        if kind is WhichChildren:
            return otp.Reply(handle_which_children(state), state)
        if kind is CountChildren:
            return otp.Reply(handle_count_children(state), state)
        if kind is Observe:
            return otp.Reply(handle_observe(state), state)
        if kind is StartChild:
            return otp.Reply(await handle_start_child(state, request.spec), state)
        if kind is TerminateChild:
            return otp.Reply(await handle_terminate_child(state, request.child), state)
        if kind is RestartChild:
            return otp.Reply(await handle_restart_child(state, request.child), state)
        if kind is DeleteChild:
            return otp.Reply(handle_delete_child(state, request.child), state)
        if kind is GetChildspec:
            return otp.Reply(handle_get_childspec(state, request.child), state)
        reports.logger.error("supervisor %r received an unexpected call: %r", state.name, request)
        return otp.Reply(("error", "unexpected_call"), state)


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
