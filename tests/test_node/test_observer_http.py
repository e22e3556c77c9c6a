"""The node's HTTP observer (``--observer HOST:PORT``): /metrics, /healthz, /readyz and the JSON
API, over a real socket, from a node running a small tree in the test's own trio run."""

from __future__ import annotations

import http.client
import json
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from test_apps.test_dispatcher.helpers import ADD_SCHEMA, add

import otp
import supervisors
from apps import dispatcher as d
from otp import node
from supervisors import ChildSpec, Supervisor

from .test_node_cli import Node


class Worker(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(state, state)


class Root(Supervisor):
    def init(self) -> Any:
        return {"strategy": "one_for_one", "intensity": 5}, [
            ChildSpec("worker", Worker),
            ChildSpec(
                "inner", (Supervisor.start_link, {}, [ChildSpec("leaf", Worker)]), type="supervisor"
            ),
        ]


DEMO = supervisors.Application("demo", Root, version="7")

Response = tuple[int, dict[str, str], bytes]


def _request(address: str, path: str, method: str, headers: dict[str, str]) -> Response:
    url = urlsplit(address)
    assert url.hostname is not None and url.port is not None
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


async def fetch(
    path: str, method: str = "GET", address: str | None = None, **headers: str
) -> Response:
    """A real HTTP request, from a thread (http.client blocks) while the node serves it."""
    address = address or node.observer_address()
    assert address is not None
    return await trio.to_thread.run_sync(_request, address, path, method, headers)


async def fetch_json(path: str) -> tuple[int, Any]:
    status, headers, body = await fetch(path)
    assert headers["content-type"] == "application/json"
    return status, json.loads(body)


async def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``/metrics`` parsed by prometheus_client's own parser: samples by (name, labels)."""
    status, headers, body = await fetch("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


@asynccontextmanager
async def observed(expected: tuple[str, ...] = ("demo",)) -> AsyncIterator[str]:
    """A node serving its observer on a free loopback port; yields the address."""
    async with otp.open_node("web@localhost"):
        app = node.observer_application(node.ObserverSettings("127.0.0.1", 0), expected)
        await supervisors.start_application(app)
        address = node.observer_address()
        assert address is not None and address.startswith("http://127.0.0.1:")
        try:
            yield address
        finally:
            await supervisors.stop_all_applications()


async def test_metrics_count_a_childs_restart_by_supervisor() -> None:
    async with observed():
        await supervisors.start_application(DEMO)
        before = await scrape()
        demo = {"application": "demo", "supervisor": "demo"}
        inner = {"application": "demo", "supervisor": "demo/inner"}
        assert before[key("otp_supervisor_restarts_total", **demo)] == 0
        assert before[key("otp_supervisor_restarts_total", **inner)] == 0
        assert before[key("otp_supervisor_children", **demo, state="running")] == 2
        assert before[key("otp_application_running", application="demo", version="7")] == 1
        assert before[key("otp_processes")] == len(otp.observer.observe_processes())

        root = supervisors.application_supervisor("demo")
        children = {child_id: pid for child_id, pid, _, _ in await supervisors.which_children(root)}
        otp.monitor(children["worker"])
        otp.exit(children["worker"], otp.KILL)
        await otp.receive(otp.Down)
        await supervisors.which_children(root)  # (answered once the restart is done)

        after = await scrape()
        assert after[key("otp_supervisor_restarts_total", **demo)] == 1
        assert after[key("otp_supervisor_restarts_total", **inner)] == 0
        assert after[key("otp_supervisor_restarts_in_window", **demo)] == 1


async def test_metrics_show_mailboxes_and_ets_tables() -> None:
    async with observed():
        sink = otp.spawn(otp.receive, int)
        for n in range(5):
            otp.send(sink, str(n))
        table = otp.ets.new("web_table", named=True, access="public")
        otp.ets.insert(table, [(1, "a"), (2, "b"), (3, "c")])
        samples = await scrape()
        assert samples[key("otp_mailbox_messages")] >= 5
        [(labels, largest)] = [
            (labels, value)
            for (name, labels), value in samples.items()
            if name == "otp_mailbox_largest_messages"
        ]
        assert largest == 5 and dict(labels)["pid"] == repr(sink)
        assert samples[key("otp_ets_table_objects", table="web_table")] == 3
        assert samples[key("otp_ets_table_memory_bytes", table="web_table")] > 0
        assert samples[key("otp_dist_connections", state="up")] == 0
        assert samples[key("process_cpu_seconds_total")] > 0


async def test_metrics_count_dispatcher_calls_and_errors_by_tool_and_kind() -> None:
    tools = [d.Tool("add", add, ADD_SCHEMA, idempotent=True, retry=d.NO_RETRY)]
    async with observed(expected=("dispatcher",)):
        await supervisors.start_application(d.application(tools=tools))
        assert await d.dispatch("add", {"a": 1, "b": 2}) == 3
        with pytest.raises(d.InvalidArguments):
            await d.dispatch("add", {"a": "x", "b": 2})
        samples = await scrape()
        assert samples[key("otp_dispatcher_calls_total", tool="add")] == 2
        assert samples[key("otp_dispatcher_errors_total", tool="add", kind="schema")] == 1
        assert samples[key("otp_dispatcher_breaker_state", tool="add", state="closed")] == 1
        assert samples[key("otp_dispatcher_running")] == 0


async def test_metrics_speak_openmetrics_to_a_scraper_that_asks() -> None:
    async with observed():
        status, headers, body = await fetch(
            "/metrics", Accept="application/openmetrics-text;version=1.0.0,text/plain;q=0.4"
        )
        assert status == 200
        assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith(b"# EOF\n") and b"otp_processes " in body
        _status, headers, _body = await fetch("/metrics", Accept="text/plain;version=0.0.4")
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


async def test_readyz_waits_for_every_application_to_start() -> None:
    async with observed():
        assert await fetch_json("/readyz") == (
            503,
            {"status": "not_ready", "waiting": {"demo": "not started"}},
        )
        await supervisors.start_application(DEMO)
        assert await fetch_json("/readyz") == (200, {"status": "ready"})


async def test_readyz_asks_each_applications_own_check() -> None:
    warm = trio.Event()
    app = supervisors.Application(
        "cache",
        (supervisors.SupFlags(), []),
        ready=lambda: None if warm.is_set() else "the cache is warming up",
    )
    broken = supervisors.Application("broken", (supervisors.SupFlags(), []), ready=lambda: 1 / 0)
    async with observed(expected=("cache",)):
        await supervisors.start_application(app)
        await supervisors.start_application(broken)
        status, body = await fetch_json("/readyz")
        assert status == 503
        assert body["waiting"] == {
            "cache": "the cache is warming up",
            "broken": "its readiness check raised ZeroDivisionError: division by zero",
        }
        await supervisors.stop_application("broken")
        warm.set()
        assert await fetch_json("/readyz") == (200, {"status": "ready"})


async def test_healthz_and_the_json_api() -> None:
    async with observed():
        await supervisors.start_application(DEMO)
        assert await fetch_json("/healthz") == (200, {"status": "ok", "node": "web@localhost"})
        status, tree = await fetch_json("/api/tree")
        assert status == 200
        demo = next(app for app in tree["applications"] if app["name"] == "demo")
        assert demo["root"]["strategy"] == "one_for_one"
        assert [child["id"] for child in demo["root"]["children"]] == ["worker", "inner"]
        assert demo["root"]["children"][1]["supervisor"]["children"][0]["id"] == "leaf"
        status, snapshot = await fetch_json("/api/snapshot")
        assert status == 200 and snapshot["node"] == "web@localhost"
        names = {p["registered_name"] for p in snapshot["processes"]}
        assert "application_controller" in names
        assert all(p["pid"].startswith("<web@localhost.") for p in snapshot["processes"])


async def test_unknown_paths_and_methods_get_a_json_error() -> None:
    async with observed():
        status, body = await fetch_json("/nope")
        assert status == 404
        assert body["error"] == "not_found" and "/metrics" in body["endpoints"]
        status, headers, raw = await fetch("/metrics", "POST")
        assert status == 405 and headers["allow"] == "GET, HEAD"
        assert json.loads(raw)["error"] == "method_not_allowed"
        status, headers, raw = await fetch("/healthz", "HEAD")
        assert status == 200 and raw == b"" and int(headers["content-length"]) > 0


async def test_a_process_detail_shows_links_monitors_and_its_mailbox_head() -> None:
    async with observed():
        await supervisors.start_application(DEMO)
        worker = otp.whereis("application_controller")
        assert worker is not None
        status, listing = await fetch_json("/api/processes")
        assert status == 200 and repr(worker) in {p["pid"] for p in listing["processes"]}
        parked = otp.spawn(otp.receive, lambda m: m == "never")
        otp.link(parked)
        otp.send(parked, ("hello", 1))
        await trio.testing.wait_all_tasks_blocked()
        status, detail = await fetch_json("/api/processes/" + quote(repr(parked)))
        assert status == 200 and detail["pid"] == repr(parked)
        assert detail["mailbox_head"] == ["('hello', 1)"]
        assert repr(otp.self()) in detail["links"]
        otp.unlink(parked)
        otp.exit(parked, otp.KILL)


async def test_an_unknown_or_malformed_pid_is_a_json_error_naming_it() -> None:
    async with observed():
        status, body = await fetch_json("/api/processes/" + quote("<web@localhost.999999.0>"))
        assert status == 404 and body["error"] == "unknown_pid"
        assert body["pid"] == "<web@localhost.999999.0>"
        status, body = await fetch_json("/api/processes/not-a-pid")
        assert status == 400 and body["error"] == "invalid_pid" and body["pid"] == "not-a-pid"
        assert "<node.id.creation>" in body["message"]


async def test_a_port_in_use_fails_the_observers_start_with_the_reason() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with otp.open_node():
            app = node.observer_application(node.ObserverSettings("127.0.0.1", port))
            with pytest.raises(
                supervisors.ApplicationError, match=f"cannot listen on 127.0.0.1:{port}"
            ):
                await supervisors.start_application(app)
            assert node.observer_address() is None


def test_the_observer_refuses_a_public_address_unless_told() -> None:
    with pytest.raises(
        node.ConfigError, match=r"0\.0\.0\.0 is not a loopback address.*--observer-public"
    ):
        node.load_config(["--observer", "0.0.0.0:9100"])
    assert node.load_config(["--observer", "0.0.0.0:9100", "--observer-public"]).observer == (
        node.ObserverSettings("0.0.0.0", 9100)
    )
    assert node.load_config(["--observer", "[::1]:0"]).observer == node.ObserverSettings("::1", 0)
    with pytest.raises(node.ConfigError, match="HOST:PORT with a port from 0"):
        node.load_config(["--observer", "127.0.0.1"])


def test_the_embedded_default_node_serves_the_observer_unless_told_off(tmp_path: Any) -> None:
    assert node.load_config([]).observer == node.ObserverSettings("127.0.0.1", 0)
    assert node.load_config(["--observer", "off"]).observer is None
    config = tmp_path / "node.toml"
    config.write_text('[observer]\nlisten = "off"\n')
    assert node.load_config(["--config", str(config)]).observer is None
    # a node that names its applications serves no observer unless asked
    assert node.load_config(["--app", "test_node.node_apps:first"]).observer is None


def test_node_toml_enables_the_observer(tmp_path: Any) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[observer]\nlisten = "127.0.0.1:9100"\n')
    assert node.load_config(["--config", str(config)]).observer == (
        node.ObserverSettings("127.0.0.1", 9100)
    )
    config.write_text('[observer]\nlisten = "10.1.2.3:9100"\n')
    with pytest.raises(node.ConfigError, match=r"observer\.listen 10\.1\.2\.3:9100"):
        node.load_config(["--config", str(config)])
    config.write_text("[observer]\nport = 9100\n")
    with pytest.raises(node.ConfigError, match=r"\[observer\] has unknown keys \['port'\]"):
        node.load_config(["--config", str(config)])


async def test_python_m_otp_node_serves_the_observer_it_prints() -> None:
    """The embedded default (demo, dispatcher, dirty pool, matching server) serves its observer
    by default on a free loopback port: each application's own view shows in /metrics."""
    async with Node() as running:
        line = await running.line_with("observer on http://127.0.0.1:")
        address = line.split()[2]
        await running.line_with("stop with Ctrl-C")
        status, _headers, body = await fetch("/healthz", address=address)
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, _headers, body = await fetch("/readyz", address=address)
        assert (status, json.loads(body)) == (200, {"status": "ready"})
        status, _headers, body = await fetch("/metrics", address=address)
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert families["otp_dirty_workers"].samples[0].value == 1
        assert families["otp_dirty_calls_in_flight"].samples[0].value == 0
        assert families["otp_dispatcher_running"].samples[0].value == 0
        assert families["otp_matching_streams"].samples[0].value == 0
        restarts = {s.labels["application"] for s in families["otp_supervisor_restarts"].samples}
        assert restarts == {"observer", "demo", "dispatcher", "dirty", "matching"}
        running.signal(signal.SIGTERM)
        assert await running.exit_code() == 0


async def test_the_ets_tables_page_reads_api_tables() -> None:
    async with observed():
        table = otp.ets.new("web_tables_page", named=True, access="protected")
        otp.ets.insert(table, [(1, "a"), (2, "b")])
        status, body = await fetch_json("/api/tables")
        assert status == 200
        [row] = [t for t in body["tables"] if t["name"] == "web_tables_page"]
        assert (row["size"], row["type"], row["access"]) == (2, "set", "protected")
        assert row["owner"] == repr(otp.self()) and row["memory"] > 0


async def test_api_series_serves_the_samplers_ring_by_series_name() -> None:
    async with observed():
        status, body = await fetch_json("/api/series")
        assert status == 200 and body["interval"] == 1.0 and body["window"] == 600
        assert set(body["series"]) == {
            "messages_per_second",
            "restarts_per_second",
            "dirty_calls_per_second",
            "dirty_errors_per_second",
            "dirty_latency_mean_seconds",
            "dirty_latency_p99_seconds",
        }
        assert all(len(values) == len(body["t"]) for values in body["series"].values())


async def test_api_series_without_a_sampler_says_where_it_runs() -> None:
    async with otp.open_node("bare@localhost"):
        series = await node.LocalSource().series()
        assert series["t"] == [] and series["series"]["messages_per_second"] == []
        assert "start the node with --observer" in series["message"]


def _strict(constant: str) -> Any:
    raise AssertionError(f"{constant} is not JSON: a browser's JSON.parse refuses it")


async def test_a_views_infinite_bucket_bound_is_served_as_plus_inf_in_strict_json() -> None:
    """A latency histogram's last bucket is +Inf, which JSON cannot say: the page would
    fail to parse /api/tree. It is served as Prometheus spells it."""
    calls = {
        "total": 3,
        "errors": {"DirtyTimeoutError": 1},
        "latency_seconds": {"buckets": [[0.1, 2], [float("inf"), 3]], "sum": 0.7, "count": 3},
    }
    dirty = supervisors.Application(
        "dirty", (supervisors.SupFlags(), []), observer_view=lambda: {"calls": calls}
    )
    async with observed():
        await supervisors.start_application(dirty)
        status, _headers, raw = await fetch("/api/tree")
        tree = json.loads(raw, parse_constant=_strict)
        [view] = [app["view"] for app in tree["applications"] if app["name"] == "dirty"]
        assert status == 200
        assert view["calls"]["latency_seconds"]["buckets"] == [[0.1, 2], ["+Inf", 3]]
