"""``SqliteStore``'s versioned schema (``schema_migrations``, as Django's and Alembic's
migrations). What it shares with PostgreSQL (rows, applying a ``WriteBatch``) is in
``_store_sql``.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

#: The pending steps' columns and key (version 1's table, and version 3's keyed by it alone).
_PENDING = """(
                flow_id TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
                step_index INTEGER NOT NULL,
                step TEXT NOT NULL,
                execution_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                lease_owner TEXT,
                lease_expires REAL,
                not_before REAL NOT NULL,
                PRIMARY KEY (flow_id, step_index)
            )"""

#: ``(version, statements)``, applied in order, each version in one transaction.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE flows (
                seq INTEGER PRIMARY KEY,
                flow_id TEXT NOT NULL UNIQUE,
                flow_type TEXT NOT NULL,
                status TEXT NOT NULL,
                args BLOB NOT NULL,
                state BLOB NOT NULL,
                step_index INTEGER NOT NULL,
                step_input BLOB NOT NULL,
                result BLOB NOT NULL,
                error BLOB NOT NULL,
                sticky_worker TEXT,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL,
                version INTEGER NOT NULL,
                definition BLOB NOT NULL
            )""",
            "CREATE INDEX flows_by_created ON flows (created_at, seq)",
            "CREATE INDEX flows_by_type ON flows (flow_type, created_at, seq)",
            "CREATE INDEX flows_by_status ON flows (status, created_at, seq)",
            "CREATE INDEX flows_by_type_status ON flows (flow_type, status, created_at, seq)",
            """CREATE TABLE attempts (
                seq INTEGER PRIMARY KEY,
                flow_id TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
                step_index INTEGER NOT NULL,
                step TEXT NOT NULL,
                execution_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                delivery INTEGER NOT NULL,
                worker_id TEXT,
                status TEXT NOT NULL,
                error BLOB NOT NULL,
                started_at REAL NOT NULL,
                finished_at REAL NOT NULL
            )""",
            "CREATE INDEX attempts_by_flow ON attempts (flow_id, seq)",
            """CREATE TABLE dispatches (
                seq INTEGER PRIMARY KEY,
                flow_id TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
                delivery INTEGER NOT NULL,
                kind TEXT NOT NULL,
                name TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                queue TEXT NOT NULL,
                reason TEXT NOT NULL,
                worker_id TEXT,
                at REAL NOT NULL
            )""",
            "CREATE INDEX dispatches_by_flow ON dispatches (flow_id, seq)",
            "CREATE TABLE pending " + _PENDING,
            "CREATE INDEX pending_by_due ON pending (not_before, flow_id, step_index)",
            "CREATE INDEX pending_by_owner ON pending (lease_owner)",
        ),
    ),
    (
        2,
        (
            # The matching servers sharing the database (``_store_servers``, ``_cluster``):
            # each registers its row at start, beats it every second, removes it on a clean
            # stop; ``addresses`` is the CBOR list of its node's distribution listen addresses.
            """CREATE TABLE servers (
                server_id TEXT PRIMARY KEY,
                node TEXT,
                addresses BLOB NOT NULL,
                started_at REAL NOT NULL,
                heartbeat_at REAL NOT NULL
            )""",
            "CREATE INDEX servers_by_heartbeat ON servers (heartbeat_at)",
        ),
    ),
    (
        3,
        (
            # Fewer B-trees a Step writes (ARCHITECTURE.md, "Durability and delivery"): a
            # flow's start wrote six for its flow and three for its pending step, its end
            # three and three. ``list_flows`` without a status reads the flow indexes that
            # remain a status at a time (``_store_sql.list_flows_sql``: a merge of four
            # index ranges of ``limit`` rows each).
            "DROP INDEX flows_by_created",
            "DROP INDEX flows_by_type",
            # Keyed by ``(flow_id, step_index)`` alone: no rowid B-tree beside the key's
            # index (a put and a delete write one B-tree less; its rows are small). Only
            # leased rows in ``pending_by_owner`` (what it serves: renewing, releasing and
            # adopting one owner's leases), not a backlog of free ones.
            "CREATE TABLE pending_keyed " + _PENDING + " WITHOUT ROWID",
            "INSERT INTO pending_keyed SELECT flow_id, step_index, step, execution_id, attempt,"
            " lease_owner, lease_expires, not_before FROM pending",
            "DROP TABLE pending",
            "ALTER TABLE pending_keyed RENAME TO pending",
            "CREATE INDEX pending_by_due ON pending (not_before, flow_id, step_index)",
            "CREATE INDEX pending_by_owner ON pending (lease_owner) WHERE lease_owner IS NOT NULL",
        ),
    ),
)
#: The schema version this code writes and reads.
SCHEMA_VERSION = MIGRATIONS[-1][0]
