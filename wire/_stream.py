"""FrameStream: frames over any ``trio.abc.Stream`` (a socket, a pipe, a TLS stream).

The I/O shell around the sans-IO :class:`~wire.FrameDecoder`, in the spirit of trio's own
wrappers: one reader task and one writer task at a time, every method a checkpoint.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterator, Iterable

import trio

from ._frame import Codec, Frame, FrameDecoder, encode_frame
from ._limits import Limits

__all__ = ["FrameStream"]

_DEFAULT_LIMITS = Limits()


class FrameStream:
    """Send and receive :class:`Frame` objects over a byte stream.

    Args:
        stream: Any ``trio.abc.Stream`` (or an object with ``send_all``, ``receive_some`` and
            ``aclose``).
        limits: Limits for both directions (the ``limits`` attribute; setting it applies to
            the frames sent and received after, say a tight limit until a handshake is done).
        versions: Protocol versions accepted when receiving.
        codec: If given, version 2 payloads are sent with this codec whatever ``frame.codec``
            says (the codec negotiated for the connection).
        coerce_keys: Version 1 compatibility mode for sending (``str(key)`` for non-str keys).
        receive_size: The most bytes asked of the stream at once.
        exact: Read no byte past the end of the frame being received (the ``exact``
            attribute), so the bytes behind it stay in the stream and are decoded under the
            limits set after it: a handshake's last frame, followed at once by the
            connection's traffic. Costs a read or two per frame; meant for a few frames only.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        limits: Limits = _DEFAULT_LIMITS,
        versions: frozenset[int] = frozenset({1, 2}),
        codec: Codec | None = None,
        coerce_keys: bool = False,
        receive_size: int = 65536,
        exact: bool = False,
    ) -> None:
        self.stream = stream
        self.codec = codec
        self._limits = limits
        self._coerce_keys = coerce_keys
        self._receive_size = receive_size
        self._decoder = FrameDecoder(limits=limits, versions=versions)
        self._ready: deque[Frame] = deque()
        self._eof = False
        self.exact = exact
        # A plain socket is read straight from its descriptor (see _receive_some).
        self._socket = stream.socket if type(stream) is trio.SocketStream else None

    @property
    def limits(self) -> Limits:
        """The limits for both directions."""
        return self._limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self._limits = limits
        self._decoder.limits = limits

    def _encode(self, frame: Frame) -> bytes:
        return encode_frame(
            frame, codec=self.codec, coerce_keys=self._coerce_keys, limits=self._limits
        )

    async def send_frame(self, frame: Frame) -> None:
        """Encode ``frame`` and write it in one ``send_all``.

        On cancellation the frame may have been partly written; the stream is then unusable, as
        with any trio stream whose ``send_all`` was cancelled.

        Raises:
            WireError: The frame cannot be encoded (nothing was written).
        """
        await self.stream.send_all(self._encode(frame))

    async def send_frames(self, frames: Iterable[Frame]) -> None:
        """Encode several frames and write them together in one ``send_all``.

        Every frame is encoded before anything is written, so an encoding error writes nothing.
        Cancellation is as for :meth:`send_frame`.
        """
        data = b"".join([self._encode(frame) for frame in frames])
        if data:
            await self.stream.send_all(data)
        else:
            await trio.lowlevel.checkpoint()

    async def receive_frame(self) -> Frame | None:
        """Return the next frame, or ``None`` at a clean end of stream.

        A clean end is one that falls between frames; an end inside a frame raises
        :class:`Truncated`. Cancellation loses nothing: bytes already read stay buffered for the
        next call.

        Raises:
            WireError: The peer sent malformed bytes (the stream cannot recover; close it).
        """
        received = False
        while not self._ready:
            self._decoder.feed(b"")  # raises an error found after the last frame delivered
            if self._eof:
                await trio.lowlevel.checkpoint()
                return None
            data = await self._receive_some(self._read_size())
            received = True
            if not data:
                self._eof = True
                self._decoder.feed_eof()
                return None
            self._ready.extend(self._decoder.feed(data))
        if not received:
            # receive_some was a checkpoint already; a frame from the buffer needs its own.
            await trio.lowlevel.checkpoint()
        return self._ready.popleft()

    async def _receive_some(self, size: int) -> bytes | bytearray:
        """``stream.receive_some(size)``; a plain socket's waits for the descriptor to be
        readable, then reads it once. ``SocketStream.receive_some`` tries to read first, and
        a reader that has taken everything (as a frame reader nearly always has) pays a failed
        ``recv``, its ``BlockingIOError`` and two context managers for it: about 25 us of the
        ~130 us of CPU a matching server spent per frame read. (It waits on the descriptor,
        not the socket: trio would ask the socket for it again, a Python call.)"""
        sock = self._socket
        if sock is None:
            return await self.stream.receive_some(size)
        while True:
            fd = sock.fileno()
            if fd == -1:
                raise trio.ClosedResourceError("the socket was closed")
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, size)
            except BlockingIOError:
                continue  # (readable was a false alarm: wait again)
            except OSError as exc:
                raise trio.BrokenResourceError(f"reading failed ({exc})") from exc

    def _read_size(self) -> int:
        if not self.exact:
            return self._receive_size
        # What the frame being decoded still needs (its header, then its payload): the
        # decoder never holds a byte of the next frame, so that one meets the limits in force
        # when it is read.
        decoder = self._decoder
        return max(1, decoder._need - decoder.buffered)

    async def receive_frames(self) -> list[Frame]:
        """Return every frame available now (at least one, reading if needed), or ``[]`` at a
        clean end of stream: one checkpoint for a whole batch, for readers that keep up with
        many small frames.

        Raises:
            WireError: as :meth:`receive_frame`.
        """
        ready = self._ready
        if ready or self._eof or self.exact:
            first = await self.receive_frame()
            if first is None:
                return []
            batch = [first]
            while ready:
                batch.append(ready.popleft())
            return batch
        decoder = self._decoder
        while True:
            # Most reads complete whole frames: hand the decoder's list over as it is.
            if decoder._error is not None:  # (an error found after the last frame delivered)
                raise decoder._error
            data = await self._receive_some(self._receive_size)
            if not data:
                self._eof = True
                decoder.feed_eof()
                return []
            frames = decoder.feed(data)
            if frames:
                return frames

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[Frame]:
        while (frame := await self.receive_frame()) is not None:
            yield frame

    async def aclose(self) -> None:
        """Close the underlying stream."""
        await self.stream.aclose()
