"""A peer that sends garbage, a wrong version, an oversized frame or nothing at all is dropped
with a logged reason and costs nothing else; TLS and its refusal of strangers."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otp
import wire

from .peer import COOKIE, PeerNode, raw_peer


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
        # Its main process, net_kernel, the echo server and our connection: nothing left of the
        # bad peers.
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
        await _node_is_healthy(address, expected_processes=4)
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
            await _node_is_healthy(address, expected_processes=4)

    trio.run(scenario)


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
        await _node_is_healthy(address, expected_processes=4)
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
        await _node_is_healthy(address, expected_processes=4)
    assert any("sent nothing for 0.4 s" in record.getMessage() for record in caplog.records)


def _frame(mtype: wire.MessageType, payload: Any) -> bytes:
    return wire.encode_message(mtype, payload, codec=wire.Codec.TLV)


@contextlib.asynccontextmanager
async def _b_with_x(tmp_path: Path, **config: Any) -> AsyncIterator[trio.SocketStream]:
    """Node b (this test's node, its main process registered as "inbox") listening at
    ``tmp_path/b.sock``, and a connection to it made by hand as node x."""
    async with otp.open_node("b@localhost"):
        otp.register("inbox", otp.self())
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/b.sock",), **config)
        )
        async with raw_peer(tmp_path / "b.sock", COOKIE, "x@localhost", "b@localhost") as (
            stream,
            _,
        ):
            yield stream


async def test_monitors_and_links_whose_ids_collide_cost_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # A peer picks the ids in the refs and pids it sends: 2,000 MONITORs whose refs share one id
    # (and LINKs from pids sharing one) must not turn the target's tables into one hash bucket.
    from otp._ids import Pid, Ref

    compared = 0
    for cls in (Pid, Ref):
        plain_eq = cls.__eq__

        def counting(self: Any, other: object, _eq: Any = plain_eq) -> bool:
            nonlocal compared
            compared += 1
            return bool(_eq(self, other))

        monkeypatch.setattr(cls, "__eq__", counting)
    n = 2000
    async with _b_with_x(tmp_path) as stream:
        me = wire.Pid("b@localhost", otp.self().id, otp.self().creation)
        data = b"".join(
            _frame(
                wire.MessageType.MONITOR,
                {"from": wire.Pid("x@localhost", 1, 1), "to": me, "ref": wire.Ref("x", 7, i)},
            )
            + _frame(wire.MessageType.LINK, {"from": wire.Pid("x@localhost", 7, i), "to": me})
            for i in range(n)
        )
        await stream.send_all(data + _frame(wire.MessageType.REG_SEND, _marker()))
        assert await otp.receive(timeout=30) == "done"
        info = otp.process_info(otp.self())
        assert info is not None
        assert len(info.monitored_by) == n and len(info.links) == n
    # About a comparison per entry at most (the old id-only hash made ~n*n/2 = 2,000,000).
    assert compared < 4 * n, compared


def _marker() -> dict[str, Any]:
    return {"from": wire.Pid("x@localhost", 1, 1), "to": "inbox", "msg": "done"}


async def test_a_monitor_or_link_for_a_third_nodes_process_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # What x plants for a process of c would outlive x's connection (only x's own processes'
    # are dropped with it): the frame is refused with the connection, as ERTS does.
    async with otp.open_node("b@localhost"):
        otp.register("inbox", otp.self())
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/b.sock",))
        )
        me = wire.Pid("b@localhost", otp.self().id, otp.self().creation)
        third = wire.Pid("c@localhost", 5, 1)
        for frame in (
            _frame(wire.MessageType.MONITOR, {"from": third, "to": me, "ref": wire.Ref("c", 1, 1)}),
            _frame(wire.MessageType.LINK, {"from": third, "to": me}),
        ):
            async with raw_peer(tmp_path / "b.sock", COOKIE, "x@localhost", "b@localhost") as (
                stream,
                _,
            ):
                await stream.send_all(frame)
                with trio.fail_after(5):
                    while await stream.receive_some(65536):
                        pass  # the node closes the connection
            with trio.fail_after(5):
                while otp.nodes():
                    await trio.sleep(0.01)
            info = otp.process_info(otp.self())
            assert info is not None
            assert info.monitored_by == () and info.links == ()
    assert any("no process of that node" in r.getMessage() for r in caplog.records)


# -- bounded memory toward a peer that does not read ---------------------------------------------


def _rss() -> int:
    """This OS process's resident memory now, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _pings(stream: trio.SocketStream, every: float) -> None:
    """Keep telling the node we are alive, reading nothing of what it sends."""
    ping = _frame(wire.MessageType.PING, None)
    while True:
        await stream.send_all(ping)
        await trio.sleep(every)


async def _send_to_a_peer_that_reads_nothing(
    tmp_path: Path, yield_: Any, **config: Any
) -> tuple[list[int], int, otp.Down]:
    """Send 50,000 x 1 KiB to ("sink", x) from a process that awaits ``yield_()`` every 16
    sends, while x pings and reads nothing; returns the sends done when the connection was
    lost, the RSS growth at its peak, and the Down of a monitor across the connection."""
    n = 50_000
    payload = b"x" * 1024
    sent: list[int] = [0]
    peak = [0]
    async with _b_with_x(tmp_path, liveness_timeout=4, **config) as stream:
        with trio.fail_after(5):
            while "x@localhost" not in otp.nodes():
                await trio.sleep(0.01)
        ref = otp.monitor(("sink", "x@localhost"))
        base = _rss()

        async def sender() -> None:
            for i in range(n):
                otp.send(("sink", "x@localhost"), payload)
                sent[0] += 1
                if i % 16 == 15:
                    await yield_()
                if i % 500 == 0:
                    peak[0] = max(peak[0], _rss() - base)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pings, stream, 0.5)
            otp.spawn(sender)
            with trio.fail_after(60):
                down = await otp.receive(otp.Down)
            sent_then = sent[0]
            nursery.cancel_scope.cancel()
    assert down.ref == ref
    return [sent_then], peak[0], down


async def test_a_sender_to_a_peer_that_reads_nothing_is_suspended_and_the_peer_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # Past busy_limit (1 MiB) the sender is suspended at its next receive, as Erlang's
    # busy_dist_port suspends it; a peer that keeps pinging but reads nothing for the
    # liveness timeout is dropped, with noconnection for what crosses the connection.
    async def receive() -> None:
        await otp.receive(timeout=0, default=None)

    [sent], peak, down = await _send_to_a_peer_that_reads_nothing(tmp_path, receive)
    assert down.reason == otp.NOCONNECTION
    assert sent < 3000  # 1 MiB and what the socket buffers (50,000 if never suspended)
    assert peak < 20 * 1024 * 1024, peak
    assert any("read nothing for 4" in r.getMessage() for r in caplog.records)


async def test_a_sender_that_never_receives_is_bounded_by_queue_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # A sender that only yields to trio (no receive to be suspended in) cannot be held back:
    # past queue_limit the connection counts as lost, rather than the queue growing.
    [sent], peak, down = await _send_to_a_peer_that_reads_nothing(
        tmp_path, trio.lowlevel.checkpoint, queue_limit=4 * 1024 * 1024
    )
    assert down.reason == otp.NOCONNECTION
    assert sent < 6000
    assert peak < 20 * 1024 * 1024, peak
    assert any("queue_limit" in r.getMessage() for r in caplog.records)


async def test_a_peer_that_floods_pings_and_reads_nothing_costs_no_memory(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Each PING was answered by a PONG queued behind the ones the peer never read.
    n = 600_000
    async with _b_with_x(tmp_path) as stream:
        flood = _frame(wire.MessageType.PING, None) * n
        base = _rss()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                stream.send_all, flood + _frame(wire.MessageType.REG_SEND, _marker())
            )
            with trio.fail_after(120):
                assert await otp.receive() == "done"
        grown = _rss() - base
        assert otp.nodes() == ["x@localhost"]
    assert grown < 12 * 1024 * 1024, grown  # 600,000 queued PONGs held 38 MB


async def test_a_peer_that_floods_requests_and_reads_no_answer_is_dropped_at_queue_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # Each MONITOR of a dead process is answered by a DOWN: the answers of a peer that reads
    # none of them stop at queue_limit, with the connection.
    n = 200_000
    async with _b_with_x(tmp_path, busy_limit=256 * 1024, queue_limit=1024 * 1024) as stream:
        ghost = wire.Pid("b@localhost", 999_999, otp.self().creation)
        flood = b"".join(
            _frame(
                wire.MessageType.MONITOR,
                {"from": wire.Pid("x@localhost", 1, 1), "to": ghost, "ref": wire.Ref("x", i, 1)},
            )
            for i in range(n)
        )
        base = _rss()
        with trio.move_on_after(60):
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(flood)  # until the node drops us
        grown = _rss() - base
        assert otp.nodes() == []
    assert grown < 12 * 1024 * 1024, grown  # 200,000 queued DOWNs held 35 MB, connected
    assert any("queue_limit" in r.getMessage() for r in caplog.records)


# -- names, and the lists of nodes peers tell -----------------------------------------------------


@pytest.mark.parametrize(
    "name", ["x\n2026-01-01 ERROR forged@localhost", "x@local host", "@localhost", "x" * 300]
)
async def test_a_peer_whose_name_is_no_node_name_is_refused_at_the_handshake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    async with PeerNode("b@localhost", f"unix:{tmp_path}/b.sock"):
        hello = wire.Handshake(name, (2,), (wire.Codec.TLV,), 0, {"challenge": b"c" * 32})
        data = wire.encode_frame(hello.to_frame())
        answer = await trio.to_thread.run_sync(_exchange, str(tmp_path / "b.sock"), data)
        assert b"challenge" not in answer
    [refusal] = [r.getMessage() for r in caplog.records if "no node name" in r.getMessage()]
    assert "\n" not in refusal


async def test_a_peers_list_is_capped_and_dialled_at_a_bounded_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="otp.dist")
    nodes = {f"n{i}@localhost": f"unix:{tmp_path}/n{i}.sock" for i in range(5000)}
    nodes["evil\n@localhost"] = f"unix:{tmp_path}/evil.sock"
    nodes["m@localhost"] = f"unix:{tmp_path}/m\n.sock"

    def dials() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith("distribution connection to ")
        ]

    async with _b_with_x(tmp_path) as stream:
        peers = {"from": wire.Pid("x@localhost", 0, 1), "to": wire.Atom("$net_kernel")}
        await stream.send_all(_frame(wire.MessageType.REG_SEND, {**peers, "msg": ("peers", nodes)}))
        await trio.sleep(1.0)
        assert 1 <= len(dials()) <= 11  # mesh_dial_rate=10 a second
        await trio.sleep(600)
        dialled = dials()
        assert len(dialled) == 256  # mesh_max_nodes
        assert not any("evil" in d or "\n" in d for d in dialled)
    assert any("mesh_max_nodes=256" in r.getMessage() for r in caplog.records)


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
