"""The socket listener: a GenServer (``dirty_listener``) owning the pool's Unix socket
(``GUNICORN_DIRTY_SOCKET``), and its acceptor.

As in Erlang's acceptor pools (ranch: the listener owns the socket, acceptors accept), the
server binds the socket and links one acceptor process that runs the blocking ``accept`` loop,
starts a connection process under the ``dirty_connections`` DynamicSupervisor for each client
and reports it; the server's own loop never blocks, so it answers calls (its address, the
connections it serves) at any time. The acceptor dying is the server's exit (the listener is
restarted by ``dirty_sup``, binding the socket anew; open connections carry on).

The acceptor is not a supervisor's child: it is owned by the listener (``dirty_listener``, a
child of ``dirty_sup``), which reaps it. It is linked to the listener and does not trap exits,
so the listener's death for any reason (a ``kill`` too, when ``terminate`` does not run) ends
it; an exit hook closes the listening socket at the same moment, so a restarted listener finds
the path free, not held by a socket its previous life left open.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import attrs
import trio

import otp
import supervisors

from ._connection import start_connection
from ._context import PoolContext
from ._errors import DirtyError
from ._io import tune_socket
from ._protocol import error_bytes

logger = logging.getLogger("apps.dirty")

LISTENER = "dirty_listener"
CONNECTIONS = "dirty_connections"
#: The listening socket's backlog.
BACKLOG = 512


@attrs.frozen
class _Accepted:
    """The acceptor tells the server it started connection process ``pid``."""

    pid: otp.Pid


@attrs.define(eq=False)
class _State:
    ctx: PoolContext
    sock: Any
    acceptor: otp.Pid | None = None
    #: The connection processes alive, by the server's monitor of each.
    connections: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)
    accepted: int = 0


async def start_listener(ctx: PoolContext) -> otp.Pid:
    """Start the listener (registered as ``dirty_listener``) linked to the caller; return
    once the socket is bound and accepting.

    Raises:
        otp.StartError: The socket cannot be bound (reason ``("dirty_socket", path, error)``).
    """
    return await Listener.start_link(ctx, name=LISTENER)


class Listener(otp.GenServer):
    """Owns the listening socket; an acceptor it links accepts, connections are supervised.

    Calls: ``"address"`` (the socket path), ``"connections"`` (how many connection processes
    are alive), ``"statistics"`` (a dict of those, plus ``accepted``, the clients accepted since
    this listener started, and ``acceptor``, its acceptor's pid).
    """

    # ======================================== client side ====================================

    @staticmethod
    async def address(server: Any = LISTENER) -> str:
        """The socket path clients connect to."""
        result: str = await otp.call(server, "address")
        return result

    @staticmethod
    async def connections(server: Any = LISTENER) -> int:
        """How many client connections are open."""
        result: int = await otp.call(server, "connections")
        return result

    @staticmethod
    async def statistics(server: Any = LISTENER) -> dict[str, Any]:
        """``address``, ``connections``, ``accepted`` and ``acceptor`` (pid) as a dict."""
        result: dict[str, Any] = await otp.call(server, "statistics")
        return result

    # ======================================== callbacks ======================================

    async def init(self, ctx: PoolContext) -> Any:
        otp.process_flag(trap_exit=True)
        path = ctx.socket_path
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await trio.to_thread.run_sync(otp.claim_socket_path, path)
            await sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            return otp.Stop(("dirty_socket", path, str(exc)))
        otp.add_exit_hook(lambda _pid, _reason: sock.close())
        os.environ["GUNICORN_DIRTY_SOCKET"] = path
        logger.info("dirty pool: clients connect to %s (GUNICORN_DIRTY_SOCKET)", path)
        state = _State(ctx, sock)
        # A restarted listener counts the connections its previous life started.
        for _, pid, _, _ in await supervisors.which_children(CONNECTIONS):
            if isinstance(pid, otp.Pid):
                state.connections[otp.monitor(pid)] = pid
        state.acceptor = otp.spawn_link(_acceptor, otp.self(), trio.SocketListener(sock), ctx)
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case "address":
                return otp.Reply(state.ctx.socket_path, state)
            case "connections":
                return otp.Reply(len(state.connections), state)
            case "statistics":
                stats = {
                    "address": state.ctx.socket_path,
                    "connections": len(state.connections),
                    "accepted": state.accepted,
                    "acceptor": state.acceptor,
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
        elif kind is otp.Exit and msg.pid == state.acceptor:
            state.acceptor = None
            return otp.Stop(("dirty_acceptor_exited", msg.reason), state)
        return otp.NoReply(state)

    def terminate(self, reason: Any, state: _State) -> None:
        if state.acceptor is not None:
            otp.unlink(state.acceptor)
            otp.exit(state.acceptor, otp.KILL)
        state.sock.close()
        try:
            os.unlink(state.ctx.socket_path)
        except OSError:
            pass


async def _acceptor(server: otp.Pid, listener: trio.SocketListener, ctx: PoolContext) -> None:
    """Accept clients for ``server``: each gets a connection process under
    ``dirty_connections``, reported to the server, while fewer than ``dirty_max_clients`` are
    served; one more gets an ERROR frame saying so and is closed. Ends (as a crash) if
    accepting fails."""
    limit = ctx.config.dirty_max_clients
    refusing = False
    while True:
        stream = await listener.accept()
        served = (await supervisors.count_children(CONNECTIONS))["active"]
        if served >= limit:
            if not refusing:
                logger.warning(
                    "dirty pool: refusing clients: %d are connected (dirty_max_clients=%d)",
                    served,
                    limit,
                )
            refusing = True
            await _refuse(stream, limit)
            continue
        refusing = False
        tune_socket(stream.socket)
        spec = supervisors.ChildSpec(
            "conn",
            (start_connection, stream, ctx.routes, ctx.config),
            restart="temporary",
            shutdown="brutal_kill",
        )
        result = await supervisors.start_child(CONNECTIONS, spec)
        if result[0] == "ok":
            otp.send(server, _Accepted(result[1]))
        else:
            logger.warning("dirty pool: could not serve a client: %r", result)
            await stream.aclose()


async def _refuse(stream: trio.SocketStream, limit: int) -> None:
    """Tell a client over ``dirty_max_clients`` why it is closed (if its socket takes the
    frame now), then close it."""
    error = DirtyError(
        f"the dirty pool serves at most {limit} clients at once (dirty_max_clients); close"
        " idle clients or raise the limit"
    )
    try:
        os.write(stream.socket.fileno(), error_bytes(0, error))  # (a new socket: room)
    except OSError:
        pass
    await stream.aclose()
