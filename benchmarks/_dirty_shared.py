"""The shared-connection floor's client (bench_dirty's ``dirty.execute_8_vs_shared_floor``): the
simplest correct Python client for the shape our sync dirty client has, threads of one process
sharing one connection, with none of its work (no GD frames, no errors, no timeouts).

Each call sends one fixed-size record (the forwarder's index of the connection, then the
request id) under a send lock, and sleeps on its thread's ``queue.SimpleQueue``; one reader
thread reads the socket and puts each record into the queue of the call its request id names.
The hand-off was chosen by measurement (8 callers, the bare floor's forwarder and echoes, 4 runs
of slices alternating with the bare floor on a host at a load of 4-5): a SimpleQueue per
thread 0.98-1.10x the bare floor's calls/s, a Lock per call released by the reader 0.90-1.13x,
leader/follower (a waiting caller reads for all and hands the role on, as our client does)
0.63-1.05x, a ``threading.Event`` per call 0.75x.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading


class SharedConn:
    """One connection to the floor's forwarder, shared by any number of threads.

    ``record`` is the forwarder's record size; the first byte the forwarder sends is this
    connection's index, which every record starts with (the forwarder routes replies by it).
    """

    def __init__(self, sock: socket.socket, record: int) -> None:
        self._sock = sock
        self._record = record
        self._head = sock.recv(1)
        self._pad = b"x" * (record - 9)
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.SimpleQueue[bytes]] = {}
        self._send_lock = threading.Lock()
        self._local = threading.local()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def call(self) -> bytes:
        """One round trip: the reply record (its bytes 1-8 are this call's request id)."""
        rid = next(self._ids)  # (atomic: itertools.count is C)
        replies = getattr(self._local, "replies", None)
        if replies is None:
            replies = self._local.replies = queue.SimpleQueue()
        self._waiting[rid] = replies
        data = self._head + rid.to_bytes(8, "little") + self._pad
        with self._send_lock:
            self._sock.sendall(data)
        return replies.get()

    def _read(self) -> None:
        record = self._record
        waiting = self._waiting
        pending = b""
        while data := self._recv():
            pending += data
            end = len(pending) - len(pending) % record
            for i in range(0, end, record):
                waiting.pop(int.from_bytes(pending[i + 1 : i + 9], "little")).put(
                    pending[i : i + record]
                )
            pending = pending[end:]

    def _recv(self) -> bytes:
        try:
            return self._sock.recv(1 << 16)
        except OSError:
            return b""  # (the forwarder is gone: the rig is closing)

    def close(self) -> None:
        """Close the socket once the reader thread has seen it shut."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(5)
        self._sock.close()
