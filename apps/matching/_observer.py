"""The matching server's view for ``supervisors.observe()``: streams registered (in all and per
app worker id) and every queue with its streams by state and its backlog, as the ``queues`` op
reports them.

Dispatch reasons are not in it: the queues do not count them (each ``Routed`` decision goes to
the engine as a message), and counting them only for this view is left to a later change.
"""

from __future__ import annotations

from typing import Any

from ._matcher import MATCHER, queue_rows, statistics


async def observer_view(matcher: Any = MATCHER) -> dict[str, Any]:
    """A dict of plain values: ``streams`` (registered), ``workers`` (streams per app worker
    id) and ``queues`` (the ``queues`` op's rows: ``name``, ``kind``, ``streams``, ``idle``,
    ``offered``, ``busy``, ``waiting`` (the backlog), ``workers``, ``declines``).

    Raises:
        otp.CallError: the matcher is not alive.
    """
    stats = await statistics(matcher=matcher)
    return {
        "streams": stats.streams,
        "workers": dict(sorted(stats.workers.items())),
        "queues": queue_rows(stats),
    }
