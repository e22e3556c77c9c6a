"""A peer that sends garbage, a wrong version, an oversized frame or nothing at all is dropped
with a logged reason and costs nothing else; TLS and its refusal of strangers."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otp
import wire

from .peer import COOKIE, PeerNode


def _exchange(path: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the node closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


def _hello(version: int = 2) -> bytes:
    frame = wire.Handshake(
        "x@localhost", (version,), (wire.Codec.TLV,), 0, {"challenge": b"c" * 32}
    )
    return wire.encode_frame(frame.to_frame())


async def _node_is_healthy(peer_address: str, expected_processes: int) -> None:
    async with otp.open_node("probe@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
        assert await otp.connect("b@localhost", peer_address)
        # Its main process, the echo server and our connection: nothing left of the bad peers.
        assert await otp.call(("echo", "b@localhost"), "process_count") == expected_processes


@pytest.mark.parametrize(
    ("name", "data", "logged"),
    [
        ("garbage", b"\x00garbage that is not a frame at all" * 3, "malformed input"),
        ("wrong version", _hello(version=1).replace(b"GD\x02", b"GD\x01", 1), "malformed input"),
        ("unsupported protocol", _hello(version=7), "speaks versions [7]"),
        ("oversized", b"GD\x02\x20" + struct.pack(">IQ", 0xFFFFFFFF, 0), "malformed input"),
        ("nothing", b"", "handshake timed out"),
    ],
)
async def test_a_bad_peer_is_dropped_and_costs_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, data: bytes, logged: str
) -> None:
    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode("b@localhost", address, handshake_timeout=0.3):
        answer = await trio.to_thread.run_sync(_exchange, str(tmp_path / "b.sock"), data)
        assert b"challenge" not in answer or name == "unsupported protocol"
        await _node_is_healthy(address, expected_processes=3)
    assert any(logged in record.getMessage() for record in caplog.records), name


def test_random_and_mutated_frames_never_hurt_a_listening_node(tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/b.sock"
    path = str(tmp_path / "b.sock")
    hello = _hello()

    mutated = st.tuples(
        st.integers(0, len(hello) - 1), st.integers(0, 255), st.integers(1, len(hello))
    ).map(lambda m: (hello[: m[0]] + bytes([m[1]]) + hello[m[0] + 1 :])[: m[2]])
    inputs = st.one_of(st.binary(min_size=1, max_size=256), mutated)

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(inputs)
    def one_peer(data: bytes) -> None:
        _exchange(path, data)

    async def scenario() -> None:
        async with PeerNode("b@localhost", address, handshake_timeout=0.1):
            await trio.to_thread.run_sync(one_peer)
            await _node_is_healthy(address, expected_processes=3)

    trio.run(scenario)


@pytest.fixture
def certificates(tmp_path: Path) -> Any:
    """Make TLS configs: ``certificates("a")`` signed by the cluster's CA, or by ``ca``."""
    trustme = pytest.importorskip("trustme")
    cluster_ca = trustme.CA()

    def make(name: str, ca: Any = cluster_ca) -> otp.TlsConfig:
        cert = ca.issue_cert("localhost", "127.0.0.1")
        cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
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


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("garbage", b"\x00garbage that is not a frame at all"),
        ("a dirty-protocol frame", wire.encode_frame(wire.Frame(wire.MessageType.STATUS, 1))),
        ("a bad SEND payload", wire.encode_message(wire.MessageType.SEND, {"msg": 1})),
        (
            "a batch whose msgs is no list",
            wire.encode_message(
                wire.MessageType.SEND_BATCH, {"to": wire.Pid("b@localhost", 1, 1), "msgs": 5}
            ),
        ),
    ],
)
async def test_a_connected_peer_that_turns_to_garbage_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, data: bytes
) -> None:
    from otp._dist_handshake import initiate

    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode("b@localhost", address):
        stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        peer = await initiate(
            frames,
            name="x@localhost",
            creation=1,
            cookie=COOKIE,
            codecs=(wire.Codec.TLV,),
            listen=(),
            expected="b@localhost",
        )
        assert peer.name == "b@localhost"
        await stream.send_all(data)
        with trio.fail_after(5):
            while await stream.receive_some(65536):
                pass  # the node closes the connection
        await stream.aclose()
        await _node_is_healthy(address, expected_processes=3)
    assert any("dropped: malformed input" in record.getMessage() for record in caplog.records), name


async def test_a_connected_peer_that_falls_silent_is_dropped_after_the_liveness_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from otp._dist_handshake import initiate

    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode("b@localhost", address, liveness_timeout=0.4):
        stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        await initiate(
            frames,
            name="x@localhost",
            creation=1,
            cookie=COOKIE,
            codecs=(wire.Codec.TLV,),
            listen=(),
            expected="b@localhost",
        )
        start = trio.current_time()
        pings = 0
        with trio.fail_after(10):
            # The node pings us (we never answer) and then gives up on us.
            async for frame in frames:
                pings += frame.type is wire.MessageType.PING
        assert trio.current_time() - start >= 0.4
        assert pings >= 2
        await stream.aclose()
        await _node_is_healthy(address, expected_processes=3)
    assert any("sent nothing for 0.4 s" in record.getMessage() for record in caplog.records)
