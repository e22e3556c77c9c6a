"""The task half of the pull worker's engine: accept or decline each offered task against the
capacity (``max_concurrent_tasks`` shared by Steps and RPCs, ``reserved_rpc_tasks`` slots only
RPCs may take), run the accepted call, keep its stream alive, and send its outcome.

This is the seed's 容量和关闭 and 为 RPC 预留容量: a Step is declined ``no_capacity`` when the busy
handlers reach the cap less the reservation (counted in ``pull_reserved_rpc_declines``), an
RPC only at the cap. :class:`WorkerTasks` is mixed into ``WorkerEngine``, which holds the state.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

import wire

from ._errors import ClientClosed
from ._model import Registry, RpcDefinition, StepDefinition
from ._options import PullWorkerOptions
from ._worker_calls import CallOutputs, HandlerRunner, execute, handler_of, send_output
from ._worker_streams import Link, Stream

__all__ = ["RESERVED_DECLINE_EXTRA_IDLE_SECONDS", "WorkerTasks"]

log = logging.getLogger("apps.matching.worker")

#: How long a queue keeps one extra idle stream after its last reserved-capacity decline.
RESERVED_DECLINE_EXTRA_IDLE_SECONDS = 30.0


class WorkerTasks:
    """Tasks and slots; the engine sets these attributes and provides :meth:`_kick`."""

    _registry: Registry
    _cache: Any
    _runner: HandlerRunner
    _pull: PullWorkerOptions
    _app_worker_id: str
    _cap: int
    _reserved: int
    _reserved_declines: int
    #: Handlers running (their slots are taken).
    _busy: int
    #: Calls whose outcome is not sent yet.
    _active: int
    _call_scopes: set[trio.CancelScope]
    _calls_nursery: trio.Nursery
    _draining: bool
    _token: trio.lowlevel.TrioToken | None

    def _kick(self) -> None:
        raise NotImplementedError

    async def _send_quietly(self, link: Link, message: wire.MatchMessage) -> bool:
        """Send, ignoring a lost connection (the loss is handled where it is noticed)."""
        try:
            await link.conn.send(message)
        except ClientClosed:
            return False
        return True

    async def _decline(self, s: Stream, task: wire.MatchTask, reason: str, message: str) -> None:
        decline = wire.MatchDecline(
            delivery=task.delivery, reason=reason, message=message, rid=s.id
        )
        await self._send_quietly(s.link, decline)

    async def _on_task(self, s: Stream, task: wire.MatchTask) -> None:
        link = s.link
        if s.state != "idle":
            await self._decline(s, task, "no_capacity", "this stream runs a call already")
            return
        if self._draining or link.reconnecting:
            await self._decline(s, task, "draining", f"worker {self._app_worker_id} is stopping")
            return
        handler = handler_of(self._registry, self._app_worker_id, task)
        if isinstance(handler, str):
            await self._decline(s, task, "unknown_name", handler)
            return
        busy, cap = self._busy, self._cap
        if task.kind == "step" and busy >= cap - self._reserved:
            if busy < cap:
                self._reserved_declines += 1
                log.debug(
                    "declined a step of flow type %s (%s): %d of %d slots busy, %d reserved for"
                    " RPCs",
                    task.flow_type,
                    task.name,
                    busy,
                    cap,
                    self._reserved,
                )
                s.queue.extra_until = trio.current_time() + RESERVED_DECLINE_EXTRA_IDLE_SECONDS
                self._kick()
                message = f"{busy} of {cap} slots busy, {self._reserved} reserved for RPCs"
            else:
                message = f"all {cap} slots busy"
            await self._decline(s, task, "no_capacity", message)
            return
        if task.kind == "rpc" and busy >= cap:
            await self._decline(s, task, "no_capacity", f"all {cap} slots busy")
            return
        s.state = "busy"
        s.pong_at = trio.current_time() + self._pull.keepalive_interval
        link.keepalive_wake.set()
        self._busy += 1
        self._active += 1
        link.calls += 1
        self._kick()
        if not await self._send_quietly(link, wire.MatchAccept(delivery=task.delivery, rid=s.id)):
            self._free_slot(s)
            self._call_over(s)
            return
        scope = trio.CancelScope()
        self._call_scopes.add(scope)
        self._calls_nursery.start_soon(self._run_call, s, task, handler, scope)

    def _free_slot(self, s: Stream) -> None:
        """The handler on ``s`` returned: its slot is free (its outcome may not be sent yet)."""
        self._busy -= 1
        if s.state == "busy":
            s.state = "idle"
            s.idle_since = trio.current_time()
            s.pong_at = math.inf
        if self._busy == self._cap - 1:
            # A slot is free again (an extra idle stream may now be opened). Otherwise the
            # stream counts as busy until its outcome is sent: _call_over wakes the loops.
            self._kick()

    def _call_over(self, s: Stream) -> None:
        """The call on ``s`` is over, its outcome sent (or dropped)."""
        self._active -= 1
        link = s.link
        link.calls -= 1
        if link.reconnecting and link.calls == 0:
            link.ending.set()
        self._kick()

    async def _run_call(
        self,
        s: Stream,
        task: wire.MatchTask,
        handler: StepDefinition | RpcDefinition,
        scope: trio.CancelScope,
    ) -> None:
        outcome: wire.MatchMessage | None = None
        freed = False
        link = s.link
        conn = link.conn

        async def output(value: Any) -> None:
            if s.state != "closed":  # (never a frame on a stream after its CLOSE)
                await send_output(conn, task.delivery, s.id, value)

        outputs = CallOutputs(self._calls_nursery, output)
        token = self._token
        assert token is not None
        try:
            with scope:
                try:
                    outcome = await execute(
                        task,
                        handler,
                        rid=s.id,
                        conn=conn,
                        cache=self._cache,
                        runner=self._runner,
                        emit=outputs.emitter(token),
                    )
                finally:
                    outputs.closed = True
                await outputs.finish()
            if scope.cancelled_caught:
                log.warning(
                    "delivery %d (%s %s of flow %s) was cancelled after stop_drain_timeout; the"
                    " server re-dispatches or fails it",
                    task.delivery,
                    task.kind,
                    task.name,
                    task.flow_id,
                )
            freed = True
            self._free_slot(s)
            if outcome is not None:
                s.sending = True
                try:
                    await self._send_outcome(s, task, outcome)
                finally:
                    s.sending = False
        finally:
            self._call_scopes.discard(scope)
            if not freed:
                self._free_slot(s)
            self._call_over(s)

    async def _keepalive_loop(self, link: Link) -> None:
        """An M_PONG every ``keepalive_interval`` on each stream while its task runs (one
        loop per connection, not a task per call)."""
        interval = self._pull.keepalive_interval
        while not link.conn.closed:
            now = trio.current_time()
            due = math.inf
            for s in list(link.streams.values()):
                if s.state != "busy":
                    continue
                if s.pong_at <= now:
                    s.pong_at = now + interval
                    await self._send_quietly(link, wire.MatchPong(rid=s.id))
                due = min(due, s.pong_at)
            # A call that starts later is due after every one waited for here: only an idle
            # wait (no busy stream) needs waking.
            link.keepalive_wake = trio.Event()
            if due == math.inf:
                await link.keepalive_wake.wait()
            else:
                await trio.sleep_until(due)

    async def _send_outcome(
        self, s: Stream, task: wire.MatchTask, outcome: wire.MatchMessage
    ) -> None:
        link = s.link
        if link.conn.closed or s.state == "closed":
            log.warning(
                "the stream of delivery %d (%s %s of flow %s) is gone: its %s is dropped; the"
                " server re-dispatches it, or fails the attempt if it sent output",
                task.delivery,
                task.kind,
                task.name,
                task.flow_id,
                "result" if isinstance(outcome, wire.MatchResult) else "failure",
            )
            return
        try:
            await link.conn.send(outcome)
        except wire.WireError as exc:
            failure = wire.MatchFailure(
                delivery=task.delivery,
                type=type(exc).__name__,
                message=f"the handler's result cannot be sent: {exc}",
                retryable=False,
                rid=s.id,
            )
            await self._send_quietly(link, failure)
        except ClientClosed:
            log.warning(
                "the connection was lost: the outcome of delivery %d is dropped", task.delivery
            )
