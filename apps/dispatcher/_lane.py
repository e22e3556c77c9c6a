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
    handler, whose timeout's cancel scope is entered only at its first wait: see
    :mod:`._deadline`); a failure of that attempt goes on through the general retry path.
    """

    tool: Tool
    #: ``ToolRegistry.version`` when the lane was resolved: another one means look again.
    version: int
    latency: Latency
    #: The tool's own event counters (``_State.by_tool[name]``).
    counts: Counter[str]
    fast: bool = False
    breaker: CircuitBreaker | None = None
    #: The fast path's attempts since the lane was made: begun, succeeded, and ended otherwise
    #: (failed, timed out, or cancelled from outside). A successful call adds one to two ints,
    #: instead of four additions to Counters and two to ``_State.running``: the attempts running
    #: are :meth:`running`, and :meth:`settle` adds the rest to the counters before a read.
    started: int = 0
    ok: int = 0
    ended_otherwise: int = 0
    #: ``started`` and ``ok`` as of the last :meth:`settle`.
    settled_started: int = 0
    settled_ok: int = 0

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

    def running(self) -> int:
        """Fast-path attempts running now."""
        return self.started - self.ok - self.ended_otherwise

    def settle(self, counters: Counter[str]) -> None:
        """Add the fast path's attempts and successes since the last settling to ``counters``
        and the tool's own."""
        started, ok = self.started, self.ok
        if started != self.settled_started:
            self.counts["dispatch.attempt"] += started - self.settled_started
            counters["dispatch.attempt"] += started - self.settled_started
            self.settled_started = started
        if ok != self.settled_ok:
            self.counts["dispatch.ok"] += ok - self.settled_ok
            counters["dispatch.ok"] += ok - self.settled_ok
            self.settled_ok = ok
