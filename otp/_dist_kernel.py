"""The net_kernel process of a distributed node (Erlang's ``net_kernel``): it owns the
listeners (Unix sockets and TCP), accepts peers, is linked to every connection process and
reaps them, and dials the nodes peers tell of (the mesh, as Erlang's ``global`` makes one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket as _socket
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

import wire

from ._dist_config import DistributionError, parse_address
from ._dist_handshake import is_node_name
from ._messages import Exit
from ._process import ProcessExit, current_process
from ._unix_socket import SocketPathTaken, claim_socket_path

if TYPE_CHECKING:
    from ._dist_connection import Connection
    from ._distribution import Distribution

logger = logging.getLogger("otp.dist")

#: The registered name of the process that owns the listeners and connections (net_kernel);
#: not Erlang's ``net_kernel``, which stays free for a user's process (a remote send to it
#: reaches that process).
NET_KERNEL = "otp.net_kernel"

#: The mesh's peer lists travel to this name (see PG_NAME: an atom no user send names).
NET_KERNEL_ATOM = wire.Atom("$net_kernel")

#: The longest address taken from a peer's list of nodes.
MAX_ADDRESS = 1024


async def net_kernel(dist: Distribution) -> None:
    """The net_kernel process (registered as NET_KERNEL): it serves the
    listeners and is linked to every connection process, dialled or accepted, trapping their
    exits. It owns them: when it ends (killed, or an exit signal from a process that is not
    one of its connections), every connection process is killed with it, the listeners close
    and the node's socket files go (Distribution.stopped), so nothing of the distribution is
    left behind. The node is its owner: it is stopped with the node."""
    me = current_process()
    try:
        async with trio.open_nursery() as nursery:
            for listener, address in zip(dist.listeners, dist.listening, strict=True):
                nursery.start_soon(_serve, dist, listener, address)
            nursery.start_soon(_dial_learnt, dist)
            while True:
                message = await me.receive()
                if message.__class__ is Exit:
                    if message.pid in dist.children:
                        dist.children.discard(message.pid)  # a connection ended: reaped
                    else:
                        raise ProcessExit(message.reason)
    finally:
        dist.stopped()


# -- listeners ----------------------------------------------------------------------------------


async def open_listeners(dist: Distribution) -> None:
    """Listen where DistConfig.listen says (``dist.listening`` gets each bound address); on a
    failure, close what was opened and raise.

    Raises:
        DistributionError: a live process listens on a Unix socket's path already.
        OSError: the socket cannot be bound.
    """
    config = dist.config
    try:
        for address in config.listen:
            # (DistConfig refused a TCP address without TLS unless insecure_tcp when made.)
            kind, where = parse_address(address)
            listener = await _open_listener(kind, where)
            dist.listeners.append(listener)
            if kind == "unix":
                dist.socket_files.append((Path(where), os.stat(where).st_ino))
            dist.listening.append(_bound_address(kind, where, listener))
    except BaseException:
        close_listeners(dist)
        raise


def close_listeners(dist: Distribution) -> None:
    """Close the listeners and remove the socket files this node made (if still its own)."""
    for listener in dist.listeners:
        sock = getattr(listener, "socket", None)
        if sock is not None:
            sock.close()  # their tasks, if any, were cancelled with the kernel
    dist.listeners.clear()
    for path, inode in dist.socket_files:
        _remove_own_socket(path, inode)
    dist.socket_files.clear()


async def _serve(dist: Distribution, listener: trio.abc.Listener[Any], address: str) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                logger.warning("distribution listener: accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            dist.spawn_connection(None, stream, _peer_address(stream, address))


async def _open_listener(kind: str, where: Any) -> trio.abc.Listener[Any]:
    if kind == "unix":
        path = Path(where)
        await trio.to_thread.run_sync(_remove_stale_socket, path)
        sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(128)
        return trio.SocketListener(sock)
    host, port = where
    listeners = await trio.open_tcp_listeners(port, host=host)
    return listeners[0]


def _bound_address(kind: str, where: Any, listener: Any) -> str:
    if kind == "unix":
        return f"unix:{where}"
    port = listener.socket.getsockname()[1]
    return f"tcp:{where[0]}:{port}"


def _peer_address(stream: trio.abc.Stream, listening: str) -> str:
    """Where an accepted peer is, for the log: its TCP address, or for a Unix socket the
    socket and the peer's OS pid."""
    sock = getattr(stream, "socket", None)
    try:
        if sock is not None and sock.family in (_socket.AF_INET, _socket.AF_INET6):
            host, port = sock.getpeername()[:2]
            return f"tcp:{host}:{port}"
        if sock is not None and hasattr(_socket, "SO_PEERCRED"):
            creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
            return f"{listening} (OS pid {int.from_bytes(creds[:4], sys.byteorder)})"
    except OSError:
        pass
    return listening


def _remove_stale_socket(path: Path) -> None:
    """Remove the socket file a dead node left at ``path``; one a live process answers on is
    never taken over.

    Raises:
        DistributionError: Something is listening on ``path``, or it is not a socket.
    """
    try:
        claim_socket_path(path)
    except SocketPathTaken as exc:
        raise DistributionError(
            f"cannot listen on unix:{path}: {exc.reason}; stop it or choose another path"
        ) from None


def _remove_own_socket(path: Path, inode: int) -> None:
    """Remove the socket file this node bound at ``path``, unless another took its place."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
            path.unlink()


# -- the mesh -----------------------------------------------------------------------------------


def peers_told(dist: Distribution, conn: Connection, message: Any) -> None:
    """``conn``'s peer told the nodes it knows (``("peers", {name: address})``, sent to
    NET_KERNEL_ATOM): remember their addresses and have the kernel dial them (see
    _dial_learnt). Anything else sent there, or a list from a hidden node, is ignored."""
    config = dist.config
    if (
        config.mesh
        and not conn.hidden  # hidden nodes (observer-remote)
        and isinstance(message, tuple)
        and len(message) == 2
        and message[0] == "peers"
        and isinstance(message[1], dict)
    ):
        room = config.mesh_max_nodes
        for name, address in message[1].items():
            if not (is_node_name(name) and isinstance(address, str)):
                continue
            if name == dist.node.name or name in dist.connections:
                continue
            if name not in dist.addresses and len(dist.addresses) >= room:
                logger.warning(
                    "node %s told of more nodes than mesh_max_nodes=%d: the rest ignored",
                    conn.peer,
                    room,
                )
                break
            if len(address) > MAX_ADDRESS or not address.isprintable():
                continue  # it would be logged: no control characters, no novel
            try:
                parse_address(address)
            except DistributionError:
                continue
            dist.addresses.setdefault(name, address)
            dist.to_dial[name] = None
        if dist.to_dial:
            dist.dial_lot.unpark()


async def _dial_learnt(dist: Distribution) -> None:
    """Dial the nodes learnt from peers' lists, at most mesh_dial_rate a second (a task of
    the net_kernel): a long list is no burst of connections."""
    while True:
        while not dist.to_dial:
            await dist.dial_lot.park()
        name = next(iter(dist.to_dial))
        del dist.to_dial[name]
        if name in dist.connections:
            continue
        dist.connection(name)
        await trio.sleep(1 / dist.config.mesh_dial_rate)
