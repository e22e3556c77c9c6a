"""TLV's fast paths (wire/_tlv_fast.py): the public functions give exactly what the exact loops
give, for any input and any limits, and the fast paths take every ordinary value themselves."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, UserString, namedtuple
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import wire
from wire import _tlv, _tlv_encode, _tlv_fast

from .codec_paths import codec_path  # noqa: F401 (runs the module with and without C)
from .strategies import v1_values, v2_values

SETTINGS = settings(max_examples=200, deadline=None)
DEFAULT = wire.Limits()

limits = st.builds(
    wire.Limits,
    max_depth=st.integers(1, 8),
    max_items=st.integers(1, 300),
    max_total_items=st.integers(1, 400),
    max_str=st.integers(1, 400),
    max_bigint_bytes=st.integers(9, 100),
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (NaN equal to NaN, compared through repr)."""
    return type(a) is type(b) and (a == b or repr(a) == repr(b))


def _exact_decode(data: bytes, version: int, limits: wire.Limits) -> Any:
    """What tlv_decode returns or raises, by the exact loop alone."""
    try:
        value, off = _tlv._decode_loop_at(data, 0, version == 2, limits)
    except wire.WireError as exc:
        return exc
    if off != len(data):
        return wire.TrailingBytes("", off)
    return value


def _public_decode(data: bytes, version: int, limits: wire.Limits) -> Any:
    try:
        return wire.tlv_decode(data, version=version, limits=limits)
    except wire.WireError as exc:
        return exc


def _exact_encode(value: Any, version: int, limits: wire.Limits, coerce_keys: bool) -> Any:
    out = bytearray()
    try:
        _tlv_encode._encode_loop(out, value, version == 2, coerce_keys, limits)
    except wire.WireError as exc:
        return exc
    return bytes(out)


def _public_encode(value: Any, version: int, limits: wire.Limits, coerce_keys: bool) -> Any:
    try:
        return wire.tlv_encode(value, version=version, limits=limits, coerce_keys=coerce_keys)
    except wire.WireError as exc:
        return exc


def _agree(got: Any, want: Any) -> None:
    if isinstance(want, wire.WireError):
        assert type(got) is type(want), (got, want)
        assert got.offset == want.offset
    else:
        assert not isinstance(got, wire.WireError), got
        assert _same(got, want)


@st.composite
def payloads(draw: Any) -> tuple[bytes, int]:
    """TLV payloads of either version, valid or damaged (cut, bit-flipped, given huge lengths,
    bytes inserted or removed)."""
    version = draw(st.sampled_from([1, 2]))
    value = draw(v1_values(12) if version == 1 else v2_values(12))
    data = bytearray(wire.tlv_encode(value, version=version))
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "cut", "huge", "insert", "delete"]))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[i:]
        elif op == "huge":
            data[i : i + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x01\x00"]))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[i : i + draw(st.integers(1, 4))]
    return bytes(data), version


@SETTINGS
@given(payloads(), st.one_of(st.just(DEFAULT), limits))
def test_decoding_equals_the_exact_loop(payload: tuple[bytes, int], lim: wire.Limits) -> None:
    data, version = payload
    _agree(_public_decode(data, version, lim), _exact_decode(data, version, lim))


@SETTINGS
@given(st.binary(max_size=64), st.sampled_from([1, 2]))
def test_decoding_arbitrary_bytes_equals_the_exact_loop(data: bytes, version: int) -> None:
    _agree(_public_decode(data, version, DEFAULT), _exact_decode(data, version, DEFAULT))


class Color(enum.IntEnum):
    RED = 1


class Name(str, enum.Enum):  # noqa: UP042 - a str mixin on purpose
    ALICE = "alice"


odd_values = st.sampled_from(
    [
        Color.RED,
        Name.ALICE,
        OrderedDict(a=1),
        namedtuple("point", "x y")(1, 2),
        (1, (2, [3])),
        {1: "int key"},
        {None: 1, True: 2},
        {Name.ALICE: 1},
        {UserString("app_path"): 1},
        UserString("app_path"),
        2**70,
        -(2**63) - 1,
        math.nan,
        "\ud800",
        {"\ud800": 1},
        bytearray(b"x"),
        {1, 2},
        object(),
        wire.Atom("ok"),
        wire.ExitReason("crash", wire.ErrorValue("E", "m", {"k": [1]}, "tb")),
        "x" * 300,
        b"y" * 300,
        list(range(300)),
        {str(i): i for i in range(300)},
    ]
)


@SETTINGS
@given(
    st.one_of(v2_values(), st.lists(odd_values, max_size=3), odd_values),
    st.sampled_from([1, 2]),
    st.one_of(st.just(DEFAULT), limits),
    st.booleans(),
)
def test_encoding_equals_the_exact_loop(
    value: Any, version: int, lim: wire.Limits, coerce_keys: bool
) -> None:
    want = _exact_encode(value, version, lim, coerce_keys)
    got = _public_encode(value, version, lim, coerce_keys)
    if isinstance(want, wire.WireError):
        assert type(got) is type(want), (got, want)
    else:
        assert got == want


def _has_big_int(value: Any) -> bool:
    if type(value) is int:
        return not -(2**63) <= value < 2**63
    if isinstance(value, (list, tuple)):
        return any(_has_big_int(x) for x in value)
    if isinstance(value, dict):
        return any(_has_big_int(k) or _has_big_int(x) for k, x in value.items())
    if isinstance(value, wire.ExitReason):
        return _has_big_int(value.detail)
    if isinstance(value, wire.ErrorValue):
        return _has_big_int(value.details)
    return False


@SETTINGS
@given(v2_values(), st.sampled_from([1, 2]))
def test_fast_paths_take_every_ordinary_value(value: Any, version: int) -> None:
    # Only big ints (and values the exact loop refuses) are left to it; a fast path that gave up
    # on ordinary values would still be correct, only slow, so this guards the speed.
    assume(not _has_big_int(value))
    if version == 1:
        try:
            data = wire.tlv_encode(value, version=1)
        except wire.WireError:
            return  # a version 2 type or key
        assume(wire.tlv_decode(data, version=1) == value)  # no tuples (they come back as lists)
    parts = _tlv_encode._encode_fast(value, version == 2, DEFAULT)
    assert parts is not None
    data = b"".join(parts)
    assert data == _exact_encode(value, version, DEFAULT, False)
    decoded, end = _tlv._decode_fast(data, version == 2, DEFAULT)
    assert end == len(data)
    assert _same(decoded, value) or wire.tlv_encode(decoded, version=version) == data


def test_the_benchmark_request_takes_the_fast_paths() -> None:
    from benchmarks.bench_wire import REQUEST

    parts = _tlv_encode._encode_fast(REQUEST, False, DEFAULT)
    assert parts is not None
    data = b"".join(parts)
    assert _tlv._decode_fast(data, False, DEFAULT) == (REQUEST, len(data))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "value",
    [
        {"a": None},
        {"a": True},
        {"a": False},
        {"a": []},
        {"a": {}},
        {"a": 1},
        {"a": 1.5},
        {"a": b""},
        {"a": ""},
        {"a": [None]},
        {"a": [True]},
        {"a": {"b": None}},
        [None],
        [True],
        None,
        {"k" * 255: None},
        {"k" * 256: None},
        {"k" * 300: 1, "k" * 255: [None], "é" * 200: False},
    ],
)
def test_values_ending_at_the_last_byte(value: Any, version: int) -> None:
    # The fast decoder reads a dict entry's key and the value's header in one go; near the end
    # of the payload it must take the short values one at a time, not give up.
    data = wire.tlv_encode(value, version=version)
    assert _tlv._decode_fast(data, version == 2, DEFAULT) == (value, len(data))
    assert wire.tlv_decode(data, version=version) == value


@pytest.mark.parametrize(
    "value", [{1: None}, {None: None}, {(1,): True}, {"a": 1, 2: None}, {wire.Atom("a"): 0}]
)
def test_version_2_keys_that_are_not_str_at_the_end(value: Any) -> None:
    data = wire.tlv_encode(value)
    assert _tlv._decode_fast(data, True, DEFAULT) == (value, len(data))


@pytest.mark.parametrize(
    ("value", "depth"),
    [({"a": [[]]}, 3), ({"a": [{"b": []}]}, 4), ([{"a": [()]}], 4), ({"a": [1, [2, [3]]]}, 4)],
)
def test_depth_counts_every_container_on_both_paths(value: Any, depth: int) -> None:
    for version in (1, 2):
        ok = wire.Limits(max_depth=depth)
        data = wire.tlv_encode(value, version=version, limits=ok)
        assert wire.tlv_encode(wire.tlv_decode(data, version=version, limits=ok), version=version)
        tight = wire.Limits(max_depth=depth - 1)
        with pytest.raises(wire.LimitExceeded, match="max_depth"):
            wire.tlv_encode(value, version=version, limits=tight)
        with pytest.raises(wire.LimitExceeded, match="max_depth") as info:
            wire.tlv_decode(data, version=version, limits=tight)
        assert info.value.offset is not None


def test_shared_containers_stop_at_max_total_items() -> None:
    # A value that shares one list all the way down expands to 2**60 items: both encoders stop
    # at the limit instead of expanding it.
    shared: Any = [1]
    mapping: Any = {"a": 1}
    for _ in range(60):
        shared = [shared, shared]
        mapping = {"x": mapping, "y": [mapping]}
    lim = wire.Limits(max_total_items=10_000, max_depth=300)
    for value in (shared, mapping, ("t", shared)):
        with pytest.raises(wire.LimitExceeded, match="max_total_items"):
            wire.tlv_encode(value, limits=lim)


def test_a_str_equal_to_a_cached_one_is_not_taken_for_it() -> None:
    wire.tlv_encode({"app_path": 1}, version=1)  # puts "app_path" in the str cache
    key = UserString("app_path")
    assert key == "app_path"
    assert hash(key) == hash("app_path")
    with pytest.raises(wire.InvalidValue, match="keys must be str"):
        wire.tlv_encode({key: 1}, version=1)
    assert wire.tlv_encode({key: 1}, version=1, coerce_keys=True) == wire.tlv_encode(
        {"app_path": 1}, version=1
    )
    with pytest.raises(wire.UnknownValueType):
        wire.tlv_encode({key: 1})
    with pytest.raises(wire.UnknownValueType):
        wire.tlv_encode([key])


def test_a_cached_str_is_still_checked_against_a_small_max_str() -> None:
    text = "cached-" * 5
    wire.tlv_encode([text])  # cached under the default limits
    for value in (text, [text], {"k": text}, {text: 1}, {"k": [text]}):
        with pytest.raises(wire.LimitExceeded, match="max_str=10"):
            wire.tlv_encode(value, limits=wire.Limits(max_str=10))


@pytest.mark.parametrize("n", [255, 256, 300, 301])
def test_max_items_is_exact_across_the_header_tables(n: int) -> None:
    lim = wire.Limits(max_items=300)
    for value in (list(range(n)), {str(i): i for i in range(n)}, {"k": list(range(n))}):
        if n <= 300:
            assert wire.tlv_decode(wire.tlv_encode(value, limits=lim), limits=lim) == value
        else:
            with pytest.raises(wire.LimitExceeded, match="max_items=300"):
                wire.tlv_encode(value, limits=lim)


def test_values_built_without_validators_equal_constructed_ones() -> None:
    pairs = [
        (_tlv_fast._pid("a@host", 2**64 - 1, 7), wire.Pid("a@host", 2**64 - 1, 7)),
        (_tlv_fast._ref("b@host", 0, 2**32 - 1), wire.Ref("b@host", 0, 2**32 - 1)),
        (_tlv_fast._atom("ok"), wire.Atom("ok")),
    ]
    for built, constructed in pairs:
        assert type(built) is type(constructed)
        assert built == constructed
        assert hash(built) == hash(constructed)
        assert repr(built) == repr(constructed)
        with pytest.raises(AttributeError):
            built.node = "other"  # type: ignore[union-attr]


def test_a_payload_longer_than_the_limits_takes_the_exact_loop() -> None:
    # The fast decoder runs only on payloads no longer than max_total_items and max_str (which
    # then cannot be exceeded); past that the exact loop decodes, with the same result.
    value = {"items": list(range(20)), "text": "t" * 30}
    data = wire.tlv_encode(value)
    for lim in (
        wire.Limits(max_total_items=len(data) - 1),
        wire.Limits(max_str=len(data) - 1),
        wire.Limits(max_depth=_tlv_encode._FAST_MAX_DEPTH + 1),
    ):
        assert _tlv._fast_size(lim) < len(data)
        assert wire.tlv_decode(data, limits=lim) == value


@pytest.mark.parametrize(
    "value",
    [
        list(range(20)),
        {"items": list(range(20))},
        [list(range(20))],
        {str(i): i for i in range(20)},
        [{str(i): i for i in range(20)}],
        {"k": {str(i): i for i in range(20)}},
        (tuple(range(20)),),
    ],
)
def test_the_fast_decoder_checks_max_items_itself(value: Any) -> None:
    # max_items is not implied by the payload's size (a 2 MiB payload may hold a list of a
    # million items): the fast decoder checks every count before building the container.
    data = wire.tlv_encode(value)
    tight = wire.Limits(max_items=19)
    assert _tlv._fast_size(tight) >= len(data)
    with pytest.raises(_tlv_fast.Fallback):
        _tlv._decode_fast(data, True, tight)
    with pytest.raises(wire.LimitExceeded, match="max_items=19"):
        wire.tlv_decode(data, limits=tight)
    assert wire.tlv_decode(data, limits=wire.Limits(max_items=20)) == value


@pytest.mark.parametrize(
    "hex_payload",
    [
        "0102",  # top level
        "2000000002" + "00" + "0102",  # in a list
        "2100000001" + "1100000001" + "61" + "0102",  # a dict's value, at the end
        "2100000002" + "1100000001" + "62" + "00" + "1100000001" + "61" + "0102",
        "2100000002" + "1100000001" + "61" + "0102" + "1100000001" + "62" + "00",
        "2100000001" + "1100000001" + "61" + "2000000001" + "0102",  # in a dict's list
        "2000000001" + "2000000001" + "0102",  # in a list in a list
        "2100000001" + "1100000001" + "61" + "2000000001" + "2000000001" + "0102",
    ],
)
@pytest.mark.parametrize("version", [1, 2])
def test_bool_bytes_other_than_0_and_1_are_refused_everywhere(
    hex_payload: str, version: int
) -> None:
    data = bytes.fromhex(hex_payload)
    with pytest.raises(wire.InvalidValue, match="bool byte") as info:
        wire.tlv_decode(data, version=version)
    assert data[info.value.offset - 1 : info.value.offset + 1] == b"\x01\x02"


@pytest.mark.parametrize(
    "hex_payload",
    [
        "2100000002" + "1100000001" + "61" + "00" + "1100000001" + "61" + "01" + "01",
        "2000000001" + "2100000002" + "1100000001" + "61" + "00" + "1100000001" + "61" + "00",
        "2100000001"
        + "1100000001"
        + "62"
        + "2100000002"
        + ("1100000001" + "61" + "0500000000000000ff") * 2,
        "2100000002" + ("11" + "00000100" + "6b" * 256 + "00") * 2,  # long keys
    ],
)
def test_duplicate_keys_are_refused_on_every_path(hex_payload: str) -> None:
    for version in (1, 2):
        with pytest.raises(wire.InvalidValue, match="duplicate dict key"):
            wire.tlv_decode(bytes.fromhex(hex_payload), version=version)


def test_version_2_duplicate_keys_that_are_not_str() -> None:
    data = bytes.fromhex("2100000002" + ("0500000000000000" + "01" + "00") * 2)
    with pytest.raises(wire.InvalidValue, match="duplicate dict key 1"):
        wire.tlv_decode(data)
    data = bytes.fromhex("2100000002" + "0500000000000000" + "01" + "00" + "0101" + "00")
    with pytest.raises(wire.InvalidValue, match="duplicate dict key"):
        wire.tlv_decode(data)  # True == 1: one key for Python


@pytest.mark.parametrize("code", ["12", "30", "31"])
def test_names_over_255_bytes_are_refused_even_when_present(code: str) -> None:
    tail = "" if code == "12" else "000000000000002a" + "00000001"
    name = "6e" * 256
    data = bytes.fromhex(code + "00000100" + name + tail)
    with pytest.raises(wire.LimitExceeded, match="255-byte limit"):
        wire.tlv_decode(data)
    ok = bytes.fromhex(code + "000000ff" + "6e" * 255 + tail)
    assert len(wire.tlv_encode(wire.tlv_decode(ok))) == len(ok)


@pytest.mark.parametrize(
    "hex_payload",
    [
        "12000000016f",  # atom
        "2200000000",  # tuple
        "3000000001" + "61" + "0000000000000001" + "00000000",  # pid
        "32" + "1100000001" + "6b" + "00",  # exit reason
        "2100000001" + "1100000001" + "61" + "12000000016f",  # as a dict's value
        "2000000001" + "2200000000",  # in a list
        "2100000001" + "12000000016b" + "00",  # as a dict key
    ],
)
def test_version_2_types_are_refused_in_version_1_on_every_path(hex_payload: str) -> None:
    data = bytes.fromhex(hex_payload)
    assert wire.tlv_decode(data) is not None
    with pytest.raises((wire.UnknownValueType, wire.InvalidValue)):
        wire.tlv_decode(data, version=1)


class _Budget(list):  # type: ignore[type-arg]
    """A parts list that refuses to grow past a budget (to watch the encoder's work bound)."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget

    def append(self, item: Any) -> None:
        if len(self) >= self.budget:
            raise AssertionError("the fast encoder kept going past max_total_items")
        super().append(item)


def test_the_fast_encoder_stops_near_max_total_items_on_shared_lists() -> None:
    # Shared lists could make the fast encoder do far more work than the value's size: it checks
    # the pieces written so far as every container (inline lists included) starts.
    shared = list(range(2000))
    lim = wire.Limits(max_total_items=10_000, max_items=1_000_000)
    encode, _ = _tlv_encode._fast_encoder(True, lim)
    for value in ({str(i): shared for i in range(2000)}, [shared] * 2000):
        parts = _Budget(lim.max_total_items + len(shared) + 10)
        with pytest.raises(_tlv_fast.Fallback):
            encode(value, parts, lim.max_depth)
        with pytest.raises(wire.LimitExceeded, match="max_total_items"):
            wire.tlv_encode(value, limits=lim)


@pytest.mark.parametrize("value", [b"x" * 11, [b"x" * 11], {"k": b"x" * 11}, {"k": [b"x" * 11]}])
def test_bytes_are_checked_against_max_str_on_every_path(value: Any) -> None:
    with pytest.raises(wire.LimitExceeded, match="max_str=10"):
        wire.tlv_encode(value, limits=wire.Limits(max_str=10))


@pytest.mark.parametrize(
    "hex_payload",
    [
        "2100000001" + "0500000000000000" + "01" + "00",  # {1: None}
        "2100000002" + "0500000000000000" + "01" + "1100000001" + "61" + "1100000001" + "62" + "00",
        # {"a": None, None: "b"}
        "2100000002" + "1100000001" + "61" + "00" + "00" + "1100000001" + "62",
        "2100000001" + "0101" + "0500000000000000" + "01",  # {True: 1}
    ],
)
def test_version_1_keys_must_be_str_on_every_path(hex_payload: str) -> None:
    data = bytes.fromhex(hex_payload)
    assert wire.tlv_decode(data) is not None  # fine in version 2
    with pytest.raises(wire.InvalidValue, match="version 1 dict keys must be str"):
        wire.tlv_decode(data, version=1)
