"""The matching server's settings: node.toml's ``[matching]`` table and the ``--matching-*``
flags (flags win), validated when built.

Where workers and clients connect (``listen``: Unix sockets, TCP with TLS by default), who may
(bearer tokens per role), where flows are kept (``store``: SQLite) and blobs (``blob_dir``), and
the routing core's limits and waits (the seed's ``matching.*`` settings, :class:`MatchingLimits`).
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._dispatch import MatchingLimits
from ._errors import ConfigurationError
from ._options import ServerAddress, parse_server_address
from ._store_sql import redact

__all__ = ["ROLES", "MatchingConfig", "add_arguments", "parse_listen_address"]

#: The roles a connection may take at HELLO.
ROLES = ("worker", "client")
#: The default store of ``--app apps.matching`` (a file in the working directory).
DEFAULT_STORE = "matching.sqlite3"
#: The largest frame payload a peer may send once connected (bytes).
DEFAULT_MAX_PAYLOAD = 16 * 1024 * 1024
#: A peer is dropped when this many bytes written to it are still unsent.
DEFAULT_MAX_UNSENT = 16 * 1024 * 1024
#: How long a graceful stop waits for the calls running on each connection (seconds).
DEFAULT_STOP_DRAIN_TIMEOUT = 10.0


def _default_listen() -> tuple[str, ...]:
    return (f"unix:{os.path.join(tempfile.gettempdir(), f'otp-matching-{os.getpid()}.sock')}",)


def parse_listen_address(address: Any, *, where: str = "matching.listen") -> ServerAddress:
    """``unix:/path`` (or ``/path``) or ``tcp://host:port``; port 0 picks a free port.

    Raises:
        ConfigurationError: Neither form; the message names ``where``.
    """
    if type(address) is str and address.endswith(":0") and not address.startswith("unix:"):
        parsed = parse_server_address(address[:-2] + ":1", where=where)
        return attrs.evolve(parsed, port=0)
    return parse_server_address(address, where=where)


def _to_listen(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ConfigurationError(
            "matching.listen must be a list of addresses such as"
            f" ['unix:/run/matching.sock', 'tcp://0.0.0.0:7233'] (got {value!r})"
        )
    out = []
    for i, address in enumerate(value):
        out.append(str(parse_listen_address(address, where=f"matching.listen[{i}]")))
    if len(set(out)) != len(out):
        raise ConfigurationError(f"matching.listen names an address twice (got {out})")
    return tuple(out)


def _to_tokens(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence):
        return value  # type: ignore[no-any-return,unused-ignore]  # (the validator refuses it)
    return tuple(value)


def _tokens(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not all(type(t) is str and t for t in value):
        raise ConfigurationError(
            f"matching.{attribute.name} must be a list of non-empty str bearer tokens"
            f" (got {value!r})"
        )


def _opt_path(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not str or not value):
        raise ConfigurationError(
            f"matching.{attribute.name} must be a file path, a non-empty str (got {value!r})"
        )


def _opt_bool(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not bool:
        raise ConfigurationError(f"matching.{attribute.name} must be true or false (got {value!r})")


_POSTGRES = ("postgresql://", "postgres://")


def _store(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value or value == "sqlite:":
        raise ConfigurationError(
            "matching.store must be 'sqlite:PATH', a file path, ':memory:' or a"
            f" postgresql:// URL (got {value!r})"
        )
    if value.startswith(_POSTGRES):
        _check_postgres_url(value)
    elif "://" in value and not value.startswith("sqlite:"):
        raise ConfigurationError(
            "matching.store: the stores are SQLite ('sqlite:PATH', a file path or ':memory:')"
            f" and PostgreSQL (a postgresql:// URL), got {redact(value)!r}"
        )


def _check_postgres_url(url: str) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise ConfigurationError(
            f"matching.store: {redact(url)!r} is not a valid PostgreSQL URL ({exc}); write"
            " postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        ) from exc
    if not parts.hostname and "host=" not in parts.query:
        raise ConfigurationError(
            f"matching.store: {redact(url)!r} names no host; write"
            " postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            "matching.store is a PostgreSQL URL but psycopg 3 is not installed: pip install"
            " 'otp-runtime[postgresql]'"
        ) from exc


def _positive_int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ConfigurationError(
            f"matching.{attribute.name} must be an int >= 1 (bytes) (got {value!r})"
        )


def _positive_seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"matching.{attribute.name} must be a number of seconds > 0 (got {value!r})"
        )


def _limits(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, MatchingLimits):
        raise ConfigurationError(f"matching.limits must be a MatchingLimits (got {value!r})")


def _server_name(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value:
        raise ConfigurationError(f"matching.server_name must be a non-empty str (got {value!r})")


def _private_file(path: str, setting: str) -> None:
    """Refuse a secret file that is missing or readable by group or others."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigurationError(f"{setting}: cannot read {path} ({exc})") from exc
    if not stat.S_ISREG(mode):
        raise ConfigurationError(f"{setting}: {path} is not a regular file")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigurationError(
            f"{setting}: {path} has mode {stat.S_IMODE(mode):04o}; it holds a secret and must be"
            f" readable by its owner only: run chmod 600 {path}"
        )


def _read_token_file(path: str) -> dict[str, tuple[str, ...]]:
    """``worker TOKEN`` / ``client TOKEN`` lines (``#`` comments, blank lines skipped)."""
    _private_file(path, "matching.token_file")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"matching.token_file: cannot read {path} ({exc})") from exc
    tokens: dict[str, list[str]] = {role: [] for role in ROLES}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        role, _, token = text.partition(" ")
        role = role.rstrip(":")
        token = token.strip()
        if role not in ROLES or not token:
            raise ConfigurationError(
                f"matching.token_file: {path} line {number} must read 'worker TOKEN' or"
                " 'client TOKEN'"
            )
        tokens[role].append(token)
    return {role: tuple(found) for role, found in tokens.items()}


@attrs.frozen
class MatchingConfig:
    """How the matching server runs.

    Attributes:
        listen: Where workers and clients connect: ``unix:/path`` (the socket is made mode
            0600 and removed on stop) or ``tcp://host:port`` (port 0 picks one). Default: one
            Unix socket ``<tempdir>/otp-matching-<pid>.sock``.
        tls: TLS on the TCP addresses; None (the default) means on. ``False`` serves plain
            TCP, for a trusted network only (logged at start).
        tls_certfile, tls_keyfile: The server's certificate chain and private key (PEM),
            needed by TLS; the key file must be readable by its owner only.
        worker_tokens, client_tokens: The bearer credentials each role may present at
            HELLO. A role without tokens (here or in ``token_file``) is not authenticated,
            which only Unix sockets allow (their mode 0600 is the access control).
        token_file: A file (mode 0600) of ``worker TOKEN`` / ``client TOKEN`` lines, added to
            the tokens above.
        store: ``sqlite:PATH``, a file path, or ``:memory:`` (nothing survives a restart); or
            a PostgreSQL URL, ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE``, which
            several matching servers may share (needs ``pip install 'otp-runtime[postgresql]'``).
        blob_dir: The directory of the server's blob cache; None puts it beside the store
            file (``<store>.blobs``), or in a temporary directory for ``:memory:``.
        limits: The routing core's limits and waits (``dispatch_wait``, ``sticky_wait``,
            ``ping_interval``, ``peer_timeout``, ``max_streams``, ...).
        server_name: What M_WELCOME calls the server.
        max_payload: The largest frame payload a peer may send once connected.
        max_unsent: A peer is dropped once this many bytes written to it are unsent (it
            stopped reading); one that drains nothing for ``peer_timeout`` is dropped too.
        stop_drain_timeout: How long a graceful stop (``stop_application("matching")``,
            SIGTERM to the node) waits for each connection to drain: a worker connection is
            sent M_RECONNECT and its running calls may still send their outcomes, a client
            connection's calls in flight may still be answered. Past it the calls still
            running are given up (a worker's are re-dispatched after the restart; a client's
            get a retryable ``draining`` error) and the connection closes.
        lease_seconds: How long this server's lease on a flow lasts without renewal (renewed
            every third of it): on a shared store (PostgreSQL) a server dead or silent this
            long loses its running flows to the others. Shorter hands flows over sooner,
            longer tolerates longer stalls.

    Raises:
        ConfigurationError: A setting is invalid; the message names it and says what to do.
    """

    listen: tuple[str, ...] = attrs.field(factory=_default_listen, converter=_to_listen)
    tls: bool | None = attrs.field(default=None, validator=_opt_bool)
    tls_certfile: str | None = attrs.field(default=None, validator=_opt_path)
    tls_keyfile: str | None = attrs.field(default=None, validator=_opt_path)
    worker_tokens: tuple[str, ...] = attrs.field(
        default=(), converter=_to_tokens, validator=_tokens
    )
    client_tokens: tuple[str, ...] = attrs.field(
        default=(), converter=_to_tokens, validator=_tokens
    )
    token_file: str | None = attrs.field(default=None, validator=_opt_path)
    store: str = attrs.field(default=DEFAULT_STORE, validator=_store)
    blob_dir: str | None = attrs.field(default=None, validator=_opt_path)
    limits: MatchingLimits = attrs.field(factory=MatchingLimits, validator=_limits)
    server_name: str = attrs.field(default="otp-matching", validator=_server_name)
    max_payload: int = attrs.field(default=DEFAULT_MAX_PAYLOAD, validator=_positive_int)
    max_unsent: int = attrs.field(default=DEFAULT_MAX_UNSENT, validator=_positive_int)
    stop_drain_timeout: float = attrs.field(
        default=DEFAULT_STOP_DRAIN_TIMEOUT, validator=_positive_seconds
    )
    lease_seconds: float = attrs.field(default=15.0, validator=_positive_seconds)
    #: Tokens read from ``token_file`` when the config was built.
    _file_tokens: Mapping[str, tuple[str, ...]] = attrs.field(
        init=False, factory=dict, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        if self.token_file is not None:
            object.__setattr__(self, "_file_tokens", _read_token_file(self.token_file))
        tcp = [a for a in self.addresses if a.kind == "tcp"]
        if not tcp:
            return
        if self.tls is not False:
            if self.tls_certfile is None or self.tls_keyfile is None:
                raise ConfigurationError(
                    f"matching.listen has TCP address {tcp[0]}, which uses TLS: set"
                    " matching.tls_certfile and matching.tls_keyfile (--matching-tls-cert,"
                    " --matching-tls-key), or matching.tls = false for plain TCP on a trusted"
                    " network"
                )
            if not os.path.isfile(self.tls_certfile):
                raise ConfigurationError(
                    f"matching.tls_certfile: {self.tls_certfile} is not a readable file"
                )
            _private_file(self.tls_keyfile, "matching.tls_keyfile")
        for role in ROLES:
            if not self.tokens(role):
                raise ConfigurationError(
                    f"matching.listen has TCP address {tcp[0]}, which needs authentication:"
                    f" set matching.{role}_tokens or a matching.token_file with"
                    f" '{role} TOKEN' lines"
                )

    # ---------------------------------------------------------------- derived values

    @property
    def addresses(self) -> tuple[ServerAddress, ...]:
        """``listen``, parsed."""
        return tuple(parse_listen_address(a) for a in self.listen)

    @property
    def uses_tls(self) -> bool:
        """Whether the TCP addresses use TLS."""
        return self.tls is not False

    def tokens(self, role: str) -> tuple[str, ...]:
        """Every token ``role`` may present (empty: that role is not authenticated)."""
        configured = self.worker_tokens if role == "worker" else self.client_tokens
        return configured + tuple(self._file_tokens.get(role, ()))

    @property
    def store_is_postgres(self) -> bool:
        """Whether ``store`` is a PostgreSQL URL."""
        return self.store.startswith(_POSTGRES)

    @property
    def store_path(self) -> str:
        """The SQLite file (or ``:memory:``), or the PostgreSQL URL."""
        return self.store[len("sqlite:") :] if self.store.startswith("sqlite:") else self.store

    @property
    def ping_interval(self) -> float:
        return self.limits.ping_interval

    @property
    def peer_timeout(self) -> float:
        return self.limits.peer_timeout

    # ---------------------------------------------------------------- from a node's settings

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> MatchingConfig:
        """Build it from a node's settings: the ``[matching]`` table, then the ``--matching-*``
        flags (``settings["flags"]``).

        The limits are keys of the table too (``dispatch_wait = 10``), or a
        ``[matching.limits]`` table; ``peer_timeout`` defaults to three ``ping_interval``.

        Raises:
            ConfigurationError: A setting is unknown or invalid.
        """
        raw = settings.get("matching", {})
        if not isinstance(raw, Mapping):
            raise ConfigurationError(
                f"[matching] must be a table of settings (got {raw!r}); in node.toml, write a"
                " [matching] line followed by key = value lines"
            )
        table = dict(raw)
        flags = settings.get("flags", {}) or {}
        for key, flag in _FLAGS.items():
            if flags.get(flag) is not None:
                table[key] = flags[flag]
        if flags.get("matching_plain_tcp"):
            table["tls"] = False
        limit_names = {f.name for f in attrs.fields(MatchingLimits)}
        nested = table.pop("limits", {})
        if not isinstance(nested, Mapping):
            raise ConfigurationError(
                f"matching.limits must be a table of limits (got {nested!r}); known:"
                f" {sorted(limit_names)}"
            )
        limits = dict(nested)
        for key in list(table):
            if key in limit_names:
                limits[key] = table.pop(key)
        known = {f.name for f in attrs.fields(cls) if f.init} - {"limits"}
        unknown = sorted(set(table) - known) + sorted(set(limits) - limit_names)
        if unknown:
            raise ConfigurationError(
                f"[matching] has unknown settings {unknown}; known: {sorted(known | limit_names)}"
            )
        if "ping_interval" in limits and "peer_timeout" not in limits:
            ping = limits["ping_interval"]
            if isinstance(ping, int | float) and not isinstance(ping, bool) and math.isfinite(ping):
                limits["peer_timeout"] = 3 * ping
        try:
            table["limits"] = MatchingLimits(**limits)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        return cls(**table)


#: setting -> the ``dest`` of its flag.
_FLAGS = {
    "listen": "matching_listen",
    "store": "matching_store",
    "token_file": "matching_token_file",
    "blob_dir": "matching_blob_dir",
    "tls_certfile": "matching_tls_cert",
    "tls_keyfile": "matching_tls_key",
    "dispatch_wait": "matching_dispatch_wait",
    "sticky_wait": "matching_sticky_wait",
    "ping_interval": "matching_ping_interval",
    "peer_timeout": "matching_peer_timeout",
    "max_streams": "matching_max_streams",
    "stop_drain_timeout": "matching_stop_drain_timeout",
    "lease_seconds": "matching_lease_seconds",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``--matching-*`` flags to ``python -m otp.node``."""
    g = parser.add_argument_group(
        "matching server (apps.matching)",
        description=(
            "Several matching servers may share one PostgreSQL database (--store"
            " postgresql://USER@HOST/DB) and act as one service: start each as a distributed"
            " node with the same cookie (--name NAME@HOST --listen ADDRESS --cookie-file PATH),"
            " so a call that reaches one server for a flow another owns is forwarded to it."
            " Each server records its --listen addresses in the database and connects to the"
            " others there. Example: python -m otp.node --app apps.matching --name m1@host"
            " --listen tcp:127.0.0.1:4401 --cookie-file cookie --insecure-tcp --store"
            " postgresql://app@127.0.0.1:5432/flows --matching-listen unix:/tmp/m1.sock"
        ),
    )
    g.add_argument(
        "--matching-listen",
        action="append",
        default=None,
        metavar="ADDRESS",
        help="where workers and clients connect: unix:PATH or tcp://HOST:PORT (repeatable)",
    )
    g.add_argument(
        "--matching-store",
        "--store",
        dest="matching_store",
        default=None,
        metavar="PATH",
        help=(
            "the flow store: sqlite:PATH, PATH, :memory: or postgresql://USER@HOST/DB, which"
            " several distributed servers may share (see above)"
            f" (default {DEFAULT_STORE})"
        ),
    )
    g.add_argument(
        "--matching-token-file",
        default=None,
        metavar="PATH",
        help="a file (mode 0600) of 'worker TOKEN' and 'client TOKEN' lines",
    )
    g.add_argument(
        "--matching-blob-dir", default=None, metavar="DIR", help="the server's blob directory"
    )
    g.add_argument("--matching-tls-cert", default=None, metavar="PEM", help="TLS certificate")
    g.add_argument("--matching-tls-key", default=None, metavar="PEM", help="TLS private key")
    g.add_argument(
        "--matching-plain-tcp",
        action="store_true",
        default=None,
        help="serve TCP without TLS (a trusted network only)",
    )
    g.add_argument(
        "--matching-dispatch-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a dispatch waits for a worker (default 10)",
    )
    g.add_argument(
        "--matching-sticky-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a sticky dispatch waits for its worker (default 5)",
    )
    g.add_argument(
        "--matching-ping-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="M_PING on idle connections and streams this often (default 20)",
    )
    g.add_argument(
        "--matching-peer-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drop a peer silent this long (default 3 x ping interval)",
    )
    g.add_argument(
        "--matching-max-streams",
        type=int,
        default=None,
        metavar="N",
        help="streams registered on the node in all (default 100000)",
    )
    g.add_argument(
        "--matching-stop-drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a graceful stop waits for running calls (default 10)",
    )
    g.add_argument(
        "--matching-lease-seconds",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a flow stays this server's without a renewal (default 15)",
    )
