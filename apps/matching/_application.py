"""The matching server as an OTP application: ``matching_sup`` and its configuration.

``matching_sup`` (rest_for_one) starts, in order: the store (``StoreServer`` over SQLite or
PostgreSQL), the queues' DynamicSupervisor (``matching_queues``), the matcher, the cluster
(``matching_cluster``: this server among those sharing a PostgreSQL store), the engine, its
lease keeper (``matching_leases``), the connections' DynamicSupervisor
(``matching_connections``) and the listener. Each depends on the ones before it, so a crash
restarts it and everything after it (a new matcher drops the old queues, and the listener's
restart binds the sockets anew). Stopping runs in reverse: the listener stops accepting and
removes its Unix sockets; the connections drain, all at once, each for at most
``stop_drain_timeout`` (workers are sent M_RECONNECT and their running calls send their outcomes
to the engine, still alive; clients' calls in flight are answered, or get a retryable
``draining`` error), then close; then the lease keeper releases this server's leases (on
PostgreSQL: the other servers take its flows at once), the engine stops, the cluster (removing
this server's row), the matcher, the queues and, last, the store, which commits what it was
given (the outcomes the drain brought in with it).

The server's id (who holds a flow's lease) is the node's name when it is distributed, else
``hostname/pid/random`` (``_server_id``).
"""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import Any

import trio

import supervisors
from otp import node

from ._blobs import BlobCache
from ._cluster import CLUSTER, Cluster, ClusterOptions
from ._config import MatchingConfig
from ._config import add_arguments as add_arguments  # (for --app apps.matching._application)
from ._connection import ServerContext
from ._engine import ENGINE, EngineOptions, FlowEngine
from ._engine_forward import ForwardOptions
from ._leases import start_leases
from ._listener import CONNECTIONS, start_listener
from ._matcher import MATCHER, QUEUES, start_matcher
from ._observer import observer_view
from ._scratch import ScratchDirectory
from ._server_id import server_id
from ._sqlite_store import SqliteStore
from ._store import SERVER_NAME, StoreServer

__all__ = ["application", "default_application", "matching_supervisor_spec"]

SUPERVISOR = "matching_sup"

#: Whether the store the application starts runs its database calls in worker threads (True,
#: the default; an in-memory SQLite never does). For tests only: a test on trio's MockClock sets
#: it False for its trio run (``STORE_THREADS.set(False)``), so autojump cannot jump while the
#: database works and a server's tests run the same on SQLite and on PostgreSQL.
STORE_THREADS: trio.lowlevel.RunVar[bool] = trio.lowlevel.RunVar(
    "matching_store_threads", default=True
)


def matching_supervisor_spec(
    ctx: ServerContext, scratch: str | None = None
) -> tuple[supervisors.SupFlags, list[Any]]:
    """``(flags, children)`` of ``matching_sup`` (ARCHITECTURE.md's tree); with ``scratch``, a
    first child owns that temporary directory (the store's, in the embedded default node)."""
    config = ctx.config
    this_server = server_id()  # (the node's name when distributed: ``_server_id``)
    owner = [supervisors.ChildSpec("scratch", (ScratchDirectory.start_link, scratch))]
    children = [
        *(owner if scratch is not None else []),
        supervisors.ChildSpec("store", (_start_store, config), shutdown=30.0),
        supervisors.ChildSpec("queues", (_start_dynamic, QUEUES, 1000, 5), type="supervisor"),
        supervisors.ChildSpec("matcher", (start_matcher, config.limits, QUEUES, MATCHER)),
        supervisors.ChildSpec("cluster", (_start_cluster, config, this_server), shutdown=10.0),
        supervisors.ChildSpec("engine", (_start_engine, config, this_server), shutdown=10.0),
        supervisors.ChildSpec("leases", (_start_leases, config, this_server), shutdown=10.0),
        supervisors.ChildSpec(
            "connections", (_start_dynamic, CONNECTIONS, 1000, 5), type="supervisor"
        ),
        supervisors.ChildSpec("listener", (start_listener, ctx), shutdown=5.0),
    ]
    return supervisors.SupFlags(strategy="rest_for_one", intensity=3, period=5), children


async def _start_store(config: MatchingConfig) -> Any:
    store: Any
    threads = STORE_THREADS.get()
    if config.store_is_postgres:
        from ._postgres_store import PostgresStore  # (psycopg is an optional dependency)

        store = PostgresStore(config.store, threads=threads)
    else:
        # An in-memory database does no disk I/O: its calls run on trio's own thread (no
        # thread hand-off per commit, and tests of the whole server run on trio's MockClock).
        path = config.store_path
        store = SqliteStore(path, threads=threads and path != ":memory:")
    return await StoreServer.start_link(store, name=SERVER_NAME)


async def _start_cluster(config: MatchingConfig, this_server: str) -> Any:
    # (a SQLite file is one server's alone: the cluster is inert there)
    options = ClusterOptions(this_server, SERVER_NAME, shared=config.store_is_postgres)
    return await Cluster.start_link(options, name=CLUSTER)


def _engine_options(config: MatchingConfig, this_server: str) -> EngineOptions:
    """(In the node.) The engine's options; the server's id is the node's (``_server_id``)."""
    forward = None
    if config.store_is_postgres:
        forward = ForwardOptions(CLUSTER, SERVER_NAME, ENGINE)
    return EngineOptions(
        store=SERVER_NAME,
        matcher=MATCHER,
        dispatch_wait=config.limits.dispatch_wait,
        max_flow_type_length=config.limits.max_flow_type_length,
        server_id=this_server,
        lease_seconds=config.lease_seconds,
        forward=forward,
    )


async def _start_engine(config: MatchingConfig, this_server: str) -> Any:
    return await FlowEngine.start_link(_engine_options(config, this_server), name=ENGINE)


async def _start_leases(config: MatchingConfig, this_server: str) -> Any:
    options = _engine_options(config, this_server)
    return await start_leases(options, ENGINE, shared=config.store_is_postgres)


async def _start_dynamic(name: str, intensity: int, period: int) -> Any:
    return await supervisors.DynamicSupervisor.start_link(
        name=name, intensity=intensity, period=period
    )


async def start_matching_sup(config: MatchingConfig, scratch: str | None = None) -> Any:
    """Start ``matching_sup`` linked to the caller (the blob directory is made here; with
    ``scratch``, that directory is made too, before it, and removed when the server stops)."""
    if scratch is not None:
        os.makedirs(scratch, mode=0o700, exist_ok=True)  # (the BlobCache is made in it first)
    blobs = BlobCache(_blob_dir(config))
    flags, children = matching_supervisor_spec(ServerContext(config, blobs), scratch)
    return await supervisors.Supervisor.start_link(flags, children, name=SUPERVISOR)


def _blob_dir(config: MatchingConfig) -> str | None:
    if config.blob_dir is not None:
        return config.blob_dir
    if config.store_path == ":memory:" or config.store_is_postgres:
        return None  # (BlobCache's per-user directory in the temporary directory)
    return config.store_path + ".blobs"


def application(
    config: node.NodeConfig | None = None, *, matching_config: MatchingConfig | None = None
) -> supervisors.Application:
    """The matching server, for ``python -m otp.node --app apps.matching`` or
    ``supervisors.start_application``.

    Settings come from ``matching_config`` if given, else from the node's ``[matching]`` table
    and ``--matching-*`` flags (see :class:`MatchingConfig`).

    Raises:
        ConfigurationError: A setting is invalid (the message names it).
    """
    if matching_config is None:
        settings = config.settings if config is not None else {}
        matching_config = MatchingConfig.from_settings(settings)
    return _application(matching_config)


def _application(config: MatchingConfig, scratch: str | None = None) -> supervisors.Application:
    listen = " and ".join(config.listen)
    auth = [role for role in ("worker", "client") if config.tokens(role)]
    return supervisors.Application(
        "matching",
        (start_matching_sup, config, scratch),
        env={"listen": list(config.listen), "store": config.store},
        description=(
            f"matching server; workers and clients connect to {listen}"
            f" (tokens: {', '.join(auth) or 'none'}); flows in {config.store}"
        ),
        version="0.1.0",
        observer_view=observer_view,
    )


def default_application(config: node.NodeConfig | None = None) -> supervisors.Application:
    """The matching server as ``python -m otp.node`` runs it with no ``--app``: the node's
    ``[matching]`` settings, with a Unix socket in the temporary directory and the flows in a
    SQLite file in a new temporary directory unless they say otherwise. That directory is
    made when the server starts and removed when it stops (``_scratch.py``).

    The banner prints where workers and clients connect.
    """
    settings = dict(config.settings) if config is not None else {}
    table = settings.get("matching", {})
    if not isinstance(table, dict):
        return application(config)  # (from_settings refuses it, naming [matching])
    flags = settings.get("flags", {}) or {}
    if "store" not in table and not flags.get("matching_store"):
        scratch = os.path.join(
            tempfile.gettempdir(), f"otp-matching-{os.getpid()}-{secrets.token_hex(4)}"
        )
        settings["matching"] = {**table, "store": os.path.join(scratch, "matching.sqlite3")}
        return _application(MatchingConfig.from_settings(settings), scratch)
    return _application(MatchingConfig.from_settings(settings))
