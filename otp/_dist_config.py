"""Distribution's configuration: how a node takes part (:class:`DistConfig`), the TLS
certificates of its TCP connections (:class:`TlsConfig`), its cookie file and the addresses it
listens on and dials (Erlang's ``-setcookie``, ``-proto_dist``, ``inet_tls_dist`` options).

Every setting is checked when it is made, so a bad one fails where it is written (a CLI flag, a
node.toml), not later inside the running node.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path
from typing import Any

import attrs

import wire

from ._errors import OtpError


class DistributionError(OtpError, RuntimeError):
    """Distribution cannot start or a node cannot be reached; the message says what to do."""


def _check_keyfile(_inst: Any, _attr: Any, value: str) -> None:
    _owner_only(Path(value), "TLS key file")


@attrs.frozen
class TlsConfig:
    """Certificates for distribution over TCP; both sides verify each other (mutual TLS).

    Attributes:
        certfile: This node's certificate chain (PEM).
        keyfile: Its private key (PEM), readable by its owner only (mode 0600 or 0400), as
            the cookie file.
        cafile: The CA that signs every node's certificate.
        server_hostname: The name peers' certificates are checked against (default: the host
            part of the address dialled).
    """

    certfile: str
    keyfile: str = attrs.field(validator=_check_keyfile)
    cafile: str
    server_hostname: str | None = None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.cafile)
        context.load_cert_chain(self.certfile, self.keyfile)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cafile)
        context.load_cert_chain(self.certfile, self.keyfile)
        return context


def _check_cookie(_inst: Any, _attr: Any, value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) < 8:
        raise DistributionError(
            "DistConfig.cookie must be at least 8 bytes: every node of a cluster shares it"
        )


@attrs.frozen
class DistConfig:
    """How a node takes part in distribution.

    Attributes:
        cookie: The shared secret (never sent; proven by HMAC).
        listen: Addresses to listen on: ``"unix:/path"`` or ``"tcp:host:port"``.
        tls: Certificates for TCP; required for TCP unless ``insecure_tcp``.
        insecure_tcp: Allow plain TCP (logged as a warning: the cookie alone is no security).
        liveness_timeout: Seconds without any frame from a peer before its connection counts as
            lost (noticed within 1.25 times this, as Erlang's ``net_ticktime``); pings every
            quarter of it keep an idle connection alive.
        handshake_timeout: Seconds a peer has to finish the handshake.
        codecs: Payload codecs this node speaks, most preferred first.
        mesh: Connect to the nodes peers know about (a full mesh, as Erlang's ``global``).
        limits: Decoding limits for frames from peers.
        busy_limit: Bytes waiting to be written to one peer past which the connection is busy
            (Erlang's ``dist_buf_busy_limit``, ``+zdbbl``): a process that sends to it then is
            suspended at its next receive or remote call until half of that is written.
        queue_limit: Bytes waiting for one peer past which its connection counts as lost
            (``noconnection``), for senders that never wait in a receive.
        mesh_max_nodes: Most nodes this node learns of from its peers' lists (the rest of
            a longer list is ignored, with a warning).
        mesh_dial_rate: Most dials a second to nodes learnt from peers' lists.
        hidden: This node is hidden (Erlang's ``-hidden``; a remote observer): its connections
            are in no node list, peer list or process group on either side (hidden nodes).
    """

    cookie: bytes = attrs.field(validator=_check_cookie, repr=False)
    listen: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    tls: TlsConfig | None = None
    insecure_tcp: bool = False
    liveness_timeout: float = 60.0
    handshake_timeout: float = 5.0
    codecs: tuple[wire.Codec, ...] = (wire.Codec.TLV, wire.Codec.CBOR)
    mesh: bool = True
    limits: wire.Limits = attrs.field(factory=lambda: wire.Limits(max_payload=64 * 1024 * 1024))
    busy_limit: int = 1024 * 1024
    queue_limit: int = 64 * 1024 * 1024
    mesh_max_nodes: int = 256
    mesh_dial_rate: float = 10.0
    hidden: bool = False  # hidden nodes (observer-remote)

    def __attrs_post_init__(self) -> None:
        # Checked now, so a bad setting fails where it is made (the CLI's flags, a config),
        # not later inside the running node.
        for name in ("liveness_timeout", "handshake_timeout", "mesh_dial_rate"):
            seconds = getattr(self, name)
            if not seconds > 0:
                raise DistributionError(f"DistConfig.{name} must be above 0 (got {seconds!r})")
        for name in ("busy_limit", "queue_limit", "mesh_max_nodes"):
            size = getattr(self, name)
            if type(size) is not int or size < 1:
                raise DistributionError(f"DistConfig.{name} is a number of bytes (got {size!r})")
        if self.queue_limit < self.busy_limit:
            raise DistributionError(
                f"DistConfig.queue_limit ({self.queue_limit}) must be at least busy_limit"
                f" ({self.busy_limit}): senders are suspended at busy_limit, before the queue"
                " is dropped at queue_limit"
            )
        for address in self.listen:
            kind, _ = parse_address(address)
            if kind == "tcp" and self.tls is None and not self.insecure_tcp:
                raise DistributionError(
                    f"listening on {address} needs TLS certificates (DistConfig.tls, --tls-cert"
                    " --tls-key --tls-ca); plain TCP only with insecure_tcp=True (--insecure-tcp)"
                )


def read_cookie_file(path: str | os.PathLike[str]) -> bytes:
    """The cookie in ``path``, which must be readable by its owner only (mode 0600 or 0400).

    Raises:
        DistributionError: the file is missing, empty, or readable by group or others.
    """
    p = Path(path)
    _owner_only(p, "cookie file")
    try:
        cookie = p.read_bytes().strip()
    except OSError as exc:
        raise DistributionError(f"cookie file {p}: cannot read it ({exc})") from exc
    if not cookie:
        raise DistributionError(f"cookie file {p} is empty: write a long random secret into it")
    return cookie


def _owner_only(p: Path, what: str) -> None:
    """Refuse a secret's file that group or others may read (or that cannot be read)."""
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise DistributionError(f"{what} {p}: cannot read it ({exc})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DistributionError(
            f"{what} {p} has mode {stat.S_IMODE(mode):04o}: it must be readable by its owner"
            f" only; run: chmod 600 {p}"
        )


def parse_address(address: str) -> tuple[str, Any]:
    """``"unix:/path"`` -> ("unix", path); ``"tcp:host:port"`` -> ("tcp", (host, port))."""
    kind, sep, rest = address.partition(":")
    if kind == "unix" and sep and rest:
        return "unix", rest
    if kind == "tcp" and sep:
        host, sep2, port = rest.rpartition(":")
        if sep2 and host and port.isdigit():
            return "tcp", (host.strip("[]"), int(port))
    raise DistributionError(
        f"an address is 'unix:/path/to/socket' or 'tcp:host:port' (got {address!r})"
    )
