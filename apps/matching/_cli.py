"""``python -m apps.matching``: a small client CLI of a matching server, in the spirit of the
seed's ``dexcli``: start a flow, call its RPCs, wait for its result, describe it (with its
attempts and its dispatch history and reasons), list and cancel flows, and list the server's
queues with their streams and backlog.

The CLI has no Registry: ``start`` uses the server's ``start_known`` op (the definition a
connected worker advertised, or the one the newest flow of the type was pinned with). Output is
a human table, or JSON with ``--json``. Exit codes: 0 done, 1 the server (or the connection)
answered with a typed matching error (its code and message are printed), 2 a usage error
(bad arguments, bad JSON, no server address). Every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from ._blobs import BlobCache
from ._cli_output import description_lines, dumps, flows_lines, queues_lines, record
from ._errors import ConfigurationError, MatchingError
from ._model import FlowStatus, Registry
from ._options import ClientOptions
from ._trio_adapters import TrioClient

__all__ = ["SERVER_ENV", "main"]

#: The environment variable naming the server when ``--server`` is not given.
SERVER_ENV = "OTP_MATCHING_SERVER"

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
_PROG = "python -m apps.matching"


class UsageError(Exception):
    """A bad command line (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, not argparse's usage block
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"seconds must be finite and > 0 (got {text!r})")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an int: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {text!r})")
    return value


def _common(parser: argparse.ArgumentParser, default: Any) -> None:
    """The connection and output options, accepted before and after the command (``default``
    is ``SUPPRESS`` on the commands, so an option given before is not reset)."""
    parser.add_argument(
        "--server",
        default=default,
        metavar="ADDRESS",
        help=f"unix:PATH or tcp://HOST:PORT (default: ${SERVER_ENV})",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", default=default, help="the client bearer token")
    token.add_argument(
        "--token-file", default=default, metavar="PATH", help="read the token from this file"
    )
    parser.add_argument(
        "--tls-ca-file", default=default, metavar="PATH", help="CA file for a TLS server"
    )
    parser.add_argument(
        "--no-tls", action="store_true", default=default, help="plain TCP (no TLS) for tcp://"
    )
    parser.add_argument(
        "--call-timeout",
        type=_seconds,
        default=default,
        metavar="S",
        help="seconds each call may take (default 60)",
    )
    parser.add_argument(
        "--json", action="store_true", default=default, help="machine-readable output"
    )


def _json_arguments(parser: argparse.ArgumentParser, whose: str) -> None:
    parser.add_argument(
        "args",
        nargs="?",
        default="[]",
        metavar="ARGS_JSON",
        help=f"a JSON array of {whose} arguments (default [])",
    )


def build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top parser (the common options, then ``COMMAND ...``) and one parser per command.

    A command's arguments are parsed on their own, intermixed (``parse_intermixed_args``), so
    options may come before, between or after its positionals (``start T --json '[1]'``)."""
    subs: dict[str, argparse.ArgumentParser] = {}
    helps: list[str] = []

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = _Parser(prog=f"{_PROG} {name}", description=help)
        _common(sub, argparse.SUPPRESS)
        subs[name] = sub
        helps.append(f"  {name:<10}{help}")
        return sub

    start = command("start", "start a flow of a type the server knows (prints its flow id)")
    start.add_argument("flow_type", metavar="FLOW_TYPE")
    _json_arguments(start, "the flow's")
    start.add_argument("--id", dest="flow_id", help="the flow id (default: the server makes one)")
    start.add_argument("--wait", action="store_true", help="wait for the flow's result too")
    start.add_argument("--timeout", type=_seconds, metavar="S", help="with --wait: seconds")

    rpc = command("rpc", "call an RPC of a flow (prints its value as JSON)")
    rpc.add_argument("flow_id", metavar="FLOW_ID")
    rpc.add_argument("name", metavar="NAME")
    _json_arguments(rpc, "the RPC's")
    rpc.add_argument("--timeout", type=_seconds, metavar="S", help="seconds in all")

    result = command("result", "wait for a flow's result (prints it as JSON)")
    result.add_argument("flow_id", metavar="FLOW_ID")
    result.add_argument("--timeout", type=_seconds, metavar="S", help="seconds to wait")

    describe = command("describe", "a flow's status, state, attempts and dispatch history")
    describe.add_argument("flow_id", metavar="FLOW_ID")

    listing = command("list", "flows, newest first")
    listing.add_argument("--type", dest="flow_type", metavar="T", help="only this flow type")
    listing.add_argument(
        "--status",
        choices=[s.value for s in FlowStatus],
        metavar="S",
        help="only flows in this status (running, completed, failed, cancelled)",
    )
    listing.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="at most N flows (default 100)"
    )

    cancel = command("cancel", "cancel a flow")
    cancel.add_argument("flow_id", metavar="FLOW_ID")

    command("queues", "the server's queues: streams (idle, offered, busy), backlog, declines")

    top = _Parser(
        prog=_PROG,
        description="Start, inspect and cancel flows of a matching server; list its queues.",
        epilog="commands (COMMAND --help for its arguments):\n" + "\n".join(helps),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(top, None)
    top.add_argument("command", metavar="COMMAND", choices=list(subs))
    top.add_argument("rest", nargs=argparse.REMAINDER, metavar="...", help=argparse.SUPPRESS)
    return top, subs


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's namespace, the common options resolved.

    Raises:
        UsageError: A bad command line.
    """
    top, subs = build_parsers()
    ns = top.parse_args(argv)
    ns = subs[ns.command].parse_intermixed_args(ns.rest, namespace=ns)
    return _resolve(ns)


# -- the command line to a client ---------------------------------------------------------------


def _json_args(text: str, what: str) -> list[Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{what} is not JSON ({exc}): pass a JSON array such as '[\"world\"]'")
    if not isinstance(value, list):
        raise UsageError(
            f"{what} must be a JSON array of arguments such as '[\"world\"]' (got"
            f" {_JSON_KINDS.get(type(value), 'a value')}); wrap a single argument in [...]"
        )
    return value


_JSON_KINDS = {
    dict: "an object",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _options(ns: argparse.Namespace, environ: Mapping[str, str]) -> ClientOptions:
    address = ns.server or environ.get(SERVER_ENV)
    if not address:
        raise UsageError(
            f"no server address: pass --server unix:PATH or tcp://HOST:PORT, or set {SERVER_ENV}"
        )
    token = ns.token
    if ns.token_file is not None:
        try:
            with open(ns.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise UsageError(f"--token-file {ns.token_file}: {exc.strerror or exc}") from None
    try:
        return ClientOptions(
            server_address=address,
            credentials=token,
            tls=False if ns.no_tls else None,
            tls_ca_file=ns.tls_ca_file,
            call_timeout=ns.call_timeout if ns.call_timeout is not None else 60.0,
        )
    except ConfigurationError as exc:
        raise UsageError(exc.message) from None


def _resolve(ns: argparse.Namespace) -> argparse.Namespace:
    for key in ("server", "token", "token_file", "tls_ca_file", "call_timeout"):
        if not hasattr(ns, key):
            setattr(ns, key, None)
    for key in ("no_tls", "json"):
        setattr(ns, key, bool(getattr(ns, key, False)))
    return ns


async def _run(ns: argparse.Namespace, options: ClientOptions, out: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="matching-cli-") as blobs:
        async with TrioClient(Registry(()), BlobCache(blobs), options) as client:
            await _COMMANDS[ns.command](client, ns, out)


async def _start(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    args = _json_args(ns.args, "ARGS_JSON")
    flow_id = await client.start_known_flow(ns.flow_type, *args, flow_id=ns.flow_id)
    if not ns.wait:
        out(dumps({"flow_id": flow_id}) if ns.json else flow_id)
        return
    if not ns.json:
        out(flow_id)
    value = await client.result(flow_id, ns.timeout)
    out(dumps({"flow_id": flow_id, "result": value}) if ns.json else dumps(value))


async def _rpc(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    args = _json_args(ns.args, "ARGS_JSON")
    out(dumps(await client.call_rpc(ns.flow_id, ns.name, *args, timeout=ns.timeout)))


async def _result(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    out(dumps(await client.result(ns.flow_id, ns.timeout)))


async def _describe(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    d = await client.describe_flow(ns.flow_id)
    for line in [dumps(record(d))] if ns.json else description_lines(d):
        out(line)


async def _list(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    rows = await client.list_flows(ns.flow_type, ns.status, ns.limit)
    for line in [dumps([record(r) for r in rows])] if ns.json else flows_lines(rows):
        out(line)


async def _cancel(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    await client.cancel_flow(ns.flow_id)
    out(dumps({"flow_id": ns.flow_id, "cancelled": True}) if ns.json else f"cancelled {ns.flow_id}")


async def _queues(client: TrioClient, ns: argparse.Namespace, out: Callable[[str], None]) -> None:
    queues = await client.list_queues()
    for line in [dumps([record(q) for q in queues])] if ns.json else queues_lines(queues):
        out(line)


_COMMANDS = {
    "start": _start,
    "rpc": _rpc,
    "result": _result,
    "describe": _describe,
    "list": _list,
    "cancel": _cancel,
    "queues": _queues,
}


# -- entry point --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the CLI; returns its exit code (0 done, 1 a matching error, 2 a usage error)."""
    environ = os.environ if environ is None else environ
    try:
        ns = parse(argv)
        options = _options(ns, environ)
        if ns.command in ("start", "rpc"):
            _json_args(ns.args, "ARGS_JSON")  # before dialling: a usage error needs no server
        trio.run(_run, ns, options, print)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MatchingError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return EXIT_OK
