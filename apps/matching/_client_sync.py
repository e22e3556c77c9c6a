"""The blocking client's engine: the client's ops (``_client_ops``, the trio engine's too) run
in the calling thread on a :class:`~._sync_connection.SyncConnection`, no event loop under it.

A client made before a fork (a pre-fork server's master, say) works in the child too: the child
dials a connection of its own on its first call and leaves the parent's alone (its socket is
closed in the child only, never shut down, which would end it for the parent as well), and the
engine's locks are new in the child (a lock some other thread of the parent held at the fork
would never be released there).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, TypeVar

from ._blobs import NEEDS_IO, BlobCache
from ._client_dial import dial
from ._client_ops import Call, ClientOps, Steps, after_loss, connection_lost
from ._errors import ClientClosed
from ._options import ClientOptions
from ._sync_connection import IdleLost, SyncConnection

__all__ = ["SyncClientEngine"]

T = TypeVar("T")


class SyncClientEngine:
    """The blocking client's engine: :class:`ClientOps` run on a :class:`SyncConnection`,
    dialled on the first call, dialled again after a loss (as ``ClientEngine`` on trio)."""

    def __init__(self, registry: Any, cache: BlobCache | None, options: ClientOptions) -> None:
        self.ops = ClientOps(registry, cache, options)
        self.options = options
        self._conn: SyncConnection | None = None
        self._dial_lock = threading.Lock()
        self._closed = False
        _ENGINES.add(self)

    def _forked(self) -> None:
        """(In a forked child.) Let go of the parent's connection without touching it."""
        self._dial_lock = threading.Lock()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.sock.close()  # (the child's copy of the descriptor only)

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, steps: Steps[T]) -> T:
        """Carry out an op's steps in the calling thread."""
        answer: Any = None
        try:
            while True:
                step = steps.send(answer)
                if isinstance(step, Call):
                    answer = self._call(step.op, step.args, step.timeout)
                else:
                    answer = step.fn(*step.args)
        except StopIteration as stop:
            return stop.value

    def call_rpc(
        self, flow_id: str, name: str, args: tuple[Any, ...], timeout: float | None
    ) -> Any:
        """``ops.call_rpc`` carried out, with no generator of its steps when it is one call
        (the usual RPC: ``ClientOps.call_rpc_now``)."""
        ops = self.ops
        call = ops.call_rpc_now(flow_id, name, args, timeout)
        if call is NEEDS_IO:
            return self.run(ops.call_rpc(flow_id, name, *args, timeout=timeout))
        value = self._call(call.op, call.args, call.timeout)
        answer = ops.answer_now(value)
        return self.run(ops.answer_steps(value)) if answer is NEEDS_IO else answer

    def open(self) -> None:
        self._connection()

    def close(self) -> None:
        """Close the connection; calls in flight fail with :class:`ClientClosed`, later calls
        too. Closing twice is a no-op."""
        self._closed = True
        with self._dial_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close(ClientClosed("the client was closed"))

    def _connection(self) -> SyncConnection:
        conn = self._conn
        if conn is not None and conn.broken is None and not self._closed:
            return conn
        with self._dial_lock:
            if self._closed:
                raise ClientClosed("the client is closed; make a new one to call the server")
            conn = self._conn
            if conn is None or conn.broken is not None:
                self._conn = conn = dial(self.options)
            return conn

    def _call(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        """Send one op; reconnect once for an idempotent op whose connection was found lost.
        An idle connection the server dropped is noticed before sending (:class:`IdleLost`):
        dialled again, once, and the op sent there."""
        retry = redialled = False
        while True:
            conn = self._conn
            if conn is None or conn.broken is not None or self._closed:
                conn = self._connection()
            try:
                return conn.call(op, args, timeout)
            except BaseException as exc:
                if not connection_lost(exc):
                    raise
                with self._dial_lock:
                    if self._conn is conn:
                        self._conn = None
                conn.close(ClientClosed("a call found it lost", retryable=True))
                if type(exc) is IdleLost and not redialled and not self._closed:
                    redialled = True
                    continue
                after_loss(op, exc, retry, self._closed)
                retry = True


_ENGINES: weakref.WeakSet[SyncClientEngine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for engine in list(_ENGINES):
        engine._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
