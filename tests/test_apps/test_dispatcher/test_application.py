"""The dispatcher application under its supervisor, node settings, and the GenServer backend."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

import otp
import supervisors
from apps import dispatcher as d
from otp import node
from otp.node._metrics import exposition

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


async def _children(app: str) -> dict[str, otp.Pid]:
    root = supervisors.application_supervisor(app)
    assert root is not None
    return {child: pid for child, pid, _, _ in await supervisors.which_children(root)}


async def test_the_runner_is_a_supervised_child_restarted_on_the_same_dispatcher(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with otp.open_node():
        await supervisors.start_application(
            d.application(tools=[d.Tool("t", handler, idempotent=False)])
        )
        before = await _children("dispatcher")
        assert sorted(before) == ["dispatcher", "runner"]
        first = await d.dispatch("t", idempotency_key="k")
        otp.exit(before["runner"], "kill")
        await trio.testing.wait_all_tasks_blocked()
        after = await _children("dispatcher")
        assert after["runner"] != before["runner"]
        # Only the runner restarted (rest_for_one): the server and its cache are the same.
        assert after["dispatcher"] == before["dispatcher"]
        assert await d.dispatch("t", idempotency_key="k") == first
        assert (await d.dispatch("t", idempotency_key="k2"))["run"] == 2
        await supervisors.stop_application("dispatcher")
    assert handler.runs == 2


async def test_a_keyed_call_runs_as_the_runner_process_not_its_caller(
    autojump_clock: trio.abc.Clock,
) -> None:
    ran_as: list[otp.Pid] = []

    async def whoami(**_args: Any) -> None:
        ran_as.append(otp.self())
        await trio.sleep(0.5)  # (and after a wait)
        ran_as.append(otp.self())

    async with otp.open_node():
        await supervisors.start_application(
            d.application(tools=[d.Tool("whoami", whoami, idempotent=True)])
        )
        runner = (await _children("dispatcher"))["runner"]
        for key in ("k1", "k2"):  # the first keyed call and one after it
            await d.dispatch("whoami", idempotency_key=key)
        assert ran_as == [runner] * 4 and otp.self() != runner
        await supervisors.stop_application("dispatcher")


async def test_a_keyed_call_cut_short_by_a_dying_runner_answers_its_waiters(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([5.0])
    async with otp.open_node():
        await supervisors.start_application(
            d.application(tools=[d.Tool("slow", slow, idempotent=False)])
        )
        runner = (await _children("dispatcher"))["runner"]
        otp.exit_after(1.0, runner, "kill")
        with pytest.raises(d.InternalError, match="stopped while the call") as caught:
            await d.dispatch("slow", idempotency_key="k")
        assert trio.current_time() == 1.0 and caught.value.in_doubt
        # It may have taken effect: the retry gets the same answer, not a second run.
        with pytest.raises(d.InternalError) as retry:
            await d.dispatch("slow", idempotency_key="k")
        assert retry.value.in_doubt and slow.runs == 1
        await supervisors.stop_application("dispatcher")


async def test_a_keyed_call_the_dying_runner_never_started_is_refused_not_stranded(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with otp.open_node():
        await supervisors.start_application(
            d.application(tools=[d.Tool("t", handler, idempotent=False)])
        )
        otp.exit((await _children("dispatcher"))["runner"], "kill")
        with pytest.raises(d.InternalError, match="stopped before the call") as caught:
            await d.dispatch("t", idempotency_key="k")
        assert not caught.value.in_doubt and handler.runs == 0
        await trio.testing.wait_all_tasks_blocked()  # the supervisor restarts the runner
        assert (await d.dispatch("t", idempotency_key="k"))["run"] == 1
        await supervisors.stop_application("dispatcher")


async def test_a_dispatcher_started_alone_runs_under_its_own_supervisor(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with running(d.Tool("add", add, ADD_SCHEMA, idempotent=True)) as sup:
        children = {child: pid for child, pid, _, _ in await supervisors.which_children(sup)}
        assert sorted(children) == ["dispatcher", "runner"]
        assert children["dispatcher"] == otp.whereis("dispatcher")
        assert await d.dispatch("add", {"a": 1, "b": 1}, dispatcher=sup, idempotency_key="k") == 2


async def test_a_bare_dispatcher_server_fails_keyed_calls_at_once_saying_it_has_no_runner(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with otp.open_node():
        tool = d.Tool("add", add, ADD_SCHEMA, idempotent=True)
        config = d.DispatcherConfig(name="bare")
        await d.Dispatcher.start_link([tool], config, name="bare")
        assert await d.dispatch("add", {"a": 1, "b": 1}, dispatcher="bare") == 2  # unkeyed: runs
        with trio.fail_after(5), pytest.raises(d.DispatchError) as info:
            await d.dispatch("add", {"a": 1, "b": 1}, dispatcher="bare", idempotency_key="k")
        assert info.value.kind == "internal"
        assert "has no runner" in info.value.message and "start_dispatcher" in info.value.message


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


async def test_the_observer_view_counts_calls_errors_retries_and_breakers_per_tool(
    autojump_clock: trio.abc.Clock,
) -> None:
    breaker = d.BreakerPolicy(failures=2, window=10.0, cooldown=5.0)
    tools = [
        d.Tool("flaky", Script(["transient"]), idempotent=True),
        d.Tool("broken", Script(["internal"] * 2), retry=d.NO_RETRY, breaker=breaker),
        d.Tool("idle", add, idempotent=True),
    ]
    async with otp.open_node():
        await supervisors.start_application(d.application(tools=tools))
        await d.dispatch("flaky")
        for _ in range(2):
            with pytest.raises(d.InternalError):
                await d.dispatch("broken")
        with pytest.raises(d.CircuitOpen):
            await d.dispatch("broken")
        with pytest.raises(d.ToolNotFound):
            await d.dispatch("made-up")
        (app,) = await supervisors.observe()
        assert app.view is not None
        tools_view = app.view["tools"]
        assert sorted(tools_view) == ["broken", "flaky", "idle"]  # not the made-up name
        flaky, broken, idle = tools_view["flaky"], tools_view["broken"], tools_view["idle"]
        assert (flaky["calls"], flaky["attempts"], flaky["ok"], flaky["retries"]) == (1, 2, 1, 1)
        assert flaky["errors"] == {} and flaky["breaker"] == "closed"
        assert (broken["calls"], broken["attempts"], broken["ok"]) == (3, 2, 0)
        assert broken["errors"] == {"circuit_open": 1, "internal": 2}
        assert broken["breaker"] == "open"
        assert idle["calls"] == 0 and idle["breaker"] is None  # no breaker before a call
        assert app.view["running"] == 0
        assert d.observer_view() == app.view


NAP_SCHEMA = {"type": "object", "properties": {"seconds": {"type": "number"}}}


async def _sleep_for(seconds: float) -> str:
    await trio.sleep(seconds)
    return "slept"


async def test_the_observer_view_has_each_tools_latency_histogram_and_quantiles(
    autojump_clock: trio.abc.Clock,
) -> None:
    tools = [
        d.Tool("nap", _sleep_for, NAP_SCHEMA, idempotent=True, retry=d.NO_RETRY),
        d.Tool("idle", add, idempotent=True),
    ]
    async with otp.open_node():
        await supervisors.start_application(d.application(tools=tools))
        for seconds in [0.02] * 98 + [2.0, 2.0]:
            assert await d.dispatch("nap", {"seconds": seconds}) == "slept"
        with pytest.raises(d.InvalidArguments):
            await d.dispatch("nap", {"seconds": "long"})  # a failed call is timed too
        view = d.observer_view()["tools"]
    nap, idle = view["nap"], view["idle"]
    histogram = nap["latency_seconds"]
    assert histogram["count"] == 101
    assert histogram["sum"] == pytest.approx(98 * 0.02 + 2 * 2.0)
    buckets = dict((le, count) for le, count in histogram["buckets"])
    assert (buckets[0.01], buckets[0.025], buckets[1.0], buckets[2.5], buckets["+Inf"]) == (
        1,  # the failed call (it took no time on this clock)
        99,
        99,
        101,
        101,
    )
    assert [le for le, _ in histogram["buckets"]][-2:] == [60.0, "+Inf"]
    assert 0.01 < nap["p50_seconds"] <= 0.025 and 1.0 < nap["p99_seconds"] <= 2.5
    assert idle["latency_seconds"]["count"] == 0 and idle["p50_seconds"] is None


async def test_a_call_that_skips_validation_is_timed_into_the_same_buckets(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A schema that accepts any object: the call runs its attempt inline in dispatch.
    tools = [d.Tool("nap", _sleep_for, {"type": "object"}, idempotent=True)]
    async with otp.open_node():
        await supervisors.start_application(d.application(tools=tools))
        for seconds in (0.0, 0.00004, 0.00006, 0.3):
            assert await d.dispatch("nap", {"seconds": seconds}) == "slept"
        histogram = d.observer_view()["tools"]["nap"]["latency_seconds"]
    assert histogram["count"] == 4
    assert histogram["sum"] == pytest.approx(0.30010)
    buckets = dict((le, count) for le, count in histogram["buckets"])
    assert (buckets[0.00005], buckets[0.0001], buckets[0.25], buckets[0.5]) == (2, 3, 3, 4)


async def test_metrics_show_each_tools_call_duration_histogram(
    autojump_clock: trio.abc.Clock,
) -> None:
    tools = [d.Tool("nap", _sleep_for, NAP_SCHEMA, idempotent=True)]
    async with otp.open_node():
        await supervisors.start_application(d.application(tools=tools))
        for seconds in (0.3, 0.3, 4.0):
            await d.dispatch("nap", {"seconds": seconds})
        body, _ = exposition(otp.observer.snapshot(), await supervisors.observe())
    (family,) = [
        f
        for f in text_string_to_metric_families(body.decode())
        if f.name == "otp_dispatcher_call_duration_seconds"
    ]
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("otp_dispatcher_call_duration_seconds_bucket", "0.25")] == 0
    assert samples[("otp_dispatcher_call_duration_seconds_bucket", "0.5")] == 2
    assert samples[("otp_dispatcher_call_duration_seconds_bucket", "5.0")] == 3
    assert samples[("otp_dispatcher_call_duration_seconds_bucket", "+Inf")] == 3
    assert samples[("otp_dispatcher_call_duration_seconds_count", None)] == 3
    assert samples[("otp_dispatcher_call_duration_seconds_sum", None)] == pytest.approx(4.6)


@pytest.mark.parametrize(
    "request_",
    [("dispatch", "t", {}, "not options"), ("dispatch", ["t"], {})],
    ids=["options-not-a-mapping", "unhashable-name"],
)
async def test_a_malformed_remote_request_is_answered_and_the_dispatcher_survives(
    autojump_clock: trio.abc.Clock, request_: tuple[Any, ...]
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        await d.start_dispatcher([d.Tool("t", Script(), idempotent=True)])
        reply = await otp.call("dispatcher", request_, timeout=5.0)
        assert reply[0] == "error"
        assert (await d.dispatch("t"))["run"] == 1
