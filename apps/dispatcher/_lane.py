"""A registered tool's lane: what :func:`dispatch` would otherwise look up on every call (the
tool's breaker, latency histogram and counters, and whether its calls may take the fast path),
resolved once per registered tool name and resolved again when the registry has changed.
"""

from __future__ import annotations

from collections import Counter

import attrs

from ._breaker import CircuitBreaker
from ._latency import Latency
from ._tool import ASYNC, Tool


@attrs.define(eq=False)
class Lane:
    """One registered tool as its calls need it.

    ``fast``: an async handler whose schema accepts any object and that needs no concurrency
    slot, on a dispatcher without a limit of its own. Such a tool's call without an idempotency
    key or budget, while its breaker is closed, runs its first attempt inline in ``dispatch``
    (no validation, no slot to wait for, no layer of coroutines between the caller and the
    handler); a failure of that attempt goes on through the general retry path.
    """

    tool: Tool
    #: ``ToolRegistry.version`` when the lane was resolved: another one means look again.
    version: int
    latency: Latency
    #: The tool's own event counters (``_State.by_tool[name]``).
    counts: Counter[str]
    fast: bool = False
    breaker: CircuitBreaker | None = None
    #: Attempts and successes of fast-path calls not yet in the counters: two additions to
    #: ints instead of four to Counters per call; :meth:`settle` adds them before a read.
    attempts: int = 0
    ok: int = 0

    def resolve(
        self, tool: Tool, version: int, breaker: CircuitBreaker | None, dispatcher_limited: bool
    ) -> None:
        """Follow ``tool``, now registered by the lane's name as of registry ``version``."""
        self.tool = tool
        self.version = version
        self.breaker = breaker
        self.fast = (
            tool.mode is ASYNC
            and tool.accepts_any
            and tool.max_concurrency is None
            and not dispatcher_limited
        )

    def settle(self, counters: Counter[str]) -> None:
        """Add the fast path's attempts and successes to ``counters`` and the tool's own."""
        if self.attempts:
            counters["dispatch.attempt"] += self.attempts
            self.counts["dispatch.attempt"] += self.attempts
            self.attempts = 0
        if self.ok:
            counters["dispatch.ok"] += self.ok
            self.counts["dispatch.ok"] += self.ok
            self.ok = 0
