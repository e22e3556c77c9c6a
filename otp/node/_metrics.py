"""The node's Prometheus metrics: a ``prometheus_client`` Collector over one observer snapshot
(``otp.observer.snapshot()``), the applications' views (``supervisors.observe()``) and the
records the log handlers' burst limits dropped (``otp.BurstLimit.dropped_total``), read at
each scrape. Nothing is counted on the hot path for it: every figure is one the runtime, the
supervisors or the applications keep anyway.

The applications' views are plain dicts; the ones this node knows the shape of (the dirty pool,
the dispatcher, the matching server, by application name) become metrics of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

import otp
import supervisors

from ._logs import burst_limits

__all__ = ["NodeCollector", "exposition"]

# The OS process's own figures (CPU, memory, open files) and Python's version, as Python exporters
# shows them: built once, read at each scrape like ours.
_STANDARD: tuple[Collector, ...] = (
    prometheus_client.ProcessCollector(registry=None),
    prometheus_client.PlatformCollector(registry=None),
)


class NodeCollector(Collector):
    """The metrics of one node at one moment: ``snapshot`` and ``applications``, as read for a
    scrape, and ``dropped_logs``: the records each log handler's burst limit dropped so far,
    by handler. ``collect`` only converts; it takes no new reading."""

    def __init__(
        self,
        snapshot: otp.observer.NodeSnapshot,
        applications: list[supervisors.ApplicationView],
        dropped_logs: Mapping[str, int] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.applications = applications
        self.dropped_logs = {} if dropped_logs is None else dropped_logs

    def collect(self) -> Iterator[Metric]:
        yield from _runtime(self.snapshot)
        yield _dropped_logs(self.dropped_logs)
        yield from _supervisors(self.applications)
        for app in self.applications:
            convert = _VIEWS.get(app.name)
            if convert is not None and app.view is not None and "error" not in app.view:
                yield from convert(app.view)


def exposition(
    snapshot: otp.observer.NodeSnapshot,
    applications: list[supervisors.ApplicationView],
    accept: str = "",
) -> tuple[bytes, str]:
    """The scrape's body and content type: the Prometheus text format, or OpenMetrics if the
    scraper's ``Accept`` header asks for it (prometheus_client's own negotiation)."""
    registry = CollectorRegistry(auto_describe=False)
    dropped_logs = {_handler_name(limit.handler): limit.dropped_total for limit in burst_limits()}
    for collector in (*_STANDARD, NodeCollector(snapshot, applications, dropped_logs)):
        registry.register(collector)
    encode, content_type = prometheus_client.exposition.choose_encoder(accept)
    return encode(registry), content_type


def _handler_name(handler: logging.Handler) -> str:
    return handler.get_name() or type(handler).__name__


def _dropped_logs(dropped: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(
        "otp_log_records_dropped_total",
        "Log records a handler's burst limit dropped (OTP's burst_limit_max_count per"
        " burst_limit_window_time), by handler.",
        labels=["handler"],
    )
    for handler, count in dropped.items():
        family.add_metric([handler], count)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _runtime(snap: otp.observer.NodeSnapshot) -> Iterator[Metric]:
    processes = snap.processes
    yield _gauge("otp_processes", "Live processes on the node.", len(processes))
    yield _gauge(
        "otp_run_queue_processes",
        "Processes ready to run and waiting for their turn (Erlang's run queue length).",
        sum(1 for p in processes if p.status == "runnable"),
    )
    yield _gauge(
        "otp_mailbox_messages",
        "Messages waiting in all mailboxes.",
        sum(p.message_queue_len for p in processes),
    )
    largest = GaugeMetricFamily(
        "otp_mailbox_largest_messages",
        "Messages waiting in the largest mailbox, labelled with its process.",
        labels=["pid", "name"],
    )
    if processes:
        top = max(processes, key=lambda p: p.message_queue_len)
        name = "" if top.registered_name is None else str(top.registered_name)
        largest.add_metric([repr(top.pid), name], top.message_queue_len)
    yield largest
    yield _gauge(
        "otp_processes_memory_bytes",
        "Estimated memory of all processes (records, link tables, mailboxes).",
        sum(p.memory for p in processes),
    )
    yield _gauge("otp_ports", "Open ports (OS processes owned by a process).", len(snap.ports))
    objects = GaugeMetricFamily(
        "otp_ets_table_objects", "Objects in an ETS table.", labels=["table"]
    )
    memory = GaugeMetricFamily(
        "otp_ets_table_memory_bytes", "Estimated memory of an ETS table.", labels=["table"]
    )
    for table in snap.tables:
        objects.add_metric([table.name], table.size)
        memory.add_metric([table.name], table.memory)
    yield objects
    yield memory
    states = GaugeMetricFamily(
        "otp_dist_connections", "Distribution connections, by state.", labels=["state"]
    )
    sent = CounterMetricFamily(
        "otp_dist_bytes_sent_total",
        "Bytes written to a peer node on its current connection.",
        labels=["node"],
    )
    received = CounterMetricFamily(
        "otp_dist_bytes_received_total",
        "Bytes read from a peer node on its current connection.",
        labels=["node"],
    )
    queued = GaugeMetricFamily(
        "otp_dist_bytes_queued", "Bytes waiting to be written to a peer node.", labels=["node"]
    )
    counts: dict[str, int] = {"up": 0, "connecting": 0, "down": 0}
    for conn in snap.connections:
        counts[conn.state] = counts.get(conn.state, 0) + 1
        sent.add_metric([conn.node], conn.bytes_written)
        received.add_metric([conn.node], conn.bytes_received)
        queued.add_metric([conn.node], conn.bytes_queued)
    for state, count in counts.items():
        states.add_metric([state], count)
    yield from (states, sent, received, queued)


def _supervisors(applications: list[supervisors.ApplicationView]) -> Iterator[Metric]:
    labels = ["application", "supervisor"]
    restarts = CounterMetricFamily(
        "otp_supervisor_restarts_total",
        "Restarts a supervisor made since it started (the supervisor is its path of child ids"
        " from the application's root).",
        labels=labels,
    )
    window = GaugeMetricFamily(
        "otp_supervisor_restarts_in_window",
        "Restarts counting against the supervisor's intensity now.",
        labels=labels,
    )
    children = GaugeMetricFamily(
        "otp_supervisor_children",
        "Children of a supervisor, by state (running, restarting, stopped).",
        labels=[*labels, "state"],
    )
    by_child = CounterMetricFamily(
        "otp_child_restarts_total",
        "Restarts a child's exits caused since its supervisor started.",
        labels=[*labels, "child"],
    )
    running = GaugeMetricFamily(
        "otp_application_running",
        "1 for each running application (its version as a label).",
        labels=["application", "version"],
    )
    for app in applications:
        running.add_metric([app.name, app.version], 1)
        pending = [] if app.root is None else [(app.name, app.root)]
        while pending:
            path, view = pending.pop()
            restarts.add_metric([app.name, path], view.restarts_total)
            window.add_metric([app.name, path], view.restarts_in_window)
            states = {"running": 0, "restarting": 0, "stopped": 0}
            for child in view.children:
                if isinstance(child.pid, otp.Pid):
                    states["running"] += 1
                elif child.pid is None:
                    states["stopped"] += 1
                else:
                    states["restarting"] += 1
                if child.id is not None:
                    by_child.add_metric([app.name, path, str(child.id)], child.restarts)
                if child.supervisor is not None:
                    pending.append((f"{path}/{child.id}", child.supervisor))
            for state, count in states.items():
                children.add_metric([app.name, path, state], count)
    yield from (restarts, window, children, by_child, running)


def _dirty(view: Mapping[str, Any]) -> Iterator[Metric]:
    workers = view.get("workers", [])
    yield _gauge("otp_dirty_workers", "Dirty worker OS processes alive.", len(workers))
    yield _gauge(
        "otp_dirty_workers_draining",
        "Dirty workers draining (finishing their calls before they stop).",
        sum(1 for w in workers if w.get("draining")),
    )
    yield _gauge(
        "otp_dirty_calls_in_flight",
        "Dirty calls sent to a worker and not answered yet.",
        sum(w.get("in_flight", 0) for w in workers),
    )
    yield _gauge(
        "otp_dirty_calls_waiting_for_thread",
        "Dirty calls in flight that wait for a free worker thread.",
        sum(w.get("waiting_for_thread", 0) for w in workers),
    )
    parked = GaugeMetricFamily(
        "otp_dirty_parked_connections",
        "Client connections with calls waiting for a worker of the app to start.",
        labels=["app"],
    )
    for app, count in view.get("parked", {}).items():
        parked.add_metric([app], count)
    stash = GaugeMetricFamily("otp_dirty_stash_keys", "Keys in a stash table.", labels=["table"])
    for table, size in view.get("stash_tables", {}).items():
        stash.add_metric([table], size)
    yield from (parked, stash)
    yield from _dirty_calls(view.get("calls"))


def _dirty_calls(calls: Mapping[str, Any] | None) -> Iterator[Metric]:
    """The pool's calls (``apps.dirty``'s view: ``total``, ``errors`` by kind, and the latency
    histogram with cumulative ``[le, count]`` buckets, ``+Inf`` being ``count``)."""
    if not calls:
        return
    yield CounterMetricFamily(
        "otp_dirty_calls_total",
        "Dirty calls that reached a worker and ended (answered, or failed by the pool).",
        value=calls.get("total", 0),
    )
    errors = CounterMetricFamily(
        "otp_dirty_call_errors_total",
        "Dirty calls that ended in an error, by kind (the error type the caller gets).",
        labels=["kind"],
    )
    for kind, count in calls.get("errors", {}).items():
        errors.add_metric([kind], count)
    yield errors
    latency = calls.get("latency_seconds", {})
    buckets = [(floatToGoString(le), count) for le, count in latency.get("buckets", [])]
    buckets.append(("+Inf", latency.get("count", 0)))
    yield HistogramMetricFamily(
        "otp_dirty_call_duration_seconds",
        "Dirty call latency, from the request's arrival in the node to its last reply frame.",
        buckets=buckets,
        sum_value=latency.get("sum", 0.0),
    )


def _dispatcher(view: Mapping[str, Any]) -> Iterator[Metric]:
    yield _gauge("otp_dispatcher_running", "Handler attempts running now.", view.get("running", 0))
    yield _gauge(
        "otp_dispatcher_in_flight_keys",
        "Idempotency keys with a call in flight.",
        view.get("in_flight_keys", 0),
    )
    yield _gauge(
        "otp_dispatcher_cached_results",
        "Results held for de-duplication.",
        view.get("cached_results", 0),
    )
    tool = ["tool"]
    counters = {
        key: CounterMetricFamily(f"otp_dispatcher_{key}_total", doc, labels=tool)
        for key, doc in (
            ("calls", "Calls to a tool that finished (ok or an error)."),
            ("attempts", "Handler attempts for a tool (a retried call makes several)."),
            ("retries", "Retries of a tool's calls."),
            ("timeouts", "Attempts of a tool that timed out."),
            ("dedup_hits", "Calls answered from the de-duplication table."),
        )
    }
    errors = CounterMetricFamily(
        "otp_dispatcher_errors_total",
        "Calls to a tool that ended in an error, by kind.",
        labels=["tool", "kind"],
    )
    breaker = GaugeMetricFamily(
        "otp_dispatcher_breaker_state",
        "1 for a tool's breaker's current state (closed, open, half_open).",
        labels=["tool", "state"],
    )
    duration = HistogramMetricFamily(
        "otp_dispatcher_call_duration_seconds",
        "How long calls to a tool took, from dispatch to its result or error.",
        labels=tool,
    )
    for name, stats in view.get("tools", {}).items():
        for key, family in counters.items():
            family.add_metric([name], stats.get(key, 0))
        latency = stats.get("latency_seconds")
        if latency is not None:
            duration.add_metric(
                [name],
                [(_le(le), count) for le, count in latency["buckets"]],
                sum_value=latency["sum"],
            )
        for kind, count in stats.get("errors", {}).items():
            errors.add_metric([name, kind], count)
        if stats.get("breaker") is not None:
            breaker.add_metric([name, stats["breaker"]], 1)
    yield from (*counters.values(), errors, breaker, duration)


def _le(bound: float | str) -> str:
    """A bucket bound as Prometheus writes it (``"0.005"``, ``"+Inf"``)."""
    return bound if isinstance(bound, str) else prometheus_client.utils.floatToGoString(bound)


def _matching(view: Mapping[str, Any]) -> Iterator[Metric]:
    yield _gauge("otp_matching_streams", "Worker streams registered.", view.get("streams", 0))
    streams = GaugeMetricFamily(
        "otp_matching_queue_streams",
        "Streams of a queue, by state (idle, offered, busy).",
        labels=["queue", "kind", "state"],
    )
    backlog = GaugeMetricFamily(
        "otp_matching_queue_backlog",
        "Flows waiting in a queue for a stream.",
        labels=["queue", "kind"],
    )
    for row in view.get("queues", []):
        queue, kind = str(row.get("name")), str(row.get("kind"))
        for state in ("idle", "offered", "busy"):
            streams.add_metric([queue, kind, state], row.get(state, 0))
        backlog.add_metric([queue, kind], row.get("waiting", 0))
    yield from (streams, backlog)
    reasons = CounterMetricFamily(
        "otp_matching_dispatches",
        "Routing decisions of the matching server, by reason (sticky, fallback_no_stream, ...).",
        labels=["reason"],
    )
    for reason, count in sorted((view.get("dispatch_reasons") or {}).items()):
        reasons.add_metric([str(reason)], count)
    yield reasons


#: The application views this node turns into metrics, by application name.
_VIEWS: dict[str, Callable[[Mapping[str, Any]], Iterator[Metric]]] = {
    "dirty": _dirty,
    "dispatcher": _dispatcher,
    "matching": _matching,
}
