"""The ``observer_agent`` application: what a remote observer (``python -m otp.observer
--node ... --connect ...``) asks a node over distribution, answered by one registered
GenServer, :data:`AGENT_NAME`.

Read-only: it answers a fixed set of requests (:data:`REQUESTS`) with plain values that cross
the wire (dicts, lists, str, numbers, bytes; pids as their text), and changes nothing on the
node. Anyone with the cookie may ask it, as anyone with the cookie may send to any process.
The boot starts it on every distributed node (``otp.node``); a node opened by hand starts it
with :func:`observer_agent_application`.
"""

from __future__ import annotations

import json
from typing import Any

import trio

import otp
import supervisors

from ._source import InvalidPid, LocalSource, UnknownPid
from ._web import plain

__all__ = [
    "AGENT_APPLICATION",
    "AGENT_NAME",
    "PROTOCOL",
    "REQUESTS",
    "ObserverAgent",
    "observer_agent_application",
]

#: The application's name.
AGENT_APPLICATION = "observer_agent"
#: The agent's registered name (the same as ``otp.observer.AGENT_NAME``).
AGENT_NAME = otp.observer.AGENT_NAME
#: The version of the requests and answers below, told by ``"info"``.
PROTOCOL = 1
#: What the agent answers: ``"info"``, ``"processes"``, ``"snapshot"``, ``"tree"``,
#: ``"readiness"``, ``("process", pid_text)``, ``("metrics", accept_header)`` and
#: ``("source", method, args)`` (the web observer's source, for a remote one).
REQUESTS = ("info", "processes", "snapshot", "tree", "readiness", "process", "metrics", "source")


class ObserverAgent(otp.GenServer):
    """Answers remote observers; see the module's docstring and :data:`REQUESTS`."""

    def init(self) -> otp.Ok:
        return otp.Ok(None)

    async def handle_call(self, request: Any, from_: otp.From, state: None) -> otp.Reply:
        try:
            return otp.Reply(("ok", await answer(request)), state)
        except _UnknownRequest as exc:
            return otp.Reply(("error", str(exc)), state)


class _UnknownRequest(Exception):
    pass


def _plain(value: Any) -> Any:
    # plain() keeps str subclasses (a StrEnum such as Strategy), which cannot cross the wire:
    # through JSON, everything is a builtin (what the web observer serves anyway).
    return json.loads(json.dumps(plain(value), ensure_ascii=False))


async def answer(request: Any) -> Any:
    """The agent's answer to ``request`` (see :data:`REQUESTS`), as plain values."""
    if request == "info":
        return {
            "node": otp.node_name(),
            "protocol": PROTOCOL,
            "requests": list(REQUESTS),
            "applications": [
                name for name, _desc, _version in await supervisors.which_applications()
            ],
        }
    if request == "processes":
        return processes()
    if request == "snapshot":
        return _plain(otp.observer.snapshot())
    if request == "tree":
        return {"node": otp.node_name(), "applications": _plain(await supervisors.observe())}
    if request == "readiness":
        return await supervisors.check_readiness(())
    if isinstance(request, tuple) and len(request) == 3 and request[0] == "source":
        return await _source(request[1], request[2])
    if isinstance(request, tuple) and len(request) == 2:
        kind, argument = request
        if kind == "process" and isinstance(argument, str):
            return _process(argument)
        if kind == "metrics" and isinstance(argument, str):
            from ._metrics import exposition  # (prometheus_client: only for a scrape)

            body, content_type = exposition(
                otp.observer.snapshot(), await supervisors.observe(), argument
            )
            return [body, content_type]
    raise _UnknownRequest(
        f"the observer agent of {otp.node_name()} does not know the request"
        f" {_brief(request)}; it answers {', '.join(REQUESTS)}"
    )


#: The columns of ``"processes"``'s rows, in order.
PROCESS_COLUMNS = (
    "pid",
    "name",
    "status",
    "message_queue_len",
    "messages_handled",
    "memory",
    "current",
)


def processes() -> dict[str, Any]:
    """Every live process as a compact row (see :data:`PROCESS_COLUMNS`): what ``--top``
    needs, about a tenth of a full snapshot's size."""
    rows = [
        [
            repr(p.pid),
            None if p.registered_name is None else str(p.registered_name),
            p.status,
            p.message_queue_len,
            p.messages_handled,
            p.memory,
            p.behaviour or p.initial_call,
        ]
        for p in otp.observer.observe_processes()
    ]
    return {
        "node": otp.node_name(),
        "time": trio.current_time(),
        "columns": list(PROCESS_COLUMNS),
        "rows": rows,
    }


#: The web observer's source methods (``otp.node.ObserverSource``) a remote source may ask.
SOURCE_METHODS = ("node", "processes", "process", "applications", "snapshot", "tables", "series")


async def _source(method: Any, args: Any) -> Any:
    """``LocalSource().method(*args)`` here: a remote web observer's source (RemoteSource);
    its InvalidPid / UnknownPid come back as ``["invalid_pid" | "unknown_pid", message]``."""
    if method not in SOURCE_METHODS or not isinstance(args, list | tuple) or len(args) > 1:
        raise _UnknownRequest(f"no source method {_brief(method)} (of {', '.join(SOURCE_METHODS)})")
    try:
        return ["ok", _plain(await getattr(LocalSource(), method)(*args))]
    except InvalidPid as exc:
        return ["invalid_pid", str(exc)]
    except UnknownPid as exc:
        return ["unknown_pid", str(exc)]


def _process(text: str) -> Any:
    for proc in otp.observer.observe_processes():
        if repr(proc.pid) == text:
            return _plain(proc)
    return None


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _start_agent() -> otp.Pid:
    return await ObserverAgent.start_link(name=AGENT_NAME)


def observer_agent_application() -> supervisors.Application:
    """The application that runs the node's :class:`ObserverAgent`."""
    return supervisors.Application(
        AGENT_APPLICATION,
        (
            supervisors.SupFlags(strategy="one_for_one", intensity=5, period=10),
            [supervisors.ChildSpec("agent", _start_agent)],
        ),
        description="answers remote observers (python -m otp.observer --node ...)",
        version="0.1.0",
    )
