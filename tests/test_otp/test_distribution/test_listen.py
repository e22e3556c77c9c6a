"""Listening for other nodes: Unix socket files (their mode, a stale file of a dead node, a live
node's socket), TCP that needs TLS or ``insecure_tcp``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import otp

from ..peer import COOKIE
from .helpers import B, C, _listening_at, _still_serves


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
