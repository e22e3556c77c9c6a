"""Node configuration: command-line flags and an optional ``node.toml``, flags winning."""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import logging
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

import otp
from otp._dist_config import parse_address

#: What ``python -m otp.node`` runs with no ``--app``: loaded by path, since nothing below
#: ``apps`` may import it.
DEFAULT_APPS = (
    "otp.node._demo:demo_application",
    "apps.dispatcher",
    "apps.dirty:default_application",
    "apps.matching:default_application",
)


class ConfigError(ValueError):
    """The node's configuration is invalid; the message says which setting and what to do."""


#: The node's log handler's burst limit, named as OTP's handler config names it (with the
#: ``log_`` of the node's other logging settings): a flag each (``--log-burst-limit-enable``,
#: ...) and a key each in node.toml's ``[node]``.
BURST_LIMIT_KEYS = (
    "log_burst_limit_enable",
    "log_burst_limit_max_count",
    "log_burst_limit_window_time",
)
#: The keys of node.toml's ``[node]`` table; distribution is set by flags only.
NODE_KEYS = ("apps", "log_format", "log_level", "name", *BURST_LIMIT_KEYS)


def _check_level(_inst: Any, _attr: Any, value: str) -> None:
    if not isinstance(value, str) or value.upper() not in logging.getLevelNamesMapping():
        raise ConfigError(
            f"log_level must be one of debug, info, warning, error, critical (got {value!r})"
        )


def _check_format(_inst: Any, _attr: Any, value: str) -> None:
    if value not in ("text", "json"):
        raise ConfigError(f"log_format must be text or json (got {value!r})")


#: What an error about a burst limit setting offers instead of a bad value.
_TURN_OFF = (
    "to write every record, turn the limit off with --log-burst-limit-enable false"
    " (log_burst_limit_enable = false in node.toml's [node])"
)


def check_burst_limit(key: str, value: Any, where: str | None = None) -> None:
    """Check one burst limit setting (``key``, one of :data:`BURST_LIMIT_KEYS`) as given at
    ``where`` (its flag, or ``node.KEY``; the key itself by default).

    Raises:
        ConfigError: ``enable`` is not a bool, ``max_count`` not an integer >= 1, or
            ``window_time`` not an integer number of milliseconds >= 1 (OTP's handler takes
            integers for both).
    """
    where = where or key
    if key == "log_burst_limit_enable":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false (got {value!r})")
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        if key == "log_burst_limit_max_count":
            what = "an integer >= 1 (got {!r}): how many log records a window writes"
        else:
            what = "an integer number of milliseconds >= 1 (got {!r}): the limit's window"
        raise ConfigError(f"{where} must be {what.format(value)}; {_TURN_OFF}")


def _check_burst(_inst: Any, attribute: Any, value: Any) -> None:
    check_burst_limit(attribute.name, value)


@attrs.frozen
class DistSettings:
    """Distribution as the flags asked for it: the config, plus the nodes to connect to."""

    config: otp.DistConfig
    connect: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class ObserverSettings:
    """Where the node serves its HTTP observer (``/metrics``, ``/healthz``, ``/readyz``,
    ``/api/...``): ``host`` and ``port`` (0 picks a free one).

    ``actions`` turns on its POST actions (kill a process, restart a child, scale the dirty
    pool), each needing ``token`` (read from ``--observer-token-file``; None: one is made at
    boot and printed). The token is kept out of the repr (logs print settings).
    """

    host: str
    port: int
    actions: bool = False
    token: str | None = attrs.field(default=None, repr=False)


#: The keys of node.toml's ``[observer]`` table.
OBSERVER_KEYS = ("actions", "listen", "public", "token_file")
#: The shortest token a token file may hold.
TOKEN_MIN_LENGTH = 16


def read_token_file(path: Path, where: str = "--observer-token-file") -> str:
    """The observer actions' token in ``path`` (one line; mode 0600, as a cookie file).

    Raises:
        ConfigError: it cannot be read, others may read it, or it holds fewer than
            :data:`TOKEN_MIN_LENGTH` characters.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where} {path}: cannot read it ({exc})") from exc
    if mode & 0o077:
        raise ConfigError(
            f"{where} {path}: others may read it (mode {mode & 0o777:o}): chmod 600 {path}"
        )
    if len(text) < TOKEN_MIN_LENGTH or any(c.isspace() for c in text):
        raise ConfigError(
            f"{where} {path}: the token must be one word of at least {TOKEN_MIN_LENGTH}"
            f" characters (got {len(text)}); e.g. python -c 'import secrets;"
            " print(secrets.token_urlsafe(24))' > FILE"
        )
    return text


def parse_observer(
    value: Any, *, public: bool = False, where: str = "--observer"
) -> ObserverSettings:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> :class:`ObserverSettings`.

    Raises:
        ConfigError: it is malformed, or names a host that is not loopback without ``public``
            (the observer shows everything a node runs, and has no authentication).
    """
    if not isinstance(value, str):
        raise ConfigError(f"{where} takes HOST:PORT such as 127.0.0.1:9100 (got {value!r})")
    host, sep, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(
            f"{where} takes HOST:PORT with a port from 0 (any free one) to 65535, such as"
            f" 127.0.0.1:9100 (got {value!r})"
        )
    if not public and not _is_loopback(host):
        raise ConfigError(
            f"{where} {value}: {host} is not a loopback address, and the observer shows"
            " everything the node runs without authentication: listen on 127.0.0.1 (or ::1),"
            " or pass --observer-public (public = true in [observer]) to serve it there anyway"
        )
    return ObserverSettings(host, int(port_text))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: ``--observer off`` (``listen = "off"``): no observer, also in the embedded default node.
OBSERVER_OFF = "off"
#: Where the embedded default node (no ``--app``) serves its observer: loopback, any free port.
EMBEDDED_OBSERVER = "127.0.0.1:0"


def _observer(
    args: argparse.Namespace, table: Any, path: Path | None, *, embedded: bool
) -> ObserverSettings | None:
    if not isinstance(table, dict):
        raise ConfigError(f"--config {path}: [observer] must be a table (got {table!r})")
    unknown = sorted(set(table) - set(OBSERVER_KEYS))
    if unknown:
        raise ConfigError(
            f"--config {path}: [observer] has unknown keys {unknown}; known: {list(OBSERVER_KEYS)}"
        )
    public = table.get("public", False)
    if not isinstance(public, bool):
        raise ConfigError(f"observer.public must be true or false (got {public!r})")
    if args.observer is not None:
        if args.observer == OBSERVER_OFF:
            return None
        settings = parse_observer(args.observer, public=args.observer_public or public)
    elif "listen" in table:
        if table["listen"] == OBSERVER_OFF:
            return None
        settings = parse_observer(
            table["listen"], public=args.observer_public or public, where="observer.listen"
        )
    elif embedded:  # the embedded default node shows itself unless told otherwise
        settings = parse_observer(EMBEDDED_OBSERVER)
    else:
        return None
    return _actions(args, table, settings)


def _actions(args: argparse.Namespace, table: Any, settings: ObserverSettings) -> ObserverSettings:
    actions = table.get("actions", False)
    if not isinstance(actions, bool):
        raise ConfigError(f"observer.actions must be true or false (got {actions!r})")
    token_file = table.get("token_file")
    where = "observer.token_file"
    if args.observer_token_file is not None:
        token_file, where = args.observer_token_file, "--observer-token-file"
    elif token_file is not None and not isinstance(token_file, str):
        raise ConfigError(f"observer.token_file must be a path (got {token_file!r})")
    if not (args.observer_actions or actions):
        if token_file is not None:
            raise ConfigError(
                f"{where} is given but actions are off: add --observer-actions"
                " (actions = true in [observer]) or drop the token file"
            )
        return settings
    token = None if token_file is None else read_token_file(Path(token_file), where)
    return attrs.evolve(settings, actions=True, token=token)


@attrs.frozen
class NodeConfig:
    """What a node runs.

    Attributes:
        name: The node's name (Erlang's ``name@host``).
        apps: Applications to start, in order, as ``module:attr`` paths; empty means the
            embedded default.
        log_level: The root logger's level.
        log_format: ``"text"`` (one readable line a record) or ``"json"`` (one JSON object a
            line, with the node, pid and application).
        log_burst_limit_enable: Whether the log handler drops records past a burst (OTP's
            handler ``burst_limit_enable``, true by default): past the limit it logs how many it
            dropped once the window is over.
        log_burst_limit_max_count: Records written per window, the rest dropped (OTP's
            ``burst_limit_max_count``, 500).
        log_burst_limit_window_time: The window, in milliseconds (OTP's
            ``burst_limit_window_time``, 1000).
        settings: Every other setting, by application (``[app_name]`` tables of node.toml and
            the flags applications add), for the applications to read.
        distribution: How the node talks to other nodes, if it does.
        observer: Where the node serves its HTTP observer, if it does.
    """

    name: str = "nonode@nohost"
    apps: tuple[str, ...] = ()
    log_level: str = attrs.field(default="info", validator=_check_level)
    log_format: str = attrs.field(default="text", validator=_check_format)
    log_burst_limit_enable: bool = attrs.field(default=True, validator=_check_burst)
    log_burst_limit_max_count: int = attrs.field(default=500, validator=_check_burst)
    log_burst_limit_window_time: int = attrs.field(default=1000, validator=_check_burst)
    settings: dict[str, Any] = attrs.field(factory=dict)
    distribution: DistSettings | None = None
    observer: ObserverSettings | None = None


def parser(*, add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m otp.node",
        add_help=add_help,
        description=(
            "Boot an otp-runtime node. With no --app it runs the embedded default. SIGINT or"
            " SIGTERM stops it gracefully (exit code 0); a second SIGINT stops it at once."
        ),
    )
    p.add_argument("--name", help="node name (default: nonode@nohost)")
    p.add_argument(
        "--app",
        action="append",
        default=None,
        metavar="MODULE:ATTR",
        help="an application to start (repeatable; started in order, stopped in reverse)",
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error", "critical"],
        help="logging level (default: info)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="log lines as text or as JSON objects with node, pid and application (default: text)",
    )
    p.add_argument(
        "--log-burst-limit-enable",
        choices=["true", "false"],
        help="drop log records past --log-burst-limit-max-count per window, and log how many"
        " (OTP's burst_limit_enable; default: true)",
    )
    p.add_argument(
        "--log-burst-limit-max-count",
        type=int,
        metavar="N",
        help="log records written per window before the rest are dropped (default: 500)",
    )
    p.add_argument(
        "--log-burst-limit-window-time",
        type=int,
        metavar="MS",
        help="the burst limit's window in milliseconds (default: 1000)",
    )
    p.add_argument("--config", type=Path, metavar="PATH", help="a node.toml file")
    o = p.add_argument_group("observer")
    o.add_argument(
        "--observer",
        metavar="HOST:PORT",
        help="serve /metrics (Prometheus), /healthz, /readyz and /api/snapshot, /api/tree over"
        " HTTP on a loopback address (port 0: any free one, printed at boot); the embedded"
        f" default node serves it on {EMBEDDED_OBSERVER} unless given 'off'",
    )
    o.add_argument(
        "--observer-public",
        action="store_true",
        help="allow --observer on an address that is not loopback (it has no authentication)",
    )
    o.add_argument(
        "--observer-actions",
        action="store_true",
        help="allow the observer's actions (kill a process, restart a child, scale the dirty"
        " pool), each with a token: printed at boot, or from --observer-token-file",
    )
    o.add_argument(
        "--observer-token-file",
        type=Path,
        metavar="PATH",
        help="the actions' token (one line, mode 0600) instead of one made at boot",
    )
    d = p.add_argument_group("distribution")
    d.add_argument(
        "--listen",
        action="append",
        default=None,
        metavar="ADDRESS",
        help="listen for nodes on unix:PATH or tcp:HOST:PORT (repeatable)",
    )
    d.add_argument("--cookie-file", type=Path, metavar="PATH", help="the cluster's cookie (0600)")
    d.add_argument(
        "--connect",
        action="append",
        default=None,
        metavar="NAME@ADDRESS",
        help="connect to a node at boot, e.g. b@host@unix:/tmp/b.sock (repeatable)",
    )
    d.add_argument(
        "--insecure-tcp", action="store_true", help="allow plain TCP without TLS (logged)"
    )
    d.add_argument("--tls-cert", metavar="PEM", help="this node's certificate chain")
    d.add_argument("--tls-key", metavar="PEM", help="this node's private key")
    d.add_argument("--tls-ca", metavar="PEM", help="the CA that signs every node's certificate")
    d.add_argument(
        "--liveness-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a peer that sends or reads nothing counts as gone after this long (default 60)",
    )
    defaults = otp.DistConfig(cookie=b"-" * 8)
    for setting, past_it in (
        ("busy_limit", "its senders are suspended"),
        ("queue_limit", "it counts as gone"),
    ):
        default = getattr(defaults, setting)
        d.add_argument(
            f"--dist-{setting.replace('_', '-')}",
            type=int,
            default=default,
            metavar="BYTES",
            help=f"bytes queued for one peer past which {past_it} (default {default >> 20} MiB)",
        )
    return p


def parse_connect(value: str) -> tuple[str, str]:
    """``b@host@unix:/path`` -> ("b@host", "unix:/path")."""
    for scheme in ("@unix:", "@tcp:"):
        name, sep, rest = value.partition(scheme)
        if sep and "@" in name:
            return name, scheme[1:] + rest
    raise ConfigError(
        f"--connect takes NAME@ADDRESS such as b@host@unix:/tmp/b.sock (got {value!r})"
    )


def _distribution(args: argparse.Namespace, name: str) -> DistSettings | None:
    if not args.listen and not args.connect and args.cookie_file is None:
        return None
    if args.cookie_file is None:
        raise ConfigError(
            "distribution (--listen/--connect) needs --cookie-file PATH: a file, mode 0600,"
            " holding the cluster's shared secret"
        )
    try:
        cookie = otp.read_cookie_file(args.cookie_file)
    except otp.DistributionError as exc:
        raise ConfigError(str(exc)) from exc
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        if not (args.tls_cert and args.tls_key and args.tls_ca):
            raise ConfigError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
        try:
            tls = otp.TlsConfig(args.tls_cert, args.tls_key, args.tls_ca)
        except otp.DistributionError as exc:
            raise ConfigError(f"--tls-key: {exc}") from exc
    try:
        config = otp.DistConfig(
            cookie=cookie,
            listen=tuple(args.listen or ()),
            tls=tls,
            insecure_tcp=args.insecure_tcp,
            liveness_timeout=args.liveness_timeout,
            busy_limit=args.dist_busy_limit,
            queue_limit=args.dist_queue_limit,
        )
    except otp.DistributionError as exc:
        raise ConfigError(str(exc)) from exc
    connect = tuple(parse_connect(c) for c in args.connect or ())
    for peer, address in connect:
        try:
            kind, _ = parse_address(address)
        except otp.DistributionError as exc:
            raise ConfigError(f"--connect {peer}@{address}: {exc}") from exc
        if kind == "tcp" and tls is None and not args.insecure_tcp:
            raise ConfigError(
                f"--connect {peer}@{address}: dialling over TCP needs --tls-cert, --tls-key and"
                " --tls-ca (or --insecure-tcp on a trusted network)"
            )
    if "@" not in name or name == "nonode@nohost":
        raise ConfigError(
            f"a distributed node (--listen/--connect/--cookie-file) needs a name like 'a@host'"
            f" (got {name!r}): pass --name a@host"
        )
    return DistSettings(config, connect)


def load_config(argv: list[str] | None = None) -> NodeConfig:
    """Build the configuration from ``argv`` (and the node.toml it names); flags win.

    An application module may define ``add_arguments(parser)`` to add its own flags (called
    once per module); their values reach it as ``config.settings["flags"]``.
    """
    # A first pass without --help finds the applications (from --app, else node.toml), so
    # their own flags are known to the real parse and shown in --help.
    known, _ = parser(add_help=False).parse_known_args(argv)
    data = _read_toml(known.config) if known.config is not None else {}
    node = _node_table(data.pop("node", {}), known.config)
    observer_table = data.pop("observer", {})
    apps = known.app if known.app is not None else node.get("apps", [])
    p = parser()
    _add_application_flags(p, apps or DEFAULT_APPS)
    args = p.parse_args(argv)
    data["flags"] = vars(args)
    name = args.name or node.get("name", "nonode@nohost")
    return NodeConfig(
        name=name,
        apps=tuple(apps),
        log_level=args.log_level or node.get("log_level", "info"),
        log_format=args.log_format or node.get("log_format", "text"),
        **_burst_limit(args, node),
        settings=data,
        distribution=_distribution(args, name),
        observer=_observer(args, observer_table, known.config, embedded=not apps),
    )


def _burst_limit(args: argparse.Namespace, node: dict[str, Any]) -> dict[str, Any]:
    """The burst limit settings given (a flag wins over its node.toml key), each checked where
    it was given."""
    settings: dict[str, Any] = {}
    for key in BURST_LIMIT_KEYS:
        flag = getattr(args, key)
        if flag is not None:
            value = flag == "true" if key == "log_burst_limit_enable" else flag
            where = "--" + key.replace("_", "-")
        elif key in node:
            value, where = node[key], f"node.{key}"
        else:
            continue
        check_burst_limit(key, value, where)
        settings[key] = value
    return settings


def _add_application_flags(p: argparse.ArgumentParser, apps: Sequence[str]) -> None:
    modules: dict[str, str] = {}
    for path in apps:
        # Once per module: a second add_arguments would add the same flags again (a conflict).
        modules.setdefault(path.partition(":")[0], path)
    for module_name, path in modules.items():
        add_arguments = getattr(_import_module(module_name, path), "add_arguments", None)
        if callable(add_arguments):
            add_arguments(p)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not UTF-8, as TOML must be ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from exc


def _node_table(node: Any, path: Path | None) -> dict[str, Any]:
    """node.toml's ``[node]`` table, checked (``log_level`` is checked by NodeConfig)."""
    if not isinstance(node, dict):
        raise ConfigError(
            f"--config {path}: [node] must be a table of {', '.join(NODE_KEYS)} (got {node!r})"
        )
    unknown = sorted(set(node) - set(NODE_KEYS))
    if unknown:
        raise ConfigError(
            f"--config {path}: [node] has unknown keys {unknown}; known: {list(NODE_KEYS)}"
            " (distribution is set by flags: --listen, --cookie-file, --connect, --tls-*)"
        )
    apps = node.get("apps", [])
    if not isinstance(apps, list) or not all(isinstance(a, str) for a in apps):
        raise ConfigError(f"node.apps must be a list of 'module:attr' strings (got {apps!r})")
    name = node.get("name", "nonode@nohost")
    if not isinstance(name, str):
        raise ConfigError(f"node.name must be a string such as 'a@host' (got {name!r})")
    return node


def _import_module(module_name: str, path: str) -> Any:
    # importlib raises ValueError or TypeError (not ImportError) for these.
    if not module_name or module_name.startswith("."):
        raise ConfigError(
            f"an application is named as 'module:attr' with an absolute module name (got {path!r})"
        )
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc


def load_object(path: str) -> Any:
    """Import ``module:attr`` (attr may be dotted) and return the object.

    Raises:
        ConfigError: the path is malformed, the module cannot be imported or lacks the attribute.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"an application is named as 'module:attr' (got {path!r})")
    obj: Any = _import_module(module_name, path)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj
