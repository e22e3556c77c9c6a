"""SubFlow steps: the engine starts a child flow for the step (a deterministic id per attempt),
parks the parent's attempt without any worker, and completes it with the child's result; the
child failing fails the attempt (its retry policy applies, a retry starts a new child), the
child cancelled alone fails it for good, cancelling the parent or timing its attempt out
cancels the child; a restarted engine finds the child in the store. Then the same end to end
through a real server and a real ``TrioWorker``.

The engine tests use ``test_engine``'s stand-in matcher and real SQLite store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import otp
from apps.matching import (
    NOT_YET,
    Cancelled,
    ClientOptions,
    Flow,
    FlowFailed,
    FlowStatus,
    PullWorkerOptions,
    Registry,
    RetryPolicy,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    rpc,
    step,
    subflow,
    wait_for,
)
from apps.matching._cli_output import description_lines
from apps.matching._dispatch import Completed, Task
from apps.matching._engine import ENGINE, EngineOptions, FlowEngine
from apps.matching._store import SERVER_NAME, StoreServer, WriteBatch

from ._in_process import BOUND, matching_server, until
from ._stores import StoreKind
from .test_engine import (
    GatedStore,
    by_step,
    definition,
    describe,
    dispatches,
    fail,
    hang,
    ok,
    outcome,
    server,
    set_script,
    spawn_call,
)
from .test_engine import (
    step as step_entry,
)


def sub(name: str, child_type: str, child: dict[str, Any] | None, **retry: Any) -> dict[str, Any]:
    entry = step_entry(name, **retry)
    entry.update(kind="subflow", flow_type=child_type)
    entry["non_retryable_errors"] = retry.get("non_retryable_errors", [])
    if child is not None:
        entry["definition"] = child
    return entry


CHILD = definition(step_entry("c1"), step_entry("c2"))


def names(log: list[Any]) -> list[tuple[str, str]]:
    return [(d.task.flow_id, d.task.name) for _, d in log]


# -- the engine -----------------------------------------------------------------------------------


async def test_a_subflow_step_runs_its_child_and_takes_its_result_holding_no_dispatch(
    store_kind: StoreKind,
) -> None:
    def script(task: Task) -> Any:
        return [ok([task.name, *task.args])]

    spec = definition(step_entry("a"), sub("s", "C", CHILD), step_entry("b"))
    async with otp.open_node(), server(store_kind, script):
        await FlowEngine.start_flow("P", [1], spec, "p")
        result = await FlowEngine.result("p")
        log = await dispatches()
        parent, child = await describe("p"), await describe("p/1/s/1")
    # the step "s" itself is never dispatched: only its child's steps are
    assert names(log) == [("p", "a"), ("p/1/s/1", "c1"), ("p/1/s/1", "c2"), ("p", "b")]
    assert log[1][1].task.args == [["a", 1]]  # the child's args: the step's input
    assert result == ["b", ["c2", ["c1", ["a", 1]]]]
    assert (child.flow_type, child.status, child.args) == ("C", FlowStatus.COMPLETED, (["a", 1],))
    assert child.parent == {"flow_id": "p", "step_index": 1, "step": "s", "attempt": 1}
    assert parent.parent is None
    assert parent.children == (
        {
            "flow_id": "p/1/s/1",
            "flow_type": "C",
            "status": "completed",
            "step": "s",
            "step_index": 1,
            "attempt": 1,
        },
    )
    assert [(a["step"], a["status"], a["worker_id"]) for a in parent.attempts] == [
        ("a", "completed", "w1"),
        ("s", "completed", None),
        ("b", "completed", "w1"),
    ]
    text = "\n".join(description_lines(parent))
    assert "children:" in text and "p/1/s/1" in text


async def test_a_failed_child_fails_the_attempt_and_the_retry_starts_a_new_child(
    store_kind: StoreKind,
    autojump_clock: trio.testing.MockClock,
) -> None:
    child = definition(step_entry("c", max_attempts=1))
    script = by_step(c=[fail("KeyError", "first"), fail("OSError", "second"), ok("third")])
    spec = definition(sub("s", "C", child, max_attempts=3, initial_backoff=2))
    async with otp.open_node(), server(store_kind, script):
        start = trio.current_time()
        await FlowEngine.start_flow("P", [], spec, "p")
        assert await FlowEngine.result("p") == "third"
        log = await dispatches()
        parent = await describe("p")
    assert [(d.task.flow_id, round(at - start, 6)) for at, d in log] == [
        ("p/0/s/1", 0),
        ("p/0/s/2", 2),
        ("p/0/s/3", 6),
    ]
    assert [(a["attempt"], a["status"], a["error"]) for a in parent.attempts] == [
        (1, "failed", {"type": "KeyError", "message": "child flow 'p/0/s/1' (C) failed: first"}),
        (2, "failed", {"type": "OSError", "message": "child flow 'p/0/s/2' (C) failed: second"}),
        (3, "completed", None),
    ]
    assert [(c["flow_id"], c["status"]) for c in parent.children] == [
        ("p/0/s/1", "failed"),
        ("p/0/s/2", "failed"),
        ("p/0/s/3", "completed"),
    ]


async def test_a_child_error_named_non_retryable_fails_the_parent_at_once(
    store_kind: StoreKind,
    autojump_clock: trio.testing.MockClock,
) -> None:
    child = definition(step_entry("c", max_attempts=1))
    spec = definition(
        sub("s", "C", child, max_attempts=5, non_retryable_errors=["PaymentDeclined"])
    )
    async with (
        otp.open_node(),
        server(store_kind, by_step(c=[fail("PaymentDeclined", "no funds")])),
    ):
        await FlowEngine.start_flow("P", [], spec, "p")
        with pytest.raises(FlowFailed, match="PaymentDeclined") as info:
            await FlowEngine.result("p")
        assert len(await dispatches()) == 1
    assert info.value.details["message"] == "child flow 'p/0/s/1' (C) failed: no funds"


async def test_cancelling_the_parent_cancels_its_running_child_and_grandchild(
    store_kind: StoreKind,
) -> None:
    grandchild = definition(step_entry("g"))
    child = definition(sub("cs", "G", grandchild))
    spec = definition(sub("s", "C", child), step_entry("after"))
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("P", [], spec, "p")
        await trio.testing.wait_all_tasks_blocked()
        assert names(await dispatches()) == [("p/0/s/1/0/cs/1", "g")]
        await FlowEngine.cancel("p")
        for flow_id in ("p", "p/0/s/1", "p/0/s/1/0/cs/1"):
            with pytest.raises(Cancelled):
                await FlowEngine.result(flow_id)
        grand = await describe("p/0/s/1/0/cs/1")
        stats = await FlowEngine.statistics()
    assert grand.error == {
        "type": "cancelled",
        "message": "the parent flow 'p/0/s/1' no longer waits for it",
    }
    assert stats.flows_running == 0 and stats.dispatches_in_flight == 0


async def test_a_child_cancelled_alone_fails_the_parent_step_without_a_retry(
    store_kind: StoreKind,
) -> None:
    spec = definition(sub("s", "C", CHILD, max_attempts=5))
    async with otp.open_node(), server(store_kind, lambda task: [hang()]):
        await FlowEngine.start_flow("P", [], spec, "p")
        await trio.testing.wait_all_tasks_blocked()
        await FlowEngine.cancel("p/0/s/1")
        with pytest.raises(FlowFailed) as info:
            await FlowEngine.result("p")
        parent = await describe("p")
    assert info.value.details["type"] == "cancelled"
    assert parent.status is FlowStatus.FAILED
    assert [(a["attempt"], a["error"]["type"]) for a in parent.attempts] == [(1, "cancelled")]


async def test_a_subflow_attempt_past_its_timeout_cancels_its_child_and_retries(
    store_kind: StoreKind,
    autojump_clock: trio.testing.MockClock,
) -> None:
    child = definition(step_entry("c"))
    script = by_step(c=[hang(), ok("quick")])
    spec = definition(sub("s", "C", child, timeout=30, initial_backoff=1))
    async with otp.open_node(), server(store_kind, script):
        start = trio.current_time()
        await FlowEngine.start_flow("P", [], spec, "p")
        assert await FlowEngine.result("p") == "quick"
        first = await describe("p/0/s/1")
        log = await dispatches()
        parent = await describe("p")
    assert first.status is FlowStatus.CANCELLED
    assert [(d.task.flow_id, round(at - start, 6)) for at, d in log] == [
        ("p/0/s/1", 0),
        ("p/0/s/2", 31),
    ]
    assert parent.attempts[0]["error"] == {
        "type": "timeout",
        "message": "SubFlow step 's' attempt 1: its child flow did not end within its timeout"
        " of 30.0 s, and was cancelled",
    }


async def test_a_restarted_engine_finds_the_running_child_and_starts_no_second_one(
    store_kind: StoreKind, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = store_kind.durable
    spec = definition(sub("s", "C", CHILD), step_entry("b"))
    async with otp.open_node(), server(store_kind, by_step(c1=[ok("one")], c2=[hang()]), path=path):
        await FlowEngine.start_flow("P", ["x"], spec, "p")
        await trio.sleep(1)
        assert names(await dispatches()) == [("p/0/s/1", "c1"), ("p/0/s/1", "c2")]
        engine = otp.whereis(ENGINE)
        assert engine is not None
        otp.exit(engine, otp.KILL)  # the parent parked, its child's second step running
        await otp.GenServer.stop(SERVER_NAME)

        await StoreServer.start_link(store_kind.store(path), name=SERVER_NAME)
        await set_script(by_step(c2=[ok("two")], b=[ok("done")]))
        await FlowEngine.start(EngineOptions(first_delivery=1000), name=ENGINE)
        assert await FlowEngine.result("p") == "done"
        log = await dispatches()
        listed = await FlowEngine.list_flows()
    assert names(log) == [("p/0/s/1", "c2"), ("p", "b")]
    assert log[1][1].task.args == ["two"]
    assert sorted(s["flow_id"] for s in listed) == ["p", "p/0/s/1"]


async def test_a_restarted_engine_takes_the_outcome_of_a_child_that_ended_meanwhile(
    store_kind: StoreKind, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = store_kind.durable
    spec = definition(sub("s", "C", definition(step_entry("c"))), step_entry("b"))
    async with otp.open_node(), server(store_kind, by_step(c=[hang()]), path=path) as store:
        await FlowEngine.start_flow("P", [], spec, "p")
        await trio.sleep(1)
        (_, d), *_ = await dispatches()
        # The child's end is committed, the parent's step not yet: the engine dies between.
        halted = trio.Event()

        async def halt(batches: Any) -> Any:
            store.commit_many = halt_for_good  # type: ignore[method-assign]
            return await GatedStore.commit_many(store, batches)

        async def halt_for_good(batches: Any) -> Any:
            halted.set()
            await trio.sleep_forever()

        store.commit_many = halt  # type: ignore[method-assign]
        otp.send(ENGINE, Completed(d.task.delivery, "w1", "late child", {}))
        await halted.wait()
        engine = otp.whereis(ENGINE)
        assert engine is not None
        otp.exit(engine, otp.KILL)
        await otp.GenServer.stop(SERVER_NAME)

        await StoreServer.start_link(store_kind.store(path), name=SERVER_NAME)
        await set_script(by_step(b=[ok("done")]))
        await FlowEngine.start(EngineOptions(first_delivery=1000), name=ENGINE)
        assert await FlowEngine.result("p") == "done"
        log = await dispatches()
    assert names(log) == [("p", "b")]
    assert log[0][1].task.args == ["late child"]


async def test_an_engine_told_a_child_ended_elsewhere_reads_it_from_the_store(
    store_kind: StoreKind,
) -> None:
    spec = definition(sub("s", "C", definition(step_entry("c"))), step_entry("b"))
    async with otp.open_node(), server(store_kind, by_step(c=[hang()], b=[ok("B")])):
        await FlowEngine.start_flow("P", [], spec, "p")
        await trio.testing.wait_all_tasks_blocked()
        FlowEngine.child_ended("p")  # told too early: the child still runs, nothing changes
        await trio.testing.wait_all_tasks_blocked()
        assert names(await dispatches()) == [("p/0/s/1", "c")]
        # Another server ends the child (its record as that server would commit it) ...
        record = await StoreServer.get_flow("p/0/s/1")
        assert record is not None
        ended = attrs.evolve(
            record, status="completed", result="elsewhere", version=record.version + 1
        )
        await StoreServer.commit(WriteBatch(flows_upserted=[ended]))
        FlowEngine.child_ended("p")  # ... and tells this one
        assert await FlowEngine.result("p") == "B"
        FlowEngine.child_ended("p")  # told again, late: the step moved on, nothing changes
        log = await dispatches()
    assert names(log) == [("p/0/s/1", "c"), ("p", "b")]
    assert log[1][1].task.args == ["elsewhere"]


async def test_a_flow_id_taken_by_another_flow_fails_the_subflow_step(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind):
        await FlowEngine.start_flow("X", [], definition(), "p/0/s/1")
        await FlowEngine.start_flow("P", [], definition(sub("s", "C", CHILD)), "p")
        with pytest.raises(FlowFailed, match="flow_exists") as info:
            await FlowEngine.result("p")
    assert "is taken by a flow this step did not start" in info.value.details["message"]


async def test_a_child_type_without_a_known_definition_fails_the_attempt(
    store_kind: StoreKind,
) -> None:
    spec = definition(sub("s", "Unknown", None, max_attempts=1))
    async with otp.open_node(), server(store_kind):
        await FlowEngine.start_flow("P", [], spec, "p")
        with pytest.raises(FlowFailed, match="unknown_flow_type"):
            await FlowEngine.result("p")


async def test_a_recursive_subflow_uses_the_definition_the_server_knows(
    store_kind: StoreKind,
) -> None:
    def script(task: Task) -> Any:
        (n,) = task.args
        return [ok(n - 1)]

    # "R": step "dec", then a SubFlow of R itself (its definition left out, as the SDK does).
    spec = definition(step_entry("dec"), sub("again", "R", None, max_attempts=1))
    seen: list[str] = []

    def counting(task: Task) -> Any:
        seen.append(task.flow_id)
        if task.args == [0]:
            return [fail("Stop", "bottom", retryable=False)]
        return script(task)

    async with otp.open_node(), server(store_kind, counting):
        await FlowEngine.start_flow("R", [2], spec, "r")
        with pytest.raises(FlowFailed, match="Stop"):
            await FlowEngine.result("r")
    assert seen == ["r", "r/1/again/1", "r/1/again/1/1/again/1"]


async def test_a_subflow_step_waiting_for_a_result_caller_is_answered_once(
    store_kind: StoreKind,
) -> None:
    async with otp.open_node(), server(store_kind):
        await FlowEngine.start_flow("P", [7], definition(sub("s", "C", CHILD)), "p")
        tag = await spawn_call(FlowEngine.result, "p")
        assert await outcome(tag) == [[7]]


# -- end to end: a real server and a real TrioWorker ---------------------------------------------


class Payment(Flow):
    name = "Payment"

    @step
    async def pay(self, ctx, amount):
        return f"paid {amount}"


class Order(Flow):
    """A Step, a SubFlow, then a WaitFor that waits for an RPC's approval."""

    name = "Order"

    @step
    async def price(self, ctx, n):
        return n * 10

    charge = subflow(Payment, retry=RetryPolicy(max_attempts=1))

    @wait_for(timeout=600)
    async def approved(self, ctx, receipt):
        if not ctx.state.get("approved"):
            return NOT_YET
        return f"{receipt}, approved"

    @rpc
    async def approve(self, ctx):
        ctx.state["approved"] = True


REGISTRY = Registry([Order, Payment], allow_async_handlers=True)


async def test_a_subflow_and_a_wait_for_run_on_a_real_worker_holding_no_slot_while_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One Step slot (one more reserved for RPCs): the child's Step can only run because the
    # parent's SubFlow step holds no slot; the WaitFor holds none between its checks.
    pull = PullWorkerOptions(max_concurrent_tasks=2, reserved_rpc_tasks=1)
    async with matching_server() as address, trio.open_nursery() as nursery:
        worker = TrioWorker(REGISTRY, None, WorkerOptions(server_address=address, pull=pull))
        nursery.start_soon(worker.start)
        async with TrioClient(REGISTRY, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                flow_id = await client.start_flow(Order, 3, flow_id="o")
                while not (await client.describe_flow(flow_id)).checks:
                    await trio.sleep(0.01)
                await until(lambda: worker.statistics().busy == 0)
                waiting = await client.describe_flow(flow_id)
                await client.call_rpc(flow_id, "approve")
                assert await client.result(flow_id) == "paid 30, approved"
                done = await client.describe_flow(flow_id)
        await worker.close()
    assert waiting.status is FlowStatus.RUNNING and waiting.step_index == 2
    assert [(c["flow_id"], c["flow_type"], c["status"]) for c in waiting.children] == [
        ("o/1/charge/1", "Payment", "completed")
    ]
    assert [(c["step"], c["attempt"], c["not_yet"]) for c in waiting.checks] == [("approved", 1, 1)]
    assert [(a["step"], a["status"]) for a in done.attempts] == [
        ("price", "completed"),
        ("charge", "completed"),
        ("approved", "completed"),
    ]
    assert [c["not_yet"] for c in done.checks] == [1]


STARTED: dict[str, trio.Event] = {}
STOPPED: list[str] = []


class Forever(Flow):
    name = "Forever"

    @step
    async def run(self, ctx, key):
        STARTED[key].set()
        try:
            await trio.sleep_forever()
        finally:
            STOPPED.append(key)


class Wrapper(Flow):
    name = "Wrapper"

    inner = subflow(Forever)


async def test_cancelling_a_flow_cancels_its_childs_running_step_on_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    STARTED["k"] = trio.Event()
    registry = Registry([Wrapper, Forever], allow_async_handlers=True)
    async with matching_server() as address, trio.open_nursery() as nursery:
        worker = TrioWorker(registry, None, WorkerOptions(server_address=address))
        nursery.start_soon(worker.start)
        async with TrioClient(registry, None, ClientOptions(server_address=address)) as client:
            with trio.fail_after(BOUND):
                await worker.wait_pull_registered()
                await client.start_flow(Wrapper, "k", flow_id="w")
                await STARTED["k"].wait()
                await client.cancel_flow("w")
                await until(lambda: STOPPED == ["k"])  # the handler was cancelled
                await until(lambda: worker.statistics().busy == 0)
                child = await client.describe_flow("w/0/inner/1")
                with pytest.raises(Cancelled):
                    await client.result("w")
        await worker.close()
    assert child.status is FlowStatus.CANCELLED
