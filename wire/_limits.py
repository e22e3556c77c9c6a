"""Decoding limits: every size a peer claims is checked against these before anything is allocated.

The defaults match Gunicorn 27's dirty protocol where it has a limit (64 MiB payloads and strings,
1,048,576 items a container) and add the bounds it lacks (nesting depth, total item count).
"""

from __future__ import annotations

from typing import Any

import attrs

from ._errors import InvalidValue, LimitExceeded

__all__ = ["MAX_PAYLOAD", "Limits"]

#: The largest payload any frame may carry (the header's limit in Gunicorn's protocol).
MAX_PAYLOAD = 64 * 1024 * 1024

# The encoders' optimistic fast paths collect the pieces of an encoding in a list and join them
# once, so they do not count bytes as they go. They bound the bytes through the number of pieces
# instead: a str or bytes longer than FAST_PIECE_BYTES adds one empty piece (NO_PIECE) for each
# FAST_PIECE_BYTES it holds, every other piece holds fewer bytes than that, and the fast paths
# give anything over FAST_MAX_PARTS pieces to the exact loops, which count every byte. So a value
# whose encoding is far over max_payload never has all of it built.
FAST_PIECE_BYTES = 1024
FAST_MAX_PARTS = MAX_PAYLOAD // (2 * (FAST_PIECE_BYTES + 9))
NO_PIECE = [b""]


def payload_too_large(size: int, max_payload: int) -> LimitExceeded:
    """The error of an encoding that has reached ``size`` bytes, over ``max_payload``."""
    return LimitExceeded(
        f"payload of {size} bytes or more exceeds max_payload={max_payload}; split it into "
        "CHUNK frames"
    )


def _positive_up_to(maximum: int | None) -> Any:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not int or value < 1 or (maximum is not None and value > maximum):
            upper = f"1..{maximum}" if maximum is not None else ">= 1"
            raise InvalidValue(
                f"Limits.{attribute.name} must be an int {upper} (got {value!r}); "
                "limits can only be lowered below the protocol's own"
            )

    return check


@attrs.frozen
class Limits:
    """Bounds enforced when decoding (and, so we never send what a peer must reject, encoding).

    Attributes:
        max_payload: Largest payload in bytes; at most :data:`MAX_PAYLOAD` (64 MiB).
        max_depth: Deepest nesting of containers (list, dict, tuple, exit reason, error value).
        max_items: Most items in one list or tuple, or pairs in one dict.
        max_total_items: Most values in one payload, all containers together; bounds the memory
            a small payload can make the decoder allocate.
        max_str: Longest string or bytes value, in bytes.
        max_bigint_bytes: Longest big integer magnitude, in bytes (version 2 only).
    """

    max_payload: int = attrs.field(default=MAX_PAYLOAD, validator=_positive_up_to(MAX_PAYLOAD))
    max_depth: int = attrs.field(default=256, validator=_positive_up_to(10_000))
    max_items: int = attrs.field(default=1024 * 1024, validator=_positive_up_to(None))
    max_total_items: int = attrs.field(default=8 * 1024 * 1024, validator=_positive_up_to(None))
    max_str: int = attrs.field(default=MAX_PAYLOAD, validator=_positive_up_to(MAX_PAYLOAD))
    max_bigint_bytes: int = attrs.field(default=1024, validator=_positive_up_to(MAX_PAYLOAD))
