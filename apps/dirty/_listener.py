"""The socket listener and the connection processes (one per client connection).

The listener binds the pool's Unix socket (``GUNICORN_DIRTY_SOCKET``) and starts a connection
process under the ``dirty_connections`` DynamicSupervisor for each client. A connection reads GD
v1 frames; many requests may be in flight on it at once, matched by request id. A REQUEST goes
to a worker holding its app (round-robin, from the router's ETS table); replies come back as
bytes ready to write. STASH runs here, on ETS; STATUS and MANAGE ask the router. An END *from* a
client abandons that request (the worker stops its generator). A client that breaks the protocol
gets an ERROR (DirtyProtocolError) and is disconnected; a client that disconnects abandons its
requests.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from typing import Any

import attrs
import trio

import otp
import supervisors
import wire
from otp import ets

from ._errors import (
    DirtyAppNotFoundError,
    DirtyError,
    DirtyNoWorkersAvailableError,
    DirtyProtocolError,
    DirtyWorkerError,
    StashError,
)
from ._frames import (
    END,
    MANAGE,
    REQUEST,
    STASH,
    STATUS,
    FrameSplitter,
    decode_payload,
    encode,
    tune_socket,
)
from ._pool import ACTORS, ROUTER, Outbox, PoolContext, error_bytes
from ._router import ROUTES
from ._stash import stash_operation

logger = logging.getLogger("apps.dirty")

CONNECTIONS = "dirty_connections"


@attrs.frozen
class _ReaderDone:
    reason: Any


async def start_listener(ctx: PoolContext) -> otp.Pid:
    """Bind the socket and start accepting, linked to the caller.

    Raises:
        otp.StartError: The socket cannot be bound (the reason is the OSError).
    """
    path = ctx.socket_path
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _remove_stale(path)
        await sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise otp.StartError(("dirty_socket", path, str(exc))) from exc
    os.environ["GUNICORN_DIRTY_SOCKET"] = path
    logger.info("dirty pool: clients connect to %s (GUNICORN_DIRTY_SOCKET)", path)
    return otp.spawn_link(_accept_loop, ctx, trio.SocketListener(sock))


def _remove_stale(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


async def _accept_loop(ctx: PoolContext, listener: trio.SocketListener) -> None:
    try:
        while True:
            stream = await listener.accept()
            tune_socket(stream.socket)
            spec = supervisors.ChildSpec(
                "conn", (_start_connection, stream), restart="temporary", shutdown="brutal_kill"
            )
            result = await supervisors.start_child(CONNECTIONS, spec)
            if result[0] != "ok":
                logger.warning("dirty pool: could not serve a client: %r", result)
                await stream.aclose()
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        try:
            os.unlink(ctx.socket_path)
        except OSError:
            pass


async def _start_connection(stream: trio.SocketStream) -> otp.Pid:
    return otp.spawn_link(_connection, stream)


@attrs.define(eq=False)
class _Conn:
    me: otp.Pid
    stream: trio.SocketStream
    outbox: Outbox
    pending: dict[int, otp.Pid] = attrs.Factory(dict)
    monitors: dict[otp.Pid, otp.Ref] = attrs.Factory(dict)
    by_ref: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)

    def deliver(self, data: bytes, done: tuple[int, ...]) -> None:
        """Frames from a worker actor (run in its task): written to the client at once."""
        pending = self.pending
        for rid in done:
            pending.pop(rid, None)
        self.outbox.write(data)


async def _connection(stream: trio.SocketStream) -> None:
    me = otp.self()
    outbox = Outbox(stream.socket.fileno(), lambda: otp.send(me, _ReaderDone("broken")))
    conn = _Conn(me, stream, outbox)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_reader, conn, nursery)
            nursery.start_soon(outbox.run)
            await _writer(conn)
            nursery.cancel_scope.cancel()
    finally:
        outbox.close()
        for rid, worker in conn.pending.items():
            actor = ACTORS.get(worker)
            if actor is not None:
                actor.cancel(conn, rid)
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _writer(conn: _Conn) -> None:
    """The connection's mailbox: a worker's death fails its calls; the reader's end ends it."""
    pending = conn.pending
    outbox = conn.outbox
    while True:
        msg = await otp.receive()
        kind = type(msg)
        if kind is otp.Down:
            worker = conn.by_ref.pop(msg.ref, None)
            if worker is not None:
                conn.monitors.pop(worker, None)
                lost = [rid for rid, w in pending.items() if w == worker]
                for rid in lost:
                    del pending[rid]
                    outbox.write(error_bytes(rid, _worker_gone(msg.reason)))
        elif kind is bytes:
            outbox.write(msg)
        elif kind is _ReaderDone:
            await outbox.flush()
            return


def _worker_gone(reason: Any) -> DirtyError:
    return DirtyWorkerError(
        f"the dirty worker running the call is gone ({otp.format_reason(reason)})"
    )


async def _reader(conn: _Conn, nursery: trio.Nursery) -> None:
    me = conn.me
    send = otp.send
    write = conn.outbox.write
    splitter = FrameSplitter()
    reason: Any = otp.NORMAL
    try:
        while True:
            try:
                data = await conn.stream.receive_some(splitter.read_size())
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            try:
                frames = splitter.feed(data)
            except DirtyProtocolError as exc:
                write(error_bytes(0, exc))
                logger.warning("dirty pool: dropping a client that sent garbage: %s", exc)
                return
            for mtype, rid, payload in frames:
                if mtype == REQUEST:
                    error = _route(conn, rid, payload)
                    if error is not None:
                        write(error_bytes(rid, error))
                elif mtype == END:
                    worker = conn.pending.pop(rid, None)
                    if worker is not None:
                        actor = ACTORS.get(worker)
                        if actor is not None:
                            actor.cancel(conn, rid)
                elif mtype == STASH:
                    write(await _stash(rid, payload))
                elif mtype in (STATUS, MANAGE):
                    nursery.start_soon(_control, me, mtype, rid, payload)
                else:
                    write(
                        error_bytes(
                            rid,
                            DirtyProtocolError(
                                f"a client may send REQUEST, STASH, STATUS or MANAGE, not"
                                f" message type 0x{mtype:02x}"
                            ),
                        ),
                    )
    finally:
        send(me, _ReaderDone(reason))


def _route(conn: _Conn, rid: int, payload: bytes) -> DirtyError | None:
    try:
        msg = decode_payload(payload)
    except DirtyProtocolError as exc:
        return exc
    app_path = msg.get("app_path") if msg else None
    if not isinstance(app_path, str) or not isinstance(msg.get("action"), str):
        return DirtyProtocolError("a REQUEST needs str app_path and action")
    if rid in conn.pending:
        return DirtyProtocolError(f"request id {rid} is already in flight on this connection")
    try:
        rows = ets.lookup(ROUTES, app_path)
    except ets.EtsError:
        return DirtyNoWorkersAvailableError(app_path, "The dirty pool is shutting down")
    if not rows:
        return DirtyAppNotFoundError(app_path)
    workers = rows[0][1]
    if not workers:
        return DirtyNoWorkersAvailableError(app_path)
    if len(workers) == 1:
        worker = workers[0]
    else:
        turn = ets.update_counter(ROUTES, app_path, (2, 1))
        assert isinstance(turn, int)
        worker = workers[turn % len(workers)]
    if worker not in conn.monitors:
        ref = otp.monitor(worker)
        conn.monitors[worker] = ref
        conn.by_ref[ref] = worker
    conn.pending[rid] = worker
    actor = ACTORS.get(worker)
    if actor is not None:
        actor.submit(conn, rid, payload)
    # else: the worker actor is gone; its Down (monitor) fails the call
    return None


async def _stash(rid: int, payload: bytes) -> bytes:
    try:
        msg = decode_payload(payload) or {}
        op = msg.get("op")
        table = msg.get("table", "")
        if type(op) is not int or not isinstance(table, str):
            raise DirtyProtocolError("a STASH needs an int op and a str table")
        pattern = msg.get("pattern")
        result = await stash_operation(op, table, msg.get("key"), msg.get("value"), pattern)
        return encode(wire.make_response(rid, result))
    except DirtyError as exc:
        return error_bytes(rid, exc)
    except (otp.CallError, otp.CallTimeout, ets.EtsError, TypeError, ValueError) as exc:
        return error_bytes(rid, StashError(f"stash operation failed: {exc}"))
    except wire.WireError as exc:
        return error_bytes(rid, StashError(f"stash result cannot be encoded: {exc}"))


async def _control(me: otp.Pid, mtype: int, rid: int, payload: bytes) -> None:
    try:
        if mtype == STATUS:
            result = await otp.call(ROUTER, "status")
        else:
            msg = decode_payload(payload) or {}
            op, count = msg.get("op"), msg.get("count", 1)
            if op not in (1, 2) or type(count) is not int:
                raise DirtyProtocolError("a MANAGE needs op 1 (add) or 2 (remove) and an int count")
            result = await otp.call(ROUTER, ("add" if op == 1 else "remove", count), timeout=None)
        otp.send(me, encode(wire.make_response(rid, result)))
    except DirtyError as exc:
        otp.send(me, error_bytes(rid, exc))
    except (otp.CallError, otp.CallTimeout) as exc:
        otp.send(me, error_bytes(rid, DirtyError(f"the dirty router did not answer: {exc}")))
