"""wire's optional C fast paths (``wire/_speedups.c``), when they were built.

``C`` is the extension module, or None where it was not built (no C compiler at install time),
was built from an older ``_speedups.c`` (it lacks a function the codecs call: rebuild it with
``pip install -e .``; a ``RuntimeWarning`` names what it lacks), or ``WIRE_NO_SPEEDUPS`` is set
in the environment; the codecs then run their pure-Python fast paths, which give the same results
(slower: a matching server's CPU per Step is about a third more). Every C function returns None
instead of raising, and the caller then runs the Python code, which produces the same value or
names the error.
"""

from __future__ import annotations

import os
import warnings
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
    "gd1_request",
    "gd1_readdress",
    "gd1_opens",
    "IdTriple",
)


def _load() -> ModuleType | None:
    if os.environ.get("WIRE_NO_SPEEDUPS"):
        return None
    try:
        from . import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    missing = [name for name in _FUNCTIONS if not hasattr(_speedups, name)]
    if missing:
        # Silent, this cost every codec its C paths unnoticed (a build older than the source).
        warnings.warn(
            f"wire: {_speedups.__file__} was built from an older wire/_speedups.c (it lacks"
            f" {', '.join(missing)}), so wire runs its pure-Python codecs: rebuild it with"
            " `python setup.py build_ext --inplace` (or `pip install -e .`)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    # The constructors the decoder uses build values from fields it has already checked.
    _speedups.init(
        Atom, Pid, Ref, ExitReason, ErrorValue, _tlv_fast._atom, _tlv_fast._pid, _tlv_fast._ref
    )
    return _speedups


C: ModuleType | None = _load()
