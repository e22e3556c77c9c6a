"""The web observer's endpoints served here with another node's data, for
``python -m otp.observer --node ... --connect ...`` without ``--top``: ``/api/snapshot``,
``/api/tree``, ``/metrics``, ``/healthz`` and ``/readyz`` answer as that node's own would, each
asked of its observer agent at the request.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TextIO

import trio

import otp

from ._config import parse_observer

__all__ = ["serve_remote_observer"]

logger = logging.getLogger("otp.node.observer")

_ENDPOINTS = ("/api/snapshot", "/api/tree", "/metrics", "/healthz", "/readyz")


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

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
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
            if path == "/api/snapshot":
                return _json(200, await remote.snapshot())
            if path == "/api/tree":
                return _json(200, await remote.tree())
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
