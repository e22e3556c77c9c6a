"""A module-scoped fixture that runs a test module twice: with wire's C fast paths
(``wire/_speedups.c``) and with the pure-Python code alone, which is what runs where the
extension was not built. Both must give exactly what the exact loops give."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from wire import _accel, _cbor, _cbor_encode, _tlv, _tlv_encode


@pytest.fixture(autouse=True, scope="module", params=["c", "python"])
def codec_path(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "c":
        if _accel.C is None:
            pytest.skip("wire's C fast paths are not built here (or WIRE_NO_SPEEDUPS is set)")
        yield "c"
        return
    saved = _tlv._C, _tlv_encode._C, _cbor._C, _cbor_encode._C
    _tlv._C = _tlv_encode._C = _cbor._C = _cbor_encode._C = None
    try:
        yield "python"
    finally:
        _tlv._C, _tlv_encode._C, _cbor._C, _cbor_encode._C = saved
