"""CBOR's fast paths: the recursive encoder and the C-speed type check give exactly what the
general encoder and the walk over decoded values give, and hand over whatever they cannot do."""

from __future__ import annotations

import enum
import math
import struct
import sys
import types
from collections import OrderedDict, namedtuple
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire
from wire import _cbor, _cbor_fast, _cbor_general, _cbor_heads

from .codec_paths import codec_path  # noqa: F401 (runs the module with and without C)
from .strategies import v2_scalars, v2_values

SETTINGS = settings(max_examples=200, deadline=None)


def _general(value: Any, limits: wire.Limits) -> bytes | wire.WireError:
    out = bytearray()
    try:
        _cbor_general._encode_into(out, value, limits)
    except wire.WireError as exc:
        return exc
    return bytes(out)


small_limits = st.builds(
    wire.Limits,
    max_depth=st.integers(1, 8),
    max_items=st.integers(1, 6),
    max_total_items=st.integers(1, 60),
    max_str=st.integers(256, 300),
    max_bigint_bytes=st.integers(1, 100),
)


@SETTINGS
@given(v2_values())
def test_fast_encoder_takes_every_plain_value_under_default_limits(value: Any) -> None:
    fast = _cbor_fast._fast_encode(value, _cbor_heads._DEFAULT_LIMITS)
    assert fast is not None
    assert fast == _general(value, _cbor_heads._DEFAULT_LIMITS)


@SETTINGS
@given(v2_values(), small_limits)
def test_fast_encoder_never_accepts_what_the_general_encoder_refuses(
    value: Any, limits: wire.Limits
) -> None:
    fast = _cbor_fast._fast_encode(value, limits)
    general = _general(value, limits)
    if fast is not None:
        assert fast == general
    if isinstance(general, wire.WireError):
        with pytest.raises(type(general)):
            wire.cbor_encode(value, limits=limits)
    else:
        assert wire.cbor_encode(value, limits=limits) == general


_LEAVES: list[Any] = [
    1,
    2**70,
    "s",
    [],
    {},
    (),
    (1,),
    wire.Atom("a"),
    wire.Pid("n@h", 1, 1),
    wire.ExitReason("normal"),
    wire.ErrorValue("E", "m"),
]


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_WRAPPERS: list[Any] = [
    lambda v: [v],
    lambda v: {"k": v},
    lambda v: {(1,): v},
    lambda v: {v: 1} if _hashable(v) else [v],
    lambda v: (v,),
    lambda v: wire.ExitReason("crash", v),
    lambda v: wire.ErrorValue("E", "m", {"d": v}),
]


@pytest.mark.parametrize("max_depth", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("leaf", _LEAVES, ids=repr)
def test_fast_encoder_applies_the_depth_rule_at_its_boundary(leaf: Any, max_depth: int) -> None:
    limits = wire.Limits(max_depth=max_depth)
    values = [leaf]
    for _ in range(2):
        values += [wrap(v) for v in values for wrap in _WRAPPERS]
    for value in values:
        general = _general(value, limits)
        fast = _cbor_fast._fast_encode(value, limits)
        if isinstance(general, wire.WireError):
            assert fast is None, value
        else:
            assert fast == general, value


@pytest.mark.parametrize("make", [lambda n: "é" * (n // 2) + "x" * (n % 2), lambda n: b"x" * n])
@pytest.mark.parametrize(
    "wrap", [lambda v: v, lambda v: [1, v], lambda v: {"k": v}, lambda v: {"k": (v,)}]
)
def test_fast_encoder_applies_max_str_at_its_boundary(make: Any, wrap: Any) -> None:
    limits = wire.Limits(max_str=301)
    value = wrap(make(301))
    assert _cbor_fast._fast_encode(value, limits) == _general(value, limits)
    assert wire.cbor_decode(wire.cbor_encode(value, limits=limits), limits=limits) == value
    too_long = wrap(make(302))
    assert _cbor_fast._fast_encode(too_long, limits) is None
    with pytest.raises(wire.LimitExceeded, match="max_str=301"):
        wire.cbor_encode(too_long, limits=limits)


class Color(enum.IntEnum):
    RED = 300


class Name(str, enum.Enum):  # noqa: UP042 - a str mixin on purpose
    ALICE = "alice"


class Ratio(float):
    pass


Point = namedtuple("Point", ["x", "y"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (OrderedDict(b=1, a=2), {"a": 2, "b": 1}),
        (Point(1, 2), (1, 2)),
        ([Color.RED], [300]),
        ({Name.ALICE: Name.ALICE}, {"alice": "alice"}),
        ([Ratio(1.5), Ratio(0.1)], [1.5, 0.1]),
    ],
)
def test_subclasses_go_to_the_general_encoder(value: Any, expected: Any) -> None:
    assert _cbor_fast._fast_encode(value, _cbor_heads._DEFAULT_LIMITS) is None
    assert wire.cbor_encode(value) == wire.cbor_encode(expected)


@pytest.mark.parametrize("value", [{1}, bytearray(b"x"), 1j, range(2), cbor2.undefined])
def test_unknown_types_nested_in_plain_values_are_refused(value: object) -> None:
    with pytest.raises(wire.UnknownValueType, match="cannot encode a value of type"):
        wire.cbor_encode({"a": [1, (2, value)]})


def test_values_nested_past_the_fast_depth_are_encoded_by_the_general_encoder() -> None:
    deep: Any = []
    for _ in range(_cbor_fast._FAST_MAX_DEPTH + 50):
        deep = [deep]
    limits = wire.Limits(max_depth=1000)
    assert _cbor_fast._fast_encode(deep, limits) is None
    assert wire.cbor_encode(deep, limits=limits) == b"\x81" * 250 + b"\x80"


def test_fast_encoder_hands_over_when_the_caller_is_deep_in_its_stack() -> None:
    value: Any = 1
    for _ in range(150):
        value = [value]
    expected = b"\x81" * 150 + b"\x01"
    depth = 0
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    limit = sys.getrecursionlimit()

    def at_depth(n: int) -> bytes:
        return at_depth(n - 1) if n else wire.cbor_encode(value)

    # 60 frames down, 60 remain: too few for the fast path's 150 levels, enough for the
    # iterative encoder it hands over to.
    sys.setrecursionlimit(depth + 120)
    try:
        assert at_depth(60) == expected
    finally:
        sys.setrecursionlimit(limit)


def test_shared_references_are_bounded_like_the_general_encoder() -> None:
    value: Any = [0] * 1000
    for _ in range(4):
        value = [value] * 1000  # 10**15 items if it were followed to the end
    with pytest.raises(wire.LimitExceeded, match="max_total_items"):
        wire.cbor_encode(value)


def test_floats_take_the_shortest_exact_form_on_both_paths() -> None:
    cases = {
        1.5: "f93e00",
        -0.0: "f98000",
        float("inf"): "f97c00",
        float("nan"): "f97e00",
        100000.0: "fa47c35000",
        1.1: "fb3ff199999999999a",
        16777217.0: "fb4170000010000000",  # low 24 bits zero, still not a binary32
        5e-324: "fb0000000000000001",
    }
    # NaNs with payload bits (all NaNs encode as the one canonical NaN)
    for bits in ("7ff8000000000001", "fff0000000000100", "7ff4000000000000"):
        cases[struct.unpack(">d", bytes.fromhex(bits))[0]] = "f97e00"
    for value, hex_ in cases.items():
        assert wire.cbor_encode(value).hex() == hex_
        assert wire.cbor_encode({"k": value}).hex() == "a1616b" + hex_
        assert wire.cbor_encode([Ratio(value)]).hex() == "81" + hex_


# ---------------------------------------------------------------------------------------------
# Decoding


def _bad_items() -> list[bytes]:
    return [bytes.fromhex(h) for h in ("f7", "f0", "e0", "f3", "f8ff", "a1a1010203")]


@pytest.mark.parametrize("bad", _bad_items(), ids=lambda b: b.hex())
@pytest.mark.parametrize(
    "wrap",
    [
        lambda b: b,
        lambda b: b"\x82\x01" + b,  # in a list
        lambda b: b"\xa1\x61\x6b\x81" + b,  # in a list in a map
        lambda b: b"\xa2\x61\x6b\xfb\x3f\xe6\x66\x66\x66\x66\x66\x66\x61\x6c\x81" + b,  # 0.7 first
        lambda b: b"\xd9\xf0\x01\x82\x01" + b,  # in a tuple (a wire tag: the walk)
        lambda b: b"\xd9\xf0\x04\x82\x61\x78" + b,  # in an exit reason
    ],
)
def test_values_that_are_not_wire_types_are_refused_wherever_they_are(
    bad: bytes, wrap: Any
) -> None:
    with pytest.raises(wire.UnknownValueType):
        wire.cbor_decode(wrap(bad))


@SETTINGS
@given(v2_values(), st.sampled_from(_bad_items()))
def test_a_foreign_item_next_to_any_value_is_refused(value: Any, bad: bytes) -> None:
    data = b"\x82" + wire.cbor_encode(value) + bad
    with pytest.raises(wire.UnknownValueType):
        wire.cbor_decode(data)


@SETTINGS
@given(v2_values())
def test_decoded_values_hold_only_wire_types(value: Any) -> None:
    decoded = wire.cbor_decode(wire.cbor_encode(value))
    _cbor._check_result(decoded)  # the walk finds nothing the fast check let through
    assert decoded == value


# A byte string no generated value holds by chance: its encoding is swapped for a foreign item.
_MARKER = b"\x00wire-test-marker\x00" * 2


def _holds_marker(value: Any) -> bool:
    return _MARKER in wire.cbor_encode(value)


@SETTINGS
@given(
    v2_values(scalars=st.one_of(v2_scalars, st.just(_MARKER))).filter(_holds_marker),
    st.sampled_from(_bad_items()),
)
def test_a_foreign_item_anywhere_inside_any_value_is_refused(value: Any, bad: bytes) -> None:
    data = wire.cbor_encode(value).replace(wire.cbor_encode(_MARKER), bad)
    with pytest.raises(wire.UnknownValueType):
        wire.cbor_decode(data)


with_nans = v2_values(scalars=st.one_of(v2_scalars, st.just(math.nan)))


@SETTINGS
@given(with_nans)
def test_values_holding_nans_decode_to_what_was_encoded(value: Any) -> None:
    data = wire.cbor_encode(value)
    assert wire.cbor_encode(wire.cbor_decode(data)) == data


@SETTINGS
@given(with_nans, with_nans)
def test_two_nan_keys_in_a_map_anywhere_are_refused(outer: Any, inner: Any) -> None:
    # {NaN: inner, NaN: outer} cannot be built as a dict: write the map's bytes by hand.
    data = b"\x82" + wire.cbor_encode(outer) + b"\xa2\xf9\x7e\x00\xf6\xf9\x7e\x00"
    data += wire.cbor_encode(inner)
    with pytest.raises(wire.InvalidValue, match=r"(?i)duplicate map key nan"):
        wire.cbor_decode(data)


def test_values_nested_deeper_than_the_c_check_goes_take_the_walk() -> None:
    limits = wire.Limits(max_depth=1000)
    data = b"\x81" * 500 + b"\xa1\x61\x6b\xf7"  # undefined at depth 501
    with pytest.raises(wire.UnknownValueType, match="undefined"):
        wire.cbor_decode(data, limits=limits)
    nan = b"\x81" * 500 + b"\xa2\xf9\x7e\x00\xf6\xfb\x7f\xf8\x00\x00\x00\x00\x00\x01\xf6"
    with pytest.raises(wire.InvalidValue, match=r"(?i)duplicate map key nan"):
        wire.cbor_decode(nan, limits=limits)
    ok = b"\x81" * 500 + b"\xf9\x7e\x00"
    assert wire.cbor_encode(wire.cbor_decode(ok, limits=limits), limits=limits) == ok


def test_bignums_are_checked_by_magnitude_when_decoded() -> None:
    limits = wire.Limits(max_bigint_bytes=9)
    assert wire.cbor_decode(bytes.fromhex("c2490100000000000000ff"), limits=limits) == 2**64 + 255
    assert (
        wire.cbor_decode(bytes.fromhex("c3490100000000000000ff"), limits=limits) == -(2**64) - 256
    )
    # leading zeros are a non-preferred but well-formed encoding; they do not count
    assert wire.cbor_decode(bytes.fromhex("c24a000100000000000000ff"), limits=limits) == 2**64 + 255
    assert wire.cbor_decode(bytes.fromhex("c24101")) == 1
    with pytest.raises(wire.LimitExceeded, match="max_bigint_bytes=9") as info:
        wire.cbor_decode(bytes.fromhex("c24a01000000000000000000"), limits=limits)
    assert info.value.offset == 1
    with pytest.raises(wire.LimitExceeded, match="max_bigint_bytes=9"):
        wire.cbor_decode(bytes.fromhex("a1c34a0100000000000000000001"), limits=limits)  # a key


def test_bignum_tag_must_wrap_bytes() -> None:
    with pytest.raises(wire.InvalidValue, match="must wrap a byte string") as info:
        wire.cbor_decode(bytes.fromhex("8201c26161"))
    assert info.value.offset == 3


def test_max_bigint_bytes_applies_to_bignums_only() -> None:
    # Ints of major types 0 and 1 (up to 64 bits) are not big ints, as in TLV's int64.
    limits = wire.Limits(max_bigint_bytes=1)
    for value in (2**63, 2**64 - 1, -(2**64)):
        data = wire.cbor_encode(value, limits=limits)
        assert wire.cbor_decode(data, limits=limits) == value
    with pytest.raises(wire.LimitExceeded):
        wire.cbor_encode(2**64, limits=limits)
    with pytest.raises(wire.LimitExceeded):
        wire.cbor_decode(wire.cbor_encode(2**64), limits=limits)


def test_large_payloads_are_scanned_and_walked() -> None:
    limits = wire.Limits(max_items=64, max_str=1024, max_total_items=64)
    value = {"k": ["x" * 100, 1.5, (1, 2)], "n": None}
    data = wire.cbor_encode(value)
    assert len(data) > 64  # over min(max_items, max_str, max_total_items): the scan runs first
    assert wire.cbor_decode(data, limits=limits) == value
    with pytest.raises(wire.UnknownValueType) as info:
        wire.cbor_decode(b"\x82" + data + b"\xf7", limits=limits)
    assert info.value.offset == len(data) + 1
