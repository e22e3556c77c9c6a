"""The matching server's view for ``supervisors.observe()``: streams registered (in all and per
app worker id), every queue with its streams by state and its backlog, as the ``queues`` op
reports them, the engine's routing decisions by reason (sticky hit, fallback after no
stream or after the sticky wait, re-route for an unknown name, declined, delivered), and the
flows it took over from other servers on a shared store.
"""

from __future__ import annotations

from typing import Any

import otp

from ._engine import ENGINE, FlowEngine
from ._matcher import MATCHER, queue_rows, statistics

#: How long the view waits for a busy engine's counters before it shows the rest without them.
ENGINE_WAIT = 1.0


async def observer_view(matcher: Any = MATCHER, engine: Any = ENGINE) -> dict[str, Any]:
    """A dict of plain values: ``streams`` (registered), ``workers`` (streams per app worker
    id), ``queues`` (the ``queues`` op's rows: ``name``, ``kind``, ``streams``, ``idle``,
    ``offered``, ``busy``, ``waiting`` (the backlog), ``workers``, ``declines``) and
    ``dispatch_reasons`` (routing decisions since the engine started, by reason), ``leases``
    (``server_id``, ``takeovers``, ``redeliveries``, ``moved``: see ``EngineStatistics``); those
    two None when the engine did not answer within :data:`ENGINE_WAIT`.

    Raises:
        otp.CallError: the matcher is not alive.
    """
    stats = await statistics(matcher=matcher)
    try:
        engine_stats = await FlowEngine.statistics(server=engine, timeout=ENGINE_WAIT)
    except (otp.CallError, otp.CallTimeout):
        reasons = leases = None
    else:
        reasons = dict(engine_stats.dispatch_reasons)
        leases = {
            "server_id": engine_stats.server_id,
            "takeovers": engine_stats.takeovers,
            "redeliveries": engine_stats.redeliveries,
            "moved": engine_stats.moved,
        }
    return {
        "streams": stats.streams,
        "workers": dict(sorted(stats.workers.items())),
        "queues": queue_rows(stats),
        "dispatch_reasons": reasons,
        "leases": leases,
    }
