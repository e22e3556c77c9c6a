"""Edges of the distributed-node layer against OTP 25 (and the node's documented contract) that
the other tests do not cover: the ``python -m otp.node`` command line, Unix-socket listening,
the handshake and liveness on trio's virtual clock, node()/nodes()/connect/disconnect/
monitor_node corner cases, TLS refusals and process groups across three nodes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_otp.peer import raw_peer

import otp
import wire

ROOT = Path(__file__).resolve().parents[2]
COOKIE = b"edge-test-cookie-0123456789"
B = "b@localhost"
C = "c@localhost"
X = "x@localhost"


# -- helpers ---------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


#: A node with a small app, quiet unless something goes wrong.
_NODE = (
    sys.executable, "-m", "otp.node", "--log-level", "warning",
    "--app", "test_node.node_apps:second",
)  # fmt: skip


def _node_cli(*args: str, timeout: float = 4.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m otp.node`` with a small app; a node that should refuse its flags but
    boots instead is killed after ``timeout`` (and the test fails)."""
    argv = [*_NODE, *args]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the node booted instead of refusing {args}: {exc.stdout!r}"
        ) from None


@pytest.fixture
def cookie_file(tmp_path: Path) -> Path:
    path = tmp_path / "cookie"
    path.write_bytes(COOKIE)
    path.chmod(0o600)
    return path


async def _listening(address: str, **config: Any) -> list[str]:
    config["listen"] = (address,)
    return await otp.start_distribution(otp.DistConfig(cookie=COOKIE, **config))


def _raw_peer(
    path: Path, name: str = X, expected: str = B
) -> contextlib.AbstractAsyncContextManager[tuple[trio.SocketStream, wire.FrameStream]]:
    return raw_peer(path, COOKIE, name, expected)


async def _read_until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    try:
        while chunk := await stream.receive_some(65536):
            received += chunk
    except trio.BrokenResourceError:
        pass
    return received


async def _still_serves(path: Path) -> None:
    """A fresh peer passes the handshake with the node at ``path`` and gets its first frame."""
    async with _raw_peer(path, name="probe@localhost") as (_, frames):
        with trio.fail_after(5):
            assert await frames.receive_frame() is not None


def _hello_header(length: int) -> bytes:
    frame = wire.Handshake(X, (2,), (wire.Codec.TLV,), 0, {"challenge": b"c" * 32})
    encoded = wire.encode_frame(frame.to_frame())
    return encoded[:4] + struct.pack(">I", length) + encoded[8:16]


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "args", "error"),
    [
        ("missing cookie file", ["--cookie-file", "{tmp}/nope"], "cannot read it"),
        ("empty cookie file", ["--cookie-file", "{tmp}/empty"], "is empty"),
        ("short cookie", ["--cookie-file", "{tmp}/short"], "at least 8 bytes"),
        ("connect without an address", ["--connect", "b@localhost"], "--connect takes"),
        ("connect without a host", ["--connect", "b@unix:/tmp/b.sock"], "--connect takes"),
        ("partial TLS flags", ["--tls-cert", "x.pem"], "needs all of"),
        ("no cookie file", ["--cookie-file", None], "needs --cookie-file"),
        pytest.param(
            "bad --listen syntax",
            ["--listen", "nonsense"],
            "an address is",
        ),
        pytest.param(
            "plain tcp without --insecure-tcp",
            ["--listen", "tcp:127.0.0.1:0"],
            "needs TLS certificates",
        ),
        pytest.param(
            "bad --connect address",
            ["--connect", "b@localhost@tcp:127.0.0.1:notaport"],
            "an address is",
        ),
        pytest.param(
            "a cookie file that is a directory",
            ["--cookie-file", "{tmp}/cookiedir"],
            "cookie file",
        ),
        pytest.param(
            "a negative liveness timeout",
            ["--liveness-timeout", "-1"],
            "liveness",
        ),
        pytest.param(
            "a TLS key file readable by others",
            ["--tls-cert", "{tmp}/c.pem", "--tls-key", "{tmp}/open.key", "--tls-ca", "{tmp}/c.pem"],
            "open.key has mode 0644",
        ),
        pytest.param(
            "a queue limit below the busy limit",
            ["--dist-busy-limit", "4096", "--dist-queue-limit", "1024"],
            "queue_limit",
        ),
    ],
)
def test_bad_distribution_flags_are_a_clear_error_with_exit_code_2(
    tmp_path: Path, cookie_file: Path, case: str, args: list[Any], error: str
) -> None:
    (tmp_path / "empty").write_bytes(b"\n")
    (tmp_path / "empty").chmod(0o600)
    (tmp_path / "short").write_bytes(b"abc")
    (tmp_path / "short").chmod(0o600)
    (tmp_path / "open.key").write_bytes(b"a key")
    (tmp_path / "open.key").chmod(0o644)
    (tmp_path / "cookiedir").mkdir(mode=0o700)
    (tmp_path / "cookiedir").chmod(0o700)
    flags = {
        "--name": "a@localhost",
        "--listen": f"unix:{tmp_path}/a.sock",
        "--cookie-file": str(cookie_file),
    }
    extra: list[str] = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in flags:
            if value is None:
                del flags[flag]
            else:
                flags[flag] = value.format(tmp=tmp_path)
        else:
            extra += [flag, value.format(tmp=tmp_path)]
    argv = [item for pair in flags.items() for item in pair] + extra
    result = _node_cli(*argv)
    assert result.returncode == 2, (case, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("python -m otp.node: ")
    assert error in result.stderr


def test_listening_without_a_node_name_is_a_clear_error(tmp_path: Path, cookie_file: Path) -> None:
    result = _node_cli("--listen", f"unix:{tmp_path}/a.sock", "--cookie-file", str(cookie_file))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "name like 'a@host'" in result.stderr


async def test_the_cli_node_on_insecure_tcp_warns_and_prints_its_real_port(
    cookie_file: Path,
) -> None:
    argv = [
        *_NODE,
        "--name",
        "a@localhost",
        "--listen",
        "tcp:127.0.0.1:0",
        "--insecure-tcp",
        "--cookie-file",
        str(cookie_file),
    ]
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT
    )
    assert process.stdout is not None
    output = b""
    try:
        with trio.fail_after(20):
            while b"stop with Ctrl-C" not in output:
                chunk = await process.stdout.receive_some(65536)
                assert chunk, output
                output += chunk
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
    text = output.decode()
    assert "WARNING" in text and "plain TCP" in text
    [listening] = [line for line in text.splitlines() if "listening on" in line]
    port = int(listening.rsplit(":", 1)[1])
    assert port > 0


# -- Unix sockets ---------------------------------------------------------------------------------


async def test_a_stale_socket_file_of_a_dead_node_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "b.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a SIGKILLed node leaves
    assert path.is_socket()
    async with otp.open_node(B):
        await _listening(f"unix:{path}")
        assert path.stat().st_mode & 0o777 == 0o600
        await _still_serves(path)


async def test_a_live_nodes_socket_is_not_stolen(tmp_path: Path) -> None:
    from test_otp.peer import PeerNode

    path = tmp_path / "b.sock"
    async with PeerNode(B, f"unix:{path}", cookie=COOKIE):
        async with otp.open_node(C):
            with pytest.raises((otp.DistributionError, OSError)):
                await _listening(f"unix:{path}")
            # Whoever answers at the address is still b.
            await _still_serves(path)


# -- the handshake and liveness, on trio's virtual clock -----------------------------------------


async def test_a_peer_that_stalls_mid_handshake_is_dropped_and_the_node_keeps_serving(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening(f"unix:{path}", handshake_timeout=5)
        stream = await trio.open_unix_socket(str(path))
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        hello = wire.Handshake(X, (2,), (wire.Codec.TLV,), 1, {"challenge": b"c" * 32})
        await frames.send_frame(hello.to_frame())
        answer = await frames.receive_frame()
        assert answer is not None and answer.type is wire.MessageType.HANDSHAKE
        start = trio.current_time()
        with trio.fail_after(60):
            await _read_until_closed(stream)  # we never send the proof
        assert 5 <= trio.current_time() - start <= 6
        await stream.aclose()
        assert otp.nodes() == []
        await _still_serves(path)
    assert _logged(caplog, "handshake timed out")


async def test_an_oversized_handshake_frame_is_refused_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening(f"unix:{path}", handshake_timeout=30)
        stream = await trio.open_unix_socket(str(path))
        await stream.send_all(_hello_header(8 * 1024 * 1024) + b"\0" * 1024)
        start = trio.current_time()
        with trio.fail_after(60):
            await _read_until_closed(stream)
        await stream.aclose()
        assert trio.current_time() - start < 1
        await _still_serves(path)
    assert not _logged(caplog, "handshake timed out")


async def test_a_peer_claiming_this_nodes_own_name_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening(f"unix:{path}")
        with pytest.raises(Exception):  # noqa: B017 - closed during the handshake, any way
            async with _raw_peer(path, name=B) as (_, frames):
                await frames.receive_frame()
        assert otp.nodes() == []
        await _still_serves(path)
    assert _logged(caplog, "claims this node's own name")


async def test_a_silent_peer_is_declared_down_between_1_and_1_25_liveness_timeouts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening(f"unix:{path}", liveness_timeout=8)
        async with _raw_peer(path) as (_, frames):
            assert await frames.receive_frame() is not None  # b counts us as up
            last_heard = trio.current_time()
            assert otp.nodes() == [X]
            otp.monitor_node(X)
            with trio.fail_after(100):
                assert await otp.receive(otp.NodeDown) == otp.NodeDown(X)
            assert 8 <= trio.current_time() - last_heard <= 10
            assert otp.nodes() == []


async def test_a_peer_that_only_answers_pings_stays_connected(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening(f"unix:{path}", liveness_timeout=8)
        async with _raw_peer(path) as (stream, frames):
            # b's first frame: b counts us as up (our handshake ends with our proof, which b
            # may not have read yet, and monitor_node of a node not up is a NodeDown at once).
            assert await frames.receive_frame() is not None
            pongs = 0

            async def answer_pings(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                nonlocal pongs
                task_status.started()
                async for frame in frames:
                    if frame.type is wire.MessageType.PING:
                        await stream.send_all(
                            wire.encode_message(wire.MessageType.PONG, None, codec=wire.Codec.TLV)
                        )
                        pongs += 1

            async with trio.open_nursery() as nursery:
                await nursery.start(answer_pings)
                otp.monitor_node(X)
                # Ten liveness timeouts of virtual time with nothing but pongs from us.
                assert await otp.receive(otp.NodeDown, timeout=80, default=None) is None
                assert otp.nodes() == [X]
                assert pongs >= 20
                nursery.cancel_scope.cancel()
            # Now silent: down within 1.25 timeouts.
            start = trio.current_time()
            with trio.fail_after(100):
                assert await otp.receive(otp.NodeDown) == otp.NodeDown(X)
            assert trio.current_time() - start <= 10


async def test_connecting_to_a_listener_that_never_answers_returns_false_and_calls_fail(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    mute = tmp_path / "mute.sock"
    accepted: list[trio.SocketStream] = []
    listener_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener_sock.bind(str(mute))
    listener_sock.listen(16)
    listener = trio.SocketListener(listener_sock)

    async def hold() -> None:
        while True:
            accepted.append(await listener.accept())

    async with otp.open_node("a@localhost"), trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await _listening(f"unix:{tmp_path}/a.sock", handshake_timeout=3)
        start = trio.current_time()
        assert await otp.connect(B, f"unix:{mute}") is False
        assert 3 <= trio.current_time() - start <= 4
        assert otp.nodes() == []
        with pytest.raises(otp.CallError) as info:
            await otp.call(("echo", B), "x", timeout=60)
        assert info.value.reason == otp.NOCONNECTION
        assert not isinstance(info.value, otp.CallTimeout)
        assert len(accepted) == 2  # the call dialled again
        nursery.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    await listener.aclose()


async def test_connecting_to_a_refused_tcp_port_returns_false(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens there
    async with otp.open_node("a@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE, insecure_tcp=True))
        assert await otp.connect(B, f"tcp:127.0.0.1:{port}") is False
        assert otp.nodes() == []
        ref = otp.monitor(("echo", B))
        assert await otp.receive(otp.Down, timeout=10) == otp.Down(
            ref, ("echo", B), otp.NOCONNECTION
        )


# -- node(), nodes(), connect, disconnect, monitor_node ------------------------------------------


async def test_node_name_nodes_and_disconnect_of_self_or_unknown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node("a@localhost"):
        assert otp.nodes() == []  # not distributed yet
        await _listening(f"unix:{tmp_path}/a.sock")
        assert otp.node_name() == "a@localhost"
        assert otp.nodes() == []  # never lists itself
        assert otp.disconnect("a@localhost") is False  # net_kernel: disconnect(node()) -> false
        assert otp.disconnect("ghost@localhost") is False


async def test_connecting_to_this_node_itself_is_true(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node("a@localhost"):
        await _listening(f"unix:{tmp_path}/a.sock")
        assert await otp.connect("a@localhost") is True
        assert otp.nodes() == []


async def test_monitoring_this_node_itself_delivers_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node("a@localhost"):
        await _listening(f"unix:{tmp_path}/a.sock")
        otp.monitor_node("a@localhost")
        assert await otp.receive(otp.NodeDown, timeout=5, default=None) is None


async def test_after_disconnect_returns_nodes_no_longer_lists_the_node(tmp_path: Path) -> None:
    from test_otp.peer import PeerNode

    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode(B, address, cookie=COOKIE), otp.open_node("a@localhost"):
        await _listening(f"unix:{tmp_path}/a.sock")
        assert await otp.connect(B, address)
        assert otp.disconnect(B) is True
        assert otp.nodes() == []


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture
def certificates(tmp_path: Path) -> Callable[..., otp.TlsConfig]:
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
    certificates: Any, server: str
) -> None:
    from test_otp.peer import PeerNode

    if server == "signed by another CA":
        tls = certificates("b", ca=certificates.new_ca())
    else:
        tls = certificates("b", hosts=("elsewhere.example",))
    async with PeerNode(B, "tcp:127.0.0.1:0", cookie=COOKIE, tls=tls) as peer:
        [b_address] = peer.listening
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE, tls=certificates("a")))
            with trio.fail_after(10):
                assert await otp.connect(B, b_address) is False
            assert otp.nodes() == []


# -- process groups -------------------------------------------------------------------------------


class PgAgent(otp.GenServer):
    """On a peer: makes members join and leave, reads its node's view, and forwards every
    pg scope event to a subscriber."""

    def init(self) -> otp.Ok:
        return otp.Ok({})

    def handle_call(self, request: Any, from_: otp.From, members: dict[Any, otp.Pid]) -> Any:
        match request:
            case ("join", key, group):
                pid = otp.spawn(_pg_member, group)
                members[key] = pid
                return otp.Reply(pid, members)
            case ("exit", key):
                otp.send(members.pop(key), "exit")
                return otp.Reply("ok", members)
            case ("members", group):
                return otp.Reply(sorted(otp.pg.get_members(group), key=repr), members)
            case ("subscribe", to):
                otp.spawn(_pg_forwarder, to)
                return otp.Reply("ok", members)
        return otp.Reply(("unknown", request), members)


async def _pg_member(group: Any) -> None:
    otp.pg.join(group if group != "self-named" else ("owner", otp.self()))
    await otp.receive(lambda m: m == "exit")


async def _pg_forwarder(to: otp.Pid) -> None:
    _, groups = otp.pg.monitor_scope()
    otp.send(to, ("scope", otp.node_name(), "groups", groups))
    while True:
        event = await otp.receive()
        kind = "join" if isinstance(event, otp.pg.PgJoin) else "leave"
        otp.send(to, ("scope", otp.node_name(), kind, event.group, list(event.pids)))


async def _with_agent() -> None:
    await PgAgent.start(name="pg_agent")


async def _with_agent_and_a_member() -> None:
    await PgAgent.start(name="pg_agent")
    await otp.call("pg_agent", ("join", "early", "svc"))


async def _agent(node: str, *request: Any) -> Any:
    return await otp.call(("pg_agent", node), request, timeout=5)


async def _scope_event(node: str, kind: str, pid: otp.Pid) -> tuple[Any, ...]:
    """The next event forwarded from ``node``'s scope monitor of ``kind`` naming ``pid``."""
    with trio.fail_after(5):
        event: tuple[Any, ...] = await otp.receive(
            lambda m: isinstance(m, tuple) and m[:3] == ("scope", node, kind) and pid in m[4]
        )
    return event


async def _scope_sees(node: str, *pids: otp.Pid) -> None:
    """Wait until ``node``'s scope monitor showed every one of ``pids`` as a member (in its
    first snapshot of the groups, or in joins)."""
    missing = set(pids)
    with trio.fail_after(5):
        while missing:
            event = await otp.receive(
                lambda m: (
                    isinstance(m, tuple) and m[:2] == ("scope", node) and m[2] in ("groups", "join")
                )
            )
            if event[2] == "groups":
                missing.difference_update(p for members in event[3].values() for p in members)
            else:
                missing.difference_update(event[4])


async def test_pg_join_and_leave_of_several_pids_and_of_a_pid_not_joined() -> None:
    async with otp.open_node():

        async def idle() -> None:
            await otp.receive()

        p, q, r = otp.spawn(idle), otp.spawn(idle), otp.spawn(idle)
        ref, _ = otp.pg.monitor("g")
        otp.pg.join("g", [p, q, p])
        assert await otp.receive(otp.pg.PgJoin) == otp.pg.PgJoin(ref, "g", (p, q, p))
        assert sorted(otp.pg.get_members("g"), key=repr) == sorted([p, p, q], key=repr)
        assert otp.pg.leave("g", r) is False  # pg: not_joined
        assert otp.pg.leave("other", p) is False
        assert await otp.receive(otp.pg.PgLeave, timeout=0, default=None) is None
        assert otp.pg.leave("g", [p, r]) is True  # one membership of p; r ignored
        assert await otp.receive(otp.pg.PgLeave) == otp.pg.PgLeave(ref, "g", (p,))
        assert sorted(otp.pg.get_members("g"), key=repr) == sorted([p, q], key=repr)
        otp.exit(p, otp.KILL)
        assert await otp.receive(otp.pg.PgLeave) == otp.pg.PgLeave(ref, "g", (p,))
        assert otp.pg.get_members("g") == [q]
        with pytest.raises(otp.BadArg):
            otp.pg.join("g", otp.Pid._make("ghost@localhost", 1, 1))
        assert otp.pg.get_members("g") == [q]


async def test_pg_converges_across_three_nodes_with_a_late_joiner_and_a_node_that_dies(
    tmp_path: Path,
) -> None:
    from test_otp.peer import PeerNode

    b_addr, c_addr = f"unix:{tmp_path}/b.sock", f"unix:{tmp_path}/c.sock"
    c_node = PeerNode(C, c_addr, cookie=COOKIE, setup=_with_agent_and_a_member)
    async with PeerNode(B, b_addr, cookie=COOKIE, setup=_with_agent), c_node:
        async with otp.open_node("a@localhost"):
            await _listening(f"unix:{tmp_path}/a.sock")
            ref, _ = otp.pg.monitor_scope()
            otp.pg.join("svc")
            me = otp.self()
            assert await otp.connect(B, b_addr)
            await _agent(B, "subscribe", me)
            b1 = await _agent(B, "join", "b1", "svc")
            await _scope_event(B, "join", b1)
            with trio.fail_after(5):
                await otp.receive(lambda m: isinstance(m, otp.pg.PgJoin) and b1 in m.pids)
            # c already has a member when it connects; it joins a, and b learns of c only
            # through the mesh.
            assert await otp.connect(C, c_addr)
            [c1] = [p for p in await _agent(C, "members", "svc") if p.node == C]
            await _agent(C, "subscribe", me)
            with trio.fail_after(5):
                await otp.receive(
                    lambda m: isinstance(m, otp.pg.PgJoin) and m.ref == ref and c1 in m.pids
                )
            await _scope_sees(B, c1)
            await _scope_sees(C, b1, me)
            everyone = sorted([me, b1, c1], key=repr)
            assert sorted(otp.pg.get_members("svc"), key=repr) == everyone
            assert await _agent(B, "members", "svc") == everyone
            assert await _agent(C, "members", "svc") == everyone
            # A member leaves by exiting: gone everywhere.
            await _agent(B, "exit", "b1")
            with trio.fail_after(5):
                leave = await otp.receive(lambda m: isinstance(m, otp.pg.PgLeave))
            assert leave == otp.pg.PgLeave(ref, "svc", (b1,))
            await _scope_event(C, "leave", b1)
            assert await _agent(C, "members", "svc") == sorted([me, c1], key=repr)
            # c dies: its member is removed on a and on b.
            c_node.stop()
            with trio.fail_after(5):
                leave = await otp.receive(lambda m: isinstance(m, otp.pg.PgLeave))
            assert leave == otp.pg.PgLeave(ref, "svc", (c1,))
            await _scope_event(B, "leave", c1)
            assert otp.pg.get_members("svc") == [me]
            assert await _agent(B, "members", "svc") == [me]


async def test_pg_a_group_named_by_a_term_holding_a_pid_is_one_group_on_every_node(
    tmp_path: Path,
) -> None:
    from test_otp.peer import PeerNode

    b_addr = f"unix:{tmp_path}/b.sock"
    async with PeerNode(B, b_addr, cookie=COOKIE, setup=_with_agent):
        async with otp.open_node("a@localhost"):
            await _listening(f"unix:{tmp_path}/a.sock")
            assert await otp.connect(B, b_addr)
            ref, _ = otp.pg.monitor_scope()
            member = await _agent(B, "join", "m", "self-named")
            with trio.fail_after(5):
                join = await otp.receive(otp.pg.PgJoin)
            assert join == otp.pg.PgJoin(ref, ("owner", member), (member,))
            assert otp.pg.get_members(("owner", member)) == [member]
