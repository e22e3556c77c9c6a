"""The matching server as an application: ``matching_sup``'s tree, a flow from a client to a
worker and back over the real socket, parallel calls, a clean stop, and the node CLI; each on
both kinds of store (``store_kind``), its calls in worker threads as a node runs them."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import otp
import supervisors
import wire
from apps.matching._application import application, default_application
from apps.matching._config import MatchingConfig
from apps.matching._listener import Listener
from apps.matching._server_id import local_server_id
from otp import node

from ._peers import Peer
from ._stores import StoreKind

ROOT = Path(__file__).resolve().parents[3]
FLOWS = {"greeting": {"steps": ["write"], "rpcs": ["read"]}}
DEFINITION = {
    "steps": [
        {
            "name": "write",
            "max_attempts": 1,
            "initial_backoff": 1.0,
            "backoff_coefficient": 2.0,
            "max_backoff": 10.0,
            "timeout": None,
        }
    ],
    "rpcs": ["read"],
}


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "m.sock")


@pytest.fixture
async def start(sock: str, store_kind: StoreKind) -> AsyncIterator[Callable[..., Any]]:
    """``await start(**MatchingConfig fields)`` starts the application in this node."""
    async with otp.open_node():
        started = False

        last: dict[str, Any] = {}

        async def go(**kw: Any) -> MatchingConfig:
            nonlocal started
            kw.setdefault("listen", [f"unix:{sock}"])
            kw.setdefault("store", store_kind.durable)
            last.update(kw)
            config = MatchingConfig(**kw)
            await supervisors.start_application(application(matching_config=config))
            started = True
            return config

        async def restart() -> MatchingConfig:
            """Stop the application and start it again with the same settings."""
            await supervisors.stop_application("matching")
            return await go(**last)

        go.restart = restart  # type: ignore[attr-defined]
        yield go
        if started and any(a[0] == "matching" for a in await supervisors.which_applications()):
            await supervisors.stop_application("matching")


async def test_the_tree_is_architectures_and_the_socket_is_private(start: Any, sock: str) -> None:
    await start()
    children = await supervisors.which_children("matching_sup")
    assert [c[0] for c in children] == [
        "listener",
        "connections",
        "leases",
        "engine",
        "cluster",
        "matcher",
        "queues",
        "store",
    ]
    assert await Listener.address() == [f"unix:{sock}"]
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    [(_, description, _)] = [
        a for a in await supervisors.which_applications() if a[0] == "matching"
    ]
    assert f"workers and clients connect to unix:{sock}" in description


async def test_stopping_the_application_removes_the_socket(start: Any, sock: str) -> None:
    await start()
    peer = await Peer.unix(sock)
    await peer.hello()
    await supervisors.stop_application("matching")
    assert not os.path.exists(sock)
    assert await peer.closed()


async def test_blobs_go_to_the_servers_blob_cache(start: Any, sock: str, tmp_path: Path) -> None:
    await start(blob_dir=str(tmp_path / "blobs"))
    peer = await Peer.unix(sock)
    await peer.hello("worker")
    key = (await peer.call(1, "put_blob", data=b"hello blob")).value
    assert key.startswith("sha256:")
    assert os.listdir(tmp_path / "blobs")
    assert (await peer.call(2, "get_blob", key=key)).value == b"hello blob"
    missing = await peer.call(3, "get_blob", key="sha256:" + "0" * 64)
    assert missing.code == "blob_not_found"
    bad = await peer.call(4, "get_blob", key="../etc/passwd")
    assert bad.code == "bad_blob_key"
    await peer.aclose()


async def test_a_flow_runs_from_a_client_through_a_worker_and_outlives_a_restart(
    start: Any, sock: str
) -> None:
    await start()
    worker, client = await Peer.unix(sock), await Peer.unix(sock)
    await worker.hello("worker", worker_id="w1", flows=FLOWS)
    await worker.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert type(await worker.receive_not_ping()) is wire.MatchRegistered
    await client.hello("client")
    started = await client.call(
        1, "start_flow", flow_type="greeting", flow_id="f1", args=["Ada"], definition=DEFINITION
    )
    assert started == wire.MatchReply("f1", rid=1)
    task = await worker.receive_not_ping()
    assert type(task) is wire.MatchTask
    assert (task.kind, task.flow_id, task.name, task.args, task.attempt) == (
        "step",
        "f1",
        "write",
        ["Ada"],
        1,
    )
    await worker.send(wire.MatchAccept(task.delivery, rid=1))
    await worker.send(
        wire.MatchResult(
            task.delivery, "hello Ada", {"set": {"greeting": "hello Ada"}, "delete": []}, rid=1
        )
    )
    assert (await client.call(2, "result", flow_id="f1", timeout=None)).value == "hello Ada"
    described = (await client.call(3, "describe", flow_id="f1")).value
    assert described["status"] == "completed"
    listed = (await client.call(4, "list", flow_type="greeting", status=None, limit=10)).value
    assert [row["flow_id"] for row in listed] == ["f1"]
    gone = await client.call(5, "describe", flow_id="nope")
    assert type(gone) is wire.MatchError and gone.code == "flow_not_found"
    await worker.aclose()
    await client.aclose()
    config = await start.restart()
    client = await Peer.unix(sock)
    await client.hello("client")
    again = (await client.call(1, "describe", flow_id="f1")).value
    assert (again["status"], again["result"]) == ("completed", "hello Ada"), config.store
    await client.aclose()


async def test_a_slow_call_does_not_hold_up_the_connections_other_calls(
    start: Any, sock: str
) -> None:
    await start()
    client = await Peer.unix(sock)
    await client.hello("client")
    started = await client.call(
        1, "start_flow", flow_type="greeting", flow_id="f1", args=[], definition=DEFINITION
    )
    assert started.value == "f1"
    # No worker: the flow's step waits its dispatch wait; result waits for the flow.
    await client.send(wire.MatchCall("result", {"flow_id": "f1", "timeout": None}, rid=2))
    await client.send(wire.MatchCall("put_blob", {"data": b"quick"}, rid=3))
    answer = await client.receive_not_ping()
    assert answer.rid == 3 and type(answer) is wire.MatchReply
    await client.aclose()


async def test_default_application_keeps_its_store_in_a_directory_removed_at_stop(
    sock: str,
) -> None:
    settings = {"matching": {"listen": [f"unix:{sock}"]}}
    app = default_application(node.NodeConfig(settings=settings))
    store = app.env["store"]
    assert store.startswith(tempfile.gettempdir())
    assert os.path.basename(store) == "matching.sqlite3"
    directory = os.path.dirname(store)
    assert str(os.getpid()) in os.path.basename(directory)
    async with otp.open_node():
        await supervisors.start_application(app)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert os.path.exists(store)  # the store writes into it while the server runs
        children = await supervisors.which_children("matching_sup")
        assert children[-1][0] == "scratch"  # started first, stopped last
        await supervisors.stop_application("matching")
    assert not os.path.exists(directory)


def test_default_application_listens_on_a_unix_socket_by_default() -> None:
    app = default_application(node.NodeConfig())
    assert app.env["listen"][0].startswith("unix:")
    assert "workers and clients connect to unix:" in app.description


def test_default_application_keeps_a_configured_store(tmp_path: Path) -> None:
    path = str(tmp_path / "mine.sqlite3")
    app = default_application(node.NodeConfig(settings={"matching": {"store": path}}))
    assert app.env["store"] == path


# ============================================================================ the node CLI


async def test_the_node_runs_the_matching_server_and_stops_on_sigterm(
    tmp_path: Path, store_kind: StoreKind
) -> None:
    sock, store = str(tmp_path / "m.sock"), store_kind.durable
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    args = [
        sys.executable, "-m", "otp.node", "--log-level", "warning", "--app", "apps.matching",
        "--matching-listen", f"unix:{sock}", "--matching-store", store,
    ]  # fmt: skip
    process = await trio.lowlevel.open_process(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT
    )
    assert process.stdout is not None
    out = b""
    try:
        with trio.fail_after(30):
            while b"stop with Ctrl-C" not in out:
                chunk = await process.stdout.receive_some(65536)
                assert chunk, out.decode()
                out += chunk
            text = out.decode()
            assert (
                f"application matching: matching server; workers and clients connect to unix:{sock}"
                in text
            )
            assert "matching_sup" not in text or "listener" in text
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
            peer = await Peer.unix(sock)
            assert type(await peer.hello()) is wire.MatchWelcome
            await peer.aclose()
            process.send_signal(signal.SIGTERM)
            while chunk := await process.stdout.receive_some(65536):
                out += chunk
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
    assert b"stopped" in out
    assert not os.path.exists(sock)
    assert store_kind.query("SELECT count(*) FROM flows") == [(0,)]  # it made the store


async def test_the_observer_view_shows_streams_and_queues_with_their_backlog(
    start: Any, sock: str
) -> None:
    await start()
    peer = await Peer.unix(sock)
    await peer.hello("worker", worker_id="w1", flows=FLOWS)
    await peer.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert type(await peer.receive_not_ping()) is wire.MatchRegistered
    [app] = [a for a in await supervisors.observe() if a.name == "matching"]
    assert app.root is not None and app.root.name == "matching_sup"
    assert app.view is not None
    assert app.view["streams"] == 1
    assert app.view["workers"] == {"w1": 1}
    [queue] = app.view["queues"]
    assert (queue["kind"], queue["name"], queue["streams"], queue["waiting"]) == (
        "flow",
        "greeting",
        1,
        0,
    )
    # The view is the ``queues`` op's rows: one source for both.
    client = await Peer.unix(sock)
    await client.hello()
    assert (await client.call(1, "queues")).value == app.view["queues"]
    assert app.view["dispatch_reasons"] == {}
    # the server's id (the node is not distributed: this process's) and its takeovers
    assert app.view["leases"] == {
        "server_id": local_server_id(),
        "takeovers": 0,
        "redeliveries": 0,
        "moved": 0,
    }
    # Each routing decision is counted by its reason: to the flow-type queue, then delivered.
    await client.call(
        2, "start_flow", flow_type="greeting", flow_id="f1", args=["Ada"], definition=DEFINITION
    )
    task = await peer.receive_not_ping()
    await peer.send(wire.MatchAccept(task.delivery, rid=1))
    await peer.send(wire.MatchResult(task.delivery, "hi", {"set": {}, "delete": []}, rid=1))
    assert (await client.call(3, "result", flow_id="f1", timeout=None)).value == "hi"
    [app] = [a for a in await supervisors.observe() if a.name == "matching"]
    assert app.view is not None
    assert app.view["dispatch_reasons"] == {"delivered": 1, "flow_queue": 1}
    await client.aclose()
    await peer.aclose()


def test_a_worker_program_imports_the_sdk_without_the_server() -> None:
    # A worker or client program pays for the SDK only (a worker restarted often pays its
    # import each time); the server's names still come from the facade, on first use.
    code = (
        "import sys\n"
        "from apps.matching import Client, Flow, Registry, TrioClient, Worker, step\n"
        "print(sorted(m for m in ('otp', 'supervisors', 'psycopg', 'apps.matching._application')"
        " if m in sys.modules))\n"
        "import apps.matching\n"
        "print(apps.matching.application.__module__, apps.matching.MatchingConfig.__module__)\n"
        "print(sorted(m for m in ('otp', 'supervisors') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [
        "[]",
        "apps.matching apps.matching",
        "['otp', 'supervisors']",
    ]
