"""The ``matching_cluster`` GenServer: this matching server among the others sharing its
database (MULTISERVER.md, part B).

It registers this server in the store's ``servers`` table at start (``_store_servers``), beats
its row every ``heartbeat`` seconds, keeps the list of live servers (a heartbeat within
``live_timeout``), deletes the rows of servers silent for over ``forget_after`` (they died:
a clean stop removes its own row), and, when the node is distributed, connects to every live
peer's node at the distribution listen addresses the peer recorded, so a call for a flow
another server owns is one round trip on an open connection (``_engine_forward``). A clean
stop removes the row.

The database is the source of truth for who is live; the distribution for who is reachable:
:meth:`Cluster.owner_node` names a server's node only while its row is live *and* this node is
connected to it (a node that went down is out at once, not after its heartbeat ages).

The beats and reads run in a helper process linked to the server, one beat at a time, and the
connects in another (so a peer slow to answer never delays the heartbeat): the server answers
``owner_node``/``live`` at once whatever the database or a dead peer's address costs. On a store
that cannot be shared (SQLite: one server per file) the cluster is inert: no row, no timer, no
warning, and every server is "not reachable".
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import trio

import otp

from ._errors import ConfigurationError, MatchingError
from ._store import DEFAULT_TIMEOUT, SERVER_NAME, ServerRecord, StoreServer

__all__ = ["CLUSTER", "Cluster", "ClusterOptions"]

logger = logging.getLogger("apps.matching")

#: The cluster's registered name.
CLUSTER = "matching_cluster"
#: How long one connect to a peer's node may take before the beat goes on without it.
_CONNECT_TIMEOUT = 5.0


def _seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not 0 < value < 86400:
        raise ConfigurationError(
            f"ClusterOptions.{attribute.name} must be a number of seconds > 0 (got {value!r})"
        )


@attrs.frozen
class ClusterOptions:
    """How the cluster process runs.

    Attributes:
        server_id: This server's id (``_server_id.server_id()``; the engine's leases' owner).
        store: The ``StoreServer`` (pid or registered name).
        shared: Whether the store may be shared with other servers (PostgreSQL); False makes
            the cluster inert.
        heartbeat: Seconds between beats.
        live_timeout: A server whose last beat is older than this is not live.
        forget_after: The row of a server whose last beat is older than this is deleted by
            the next beat of any live server (it died without a clean stop long ago: its
            leases expired and its flows were taken over within a lease).
    """

    server_id: str
    store: Any = SERVER_NAME
    shared: bool = True
    heartbeat: float = attrs.field(default=1.0, validator=_seconds)
    live_timeout: float = attrs.field(default=5.0, validator=_seconds)
    forget_after: float = attrs.field(default=3600.0, validator=_seconds)


@attrs.frozen
class _Tick:
    """Time for the next beat."""


@attrs.frozen(eq=False)
class _Beaten:
    """A beat's outcome: the live servers."""

    live: list[ServerRecord]


@attrs.frozen(eq=False)
class _Connected:
    """The connects' outcome: why those that failed failed, by server id."""

    unreachable: dict[str, str]


@attrs.frozen
class _BeatFailed:
    message: str


@attrs.define
class _State:
    options: ClusterOptions
    record: ServerRecord | None = None
    live: dict[str, ServerRecord] = attrs.field(factory=dict)
    #: The beat's helper, and the connects' (apart: a peer slow to answer a connect must not
    #: delay the heartbeat past ``live_timeout``).
    helper: otp.Pid | None = None
    connector: otp.Pid | None = None
    #: The failure of the last beat (logged once per streak of failures).
    failing: str | None = None
    #: The peers the last beats could not connect to (logged once each, until reached).
    unreachable: set[str] = attrs.field(factory=set)


class Cluster(otp.GenServer):
    """``matching_cluster``: start it with ``Cluster.start_link(ClusterOptions(...),
    name=CLUSTER)`` after the ``StoreServer`` (its ``init`` registers the server)."""

    # ======================================== client side ====================================

    @staticmethod
    async def owner_node(
        server_id: str, *, server: Any = CLUSTER, timeout: float | None = DEFAULT_TIMEOUT
    ) -> str | None:
        """The node of the live server ``server_id``, if this node is connected to it; None if
        it is this server, not live, not distributed, or not reachable now."""
        return await otp.call(server, ("owner_node", server_id), timeout)

    @staticmethod
    async def live(
        *, server: Any = CLUSTER, timeout: float | None = DEFAULT_TIMEOUT
    ) -> list[ServerRecord]:
        """The live servers as of the last beat (this one included), by id; [] when inert."""
        return await otp.call(server, ("live",), timeout)

    # ======================================== callbacks ======================================

    async def init(self, options: ClusterOptions) -> otp.Ok:
        state = _State(options)
        if not options.shared:
            return otp.Ok(state)
        otp.process_flag(trap_exit=True)  # (so a clean stop runs terminate, removing the row)
        node, addresses = _distribution()
        now = time.time()
        state.record = ServerRecord(options.server_id, node, addresses, now, now)
        await StoreServer.register_server(state.record, server=options.store)
        live = await StoreServer.servers(now, options.live_timeout, server=options.store)
        state.live = {r.server_id: r for r in live}
        others = sorted(r.server_id for r in live if r.server_id != options.server_id)
        if node is None and others:
            logger.warning(
                "matching cluster: this node is not distributed, but %d other matching"
                " server(s) use the same database (%s): calls for flows they own will answer"
                " 'unavailable'; start every server with --name NAME@HOST --listen ADDRESS"
                " --cookie-file PATH",
                len(others),
                ", ".join(others),
            )
        self._beat(state)  # (connects to the peers at once)
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case ("owner_node", str(sid)):
                return otp.Reply(_owner_node(state, sid), state)
            case ("live",):
                return otp.Reply(sorted(state.live.values(), key=_by_id), state)
        logger.warning("matching cluster: unknown request %r", request)
        return otp.Reply(None, state)

    def handle_info(self, message: Any, state: _State) -> Any:
        match message:
            case _Tick():
                self._beat(state)
            case _Beaten(live=live):
                state.live = {r.server_id: r for r in live}
                if state.failing is not None:
                    logger.info("matching cluster: the heartbeat works again")
                    state.failing = None
                self._connect(state)
            case _Connected(unreachable=unreachable):
                for sid, why in unreachable.items():
                    if sid not in state.unreachable:
                        logger.warning(
                            "matching cluster: cannot connect to server %s (%s); calls for"
                            " its flows wait for it or answer 'unavailable'",
                            sid,
                            why,
                        )
                state.unreachable = set(unreachable)
            case _BeatFailed(message=text):
                if state.failing is None:
                    logger.warning("matching cluster: the heartbeat failed: %s", text)
                state.failing = text
            case otp.Exit(pid=pid, reason=reason) if pid == state.helper:
                state.helper = None
                _log_crash("heartbeat", reason)
                otp.send_after(state.options.heartbeat, otp.self(), _Tick())
            case otp.Exit(pid=pid, reason=reason) if pid == state.connector:
                state.connector = None
                _log_crash("connecting", reason)
            case otp.Exit(reason=reason):
                return otp.Stop(reason, state)  # (trapping: our supervisor or a link ends us)
        return otp.NoReply(state)

    async def terminate(self, reason: Any, state: _State) -> None:
        for helper in (state.helper, state.connector):
            if helper is not None:
                otp.exit(helper, otp.KILL)
        if state.record is None:
            return
        try:
            await StoreServer.remove_server(
                state.options.server_id, server=state.options.store, timeout=5.0
            )
        except (MatchingError, otp.OtpError) as exc:  # (it ages out of the live list anyway)
            logger.warning("matching cluster: could not remove this server's row: %s", exc)

    def _beat(self, state: _State) -> None:
        if state.helper is None and state.record is not None:
            state.helper = otp.spawn_link(_beat, state.options, state.record, otp.self())

    def _connect(self, state: _State) -> None:
        """Connect to the live peers' nodes not connected yet (one connecting helper at a
        time)."""
        me = state.record
        if me is None or me.node is None or state.connector is not None:
            return
        connected = set(otp.nodes())
        peers = [
            peer
            for peer in state.live.values()
            if peer.node is not None and peer.node != me.node and peer.node not in connected
        ]
        if peers:
            state.connector = otp.spawn_link(_connect_peers, peers, otp.self())


def _log_crash(helper: str, reason: Any) -> None:
    if otp.is_abnormal(reason):
        logger.warning(
            "matching cluster: the %s helper crashed: %s", helper, otp.format_reason(reason)
        )


def _by_id(record: ServerRecord) -> str:
    return record.server_id


def _owner_node(state: _State, sid: str) -> str | None:
    record = state.live.get(sid)
    if record is None or record.node is None or sid == state.options.server_id:
        return None
    return record.node if record.node in otp.nodes() else None


def _distribution() -> tuple[str | None, tuple[str, ...]]:
    """This node's name and distribution listen addresses, or (None, ()) if not distributed."""
    node = otp.current_node()
    dist = node.distribution
    if dist is None:
        return None, ()
    return node.name, tuple(getattr(dist, "listening", ()))


async def _beat(options: ClusterOptions, record: ServerRecord, cluster: otp.Pid) -> None:
    """One beat (in a helper process): the heartbeat (registering again if the row is gone)
    and the live servers; the outcome goes to ``cluster``."""
    store = options.store
    try:
        now = time.time()
        if not await StoreServer.beat(options.server_id, now, server=store):
            await StoreServer.register_server(attrs.evolve(record, heartbeat_at=now), server=store)
        live = await StoreServer.servers(now, options.live_timeout, server=store)
        # (after this server's own beat: a server paused that long is not forgotten)
        forgotten = await StoreServer.forget_servers(now - options.forget_after, server=store)
    except (MatchingError, otp.OtpError) as exc:
        otp.send(cluster, _BeatFailed(str(exc)))
        return
    if forgotten:
        logger.info(
            "matching cluster: deleted the rows of %d server(s) silent for over %g s",
            forgotten,
            options.forget_after,
        )
    otp.send(cluster, _Beaten(live))


async def _connect_peers(peers: list[ServerRecord], cluster: otp.Pid) -> None:
    """(In a helper process.) Connect to each of ``peers``' nodes; tell ``cluster`` why the
    connects that failed failed."""
    unreachable: dict[str, str] = {}
    for peer in peers:
        why = await _connect(peer)
        if why is not None:
            unreachable[peer.server_id] = why
    otp.send(cluster, _Connected(unreachable))


async def _connect(peer: ServerRecord) -> str | None:
    """Connect to ``peer``'s node at one of its addresses; None once connected, else why not."""
    assert peer.node is not None
    if not peer.addresses:
        return "it recorded no distribution address"
    for address in peer.addresses:
        with trio.move_on_after(_CONNECT_TIMEOUT):
            try:
                if await otp.connect(peer.node, address):
                    return None
            except otp.DistributionError as exc:
                return f"its address {address} is not usable: {exc}"
    return f"no answer at {', '.join(peer.addresses)}"
