"""The pool as users run it: ``python -m otp.node --app apps.dirty ...`` in a real OS process,
called by Gunicorn 27's own client, driven by real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from apps import dirty
from apps.dirty.examples import EXAMPLE_APP

from .conftest import ECHO, LIMITED

LOG = "tests.test_apps.test_dirty.dirty_apps:LogApp"

gunicorn_dirty = pytest.importorskip("gunicorn.dirty")

ROOT = Path(__file__).resolve().parents[3]


class Node:
    """A node process; its output goes to a file we can read."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.socket = str(tmp / "pool.sock")
        self.log = tmp / "node.log"
        self.args = [
            sys.executable, "-m", "otp.node", "--log-level", "info", "--app", "apps.dirty",
            "--dirty-socket", self.socket, "--dirty-pidfile", str(tmp / "pool.pid"), *args,
        ]  # fmt: skip
        self.process: trio.Process | None = None

    async def __aenter__(self) -> Node:
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        self.out = open(self.log, "wb")
        self.process = await trio.lowlevel.open_process(
            self.args, stdout=self.out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        await self.wait_for("is running")
        return self

    async def wait_for(self, text: str, timeout: float = 20) -> None:
        with trio.fail_after(timeout):
            while text not in self.log.read_text():
                assert self.process is not None
                if self.process.poll() is not None:
                    raise AssertionError(f"node exited: {self.log.read_text()}")
                await trio.sleep(0.05)

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        self.out.close()


def gclient(node: Node) -> Any:
    return gunicorn_dirty.DirtyClient(node.socket, timeout=10)


async def test_gunicorn_client_execute_stream_stash_status_manage(tmp_path: Path) -> None:
    async with Node(tmp_path, "--dirty-app", ECHO, "--dirty-app", f"{LIMITED}:1",
                    "--dirty-workers", "2") as node:  # fmt: skip

        def use() -> None:
            client = gclient(node)
            assert client.execute(ECHO, "add", 2, b=3) == 5
            assert list(client.stream(ECHO, "count", 4)) == [0, 1, 2, 3]
            with pytest.raises(gunicorn_dirty.DirtyAppError, match="kaput"):
                client.execute(ECHO, "fail", "kaput")
            assert client.execute(ECHO, "echo", "still usable") == "still usable"
            client.close()
            from gunicorn.dirty import stash as gstash

            s = gstash.StashClient(node.socket, timeout=10)
            s.put("t", "k", {"v": 1})
            assert s.get("t", "k") == {"v": 1}
            assert s.get("t", "missing", "dflt") == "dflt"  # Gunicorn's own arbiter fails this
            assert s.keys("t") == ["k"] and s.exists("t", "k")
            assert "t" in s.tables()
            s.close()

        await trio.to_thread.run_sync(use)
        ours = dirty.DirtyClient(node.socket)
        status = await trio.to_thread.run_sync(ours.status)
        assert status["worker_count"] == 2
        added = await trio.to_thread.run_sync(ours.manage, "add", 1)
        assert added["total_workers"] == 3
        ours.close()
        node.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        with trio.fail_after(20):
            assert await node.process.wait() == 0  # type: ignore[union-attr]


async def test_signals_hup_ttin_ttou_and_graceful_drain(tmp_path: Path) -> None:
    async with Node(tmp_path, "--dirty-app", ECHO, "--dirty-workers", "2") as node:
        client = dirty.DirtyClient(node.socket)
        status = await trio.to_thread.run_sync(client.status)
        old = {w["pid"] for w in status["workers"]}
        assert len(old) == 2
        node.process.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        with trio.fail_after(20):
            while True:
                pids = {w["pid"] for w in (await trio.to_thread.run_sync(client.status))["workers"]}
                if len(pids) == 2 and not pids & old:
                    break
                await trio.sleep(0.1)
        for pid in old:  # HUP really replaced (and stopped) every old worker
            with trio.fail_after(10):
                while os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid):
                    await trio.sleep(0.05)
        node.process.send_signal(signal.SIGTTIN)  # type: ignore[union-attr]
        await _wait_workers(client, 3)
        node.process.send_signal(signal.SIGTTOU)  # type: ignore[union-attr]
        await _wait_workers(client, 2)
        # A call in flight when SIGTERM arrives finishes before the node exits.
        async with trio.open_nursery() as nursery:
            result: list[Any] = []

            async def slow() -> None:
                result.append(await trio.to_thread.run_sync(client.execute, ECHO, "sleep", 0.5))

            nursery.start_soon(slow)
            await trio.sleep(0.2)
            node.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert result == [0.5]
        with trio.fail_after(20):
            assert await node.process.wait() == 0  # type: ignore[union-attr]
        client.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except OSError:
        return "Z"


async def _wait_workers(client: dirty.DirtyClient, n: int) -> None:
    with trio.fail_after(20):
        while True:
            status = await trio.to_thread.run_sync(client.status)
            if len([w for w in status["workers"] if not w["draining"]]) == n:
                return
            await trio.sleep(0.05)


async def test_quit_stops_the_node_and_its_workers_at_once(tmp_path: Path) -> None:
    async with Node(tmp_path, "--dirty-app", ECHO, "--dirty-workers", "2") as node:
        client = dirty.DirtyClient(node.socket)
        pids = [w["pid"] for w in (await trio.to_thread.run_sync(client.status))["workers"]]
        async with trio.open_nursery() as nursery:
            outcome: list[Any] = []

            async def busy() -> None:  # QUIT does not wait for it, unlike TERM
                try:
                    outcome.append(await client.execute_async(ECHO, "sleep", 30))
                except dirty.DirtyError as exc:
                    outcome.append(exc)

            nursery.start_soon(busy)
            await trio.sleep(0.2)
            node.process.send_signal(signal.SIGQUIT)  # type: ignore[union-attr]
            with trio.fail_after(3):
                await node.process.wait()  # type: ignore[union-attr]
        assert isinstance(outcome[0], dirty.DirtyConnectionError)
        with trio.fail_after(5):
            while not all(_state(pid) == "Z" for pid in pids):
                await trio.sleep(0.05)
        # Immediate, but tidy, as Gunicorn's QUIT: no socket or PID file is left behind.
        assert not os.path.exists(node.socket)
        assert not (tmp_path / "pool.pid").exists()
        await client.close_async()


async def test_workers_exit_when_the_node_dies(tmp_path: Path) -> None:
    """Even a worker whose loop is blocked (so it cannot see its socket close) exits."""
    async with Node(tmp_path, "--dirty-app", LOG, "--dirty-workers", "2") as node:
        client = dirty.DirtyClient(node.socket)
        pids = [w["pid"] for w in (await client.status_async())["workers"]]
        assert len(pids) == 2 and all(_state(pid) != "Z" for pid in pids)
        async with trio.open_nursery() as nursery:

            async def block() -> None:
                with pytest.raises(dirty.DirtyConnectionError):
                    await client.execute_async(LOG, "async_block", 60)

            nursery.start_soon(block)
            await trio.sleep(0.3)
            node.process.kill()  # type: ignore[union-attr]
            await node.process.wait()  # type: ignore[union-attr]
        with trio.fail_after(6):  # parent-death detection, not the 300 s dirty_timeout
            while not all(_state(pid) == "Z" for pid in pids):
                await trio.sleep(0.05)
        await client.close_async()


async def test_readme_node_command_serves_the_example_app_on_the_printed_socket(
    tmp_path: Path,
) -> None:
    """``python -m otp.node`` (no arguments): the banner's GUNICORN_DIRTY_SOCKET line names a
    socket that answers the bundled example app's actions, and its declared stash exists."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    env.pop("GUNICORN_DIRTY_SOCKET", None)
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "otp.node"], stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=ROOT,
        )  # fmt: skip
        try:
            with trio.fail_after(30):
                while (
                    m := re.search(r"export GUNICORN_DIRTY_SOCKET=(\S+)", log.read_text())
                ) is None:
                    assert proc.poll() is None, log.read_text()
                    await trio.sleep(0.05)
                while "is running" not in log.read_text():
                    assert proc.poll() is None, log.read_text()
                    await trio.sleep(0.05)
            sock = m.group(1)
            assert sock.startswith(str(tmp_path)) and Path(sock).exists()

            def use() -> None:
                with dirty.DirtyClient(sock, timeout=20) as client:
                    assert client.execute(EXAMPLE_APP, "upper", "hi") == "HI"
                    got = client.execute(EXAMPLE_APP, "predict", "a great, lovely day")
                    assert got["label"] == "positive"
                    assert list(client.stream(EXAMPLE_APP, "count", 3)) == [0, 1, 2]
                    info = client.execute(EXAMPLE_APP, "info")
                    assert info["pid"] != proc.pid and info["app"] == EXAMPLE_APP
                    assert "examples" in dirty.stash.StashClient(client).tables()

            await trio.to_thread.run_sync(use)
        finally:
            proc.terminate()
            with trio.move_on_after(15):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
