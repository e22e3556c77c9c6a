"""Forwarding calls for flows another server owns (``_engine_forward``), on one node: which
lease makes a flow another's, the engine answering a forwarded request for a flow it does not
own with ``not_owner`` (never forwarding it again, never taking the flow), and a call for a flow
whose owner cannot be reached ending in a retryable ``unavailable`` within its bounds (at once
on a server that is not distributed), and an owner answering ``not_owner`` re-resolved (two
real servers: ``test_cluster_forwarding.py``); the SubFlow notices (``child_ended``,
``cancel_child``) answered the same, and one that reaches no owner within the patience logged
(SubFlows across servers: ``test_cluster_subflows.py``)."""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import pytest
import trio
from test_otp.peer import COOKIE

import otp
from apps.matching._cluster import CLUSTER, Cluster, ClusterOptions
from apps.matching._engine import ENGINE, FlowEngine
from apps.matching._engine_family import PARENT_KEY
from apps.matching._engine_forward import (
    FORWARDED,
    MAX_OWNERS,
    OWNER_TTL,
    ForwardOptions,
    is_not_owner,
    known_owner,
    lease_owner,
    remember_owner,
)
from apps.matching._errors import Unavailable
from apps.matching._store import FlowRecord, PendingStep, StoreServer, WriteBatch

from ._stores import StoreKind
from .test_engine import definition, server, step

ME, OTHER = "me@host", "other@host"


def _row(owner: str | None, expires: float | None) -> PendingStep:
    return PendingStep("f1", 0, "a", "f1/0/a", 1, owner, expires)


def test_only_another_servers_unexpired_lease_makes_a_flow_someone_elses() -> None:
    assert lease_owner([_row(OTHER, 110.0)], ME, 100.0) == OTHER
    assert lease_owner([_row(OTHER, 100.0)], ME, 100.0) is None  # expired
    assert lease_owner([_row(ME, 110.0)], ME, 100.0) is None  # ours
    assert lease_owner([_row(None, None)], ME, 100.0) is None  # free
    assert lease_owner([], ME, 100.0) is None  # (ended: no pending row)


def test_forward_options_refuse_a_patience_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match=r"ForwardOptions\.patience must be a number of seconds"):
        ForwardOptions(patience=0)


async def _owned_by_other(flow_id: str, lease: float = 600.0) -> None:
    """A running flow stored (after the engine started, so it never held it) whose pending row
    ``OTHER`` leases."""
    now = time.time()
    record = FlowRecord(
        flow_id, "t", "running", [1], {}, 0, [1], None, None, None, now, now, 1,
        definition(step("a")),
    )  # fmt: skip
    pending = PendingStep(flow_id, 0, "a", f"{flow_id}/0/a", 1, OTHER, now + lease)
    await StoreServer.commit(WriteBatch(flows_created=[record], pending_put=[pending]))


async def _with_cluster(store_kind: StoreKind, **forward: Any) -> Any:
    await Cluster.start_link(ClusterOptions(ME, shared=False), name=CLUSTER)
    return server(store_kind, server_id=ME, forward=ForwardOptions(**forward))


async def test_a_forwarded_request_for_a_flow_another_server_owns_is_answered_not_owner(
    store_kind: StoreKind,
    autojump_clock: Any,
) -> None:
    async with otp.open_node(), await _with_cluster(store_kind):
        await _owned_by_other("f1")
        requests = [
            ("result", "f1", None),
            ("call_rpc", "f1", "r", [], None),
            ("cancel", "f1"),
            ("child_ended", "f1"),  # (the SubFlow notices: "f1" as a parent, as a child)
            ("cancel_child", "f1", "p"),
        ]
        for request in requests:
            reply = await otp.call(ENGINE, (FORWARDED, request), 5.0)
            assert is_not_owner(reply)
            said = f"server {ME} does not own flow 'f1' (server {OTHER} holds its lease)"
            assert reply[2] == said
        statistics = await FlowEngine.statistics()
        assert statistics.flows_resident == 0  # it did not take the flow over


async def _distributed(tmp_path: Path) -> None:
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",)))


async def test_a_result_for_a_flow_whose_owner_is_unreachable_is_unavailable_at_its_timeout(
    store_kind: StoreKind, autojump_clock: Any, tmp_path: Path
) -> None:
    async with otp.open_node("a@localhost"), await _with_cluster(store_kind):
        await _distributed(tmp_path)
        await _owned_by_other("f1")
        started = trio.current_time()
        with pytest.raises(Unavailable) as info:
            await FlowEngine.result("f1", timeout=3.0)
        assert 2.0 <= trio.current_time() - started <= 3.0
        assert info.value.retryable
        assert info.value.message == (
            "flow 'f1' is owned by another matching server and the call could not reach it: its"
            f" owner, server {OTHER}, is not reachable; retry it (once the owner's lease expires"
            " another server takes the flow over)"
        )
        assert info.value.details == {"flow_id": "f1", "owner": OTHER}


async def test_a_call_without_a_timeout_is_re_resolved_for_at_most_the_patience(
    store_kind: StoreKind, autojump_clock: Any, tmp_path: Path
) -> None:
    async with otp.open_node("a@localhost"), await _with_cluster(store_kind, patience=5.0):
        await _distributed(tmp_path)
        await _owned_by_other("f1")
        started = trio.current_time()
        with pytest.raises(Unavailable, match="could not reach it"):
            await FlowEngine.call_rpc("f1", "r")
        assert 4.0 <= trio.current_time() - started <= 5.0


async def test_a_child_ended_notice_that_reaches_no_owner_within_the_patience_is_logged(
    store_kind: StoreKind,
    autojump_clock: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A child ends here whose parent another server holds, unreachable: the ``child_ended``
    notice is re-resolved for the patience, then given up with one line (the parent's next
    owner finds the ended child in the store when it takes the parent)."""
    async with otp.open_node("a@localhost"), await _with_cluster(store_kind, patience=5.0):
        await _distributed(tmp_path)
        await _owned_by_other("p")
        now = time.time()
        link = {"flow_id": "p", "step_index": 0, "step": "a", "attempt": 1}
        child = FlowRecord(
            "p/0/a/1", "t", "running", [1], {}, 0, [1], None, None, None, now, now, 1,
            {**definition(step("a")), PARENT_KEY: link},
        )  # fmt: skip
        pending = PendingStep("p/0/a/1", 0, "a", "p/0/a/1/0/a", 1, None, None)
        await StoreServer.commit(WriteBatch(flows_created=[child], pending_put=[pending]))
        await FlowEngine.result("p/0/a/1", timeout=5.0)  # this server takes the child, ends it
        await trio.sleep(4.0)
        assert not [r for r in caplog.records if "notice" in r.getMessage()]
        await trio.sleep(2.0)
    [line] = [r.getMessage() for r in caplog.records if "notice" in r.getMessage()]
    assert line.startswith(
        "matching engine: the 'child_ended' notice about flow 'p' reached no server that holds"
        " it (flow 'p' is owned by another matching server and the call could not reach it:"
        f" its owner, server {OTHER}, is not reachable;"
    )
    assert line.endswith(
        "the flow's next owner finds what it says in the store when it takes the flow"
    )


async def test_a_server_that_is_not_distributed_answers_unavailable_at_once(
    store_kind: StoreKind,
    autojump_clock: Any,
) -> None:
    async with otp.open_node(), await _with_cluster(store_kind):
        await _owned_by_other("f1")
        started = trio.current_time()
        with pytest.raises(Unavailable) as info:
            await FlowEngine.cancel("f1")
        assert trio.current_time() - started < 0.1
        assert info.value.retryable
        assert f"its owner is server {OTHER}, and this server is not distributed" in str(info.value)


async def test_forwarded_requests_for_a_flow_this_server_holds_are_served_here(
    store_kind: StoreKind,
    autojump_clock: Any,
) -> None:
    async with otp.open_node(), await _with_cluster(store_kind):
        flow_id = await FlowEngine.start_flow("t", [1], definition(step("a"), rpcs=["r"]))
        assert await FlowEngine.result(flow_id, timeout=5.0) == [1]
        reply = await otp.call(ENGINE, (FORWARDED, ("result", flow_id, None)), 5.0)
        assert reply == ("ok", [1])


class _Everywhere(otp.GenServer):
    """A cluster that places every server on this node: a forwarded call reaches this node's
    own engine, which answers ``not_owner`` for a flow another server leases."""

    def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        return otp.Reply(otp.node_name(), state)


async def test_an_owner_answering_not_owner_is_re_resolved_until_the_flow_is_free(
    store_kind: StoreKind, autojump_clock: Any, tmp_path: Path
) -> None:
    async with (
        otp.open_node("a@localhost"),
        server(store_kind, server_id=ME, forward=ForwardOptions()),
    ):
        await _distributed(tmp_path)
        await _Everywhere.start_link(name=CLUSTER)
        await _owned_by_other("f1")
        answers: list[Any] = []

        async def wait_result() -> None:
            answers.append(await FlowEngine.result("f1", timeout=30.0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_result)
            await trio.sleep(2.0)  # "other" keeps answering not_owner meanwhile
            assert answers == []
            free = PendingStep("f1", 0, "a", "f1/0/a", 1, None, None)
            await StoreServer.commit(WriteBatch(pending_put=[free]))  # (its lease released)
        assert answers == [[1]]  # re-resolved to this server, which took the flow and ran it


async def test_an_owner_found_in_the_store_is_trusted_for_a_while_and_a_bounded_number(
    autojump_clock: Any,
) -> None:
    state = types.SimpleNamespace(
        owners={}, options=types.SimpleNamespace(forward=ForwardOptions())
    )
    remember_owner(state, "f1", OTHER)  # type: ignore[arg-type]
    assert known_owner(state, "f1") == OTHER  # type: ignore[arg-type]
    await trio.sleep(OWNER_TTL + 0.1)
    assert known_owner(state, "f1") is None  # type: ignore[arg-type]
    assert state.owners == {}
    for i in range(MAX_OWNERS + 1):
        remember_owner(state, f"f{i}", OTHER)  # type: ignore[arg-type]
    assert len(state.owners) == MAX_OWNERS and "f0" not in state.owners  # the oldest went
