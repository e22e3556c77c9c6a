"""Direct routes: a dispatch whose queue the matcher would pick at once goes there without
waking the matcher (issue 15: the matcher's wake-up was a hop on every Step's and RPC's path).

The matcher publishes, in an ``otp.ets`` table named after it (``routes_table``), the queues it
would send a fresh dispatch straight to: a sticky worker's queue while that worker has a stream
there and is not draining (``worker:<id>``), and a flow type's queue while it has a stream
(``flow:<type>``), each with the queue's ``QueueHandle`` (the engine hands its dispatches
over rather than sending them, see ``_queue``). Every other case (no such stream,
exclusions, another server's streams, bad names) still goes through the matcher, which
applies the seed's rules as before. Erlang's ``pg`` and ``global`` publish their state the
same way, for reads that wake nobody.

The engine's side (what it sends straight, and the queues it watches for it) is
``_engine_direct``.
"""

from __future__ import annotations

from typing import Any

import otp
from otp import ets

from ._queue import QueueHandle

__all__ = ["open_routes", "publish_route", "routes_table"]


def routes_table(matcher: Any) -> str | None:
    """The name of the routes table of the matcher registered as ``matcher`` (None for a pid:
    an unregistered matcher publishes no routes)."""
    return f"{matcher}.routes" if isinstance(matcher, str) else None


def open_routes(matcher_name: str | None) -> Any:
    """(In the matcher's ``init``.) Its routes table, owned by it (gone with it), or None for
    an unregistered matcher."""
    name = routes_table(matcher_name)
    if name is None:
        return None
    return ets.new(name, type=ets.SET, access=ets.PROTECTED, named=True)


def publish_route(
    table: Any, queue_name: str, pid: otp.Pid | None, handle: QueueHandle | None = None
) -> None:
    """(In the matcher.) ``queue_name`` is a direct route to ``pid`` now (its dispatches handed
    to ``handle``, else sent), or none (None)."""
    if table is None:
        return
    if pid is None:
        ets.delete(table, queue_name)
    else:
        ets.insert(table, (queue_name, pid, handle))
