"""The matching server as users run it: ``python -m otp.node --app apps.matching`` in its own
OS process, the seed's example and pull workers in theirs, and workers SIGKILLed mid-Step."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import trio
from test_node.test_node_cli import ROOT, Node, _env

from apps.matching import Client, ClientOptions, FlowStatus, Registry

from ._stores import StoreKind
from .crash_worker import Crashy

HERE = Path(__file__).resolve().parent


def _server(tmp_path: Path, store_kind: StoreKind | None = None) -> tuple[Node, str]:
    address = f"unix:{tmp_path / 'matching.sock'}"
    node = Node(
        "--app",
        "apps.matching",
        "--matching-listen",
        address,
        "--matching-store",
        str(tmp_path / "matching.sqlite3") if store_kind is None else store_kind.durable,
    )
    return node, address


async def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(timeout):
        return await trio.run_process(
            args, capture_stdout=True, capture_stderr=True, check=False, env=_env(), cwd=ROOT
        )


async def test_the_seeds_greeting_example_runs_against_a_node(tmp_path, store_kind):
    node, address = _server(tmp_path, store_kind)
    async with node:
        await node.line_with("application matching")
        done = await _run([sys.executable, "examples/matching/pull_workers.py", address])
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        assert "result: Hello, world!" in out
        assert "rpc greeting: Hello, world!" in out
        assert "PullGreetingDiagnostics(is_ready=True, reserved_rpc_declines=0)" in out
        node.signal(signal.SIGTERM)
        assert await node.exit_code() == 0
    assert not (tmp_path / "matching.sock").exists()


class _WorkerProcess:
    def __init__(self, address: str, log: Path, mode: str) -> None:
        self.args = [sys.executable, str(HERE / "crash_worker.py"), address, str(log)]
        self.env = dict(_env(), CRASHY_MODE=mode)
        self.process: trio.Process | None = None

    async def __aenter__(self) -> _WorkerProcess:
        self.process = await trio.lowlevel.open_process(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, cwd=ROOT
        )
        assert await self.line() == "ready"
        return self

    async def line(self) -> str:
        """The next line the worker prints."""
        assert self.process is not None and self.process.stdout is not None
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await self.process.stdout.receive_some(1)
                assert chunk, "the worker exited"
                line += chunk
        return line.decode().strip()

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)


async def test_a_worker_killed_mid_step_loses_nothing(tmp_path, store_kind):
    node, address = _server(tmp_path, store_kind)
    log = tmp_path / "handler.log"
    client = Client(Registry((Crashy,)), None, ClientOptions(server_address=address))
    try:
        flow_ids = await _kill_a_worker_mid_step(node, address, log, client)
    finally:
        await trio.to_thread.run_sync(client.close)
    executions = [line.split() for line in log.read_text().splitlines()]
    # at least once at the handler: each killed execution ran again, with the same id
    by_id: dict[str, int] = {}
    for execution_id, _attempt, _pid in executions:
        by_id[execution_id] = by_id.get(execution_id, 0) + 1
    assert sorted(by_id) == sorted(f"{f}/0/work" for f in flow_ids)
    assert all(count == 2 for count in by_id.values())


async def _kill_a_worker_mid_step(node: Node, address: str, log: Path, client: Client) -> list[str]:
    async with node:
        await node.line_with("application matching")
        async with _WorkerProcess(address, log, "hang") as hanging:
            flow_ids = [
                await trio.to_thread.run_sync(client.start_flow, Crashy, n) for n in range(3)
            ]
            started = {await hanging.line() for _ in flow_ids}
            assert started == {f"started {f}/0/work" for f in flow_ids}
            hanging.kill()
            await hanging.process.wait()  # type: ignore[union-attr]
        async with _WorkerProcess(address, log, "fast"):
            results = [
                await trio.to_thread.run_sync(lambda f=f: client.result(f, timeout=60))
                for f in flow_ids
            ]
            assert results == [1, 3, 5]
            for flow_id in flow_ids:
                description = await trio.to_thread.run_sync(client.describe_flow, flow_id)
                assert description.status is FlowStatus.COMPLETED
                completed = [a for a in description.attempts if a["status"] == "completed"]
                # exactly once from the flow's point of view: each step completed once
                assert sorted(a["step"] for a in completed) == ["finish", "work"]
                assert any(d["reason"] == "redispatch_lost" for d in description.dispatches)
    return flow_ids
