"""The matching server's listener: a GenServer (``matching_listener``) owning every listening
socket, with one linked acceptor per socket.

As in Erlang's acceptor pools (ranch) and the dirty pool's listener: the server binds the Unix
sockets (mode 0600, removed on stop) and the TCP ones (TLS by default, ``trio.SSLListener``,
the handshake done by the connection, never by the acceptor), links one acceptor process per
socket that runs the ``accept`` loop and starts a connection process under the
``matching_connections`` DynamicSupervisor for each peer. An acceptor's death is the
listener's (``matching_sup`` restarts it, binding anew; open connections carry on). On a
graceful stop the listener stops first: the sockets close (no new peer), then the connections
drain, each bounded by ``stop_drain_timeout`` (their child specs' ``shutdown``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
from typing import Any

import attrs
import trio

import otp
import supervisors

from ._connection import ServerContext, shutdown_timeout, start_connection

__all__ = ["CONNECTIONS", "LISTENER", "Listener", "start_listener"]

logger = logging.getLogger("apps.matching")

LISTENER = "matching_listener"
CONNECTIONS = "matching_connections"
#: Each listening socket's backlog.
BACKLOG = 512


@attrs.frozen
class _Accepted:
    """An acceptor tells the server it started connection process ``pid``."""

    pid: otp.Pid


@attrs.define(eq=False)
class _State:
    ctx: ServerContext
    #: The addresses being served, as peers dial them (a TCP port 0 resolved).
    addresses: list[str]
    listeners: list[trio.abc.Listener[Any]]
    unix_paths: list[str]
    acceptors: list[otp.Pid] = attrs.Factory(list)
    connections: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)
    accepted: int = 0


async def start_listener(ctx: ServerContext) -> otp.Pid:
    """Start the listener (registered as ``matching_listener``) linked to the caller; return
    once every socket is bound and accepting.

    Raises:
        otp.StartError: A socket cannot be bound or TLS cannot be set up (reason
            ``("matching_listen", address, error)`` or ``("matching_tls", error)``).
    """
    return await Listener.start_link(ctx, name=LISTENER)


class Listener(otp.GenServer):
    """Owns the listening sockets; the acceptors it links accept, connections are supervised.

    Calls: ``"address"`` (the addresses served, a list of str such as ``unix:/path`` and
    ``tcp://127.0.0.1:7233``), ``"statistics"`` (a dict of ``addresses``, ``connections``
    alive, ``accepted`` since this listener started and ``acceptors``, their pids).
    """

    # ======================================== client side ====================================

    @staticmethod
    async def address(server: Any = LISTENER) -> list[str]:
        """The addresses workers and clients connect to."""
        result: list[str] = await otp.call(server, "address")
        return result

    @staticmethod
    async def statistics(server: Any = LISTENER) -> dict[str, Any]:
        """``addresses``, ``connections``, ``accepted`` and ``acceptors`` as a dict."""
        result: dict[str, Any] = await otp.call(server, "statistics")
        return result

    # ======================================== callbacks ======================================

    async def init(self, ctx: ServerContext) -> Any:
        otp.process_flag(trap_exit=True)
        config = ctx.config
        state = _State(ctx, [], [], [])
        tls: ssl.SSLContext | None = None
        try:
            for address in config.addresses:
                if address.kind == "unix":
                    state.listeners.append(await _bind_unix(address.path))
                    state.unix_paths.append(address.path)
                    state.addresses.append(f"unix:{address.path}")
                    continue
                if config.uses_tls and tls is None:
                    tls = _tls_context(config.tls_certfile, config.tls_keyfile)
                found = await trio.open_tcp_listeners(
                    address.port, host=address.host, backlog=BACKLOG
                )
                for tcp in found:
                    host, port = tcp.socket.getsockname()[:2]
                    shown = f"[{host}]" if ":" in host else host
                    state.addresses.append(f"tcp://{shown}:{port}")
                    if tls is not None:
                        state.listeners.append(trio.SSLListener(tcp, tls, https_compatible=False))
                    else:
                        state.listeners.append(tcp)
                if tls is None:
                    logger.warning(
                        "matching: serving %s as plain TCP without TLS (matching.tls = false):"
                        " use it on a trusted network only",
                        address,
                    )
        except _TlsError as exc:
            await _close_all(state)
            return otp.Stop(("matching_tls", str(exc)))
        except OSError as exc:
            await _close_all(state)
            return otp.Stop(("matching_listen", str(address), str(exc)))
        # A restarted listener counts the connections its previous life started.
        for _, pid, _, _ in await supervisors.which_children(CONNECTIONS):
            if isinstance(pid, otp.Pid):
                state.connections[otp.monitor(pid)] = pid
        me = otp.self()
        for listener, shown in zip(state.listeners, state.addresses, strict=True):
            state.acceptors.append(otp.spawn_link(_acceptor, me, listener, ctx, shown))
        logger.info("matching: workers and clients connect to %s", " ".join(state.addresses))
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case "address":
                return otp.Reply(list(state.addresses), state)
            case "statistics":
                stats = {
                    "addresses": list(state.addresses),
                    "connections": len(state.connections),
                    "accepted": state.accepted,
                    "acceptors": list(state.acceptors),
                }
                return otp.Reply(stats, state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    def handle_info(self, msg: Any, state: _State) -> Any:
        kind = type(msg)
        if kind is _Accepted:
            state.accepted += 1
            state.connections[otp.monitor(msg.pid)] = msg.pid
        elif kind is otp.Down:
            state.connections.pop(msg.ref, None)
        elif kind is otp.Exit:
            if msg.pid in state.acceptors:
                state.acceptors.remove(msg.pid)
                return otp.Stop(("matching_acceptor_exited", msg.reason), state)
            return otp.Stop(msg.reason, state)  # (the parent's exit signal)
        return otp.NoReply(state)

    async def terminate(self, reason: Any, state: _State) -> None:
        for pid in state.acceptors:
            otp.unlink(pid)
            otp.exit(pid, otp.KILL)
        state.acceptors.clear()
        await _close_all(state)


class _TlsError(Exception):
    pass


def _tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile or "", keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise _TlsError(
            f"cannot load matching.tls_certfile {certfile} / matching.tls_keyfile {keyfile}: {exc}"
        ) from exc
    return context


async def _bind_unix(path: str) -> trio.SocketListener:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _remove_stale(path)
        await sock.bind(path)
        os.chmod(path, 0o600)  # before listen(): nobody can connect until then
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return trio.SocketListener(sock)


def _remove_stale(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


async def _close_all(state: _State) -> None:
    for listener in state.listeners:
        await trio.aclose_forcefully(listener)
    state.listeners.clear()
    for path in state.unix_paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    state.unix_paths.clear()


def _peer(stream: Any, address: str) -> str:
    transport = getattr(stream, "transport_stream", stream)
    sock = getattr(transport, "socket", None)
    try:
        name = sock.getpeername() if sock is not None else None
    except OSError:
        name = None
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return address


async def _acceptor(
    server: otp.Pid, listener: trio.abc.Listener[Any], ctx: ServerContext, address: str
) -> None:
    """Accept peers on ``listener``: each gets a connection process under
    ``matching_connections``, reported to ``server``. Ends (as a crash) if accepting fails."""
    while True:
        stream = await listener.accept()
        peer = _peer(stream, address)
        spec = supervisors.ChildSpec(
            "conn",
            (start_connection, stream, ctx, peer),
            restart="temporary",
            shutdown=shutdown_timeout(ctx.config),  # (it drains: _connection.py)
        )
        result = await supervisors.start_child(CONNECTIONS, spec)
        if result[0] == "ok":
            otp.send(server, _Accepted(result[1]))
        else:
            logger.warning("matching: could not serve %s: %r", peer, result)
            await trio.aclose_forcefully(stream)
