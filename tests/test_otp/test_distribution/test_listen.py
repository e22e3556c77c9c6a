"""Listening for other nodes: Unix socket files (their mode, a stale file of a dead node, a live
node's socket), TCP that needs TLS or ``insecure_tcp``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

import otp

from ..peer import COOKIE, PeerNode
from .helpers import B, C, _distributed, _listening_at, _still_serves


async def test_a_stale_socket_file_of_a_dead_node_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "b.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a SIGKILLed node leaves
    assert path.is_socket()
    async with otp.open_node(B):
        await _listening_at(f"unix:{path}")
        assert path.stat().st_mode & 0o777 == 0o600
        await _still_serves(path)


async def test_a_live_nodes_socket_is_not_stolen(tmp_path: Path) -> None:
    from test_otp.peer import PeerNode

    path = tmp_path / "b.sock"
    async with PeerNode(B, f"unix:{path}", cookie=COOKIE):
        async with otp.open_node(C):
            with pytest.raises((otp.DistributionError, OSError)):
                await _listening_at(f"unix:{path}")
            # Whoever answers at the address is still b.
            await _still_serves(path)


async def test_unix_sockets_are_created_mode_0600(sockets: Any, tmp_path: Path) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert (tmp_path / "a.sock").stat().st_mode & 0o777 == 0o600


async def test_tcp_without_tls_needs_insecure_tcp() -> None:
    async with otp.open_node("a@localhost"):
        with pytest.raises(otp.DistributionError, match="needs TLS certificates"):
            await _distributed("a", "tcp:127.0.0.1:0")


async def test_a_clean_stop_removes_the_unix_socket_file(sockets: Any, tmp_path: Path) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert (tmp_path / "a.sock").is_socket()
    assert not (tmp_path / "a.sock").exists()


async def test_plain_tcp_with_insecure_tcp_logs_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with PeerNode("b@localhost", "tcp:127.0.0.1:0", insecure_tcp=True) as peer:
        [b_address] = peer.listening
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE, insecure_tcp=True))
            assert await otp.connect("b@localhost", b_address)
            assert await otp.call(("echo", "b@localhost"), "whoami") == "b@localhost"
    assert any("plain TCP" in r.getMessage() for r in caplog.records)
