"""Nodes in separate OS processes, started as ports from the test: messages, links, monitors and
calls across them, then one killed with SIGKILL (or frozen with SIGSTOP) while the others
watch; and a supervisor restarting a port that runs a node."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import otp
import supervisors

ROOT = Path(__file__).resolve().parents[2]
COOKIE = b"cluster-test-cookie-42"


@pytest.fixture
def cookie_file(tmp_path: Path) -> Path:
    path = tmp_path / "cookie"
    path.write_bytes(COOKIE)
    path.chmod(0o600)
    return path


def node_argv(name: str, address: str, cookie_file: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "otp.node",
        "--name",
        name,
        "--listen",
        address,
        "--cookie-file",
        str(cookie_file),
        "--app",
        "test_node.node_apps:cluster",
        "--liveness-timeout",
        "1",
        "--log-level",
        "warning",
        *extra,
    ]


def node_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def start_node(name: str, address: str, cookie_file: Path, *extra: str) -> otp.Pid:
    """Start a node as a port of the caller; return once it prints that it runs."""
    port = await otp.open_port(
        node_argv(name, address, cookie_file, *extra), env=node_env(), cwd=ROOT, mode="line"
    )
    with trio.fail_after(30):
        while b"is running" not in (await otp.receive(otp.PortData)).data:
            pass
    return port


async def test_three_nodes_in_three_processes_and_one_killed(
    tmp_path: Path, cookie_file: Path
) -> None:
    b_addr, c_addr = f"unix:{tmp_path}/b.sock", f"unix:{tmp_path}/c.sock"
    async with otp.open_node("a@localhost"):
        otp.process_flag(trap_exit=True)
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",), liveness_timeout=1)
        )
        b = await start_node("b@localhost", b_addr, cookie_file)
        c = await start_node(
            "c@localhost", c_addr, cookie_file, "--connect", f"b@localhost@{b_addr}"
        )
        assert await otp.connect("b@localhost", b_addr)
        assert await otp.connect("c@localhost", c_addr)
        assert await otp.call(("echo", "b@localhost"), "whoami") == "b@localhost"
        assert await otp.call(("echo", "c@localhost"), "nodes") == ["a@localhost", "b@localhost"]
        # Messages, a link and a monitor to processes of b.
        otp.send(("echo", "b@localhost"), (otp.self(), "ping"))
        assert await otp.receive(tuple) == ("echo", "ping")
        linked = await otp.call(("echo", "b@localhost"), ("spawn", "unused"))
        otp.link(linked)
        watched = await otp.call(("echo", "b@localhost"), ("spawn", "unused"))
        ref = otp.monitor(watched)
        otp.monitor_node("b@localhost")
        os.kill(await otp.port_os_pid(b), signal.SIGKILL)
        with trio.fail_after(5):
            assert await otp.receive(otp.Exit) == otp.Exit(linked, otp.NOCONNECTION)
            assert await otp.receive(otp.Down) == otp.Down(ref, watched, otp.NOCONNECTION)
            assert await otp.receive(otp.NodeDown) == otp.NodeDown("b@localhost")
            port_exit = await otp.receive(lambda m: isinstance(m, otp.Exit) and m.pid == b)
        assert port_exit.reason == otp.Signaled("SIGKILL")
        # c saw b go too, and still answers.
        with trio.fail_after(5):
            while await otp.call(("echo", "c@localhost"), "nodes") != ["a@localhost"]:
                await trio.sleep(0.05)
        otp.unlink(c)
        otp.exit(c, otp.SHUTDOWN)


async def test_a_frozen_node_is_noticed_within_the_liveness_timeout(
    tmp_path: Path, cookie_file: Path
) -> None:
    b_addr = f"unix:{tmp_path}/b.sock"
    async with otp.open_node("a@localhost"):
        otp.process_flag(trap_exit=True)
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",), liveness_timeout=1)
        )
        b = await start_node("b@localhost", b_addr, cookie_file)
        assert await otp.connect("b@localhost", b_addr)
        otp.monitor_node("b@localhost")
        os_pid = await otp.port_os_pid(b)
        os.kill(os_pid, signal.SIGSTOP)
        try:
            start = trio.current_time()
            with trio.fail_after(5):
                assert await otp.receive(otp.NodeDown) == otp.NodeDown("b@localhost")
            assert 0.9 <= trio.current_time() - start <= 3
        finally:
            os.kill(os_pid, signal.SIGKILL)


async def test_a_supervisor_restarts_a_port_that_runs_a_node(
    tmp_path: Path, cookie_file: Path
) -> None:
    b_addr = f"unix:{tmp_path}/b.sock"

    async def start_b() -> otp.Pid:
        return await otp.open_port(
            node_argv("b@localhost", b_addr, cookie_file), env=node_env(), cwd=ROOT
        )

    async with otp.open_node("a@localhost"):
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",), liveness_timeout=1)
        )
        sup = await supervisors.Supervisor.start_link(
            supervisors.SupFlags(strategy="one_for_one", intensity=3, period=60),
            [supervisors.ChildSpec("b_node", (start_b,), shutdown=5)],
        )

        async def answer() -> Any:
            with trio.fail_after(30):
                while not await otp.connect("b@localhost", b_addr):
                    await trio.sleep(0.1)
                return await otp.call(("echo", "b@localhost"), "whoami")

        assert await answer() == "b@localhost"
        [(_, first, _, _)] = await supervisors.which_children(sup)
        os.kill(await otp.port_os_pid(first), signal.SIGKILL)
        with trio.fail_after(10):
            while (await supervisors.which_children(sup))[0][1] == first:
                await trio.sleep(0.05)
        assert await answer() == "b@localhost"
        [(_, second, _, _)] = await supervisors.which_children(sup)
        os_pid = await otp.port_os_pid(second)
        otp.unlink(sup)
        await otp.GenServer.stop(sup, otp.SHUTDOWN)
        # The supervisor's shutdown stopped the port, and the port its OS process.
        with pytest.raises(ProcessLookupError):
            os.kill(os_pid, 0)
