"""The ``servers`` table: the matching servers sharing one database (``_cluster`` registers,
beats and lists them). Its record, :class:`ServerRecord`, and the SQL both stores run for it
(:class:`SqlServers`, a mixin of ``SqlStore``), apart from the flows' tables and their batches.

A server is live while its ``heartbeat_at`` is recent: the store only compares the times the
caller passes in (wall-clock unix seconds, as the leases), so every server judges liveness by
the same rule, ``heartbeat_at > now - timeout``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

import wire

from ._store_records import StoreError

__all__ = ["MAX_ADDRESSES", "MAX_SERVER_ID_LENGTH", "ServerRecord", "SqlServers"]

#: The longest server id (a node name, or ``host/pid/hex``).
MAX_SERVER_ID_LENGTH = 512
#: The most distribution listen addresses one server records.
MAX_ADDRESSES = 16

_COLUMNS = "server_id, node, addresses, started_at, heartbeat_at"


def _server_id(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value or len(value) > MAX_SERVER_ID_LENGTH:
        raise ValueError(
            f"ServerRecord.{attribute.name} must be a non-empty str of at most"
            f" {MAX_SERVER_ID_LENGTH} characters (got {value!r})"
        )


def _node(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not str or not value):
        raise ValueError(
            f"ServerRecord.node must be a node name or None when not distributed (got {value!r})"
        )


def _addresses(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"ServerRecord.addresses must be a list of str (got {value!r})")
    if len(value) > MAX_ADDRESSES or not all(type(a) is str and a for a in value):
        raise ValueError(
            f"ServerRecord.addresses must be at most {MAX_ADDRESSES} non-empty str (got {value!r})"
        )
    return tuple(value)


def _time(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(
            f"ServerRecord.{attribute.name} must be a finite number of unix seconds (got {value!r})"
        )


@attrs.frozen
class ServerRecord:
    """One matching server sharing the database.

    Attributes:
        server_id: Its id: its node's name when the node is distributed, else
            ``host/pid/random hex`` (``_cluster.server_id``).
        node: Its node's name when the node is distributed, else None (unreachable).
        addresses: Its node's distribution listen addresses (``unix:PATH``,
            ``tcp:HOST:PORT``): where other servers connect to it.
        started_at: When it registered (unix seconds).
        heartbeat_at: Its last heartbeat (unix seconds).
    """

    server_id: str = attrs.field(validator=_server_id)
    node: str | None = attrs.field(validator=_node)
    addresses: tuple[str, ...] = attrs.field(converter=_addresses)
    started_at: float = attrs.field(validator=_time)
    heartbeat_at: float = attrs.field(validator=_time)


def _row(record: ServerRecord) -> tuple[Any, ...]:
    return (
        record.server_id,
        record.node,
        wire.cbor_encode(list(record.addresses)),
        record.started_at,
        record.heartbeat_at,
    )


def _from_row(row: Any) -> ServerRecord:
    return ServerRecord(row[0], row[1], wire.cbor_decode(bytes(row[2])), row[3], row[4])


class SqlServers:
    """The ``servers`` table's operations (a mixin of ``SqlStore``, whose connection, lock and
    transactions they use): each one transaction, or one read."""

    # (provided by SqlStore)
    _run: Any
    _guarded: Any
    _transaction: Any

    async def register_server(self, record: ServerRecord) -> None:
        """Insert ``record``, or replace the row of its ``server_id`` (a server restarted
        under the same node name takes its row back)."""
        if not isinstance(record, ServerRecord):
            raise StoreError(f"register_server takes a ServerRecord (got {record!r})")
        row = _row(record)

        def register(conn: Any) -> None:
            with self._transaction(conn):
                conn.execute(
                    f"INSERT INTO servers ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (server_id) DO UPDATE SET node = excluded.node,"
                    " addresses = excluded.addresses, started_at = excluded.started_at,"
                    " heartbeat_at = excluded.heartbeat_at",
                    row,
                )

        await self._run(self._guarded(register))

    async def beat(self, server_id: str, now: float) -> bool:
        """Set the server's ``heartbeat_at`` to ``now``; False if it has no row (another
        server removed it, or it never registered: register again)."""

        def beat(conn: Any) -> bool:
            with self._transaction(conn):
                cursor = conn.execute(
                    "UPDATE servers SET heartbeat_at = ? WHERE server_id = ?", (now, server_id)
                )
            return bool(cursor.rowcount)

        return bool(await self._run(self._guarded(beat)))

    async def servers(self, now: float, timeout: float) -> list[ServerRecord]:
        """The live servers, those whose heartbeat is later than ``now - timeout``, by id."""

        def read(conn: Any) -> list[ServerRecord]:
            sql = f"SELECT {_COLUMNS} FROM servers WHERE heartbeat_at > ? ORDER BY server_id"
            return [_from_row(row) for row in conn.execute(sql, (now - timeout,))]

        return list(await self._run(self._guarded(read)))

    async def remove_server(self, server_id: str) -> bool:
        """Delete the server's row (a clean stop); False if it had none."""

        def remove(conn: Any) -> bool:
            with self._transaction(conn):
                cursor = conn.execute("DELETE FROM servers WHERE server_id = ?", (server_id,))
            return bool(cursor.rowcount)

        return bool(await self._run(self._guarded(remove)))

    async def forget_servers(self, before: float) -> int:
        """Delete the rows of servers whose last heartbeat is older than ``before`` (servers
        that died without a clean stop, long ago); how many went."""

        def forget(conn: Any) -> int:
            with self._transaction(conn):
                cursor = conn.execute("DELETE FROM servers WHERE heartbeat_at < ?", (before,))
            return int(cursor.rowcount)

        return int(await self._run(self._guarded(forget)))
