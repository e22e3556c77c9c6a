"""Audit of wire/: bugs found against SPEC.md, RFC 8949 and Gunicorn 27.0.1 (now fixed, each test
guards its fix), and tricky edges checked and found right (regression guards)."""

from __future__ import annotations

import enum
import math
import random
import struct
import subprocess
import sys
import textwrap
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

import wire

TLVEncoder = pytest.importorskip("gunicorn.dirty.tlv").TLVEncoder

# ---------------------------------------------------------------------------------------------
# Bugs


@pytest.mark.parametrize("request_id", [-1, 2**64])
@pytest.mark.parametrize("payload", [None, {"a": 1}])
def test_encode_message_refuses_a_request_id_outside_u64_with_a_wire_error(
    request_id: int, payload: Any
) -> None:
    with pytest.raises(wire.ValueOutOfRange, match="request_id"):
        wire.encode_message(wire.MessageType.PING, payload, request_id=request_id)


@pytest.mark.parametrize("encode", ["frame", "message"])
def test_a_codec_given_as_a_str_is_refused_not_written_as_cbor(encode: str) -> None:
    frame = wire.Frame(wire.MessageType.RESPONSE, 1, {"result": 1}, version=2)
    codec: Any = "tlv"
    with pytest.raises(wire.WireError, match="codec"):  # was: a frame with the CBOR flag
        if encode == "frame":
            wire.encode_frame(frame, codec=codec)
        else:
            wire.encode_message(frame.type, frame.payload, codec=codec)


def test_bignum_leading_zeros_do_not_depend_on_the_payload_size() -> None:
    limits = wire.Limits(max_bigint_bytes=9, max_items=64, max_str=64, max_total_items=64)
    bignum = bytes.fromhex("c24a000100000000000000ff")  # 2**64 + 255 with one leading zero
    assert wire.cbor_decode(bignum, limits=limits) == 2**64 + 255  # a short payload: fine
    text = b"\x78\x40" + b"x" * 64
    payload = b"\x82" + bignum + text  # over 64 bytes: scanned first
    assert wire.cbor_decode(payload, limits=limits) == [2**64 + 255, "x" * 64]


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


@pytest.mark.parametrize(
    ("decode", "hex_payload"),
    [
        (wire.cbor_decode, "a2f97e006161f97e006162"),
        (
            wire.tlv_decode,
            "2100000002067ff8000000000000110000000161067ff8000000000000110000000162",
        ),
    ],
)
def test_byte_identical_nan_keys_are_duplicate_keys(
    decode: Callable[[bytes], Any], hex_payload: str
) -> None:
    with pytest.raises(wire.InvalidValue, match=r"(?i)duplicate"):
        decode(bytes.fromhex(hex_payload))


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


def test_encoders_refuse_two_nan_keys_of_one_encoding() -> None:
    a, b = float("nan"), float("nan")  # two objects: a dict holds both
    with pytest.raises(wire.InvalidValue, match="duplicate dict key nan"):
        wire.cbor_encode({a: 1, b: 2})  # every NaN is f9 7e 00
    with pytest.raises(wire.InvalidValue, match="duplicate dict key nan"):
        wire.tlv_encode({"x": [{a: 1, b: 2}]})
    with pytest.raises(wire.InvalidValue, match="duplicate dict key nan"):
        wire.encode_message(wire.MessageType.SEND, {"msg": {a: 1, b: 2}})


def test_nan_keys_of_different_bits_and_nan_values_are_not_duplicates() -> None:
    other = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]
    nan = float("nan")
    value = {nan: [nan, nan], other: nan}
    data = wire.tlv_encode(value)  # TLV keeps NaN bits: two keys
    back = wire.tlv_decode(data)
    assert [struct.pack(">d", k) for k in back] == [struct.pack(">d", k) for k in value]
    one = wire.cbor_decode(wire.cbor_encode({nan: [nan, nan]}))
    assert len(one) == 1 and all(math.isnan(x) for x in next(iter(one.values())))


def test_two_nan_keys_are_refused_on_the_slow_paths_too() -> None:
    filler = "x" * 5000  # a payload over the fast decoders' size
    nan_key = "067ff8000000000000"
    tlv = bytes.fromhex("2100000003" + nan_key + "00" + nan_key + "00" + "1100000003616263")
    tlv += bytes.fromhex("11") + struct.pack(">I", len(filler)) + filler.encode()
    with pytest.raises(wire.InvalidValue, match="duplicate dict key nan"):
        wire.tlv_decode(tlv, limits=wire.Limits(max_str=10_000, max_total_items=8))
    cbor = wire.cbor_encode([filler, 1])[:-1] + bytes.fromhex("a2fb7ff8000000000000f6f97e00f6")
    with pytest.raises(wire.InvalidValue, match=r"(?i)duplicate map key nan"):
        wire.cbor_decode(cbor)


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


def _may_hold_a_nan_or_a_tag(data: bytes) -> bool:
    """A wire tag's first byte, or a float head and the first byte of a NaN/infinity after it."""
    for i, b in enumerate(data):
        e = data[i + 1] & 0x7F if i + 1 < len(data) else 0
        if b == 0xD9 or (b == 0xF9 and e >= 0x7C) or (b in (0xFA, 0xFB) and e == 0x7F):
            return True
    return False


def test_the_cbor_nan_checks_never_call_a_payload_with_a_nan_plain() -> None:
    from wire import _accel, _cbor

    checks = [_cbor._plain_py] + ([_accel.C.cbor_plain] if _accel.C is not None else [])
    rng = random.Random(5)
    alphabet = bytes([0x00, 0x41, 0x7C, 0x7E, 0x7F, 0x80, 0xD9, 0xF9, 0xFA, 0xFB, 0xFC, 0xFF])
    for _ in range(3000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(6)))
        suspect = _may_hold_a_nan_or_a_tag(data)
        for plain in checks:
            assert not (plain(data) and suspect), (plain, data.hex())
        if _accel.C is not None:  # the C check is exact
            assert _accel.C.cbor_plain(data) is not suspect, data.hex()


# ---------------------------------------------------------------------------------------------
# Edges checked and found right


class _Int(enum.IntEnum):
    A = 3
    B = 2**40


class _Str(enum.StrEnum):
    X = "x"


_Pair = namedtuple("_Pair", "a b")


def test_subclasses_and_coerced_keys_are_byte_identical_to_gunicorn() -> None:
    value = {
        "ints": [_Int.A, _Int.B, True, -(2**63)],
        "s": _Str.X,
        "pair": _Pair(1.5, -0.0),
        "od": OrderedDict([("b", None), ("a", b"\x00")]),
        1: "one",
        "1": "str one",  # coerced, key 1 becomes a second "1"
        _Int.A: float("inf"),
    }
    ours = wire.tlv_encode(value, version=1, coerce_keys=True)
    assert ours == TLVEncoder.encode(value)
    # Gunicorn's decoder keeps the last "1"; ours refuses the duplicate, as SPEC 3.3 says.
    assert TLVEncoder.decode_full(ours)["1"] == "str one"
    with pytest.raises(wire.InvalidValue, match="duplicate dict key '1'"):
        wire.tlv_decode(ours, version=1)


@pytest.mark.parametrize(
    "hex_payload",
    [
        "a201610af93c006162",  # 1 and 1.0
        "a2016161f56162",  # 1 and true
        "a2f900006161f980006162",  # 0.0 and -0.0
    ],
)
def test_cbor_keys_equal_as_values_but_encoded_differently_are_duplicates(
    hex_payload: str,
) -> None:
    with pytest.raises(wire.InvalidValue, match=r"(?i)duplicate"):
        wire.cbor_decode(bytes.fromhex(hex_payload))


@pytest.mark.parametrize(
    ("hex_payload", "value"),
    [
        ("1801", 1),  # non-preferred heads are accepted (SPEC 5 SHOULD)
        ("1b0000000000000001", 1),
        ("3bffffffffffffffff", -(2**64)),
        ("fb3ff0000000000000", 1.0),
        ("c240", 0),  # an empty bignum
        ("c34101", -2),
    ],
)
def test_cbor_accepts_well_formed_non_preferred_encodings(hex_payload: str, value: Any) -> None:
    got = wire.cbor_decode(bytes.fromhex(hex_payload))
    assert got == value and type(got) is type(value)


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
