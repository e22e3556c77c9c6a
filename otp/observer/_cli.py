"""The command line of ``python -m otp.observer``: attach to a running node as a hidden node and
show it, as a refreshing table of its busiest processes (``--top``) or through the web observer
served here (``--observer HOST:PORT``) with the remote node's data.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import trio

from .._dist_config import DistributionError, TlsConfig, read_cookie_file
from .._node import open_node
from ._remote import (
    BAD_COOKIE,
    LOST,
    NO_AGENT,
    REFUSED,
    UNREACHABLE,
    WRONG_NODE,
    AttachError,
    RemoteNode,
    attach,
    observer_name,
)
from ._top import SORTS, render, top

#: Exit codes: bad arguments or files (as argparse's own usage errors), and each way an attach
#: or a session fails.
EXIT_USAGE = 2
EXIT_CODES = {
    UNREACHABLE: 3,
    BAD_COOKIE: 4,
    WRONG_NODE: 5,
    NO_AGENT: 6,
    REFUSED: 6,
    LOST: 7,
}

#: ``serve_web(remote, listen, out)``: serve the web observer on ``listen`` (``HOST:PORT``)
#: with ``remote``'s data until cancelled (``otp.node.serve_remote_observer``).
ServeWeb = Callable[[RemoteNode, str, TextIO], Awaitable[None]]

CLEAR = "\x1b[H\x1b[2J"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m otp.observer",
        description="Attach to a running node over distribution (as a hidden node: it joins"
        " no mesh and no process groups) and show it.",
    )
    p.add_argument("--node", required=True, metavar="NAME@HOST", help="the node to attach to")
    p.add_argument(
        "--connect",
        required=True,
        metavar="ADDRESS",
        help="where it listens: unix:PATH or tcp:HOST:PORT",
    )
    p.add_argument(
        "--cookie-file", required=True, metavar="PATH", help="the cluster's cookie (mode 0600)"
    )
    p.add_argument("--insecure-tcp", action="store_true", help="dial plain TCP without TLS")
    p.add_argument("--tls-cert", metavar="PEM", help="this observer's certificate chain")
    p.add_argument("--tls-key", metavar="PEM", help="its private key")
    p.add_argument("--tls-ca", metavar="PEM", help="the CA that signs every node's certificate")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="for the handshake and each request (default 10)",
    )
    t = p.add_argument_group("--top: the busiest processes (as etop)")
    t.add_argument("--top", action="store_true", help="print a refreshing table of processes")
    t.add_argument(
        "--sort", choices=sorted(SORTS), default="rate", help="sort by (default: rate, msgs/s)"
    )
    t.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="between samples (default 1)",
    )
    t.add_argument(
        "--count", type=int, default=20, metavar="N", help="processes shown (default 20)"
    )
    t.add_argument(
        "--once",
        action="store_true",
        help="print one table and exit (the default when stdout is no terminal)",
    )
    w = p.add_argument_group("web observer (without --top)")
    w.add_argument(
        "--observer",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where to serve it (default: loopback, a free port, printed)",
    )
    return p


def main(
    argv: list[str] | None = None,
    *,
    serve_web: ServeWeb | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run the command line; returns the exit code (see :data:`EXIT_CODES`)."""
    args = parser().parse_args(argv)
    try:
        cookie = read_cookie_file(args.cookie_file)
        tls = _tls(args)
    except DistributionError as exc:
        print(f"python -m otp.observer: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for name, value, least in (("--interval", args.interval, 0.0), ("--timeout", args.timeout, 0)):
        if not value > least:
            print(f"python -m otp.observer: {name} must be above 0 (got {value})", file=sys.stderr)
            return EXIT_USAGE
    if args.count < 1:
        print(
            f"python -m otp.observer: --count must be at least 1 (got {args.count})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not args.top and serve_web is None:
        print("python -m otp.observer: no web observer here; use --top", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        return trio.run(_run, args, cookie, tls, serve_web, out)
    except AttachError as exc:
        print(f"python -m otp.observer: {exc}", file=sys.stderr)
        return EXIT_CODES[exc.kind]
    except DistributionError as exc:
        print(f"python -m otp.observer: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0


def _tls(args: argparse.Namespace) -> TlsConfig | None:
    given = (args.tls_cert, args.tls_key, args.tls_ca)
    if not any(given):
        return None
    if not all(given):
        raise DistributionError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
    return TlsConfig(args.tls_cert, args.tls_key, args.tls_ca)


async def _run(
    args: argparse.Namespace,
    cookie: bytes,
    tls: TlsConfig | None,
    serve_web: ServeWeb | None,
    out: TextIO,
) -> int:
    async with open_node(observer_name(args.node)):
        remote = await attach(
            args.node,
            args.connect,
            cookie,
            tls=tls,
            insecure_tcp=args.insecure_tcp,
            timeout=args.timeout,
        )
        if args.top:
            once = args.once or not out.isatty()
            await run_top(remote, out, args.sort, args.count, args.interval, once=once)
        else:
            assert serve_web is not None
            await serve_web(remote, args.observer, out)
    return 0


async def run_top(
    remote: RemoteNode,
    out: TextIO,
    sort: str,
    count: int,
    interval: float,
    *,
    once: bool,
) -> None:
    """Print the table every ``interval`` seconds (clearing the terminal), or once."""
    before: dict[str, Any] = await remote.processes()
    while True:
        await trio.sleep(interval)
        after = await remote.processes()
        table = top(before, after, sort=sort, count=count)
        width = 1000 if once else shutil.get_terminal_size().columns
        out.write(("" if once else CLEAR) + render(table, width) + "\n")
        out.flush()
        if once:
            return
        before = after
