"""Property tests that simulate crashes: a stateful machine against the pure model, and scripted
crash sequences on random supervision trees, both on the real runtime and trio's MockClock."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import otp
from supervisors import ChildSpec, Supervisor, SupFlags, which_children
from supervisors import delete_child as real_delete_child
from supervisors import restart_child as real_restart_child
from supervisors import start_child as real_start_child
from supervisors import terminate_child as real_terminate_child

from .model import MSup, SupDef, WorkerDef, crash

REASONS = {
    "normal": otp.NORMAL,
    "shutdown": otp.SHUTDOWN,
    "shutdown_x": otp.Shutdown("x"),
    "boom": "boom",
}
CRASH_KINDS = [*REASONS, "crash", "killed"]


def token(reason: Any) -> str:
    if isinstance(reason, otp.Shutdown):
        return "shutdown_x"
    if isinstance(reason, otp.Crash):
        return "crash"
    return str(reason)


class PWorker(otp.GenServer):
    """Logs its start and its terminate; stops or raises on request."""

    async def init(self, ident: str, log: list[Any], pids: dict[str, otp.Pid]) -> Any:
        otp.process_flag(trap_exit=True)
        log.append(("start", ident))
        pids[ident] = otp.self()
        return otp.Ok((ident, log))

    async def handle_cast(self, request: Any, state: Any) -> Any:
        if request == "raise":
            raise RuntimeError("simulated crash")
        return otp.Stop(request, state)

    async def terminate(self, reason: Any, state: Any) -> None:
        state[1].append(("terminate", state[0], token(reason)))


def child_spec(defn: WorkerDef | SupDef, log: list[Any], pids: dict[str, otp.Pid]) -> ChildSpec:
    if isinstance(defn, SupDef):
        return ChildSpec(defn.id, (TreeSup.start_link, defn, log, pids), restart=defn.restart)
    return ChildSpec(defn.id, (PWorker.start_link, defn.id, log, pids), restart=defn.restart)


class TreeSup(Supervisor):
    def init(self, defn: SupDef, log: list[Any], pids: dict[str, otp.Pid]) -> Any:
        log.append(("start", defn.id))
        pids[defn.id] = otp.self()
        flags = SupFlags(defn.strategy, defn.intensity, defn.period)
        return flags, [child_spec(c, log, pids) for c in defn.children]


async def inflict(pid: otp.Pid | None, kind: str) -> None:
    if pid is None:
        return
    if kind == "killed":
        otp.exit(pid, otp.KILL)
    elif kind == "crash":
        otp.cast(pid, "raise")
    else:
        otp.cast(pid, REASONS[kind])
    await trio.testing.wait_all_tasks_blocked()


# -- 1. a stateful machine: one supervisor, its child API and crashes, against the model -------


class NodeThread:
    """A node in a background thread, whose main process runs the machine's commands."""

    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=trio.run, args=(self._main,), kwargs={"clock": self.clock}, daemon=True
        )
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        send, receive = trio.open_memory_channel[Any](0)
        self._send = send
        async with otp.open_node():
            otp.process_flag(trap_exit=True)
            self._ready.set()
            async for fn, box, done in receive:
                if fn is None:
                    break
                try:
                    box["value"] = await fn()
                    await trio.testing.wait_all_tasks_blocked()
                except BaseException as exc:  # reported to the machine's thread
                    box["error"] = exc
                done.set()
            box["leftover"] = [p for p in otp.processes() if p != otp.self()]
            done.set()

    async def _submit(self, fn: Callable[[], Awaitable[Any]] | None) -> Any:
        box: dict[str, Any] = {}
        done = trio.Event()
        await self._send.send((fn, box, done))
        await done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value", box.get("leftover"))

    def run(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        return trio.from_thread.run(self._submit, fn, trio_token=self.token)

    def close(self) -> Any:
        leftover = trio.from_thread.run(self._submit, None, trio_token=self.token)
        self._thread.join()
        return leftover


restart_types = st.sampled_from(["permanent", "transient", "temporary"])


class SupervisorMachine(RuleBasedStateMachine):
    @initialize(
        strategy=st.sampled_from(["one_for_one", "one_for_all", "rest_for_one"]),
        intensity=st.integers(0, 3),
        period=st.integers(1, 5),
        restarts=st.lists(restart_types, min_size=1, max_size=4),
    )
    def boot(self, strategy: str, intensity: int, period: int, restarts: list[str]) -> None:
        self.node = NodeThread()
        self.log: list[Any] = []
        self.pids: dict[str, otp.Pid] = {}
        self.time = [0.0]
        children = tuple(WorkerDef(f"c{i}", r) for i, r in enumerate(restarts))
        self.defn = SupDef("root", strategy, intensity, period, "permanent", children)
        self.model = MSup(self.defn, [], self.time)
        self.model.boot()

        async def start() -> otp.Pid:
            return await TreeSup.start_link(self.defn, self.log, self.pids)

        self.sup = self.node.run(start)

    def teardown(self) -> None:
        node = getattr(self, "node", None)
        if node is None:
            return
        sup = self.sup

        async def stop() -> None:
            if otp.process_info(sup) is not None:
                otp.exit(sup, otp.SHUTDOWN)
                await otp.receive(lambda m: isinstance(m, otp.Exit) and m.pid == sup)

        try:
            node.run(stop)
            if self.model.alive:
                self.model.stop_all()
            assert self.log == self.model.log
        finally:
            leftover = node.close()
        assert leftover == []

    @precondition(lambda self: self.model.alive)
    @rule(child=st.integers(0, 7), kind=st.sampled_from(CRASH_KINDS))
    def crash_child(self, child: int, kind: str) -> None:
        ident = f"c{child}"
        crash(self.model, [ident], kind)
        self.node.run(lambda: inflict(self.pids.get(ident), kind))

    @rule(seconds=st.sampled_from([0.4, 1.0, 2.5, 6.0]))
    def advance_clock(self, seconds: float) -> None:
        self.time[0] += seconds

        async def jump() -> None:
            self.node.clock.jump(seconds)
            await trio.lowlevel.checkpoint()

        self.node.run(jump)

    @precondition(lambda self: self.model.alive)
    @rule(child=st.integers(0, 7), op=st.sampled_from(["terminate", "restart", "delete"]))
    def child_api(self, child: int, op: str) -> None:
        ident = f"c{child}"
        expected = getattr(self.model, f"{op}_child")(ident)
        call = {
            "terminate": real_terminate_child,
            "restart": real_restart_child,
            "delete": real_delete_child,
        }[op]
        result = self.node.run(lambda: call(self.sup, ident))
        if expected == "ok" and op == "restart":
            assert result[0] == "ok"
        else:
            assert result == expected

    @precondition(lambda self: self.model.alive)
    @rule(child=st.integers(0, 9), restart=restart_types)
    def start_new_child(self, child: int, restart: str) -> None:
        defn = WorkerDef(f"c{child}", restart)
        expected = self.model.start_child(defn)
        spec = child_spec(defn, self.log, self.pids)
        result = self.node.run(lambda: real_start_child(self.sup, spec))
        if expected == "ok":
            assert result[0] == "ok"
        else:
            assert result[0] == "error" and (
                result[1] == expected[1] or result[1][0] == expected[1]
            )

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "node"):
            return
        assert self.log == self.model.log
        sup = self.sup

        async def observe() -> Any:
            if otp.process_info(sup) is None:
                return None
            return [(row[0], isinstance(row[1], otp.Pid)) for row in await which_children(sup)]

        rows = self.node.run(observe)
        if self.model.alive:
            assert rows == self.model.rows()
        else:
            assert rows is None


SupervisorMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSupervisorMachine = SupervisorMachine.TestCase


# -- 2. scripted crash sequences on random trees (depth <= 3), in one trio.run each -----------


def trees(depth: int, prefix: str) -> st.SearchStrategy[SupDef]:
    def build(
        strategy: str, intensity: int, period: int, restart: str, kinds: list[Any]
    ) -> st.SearchStrategy[SupDef]:
        children: list[st.SearchStrategy[Any]] = []
        for i, kind in enumerate(kinds):
            ident = f"{prefix}{i}"
            if kind == "sup" and depth > 1:
                children.append(trees(depth - 1, ident + "."))
            else:
                children.append(restart_types.map(lambda r, ident=ident: WorkerDef(ident, r)))
        return st.tuples(*children).map(
            lambda cs: SupDef(
                prefix.rstrip(".") or "root", strategy, intensity, period, restart, cs
            )
        )

    return st.tuples(
        st.sampled_from(["one_for_one", "one_for_all", "rest_for_one"]),
        st.integers(0, 3),
        st.integers(1, 4),
        restart_types if prefix else st.just("permanent"),
        st.lists(st.sampled_from(["worker", "sup"]), min_size=1, max_size=3),
    ).flatmap(lambda args: build(*args))


def leaves(defn: SupDef, path: tuple[str, ...] = ()) -> list[list[str]]:
    found: list[list[str]] = []
    for child in defn.children:
        if isinstance(child, SupDef):
            found.extend(leaves(child, (*path, child.id)))
        else:
            found.append([*path, child.id])
    return found


steps = st.lists(
    st.one_of(
        st.tuples(st.just("crash"), st.integers(0, 30), st.sampled_from(CRASH_KINDS)),
        st.tuples(st.just("sleep"), st.sampled_from([0.5, 1.0, 3.0, 6.0]), st.just("")),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(3, ""), script=steps)
def test_random_trees_follow_the_model_and_leak_nothing(
    tree: SupDef, script: list[tuple[str, Any, str]]
) -> None:
    paths = leaves(tree)
    time = [0.0]
    model = MSup(tree, [], time)
    model.boot()
    log: list[Any] = []
    pids: dict[str, otp.Pid] = {}

    async def main() -> None:
        async with otp.open_node() as node:
            otp.process_flag(trap_exit=True)
            root = await TreeSup.start_link(tree, log, pids)
            for op, arg, kind in script:
                if op == "sleep":
                    time[0] += arg
                    await trio.sleep(arg)
                    continue
                path = paths[arg % len(paths)]
                crash(model, path, kind)
                await inflict(pids.get(path[-1]), kind)
                assert log == model.log
                assert (otp.process_info(root) is not None) == model.alive
            if model.alive:
                otp.exit(root, otp.SHUTDOWN)
                model.stop_all()
            exit_message = await otp.receive(lambda m: isinstance(m, otp.Exit) and m.pid == root)
            assert exit_message.reason == otp.SHUTDOWN
            await trio.testing.wait_all_tasks_blocked()
            assert log == model.log
            assert otp.processes() == [otp.self()]
            assert list(node.processes.values()) == [otp.current_node().processes[otp.self().id]]
            assert not node.nursery.child_tasks

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
