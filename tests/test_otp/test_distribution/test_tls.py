"""Distribution over TLS: nodes talk over verified TLS and refuse what they cannot verify."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp

from ..peer import COOKIE, PeerNode
from .helpers import B, _hello


@pytest.fixture
def cluster_certificates(tmp_path: Path) -> Callable[..., otp.TlsConfig]:
    trustme = pytest.importorskip("trustme")
    cluster_ca = trustme.CA()

    def make(name: str, ca: Any = None, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Any:
        ca = ca or cluster_ca
        cert = ca.issue_cert(*hosts)
        cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
        (tmp_path / f"{name}.key").chmod(0o600)
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.pem"))
        cluster_ca.cert_pem.write_to_path(str(tmp_path / f"{name}-ca.pem"))
        return otp.TlsConfig(
            str(tmp_path / f"{name}.pem"),
            str(tmp_path / f"{name}.key"),
            str(tmp_path / f"{name}-ca.pem"),
        )

    make.new_ca = trustme.CA  # type: ignore[attr-defined]
    return make


@pytest.mark.parametrize("server", ["signed by another CA", "issued for another host"])
async def test_a_tls_node_refuses_to_talk_to_a_server_it_cannot_verify(
    cluster_certificates: Any, server: str
) -> None:
    from test_otp.peer import PeerNode

    if server == "signed by another CA":
        tls = cluster_certificates("b", ca=cluster_certificates.new_ca())
    else:
        tls = cluster_certificates("b", hosts=("elsewhere.example",))
    async with PeerNode(B, "tcp:127.0.0.1:0", cookie=COOKIE, tls=tls) as peer:
        [b_address] = peer.listening
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(
                otp.DistConfig(cookie=COOKIE, tls=cluster_certificates("a"))
            )
            with trio.fail_after(10):
                assert await otp.connect(B, b_address) is False
            assert otp.nodes() == []


@pytest.fixture
def certificates(tmp_path: Path) -> Any:
    """Make TLS configs: ``certificates("a")`` signed by the cluster's CA, or by ``ca``."""
    trustme = pytest.importorskip("trustme")
    cluster_ca = trustme.CA()

    def make(name: str, ca: Any = cluster_ca) -> otp.TlsConfig:
        cert = ca.issue_cert("localhost", "127.0.0.1")
        cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
        (tmp_path / f"{name}.key").chmod(0o600)
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.pem"))
        ca.cert_pem.write_to_path(str(tmp_path / f"{name}-ca.pem"))
        return otp.TlsConfig(
            str(tmp_path / f"{name}.pem"),
            str(tmp_path / f"{name}.key"),
            str(tmp_path / f"{name}-ca.pem"),
        )

    make.new_ca = trustme.CA  # type: ignore[attr-defined]
    return make


async def test_nodes_talk_over_tcp_with_tls(certificates: Any) -> None:
    async with PeerNode("b@localhost", "tcp:127.0.0.1:0", tls=certificates("b")) as peer:
        [b_address] = peer.listening
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE, tls=certificates("a")))
            assert await otp.connect("b@localhost", b_address)
            assert await otp.call(("echo", "b@localhost"), "whoami") == "b@localhost"


async def test_a_plain_tcp_client_cannot_talk_to_a_tls_node(certificates: Any) -> None:
    async with PeerNode(
        "b@localhost", "tcp:127.0.0.1:0", tls=certificates("b"), handshake_timeout=1
    ) as peer:
        [b_address] = peer.listening
        port = int(b_address.rsplit(":", 1)[1])

        def plain_hello() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(_hello())
                received = b""
                try:
                    while chunk := sock.recv(65536):
                        received += chunk
                except (ConnectionResetError, TimeoutError):
                    pass
                return received

        answer = await trio.to_thread.run_sync(plain_hello)
        assert b"challenge" not in answer


async def test_a_node_with_a_certificate_from_another_ca_is_refused(
    certificates: Any, caplog: pytest.LogCaptureFixture
) -> None:
    stranger = certificates("stranger", ca=certificates.new_ca())
    async with PeerNode("b@localhost", "tcp:127.0.0.1:0", tls=certificates("b")) as peer:
        [b_address] = peer.listening
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE, tls=stranger))
            assert await otp.connect("b@localhost", b_address) is False
            assert otp.nodes() == []


def _tls_client(port: int, context: ssl.SSLContext | None) -> None:
    """Connect to the TLS port (over TLS with ``context``, or in plain text), say hello, and
    read until the node closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            sock = raw if context is None else context.wrap_socket(raw, server_hostname="localhost")
            sock.sendall(_hello())
            while sock.recv(65536):
                pass
        except (OSError, ssl.SSLError):
            pass  # refused: what the node logged is the point


@pytest.mark.parametrize(
    ("client", "reason"),
    [
        ("plain text", "TLS handshake failed: WRONG_VERSION_NUMBER"),
        ("no certificate", "TLS handshake failed: PEER_DID_NOT_RETURN_A_CERTIFICATE"),
        ("another CA", "TLS handshake failed: certificate refused: unable to get local issuer"),
    ],
)
async def test_a_refused_tls_client_is_logged_with_its_address_and_the_tls_reason(
    certificates: Any, caplog: pytest.LogCaptureFixture, client: str, reason: str
) -> None:
    node = certificates("b")
    async with PeerNode("b@localhost", "tcp:127.0.0.1:0", tls=node) as peer:
        port = int(peer.listening[0].rsplit(":", 1)[1])
        context = None
        if client != "plain text":
            context = ssl.create_default_context(cafile=node.cafile)
        if client == "another CA":
            stranger = certificates("stranger", ca=certificates.new_ca())
            assert context is not None
            context.load_cert_chain(stranger.certfile, stranger.keyfile)
        await trio.to_thread.run_sync(_tls_client, port, context)
        with trio.fail_after(5):
            while not any(reason in r.getMessage() for r in caplog.records):
                await trio.sleep(0.01)
    [record] = [r for r in caplog.records if reason in r.getMessage()]
    assert record.levelname == "WARNING"
    assert "distribution connection from tcp:127.0.0.1:" in record.getMessage()


def test_a_tls_key_file_readable_by_others_is_refused(certificates: Any, tmp_path: Path) -> None:
    node = certificates("b")
    Path(node.keyfile).chmod(0o644)
    with pytest.raises(
        otp.DistributionError, match=r"TLS key file .*b\.key has mode 0644.*chmod 600"
    ):
        otp.TlsConfig(node.certfile, node.keyfile, node.cafile)


async def test_a_tls_connection_counts_the_bytes_it_reads(certificates: Any) -> None:
    async with PeerNode("b@localhost", "tcp:127.0.0.1:0", tls=certificates("b")) as peer:
        [b_address] = peer.listening
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE, tls=certificates("a")))
            assert await otp.connect("b@localhost", b_address)
            (before,) = otp.observer.observe_connections()
            assert await otp.call(("echo", "b@localhost"), b"y" * 5000) == b"y" * 5000
            (after,) = otp.observer.observe_connections()
            assert after.bytes_received - before.bytes_received > 5000
