"""Distribution over TLS: nodes talk over verified TLS and refuse what they cannot verify."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp

from ..peer import COOKIE
from .helpers import B


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
