"""Benchmarks of the wire codecs against Gunicorn's own TLV codec and bare cbor2.

- ``wire.tlv_roundtrip``: encode + decode of a representative dirty REQUEST payload with nested
  args (version 1 TLV), against ``gunicorn.dirty.tlv.TLVEncoder`` in the same run.
- ``wire.cbor_roundtrip``: the same payload through our deterministic CBOR path, against bare
  ``cbor2.dumps``/``cbor2.loads``.
- ``wire.frames``: frames per second through the incremental ``FrameDecoder`` fed 64 KiB chunks,
  against Gunicorn's ``BinaryProtocol.decode_message`` on the same frames already split apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import cbor2

import wire
from wire import _accel

from ._harness import Benchmark, Result, best_of, timed

REQUEST: dict[str, Any] = {
    "app_path": "myapp.ml:MLApp",
    "action": "predict",
    "args": [
        "hello world",
        42,
        3.14,
        [1, 2, 3, {"nested": [True, None, b"\x00\x01\x02"]}],
    ],
    "kwargs": {
        "temperature": 0.7,
        "max_tokens": 256,
        "stop": ["\n", "END"],
        "meta": {"user": "u-123", "tags": ["a", "b"]},
    },
}


#: Which code the figures measure: wire's C fast paths run when they were built.
PATHS = (
    "C fast paths on"
    if _accel.C is not None
    else "pure Python (C fast paths off: WIRE_NO_SPEEDUPS set, or wire/_speedups not built or"
    " built from an older _speedups.c: python setup.py build_ext --inplace)"
)


def _gunicorn() -> Any:
    try:
        from gunicorn.dirty import protocol, tlv
    except ImportError:
        return None
    return tlv, protocol


def _rates(n: int, repeats: int, *bodies: Callable[[], None]) -> list[float]:
    """Operations per second of each body (each runs ``n`` operations), best of ``repeats``,
    the bodies run in turns so that load on the machine during the run affects them alike."""
    best = [float("inf")] * len(bodies)
    for _ in range(repeats):
        for i, body in enumerate(bodies):
            best[i] = min(best[i], best_of(1, lambda body=body: timed(body)))
    return [n / t for t in best]


def _loop(n: int, op: Callable[[], object]) -> Callable[[], None]:
    def body() -> None:
        for _ in range(n):
            op()

    return body


def run_tlv(quick: bool) -> list[Result]:
    n, repeats = (4_000, 2) if quick else (100_000, 5)
    encode, decode = wire.tlv_encode, wire.tlv_decode
    data = encode(REQUEST, version=1)
    assert decode(data, version=1) == REQUEST
    ours_body = _loop(n, lambda: decode(encode(REQUEST, version=1), version=1))
    g = _gunicorn()
    if g is not None:
        codec = g[0].TLVEncoder
        assert codec.encode(REQUEST) == data
        base_body = _loop(n, lambda: codec.decode_full(codec.encode(REQUEST)))
        ours, base = _rates(n, repeats, ours_body, base_body)
        baseline, notes = "gunicorn 27 TLVEncoder.encode + decode_full", "byte-identical output"
    else:
        plain = {**REQUEST, "args": REQUEST["args"][:3]}  # JSON has no bytes
        base_body = _loop(n, lambda: json.loads(json.dumps(plain)))
        ours, base = _rates(n, repeats, ours_body, base_body)
        baseline = "json.dumps + json.loads (stdlib)"
        notes = "gunicorn not installed: baseline is a stdlib json round trip, not Gunicorn"
    notes = f"{notes}; {PATHS}"
    return [Result("wire.tlv_roundtrip", "ops/s", ours, baseline, base, "higher", notes)]


def run_cbor(quick: bool) -> list[Result]:
    n, repeats = (4_000, 2) if quick else (100_000, 5)
    encode, decode = wire.cbor_encode, wire.cbor_decode
    assert decode(encode(REQUEST)) == REQUEST
    dumps, loads = cbor2.dumps, cbor2.loads
    ours, base, canonical = _rates(
        n,
        repeats,
        _loop(n, lambda: decode(encode(REQUEST))),
        _loop(n, lambda: loads(dumps(REQUEST))),
        _loop(n, lambda: loads(dumps(REQUEST, canonical=True))),
    )
    notes = (
        "ours adds deterministic encoding (shortest floats, sorted keys), OTP tags, limits and a "
        f"type check of every decoded value; bare cbor2 does none of these; {PATHS}"
    )
    return [
        Result(
            "wire.cbor_roundtrip", "ops/s", ours, "cbor2.dumps + cbor2.loads", base, "higher", notes
        ),
        Result(
            "wire.cbor_roundtrip.canonical",
            "ops/s",
            ours,
            "cbor2.dumps(canonical=True) + cbor2.loads",
            canonical,
            "higher",
            "cbor2's own canonical mode, without our checks (it sorts map keys length-first as "
            "RFC 7049 did, so maps with mixed key types can differ from RFC 8949 order)",
        ),
    ]


def run_frames(quick: bool) -> list[Result]:
    count, repeats = (8_000, 2) if quick else (200_000, 5)
    frames = [
        wire.make_response(i, {"ok": True, "value": i, "text": "x" * (i % 50)})
        for i in range(count)
    ]
    encoded = [wire.encode_frame(f) for f in frames]
    stream = b"".join(encoded)
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]

    def ours_body() -> None:
        decoder = wire.FrameDecoder()
        got = 0
        for chunk in chunks:
            got += len(decoder.feed(chunk))
        assert got == count

    g = _gunicorn()
    if g is not None:
        decode_message = g[1].BinaryProtocol.decode_message

        def base_body() -> None:
            for e in encoded:
                decode_message(e)

        ours, base = _rates(count, repeats, ours_body, base_body)
        baseline = "gunicorn 27 BinaryProtocol.decode_message, frames pre-split"
        notes = "64 KiB chunks for ours; the baseline is handed whole frames (no buffering)"
    else:

        def base_body() -> None:
            for e in encoded:
                wire.tlv_decode(e[16:], version=1)

        ours, base = _rates(count, repeats, ours_body, base_body)
        baseline = "wire.tlv_decode on pre-split payloads"
        notes = "gunicorn not installed: baseline is our own payload decoder without framing"
    notes = f"{notes}; {PATHS}"
    return [Result("wire.frames", "frames/s", ours, baseline, base, "higher", notes)]


BENCHMARKS: list[Benchmark] = [
    Benchmark("wire.tlv_roundtrip", run_tlv),
    Benchmark("wire.cbor_roundtrip", run_cbor),
    Benchmark("wire.frames", run_frames),
]
