"""A small in-test matching server: real Unix sockets and ``wire.FrameStream`` frames, speaking
the protocol table of ``apps/matching/ARCHITECTURE.md`` with a toy engine (steps in order,
retries without backoff, RPCs to any registered stream). For the SDK's tests only.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import wire
from apps.matching import FlowFailed, FlowNotFound, MatchingError, UnknownFlowType
from apps.matching._blobs import BlobCache

Op = Callable[[dict[str, Any]], Awaitable[Any]]


class _Peer:
    def __init__(self, fs: wire.FrameStream, role: str, worker_id: str | None) -> None:
        self.fs = fs
        self.role = role
        self.worker_id = worker_id
        self.lock = trio.Lock()

    async def send(self, message: Any) -> None:
        async with self.lock:
            await self.fs.send_frame(message.to_frame(self.fs.codec or wire.Codec.TLV))


class _Stream:
    def __init__(self, peer: _Peer, rid: int, queue: str, name: str) -> None:
        self.peer = peer
        self.rid = rid
        self.queue = queue
        self.name = name
        self.busy = False


class FakeServer:
    """Serve on ``path``; ``ops`` may override or add client ops; ``calls`` records them."""

    def __init__(self, path: str, blobs: BlobCache) -> None:
        self.path = path
        self.blobs = blobs
        self.ops: dict[str, Op] = {
            "start_flow": self._start_flow,
            "call_rpc": self._call_rpc,
            "result": self._result,
            "describe": self._describe,
            "list": self._list,
            "cancel": self._cancel,
            "put_blob": self._put_blob,
            "get_blob": self._get_blob,
        }
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.hellos: list[wire.MatchHello] = []
        self.connections = 0
        #: Connection-level M_PONGs received (answers to :meth:`ping_clients`).
        self.pongs = 0
        self.ponged = trio.Event()
        self.peers: list[_Peer] = []
        self.streams: list[_Stream] = []
        self.flows: dict[str, dict[str, Any]] = {}
        self._changed = trio.Event()
        self._deliveries = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel[Any]] = {}
        self._ids = itertools.count(1)
        self.nursery: trio.Nursery | None = None
        self.listener: trio.SocketListener | None = None

    # -- serving ----------------------------------------------------------------------------

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen(64)
        self.listener = trio.SocketListener(sock)
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            task_status.started(self)
            await trio.serve_listeners(self._serve_one, [self.listener], handler_nursery=nursery)

    async def drop_connections(self) -> None:
        """Close every connection (the clients see the connection lost)."""
        for peer in list(self.peers):
            await peer.fs.stream.aclose()

    async def ping_clients(self) -> None:
        """Send a connection-level M_PING on every connection (as the server's keepalive)."""
        for peer in list(self.peers):
            await peer.send(wire.MatchPing())

    async def _serve_one(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        fs = wire.FrameStream(stream, versions=frozenset({2}))
        try:
            frame = await fs.receive_frame()
            if frame is None:
                return
            hello = wire.parse_matching(frame)
            assert isinstance(hello, wire.MatchHello)
            self.hellos.append(hello)
            codec = hello.codecs[0]
            await fs.send_frame(
                wire.MatchWelcome("fake", codec, ping_interval=60.0, peer_timeout=180.0).to_frame()
            )
            fs.codec = codec
            peer = _Peer(fs, hello.role, hello.worker_id)
            self.peers.append(peer)
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        frame = await fs.receive_frame()
                    except (trio.BrokenResourceError, trio.ClosedResourceError, wire.WireError):
                        frame = None
                    if frame is None:
                        break
                    nursery.start_soon(self._handle, peer, wire.parse_matching(frame))
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, wire.WireError):
            pass
        finally:
            self.streams = [s for s in self.streams if s.peer.fs is not fs]
            self.peers = [p for p in self.peers if p.fs is not fs]
            self._poke()
            with trio.CancelScope(shield=True):
                await fs.stream.aclose()

    async def _handle(self, peer: _Peer, message: Any) -> None:
        if isinstance(message, wire.MatchCall):
            self.calls.append((message.op, message.args))
            try:
                op = self.ops.get(message.op)
                if op is None:
                    raise MatchingError(f"unknown op {message.op}")
                value = await op(message.args)
            except MatchingError as exc:
                await peer.send(
                    wire.MatchError(
                        exc.code,
                        exc.message,
                        retryable=exc.retryable,
                        details=exc.details,
                        rid=message.rid,
                    )
                )
            else:
                await peer.send(wire.MatchReply(value, rid=message.rid))
        elif isinstance(message, wire.MatchRegister):
            self.streams.append(_Stream(peer, message.rid, message.queue, message.name))
            await peer.send(wire.MatchRegistered(message.queue, message.name, rid=message.rid))
            self._poke()
        elif isinstance(message, wire.MatchClose):
            self.streams = [
                s for s in self.streams if not (s.peer is peer and s.rid == message.rid)
            ]
        elif isinstance(message, wire.MatchPing):
            await peer.send(wire.MatchPong(rid=message.rid))
        elif isinstance(message, wire.MatchPong) and message.rid == 0:
            self.pongs += 1
            self.ponged.set()
            self.ponged = trio.Event()
        elif isinstance(
            message, wire.MatchAccept | wire.MatchDecline | wire.MatchResult | wire.MatchFailure
        ):
            channel = self._pending.get(message.delivery)
            if channel is not None:
                channel.send_nowait(message)

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- dispatch -----------------------------------------------------------------------------

    async def dispatch(self, kind: str, flow: dict[str, Any], name: str, args: list[Any]) -> Any:
        """Offer a task to an idle stream of the flow's queue until one runs it; the stream's
        RESULT or FAILURE message."""
        declined: set[int] = set()
        while True:
            idle = [
                s
                for s in self.streams
                if s.queue == "flow"
                and s.name == flow["flow_type"]
                and not s.busy
                and id(s) not in declined
            ]
            if not idle:
                await self._changed.wait()
                declined.clear()
                continue
            stream = idle[0]
            stream.busy = True
            delivery = next(self._deliveries)
            send, receive = trio.open_memory_channel[Any](10)
            self._pending[delivery] = send
            try:
                await stream.peer.send(
                    wire.MatchTask(
                        delivery,
                        kind,
                        flow["flow_type"],
                        flow["flow_id"],
                        name,
                        f"{flow['flow_id']}/{flow['step_index']}/{name}",
                        flow["attempt"],
                        args,
                        dict(flow["state"]),
                        None,
                        rid=stream.rid,
                    )
                )
                answer = await receive.receive()
                if isinstance(answer, wire.MatchDecline):
                    declined.add(id(stream))
                    continue
                return await receive.receive()
            finally:
                del self._pending[delivery]
                stream.busy = False
                self._poke()

    # -- client ops ---------------------------------------------------------------------------

    def _flow(self, flow_id: str) -> dict[str, Any]:
        try:
            return self.flows[flow_id]
        except KeyError:
            raise FlowNotFound(f"no flow {flow_id!r}") from None

    async def _start_flow(self, args: dict[str, Any]) -> str:
        if args["flow_type"] == "Unknown":
            raise UnknownFlowType(f"no flow type {args['flow_type']!r}")
        flow_id = args["flow_id"] or f"flow-{next(self._ids)}"
        flow = {
            "flow_id": flow_id,
            "flow_type": args["flow_type"],
            "args": args["args"],
            "definition": args["definition"],
            "status": "running",
            "state": {},
            "result": None,
            "error": None,
            "step_index": 0,
            "attempt": 1,
            "done": trio.Event(),
        }
        self.flows[flow_id] = flow
        assert self.nursery is not None
        self.nursery.start_soon(self._run_flow, flow)
        return flow_id

    async def _run_flow(self, flow: dict[str, Any]) -> None:
        args = list(flow["args"])
        with trio.CancelScope() as scope:
            flow["scope"] = scope
            for index, step in enumerate(flow["definition"]["steps"]):
                flow["step_index"] = index
                for attempt in range(1, step["max_attempts"] + 1):
                    flow["attempt"] = attempt
                    answer = await self.dispatch("step", flow, step["name"], args)
                    if isinstance(answer, wire.MatchResult):
                        for key in answer.patch["delete"]:
                            flow["state"].pop(key, None)
                        flow["state"].update(answer.patch["set"])
                        args = [answer.value]
                        break
                    flow["error"] = {"type": answer.type, "message": answer.message}
                else:
                    flow["status"] = "failed"
                    flow["done"].set()
                    return
            flow["status"] = "completed"
            flow["result"] = args[0] if args else None
        if scope.cancelled_caught:
            flow["status"] = "cancelled"
        flow["done"].set()

    async def _call_rpc(self, args: dict[str, Any]) -> Any:
        flow = self._flow(args["flow_id"])
        answer = await self.dispatch("rpc", flow, args["name"], args["args"])
        if isinstance(answer, wire.MatchFailure):
            raise MatchingError(answer.message, details={"type": answer.type})
        for key in answer.patch["delete"]:
            flow["state"].pop(key, None)
        flow["state"].update(answer.patch["set"])
        return answer.value

    async def _result(self, args: dict[str, Any]) -> Any:
        flow = self._flow(args["flow_id"])
        timeout = args["timeout"]
        with trio.move_on_after(float("inf") if timeout is None else timeout) as scope:
            await flow["done"].wait()
        if scope.cancelled_caught:
            from apps.matching import CallTimeout

            raise CallTimeout(f"flow {flow['flow_id']} still running after {timeout} s")
        if flow["status"] != "completed":
            raise FlowFailed(f"flow {flow['flow_id']} {flow['status']}", details=flow["error"])
        return flow["result"]

    def _describe_one(self, flow: dict[str, Any]) -> dict[str, Any]:
        return {
            "flow_id": flow["flow_id"],
            "flow_type": flow["flow_type"],
            "status": flow["status"],
            "args": flow["args"],
            "state": flow["state"],
            "result": flow["result"],
            "error": flow["error"],
            "step_index": flow["step_index"],
            "sticky_worker": None,
            "created_at": 1.0,
            "updated_at": 2.0,
            "attempts": [],
            "dispatches": [],
        }

    async def _describe(self, args: dict[str, Any]) -> Any:
        return self._describe_one(self._flow(args["flow_id"]))

    async def _list(self, args: dict[str, Any]) -> Any:
        rows = [
            self._describe_one(f)
            for f in reversed(self.flows.values())
            if args["flow_type"] in (None, f["flow_type"]) and args["status"] in (None, f["status"])
        ]
        keys = ("flow_id", "flow_type", "status", "created_at", "updated_at")
        return [{k: row[k] for k in keys} for row in rows[: args["limit"]]]

    async def _cancel(self, args: dict[str, Any]) -> None:
        flow = self._flow(args["flow_id"])
        scope = flow.get("scope")
        if scope is not None:
            scope.cancel()

    async def _put_blob(self, args: dict[str, Any]) -> str:
        return await trio.to_thread.run_sync(self.blobs.put, args["data"])

    async def _get_blob(self, args: dict[str, Any]) -> bytes:
        try:
            return await trio.to_thread.run_sync(self.blobs.get, args["key"])
        except KeyError as exc:
            raise FlowNotFound(str(exc)) from None


class ThreadedFakeServer:
    """A :class:`FakeServer` in a ``trio.run`` of its own thread, for asyncio and blocking
    programs."""

    def __init__(self, path: str, blobs: BlobCache) -> None:
        self.server = FakeServer(path, blobs)
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.server.serve)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def __enter__(self) -> FakeServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self.server

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``fn`` in the server's trio thread."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None and self._token is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)
        if os.path.exists(self.server.path):
            os.unlink(self.server.path)
