"""wire's optional C fast paths (``wire/_speedups.c``), when they were built.

``C`` is the extension module, or None where it was not built (no C compiler at install time),
was built from an older ``_speedups.c`` (it lacks a function the codecs call: rebuild it with
``pip install -e .``), or ``WIRE_NO_SPEEDUPS`` is set in the environment; the codecs then run
their pure-Python fast paths, which give the same results. Every C function returns None instead
of raising, and the caller then runs the Python code, which produces the same value or names the
error.
"""

from __future__ import annotations

import os
from types import ModuleType

from . import _tlv_fast
from ._values import Atom, ErrorValue, ExitReason, Pid, Ref

__all__ = ["C"]

#: What the codecs call; an extension built before one of these was added is not used.
_FUNCTIONS = (
    "init",
    "cbor_encode",
    "cbor_check",
    "cbor_decode",
    "tlv_encode",
    "tlv_decode",
    "frames_init",
    "tlv_frames",
    "frames_v2",
    "gd1_scan",
    "gd1_frame",
)


def _load() -> ModuleType | None:
    if os.environ.get("WIRE_NO_SPEEDUPS"):
        return None
    try:
        from . import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    if not all(hasattr(_speedups, name) for name in _FUNCTIONS):
        return None
    # The constructors the decoder uses build values from fields it has already checked.
    _speedups.init(
        Atom, Pid, Ref, ExitReason, ErrorValue, _tlv_fast._atom, _tlv_fast._pid, _tlv_fast._ref
    )
    return _speedups


C: ModuleType | None = _load()
