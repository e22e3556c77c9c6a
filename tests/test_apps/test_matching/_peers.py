"""Raw wire peers for the matching server's tests: a socket, FrameStream, typed messages."""

from __future__ import annotations

import ssl
from typing import Any

import trio

import wire


class Peer:
    """A worker or client speaking the matching protocol by hand."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.frames = wire.FrameStream(stream, versions=frozenset({2}))
        self.codec = wire.Codec.TLV

    @classmethod
    async def unix(cls, path: str) -> Peer:
        return cls(await trio.open_unix_socket(path))

    @classmethod
    async def tls(cls, host: str, port: int, context: ssl.SSLContext) -> Peer:
        tcp = await trio.open_tcp_stream(host, port)
        return cls(trio.SSLStream(tcp, context, server_hostname=host))

    async def send(self, msg: Any) -> None:
        await self.frames.send_frame(msg.to_frame(self.codec))

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> Any:
        """The next message, or None at the end of the stream."""
        try:
            frame = await self.frames.receive_frame()
        except trio.BrokenResourceError:
            return None
        return None if frame is None else wire.parse_matching(frame)

    async def receive_not_ping(self) -> Any:
        while True:
            msg = await self.receive()
            if type(msg) is not wire.MatchPing:
                return msg

    async def hello(
        self,
        role: str = "client",
        *,
        token: str = "",
        worker_id: str | None = None,
        flows: dict[str, Any] | None = None,
        codecs: tuple[str, ...] = ("cbor", "tlv"),
    ) -> Any:
        if role == "worker" and worker_id is None:
            worker_id = "w1"
        await self.send(
            wire.MatchHello(
                role,
                "session-1",
                token=token,
                worker_id=worker_id,
                codecs=codecs,
                flows=flows or {},
            )
        )
        answer = await self.receive()
        if type(answer) is wire.MatchWelcome:
            self.codec = answer.codec
        return answer

    async def call(self, rid: int, op: str, **args: Any) -> Any:
        await self.send(wire.MatchCall(op, args, rid=rid))
        return await self.receive_not_ping()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)

    async def closed(self) -> bool:
        """Read until the end of the stream; True if it ended (the server dropped us)."""
        while True:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return True
            if not data:
                return True


class MemoryBlobs:
    """A stand-in blob cache (``put``/``get``), for the tests that are not about blobs."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        key = f"k{len(self.data)}"
        self.data[key] = bytes(data)
        return key

    def get(self, key: str) -> bytes:
        return self.data[key]
