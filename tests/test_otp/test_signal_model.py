"""A random graph of processes with links, monitors and trap_exit flags, killed at random (by the
driver's exit signals, by exit/1 and by exit(self(), reason)), checked against a pure model of
OTP's signal rules (OTP_SEMANTICS.md sections 1 and 2)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otp

REASONS = ["normal", "shutdown", otp.Shutdown("x"), "kill", "boom", "crash"]


@attrs.define
class Model:
    """What OTP says happens: who is dead with which reason, and what each survivor received."""

    traps: list[bool]
    links: set[frozenset[int]]
    monitors: list[tuple[int, int]]
    dead: dict[int, Any] = attrs.Factory(dict)
    received: list[Counter[tuple[Any, ...]]] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self.received = [Counter() for _ in self.traps]

    def exit_signal(self, target: int, reason: Any, sender: Any = "driver") -> None:
        if target in self.dead:
            return
        if reason == "kill":
            self.die(target, "killed")
        elif self.traps[target]:
            self.received[target][("exit", sender, reason)] += 1
        elif reason != "normal" or sender == target:
            self.die(target, reason)

    def exit_signal_to_self(self, target: int, reason: Any) -> None:
        """``exit(self(), reason)``: a signal that kills the caller ends it before the call
        returns, so it never runs the line after (which logs "after")."""
        if target in self.dead:
            return
        self.exit_signal(target, reason, sender=target)
        if target not in self.dead:
            self.received[target][("after",)] += 1

    def die(self, proc: int, reason: Any) -> None:
        pending = [(proc, reason)]
        while pending:
            proc, reason = pending.pop(0)
            if proc in self.dead:
                continue
            self.dead[proc] = reason
            for link in [link for link in self.links if proc in link]:
                self.links.discard(link)
                (other,) = link - {proc}
                if other in self.dead or other in [p for p, _ in pending]:
                    continue
                if self.traps[other]:
                    self.received[other][("exit", proc, reason)] += 1
                elif reason != "normal":
                    pending.append((other, reason))
            for watcher, target in self.monitors:
                # A watcher that is itself about to die may still read this DOWN first: deaths
                # unwind concurrently, so for dead processes only "at most this" is checked.
                if target == proc and watcher not in self.dead:
                    self.received[watcher][("down", proc, reason)] += 1


def _observed_reason(reason: Any) -> Any:
    return "crash" if isinstance(reason, otp.Crash) else reason


async def _member(
    index: int, trap: bool, log: list[Counter[tuple[Any, ...]]], pids: dict[Any, Any]
):
    otp.process_flag(trap_exit=trap)
    while True:
        message = await otp.receive()
        if isinstance(message, otp.Exit):
            log[index][("exit", pids[message.pid], _observed_reason(message.reason))] += 1
        elif isinstance(message, otp.Down):
            log[index][("down", pids[message.pid], _observed_reason(message.reason))] += 1
        elif message[0] == "link":
            otp.link(message[1])
        elif message[0] == "monitor":
            otp.monitor(message[1])
        elif message[0] == "exit_self":
            if message[1] == "crash":
                raise RuntimeError("crash")
            otp.exit_self(message[1])
        elif message[0] == "signal_self":
            otp.exit(otp.self(), message[1])
            log[index][("after",)] += 1


graphs = st.integers(min_value=2, max_value=7).flatmap(
    lambda n: st.tuples(
        st.lists(st.booleans(), min_size=n, max_size=n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n),
        st.lists(
            st.tuples(
                st.integers(0, n - 1),
                st.sampled_from(REASONS),
                st.sampled_from(["signal", "self", "signal_self"]),
            ),
            min_size=1,
            max_size=n + 2,
        ),
    )
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs)
def test_random_process_graph_matches_the_signal_model(graph: Any) -> None:
    traps, link_pairs, monitor_pairs, events = graph
    links = {frozenset(pair) for pair in link_pairs if pair[0] != pair[1]}
    model = Model(traps=traps, links=set(links), monitors=list(monitor_pairs))

    async def scenario() -> None:
        async with otp.open_node():
            driver = otp.self()
            log: list[Counter[tuple[Any, ...]]] = [Counter() for _ in traps]
            pids: dict[Any, Any] = {driver: "driver"}
            members = [otp.spawn(_member, i, trap, log, pids) for i, trap in enumerate(traps)]
            pids.update({pid: i for i, pid in enumerate(members)})
            exit_reasons: dict[Any, Any] = {}
            for pid in members:
                otp.monitor(pid)
            for link in links:
                a, b = sorted(link)
                otp.send(members[a], ("link", members[b]))
            for watcher, target in monitor_pairs:
                otp.send(members[watcher], ("monitor", members[target]))
            await trio.testing.wait_all_tasks_blocked()
            for target, reason, mode in events:
                if mode == "signal":
                    otp.exit(members[target], reason if reason != "crash" else "boom")
                    model.exit_signal(target, reason if reason != "crash" else "boom")
                elif mode == "signal_self":
                    signal = reason if reason != "crash" else "boom"
                    otp.send(members[target], ("signal_self", signal))
                    model.exit_signal_to_self(target, signal)
                else:
                    otp.send(members[target], ("exit_self", reason))
                    if target not in model.dead:
                        model.die(target, reason)
                await trio.testing.wait_all_tasks_blocked()
                while (down := await otp.receive(otp.Down, timeout=0, default=None)) is not None:
                    exit_reasons[down.pid] = down.reason
                alive = {i for i, pid in enumerate(members) if otp.process_info(pid) is not None}
                assert alive == set(range(len(traps))) - set(model.dead)
            for i in range(len(traps)):
                if i in model.dead:
                    # It may have died before reading all that was delivered to it.
                    assert not log[i] - model.received[i], f"process {i}"
                else:
                    assert log[i] == model.received[i], f"process {i}"
            for i, pid in enumerate(members):
                if i in model.dead:
                    assert _observed_reason(exit_reasons[pid]) == model.dead[i], f"process {i}"

    trio.run(scenario)
