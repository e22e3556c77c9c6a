"""``python -m wire``: the socket-sniffing tool."""

from __future__ import annotations

import json
import subprocess
import sys

import wire


def _run(args: list[str], data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "wire", *args], input=data, capture_output=True, timeout=60
    )


FRAMES = [
    wire.make_request(1, "m:A", "echo", ["hi", b"\x00\xff", 1.5, 2**62], {"k": None}),
    wire.make_end(1),
    wire.Send(wire.Pid("a@h", 3, 1), (wire.Atom("ok"), 2**80, {1: "x"})).to_frame(wire.Codec.CBOR),
    wire.Down(
        wire.Pid("b@h", 1),
        wire.Pid("a@h", 3),
        wire.Ref("a@h", 9),
        wire.ExitReason("crash", wire.ErrorValue("E", "m", {}, "tb")),
    ).to_frame(),
]


def test_decode_prints_one_json_line_per_frame() -> None:
    result = _run(["decode"], b"".join(wire.encode_frame(f) for f in FRAMES))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert [wire.frame_from_json(json.loads(line)) for line in lines] == FRAMES
    assert json.loads(lines[0])["payload"]["args"][1] == {"$bytes": "AP8="}


def test_encode_then_decode_hex_round_trips() -> None:
    jsonl = "".join(json.dumps(wire.frame_to_json(f)) + "\n" for f in FRAMES).encode()
    encoded = _run(["encode"], jsonl)
    assert encoded.returncode == 0, encoded.stderr
    assert encoded.stdout == b"".join(wire.encode_frame(f) for f in FRAMES)
    hexed = _run(["encode", "--hex"], jsonl)
    decoded = _run(["decode", "--hex"], hexed.stdout)
    assert decoded.stdout.decode() == jsonl.decode()


def test_malformed_input_exits_1_with_the_error_after_the_good_frames() -> None:
    data = wire.encode_frame(wire.make_end(1)) + b"GD\x09\x05" + bytes(12)
    result = _run(["decode"], data)
    assert result.returncode == 1
    assert len(result.stdout.splitlines()) == 1
    assert b"UnsupportedVersion: unsupported protocol version 9" in result.stderr
    assert b"(at byte 18)" in result.stderr


def test_encode_names_the_bad_line() -> None:
    result = _run(["encode"], b'{"type": "END"}\n{"type": "NOPE"}\n')
    assert result.returncode == 1
    assert b"line 2" in result.stderr or b"NOPE" in result.stderr
