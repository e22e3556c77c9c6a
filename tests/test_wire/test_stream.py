"""FrameStream over trio streams."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import wire


async def test_send_and_receive_over_a_socket_pair() -> None:
    a, b = trio.socket.socketpair()
    left = wire.FrameStream(trio.SocketStream(a))
    right = wire.FrameStream(trio.SocketStream(b))
    frames = [wire.make_request(i, "m:A", "echo", [i]) for i in range(50)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_frames, frames)
        got = [await right.receive_frame() for _ in frames]
    assert got == frames
    await left.aclose()
    assert await right.receive_frame() is None
    await right.aclose()


async def test_send_frames_is_one_write() -> None:
    writes = 0

    async def count() -> None:
        nonlocal writes
        writes += 1

    send = trio.testing.MemorySendStream(send_all_hook=count)
    stream = wire.FrameStream(trio.StapledStream(send, trio.testing.MemoryReceiveStream()))
    frames = [wire.Ping(1).to_frame(), wire.Pong(1).to_frame(), wire.make_end(3)]
    await stream.send_frames(frames)
    assert writes == 1
    data = send.get_data_nowait()
    assert data == b"".join(wire.encode_frame(f) for f in frames)


async def test_clean_eof_returns_none_and_eof_mid_frame_raises() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    stream = wire.FrameStream(trio.StapledStream(trio.testing.MemorySendStream(), receive))
    await send.send_all(wire.encode_frame(wire.make_end(1)) + b"GD\x01")
    await send.aclose()
    assert await stream.receive_frame() == wire.make_end(1)
    with pytest.raises(wire.Truncated, match="ended inside a frame"):
        await stream.receive_frame()


async def test_async_iteration_ends_at_eof() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    stream = wire.FrameStream(trio.StapledStream(trio.testing.MemorySendStream(), receive))
    await send.send_all(wire.encode_frame(wire.make_end(1)) * 3)
    await send.aclose()
    assert [f.request_id async for f in stream] == [1, 1, 1]


async def test_connection_codec_overrides_frame_codec() -> None:
    send = trio.testing.MemorySendStream()
    stream = wire.FrameStream(
        trio.StapledStream(send, trio.testing.MemoryReceiveStream()), codec=wire.Codec.CBOR
    )
    await stream.send_frame(wire.Send(wire.Pid("a", 1), "hi").to_frame())
    (frame,) = wire.FrameDecoder().feed(send.get_data_nowait())
    assert frame.codec is wire.Codec.CBOR
    assert wire.parse_dist(frame) == wire.Send(wire.Pid("a", 1), "hi")


async def test_encoding_error_writes_nothing() -> None:
    send = trio.testing.MemorySendStream()
    stream = wire.FrameStream(trio.StapledStream(send, trio.testing.MemoryReceiveStream()))
    bad = wire.make_response(2, {1, 2})
    with pytest.raises(wire.UnknownValueType):
        await stream.send_frames([wire.make_end(1), bad])
    with pytest.raises(trio.WouldBlock):  # nothing was written
        send.get_data_nowait()


async def test_error_after_good_frames_surfaces_without_more_data() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    stream = wire.FrameStream(trio.StapledStream(trio.testing.MemorySendStream(), receive))
    await send.send_all(wire.encode_frame(wire.make_end(1)) + b"XX" + bytes(14))
    assert await stream.receive_frame() == wire.make_end(1)
    with pytest.raises(wire.BadMagic):
        await stream.receive_frame()  # the peer sent nothing more: no hang


async def test_limits_changed_between_frames_apply_to_the_next_frame() -> None:
    a, b = trio.socket.socketpair()
    left = wire.FrameStream(trio.SocketStream(a))
    right = wire.FrameStream(trio.SocketStream(b), limits=wire.Limits(max_payload=1000))
    big = wire.make_request(2, "m:A", "echo", ["x" * 5000])
    await left.send_frame(wire.make_request(1, "m:A", "echo", [1]))
    assert (await right.receive_frame()) == wire.make_request(1, "m:A", "echo", [1])
    right.limits = wire.Limits()  # (as a node does once a peer has proved the cookie)
    assert right.limits == wire.Limits()
    await left.send_frame(big)
    assert await right.receive_frame() == big
    right.limits = wire.Limits(max_payload=1000)
    await left.send_frame(big)
    with pytest.raises(wire.WireError):
        await right.receive_frame()
    await left.aclose()
    await right.aclose()


async def test_a_receive_cancelled_mid_frame_loses_no_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    stream = wire.FrameStream(trio.StapledStream(trio.testing.MemorySendStream(), receive))
    first = wire.make_response(7, "x" * 100)
    data = wire.encode_frame(first) + wire.encode_frame(wire.make_end(7))
    await send.send_all(data[:10])  # a partial header
    with trio.move_on_after(1):
        await stream.receive_frame()
    assert stream._decoder.buffered == 10
    await send.send_all(data[10:60])  # the header and part of the payload
    with trio.move_on_after(1):
        await stream.receive_frame()
    await send.send_all(data[60:])
    await send.aclose()
    assert await stream.receive_frame() == first
    assert await stream.receive_frame() == wire.make_end(7)
    assert await stream.receive_frame() is None


async def test_a_socket_closed_while_a_receive_waits_raises_closed_resource() -> None:
    # A plain socket is read straight from its descriptor: closing it from another task
    # still ends the waiting receive as SocketStream's own receive_some does.
    a, b = trio.socket.socketpair()
    stream = wire.FrameStream(trio.SocketStream(b))
    raised: list[BaseException] = []

    async def receive() -> None:
        try:
            await stream.receive_frames()
        except trio.ClosedResourceError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        await stream.aclose()
    assert len(raised) == 1
    with pytest.raises(trio.ClosedResourceError):
        await stream.receive_frame()  # (and so does a receive after it)
    a.close()


async def test_a_socket_reset_by_its_peer_raises_broken_resource() -> None:
    import socket
    import struct

    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = trio.socket.socket()
    await client.connect(listener.getsockname())
    server, _ = await listener.accept()
    stream = wire.FrameStream(trio.SocketStream(server))
    # Unread data at close plus SO_LINGER 0: the kernel sends RST, not FIN.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.send(b"GD")
    await trio.testing.wait_all_tasks_blocked()
    client.close()
    with pytest.raises((trio.BrokenResourceError, wire.WireError)):
        while True:
            assert await stream.receive_frames() != []
    await stream.aclose()
    listener.close()


async def test_frames_a_socket_already_holds_are_read_without_waiting_for_more() -> None:
    a, b = trio.socket.socketpair()
    left = wire.FrameStream(trio.SocketStream(a))
    right = wire.FrameStream(trio.SocketStream(b))
    frames = [wire.make_request(i, "m:A", "echo", [i]) for i in range(3)]
    await left.send_frames(frames)
    with trio.fail_after(5):
        assert await right.receive_frames() == frames
    await left.aclose()
    assert await right.receive_frames() == []
    await right.aclose()
