"""A scripted stand-in for the matching server, speaking ARCHITECTURE.md's wire table over a
real Unix socket: it answers HELLO, registers streams by a policy, records every frame, and
lets a test offer tasks and drop connections. For the SDK's own tests (worker engine, SDK
connection) while the real server is tested on its own."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import trio

import wire

RegisterPolicy = Callable[["FakeConn", wire.MatchRegister], "wire.MatchMessage | None"]


def register_all(conn: FakeConn, message: wire.MatchRegister) -> wire.MatchMessage | None:
    return wire.MatchRegistered(queue=message.queue, name=message.name, rid=message.rid)


class FakeConn:
    """One accepted connection, as the server sees it."""

    def __init__(self, server: FakeServer, frames: wire.FrameStream, hello: wire.MatchHello):
        self.server = server
        self.frames = frames
        self.hello = hello
        self.codec = hello.codecs[0]
        self.received: list[wire.MatchMessage] = []
        #: For each message of ``received``, the number of the socket read that brought it.
        self.reads: list[int] = []
        #: Each message of ``received`` -> the trio time it was read at.
        self.times: list[float] = []
        self.registers: dict[int, wire.MatchRegister] = {}
        self.registered: set[int] = set()
        self.busy: set[int] = set()
        self.open = True
        self._lock = trio.Lock()

    async def send(self, message: wire.MatchMessage) -> None:
        async with self._lock:
            await self.frames.send_frame(message.to_frame(self.codec))

    async def drop(self) -> None:
        """Close the socket at once, as a crashed server would."""
        self.open = False
        await trio.aclose_forcefully(self.frames.stream)
        self.server.kick()

    def queue_of(self, stream_id: int) -> str:
        register = self.registers[stream_id]
        return f"{register.queue}:{register.name}"

    def streams_of(self, queue: str) -> list[int]:
        """Registered (open) stream ids of ``queue`` (``flow:<type>`` or ``worker:<id>``)."""
        return sorted(s for s in self.registered if self.queue_of(s) == queue)

    def idle_of(self, queue: str) -> list[int]:
        return [s for s in self.streams_of(queue) if s not in self.busy]

    def of_type(self, cls: type, stream_id: int | None = None) -> list[Any]:
        return [
            m
            for m in self.received
            if isinstance(m, cls) and (stream_id is None or getattr(m, "rid", None) == stream_id)
        ]

    def read_together(self, *messages: wire.MatchMessage) -> bool:
        """Whether ``messages`` (received, in this order) came in one read of the socket, one
        right after the other (one write of the worker's)."""
        indices = [self.received.index(m) for m in messages]
        return all(b == a + 1 for a, b in itertools.pairwise(indices)) and (
            len({self.reads[i] for i in indices}) == 1
        )

    def time_of(self, message: wire.MatchMessage) -> float:
        """When ``message`` (received) was read, on trio's clock."""
        return self.times[self.received.index(message)]

    def answer_to(self, delivery: int) -> Any:
        for m in self.received:
            if isinstance(m, wire.MatchAccept | wire.MatchDecline) and m.delivery == delivery:
                return m
        return None

    def outcome_of(self, delivery: int) -> Any:
        for m in self.received:
            if isinstance(m, wire.MatchResult | wire.MatchFailure) and m.delivery == delivery:
                return m
        return None

    async def offer(self, queue: str, **task: Any) -> tuple[int, int, Any]:
        """Offer a task (as :meth:`offer_nowait`) and wait for its answer; returns (stream id,
        delivery, the ACCEPT or DECLINE)."""
        stream_id, delivery = await self.offer_nowait(queue, **task)
        server = self.server
        await server.wait_for(lambda: self.answer_to(delivery) is not None or not self.open)
        answer = self.answer_to(delivery)
        if not isinstance(answer, wire.MatchAccept):
            self.busy.discard(stream_id)
        return stream_id, delivery, answer

    async def offer_nowait(
        self,
        queue: str,
        *,
        flow_type: str,
        name: str,
        kind: str = "step",
        args: list[Any] | None = None,
        state: dict[str, Any] | None = None,
        stream_id: int | None = None,
        timeout: float | None = None,
    ) -> tuple[int, int]:
        """Write a TASK on an idle stream of ``queue`` without waiting for its answer;
        returns (stream id, delivery)."""
        server = self.server
        if stream_id is None:
            await server.wait_for(lambda: bool(self.idle_of(queue)))
            stream_id = self.idle_of(queue)[0]
        delivery = next(server.deliveries)
        self.busy.add(stream_id)
        await self.send(
            wire.MatchTask(
                delivery=delivery,
                kind=kind,
                flow_type=flow_type,
                flow_id=f"flow-{delivery}",
                name=name,
                execution_id=f"flow-{delivery}/0/{name}",
                attempt=1,
                args=list(args or []),
                state=dict(state or {}),
                timeout=timeout,
                rid=stream_id,
            )
        )
        return stream_id, delivery

    async def wait_outcome(self, delivery: int) -> Any:
        await self.server.wait_for(lambda: self.outcome_of(delivery) is not None)
        return self.outcome_of(delivery)


class FakeServer:
    """Listens on ``path``; ``policy`` answers each M_REGISTER (None: no answer)."""

    def __init__(self, path: str, *, policy: RegisterPolicy = register_all) -> None:
        self.path = path
        self.policy = policy
        self.welcome_error: wire.MatchError | None = None
        self.silent = False
        #: What WELCOME tells the worker (the server's wait for a silent peer).
        self.peer_timeout = 30.0
        self.conns: list[FakeConn] = []
        self.deliveries = itertools.count(1)
        self._changed = trio.Event()

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    @property
    def conn(self) -> FakeConn:
        return self.conns[-1]

    def kick(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def wait_conns(self, n: int) -> FakeConn:
        await self.wait_for(lambda: len(self.conns) >= n)
        return self.conns[n - 1]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen()
        listener = trio.SocketListener(sock)
        async with listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._handle, stream)

    async def _answer(self, conn: FakeConn, message: wire.MatchMessage) -> None:
        """What the scripted server answers by itself: REGISTER by its policy, the worker's
        ``define_flows`` at connect as the server does (tests answer other calls)."""
        if isinstance(message, wire.MatchRegister):
            conn.registers[message.rid] = message
            answer = self.policy(conn, message)
            if isinstance(answer, wire.MatchRegistered):
                conn.registered.add(message.rid)
            if answer is not None:
                await conn.send(answer)
        elif isinstance(message, wire.MatchCall) and message.op == "define_flows":
            await conn.send(wire.MatchReply(None, rid=message.rid))

    async def _handle(self, stream: trio.abc.Stream) -> None:
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        try:
            first = await frames.receive_frame()
            assert first is not None
            hello = wire.parse_matching(first)
            assert isinstance(hello, wire.MatchHello)
            if self.silent:
                await trio.sleep_forever()
            if self.welcome_error is not None:
                await frames.send_frame(self.welcome_error.to_frame())
                await stream.aclose()
                return
            conn = FakeConn(self, frames, hello)
            await frames.send_frame(
                wire.MatchWelcome(
                    server="fake",
                    codec=conn.codec,
                    ping_interval=10.0,
                    peer_timeout=self.peer_timeout,
                ).to_frame()
            )
            self.conns.append(conn)
            self.kick()
            reads = itertools.count()
            while conn.open:
                try:
                    batch = await frames.receive_frames()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not batch:
                    break
                read = next(reads)
                for frame in batch:
                    message = wire.parse_matching(frame)
                    conn.received.append(message)
                    conn.reads.append(read)
                    conn.times.append(trio.current_time())
                    try:
                        await self._answer(conn, message)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        conn.open = False  # the peer went away before its answer
                        break
                    if isinstance(message, wire.MatchClose):
                        conn.registered.discard(message.rid)
                    elif isinstance(message, wire.MatchResult | wire.MatchFailure):
                        conn.busy.discard(message.rid)
                    self.kick()
            conn.open = False
            self.kick()
        finally:
            await trio.aclose_forcefully(stream)
