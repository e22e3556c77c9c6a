"""The codecs' limits (max_payload, max_items, max_bigint_bytes, ...): what an encoder writes
under some limits a decoder with the same limits accepts, and what exceeds one is a typed
LimitExceeded, never a MemoryError."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import wire


def test_bignums_are_bounded_by_max_bigint_bytes_not_max_str() -> None:
    limits = wire.Limits(max_str=1000, max_bigint_bytes=2000)
    value = 1 << (8 * 1500)  # a 1,501-byte magnitude
    assert wire.tlv_decode(wire.tlv_encode(value, limits=limits), limits=limits) == value
    data = wire.cbor_encode(value, limits=limits)  # accepted by the encoder
    assert wire.cbor_decode(data, limits=limits) == value


def test_cbor_encoder_counts_items_inside_map_keys_toward_max_total_items() -> None:
    limits = wire.Limits(max_total_items=100)
    value = {(i, i): 0 for i in range(30)}  # 1 + 30 * 2 pairs + 30 * 2 key items = 121
    with pytest.raises(wire.LimitExceeded, match="max_total_items=100"):
        wire.tlv_encode(value, limits=limits)
    with pytest.raises(wire.LimitExceeded, match="max_total_items=100"):
        wire.cbor_decode(wire.cbor_encode(value), limits=limits)
    with pytest.raises(wire.LimitExceeded, match="max_total_items=100"):
        wire.cbor_encode(value, limits=limits)


def _ok(fn: Callable[[], object]) -> bool:
    try:
        fn()
    except wire.LimitExceeded:
        return False
    return True


@pytest.mark.parametrize(
    ("value", "max_items"),
    [
        (wire.Pid("n@h", 1, 1), 2),
        (wire.ExitReason("crash", None), 1),
        (wire.ErrorValue("E", "m", {}, ""), 3),
    ],
)
def test_cbor_encoder_and_decoder_agree_on_max_items_for_wire_types(
    value: Any, max_items: int
) -> None:
    limits = wire.Limits(max_items=max_items)
    data = wire.cbor_encode(value)
    assert _ok(lambda: wire.cbor_encode(value, limits=limits)) == _ok(
        lambda: wire.cbor_decode(data, limits=limits)
    )


def test_an_oversized_payload_is_limit_exceeded_not_memory_error() -> None:
    # 8 MiB in memory, 1 GiB encoded: the limit is 64 MiB, the address space 256 MiB more than
    # the process already has.
    script = textwrap.dedent(
        """
        import resource
        import wire

        def vmsize():
            for line in open("/proc/self/status"):
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

        blob = b"x" * (8 << 20)
        value = [blob] * 128
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (vmsize() + (256 << 20), hard))
        for encode in (
            lambda: wire.encode_frame(wire.make_response(1, value)),
            lambda: wire.encode_message(
                wire.MessageType.SEND, {"msg": value}, codec=wire.Codec.CBOR
            ),
        ):
            try:
                encode()
                print("encoded")
            except wire.LimitExceeded:
                print("LimitExceeded")
            except MemoryError:
                print("MemoryError")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["LimitExceeded", "LimitExceeded"]


def _decode(data: bytes, codec: wire.Codec) -> Any:
    return wire.tlv_decode(data) if codec is wire.Codec.TLV else wire.cbor_decode(data)


@pytest.mark.parametrize("codec", [wire.Codec.TLV, wire.Codec.CBOR])
@pytest.mark.parametrize(
    "value",
    [b"x" * 200, "y" * 200, ["z" * 2000], {"k": b"\x00" * 5000}, [1.5] * 40],
)
def test_value_encoders_refuse_what_exceeds_max_payload_on_every_path(
    codec: wire.Codec, value: Any
) -> None:
    limits = wire.Limits(max_payload=100)
    with pytest.raises(wire.LimitExceeded, match="max_payload=100; split it into CHUNK frames"):
        wire.encode_value(value, codec, limits=limits)
    with pytest.raises(wire.LimitExceeded, match="max_payload=100; split it into CHUNK frames"):
        wire.encode_message(wire.MessageType.SEND, {"msg": value}, codec=codec, limits=limits)
    assert _decode(wire.encode_value(value, codec), codec) == value


@pytest.mark.parametrize("codec", [wire.Codec.TLV, wire.Codec.CBOR])
def test_items_over_the_fast_paths_size_encode_as_the_small_ones(codec: wire.Codec) -> None:
    value = {"s": "é" * 3000, "b": bytes(range(256)) * 20, "l": ["w" * 1500] * 3, "n": 1}
    data = wire.encode_value(value, codec)
    assert _decode(data, codec) == value
    small = {"s": "é", "b": b"\x01", "l": ["w"], "n": 1}
    assert _decode(wire.encode_value(small, codec), codec) == small


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(11 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, 0, -1, 2**63 - 1, 2**64, -(2**80), 1.5])
    if kind == 1:
        return rng.choice([b"", b"abc", "", "h\u00e9", "x" * 9])
    if kind == 2:
        return wire.Atom("ok")
    if kind == 3:
        return wire.Pid("n@h", 1, 2)
    if kind == 4:
        return wire.ExitReason("crash", None)
    if kind == 5:
        return ()
    if kind in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 8:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    if kind == 9:
        return {rng.choice(["a", "b", 1, None]): _random_value(rng, depth + 1) for _ in range(3)}
    return wire.ExitReason("crash", _random_value(rng, depth + 1))


def test_tlv_encoder_and_decoder_agree_on_every_limit() -> None:
    """Whatever TLV encodes under some limits, a TLV decoder with the same limits accepts, and
    the reverse (the C paths hand every refusal to the exact loops, so both are exercised)."""
    rng = random.Random(4)
    for _ in range(400):
        value = _random_value(rng)
        limits = wire.Limits(
            max_depth=rng.randrange(1, 5),
            max_items=rng.randrange(1, 5),
            max_total_items=rng.randrange(1, 20),
            max_str=rng.randrange(1, 10),
            max_bigint_bytes=rng.randrange(1, 12),
        )
        data = wire.tlv_encode(value)
        encoded = _ok(lambda: wire.tlv_encode(value, limits=limits))  # noqa: B023
        decoded = _ok(lambda: wire.tlv_decode(data, limits=limits))  # noqa: B023
        assert encoded == decoded, (value, limits)
