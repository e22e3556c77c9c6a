"""The web observer served here with another node's data, for ``python -m otp.observer --node
... --connect ...`` without ``--top``: the pages and ``/api/...`` through :class:`RemoteSource`
(``otp.node.ObserverSource`` over the node's observer agent), and ``/metrics``, ``/healthz`` and
``/readyz`` as that node's own answer them, each asked of its agent at the request.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TextIO

import trio

import otp

from ._actions import ObserverActions
from ._config import parse_observer
from ._source import InvalidPid, UnknownPid
from ._web import ObserverWeb

__all__ = ["RemoteSource", "serve_remote_observer"]


class RemoteSource:
    """``otp.node.ObserverSource`` of a node attached to (``otp.observer.attach``): each method
    asks its observer agent, which answers with its own LocalSource.

    Raises (every method): otp.observer.AttachError (lost, or no agent); ``process`` also
    InvalidPid and UnknownPid, as the local source.
    """

    def __init__(self, remote: otp.observer.RemoteNode) -> None:
        self.remote = remote

    async def _ask(self, method: str, *args: Any) -> Any:
        kind, value = await self.remote.ask(("source", method, list(args)))
        if kind == "invalid_pid":
            raise InvalidPid(value)
        if kind == "unknown_pid":
            raise UnknownPid(value)
        return value

    async def node(self) -> dict[str, Any]:
        return dict(await self._ask("node"))

    async def processes(self) -> list[dict[str, Any]]:
        return list(await self._ask("processes"))

    async def process(self, pid: str) -> dict[str, Any]:
        return dict(await self._ask("process", pid))

    async def applications(self) -> list[dict[str, Any]]:
        return list(await self._ask("applications"))

    async def snapshot(self) -> dict[str, Any]:
        return dict(await self._ask("snapshot"))

    async def tables(self) -> list[dict[str, Any]]:
        return list(await self._ask("tables"))

    async def series(self) -> dict[str, Any]:
        return dict(await self._ask("series"))


logger = logging.getLogger("otp.node.observer")

#: What this serves itself (the rest is ObserverWeb's, through RemoteSource).
_OWN = ("/metrics", "/healthz", "/readyz")
_ENDPOINTS = (
    "/",
    "/api/snapshot",
    "/api/tree",
    "/api/processes",
    "/api/tables",
    "/api/series",
    *_OWN,
)


async def serve_remote_observer(remote: otp.observer.RemoteNode, listen: str, out: TextIO) -> None:
    """Serve ``remote``'s observer endpoints on ``listen`` (``HOST:PORT``, loopback) until
    cancelled; prints where once it listens."""
    import hypercorn.config
    import hypercorn.trio

    settings = parse_observer(listen)
    config = hypercorn.config.Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("otp.node.observer.http")
    config.graceful_timeout = 1.0
    app = _RemoteWeb(remote)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(hypercorn.trio.serve, app, config)
        print(
            f"observing {remote.name} on {binds[0]} ({', '.join(_ENDPOINTS)})", file=out, flush=True
        )


class _RemoteWeb:
    def __init__(self, remote: otp.observer.RemoteNode) -> None:
        self.remote = remote
        # Actions stay on the node's own observer: the agent answers questions, changes nothing.
        self.web = ObserverWeb(
            source=RemoteSource(remote),
            actions=ObserverActions(
                disabled="actions are not available through a remote attach (its agent is"
                " read-only): use the node's own observer, started with --observer-actions"
            ),
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in _OWN:
            try:
                await self.web(scope, receive, send)
            except otp.observer.AttachError as exc:
                status, content_type, body = _json(502, {"error": exc.kind, "message": str(exc)})
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [(b"content-type", content_type.encode())],
                    }
                )
                await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, content_type, body = await self._answer(scope)
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _answer(self, scope: dict[str, Any]) -> tuple[int, str, bytes]:
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            return _json(405, {"error": "method_not_allowed", "message": f"{path} is read-only"})
        remote = self.remote
        try:
            if path == "/metrics":
                accept = b", ".join(v for k, v in scope["headers"] if k == b"accept")
                body, content_type = await remote.metrics(accept.decode("latin-1"))
                return 200, content_type, body
            if path == "/healthz":
                await remote.info()
                return _json(200, {"status": "ok", "node": remote.name})
            if path == "/readyz":
                waiting = await remote.readiness()
                if waiting:
                    return _json(503, {"status": "not_ready", "waiting": waiting})
                return _json(200, {"status": "ready"})
        except otp.observer.AttachError as exc:
            return _json(502, {"error": exc.kind, "message": str(exc)})
        return _json(
            404,
            {"error": "not_found", "message": f"no endpoint {path}", "endpoints": list(_ENDPOINTS)},
        )


def _json(status: int, body: Any) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body, ensure_ascii=False).encode() + b"\n"
