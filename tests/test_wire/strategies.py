"""Hypothesis strategies for wire values."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import wire

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
names = st.text(max_size=12).filter(lambda s: len(s.encode()) <= 255)
floats = st.floats(allow_nan=False)

v1_scalars = st.one_of(
    st.none(), st.booleans(), I64, floats, st.binary(max_size=40), st.text(max_size=40)
)


def v1_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Values of TLV version 1 (Gunicorn's eight types, str keys)."""
    return st.recursive(
        v1_scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=10), inner, max_size=6)
        ),
        max_leaves=max_leaves,
    )


pids = st.builds(wire.Pid, names, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
refs = st.builds(wire.Ref, names, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
atoms = st.builds(wire.Atom, names)
bigints = st.integers(min_value=-(2**700), max_value=2**700)
kinds = st.sampled_from(
    ["normal", "shutdown", "kill", "killed", "noproc", "noconnection", "crash", "x"]
)

v2_scalars = st.one_of(v1_scalars, bigints, atoms, pids, refs)

hashable = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        bigints,
        floats,
        st.binary(max_size=8),
        st.text(max_size=8),
        atoms,
        pids,
        refs,
    ),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)


def v2_values(
    max_leaves: int = 30, scalars: st.SearchStrategy[Any] = v2_scalars
) -> st.SearchStrategy[Any]:
    """Values of version 2 (TLV and CBOR), nested, with leaves drawn from ``scalars``."""
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5),
            st.lists(inner, max_size=5).map(tuple),
            st.dictionaries(hashable, inner, max_size=5),
            st.builds(wire.ExitReason, kinds, inner),
            st.builds(
                wire.ErrorValue,
                st.text(max_size=10),
                st.text(max_size=10),
                st.dictionaries(st.text(max_size=5), inner, max_size=3),
                st.text(max_size=20),
            ),
        ),
        max_leaves=max_leaves,
    )
