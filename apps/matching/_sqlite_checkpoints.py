"""``WalCheckpoints``: a SQLite store's WAL checkpoints, in a thread and on a connection of their
own, off the commit path (as PostgreSQL's checkpointer is a process of its own, not a
backend's commit).

Why: SQLite's own, ``wal_autocheckpoint``, runs inside the COMMIT that takes the WAL past 1,000
pages: it syncs the WAL, copies its pages into the database and syncs that, 10-140 ms on this
machine, and meanwhile no other commit of the server can start (one writer). Under load that
was ~50 commits in 3 s and ~15% of the time (issue 15). A PASSIVE checkpoint on another
connection takes no writer lock: commits go on while it copies.

The WAL starts again from its beginning only at a write transaction that finds every frame
copied, which a checkpoint racing a steady stream of commits never leaves behind (the WAL grew
~25 MB a second under load). So the writer still checkpoints past ``WRITER_CHECKPOINT_PAGES``
(16 MB of WAL), with nothing else writing: it finds little left to copy, and the WAL restarts.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

import trio

__all__ = ["CHECKPOINT_EVERY", "WRITER_CHECKPOINT_PAGES", "WalCheckpoints"]

logger = logging.getLogger("apps.matching")

#: Write transactions between two checkpoints (a Step's commits dirty ~15 pages of WAL: one
#: in 64 keeps it near SQLite's own 1,000 pages).
CHECKPOINT_EVERY = 64
#: The store's own connection's ``wal_autocheckpoint``, in pages (SQLite's default is 1,000).
WRITER_CHECKPOINT_PAGES = 4000


class WalCheckpoints:
    """Checkpoints of the WAL of the database at ``path``, one at a time, each in a thread of
    trio's cache (``start_thread_soon``: no task waits for it), started by :meth:`committed`
    every ``every`` write transactions while none runs. The store's own connection checkpoints
    only past ``WRITER_CHECKPOINT_PAGES`` (``SqliteStore``).

    A checkpoint that fails is logged (the next one tries again; the WAL only grows
    meanwhile). :meth:`close` waits for a running checkpoint, then closes the connection.
    """

    def __init__(self, path: str, every: int = CHECKPOINT_EVERY) -> None:
        self.path = path
        self.every = every
        #: Checkpoints run to their end (complete or not: PASSIVE copies what no reader needs).
        self.checkpoints = 0
        self._since = 0
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        #: Held by a checkpoint, or by :meth:`close`: the connection is used by one at a time.
        self._lock = threading.Lock()
        #: Set while no checkpoint is started or running.
        self._idle = threading.Event()
        self._idle.set()

    def committed(self) -> None:
        """(In the trio thread, after a write transaction.) Start a checkpoint when one is due
        and none runs."""
        self._since += 1
        if self._since >= self.every and self._idle.is_set() and not self._closed:
            self._since = 0
            self._idle.clear()
            trio.lowlevel.start_thread_soon(self._checkpoint, self._deliver)

    def wait_idle(self) -> None:
        """(Blocking: in a thread.) Return once no checkpoint is started or running."""
        self._idle.wait()

    def close(self) -> None:
        """(Blocking: in a thread.) Wait for a running checkpoint and close the connection;
        none starts after."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _checkpoint(self) -> None:
        """(In its thread.)"""
        with self._lock:
            if self._closed:
                return
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(
                        self.path, isolation_level=None, check_same_thread=False
                    )
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as exc:
                logger.warning(
                    "matching store: a checkpoint of %s failed (the next one tries again): %s",
                    self.path,
                    exc,
                )
            else:
                self.checkpoints += 1

    def _deliver(self, result: Any) -> None:
        """(In the checkpoint's thread, once it returned: ``result`` its ``outcome``.)"""
        self._idle.set()
        try:
            result.unwrap()
        except Exception:
            logger.exception("matching store: a checkpoint of %s crashed", self.path)
