"""The dirty client's asyncio transport: the connection is a protocol, so the event loop hands
it each read and it wakes the calls it completes (a call costs one send and one wake-up), as
Gunicorn's async client reads on asyncio streams.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._client_shared import _STREAM_HIGH, _AsyncConn, _connect_error, _interrupted, _Slot
from ._io import tune_socket


class _AsyncioConn(_AsyncConn):
    """An asyncio loop's connection; ``stream`` is its :class:`_Protocol`."""

    def __init__(self, loop: Any, lost: Any) -> None:
        super().__init__(loop, lost)
        self.stream: Any = None

    @staticmethod
    def current_loop() -> Any:
        return asyncio.get_running_loop()

    @classmethod
    async def open(cls, loop: Any, socket_path: str, lost: Any) -> _AsyncioConn:
        conn = cls(loop, lost)
        try:
            _, conn.stream = await loop.create_unix_connection(
                lambda: _Protocol(conn, lost), socket_path
            )
        except OSError as exc:
            raise _connect_error(socket_path, exc) from exc
        return conn

    async def send(self, parts: list[Any], timeout: float | None) -> bool:
        protocol = self.stream
        if protocol.transport.is_closing():
            raise ConnectionResetError("the connection is closing")
        protocol.transport.writelines(parts)
        if protocol.paused:
            return await _drain(protocol, timeout)
        return False

    async def wait(self, slot: _Slot, remaining: float | None) -> None:
        if self.held:
            self.release()  # (its frame may be behind the held-back streams)
        slot.waiter = self.loop.create_future()
        try:
            async with asyncio.timeout(remaining):
                await slot.waiter
        except TimeoutError:
            pass
        finally:
            slot.waiter = None

    async def send_end(self, data: bytes, timeout: float | None) -> None:
        try:
            self.stream.transport.write(data)  # in order with other writes; no await needed
        except (OSError, RuntimeError):
            pass

    def wake(self, slot: _Slot) -> None:
        waiter = slot.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def hold(self) -> None:
        """Stop reading while streams lag, unless a call waits for a frame (it would wait on
        the held-back stream: a consumer awaiting another call mid-stream)."""
        for slot in self.slots.values():
            waiter = slot.waiter
            if waiter is not None and not waiter.done():
                return
        transport = self.stream.transport
        if not transport.is_closing():
            self.held = True
            transport.pause_reading()

    def release(self) -> None:
        self.held = False
        transport = self.stream.transport
        if not transport.is_closing():
            transport.resume_reading()

    def close_transport(self) -> None:
        self.stream.transport.close()  # (what is queued goes out first: the ENDs)

    def discard(self) -> None:
        sock = self.stream.transport.get_extra_info("socket") if self.stream else None
        raw = getattr(sock, "_sock", None)  # (asyncio's TransportSocket hides the socket)
        if raw is not None and self.loop.is_closed():
            raw.close()
        elif self.stream is not None:
            self.stream.transport.abort()

    def loop_ended(self) -> bool:
        return bool(self.loop.is_closed())

    def run_soon(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)


class _Protocol(asyncio.BufferedProtocol):
    """The asyncio side of an :class:`_AsyncioConn`: reads go straight to its calls."""

    def __init__(self, conn: _AsyncioConn, lost: Any) -> None:
        self.conn = conn
        self.lost = lost
        self.transport: Any = None
        self.buffer = bytearray(262144)
        self.view = memoryview(self.buffer)
        self.paused = False
        self.drained: list[asyncio.Future[None]] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        conn.dispatch(bytes(self.view[:nbytes]))
        if conn.broken is not None and self.transport is not None:
            self.transport.close()
        elif conn.queued > _STREAM_HIGH and not conn.held:
            conn.hold()

    def eof_received(self) -> bool:
        self.conn.fail(self.lost("the pool closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.fail(self.lost(exc or "the connection was closed"))
        self._wake_drainers()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self._wake_drainers()

    def _wake_drainers(self) -> None:
        self.paused = False
        for waiter in self.drained:
            if not waiter.done():
                waiter.set_result(None)
        self.drained.clear()

    async def drain(self) -> None:
        """Wait until the transport takes writes again (its buffer went under the limit)."""
        if self.paused:
            waiter = asyncio.get_running_loop().create_future()
            self.drained.append(waiter)
            await waiter


async def _drain(protocol: _Protocol, timeout: float | None) -> bool:
    """Wait until the transport takes writes again; True if ``timeout`` passed first (the
    connection is then dropped: part of a frame may be out)."""
    try:
        async with asyncio.timeout(timeout):
            await protocol.drain()
    except TimeoutError:
        protocol.conn.fail(_interrupted())
        protocol.transport.abort()
        return True
    return False
