"""The observer's HTTP endpoints as a small ASGI application: ``/metrics`` (Prometheus),
``/healthz``, ``/readyz``, the page and its JSON API (``/api/...``), read-only (GET and HEAD)
but for the actions (``POST /api/actions/<name>``, off unless the node turns them on).

It runs inside the observer's HTTP process (hypercorn's tasks inherit it), so it may call
supervisors as that process. A few fixed routes need no framework: a router, request parsing and
middleware would be all Starlette added here.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import unquote

import attrs

import otp
import supervisors

from ._actions import ACTIONS, MAX_BODY, ActionError, ObserverActions
from ._source import InvalidPid, LocalSource, ObserverSource, UnknownPid

__all__ = ["ObserverWeb", "plain"]

JSON = "application/json"
Response = tuple[int, str, bytes]


def plain(value: Any) -> Any:
    """``value`` as JSON-ready plain values: attrs records as dicts, pids as their text, enums
    as their values, infinite floats as ``"+Inf"``/``"-Inf"`` (``"NaN"``), exit reasons as OTP
    prints them, anything else without a JSON form as its ``repr``."""
    if value.__class__ is float and not math.isfinite(value):
        # JSON has no infinities (a histogram's +Inf bucket): Prometheus's spelling instead.
        return "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, otp.Pid):
        return repr(value)
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if attrs.has(type(value)):
        return {
            field.name: _field(field.name, getattr(value, field.name))
            for field in attrs.fields(type(value))
        }
    return repr(value)


def _field(name: str, value: Any) -> Any:
    if name.endswith("reason") and value is not None:
        return otp.format_reason(value)
    return plain(value)


def _json(status: int, body: Any) -> Response:
    return status, JSON, json.dumps(body, ensure_ascii=False).encode() + b"\n"


@attrs.define
class ObserverWeb:
    """The ASGI application (``await web(scope, receive, send)``).

    Args:
        expected: The applications the node starts; ``/readyz`` is 503 until each runs and
            passes its own readiness check.
    """

    expected: tuple[str, ...] = ()
    #: Where the pages read the node from (the local node unless given another).
    source: ObserverSource = attrs.field(factory=LocalSource)
    #: The POST actions (off unless given a token).
    actions: ObserverActions = attrs.field(factory=ObserverActions)

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # (websockets: none served; hypercorn closes the connection)
        method = scope["method"]
        if scope["path"].startswith(_ACTION_PREFIX) and method == "POST":
            await _send(send, method, *await self._action(scope, receive), [])
            return
        route = _ROUTES.get(scope["path"])
        if route is None and scope["path"].startswith(_PROCESS_PREFIX):
            route = ObserverWeb.api_process
        elif route is None and scope["path"] in _ASSETS:
            route = ObserverWeb.asset
        headers: list[tuple[bytes, bytes]] = []
        if route is None and scope["path"].startswith(_ACTION_PREFIX):
            status, content_type, body = _json(
                405,
                {
                    "error": "method_not_allowed",
                    "message": f"{scope['path']} is an action: POST it (got {method})",
                },
            )
            headers.append((b"allow", b"POST"))
        elif route is None:
            status, content_type, body = _json(
                404,
                {
                    "error": "not_found",
                    "message": f"no endpoint {scope['path']}",
                    "endpoints": sorted(_ROUTES),
                },
            )
        elif method not in ("GET", "HEAD"):
            status, content_type, body = _json(
                405,
                {
                    "error": "method_not_allowed",
                    "message": f"{scope['path']} is read-only: use GET or HEAD (got {method})",
                },
            )
            headers.append((b"allow", b"GET, HEAD"))
        else:
            status, content_type, body = await route(self, scope)
        await _send(send, method, status, content_type, body, headers)

    async def _action(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]]
    ) -> Response:
        name = scope["path"][len(_ACTION_PREFIX) :]
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return _json(400, {"error": "bad_request", "message": "the request ended early"})
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                break  # (refused below, unread: the server drops the rest)
            chunks.append(chunk)
            more = message.get("more_body", False)
        # (past MAX_BODY: a body of that size stands for it, for the guard to log and refuse)
        body = b"".join(chunks) if size <= MAX_BODY else b" " * (MAX_BODY + 1)
        try:
            return _json(200, await self.actions.run(name, scope, body))
        except ActionError as exc:
            return _json(exc.status, {"error": exc.error, "message": str(exc)})

    async def _lifespan(
        self,
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def healthz(self, scope: dict[str, Any]) -> Response:
        return _json(200, {"status": "ok", "node": otp.node_name()})

    async def readyz(self, scope: dict[str, Any]) -> Response:
        waiting = await supervisors.check_readiness(self.expected)
        if waiting:
            return _json(503, {"status": "not_ready", "waiting": waiting})
        return _json(200, {"status": "ready"})

    async def metrics(self, scope: dict[str, Any]) -> Response:
        # Imported at the first scrape: prometheus_client is not needed by nodes without one.
        from ._metrics import exposition

        accept = b", ".join(v for k, v in scope["headers"] if k == b"accept").decode("latin-1")
        applications = await supervisors.observe()
        body, content_type = exposition(otp.observer.snapshot(), applications, accept)
        return 200, content_type, body

    async def api_snapshot(self, scope: dict[str, Any]) -> Response:
        return _json(200, await self.source.snapshot())

    async def api_tree(self, scope: dict[str, Any]) -> Response:
        node = await self.source.node()
        return _json(200, {"node": node["node"], "applications": await self.source.applications()})

    async def api_actions(self, scope: dict[str, Any]) -> Response:
        enabled = self.actions.enabled
        return _json(
            200,
            {
                "enabled": enabled,
                "actions": sorted(ACTIONS) if enabled else [],
                "message": None if enabled else self.actions.disabled,
            },
        )

    async def api_series(self, scope: dict[str, Any]) -> Response:
        return _json(200, await self.source.series())

    async def api_tables(self, scope: dict[str, Any]) -> Response:
        return _json(200, {"tables": await self.source.tables()})

    async def asset(self, scope: dict[str, Any]) -> Response:
        name, content_type = _ASSETS[scope["path"]]
        return 200, content_type, (resources.files(__package__) / "static" / name).read_bytes()

    async def api_processes(self, scope: dict[str, Any]) -> Response:
        return _json(200, {"processes": await self.source.processes()})

    async def api_process(self, scope: dict[str, Any]) -> Response:
        text = unquote(scope["path"][len(_PROCESS_PREFIX) :])
        try:
            return _json(200, await self.source.process(text))
        except InvalidPid as exc:
            return _json(400, {"error": "invalid_pid", "pid": text, "message": str(exc)})
        except UnknownPid as exc:
            return _json(404, {"error": "unknown_pid", "pid": text, "message": str(exc)})


async def _send(
    send: Callable[[dict[str, Any]], Awaitable[None]],
    method: str,
    status: int,
    content_type: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
) -> None:
    headers = [
        *headers,
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


_ROUTES: dict[str, Callable[[ObserverWeb, dict[str, Any]], Awaitable[Response]]] = {
    "/healthz": ObserverWeb.healthz,
    "/readyz": ObserverWeb.readyz,
    "/metrics": ObserverWeb.metrics,
    "/api/snapshot": ObserverWeb.api_snapshot,
    "/api/tree": ObserverWeb.api_tree,
    "/api/processes": ObserverWeb.api_processes,
    "/api/tables": ObserverWeb.api_tables,
    "/api/series": ObserverWeb.api_series,
    "/api/actions": ObserverWeb.api_actions,
}
#: ``POST /api/actions/<name>``: one of the actions (``otp.node._actions.ACTIONS``).
_ACTION_PREFIX = "/api/actions/"
#: ``/api/processes/<pid>`` (the pid's text, URL-encoded): one process's detail.
_PROCESS_PREFIX = "/api/processes/"
#: The page and its assets, shipped in the package (no CDN: nodes run on closed networks).
_ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/observer.js": ("observer.js", "text/javascript; charset=utf-8"),
    "/static/observer.css": ("observer.css", "text/css; charset=utf-8"),
    "/static/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
}
