"""``python -m apps.matching``, the client CLI, run as an OS process of its own against a real
matching server (in this test's trio run, on a Unix socket) with a real SDK worker: it starts
flows of a type only the worker knows, calls RPCs, describes, lists, cancels and lists queues;
every error is one line on stderr with exit code 1 (a matching error) or 2 (a usage error)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from test_node.test_node_cli import ROOT, _env

from apps.matching import (
    Flow,
    Registry,
    RetryPolicy,
    TrioWorker,
    WorkerOptions,
    rpc,
    step,
)
from apps.matching._cli import SERVER_ENV, main

from ._in_process import matching_server

#: A step of ``Slow`` waits on this (set by the test that cancels, so no step runs forever).
_release = trio.Event()


class Greeting(Flow):
    name = "Greeting"

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))
    async def greet(self, ctx, who):
        if ctx.attempt == 1 and who == "flaky":
            raise RuntimeError("the first attempt fails")
        ctx.state["greeting"] = f"Hello, {who}!"
        return ctx.state["greeting"]

    @rpc
    async def greeting(self, ctx, suffix=""):
        return ctx.state.get("greeting", "") + suffix


class Slow(Flow):
    name = "Slow"

    @step
    async def wait(self, ctx):
        await _release.wait()
        return "released"


async def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m apps.matching ARGS`` to its end."""
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "apps.matching", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env or _env(),
            cwd=ROOT,
        )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def one_error_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The process failed with ``code`` and one line on stderr (returned)."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@asynccontextmanager
async def server_and_worker(**config: Any) -> AsyncIterator[str]:
    """A real server and a TrioWorker of Greeting and Slow; yields the server's address."""
    global _release
    _release = trio.Event()
    async with matching_server(**config) as address:
        registry = Registry([Greeting, Slow], allow_async_handlers=True)
        worker = TrioWorker(
            registry, None, WorkerOptions(server_address=address, credentials="w-token")
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.start)
            await worker.wait_pull_registered(timeout=30)
            yield address
            _release.set()
            await worker.close()


async def test_start_rpc_result_describe_list_and_queues_of_a_type_only_the_worker_knows():
    async with server_and_worker() as address:
        s = ("--server", address)
        started = await cli(*s, "start", "Greeting", '["flaky"]', "--id", "g1", "--wait")
        assert started.returncode == 0, started.stderr
        assert started.stdout.splitlines() == ["g1", '"Hello, flaky!"']
        called = await cli(*s, "rpc", "g1", "greeting", '["?"]')
        result = await cli(*s, "--json", "result", "g1", "--timeout", "5")
        described = await cli(*s, "describe", "g1")
        as_json = await cli(*s, "describe", "g1", "--json")
        started_json = await cli(*s, "start", "Greeting", "--json", '["json"]')  # intermixed
        listed = await cli(*s, "list", "--type", "Greeting", "--json")
        listed_human = await cli(*s, "list", "--status", "completed")
        queues = await cli(*s, "queues", "--json")
        queues_human = await cli(*s, "queues")
    for done in (called, result, described, as_json, started_json, listed, listed_human, queues):
        assert done.returncode == 0 and done.stderr == "", (done.args, done.stderr)
    assert called.stdout == '"Hello, flaky!?"\n'
    assert json.loads(result.stdout) == "Hello, flaky!"
    # describe: its attempts (the failed first, with its error) and its dispatches' reasons
    assert "status:        completed" in described.stdout
    assert "RuntimeError: the first attempt fails" in described.stdout
    assert "flow_queue" in described.stdout and "delivered" in described.stdout
    description = json.loads(as_json.stdout)
    assert [(a["attempt"], a["status"]) for a in description["attempts"]] == [
        (1, "failed"),
        (2, "completed"),
    ]
    reasons = [d["reason"] for d in description["dispatches"]]
    assert "flow_queue" in reasons and "delivered" in reasons
    assert description["state"] == {"greeting": "Hello, flaky!"}
    new_id = json.loads(started_json.stdout)["flow_id"]
    assert {row["flow_id"] for row in json.loads(listed.stdout)} >= {"g1", new_id}
    assert listed_human.stdout.splitlines()[0].split() == [
        "FLOW",
        "TYPE",
        "STATUS",
        "CREATED",
        "UPDATED",
    ]
    assert any(line.startswith("g1 ") for line in listed_human.stdout.splitlines())
    by_name = {(q["kind"], q["name"]): q for q in json.loads(queues.stdout)}
    greeting = by_name["flow", "Greeting"]
    assert greeting["streams"] >= 1 and greeting["idle"] >= 1 and greeting["waiting"] == 0
    assert set(greeting) == {
        "name",
        "kind",
        "streams",
        "idle",
        "offered",
        "busy",
        "waiting",
        "workers",
        "declines",
    }
    assert any(kind == "worker" for kind, _ in by_name)
    header = queues_human.stdout.splitlines()[0].split()
    assert header == ["QUEUE", "KIND", "IDLE", "OFFERED", "BUSY", "BACKLOG", "WORKERS", "DECLINES"]
    assert any(
        line.split()[:2] == ["Greeting", "flow"] for line in queues_human.stdout.splitlines()
    )


async def test_cancel_a_running_flow_then_its_result_is_a_cancelled_error():
    async with server_and_worker() as address:
        env = dict(_env(), OTP_MATCHING_SERVER=address)  # the server from the environment
        started = await cli("start", "Slow", "--id", "s1", env=env)
        assert started.stdout == "s1\n", started.stderr
        queues = await cli("queues", "--json", env=env)
        cancelled = await cli("cancel", "s1", env=env)
        result = await cli("result", "s1", env=env)
        described = await cli("describe", "s1", "--json", env=env)
    slow = {(q["kind"], q["name"]): q for q in json.loads(queues.stdout)}.get(("flow", "Slow"))
    assert cancelled.returncode == 0 and cancelled.stdout == "cancelled s1\n", cancelled.stderr
    line = one_error_line(result, 1)
    assert line.startswith("error: cancelled: ") or line.startswith("error: flow_failed: ")
    assert json.loads(described.stdout)["status"] == "cancelled"
    # while its step ran: one stream of the flow queue or the worker's queue was busy
    busy = sum(q["busy"] for q in json.loads(queues.stdout))
    assert busy == 1 and slow is not None


async def test_client_tokens_from_the_flag_or_a_file(tmp_path):
    async with server_and_worker(client_tokens=["c-token"], worker_tokens=["w-token"]) as address:
        token_file = tmp_path / "token"
        token_file.write_text("c-token\n")
        by_flag = await cli("--server", address, "--token", "c-token", "list")
        by_file = await cli("--server", address, "list", "--token-file", str(token_file))
        wrong = await cli("--server", address, "--token", "nope", "list")
        missing = await cli("--server", address, "--token-file", str(tmp_path / "none"), "list")
    assert by_flag.returncode == 0 and by_file.returncode == 0, (by_flag.stderr, by_file.stderr)
    assert one_error_line(wrong, 1).startswith("error: unauthenticated: ")
    assert "--token-file" in one_error_line(missing, 2)


async def test_errors_from_the_server_are_one_line_and_exit_code_1():
    async with server_and_worker() as address:
        s = ("--server", address)
        no_flow = await cli(*s, "describe", "nope")
        no_type = await cli(*s, "start", "NoSuchFlow")
        no_rpc_flow = await cli(*s, "rpc", "nope", "greeting")
        taken = await cli(*s, "start", "Greeting", '["a"]', "--id", "t1")
        taken_again = await cli(*s, "start", "Greeting", '["a"]', "--id", "t1")
    assert one_error_line(no_flow, 1) == "error: flow_not_found: no flow has id 'nope'"
    line = one_error_line(no_type, 1)
    assert line.startswith("error: unknown_flow_type: ") and "'NoSuchFlow'" in line
    assert one_error_line(no_rpc_flow, 1).startswith("error: flow_not_found: ")
    assert taken.returncode == 0
    assert one_error_line(taken_again, 1).startswith("error: flow_exists: ")


async def test_an_unreachable_server_is_one_line_and_exit_code_1(tmp_path):
    done = await cli("--server", f"unix:{tmp_path / 'none.sock'}", "list")
    line = one_error_line(done, 1)
    assert line.startswith("error: unavailable: ") and "none.sock" in line


async def test_bad_json_args_are_one_line_and_exit_code_2_before_dialling(tmp_path):
    # (no server listens there: the usage error comes first)
    done = await cli("--server", f"unix:{tmp_path / 'none.sock'}", "start", "Greeting", "[1")
    assert "ARGS_JSON is not JSON" in one_error_line(done, 2)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["start", "Greeting", '{"who": 1}'], "ARGS_JSON must be a JSON array"),
        (["rpc", "f", "greeting", '"x"'], "(got a string)"),
        (["list", "--limit", "0"], "--limit: must be >= 1"),
        (["list", "--status", "sleeping"], "--status"),
        (["result", "f", "--timeout", "-1"], "--timeout"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["--server", "nowhere", "list"], "server_address"),
        (["--token", "a", "--token-file", "b", "list"], "not allowed with"),
    ],
)
def test_usage_errors_are_one_line_and_exit_code_2(tmp_path, capsys, args, says):
    environ = {SERVER_ENV: f"unix:{tmp_path / 'none.sock'}"}
    assert main(args, environ) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("error: ") and says in line


def test_no_server_address_is_a_usage_error(capsys):
    assert main(["list"], {}) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert SERVER_ENV in line and "--server" in line
