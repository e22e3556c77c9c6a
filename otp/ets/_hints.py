"""The ``new/2`` options OTP tunes performance with: ``read_concurrency``,
``write_concurrency``, ``compressed``, ``decentralized_counters``.

Here they are hints: accepted, validated, reported by ``info`` and saved by ``tab2file``, and
they change nothing. Every local process runs in one trio thread and each operation is one
uninterrupted step, so there is no lock to split (OTP's concurrency options) and objects are
Python tuples shared by reference, with nothing to compress.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ._errors import EtsError, brief

WriteConcurrency = bool | Literal["auto"]


@attrs.frozen(slots=True)
class Hints:
    """The performance options a table was created with (OTP's defaults: all off)."""

    read_concurrency: bool = False
    write_concurrency: WriteConcurrency = False
    compressed: bool = False
    decentralized_counters: bool | None = None

    def decentralized(self, ordered: bool) -> bool:
        """What OTP 25 reports: off without write_concurrency; by default on with ``"auto"``,
        and with ``True`` for an ordered_set."""
        if self.write_concurrency is False:
            return False
        if self.decentralized_counters is not None:
            return self.decentralized_counters
        return self.write_concurrency == "auto" or ordered


NO_HINTS = Hints()


def make_hints(
    name: str,
    read_concurrency: Any,
    write_concurrency: Any,
    compressed: Any,
    decentralized_counters: Any,
) -> Hints:
    """Validated hints for ``ets.new(name, ...)``.

    Raises:
        EtsError: an option has a value OTP would refuse (badarg).
    """
    for field, value in (("read_concurrency", read_concurrency), ("compressed", compressed)):
        if value.__class__ is not bool:
            raise EtsError(
                f"ets.new({brief(name)}): {field} must be True or False (got {brief(value)})",
                operation="new",
            )
    if write_concurrency.__class__ is not bool and write_concurrency != "auto":
        raise EtsError(
            f"ets.new({brief(name)}): write_concurrency must be True, False or 'auto'"
            f" (got {brief(write_concurrency)})",
            operation="new",
        )
    if decentralized_counters is not None and decentralized_counters.__class__ is not bool:
        raise EtsError(
            f"ets.new({brief(name)}): decentralized_counters must be True, False or None (OTP's"
            f" default for the write_concurrency given) (got {brief(decentralized_counters)})",
            operation="new",
        )
    if (read_concurrency, write_concurrency, compressed, decentralized_counters) == (
        False,
        False,
        False,
        None,
    ):
        return NO_HINTS
    return Hints(read_concurrency, write_concurrency, compressed, decentralized_counters)
