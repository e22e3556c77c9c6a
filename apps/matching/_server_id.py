"""The matching server's id: who holds a flow's lease in the store (``pending.lease_owner``).

A distributed node's name (``--name m1@host``) names its server: a server restarted under the
same name owns its old leases again at once, and other servers reach it by that name. A node
that is not distributed gets ``hostname/pid/8 random hex``, unique to this process run (made
once per process, so every engine of the process shares it).
"""

from __future__ import annotations

import os
import secrets
import socket

import otp

__all__ = ["UNNAMED_NODE", "local_server_id", "server_id"]

#: The name of a node that is not distributed (``otp.node_name()`` then).
UNNAMED_NODE = "nonode@nohost"

_local: tuple[int, str] | None = None


def server_id() -> str:
    """This server's id: the node's name when it is distributed, else this process's
    ``hostname/pid/random`` id. Call it inside the node (from a process)."""
    name = otp.node_name()
    return local_server_id() if name == UNNAMED_NODE else name


def local_server_id() -> str:
    """This process's ``hostname/pid/random`` id (the default ``EngineOptions.server_id``);
    a forked child makes its own."""
    global _local
    pid = os.getpid()
    if _local is None or _local[0] != pid:
        _local = (pid, f"{socket.gethostname()}/{pid}/{secrets.token_hex(4)}")
    return _local[1]
