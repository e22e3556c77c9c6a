"""Process groups, as Erlang's ``pg``: named groups of processes across connected nodes.

Each node owns the entries of its own processes; joins and leaves are told to every connected
node, a new connection starts with an exchange of each side's local memberships, and a lost one
drops the peer's entries, so the views converge with no cluster-wide lock. A member that exits
leaves all its groups (before its links and monitors fire). Reads (``get_members``) are local.
Processes may subscribe to a group's (or all groups') changes and get :class:`PgJoin` and
:class:`PgLeave` messages.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import attrs

import wire

from ._dist_values import pid_from_wire, value_from_wire, value_to_wire
from ._errors import BadArg
from ._ids import Pid, Ref
from ._node import Node, current_node
from ._process import Process, current_process, current_process_or_none

logger = logging.getLogger("otp.pg")

#: The name pg's messages between nodes are sent to: an atom, where a user's remote send always
#: names a str, so a process a user registers as "pg" (or "$pg") still gets its messages.
PG_NAME = wire.Atom("$pg")


@attrs.frozen
class PgJoin:
    """``pids`` joined ``group`` (a message to subscribers)."""

    ref: Ref
    group: Any
    pids: tuple[Pid, ...]


@attrs.frozen
class PgLeave:
    """``pids`` left ``group`` (a message to subscribers)."""

    ref: Ref
    group: Any
    pids: tuple[Pid, ...]


class GroupState:
    """One node's view of every group: its own members and what peers told it of theirs."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.groups: dict[Any, list[Pid]] = {}
        #: group -> Counter of local pids (a pid may join a group more than once, as in pg).
        self.local: dict[Any, Counter[Pid]] = {}
        self.hooked: set[Pid] = set()
        self.scope_watchers: dict[Ref, Pid] = {}
        self.group_watchers: dict[Ref, tuple[Any, Pid]] = {}
        dist = node.distribution
        if dist is not None:
            self.attach(dist)

    def attach(self, dist: Any) -> None:
        dist.nodeup_hooks.append(self._nodeup)
        dist.nodedown_hooks.append(self._nodedown)

    # -- changes ---------------------------------------------------------------------------

    def _add(self, group: Any, pids: list[Pid]) -> None:
        self.groups.setdefault(group, []).extend(pids)
        self._notify(group, pids, PgJoin)

    def _remove(self, group: Any, pids: list[Pid]) -> None:
        members = self.groups.get(group)
        if members is None:
            return
        if len(pids) == 1:
            removed = []
            if pids[0] in members:
                members.remove(pids[0])
                removed = pids
        else:
            # One pass over the group, not a scan of it per pid (a member that joined n times,
            # or a peer's leave of many): quadratic in a big group.
            wanted = Counter(pids)
            kept = []
            removed = []
            for pid in members:
                if wanted[pid] > 0:
                    wanted[pid] -= 1
                    removed.append(pid)
                else:
                    kept.append(pid)
            members[:] = kept
        if not members:
            del self.groups[group]
        if removed:
            self._notify(group, removed, PgLeave)

    def _drop_peer(self, peer: str) -> None:
        """Forget every member ``peer`` told of (it went down, or its sync replaces them)."""
        for group in list(self.groups):
            members = self.groups[group]
            gone = [pid for pid in members if pid.node == peer]
            if not gone:
                continue
            kept = [pid for pid in members if pid.node != peer]
            if kept:
                self.groups[group] = kept
            else:
                del self.groups[group]
            self._notify(group, gone, PgLeave)

    def _notify(self, group: Any, pids: list[Pid], kind: type[PgJoin] | type[PgLeave]) -> None:
        for ref, watcher in list(self.scope_watchers.items()):
            self._tell(watcher, kind(ref, group, tuple(pids)))
        for ref, (watched, watcher) in list(self.group_watchers.items()):
            if watched == group:
                self._tell(watcher, kind(ref, group, tuple(pids)))

    def _tell(self, pid: Pid, message: Any) -> None:
        proc = self.node.resolve(pid)
        if proc is not None:
            proc.deliver(message)

    def _broadcast(self, verb: str, group: Any, pids: list[Pid]) -> None:
        """Tell every connected node of a join or leave; never raises (the change is made here
        already, and a join checks that its group name can cross under this node's limits)."""
        dist = self.node.distribution
        if dist is None:
            return
        for conn in list(dist.connections.values()):
            if conn.state == "up" and not conn.hidden:  # hidden nodes (observer-remote)
                try:
                    self._send_pieces(conn, verb, group, pids)
                except BadArg as exc:
                    logger.error(
                        "pg: cannot tell node %s of a %s of %r: %s", conn.peer, verb, group, exc
                    )

    def _send_pieces(self, conn: Any, verb: str, group: Any, pids: list[Pid]) -> None:
        """Send ``(verb, group, pids)``, split in halves as often as needed to fit the
        connection's limits: a join or leave must not fail because it is big."""
        try:
            self._send(conn, (verb, group, pids))
        except BadArg as exc:
            if len(pids) < 2 or not isinstance(exc.__cause__, wire.LimitExceeded):
                raise
            half = len(pids) // 2
            self._send_pieces(conn, verb, group, pids[:half])
            self._send_pieces(conn, verb, group, pids[half:])

    def _send(self, conn: Any, message: Any) -> None:
        conn.enqueue(wire.MessageType.REG_SEND, _payload(self.node, message))

    def join(self, group: Any, pids: list[Pid]) -> None:
        """Add local ``pids`` to ``group``: all of them, or (BadArg) none."""
        _check_group("join", group, self.node)
        for pid in pids:
            if self.node.resolve(pid) is None:
                raise BadArg(f"pg.join({group!r}, {pid!r}): only live local processes can join")
        if not pids:
            return
        counts = self.local.setdefault(group, Counter())
        for pid in pids:
            proc = self.node.resolve(pid)
            assert proc is not None
            _watch_exit(proc, self)
            counts[pid] += 1
        self._add(group, pids)
        self._broadcast("join", group, pids)

    def leave(self, group: Any, pids: list[Pid]) -> bool:
        counts = self.local.get(group)
        left = []
        for pid in pids:
            if counts is not None and counts[pid] > 0:
                counts[pid] -= 1
                if counts[pid] == 0:
                    del counts[pid]
                left.append(pid)
        if counts is not None and not counts:
            del self.local[group]
        if not left:
            return False
        self._remove(group, left)
        self._broadcast("leave", group, left)
        return True

    def member_exited(self, proc: Process) -> None:
        """An exit hook: ``proc`` leaves every group and its subscriptions end."""
        pid = proc.pid
        self.hooked.discard(pid)
        left = []
        for group in list(self.local):
            counts = self.local[group]
            times = counts.pop(pid, 0)
            if not counts:
                del self.local[group]
            if times:
                gone = [pid] * times
                self._remove(group, gone)
                left.append((group, gone))
        for ref in [r for r, w in self.scope_watchers.items() if w == pid]:
            del self.scope_watchers[ref]
        for ref in [r for r, (_, w) in self.group_watchers.items() if w == pid]:
            del self.group_watchers[ref]
        for group, gone in left:
            self._broadcast("leave", group, gone)

    # -- peers -----------------------------------------------------------------------------

    def _nodeup(self, peer: str) -> None:
        dist = self.node.distribution
        conn = dist.connections.get(peer) if dist is not None else None
        if conn is None:
            return
        local = {group: list(counts.elements()) for group, counts in self.local.items()}
        try:
            self._send(conn, ("sync", local))
            return
        except BadArg as exc:
            if not isinstance(exc.__cause__, wire.LimitExceeded):
                # Called as the connection comes up, which must not fail for it.
                logger.error("pg: cannot tell node %s this node's groups: %s", peer, exc)
                return
        # Too big for one message: an empty sync (the peer drops what it knew of this node),
        # then the memberships as joins, each in pieces that fit.
        self._send(conn, ("sync", {}))
        for group, pids in local.items():
            try:
                self._send_pieces(conn, "join", group, pids)
            except BadArg as exc:
                # A name joined before distribution started, too big for its limits.
                logger.error("pg: cannot tell node %s of group %r: %s", peer, group, exc)

    def _nodedown(self, peer: str) -> None:
        self._drop_peer(peer)

    def from_peer(self, peer: str, message: Any) -> None:
        """A join, leave or sync from ``peer`` (wire values); other shapes are ignored."""
        node = self.node
        if not (isinstance(message, tuple) and message):
            return
        if message[0] == "sync" and len(message) == 2 and isinstance(message[1], dict):
            self._drop_peer(peer)
            for group, pids in message[1].items():
                members = _peer_pids(node, peer, pids)
                if members:
                    self._add(_group(group, node), members)
        elif message[0] in ("join", "leave") and len(message) == 3:
            members = _peer_pids(node, peer, message[2])
            if members:
                if message[0] == "join":
                    self._add(_group(message[1], node), members)
                else:
                    self._remove(_group(message[1], node), members)


def _check_hashable(call: str, group: Any) -> None:
    try:
        hash(group)
    except TypeError as exc:
        raise BadArg(
            f"pg.{call}({group!r}): a group name must be hashable (got a"
            f" {group.__class__.__qualname__}): use a tuple for a name of several parts"
        ) from exc


def _check_group(call: str, group: Any, node: Node) -> None:
    """Raise BadArg unless ``group`` can cross to other nodes: a join of one pid must fit this
    node's limits in every codec (it crosses at every join, and in the sync of each new
    connection), so a broadcast split down to one pid a message never fails."""
    _check_hashable(call, group)
    dist = node.distribution
    limits = dist.config.limits if dist is not None else wire.Limits()
    # The largest pid of this node: a real one encodes no bigger.
    pid = wire.Pid(node.name, 2**64 - 1, node.creation)
    try:
        payload = {"from": pid, "to": PG_NAME, "msg": ("join", value_to_wire(group), [pid])}
        for codec in wire.Codec:
            wire.encode_message(wire.MessageType.REG_SEND, payload, codec=codec, limits=limits)
    except (BadArg, wire.WireError) as exc:
        raise BadArg(
            f"pg.{call}({group!r}): a group name must be able to cross to other nodes: {exc}"
        ) from exc


def _payload(node: Node, message: Any) -> dict[str, Any]:
    """The REG_SEND payload that takes ``message`` to pg on another node."""
    return {
        "from": wire.Pid(node.name, 0, node.creation),
        "to": PG_NAME,
        "msg": value_to_wire(message),
    }


def _group(value: Any, node: Node) -> Any:
    """A group name from a peer, as this node spells it (a name may be any term: pids in it
    become this node's pids)."""
    value = value_from_wire(value, node)
    return value.name if isinstance(value, wire.Atom) else value


def _peer_pids(node: Node, peer: str, pids: Any) -> list[Pid]:
    if not isinstance(pids, list):
        return []
    # A node speaks only for its own processes.
    return [pid_from_wire(p, node) for p in pids if isinstance(p, wire.Pid) and p.node == peer]


def _watch_exit(proc: Process, state: GroupState) -> None:
    if proc.pid in state.hooked:
        return
    state.hooked.add(proc.pid)

    def left_on_exit(dead: Process, _reason: Any) -> None:
        state.member_exited(dead)

    if proc.exit_hooks is None:
        proc.exit_hooks = [left_on_exit]
    else:
        proc.exit_hooks.append(left_on_exit)


def _state() -> GroupState:
    node = current_node()
    if node.pg is None:
        node.pg = GroupState(node)
    assert isinstance(node.pg, GroupState)
    return node.pg


def _local_pids(call: str, group: Any, pids: Any) -> list[Pid]:
    """``pids`` (a pid, a list or tuple of them, or None for the caller) as a list, or BadArg
    naming the call unless each is a pid of this node (OTP's ``{nolocal, Bad}``)."""
    if pids is None:
        return [current_process().pid]
    listed = [pids] if isinstance(pids, Pid) else pids
    if not isinstance(listed, list | tuple):
        problem = f"got a {pids.__class__.__qualname__}"
    else:
        node = current_node()
        problem = ""
        for pid in listed:
            if not isinstance(pid, Pid):
                problem = f"{pid!r} is a {pid.__class__.__qualname__}"
                break
            if pid.node != node.name:
                problem = f"{pid!r} is a process of node {pid.node!r}"
                break
        else:
            return list(listed)
    raise BadArg(
        f"pg.{call}({group!r}, {pids!r}): expected a pid of this node or a list of them"
        f" ({problem}): a node {call}s only its own processes; look a name up first (whereis)"
    )


def join(group: Any, pids: Pid | list[Pid] | tuple[Pid, ...] | None = None) -> None:
    """Add ``pids`` (default: the caller) to ``group``; a pid may join more than once.

    All of ``pids`` join, or none. A join too big for one message to a connected node goes to
    it in pieces.

    Raises:
        BadArg: ``pids`` is not a pid or a list of pids, a pid is not a live process of this
            node (each node owns its own entries), or ``group`` is not hashable or cannot
            cross to other nodes.
    """
    _state().join(group, _local_pids("join", group, pids))


def leave(group: Any, pids: Pid | list[Pid] | tuple[Pid, ...] | None = None) -> bool:
    """Remove one membership of each of ``pids`` (default: the caller) from ``group``;
    False if none of them was a member.

    Raises:
        BadArg: ``pids`` is not a pid or a list of pids of this node, or ``group`` is not
            hashable (as :func:`join` refuses them).
    """
    pids = _local_pids("leave", group, pids)
    _check_hashable("leave", group)
    return _state().leave(group, pids)


def get_members(group: Any) -> list[Pid]:
    """Every member of ``group`` on every connected node (one entry per join); none for a
    name that cannot be a group (unhashable), as OTP answers ``[]`` for any term."""
    try:
        return list(_state().groups.get(group, ()))
    except TypeError:  # unhashable: never a group
        return []


def get_local_members(group: Any) -> list[Pid]:
    """The members of ``group`` on this node (none for an unhashable name, as
    :func:`get_members`)."""
    try:
        counts = _state().local.get(group)
    except TypeError:  # unhashable: never a group
        return []
    return list(counts.elements()) if counts else []


def which_groups() -> list[Any]:
    """Every group with at least one member anywhere."""
    return list(_state().groups)


def monitor_scope() -> tuple[Ref, dict[Any, list[Pid]]]:
    """Subscribe the caller to every join and leave; returns the ref and the current groups."""
    me = current_process()
    state = _state()
    ref = me.node.make_ref()
    state.scope_watchers[ref] = me.pid
    _watch_exit(me, state)
    return ref, {group: list(pids) for group, pids in state.groups.items()}


def monitor(group: Any) -> tuple[Ref, list[Pid]]:
    """Subscribe the caller to joins and leaves of ``group``; returns the ref and its members."""
    _check_hashable("monitor", group)
    me = current_process()
    state = _state()
    ref = me.node.make_ref()
    state.group_watchers[ref] = (group, me.pid)
    _watch_exit(me, state)
    return ref, list(state.groups.get(group, ()))


def demonitor(ref: Ref) -> bool:
    """Cancel a :func:`monitor_scope` or :func:`monitor` subscription; False if ``ref`` is not
    one. As in OTP's pg, the subscription's :class:`PgJoin` and :class:`PgLeave` already in the
    caller's mailbox are flushed."""
    state = _state()
    found = (
        state.scope_watchers.pop(ref, None) is not None
        or state.group_watchers.pop(ref, None) is not None
    )
    me = current_process_or_none()
    if found and me is not None:
        me.remove_messages(lambda m: m.__class__ in (PgJoin, PgLeave) and m.ref == ref)
    return found
