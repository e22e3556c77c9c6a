"""The flavours around the one engine per side: asyncio (the seed's example as it stands),
blocking, trio; the bridging of cancellation between asyncio and trio; readiness probes."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from apps.matching import (
    AsyncClient,
    AsyncWorker,
    Client,
    ClientOptions,
    Flow,
    Registry,
    TrioClient,
    TrioWorker,
    Worker,
    WorkerOptions,
    readiness_handler,
    rpc,
    serve_readyz,
    step,
)
from apps.matching._asyncio_handlers import _LoopThread, run_on_asyncio
from apps.matching._blobs import BlobCache
from apps.matching._errors import ClientClosed
from apps.matching._trio_thread import _call_async, _call_sync, _TrioThread

from .fake_matching_server import FakeServer

# -- the seed's example, as it stands: examples/matching/pull_workers.py -----------------------

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "matching" / "pull_workers.py"
_spec = importlib.util.spec_from_file_location("pull_workers", _EXAMPLE)
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
sys.modules["pull_workers"] = example  # (its dataclass looks its module up there)
_spec.loader.exec_module(example)
GreetingFlow = example.GreetingFlow


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ma-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def threaded_server(fake_server) -> FakeServer:
    return fake_server  # (conftest's)


# -- asyncio ----------------------------------------------------------------------------------


def test_the_seed_example_runs_a_greeting_flow_on_asyncio(threaded_server, short_dir):
    cache = BlobCache(os.path.join(short_dir, "blobs"))
    address = f"unix:{threaded_server.path}"

    async def main() -> None:
        _flow, worker, client, worker_task = await example.start_pull_greeting(cache, address)
        try:
            assert example.is_pull_greeting_ready(worker)
            flow_id = await client.start_flow(example.GreetingFlow, "world")
            assert await client.result(flow_id, timeout=30) == "Hello, world!"
            assert await client.call_rpc(flow_id, "greeting") == "Hello, world!"
            assert example.get_pull_greeting_diagnostics(worker) == example.PullGreetingDiagnostics(
                True, 0
            )
        finally:
            await example.stop_pull_greeting(worker, client, worker_task)
        assert worker_task.done() and worker_task.exception() is None
        # readable after close, and readiness is left as it was
        assert worker.pull_reserved_rpc_declines == 0
        assert example.is_pull_greeting_ready(worker)

    asyncio.run(main())


def test_an_async_worker_closed_before_it_started_returns_from_start(short_dir):
    registry = Registry([GreetingFlow], allow_async_handlers=True)
    options = WorkerOptions(server_address=os.path.join(short_dir, "none.sock"))

    async def main() -> None:
        worker = AsyncWorker(registry, BlobCache(short_dir), options)
        await worker.close()
        await worker.start()
        assert not worker.pull_registration_state().is_ready

    asyncio.run(main())


def test_async_client_calls_after_close_raise_client_closed(threaded_server, short_dir):
    async def main() -> None:
        client = AsyncClient(
            Registry([GreetingFlow], allow_async_handlers=True),
            BlobCache(short_dir),
            ClientOptions(server_address=threaded_server.path),
        )
        await client.start_flow(GreetingFlow, "x", flow_id="one")
        await client.close()
        with pytest.raises(ClientClosed):
            await client.describe_flow("one")

    asyncio.run(main())


def test_cancelling_the_asyncio_task_cancels_the_trio_side_and_waits_for_it():
    thread = _TrioThread("t", lambda: ClientClosed("closed"))
    started = threading.Event()
    ended: list[str] = []

    async def forever() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            ended.append("cancelled in trio")

    async def main() -> None:
        task = asyncio.create_task(_call_async(thread, forever))
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ended == ["cancelled in trio"]
        # the thread serves on
        await _call_async(thread, trio.lowlevel.checkpoint)

    asyncio.run(main())
    thread.stop().result()
    with pytest.raises(ClientClosed):
        _call_sync(thread, trio.lowlevel.checkpoint)


def test_a_call_still_running_when_its_thread_stops_gets_the_closed_error():
    thread = _TrioThread("t", lambda: ClientClosed("the client is closed"))
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await trio.sleep_forever()

    errors: list[BaseException] = []

    def call() -> None:
        try:
            _call_sync(thread, forever)
        except BaseException as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    started.wait()
    thread.stop().result()
    caller.join()
    assert isinstance(errors[0], ClientClosed)


async def test_a_cancelled_async_handler_is_cancelled_on_its_loop_and_waited_for():
    loops = _LoopThread("handlers")
    loop = loops.loop()
    started = threading.Event()
    ended: list[str] = []

    async def handler() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # cleanup that takes a turn of the loop
            ended.append("cleaned up")
            raise

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_when_started() -> None:
                await trio.to_thread.run_sync(started.wait)
                scope.cancel()

            nursery.start_soon(cancel_when_started)
            await run_on_asyncio(loop, handler)
    assert ended == ["cleaned up"]
    assert await run_on_asyncio(loop, lambda: asyncio.sleep(0, result=42)) == 42
    await trio.to_thread.run_sync(loops.stop)


async def test_an_async_handler_error_is_raised_in_trio():
    loops = _LoopThread("handlers")

    async def handler() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        await run_on_asyncio(loops.loop(), handler)
    await trio.to_thread.run_sync(loops.stop)


# -- blocking ---------------------------------------------------------------------------------


class Blocking(Flow):
    name = "Blocking"

    @step
    def first(self, ctx, n):
        ctx.state["thread"] = threading.current_thread().name
        return n + 1

    @step
    async def second(self, ctx, n):
        await asyncio.sleep(0)
        return n * 10

    @rpc
    def where(self, ctx):
        return ctx.state["thread"]


def test_blocking_worker_and_client_run_sync_and_async_handlers(threaded_server, short_dir):
    registry = Registry([Blocking], allow_async_handlers=True)
    cache = BlobCache(os.path.join(short_dir, "blobs"), inline_limit=4)
    with (
        Worker(registry, cache, WorkerOptions(server_address=threaded_server.path)) as worker,
        Client(registry, cache, ClientOptions(server_address=threaded_server.path)) as client,
    ):
        worker.wait_pull_registered(timeout=30)
        assert worker.is_ready()
        flow_id = client.start_flow(Blocking, 4)
        assert client.result(flow_id, timeout=30) == 50
        assert client.call_rpc(flow_id, "where") not in ("MainThread", "matching-worker")
        assert client.describe_flow(flow_id).status == "completed"
        assert [s.flow_id for s in client.list_flows(Blocking)] == [flow_id]
    assert worker.pull_registration_state().is_ready


def test_blocking_worker_start_blocks_until_close_from_another_thread(threaded_server, short_dir):
    registry = Registry([Blocking], allow_async_handlers=True)
    worker = Worker(
        registry, BlobCache(short_dir), WorkerOptions(server_address=threaded_server.path)
    )
    returned = threading.Event()

    def serve() -> None:
        worker.start()
        returned.set()

    thread = threading.Thread(target=serve)
    thread.start()
    worker.wait_pull_registered(timeout=30)
    assert not returned.is_set()
    worker.close()
    thread.join()
    assert returned.is_set()


# -- trio -------------------------------------------------------------------------------------


@pytest.fixture
async def server(short_dir):
    fake = FakeServer(os.path.join(short_dir, "t.sock"), BlobCache(os.path.join(short_dir, "sb")))
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        yield fake
        nursery.cancel_scope.cancel()


class TrioGreeting(Flow):
    name = "Greeting"

    @step
    async def greet(self, ctx, who):
        await trio.sleep(0)
        ctx.state["greeting"] = f"Hello, {who}!"
        return ctx.state["greeting"]


async def test_trio_worker_and_client_are_the_engines(server, short_dir):
    registry = Registry([TrioGreeting], allow_async_handlers=True)
    cache = BlobCache(short_dir)
    worker = TrioWorker(registry, cache, WorkerOptions(server_address=server.path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.start)
        async with TrioClient(registry, cache, ClientOptions(server_address=server.path)) as client:
            await worker.wait_pull_registered(timeout=30)
            flow_id = await client.start_flow(TrioGreeting, "trio")
            assert await client.result(flow_id) == "Hello, trio!"
        await worker.close()


# -- readiness --------------------------------------------------------------------------------


class _State:
    def __init__(self, ready: bool) -> None:
        self.is_ready = ready


class _Probe:
    def __init__(self) -> None:
        self.ready = False

    def pull_registration_state(self) -> _State:
        return _State(self.ready)


def test_readiness_handler_is_200_when_ready_else_503():
    probe = _Probe()
    assert readiness_handler(probe) == (503, b"not ready\n")
    probe.ready = True
    assert readiness_handler(probe) == (200, b"ready\n")


async def _get(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    response = b""
    while data := await stream.receive_some(4096):
        response += data
    await stream.aclose()
    return response


async def test_serve_readyz_answers_probes():
    probe = _Probe()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_readyz, probe, "127.0.0.1", 0)
        port = listeners[0].socket.getsockname()[1]
        get = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
        response = await _get(port, get)
        assert response.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert response.endswith(b"\r\n\r\nnot ready\n")
        probe.ready = True
        assert (await _get(port, get)).startswith(b"HTTP/1.1 200 OK\r\n")
        assert (await _get(port, b"GET /other HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await _get(port, b"POST /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        head = await _get(port, b"HEAD /readyz HTTP/1.1\r\n\r\n")
        assert head.endswith(b"Connection: close\r\n\r\n")
        nursery.cancel_scope.cancel()


# -- against the real server ------------------------------------------------------------------


class BigGreeting(Flow):
    name = "BigGreeting"

    @step
    async def greet(self, ctx, who, payload):
        ctx.state["greeting"] = f"Hello, {who}!"
        return [ctx.state["greeting"], payload * 2]

    @rpc
    def greeting(self, ctx):
        return ctx.state.get("greeting")


async def test_trio_flavour_against_the_real_server(store_kind, short_dir):
    import otp
    import supervisors
    from apps.matching._application import application
    from apps.matching._config import MatchingConfig

    sock = os.path.join(short_dir, "real.sock")
    registry = Registry([BigGreeting], allow_async_handlers=True)
    payload = os.urandom(300_000)
    async with otp.open_node():
        config = MatchingConfig(listen=[f"unix:{sock}"], store=store_kind.durable)
        await supervisors.start_application(application(matching_config=config))
        worker = TrioWorker(
            registry, BlobCache(os.path.join(short_dir, "w")), WorkerOptions(server_address=sock)
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.start)
            async with TrioClient(
                registry,
                BlobCache(os.path.join(short_dir, "c")),
                ClientOptions(server_address=sock),
            ) as client:
                await worker.wait_pull_registered(timeout=30)
                flow_id = await client.start_flow(BigGreeting, "real", payload)
                assert await client.result(flow_id, timeout=30) == ["Hello, real!", payload * 2]
                assert (await client.describe_flow(flow_id)).status == "completed"
            await worker.close()
        await supervisors.stop_application("matching")


def test_the_seed_example_against_the_real_server(store_kind, short_dir):
    import otp
    import supervisors
    from apps.matching._application import application
    from apps.matching._config import MatchingConfig

    sock = os.path.join(short_dir, "real.sock")
    ready = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []
    stop = trio.Event()

    async def serve() -> None:
        async with otp.open_node():
            config = MatchingConfig(listen=[f"unix:{sock}"], store=store_kind.durable)
            await supervisors.start_application(application(matching_config=config))
            token.append(trio.lowlevel.current_trio_token())
            ready.set()
            await stop.wait()
            await supervisors.stop_application("matching")

    server = threading.Thread(target=trio.run, args=(serve,))
    server.start()
    assert ready.wait(30)

    async def main() -> None:
        cache = BlobCache(os.path.join(short_dir, "blobs"))
        _flow, worker, client, worker_task = await example.start_pull_greeting(
            cache, f"unix:{sock}"
        )
        try:
            assert example.is_pull_greeting_ready(worker)
            flow_id = await client.start_flow(example.GreetingFlow, "world")
            assert await client.result(flow_id, timeout=30) == "Hello, world!"
            assert example.get_pull_greeting_diagnostics(worker) == example.PullGreetingDiagnostics(
                True, 0
            )
        finally:
            await example.stop_pull_greeting(worker, client, worker_task)

    try:
        asyncio.run(main())
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token[0])
        server.join(30)


# -- start_known_flow and list_queues, on every flavour ----------------------------------------


async def test_every_client_flavour_starts_a_known_flow_and_lists_queues(store_kind, short_dir):
    """A client with an empty registry starts flows of a type only the worker registered (the
    worker sent its definition at connect), and sees the queues the worker's streams are on."""
    from ._in_process import matching_server

    async with matching_server(store_kind) as address:
        worker = TrioWorker(
            Registry([TrioGreeting], allow_async_handlers=True),
            None,
            WorkerOptions(server_address=address),
        )
        options = ClientOptions(server_address=address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.start)
            await worker.wait_pull_registered(timeout=30)
            async with TrioClient(Registry(()), None, options) as trio_client:
                flow_id = await trio_client.start_known_flow("Greeting", "trio", flow_id="t")
                trio_result = await trio_client.result(flow_id, timeout=30)
                trio_queues = await trio_client.list_queues()

            def blocking() -> tuple[Any, Any]:
                with Client(Registry(()), None, options) as client:
                    flow_id = client.start_known_flow("Greeting", "blocking")
                    return client.result(flow_id, timeout=30), client.list_queues()

            async def on_asyncio() -> tuple[Any, Any]:
                async with AsyncClient(Registry(()), None, options) as client:
                    flow_id = await client.start_known_flow("Greeting", "asyncio")
                    return await client.result(flow_id, timeout=30), await client.list_queues()

            blocking_answers = await trio.to_thread.run_sync(blocking)
            asyncio_answers = await trio.to_thread.run_sync(asyncio.run, on_asyncio())
            await worker.close()
    assert trio_result == "Hello, trio!"
    assert blocking_answers[0] == "Hello, blocking!"
    assert asyncio_answers[0] == "Hello, asyncio!"
    for queues in (trio_queues, blocking_answers[1], asyncio_answers[1]):
        by_name = {(q.kind, q.name): q for q in queues}
        greeting = by_name["flow", "Greeting"]
        assert greeting.streams >= 1 and greeting.waiting == 0 and greeting.workers == 1
        assert ("worker", worker.app_worker_id) in by_name
