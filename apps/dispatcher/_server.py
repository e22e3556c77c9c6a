"""The dispatcher's processes: ``Dispatcher`` (the GenServer that owns the state), its runner (the
process whose nursery runs keyed calls and remote requests), and the supervisor over both.

The tree is ``rest_for_one`` over ``[dispatcher, runner]``: the runner serves the server's state,
so a dead server takes its runner with it, while a runner that dies alone is restarted on the
same state (the cache and the breakers survive; its calls in flight end with an error). Both
are children of the dispatcher application's root supervisor, or of the supervisor that
:func:`start_dispatcher` starts.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Iterable, Mapping
from typing import Any

import trio

import otp
import supervisors
from otp import ets

from ._config import DispatcherConfig
from ._errors import ConfigurationError, DispatcherNotRunning, DispatchError, ErrorKind
from ._runner import Job, serve_jobs
from ._state import _State, _states
from ._tool import Tool, ToolRegistry
from ._validation import timeout_of

logger = logging.getLogger("apps.dispatcher")


class Dispatcher(otp.GenServer):
    """The dispatcher process: owns the tool registry, the breakers, the retry buckets, the
    counters and the idempotency cache (an ``otp.ets`` table it owns).

    It runs as the first child of the tree :func:`dispatcher_supervisor_spec` describes (start
    it with :func:`start_dispatcher` or the dispatcher application; on its own it has no runner,
    and keyed calls fail at once with an ``internal`` error saying so). Clients use the module
    functions (:func:`dispatch`, :func:`gather_bounded`, ...), which do not go through its
    mailbox. Processes on other nodes
    call it: ``otp.call(("dispatcher", node), ("dispatch", tool_name, args))`` replies
    ``("ok", result)`` or ``("error", kind, message, data)`` (see :class:`GenServerBackend`).

    When it dies, its supervisor stops and restarts its runner after it: keyed calls still
    running end with an ``internal`` error for their waiters, and the cache table goes with the
    process.
    """

    def init(
        self,
        tools: ToolRegistry | Iterable[Tool],
        config: DispatcherConfig,
        owner: otp.Pid | None = None,
    ) -> otp.Ok:
        registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(list(tools))
        table = ets.new(f"{config.name}_results", access=ets.PUBLIC, expire_after=config.result_ttl)
        state = _State(
            pid=otp.self(),
            name=config.name,
            registry=registry,
            config=config,
            table=table,
            rng=random.Random(config.seed),
            limiter=(
                trio.Semaphore(config.max_concurrency)
                if config.max_concurrency is not None
                else None
            ),
            owner=owner,
        )
        states = _states()
        for key in [key for key, other in states.items() if not other.alive]:
            del states[key]
        states[state.pid] = state
        if otp.whereis(config.name) == state.pid:  # registered by start_dispatcher
            states[state.name] = state
        if owner is not None:
            states[owner] = state
        # However the server dies (a kill runs no terminate), the state is closed before its
        # supervisor hears of it and before anyone sees its Exit.
        otp.add_exit_hook(lambda _pid, _reason: state.close())
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        if isinstance(request, tuple) and len(request) in (3, 4) and request[0] == "dispatch":
            options = request[3] if len(request) == 4 else {}
            if not isinstance(request[1], str) or not isinstance(options, Mapping):
                return otp.Reply(
                    (
                        "error",
                        "bad_request",
                        "a remote dispatch is ('dispatch', tool_name: str, args) or"
                        f" ('dispatch', tool_name, args, options: dict); got {request!r}",
                        {},
                    ),
                    state,
                )
            state.submit(
                Job(
                    functools.partial(_serve_remote, state, request, options, from_),
                    functools.partial(_refuse_remote, state, from_),
                )
            )
            return otp.NoReply(state)
        if request == ("statistics",):
            return otp.Reply(state.statistics(), state)
        if request == ("tools",):
            return otp.Reply([tool.to_mcp() for tool in state.registry], state)
        return otp.Reply(("error", "bad_request", f"unknown request {request!r}", {}), state)

    def terminate(self, reason: Any, state: _State) -> None:
        state.close()


async def _serve_remote(
    state: _State, request: tuple[Any, ...], options: Mapping[str, Any], from_: otp.From
) -> None:
    _, name, args, *_ = request
    try:
        timeout = timeout_of(name, options.get("timeout"), options.get("timeout_ms"))
        value = await state.dispatch(name, args, options.get("idempotency_key"), timeout, None)
    except DispatchError as error:
        otp.reply(from_, ("error", str(error.kind), error.message, error.data))
    except ConfigurationError as exc:
        otp.reply(from_, ("error", str(ErrorKind.SCHEMA), str(exc), {}))
    except DispatcherNotRunning as exc:
        otp.reply(from_, ("error", str(ErrorKind.INTERNAL), str(exc), {}))
    except Exception as exc:  # a bug of ours: the caller gets an answer, the runner lives on
        logger.exception("dispatcher %r: a remote dispatch of %r failed", state.name, name)
        otp.reply(
            from_,
            ("error", str(ErrorKind.INTERNAL), f"the dispatcher failed on this call: {exc!r}", {}),
        )
    else:
        otp.reply(from_, ("ok", value))


def _refuse_remote(state: _State, from_: otp.From) -> None:
    otp.reply(
        from_,
        (
            "error",
            str(ErrorKind.INTERNAL),
            f"dispatcher {state.name!r} has no runner right now (it is being restarted); the"
            " call was not run; call again",
            {},
        ),
    )


async def _start_server(tools: ToolRegistry, config: DispatcherConfig) -> otp.Pid:
    # A start function runs in the supervisor's process: otp.self() is the supervisor.
    return await Dispatcher.start_link(tools, config, otp.self(), name=config.name)


async def _start_runner() -> otp.Pid:
    state = _states().get(otp.self())
    if state is None or not state.alive:
        # The runner starts after its server, under the same supervisor.
        raise otp.StartError(("no_dispatcher_server", otp.self()))
    return otp.spawn_link(serve_jobs, state.take_jobs(), state.serve)


def dispatcher_supervisor_spec(
    tools: ToolRegistry | Iterable[Tool], config: DispatcherConfig
) -> tuple[supervisors.SupFlags, list[supervisors.ChildSpec]]:
    """``(flags, children)`` of a dispatcher's supervisor: ``rest_for_one`` over the
    ``dispatcher`` server and its ``runner``."""
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(list(tools))
    flags = supervisors.SupFlags(strategy="rest_for_one", intensity=3, period=5)
    children = [
        supervisors.ChildSpec("dispatcher", (_start_server, registry, config), shutdown=5.0),
        # The runner's jobs end with the server's state; it has nothing to finish on shutdown.
        supervisors.ChildSpec("runner", (_start_runner,), shutdown="brutal_kill"),
    ]
    return flags, children


async def start_dispatcher(
    tools: ToolRegistry | Iterable[Tool] = (), config: DispatcherConfig | None = None
) -> otp.Pid:
    """Start a dispatcher's supervisor linked to the caller (its server registered as
    ``config.name``, then its runner); return the supervisor's pid once both run. A start
    function for your own tree: ``ChildSpec("dispatcher", (start_dispatcher, registry, config),
    type="supervisor")``. ``dispatch(..., dispatcher=pid)`` takes the returned pid.

    Raises:
        otp.StartError: the name is taken (the server's reason ``("already_started", pid)``,
            wrapped as ``failed_to_start_child``).
    """
    config = config or DispatcherConfig()
    flags, children = dispatcher_supervisor_spec(tools, config)
    return await supervisors.Supervisor.start_link(flags, children)
