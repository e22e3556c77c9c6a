"""Readiness probes for a pull worker of any flavour: what to answer (:func:`readiness_handler`)
and a tiny HTTP/1.1 server answering ``GET /readyz`` on trio (:func:`serve_readyz`), for the
seed's Kubernetes readiness check.
"""

from __future__ import annotations

from typing import Any

import trio

__all__ = ["readiness_handler", "serve_readyz"]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def readiness_handler(worker: Any) -> tuple[int, bytes]:
    """What a readiness probe answers for ``worker`` (any flavour): ``(200, b"ready\\n")`` when
    ``worker.pull_registration_state().is_ready``, else ``(503, b"not ready\\n")``."""
    if worker.pull_registration_state().is_ready:
        return 200, b"ready\n"
    return 503, b"not ready\n"


async def serve_readyz(
    worker: Any,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    path: str = "/readyz",
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET path`` (and ``HEAD``) with :func:`readiness_handler` over HTTP/1.1 on a trio
    TCP socket, one request per connection, until cancelled. ``task_status.started`` gets the
    listeners (``port=0`` picks a free port). Other paths get 404, other methods 405.
    """

    async def answer(stream: trio.SocketStream) -> None:
        with trio.move_on_after(10):
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 8192:
                data = await stream.receive_some(4096)
                if not data:
                    return
                request += data
            line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, target = [*line, "", ""][:2]
            if target.split("?", 1)[0] != path:
                status, body = 404, b"not found\n"
            elif method not in ("GET", "HEAD"):
                status, body = 405, b"method not allowed\n"
            else:
                status, body = readiness_handler(worker)
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            try:
                await stream.send_all(head + (b"" if method == "HEAD" else body))
            except trio.BrokenResourceError:
                pass
        await trio.aclose_forcefully(stream)

    await trio.serve_tcp(answer, port, host=host, task_status=task_status)
