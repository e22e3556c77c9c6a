"""``python -m otp.observer``: attaching to a node started by the test (a real ``python -m
otp.node`` process) as a hidden node, ``--top --once``, failed attaches (a wrong cookie, an
unreachable node, a wrong name) with their exit codes, and the hidden property: a third node
connected to the target never sees the observer in its node list or its process groups."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import otp
import otp.pg

ROOT = Path(__file__).resolve().parents[2]
COOKIE = b"observer-remote-cookie-42"
TARGET = "b@localhost"


@pytest.fixture
def cookie_file(tmp_path: Path) -> Path:
    path = tmp_path / "cookie"
    path.write_bytes(COOKIE)
    path.chmod(0o600)
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def _start_target(address: str, cookie_file: Path) -> otp.Pid:
    argv = [
        sys.executable,
        "-m",
        "otp.node",
        "--name",
        TARGET,
        "--listen",
        address,
        "--cookie-file",
        str(cookie_file),
        "--app",
        "test_node.node_apps:cluster",
        "--observer",
        "off",
        "--log-level",
        "warning",
    ]
    port = await otp.open_port(argv, env=_env(), cwd=ROOT, mode="line")
    with trio.fail_after(30):
        while b"is running" not in (await otp.receive(otp.PortData)).data:
            pass
    return port


def _observer_argv(address: str, cookie_file: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "otp.observer",
        "--node",
        TARGET,
        "--connect",
        address,
        "--cookie-file",
        str(cookie_file),
        *extra,
    ]


async def _observe(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        argv, env=_env(), cwd=ROOT, capture_stdout=True, capture_stderr=True, check=False
    )


async def _hidden_connections() -> list[Any]:
    snap = await otp.call((otp.observer.AGENT_NAME, TARGET), "snapshot")
    return [c for c in snap[1]["connections"] if c["hidden"]]


async def test_top_once_prints_the_targets_busiest_processes_as_a_hidden_node(
    tmp_path: Path, cookie_file: Path
) -> None:
    address = f"unix:{tmp_path}/b.sock"
    async with otp.open_node("a@localhost"):
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",))
        )
        otp.pg.join("workers", otp.self())
        port = await _start_target(address, cookie_file)
        assert await otp.connect(TARGET, address)
        async with trio.open_nursery() as nursery:
            done: list[subprocess.CompletedProcess[bytes]] = []

            async def observe() -> None:
                argv = _observer_argv(
                    address, cookie_file, "--top", "--once", "--interval", "3", "--sort", "mailbox"
                )
                done.append(await _observe(argv))

            nursery.start_soon(observe)
            # While the observer is attached: the target sees it as hidden; neither this node
            # nor the target's visible node list has it, and pg here only has our own member.
            with trio.fail_after(30):
                while not await _hidden_connections():
                    await trio.sleep(0.05)
            hidden = await _hidden_connections()
            assert len(hidden) == 1 and hidden[0]["node"].startswith("observer-")
            assert otp.nodes() == [TARGET]
            assert otp.nodes("connected") == [TARGET]
            assert await otp.call(("echo", TARGET), "nodes") == ["a@localhost"]
            assert otp.pg.get_members("workers") == [otp.self()]
        result = done[0]
        assert result.returncode == 0, result.stderr.decode()
        text = result.stdout.decode()
        header, _blank, columns, *rows = text.splitlines()
        assert header.startswith(f"{TARGET}  processes ") and "sorted by mailbox" in header
        assert columns.split()[:5] == ["pid", "name", "msgs/s", "mailbox", "memory"]
        assert any("otp.observer_agent" in row for row in rows)
        assert any("net_kernel" in row for row in rows)
        # Gone again: the target counts no connection to it.
        with trio.fail_after(10):
            while await _hidden_connections():
                await trio.sleep(0.05)
        otp.port_close(port)


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("bad_cookie", 4, "wrong cookie"),
        ("wrong_node", 5, "wrong node name"),
        ("unreachable", 3, "unreachable"),
    ],
)
async def test_a_failed_attach_says_why_exits_with_its_code_and_changes_nothing(
    tmp_path: Path, cookie_file: Path, case: str, code: int, says: str
) -> None:
    address = f"unix:{tmp_path}/b.sock"
    wrong = tmp_path / "wrong-cookie"
    wrong.write_bytes(b"not-the-cluster-cookie")
    wrong.chmod(0o600)
    async with otp.open_node("a@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
        port = await _start_target(address, cookie_file)
        assert await otp.connect(TARGET, address)
        before = await otp.call((otp.observer.AGENT_NAME, TARGET), "snapshot")
        argv = {
            "bad_cookie": _observer_argv(address, wrong, "--top", "--once"),
            "wrong_node": [*_observer_argv(address, cookie_file, "--top", "--once")],
            "unreachable": _observer_argv(f"unix:{tmp_path}/none.sock", cookie_file, "--top"),
        }[case]
        if case == "wrong_node":
            argv[argv.index(TARGET)] = "c@localhost"
        result = await _observe(argv)
        assert result.returncode == code, result.stderr.decode()
        assert says in result.stderr.decode()
        assert result.stdout == b""
        after = await otp.call((otp.observer.AGENT_NAME, TARGET), "snapshot")
        assert [c["node"] for c in after[1]["connections"]] == ["a@localhost"]
        assert len(after[1]["processes"]) == len(before[1]["processes"])
        assert await otp.call(("echo", TARGET), "nodes") == ["a@localhost"]
        otp.port_close(port)


def test_top_sorts_by_rate_mailbox_or_memory() -> None:
    columns = [
        "pid",
        "name",
        "status",
        "message_queue_len",
        "messages_handled",
        "memory",
        "current",
    ]
    before = {"time": 10.0, "columns": columns, "rows": [["<1>", None, "waiting", 0, 5, 100, "x"]]}
    after = {
        "node": "b@h",
        "time": 12.0,
        "columns": columns,
        "rows": [
            ["<1>", None, "waiting", 0, 25, 100, "x"],
            ["<2>", "big", "runnable", 7, 2, 900, None],
        ],
    }
    by_rate = otp.observer.top(before, after, sort="rate")
    assert [r.pid for r in by_rate.rows] == ["<1>", "<2>"]
    assert by_rate.rows[0].rate == 10.0 and by_rate.rows[1].rate == 1.0
    assert [r.pid for r in otp.observer.top(before, after, sort="mailbox").rows] == ["<2>", "<1>"]
    assert [r.pid for r in otp.observer.top(before, after, sort="memory", count=1).rows] == ["<2>"]
    text = otp.observer.render_top(by_rate)
    assert "processes 2" in text and "big" in text
    with pytest.raises(ValueError, match="--sort"):
        otp.observer.top(before, after, sort="cpu")


def _get(address: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    try:
        connection.request("GET" if body is None else "POST", path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


async def test_without_top_it_serves_the_targets_endpoints_locally(
    tmp_path: Path, cookie_file: Path
) -> None:
    import json

    address = f"unix:{tmp_path}/b.sock"
    async with otp.open_node("a@localhost"):
        target = await _start_target(address, cookie_file)
        observer = await otp.open_port(
            _observer_argv(address, cookie_file, "--observer", "127.0.0.1:0"),
            env=_env(),
            cwd=ROOT,
            mode="line",
        )
        with trio.fail_after(30):
            while True:
                line = (await otp.receive(otp.PortData)).data.decode()
                if line.startswith(f"observing {TARGET} on "):
                    break
        web = line.split()[3]
        status, body = await trio.to_thread.run_sync(_get, web, "/api/snapshot")
        snap = json.loads(body)
        assert status == 200 and snap["node"] == TARGET
        assert any(p["registered_name"] == "echo" for p in snap["processes"])
        status, body = await trio.to_thread.run_sync(_get, web, "/api/tree")
        assert status == 200 and "cluster" in [a["name"] for a in json.loads(body)["applications"]]
        status, body = await trio.to_thread.run_sync(_get, web, "/api/processes")
        rows = json.loads(body)["processes"]
        echo = next(p for p in rows if p["registered_name"] == "echo")
        assert status == 200 and echo["pid"].startswith(f"<{TARGET}.")
        status, body = await trio.to_thread.run_sync(_get, web, f"/api/processes/{echo['pid']}")
        assert status == 200 and json.loads(body)["mailbox_head"] == []
        status, body = await trio.to_thread.run_sync(
            _get, web, f"/api/processes/<{TARGET}.999999.0>"
        )
        assert status == 404 and json.loads(body)["error"] == "unknown_pid"
        status, body = await trio.to_thread.run_sync(_get, web, "/api/processes/nonsense")
        assert status == 400 and json.loads(body)["error"] == "invalid_pid"
        status, body = await trio.to_thread.run_sync(_get, web, "/")
        assert status == 200 and b"<html" in body.lower()
        status, body = await trio.to_thread.run_sync(_get, web, "/metrics")
        assert status == 200 and b"otp_processes " in body
        status, _body = await trio.to_thread.run_sync(_get, web, "/healthz")
        assert status == 200
        status, _body = await trio.to_thread.run_sync(_get, web, "/nowhere")
        assert status == 404
        status, body = await trio.to_thread.run_sync(_get, web, "/api/tables")
        assert status == 200 and isinstance(json.loads(body)["tables"], list)
        # the target serves no observer (--observer off), so no sampler: the charts say so
        status, body = await trio.to_thread.run_sync(_get, web, "/api/series")
        assert status == 200 and "no sampler runs on b@localhost" in json.loads(body)["message"]
        # actions stay on the node's own observer: the agent is read-only
        kill = json.dumps({"pid": echo["pid"]}).encode()
        status, body = await trio.to_thread.run_sync(_get, web, "/api/actions/kill", kill)
        assert status == 403 and "remote attach" in json.loads(body)["message"]
        status, body = await trio.to_thread.run_sync(_get, web, f"/api/processes/{echo['pid']}")
        assert status == 200
        otp.port_close(observer)
        otp.port_close(target)


async def test_a_hidden_node_joins_no_node_list_mesh_or_process_group(tmp_path: Path) -> None:
    from .peer import COOKIE as PEER_COOKIE
    from .peer import PeerNode

    a_addr = f"unix:{tmp_path}/a.sock"

    async def hidden_setup() -> None:
        member = otp.spawn(otp.receive)
        otp.pg.join("g", member)
        assert await otp.connect("a@localhost", a_addr)

    async def visible_setup() -> None:
        assert await otp.connect("a@localhost", a_addr)

    async with otp.open_node("a@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=PEER_COOKIE, listen=(a_addr,)))
        otp.pg.join("mine", otp.self())
        async with (
            PeerNode("c@localhost", f"unix:{tmp_path}/c.sock", setup=visible_setup),
            PeerNode(
                "h@localhost",
                f"unix:{tmp_path}/h.sock",
                setup=hidden_setup,
                hidden=True,
                mesh=False,
            ),
        ):
            # The peers' setups connect from their side: their connections come up here a
            # moment later (a hidden one announces itself to nobody, so this polls, bounded).
            with trio.fail_after(10):
                while len(otp.nodes("connected")) < 2:
                    await trio.sleep(0.005)
            assert otp.nodes() == ["c@localhost"]
            assert otp.nodes("hidden") == ["h@localhost"]
            assert otp.nodes("connected") == ["c@localhost", "h@localhost"]
            # Neither its groups reach us, nor ours it; the visible peer never hears of it.
            assert await otp.call(("echo", "h@localhost"), "nodes") == []
            assert await otp.call(("echo", "c@localhost"), "nodes") == ["a@localhost"]
            assert otp.pg.get_members("g") == []  # (a sync of h's would have come before)
            snap = otp.observer.snapshot()
            assert {c.node: c.hidden for c in snap.connections} == {
                "c@localhost": False,
                "h@localhost": True,
            }
        with pytest.raises(otp.BadArg, match="visible"):
            otp.nodes("all")
