"""Play one conformance scenario (``../shared/conformance/README.md``) on the real runtime.

The tree is made of real :class:`~supervisors.Supervisor` processes and real ``GenServer``
workers; a driver process (trapping exits, linked to the root) performs the events and one
collector records the trace. The run is on trio's ``MockClock``: every wait of the scenario
(``settle_ms``, ``sleep``, slow ``terminate``, shutdown timeouts) passes in virtual time, so the
clock reads as it did in the OTP run that produced the expected trace, at no wall-clock cost.

Deaths are recorded at the instant the process ends, before its links and monitors fire (an
``otp.add_exit_hook`` of the process), so a death always
precedes the restart it causes, as in the collector of the OTP run.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import attrs
import trio
import trio.testing

import otp

from .._supervisor import Supervisor, start_child, which_children
from .._supervisor import count_children as _count_children
from .._supervisor import delete_child as _delete_child
from .._supervisor import restart_child as _restart_child
from .._supervisor import terminate_child as _terminate_child
from ._terms import format_term, parse_reason

DEFAULT_SETTLE_MS = 100
#: Where virtual time starts: mid-second, as far as can be from OTP's whole-second steps.
CLOCK_START = 0.5


def dumps(value: Any) -> str:
    """One trace line: keys sorted, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class ScenarioError(ValueError):
    """The scenario file does not follow the format."""


def _is_supervisor(node: dict[str, Any]) -> bool:
    return "children" in node or node.get("kind") == "supervisor"


class Collector:
    """Records the trace and tracks, per id, start attempts, incarnations and the latest pid."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.attempts: Counter[str] = Counter()
        self.incarnations: Counter[str] = Counter()
        self.pids: dict[str, otp.Pid] = {}
        self.closed = False

    def emit(self, **fields: Any) -> None:
        if not self.closed:
            self.lines.append(dumps(fields))

    def attempt(self, node: dict[str, Any]) -> str:
        """Count a start attempt of ``node``; return its outcome: ok, error or ignore."""
        ident = node["id"]
        self.attempts[ident] += 1
        attempt = self.attempts[ident]
        results = node.get("start_results", [])
        outcome = results[attempt - 1] if attempt <= len(results) else "ok"
        if outcome not in ("ok", "error", "ignore"):
            raise ScenarioError(f"start_results of {ident!r}: unknown outcome {outcome!r}")
        if outcome != "ok":
            self.emit(ev="start_failed", id=ident, attempt=attempt, result=outcome)
        return str(outcome)

    def started(self, ident: str) -> int:
        """Record a successful start of ``ident`` in the calling process; return its number."""
        self.incarnations[ident] += 1
        n = self.incarnations[ident]
        self.pids[ident] = otp.self()
        self.emit(ev="start", id=ident, n=n)

        def on_exit(_pid: otp.Pid, reason: Any) -> None:
            self.emit(ev="exit", id=ident, n=n, reason=format_term(reason))

        otp.add_exit_hook(on_exit)
        return n

    def child_spec(self, node: dict[str, Any]) -> dict[str, Any]:
        """The child spec (OTP's map form) of a scenario node; absent keys keep OTP defaults."""
        if "id" not in node:
            raise ScenarioError(f"a node has no id: {node!r}")
        is_sup = _is_supervisor(node)
        behaviour: Any = ScenarioSupervisor if is_sup else ScenarioWorker
        spec: dict[str, Any] = {
            "id": node["id"],
            "start": (behaviour.start_link, self, node),
            "type": "supervisor" if is_sup else "worker",
        }
        for key in ("restart", "significant"):
            if key in node:
                spec[key] = node[key]
        if "shutdown" in node:
            shutdown = node["shutdown"]
            spec["shutdown"] = shutdown / 1000 if isinstance(shutdown, int | float) else shutdown
        return spec


@attrs.define
class _WorkerState:
    ident: str
    n: int
    terminate_sleep: float


class ScenarioWorker(otp.GenServer):
    """A worker of the scenarios: answers ``ping`` with ``pong``, stops on ``("crash", R)``,
    stops with the reason of an exit signal from a non-parent, records its terminate."""

    async def init(self, collector: Collector, node: dict[str, Any]) -> Any:
        outcome = collector.attempt(node)
        if outcome == "error":
            return otp.Stop("start_failed")
        if outcome == "ignore":
            return otp.Ignore()
        if node.get("trap_exit", True):
            otp.process_flag(trap_exit=True)
        self.collector = collector
        n = collector.started(node["id"])
        return otp.Ok(_WorkerState(node["id"], n, node.get("terminate_sleep_ms", 0) / 1000))

    async def handle_call(self, request: Any, from_: otp.From, state: _WorkerState) -> Any:
        return otp.Reply("pong" if request == "ping" else ("error", "unknown_call"), state)

    async def handle_cast(self, request: Any, state: _WorkerState) -> Any:
        if isinstance(request, tuple) and request[0] == "crash":
            return otp.Stop(request[1], state)
        return otp.NoReply(state)

    async def handle_info(self, message: Any, state: _WorkerState) -> Any:
        if isinstance(message, otp.Exit):
            return otp.Stop(message.reason, state)
        return otp.NoReply(state)

    async def terminate(self, reason: Any, state: _WorkerState) -> None:
        self.collector.emit(
            ev="terminate_cb", id=state.ident, n=state.n, reason=format_term(reason)
        )
        if state.terminate_sleep > 0:
            await trio.sleep(state.terminate_sleep)


class ScenarioSupervisor(Supervisor):
    """A supervisor node of the scenarios: flags and children from the node."""

    def init(self, collector: Collector, node: dict[str, Any]) -> Any:
        outcome = collector.attempt(node)
        if outcome == "error":
            return otp.Stop("start_failed")
        if outcome == "ignore":
            return otp.Ignore()
        collector.started(node["id"])
        flags = {
            k: node[k] for k in ("strategy", "intensity", "period", "auto_shutdown") if k in node
        }
        children = [collector.child_spec(child) for child in node.get("children", [])]
        return flags, children


# -- the driver ---------------------------------------------------------------------------------


def _row(row: tuple[Any, Any, Any, Any]) -> list[str]:
    ident, child, kind, _modules = row
    status = "pid" if isinstance(child, otp.Pid) else ("undefined" if child is None else child)
    return [ident if isinstance(ident, str) else format_term(ident), status, str(kind)]


def _result(value: Any) -> str:
    return format_term(value)


def _exit_result(exc: otp.CallError) -> str:
    return "{exit," + format_term(exc.reason) + "}"


class Driver:
    """Performs a scenario's events from the node's main process."""

    def __init__(self, scenario: dict[str, Any], collector: Collector) -> None:
        self.scenario = scenario
        self.collector = collector
        self.root: otp.Pid | None = None

    def _pid(self, ident: Any) -> otp.Pid | None:
        return self.collector.pids.get(ident)

    def _target(self, event: dict[str, Any], key: str) -> Any:
        if key not in event:
            raise ScenarioError(f"event {event!r} needs {key!r}")
        pid = self._pid(event[key])
        if pid is None:
            # Never started: calls to it fail with noproc, as a call to a dead pid does.
            return f"__never_started__{event[key]}"
        return pid

    async def run(self) -> None:
        scenario = self.scenario
        emit = self.collector.emit
        otp.process_flag(trap_exit=True)
        emit(ev="begin", name=scenario.get("name", ""))
        root_node = scenario["supervisor"]
        try:
            self.root = await ScenarioSupervisor.start_link(self.collector, root_node)
            emit(ev="root_start_result", result="{ok,<pid>}")
        except otp.StartError as exc:
            emit(ev="root_start_result", result="{error," + format_term(exc.reason) + "}")
        except otp.StartIgnored:
            emit(ev="root_start_result", result="ignore")
        default_settle = scenario.get("settle_ms", DEFAULT_SETTLE_MS)
        for number, event in enumerate(scenario.get("events", []), 1):
            emit(ev="op", n=number, op=event)
            await self.perform(event)
            await self.settle(event.get("settle_ms", default_settle))
        emit(ev="final")
        root = self.root
        if root is None or otp.process_info(root) is None:
            emit(ev="tree", value="root_dead")
            return
        emit(ev="tree", value=await self.tree(root_node["id"], root))
        if scenario.get("final_shutdown", True):
            emit(ev="shutdown_root")
            otp.exit(root, otp.SHUTDOWN)
            await otp.receive(lambda m: isinstance(m, otp.Exit) and m.pid == root)
            await trio.testing.wait_all_tasks_blocked()

    async def settle(self, ms: float) -> None:
        await trio.sleep(ms / 1000)
        await trio.testing.wait_all_tasks_blocked()

    async def tree(self, ident: Any, pid: otp.Pid) -> dict[str, Any]:
        rows: list[Any] = []
        for row in await which_children(pid):
            child = row[1]
            if str(row[2]) == "supervisor" and isinstance(child, otp.Pid):
                try:
                    rows.append(await self.tree(_row(row)[0], child))
                    continue
                except otp.CallError:
                    pass
            rows.append(_row(row))
        return {"sup": ident, "children": rows}

    async def perform(self, event: dict[str, Any]) -> None:
        op = event.get("op")
        emit = self.collector.emit
        if op == "sleep":
            await trio.sleep(event.get("ms", 0) / 1000)
            return
        if op in ("crash", "kill", "exit_signal"):
            pid = self._pid(event.get("child"))
            if pid is None:
                return
            if op == "crash":
                otp.cast(pid, ("crash", parse_reason(event.get("reason", "normal"))))
            elif op == "kill":
                otp.exit(pid, otp.KILL)
            else:
                reason = parse_reason(event.get("reason", "normal"))

                async def signal() -> None:
                    otp.exit(pid, reason)

                otp.spawn(signal)
            return
        try:
            value = await self.call_op(op, event)
        except otp.CallError as exc:
            emit(ev="result", value=_exit_result(exc))
            return
        emit(ev="result", value=value)

    async def call_op(self, op: Any, event: dict[str, Any]) -> Any:
        if op == "call":
            target = self._target(event, "child")
            try:
                return _result(await otp.call(target, "ping", timeout=1.0))
            except otp.CallError as exc:
                return _exit_result(exc)
        if op not in (
            "which_children",
            "count_children",
            "terminate_child",
            "restart_child",
            "delete_child",
            "start_child",
            "start_child_dyn",
        ):
            raise ScenarioError(f"unknown op {op!r} in {event!r}")
        sup = self._target(event, "sup")
        if op == "which_children":
            return [_row(row) for row in await which_children(sup)]
        if op == "count_children":
            return await _count_children(sup)
        if op == "start_child":
            return _result(await start_child(sup, self.collector.child_spec(event["spec"])))
        if op == "start_child_dyn":
            return _result(await start_child(sup, []))
        child = event.get("child")
        if op == "terminate_child":
            return _result(await _terminate_child(sup, child))
        if op == "restart_child":
            return _result(await _restart_child(sup, child))
        return _result(await _delete_child(sup, child))


# -- running ------------------------------------------------------------------------------------


async def run_scenario_async(scenario: dict[str, Any]) -> list[str]:
    """Run ``scenario`` on a fresh node in the current ``trio.run`` and return its trace lines."""
    collector = Collector()
    async with otp.open_node():
        try:
            await Driver(scenario, collector).run()
        finally:
            collector.closed = True
    return collector.lines


def run_scenario(scenario: dict[str, Any]) -> list[str]:
    """Run ``scenario`` in its own ``trio.run`` on a ``MockClock``; return the trace lines."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    clock.jump(CLOCK_START)
    return trio.run(run_scenario_async, scenario, clock=clock)
