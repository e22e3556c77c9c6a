"""The pool's PID file: the node's OS pid, then its workers', so a restarted node can kill the
workers a crashed previous life left behind (owner-checked, as Gunicorn 27 does)."""

from __future__ import annotations

import logging
import os
import signal
import stat

logger = logging.getLogger("apps.dirty")

__all__ = ["kill_orphans", "read_pidfile", "remove_pidfile", "write_pidfile"]


def _owned_regular_file(st: os.stat_result) -> bool:
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


#: A worker's ``python -m`` module (and its name before it became a package, for the orphans of
#: a node of an earlier version).
_WORKER_PROGRAMS = (b"apps.dirty.worker", b"apps.dirty._worker_main")


def _ours(pid: int) -> bool:
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return any(arg in _WORKER_PROGRAMS for arg in f.read().split(b"\0"))
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


def _running_node(pid: int) -> bool:
    """Whether ``pid`` is a live process of this user other than us (not a zombie)."""
    if pid == os.getpid():
        return False
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def kill_orphans(path: str) -> bool:
    """Kill the workers a previous life of the pool left behind, and claim the PID file.

    Trusts the file only if it is ours (a regular file of this user nobody else can write), and
    kills only the pids it lists that are this user's processes running the dirty worker
    program. If the node it names is still running, its workers are not orphans: they are left
    alone and the file is not claimed.

    Returns:
        Whether this pool owns the PID file now (False: another running pool does, or there is
        none).
    """
    if not path:
        return False
    pids = read_pidfile(path)
    if pids[:1] == [os.getpid()]:
        return True  # ours: a restarted router of this very pool
    if pids and _running_node(pids[0]):
        logger.warning(
            "dirty pool: PID file %s belongs to a running pool (OS pid %d); leaving it and its"
            " workers alone (set dirty_pidfile to a path of this pool's own)",
            path,
            pids[0],
        )
        return False
    for pid in pids[1:]:
        if pid != os.getpid() and _ours(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                logger.warning("dirty pool: killed orphan worker %d of a previous run", pid)
            except OSError:
                pass
    write_pidfile(path, [])
    return True


def remove_pidfile(path: str) -> None:
    """Remove the PID file if it is ours and names this node (a clean stop)."""
    if path and read_pidfile(path)[:1] == [os.getpid()]:
        try:
            os.unlink(path)
        except OSError:
            pass
