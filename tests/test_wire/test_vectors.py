"""The spec's test vectors (wire/vectors.json, rendered into wire/SPEC.md) hold."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import wire

from . import make_vectors

VECTORS = json.loads((Path(wire.__file__).parent / "vectors.json").read_text())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def test_vectors_file_and_spec_are_current() -> None:
    assert make_vectors.main() == 0, "run tests/test_wire/make_vectors.py --write"


def test_spec_has_gunicorn_examples_from_the_protocol_notes() -> None:
    spec = (Path(wire.__file__).parent / "SPEC.md").read_text()
    assert "47 44 01 05 00 00 00 00 00 00 00 00 00 00 00 03" in spec  # END id=3


@pytest.mark.parametrize("vector", VECTORS["tlv"], ids=lambda v: f"v{v['version']} {v['name']}")
def test_tlv_vector(vector: dict[str, Any]) -> None:
    value = wire.from_json(vector["value"])
    data = bytes.fromhex(vector["hex"])
    assert wire.tlv_encode(value, version=vector["version"]) == data
    assert _same(wire.tlv_decode(data, version=vector["version"]), value)


@pytest.mark.parametrize("vector", VECTORS["cbor"], ids=lambda v: v["name"])
def test_cbor_vector(vector: dict[str, Any]) -> None:
    value = wire.from_json(vector["value"])
    data = bytes.fromhex(vector["hex"])
    assert wire.cbor_encode(value) == data
    assert _same(wire.cbor_decode(data), value)


@pytest.mark.parametrize("vector", VECTORS["frames"], ids=lambda v: v["name"])
def test_frame_vector(vector: dict[str, Any]) -> None:
    frame = wire.frame_from_json(vector["frame"])
    data = bytes.fromhex(vector["hex"])
    assert wire.encode_frame(frame) == data
    assert wire.FrameDecoder().feed(data) == [frame]


def _decode(decoder: str, data: bytes) -> None:
    if decoder == "frame":
        d = wire.FrameDecoder()
        d.feed(data)
        d.feed_eof()
    elif decoder == "cbor":
        wire.cbor_decode(data)
    else:
        wire.tlv_decode(data, version=1 if decoder == "tlv1" else 2)


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vector(vector: dict[str, Any]) -> None:
    error = getattr(wire, vector["error"])
    with pytest.raises(error) as info:
        _decode(vector["decoder"], bytes.fromhex(vector["hex"]))
    assert info.value.offset == vector["offset"]


@pytest.mark.parametrize("vector", VECTORS["rfc8949"], ids=lambda v: f"{v['kind']} {v['hex'][:24]}")
def test_rfc8949_appendix_a(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    if vector["kind"] == "reject":
        with pytest.raises(wire.WireError):
            wire.cbor_decode(data)
        return
    value = wire.from_json(vector["value"])
    assert _same(wire.cbor_decode(data), value)
    if vector["kind"] == "plain":
        assert wire.cbor_encode(value) == data
