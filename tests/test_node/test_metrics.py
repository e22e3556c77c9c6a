"""``otp.node``'s Prometheus metrics (``_metrics.exposition``, what ``/metrics`` serves):
names by Prometheus conventions, the run queue, restarts by supervisor and by child, and the
dirty pool's calls, the log records a burst limit dropped."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from test_otp.peer import COOKIE, PeerNode

import otp
import supervisors
from otp.node._metrics import exposition
from supervisors import ChildSpec, Supervisor


class Worker(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(state, state)


class Root(Supervisor):
    def init(self) -> Any:
        return {"strategy": "one_for_one", "intensity": 5}, [
            ChildSpec("worker", Worker),
            ChildSpec("other", Worker),
        ]


async def _families() -> dict[str, Any]:
    body, _content_type = exposition(otp.observer.snapshot(), await supervisors.observe())
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


async def test_metric_names_follow_prometheus_conventions() -> None:
    async with otp.open_node("metrics@localhost"):
        await supervisors.start_application(supervisors.Application("demo", Root))
        families = await _families()
        ours = {name: f for name, f in families.items() if name.startswith("otp_")}
        for name in ("otp_processes", "otp_run_queue_processes", "otp_child_restarts"):
            assert name in ours
        for name, family in ours.items():
            assert re.fullmatch(r"otp(_[a-z0-9]+)+", name), name
            if family.type == "counter":
                assert all(s.name.endswith("_total") for s in family.samples), name
            assert not re.search(r"_(ms|milliseconds|kb|kilobytes)\b", name), name
        await supervisors.stop_all_applications()


async def test_restarts_are_counted_by_child() -> None:
    async with otp.open_node("metrics@localhost"):
        await supervisors.start_application(supervisors.Application("demo", Root))
        root = supervisors.application_supervisor("demo")
        children = {child_id: pid for child_id, pid, _, _ in await supervisors.which_children(root)}
        otp.monitor(children["worker"])
        otp.exit(children["worker"], otp.KILL)
        await otp.receive(otp.Down)
        await supervisors.which_children(root)  # (answered once the restart is done)
        samples = {
            s.labels["child"]: s.value for s in (await _families())["otp_child_restarts"].samples
        }
        assert samples == {"worker": 1, "other": 0}
        run_queue = (await _families())["otp_run_queue_processes"].samples[0].value
        assert 0 <= run_queue <= len(otp.observer.observe_processes())
        await supervisors.stop_all_applications()


async def test_distribution_bytes_are_counted_per_peer_node(tmp_path: Path) -> None:
    b_address = f"unix:{tmp_path / 'b'}.sock"
    async with PeerNode("b@localhost", b_address):
        async with otp.open_node("metrics@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
            assert await otp.connect("b@localhost", b_address)
            assert await otp.call(("echo", "b@localhost"), b"x" * 10_000) == b"x" * 10_000
            snapshot = otp.observer.snapshot()
            body, _content_type = exposition(snapshot, [])
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            (conn,) = snapshot.connections
            for name, counted in (
                ("otp_dist_bytes_sent", conn.bytes_written),
                ("otp_dist_bytes_received", conn.bytes_received),
            ):
                (sample,) = families[name].samples
                assert sample.name == f"{name}_total"
                assert sample.labels == {"node": "b@localhost"}
                assert sample.value == counted > 10_000


async def test_records_a_burst_limit_dropped_are_counted_by_handler() -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())
    handler.set_name("node-stderr")
    handler.addFilter(otp.BurstLimit(handler, max_count=3, window=60.0))
    root.addHandler(handler)
    log = logging.getLogger("test_metrics.storm")
    log.propagate, level = True, log.level
    log.setLevel(logging.INFO)
    try:
        async with otp.open_node("metrics@localhost"):
            assert (await _families())["otp_log_records_dropped"].samples[0].value == 0
            for i in range(10):
                log.info("record %d", i)
            (sample,) = (await _families())["otp_log_records_dropped"].samples
            assert sample.name == "otp_log_records_dropped_total"
            assert sample.labels == {"handler": "node-stderr"}
            assert sample.value == 7
    finally:
        root.removeHandler(handler)
        log.setLevel(level)


async def test_dirty_calls_errors_and_latency_are_a_counter_and_a_histogram() -> None:
    view = {
        "workers": [{"in_flight": 0, "waiting_for_thread": 0, "draining": False}],
        "stash_tables": {"t": 3},
        "calls": {
            "total": 5,
            "errors": {"DirtyAppError": 2, "DirtyTimeoutError": 1},
            "latency_seconds": {"buckets": [[0.001, 1], [0.01, 4]], "sum": 0.5, "count": 5},
        },
    }
    async with otp.open_node("metrics@localhost"):
        dirty_app = supervisors.ApplicationView("dirty", "", "", None, view)
        body, _ = exposition(otp.observer.snapshot(), [dirty_app])
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["otp_dirty_calls"].type == "counter"
    assert [s.value for s in families["otp_dirty_calls"].samples] == [5]
    errors = {s.labels["kind"]: s.value for s in families["otp_dirty_call_errors"].samples}
    assert errors == {"DirtyAppError": 2, "DirtyTimeoutError": 1}
    latency = families["otp_dirty_call_duration_seconds"]
    assert latency.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in latency.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.001": 1, "0.01": 4, "+Inf": 5}
    others = {s.name: s.value for s in latency.samples if not s.name.endswith("_bucket")}
    assert others["otp_dirty_call_duration_seconds_sum"] == 0.5
    assert others["otp_dirty_call_duration_seconds_count"] == 5
    assert families["otp_dirty_workers"].samples[0].value == 1
    assert {s.labels["table"]: s.value for s in families["otp_dirty_stash_keys"].samples} == {
        "t": 3
    }


async def test_matching_dispatches_are_counted_by_their_routing_reason() -> None:
    view = {
        "streams": 2,
        "queues": [],
        "dispatch_reasons": {"sticky": 3, "fallback_timeout": 1, "delivered": 4},
    }
    silent = {"streams": 0}  # the engine did not answer in time: no reasons
    async with otp.open_node("metrics@localhost"):
        matching = supervisors.ApplicationView("matching", "", "", None, view)
        body, _ = exposition(otp.observer.snapshot(), [matching])
        without = supervisors.ApplicationView("matching", "", "", None, silent)
        body_without, _ = exposition(otp.observer.snapshot(), [without])
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    family = families["otp_matching_dispatches"]
    assert family.type == "counter"
    assert {s.labels["reason"]: s.value for s in family.samples} == {
        "delivered": 4,
        "fallback_timeout": 1,
        "sticky": 3,
    }
    families = {f.name: f for f in text_string_to_metric_families(body_without.decode())}
    assert families["otp_matching_dispatches"].samples == []
