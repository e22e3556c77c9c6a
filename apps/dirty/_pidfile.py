"""The pool's PID file: the node's OS pid, then its workers', so a restarted node can kill the
workers a crashed previous life left behind (owner-checked, as Gunicorn 27 does)."""

from __future__ import annotations

import logging
import os
import signal
import stat

logger = logging.getLogger("apps.dirty")

__all__ = ["kill_orphans", "read_pidfile", "write_pidfile"]


def _owned_regular_file(st: os.stat_result) -> bool:
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _ours(pid: int) -> bool:
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"apps.dirty._worker_main" in f.read()
    except OSError:
        return False


def read_pidfile(path: str) -> list[int]:
    """The pids a trusted PID file lists (ours, a regular file nobody else can write)."""
    try:
        st = os.lstat(path)
        if not _owned_regular_file(st):
            return []
        with open(path) as f:
            return [int(x) for x in f.read(65536).split() if x.isdigit()]
    except (OSError, ValueError):
        return []


def write_pidfile(path: str, pids: list[int]) -> None:
    """Write the node's pid then its workers' pids, as this user, mode 0600; a file owned by
    someone else (or a symlink) is left alone."""
    if not path:
        return
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not _owned_regular_file(st):
                return
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(str(p) for p in [os.getpid(), *pids]) + "\n")
    except OSError as exc:
        logger.warning("dirty pool: cannot write PID file %s: %s", path, exc)


def kill_orphans(path: str) -> int:
    """Kill the workers a previous life of the pool left behind (listed in its PID file, owned
    by this user, running our worker program); returns how many were killed."""
    if not path:
        return 0
    killed = 0
    pids = read_pidfile(path)
    for pid in pids[1:]:
        if pid != os.getpid() and _ours(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
                logger.warning("dirty pool: killed orphan worker %d of a previous run", pid)
            except OSError:
                pass
    write_pidfile(path, [])
    return killed
