"""The dispatcher application under its supervisor, node settings, and the GenServer backend."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import otp
import supervisors
from apps import dispatcher as d
from otp import node

from .helpers import ADD_SCHEMA, TOOLS, Script, add, running


async def test_the_application_runs_the_dispatcher_under_its_supervisor(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with otp.open_node():
        await supervisors.start_application(d.application(tools=TOOLS))
        assert await d.dispatch("add", {"a": 1, "b": 2}) == 3
        d.register_tool(d.Tool("sub", add, idempotent=True))
        first = otp.whereis("dispatcher")
        assert first is not None
        otp.exit(first, "kill")
        await trio.testing.wait_all_tasks_blocked()
        second = otp.whereis("dispatcher")
        assert second is not None and second != first
        # The restarted dispatcher kept its registry, runtime registrations included.
        assert await d.dispatch("sub", {"a": 1, "b": 2}) == 3
        await supervisors.stop_application("dispatcher")
        assert otp.whereis("dispatcher") is None


async def test_the_application_reads_the_node_configuration(
    autojump_clock: trio.abc.Clock,
) -> None:
    config = node.NodeConfig(
        settings={
            "dispatcher": {
                "name": "tools",
                "result_ttl": 5.0,
                "tools": ["tests.test_apps.test_dispatcher.helpers:TOOLS"],
            }
        }
    )
    app = node.resolve_application("apps.dispatcher", config)
    assert app.name == "dispatcher" and app.env["result_ttl"] == 5.0
    async with otp.open_node():
        await supervisors.start_application(app)
        assert await d.dispatch("add", {"a": 2, "b": 2}, dispatcher="tools") == 4
        await supervisors.stop_application("dispatcher")


def test_unknown_settings_are_rejected() -> None:
    config = node.NodeConfig(settings={"dispatcher": {"result_tll": 5}})
    with pytest.raises(d.ConfigurationError, match=r"unknown keys \['result_tll'\]"):
        d.application(config)


class Doubler(otp.GenServer):
    def init(self) -> otp.Ok:
        return otp.Ok(0)

    def handle_call(self, request: Any, from_: otp.From, state: int) -> otp.Reply:
        _, _tool, args = request
        if args.get("x") is None:
            return otp.Reply(("error", "transient", "no x yet"), state + 1)
        return otp.Reply(("ok", args["x"] * 2), state + 1)


async def test_a_genserver_backend_runs_the_tool_in_a_server(
    autojump_clock: trio.abc.Clock,
) -> None:
    backend = d.GenServerBackend("doubler")
    tool = d.Tool("double", backend, idempotent=True, retry=d.RetryPolicy(max_attempts=2))
    async with running(tool):
        with pytest.raises(d.TransientFailure, match="its server 'doubler' is not running"):
            await d.dispatch("double", {"x": 2})
        await Doubler.start_link(name="doubler")
        assert await d.dispatch("double", {"x": 21}) == 42
        with pytest.raises(d.TransientFailure, match="no x yet") as caught:
            await d.dispatch("double", {})
        assert caught.value.attempts == 2


async def test_another_dispatcher_is_a_backend(autojump_clock: trio.abc.Clock) -> None:
    async with running(d.Tool("add", add, ADD_SCHEMA, idempotent=True)):
        await d.start_dispatcher(
            [d.Tool("add", d.GenServerBackend("dispatcher"), idempotent=True)],
            d.DispatcherConfig(name="front"),
        )
        assert await d.dispatch("add", {"a": 1, "b": 2}, dispatcher="front") == 3
        with pytest.raises(d.InternalError, match=r"failed on 'dispatcher' \(schema\)"):
            await d.dispatch("add", {"a": "x", "b": 2}, dispatcher="front")
        reply = await otp.call("dispatcher", ("dispatch", "add", {"a": 1}))
        assert reply[0:2] == ("error", "schema")


async def test_a_backend_timeout_is_a_timeout(autojump_clock: trio.abc.Clock) -> None:
    slow = Script(["timeout"])
    async with running(d.Tool("slow", slow, timeout=1.0, idempotent=False)):
        await d.start_dispatcher(
            [d.Tool("slow", d.GenServerBackend("dispatcher"), idempotent=False, timeout=5.0)],
            d.DispatcherConfig(name="front"),
        )
        with pytest.raises(d.DispatchTimeout, match="where it ran"):
            await d.dispatch("slow", dispatcher="front")
        assert trio.current_time() == 1.0
