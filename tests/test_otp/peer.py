"""A peer node in a thread of this OS process (its own ``trio.run``), reachable only through
distribution sockets: fast functional tests of distribution. Tests of failures that need a real
OS process (SIGKILL) start nodes as ports instead."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

import otp
import wire
from otp._dist_handshake import FEATURES, initiate

COOKIE = b"test-cookie-0123456789"


class Echo(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request == "crash":
            raise RuntimeError("remote crash")
        if request == "whoami":
            return otp.Reply(otp.node_name(), state)
        if request == "hang":
            return otp.NoReply(state)
        if request == "nodes":
            return otp.Reply(otp.nodes(), state)
        if request == "process_count":
            return otp.Reply(len(otp.processes()), state)
        if isinstance(request, tuple) and request[0] == "spawn":
            return otp.Reply(otp.spawn(_exit_on_message, request[1]), state)
        return otp.Reply(request, state)

    def handle_cast(self, request: Any, state: Any) -> Any:
        pid, message = request
        otp.send(pid, message)
        return otp.NoReply(state)

    def handle_info(self, message: Any, state: Any) -> Any:
        if isinstance(message, tuple) and len(message) == 2 and isinstance(message[0], otp.Pid):
            otp.send(message[0], ("echo", message[1]))
        return otp.NoReply(state)


async def _exit_on_message(reason: Any) -> None:
    await otp.receive()
    otp.exit_self(reason)


class PeerNode:
    """Run a node named ``name`` listening at ``address`` in a background thread."""

    def __init__(
        self,
        name: str,
        address: str,
        *,
        cookie: bytes = COOKIE,
        setup: Callable[[], Awaitable[None]] | None = None,
        **config: Any,
    ) -> None:
        self.name = name
        self.address = address
        self.config = otp.DistConfig(cookie=cookie, listen=(address,), **config)
        self.setup = setup
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self.error: BaseException | None = None
        self.listening: list[str] = []

    async def __aenter__(self) -> PeerNode:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        await trio.to_thread.run_sync(self._ready.wait, 10)
        if self.error is not None:
            raise self.error
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        assert self._thread is not None
        await trio.to_thread.run_sync(self._thread.join, 10)

    def stop(self) -> None:
        if self._token is not None and self._scope is not None:
            try:
                self._token.run_sync_soon(self._scope.cancel)
            except trio.RunFinishedError:
                pass

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test through .error
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        async with otp.open_node(self.name):
            self.listening = await otp.start_distribution(self.config)
            await Echo.start(name="echo")
            if self.setup is not None:
                await self.setup()
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self._scope:
                self._ready.set()
                await trio.sleep_forever()


@contextlib.asynccontextmanager
async def raw_peer(
    path: Path, cookie: bytes, name: str, expected: str, features: Sequence[str] = FEATURES
) -> AsyncIterator[tuple[trio.SocketStream, wire.FrameStream]]:
    """A connection made by hand to the node listening at ``path``, through the handshake as
    node ``name`` saying it understands ``features`` (its last frame is our proof, which the
    node may not have read yet), that then does only what the test writes on it."""
    stream = await trio.open_unix_socket(str(path))
    try:
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        await initiate(
            frames,
            name=name,
            creation=1,
            cookie=cookie,
            codecs=(wire.Codec.TLV,),
            listen=(),
            expected=expected,
            features=features,
        )
        yield stream, frames
    finally:
        await stream.aclose()


async def messages_to(frames: wire.FrameStream, to: str) -> AsyncIterator[Any]:
    """The messages the node sends to the name ``to`` on a hand-made connection (alone or in
    a batch)."""
    async for frame in frames:
        if frame.type is wire.MessageType.REG_SEND and frame.payload["to"] == to:
            yield frame.payload["msg"]
        elif frame.type is wire.MessageType.REG_SEND_BATCH and frame.payload["to"] == to:
            for message in frame.payload["msgs"]:
                yield message
