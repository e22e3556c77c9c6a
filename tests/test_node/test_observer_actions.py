"""The web observer's actions (``--observer-actions``): kill a process, restart a supervisor's
child, scale the dirty pool; off by default, each needing the token, each attempt logged, and
bad input refused with a clear error that changes nothing. Over a real socket."""

from __future__ import annotations

import http.client
import json
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
import trio.testing

import otp
import supervisors
from otp import node
from supervisors import ChildSpec

from .test_node_cli import Node

TOKEN = "test-token-0123456789abcdef"


class Worker(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(state, state)


DEMO = supervisors.Application(
    "demo",
    (
        supervisors.SupFlags(intensity=5),
        [ChildSpec("worker", Worker), ChildSpec("other", Worker)],
    ),
)


def _post(address: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    url = urlsplit(address)
    assert url.hostname is not None and url.port is not None
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


async def post(
    path: str,
    body: Any = None,
    token: str | None = TOKEN,
    raw: bytes | None = None,
    address: str | None = None,
) -> tuple[int, Any]:
    """POST ``body`` as JSON (or ``raw`` bytes) with ``token`` as its bearer token."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    data = raw if raw is not None else json.dumps(body or {}).encode()
    target = address or node.observer_address()
    assert target is not None
    return await trio.to_thread.run_sync(_post, target, path, data, headers)


async def get(path: str) -> tuple[int, Any]:
    address = node.observer_address()
    assert address is not None
    return await trio.to_thread.run_sync(_post, address, path, None, {})


@asynccontextmanager
async def observed(actions: bool = True) -> AsyncIterator[None]:
    """A node serving its observer (actions on with :data:`TOKEN`, or off) and the demo tree."""
    settings = node.ObserverSettings(
        "127.0.0.1", 0, actions=actions, token=TOKEN if actions else None
    )
    async with otp.open_node("act@localhost"):
        await supervisors.start_application(node.observer_application(settings))
        await supervisors.start_application(DEMO)
        try:
            yield
        finally:
            await supervisors.stop_all_applications()


async def http_process() -> otp.Pid:
    root = supervisors.application_supervisor("observer")
    [pid] = [
        pid for child_id, pid, _, _ in await supervisors.which_children(root) if child_id == "http"
    ]
    return pid


async def children() -> dict[Any, otp.Pid]:
    root = supervisors.application_supervisor("demo")
    return {child_id: pid for child_id, pid, _, _ in await supervisors.which_children(root)}


async def test_actions_are_off_by_default_and_say_how_to_turn_them_on(caplog: Any) -> None:
    caplog.set_level(logging.INFO, "otp.node.observer.actions")
    async with observed(actions=False):
        worker = (await children())["worker"]
        status, body = await post("/api/actions/kill", {"pid": repr(worker)})
        assert status == 403 and body["error"] == "actions_disabled"
        assert "--observer-actions" in body["message"]
        assert otp.process_info(worker) is not None and (await children())["worker"] == worker
        assert await get("/api/actions") == (
            200,
            {"enabled": False, "actions": [], "message": body["message"]},
        )
        assert "observer action kill" in caplog.text and "refused (actions_disabled)" in caplog.text


async def test_a_missing_or_wrong_token_is_403_changes_nothing_and_is_logged(caplog: Any) -> None:
    caplog.set_level(logging.INFO, "otp.node.observer.actions")
    async with observed():
        worker = (await children())["worker"]
        status, body = await post("/api/actions/kill", {"pid": repr(worker)}, token=None)
        assert (status, body["error"]) == (403, "forbidden")
        assert "Authorization: Bearer" in body["message"]
        status, body = await post("/api/actions/kill", {"pid": repr(worker)}, token=TOKEN + "x")
        assert (status, body["error"]) == (403, "forbidden") and "wrong token" in body["message"]
        assert otp.process_info(worker) is not None and (await children())["worker"] == worker
        refused = [r for r in caplog.records if "refused (forbidden)" in r.getMessage()]
        assert len(refused) == 2 and all(r.levelno == logging.WARNING for r in refused)
        assert all(repr(worker) in r.getMessage() for r in refused)  # what
        assert all(" by 127.0.0.1:" in r.getMessage() for r in refused)  # who
        assert TOKEN not in caplog.text


async def test_kill_with_the_token_kills_the_process_and_its_supervisor_restarts_it(
    caplog: Any,
) -> None:
    caplog.set_level(logging.INFO, "otp.node.observer.actions")
    async with observed():
        assert (await get("/api/actions"))[1]["actions"] == ["kill", "restart_child", "scale_dirty"]
        worker = (await children())["worker"]
        otp.monitor(worker)
        status, body = await post("/api/actions/kill", {"pid": repr(worker)})
        assert (status, body) == (200, {"ok": True, "action": "kill", "pid": repr(worker)})
        down = await otp.receive(otp.Down)
        assert down.reason == otp.KILLED
        restarted = (await children())["worker"]
        assert isinstance(restarted, otp.Pid) and restarted != worker
        [allowed] = [r for r in caplog.records if r.levelno == logging.INFO]
        assert (
            "observer action kill" in allowed.getMessage() and repr(worker) in allowed.getMessage()
        )
        assert " by 127.0.0.1:" in allowed.getMessage()


async def test_restart_child_stops_and_starts_the_child_by_its_id() -> None:
    async with observed():
        root = supervisors.application_supervisor("demo")
        before = await children()
        status, body = await post(
            "/api/actions/restart_child", {"supervisor": repr(root), "child": "other"}
        )
        after = await children()
        assert status == 200 and body["child"] == "other" and body["pid"] == repr(after["other"])
        assert after["other"] != before["other"] and after["worker"] == before["worker"]


async def test_bad_action_requests_get_a_clear_error_and_change_nothing() -> None:
    async with observed():
        root = supervisors.application_supervisor("demo")
        before = await children()
        http = await http_process()
        cases = [
            ("kill", {"pid": "not-a-pid"}, 400, "invalid_pid"),
            ("kill", {"pid": "<act@localhost.999999.0>"}, 404, "unknown_pid"),
            ("kill", {"pid": "<elsewhere@host.1.0>"}, 404, "unknown_pid"),
            ("kill", {}, 400, "bad_request"),
            ("restart_child", {"supervisor": repr(root), "child": "nope"}, 404, "unknown_child"),
            (
                "restart_child",
                {"supervisor": repr(before["worker"]), "child": "worker"},
                404,
                "not_a_supervisor",
            ),
            ("scale_dirty", {"change": "double"}, 400, "bad_request"),
            ("scale_dirty", {"change": "add", "count": 1000}, 400, "bad_request"),
            ("scale_dirty", {"change": "add"}, 404, "no_dirty_pool"),
            ("reboot", {}, 404, "unknown_action"),
            ("kill", {"pid": repr(http)}, 409, "refused"),
        ]
        for name, args, status, error in cases:
            got = await post(f"/api/actions/{name}", args)
            assert (got[0], got[1]["error"]) == (status, error), (name, args, got)
        status, body = await post(
            "/api/actions/restart_child", {"supervisor": repr(root), "child": "nope"}
        )
        assert "its children: ['other', 'worker']" in body["message"]
        status, body = await post("/api/actions/kill", raw=b"{not json")
        assert (status, body["error"]) == (400, "bad_request")
        status, body = await post("/api/actions/kill", raw=b"[1, 2]")
        assert (status, body["error"]) == (400, "bad_request")
        status, body = await post("/api/actions/kill", raw=b" " * 100_000)
        assert (status, body["error"]) == (413, "too_large")
        status, body = await get("/api/actions/kill")
        assert (status, body["error"]) == (405, "method_not_allowed")
        assert await children() == before and await http_process() == http


def _token_file(tmp_path: Path, text: str = TOKEN, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_observer_actions_are_set_by_flag_or_node_toml_with_a_token_file(tmp_path: Path) -> None:
    assert node.load_config(["--observer", "127.0.0.1:0"]).observer == node.ObserverSettings(
        "127.0.0.1", 0
    )
    on = node.load_config(["--observer", "127.0.0.1:0", "--observer-actions"]).observer
    assert on is not None and on.actions and on.token is None  # made at boot
    token_file = _token_file(tmp_path)
    flagged = node.load_config(
        [
            "--observer",
            "127.0.0.1:0",
            "--observer-actions",
            "--observer-token-file",
            str(token_file),
        ]
    ).observer
    assert flagged is not None and flagged.token == TOKEN and TOKEN not in repr(flagged)
    config = tmp_path / "node.toml"
    config.write_text(
        f'[observer]\nlisten = "127.0.0.1:0"\nactions = true\ntoken_file = "{token_file}"\n'
    )
    from_toml = node.load_config(["--config", str(config)]).observer
    assert from_toml is not None and from_toml.actions and from_toml.token == TOKEN


def test_a_bad_token_file_or_actions_setting_is_a_config_error(tmp_path: Path) -> None:
    base = ["--observer", "127.0.0.1:0", "--observer-actions", "--observer-token-file"]
    with pytest.raises(node.ConfigError, match=r"others may read it \(mode 644\): chmod 600"):
        node.load_config([*base, str(_token_file(tmp_path, mode=0o644))])
    with pytest.raises(node.ConfigError, match="at least 16 characters"):
        node.load_config([*base, str(_token_file(tmp_path, text="short"))])
    with pytest.raises(node.ConfigError, match="cannot read it"):
        node.load_config([*base, str(tmp_path / "missing")])
    with pytest.raises(node.ConfigError, match="actions are off: add --observer-actions"):
        node.load_config(
            ["--observer", "127.0.0.1:0", "--observer-token-file", str(_token_file(tmp_path))]
        )
    config = tmp_path / "node.toml"
    config.write_text('[observer]\nlisten = "127.0.0.1:0"\nactions = "yes"\n')
    with pytest.raises(node.ConfigError, match=r"observer\.actions must be true or false"):
        node.load_config(["--config", str(config)])


async def test_a_node_prints_its_made_token_and_scales_its_dirty_pool_with_it() -> None:
    """``python -m otp.node --observer-actions``: the banner prints the token made at boot;
    with it, scale_dirty adds a dirty worker and removes it (SIGTTIN/SIGTTOU style)."""
    async with Node("--observer", "127.0.0.1:0", "--observer-actions") as running:
        address = (await running.line_with("observer on http://127.0.0.1:")).split()[2]
        line = await running.line_with("observer actions on: token ")
        token = line.split("token ")[1].split()[0]
        assert f"{address}/#token={token}" in line
        await running.line_with("stop with Ctrl-C")
        status, body = await post(
            "/api/actions/scale_dirty", {"change": "add"}, token, address=address
        )
        assert status == 200 and body["result"]["spawned"] == 1
        assert body["result"]["total_workers"] == 2
        status, body = await post(
            "/api/actions/scale_dirty", {"change": "remove", "count": 1}, token, address=address
        )
        assert status == 200 and body["result"]["removed"] == 1
        assert body["result"]["total_workers"] == 1
        status, body = await post(
            "/api/actions/scale_dirty", {"change": "add"}, "wrong-token", address=address
        )
        assert status == 403
        running.signal(signal.SIGTERM)
        assert await running.exit_code() == 0


async def test_a_token_file_is_not_printed(tmp_path: Path) -> None:
    token_file = _token_file(tmp_path)
    async with Node(
        "--observer", "127.0.0.1:0", "--observer-actions", "--observer-token-file", str(token_file)
    ) as running:
        line = await running.line_with("observer actions on")
        assert line.strip() == "observer actions on (token from the token file)"
        await running.line_with("stop with Ctrl-C")
        running.signal(signal.SIGTERM)
        assert TOKEN not in "\n".join(await running.rest())
        assert await running.exit_code() == 0
