"""Taking a path for a listening Unix socket without taking it from anyone: shared by the
distribution listener and any app that listens on a Unix socket (the dirty pool)."""

from __future__ import annotations

import os
import socket
import stat

from ._errors import OtpError

__all__ = ["SocketPathTaken", "claim_socket_path"]


class SocketPathTaken(OtpError, OSError):
    """A Unix socket cannot be bound at ``path``: ``reason`` says what is there."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot listen on {path}: {reason}; stop it or choose another path")
        self.path = path
        self.reason = reason


def claim_socket_path(path: str | os.PathLike[str]) -> None:
    """Make ``path`` free to bind a listening Unix socket at: remove the socket file a dead
    listener left there. Anything else at ``path`` is never removed. Blocking (one
    ``connect``); run it in a thread from async code.

    Raises:
        SocketPathTaken: ``path`` is not a socket (a file, a directory...), or a live process
            accepts connections on it.
    """
    where = os.fspath(path)
    try:
        mode = os.lstat(where).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a file that is not a socket"
        raise SocketPathTaken(where, f"{kind} is there")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(where)
    except ConnectionRefusedError:
        try:
            os.unlink(where)  # nobody listens: a dead listener's leftover
        except FileNotFoundError:
            pass
        return
    except OSError:
        return  # gone meanwhile, or not ours to judge: bind reports what is wrong
    finally:
        probe.close()
    raise SocketPathTaken(where, "a live process listens there")
