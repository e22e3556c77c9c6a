"""Process groups (OTP's pg): join and leave, scope monitors, and groups converging across
nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp

from .peer import COOKIE
from .test_distribution.helpers import B, C, _listening_at


class PgAgent(otp.GenServer):
    """On a peer: makes members join and leave, reads its node's view, and forwards every
    pg scope event to a subscriber."""

    def init(self) -> otp.Ok:
        return otp.Ok({})

    def handle_call(self, request: Any, from_: otp.From, members: dict[Any, otp.Pid]) -> Any:
        match request:
            case ("join", key, group):
                pid = otp.spawn(_pg_member, group)
                members[key] = pid
                return otp.Reply(pid, members)
            case ("exit", key):
                otp.send(members.pop(key), "exit")
                return otp.Reply("ok", members)
            case ("members", group):
                return otp.Reply(sorted(otp.pg.get_members(group), key=repr), members)
            case ("subscribe", to):
                otp.spawn(_pg_forwarder, to)
                return otp.Reply("ok", members)
        return otp.Reply(("unknown", request), members)


async def _pg_member(group: Any) -> None:
    otp.pg.join(group if group != "self-named" else ("owner", otp.self()))
    await otp.receive(lambda m: m == "exit")


async def _pg_forwarder(to: otp.Pid) -> None:
    _, groups = otp.pg.monitor_scope()
    otp.send(to, ("scope", otp.node_name(), "groups", groups))
    while True:
        event = await otp.receive()
        kind = "join" if isinstance(event, otp.pg.PgJoin) else "leave"
        otp.send(to, ("scope", otp.node_name(), kind, event.group, list(event.pids)))


async def _with_agent() -> None:
    await PgAgent.start(name="pg_agent")


async def _with_agent_and_a_member() -> None:
    await PgAgent.start(name="pg_agent")
    await otp.call("pg_agent", ("join", "early", "svc"))


async def _agent(node: str, *request: Any) -> Any:
    return await otp.call(("pg_agent", node), request, timeout=5)


async def _scope_event(node: str, kind: str, pid: otp.Pid) -> tuple[Any, ...]:
    """The next event forwarded from ``node``'s scope monitor of ``kind`` naming ``pid``."""
    with trio.fail_after(5):
        event: tuple[Any, ...] = await otp.receive(
            lambda m: isinstance(m, tuple) and m[:3] == ("scope", node, kind) and pid in m[4]
        )
    return event


async def _scope_sees(node: str, *pids: otp.Pid) -> None:
    """Wait until ``node``'s scope monitor showed every one of ``pids`` as a member (in its
    first snapshot of the groups, or in joins)."""
    missing = set(pids)
    with trio.fail_after(5):
        while missing:
            event = await otp.receive(
                lambda m: (
                    isinstance(m, tuple) and m[:2] == ("scope", node) and m[2] in ("groups", "join")
                )
            )
            if event[2] == "groups":
                missing.difference_update(p for members in event[3].values() for p in members)
            else:
                missing.difference_update(event[4])


async def test_pg_join_and_leave_of_several_pids_and_of_a_pid_not_joined() -> None:
    async with otp.open_node():

        async def idle() -> None:
            await otp.receive()

        p, q, r = otp.spawn(idle), otp.spawn(idle), otp.spawn(idle)
        ref, _ = otp.pg.monitor("g")
        otp.pg.join("g", [p, q, p])
        assert await otp.receive(otp.pg.PgJoin) == otp.pg.PgJoin(ref, "g", (p, q, p))
        assert sorted(otp.pg.get_members("g"), key=repr) == sorted([p, p, q], key=repr)
        assert otp.pg.leave("g", r) is False  # pg: not_joined
        assert otp.pg.leave("other", p) is False
        assert await otp.receive(otp.pg.PgLeave, timeout=0, default=None) is None
        assert otp.pg.leave("g", [p, r]) is True  # one membership of p; r ignored
        assert await otp.receive(otp.pg.PgLeave) == otp.pg.PgLeave(ref, "g", (p,))
        assert sorted(otp.pg.get_members("g"), key=repr) == sorted([p, q], key=repr)
        otp.exit(p, otp.KILL)
        assert await otp.receive(otp.pg.PgLeave) == otp.pg.PgLeave(ref, "g", (p,))
        assert otp.pg.get_members("g") == [q]
        with pytest.raises(otp.BadArg):
            otp.pg.join("g", otp.Pid._make("ghost@localhost", 1, 1))
        assert otp.pg.get_members("g") == [q]


async def test_pg_converges_across_three_nodes_with_a_late_joiner_and_a_node_that_dies(
    tmp_path: Path,
) -> None:
    from test_otp.peer import PeerNode

    b_addr, c_addr = f"unix:{tmp_path}/b.sock", f"unix:{tmp_path}/c.sock"
    c_node = PeerNode(C, c_addr, cookie=COOKIE, setup=_with_agent_and_a_member)
    async with PeerNode(B, b_addr, cookie=COOKIE, setup=_with_agent), c_node:
        async with otp.open_node("a@localhost"):
            await _listening_at(f"unix:{tmp_path}/a.sock")
            ref, _ = otp.pg.monitor_scope()
            otp.pg.join("svc")
            me = otp.self()
            assert await otp.connect(B, b_addr)
            await _agent(B, "subscribe", me)
            b1 = await _agent(B, "join", "b1", "svc")
            await _scope_event(B, "join", b1)
            with trio.fail_after(5):
                await otp.receive(lambda m: isinstance(m, otp.pg.PgJoin) and b1 in m.pids)
            # c already has a member when it connects; it joins a, and b learns of c only
            # through the mesh.
            assert await otp.connect(C, c_addr)
            [c1] = [p for p in await _agent(C, "members", "svc") if p.node == C]
            await _agent(C, "subscribe", me)
            with trio.fail_after(5):
                await otp.receive(
                    lambda m: isinstance(m, otp.pg.PgJoin) and m.ref == ref and c1 in m.pids
                )
            await _scope_sees(B, c1)
            await _scope_sees(C, b1, me)
            everyone = sorted([me, b1, c1], key=repr)
            assert sorted(otp.pg.get_members("svc"), key=repr) == everyone
            assert await _agent(B, "members", "svc") == everyone
            assert await _agent(C, "members", "svc") == everyone
            # A member leaves by exiting: gone everywhere.
            await _agent(B, "exit", "b1")
            with trio.fail_after(5):
                leave = await otp.receive(lambda m: isinstance(m, otp.pg.PgLeave))
            assert leave == otp.pg.PgLeave(ref, "svc", (b1,))
            await _scope_event(C, "leave", b1)
            assert await _agent(C, "members", "svc") == sorted([me, c1], key=repr)
            # c dies: its member is removed on a and on b.
            c_node.stop()
            with trio.fail_after(5):
                leave = await otp.receive(lambda m: isinstance(m, otp.pg.PgLeave))
            assert leave == otp.pg.PgLeave(ref, "svc", (c1,))
            await _scope_event(B, "leave", c1)
            assert otp.pg.get_members("svc") == [me]
            assert await _agent(B, "members", "svc") == [me]


async def test_pg_a_group_named_by_a_term_holding_a_pid_is_one_group_on_every_node(
    tmp_path: Path,
) -> None:
    from test_otp.peer import PeerNode

    b_addr = f"unix:{tmp_path}/b.sock"
    async with PeerNode(B, b_addr, cookie=COOKIE, setup=_with_agent):
        async with otp.open_node("a@localhost"):
            await _listening_at(f"unix:{tmp_path}/a.sock")
            assert await otp.connect(B, b_addr)
            ref, _ = otp.pg.monitor_scope()
            member = await _agent(B, "join", "m", "self-named")
            with trio.fail_after(5):
                join = await otp.receive(otp.pg.PgJoin)
            assert join == otp.pg.PgJoin(ref, ("owner", member), (member,))
            assert otp.pg.get_members(("owner", member)) == [member]
