"""The ``ordered_set`` index: the stored keys in Erlang's term order, as a chunked sorted list.

ERTS keeps an ordered_set in an AVL tree (O(log n) insert, delete and neighbour search). Here
the keys' flat sort keys (``_order.order_key``) sit in short sorted chunks, each with the key
it was indexed by alongside, plus the largest sort key of each chunk: a search is a bisect of
the chunk maxima then of one chunk, and an insert or delete moves at most one chunk's worth of
pointers, so both stay close to O(log n) where one flat list made them O(n) (the layout of
``sortedcontainers.SortedList``, kept to what ETS needs and paired with the indexed keys).
"""

from __future__ import annotations

import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Any

#: A chunk splits in two when it grows past twice this, and merges with a neighbour when it
#: shrinks below half of it. Around a thousand keeps a 1k-key table in one or two chunks (as
#: cheap as a flat list) and a 1M-key table's chunk maxima short.
CHUNK = 1000


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


#: What a search returns when no key qualifies (None is a valid key).
ABSENT: Any = _Absent()


class OrderedIndex:
    """Sort keys (``sks``) in order, each paired with the key it was indexed by (``raws``).

    Positions are (chunk, offset) pairs inside; callers see keys only. Every sort key is
    unique: :meth:`add` reports a sort key already present instead of adding it.
    """

    __slots__ = ("_maxes", "_raws", "_sks", "ords")

    def __init__(self) -> None:
        self._sks: list[list[Any]] = []
        self._raws: list[list[Any]] = []
        self._maxes: list[Any] = []
        #: Each indexed key's sort key, as computed when it was indexed: a key == to it may
        #: sort elsewhere (``frozenset({1.0})`` and ``frozenset({1})`` have different reprs),
        #: so the index is searched with this one, never with the caller's key.
        self.ords: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self.ords)

    def __bool__(self) -> bool:
        return bool(self.ords)

    def __iter__(self) -> Iterator[Any]:
        """The indexed keys in order (iterate over a copy: see :meth:`keys`)."""
        for raws in self._raws:
            yield from raws

    def keys(self) -> list[Any]:
        """A new list of the indexed keys, in order."""
        out: list[Any] = []
        for raws in self._raws:
            out += raws
        return out

    def clear(self) -> None:
        self._sks.clear()
        self._raws.clear()
        self._maxes.clear()
        self.ords.clear()

    def holder(self, sk: Any) -> Any:
        """The indexed key whose sort key equals ``sk``, or ABSENT."""
        maxes = self._maxes
        ci = bisect_left(maxes, sk)
        if ci == len(maxes):
            return ABSENT
        chunk = self._sks[ci]
        i = bisect_left(chunk, sk)
        return self._raws[ci][i] if chunk[i] == sk else ABSENT

    def add(self, key: Any, sk: Any) -> Any:
        """Index ``key`` under sort key ``sk``; returns ABSENT, or (nothing added) the key
        already indexed under an equal sort key."""
        maxes = self._maxes
        if not maxes:
            self._sks.append([sk])
            self._raws.append([key])
            maxes.append(sk)
        else:
            ci = bisect_left(maxes, sk)
            if ci == len(maxes):
                ci -= 1  # above every key: the last chunk grows
                chunk = self._sks[ci]
                chunk.append(sk)
                self._raws[ci].append(key)
                maxes[ci] = sk
            else:
                chunk = self._sks[ci]
                i = bisect_left(chunk, sk)
                if chunk[i] == sk:
                    return self._raws[ci][i]
                chunk.insert(i, sk)
                self._raws[ci].insert(i, key)
            if len(chunk) > 2 * CHUNK:
                self._split(ci)
        self.ords[key] = sk
        return ABSENT

    def remove(self, key: Any) -> None:
        """Drop ``key`` (indexed, as the table's data says) from the index."""
        sk = self.ords.pop(key)
        ci = bisect_left(self._maxes, sk)
        chunk = self._sks[ci]
        i = bisect_left(chunk, sk)
        del chunk[i]
        del self._raws[ci][i]
        if not chunk:
            del self._sks[ci], self._raws[ci], self._maxes[ci]
            return
        if i == len(chunk):
            self._maxes[ci] = chunk[-1]
        if len(chunk) < CHUNK // 2 and len(self._sks) > 1:
            self._merge(ci)

    def _split(self, ci: int) -> None:
        sks, raws = self._sks[ci], self._raws[ci]
        half = len(sks) // 2
        self._sks[ci + 1 : ci + 1] = [sks[half:]]
        self._raws[ci + 1 : ci + 1] = [raws[half:]]
        del sks[half:], raws[half:]
        self._maxes.insert(ci, sks[-1])

    def _merge(self, ci: int) -> None:
        """Join chunk ``ci`` with its right neighbour (its left one if it is the last), then
        split the result again if that made it too long."""
        if ci == len(self._sks) - 1:
            ci -= 1
        self._sks[ci] += self._sks[ci + 1]
        self._raws[ci] += self._raws[ci + 1]
        self._maxes[ci] = self._maxes[ci + 1]
        del self._sks[ci + 1], self._raws[ci + 1], self._maxes[ci + 1]
        if len(self._sks[ci]) > 2 * CHUNK:
            self._split(ci)

    def sort_key(self, key: Any) -> Any:
        """The sort key ``key`` was indexed with, or None (not indexed, or unhashable)."""
        try:
            return self.ords.get(key)
        except TypeError:
            return None

    def first(self) -> Any:
        """The first indexed key (the index is not empty)."""
        return self._raws[0][0]

    def last(self) -> Any:
        """The last indexed key (the index is not empty)."""
        return self._raws[-1][-1]

    def at(self, position: int) -> Any:
        """The indexed key at ``position`` (0-based, in order; 0 <= position < len)."""
        for raws in self._raws:
            if position < len(raws):
                return raws[position]
            position -= len(raws)
        raise IndexError(position)

    def after(self, sk: Any) -> Any:
        """The first indexed key whose sort key is above ``sk``, or ABSENT."""
        maxes = self._maxes
        ci = bisect_right(maxes, sk)
        if ci == len(maxes):
            return ABSENT
        return self._raws[ci][bisect_right(self._sks[ci], sk)]

    def before(self, sk: Any) -> Any:
        """The last indexed key whose sort key is below ``sk``, or ABSENT."""
        maxes = self._maxes
        ci = bisect_left(maxes, sk)
        if ci == len(maxes):
            return self._raws[-1][-1] if maxes else ABSENT
        i = bisect_left(self._sks[ci], sk)
        if i:
            return self._raws[ci][i - 1]
        return self._raws[ci - 1][-1] if ci else ABSENT

    def run(self, sk: Any, count: int, reverse: bool) -> list[Any]:
        """Up to ``count`` indexed keys after sort key ``sk`` (before it if ``reverse``, nearest
        first); from the first (last) key if ``sk`` is None."""
        out: list[Any] = []
        sks, raws, maxes = self._sks, self._raws, self._maxes
        if not reverse:
            if sk is None:
                ci, i = 0, 0
            else:
                ci = bisect_right(maxes, sk)
                i = bisect_right(sks[ci], sk) if ci < len(maxes) else 0
            while ci < len(raws) and len(out) < count:
                out += raws[ci][i : i + count - len(out)]
                ci, i = ci + 1, 0
            return out
        if sk is None:
            ci = len(raws) - 1
            end = len(raws[ci]) if raws else 0
        else:
            ci = bisect_left(maxes, sk)
            if ci == len(maxes):
                ci = len(raws) - 1
                end = len(raws[ci]) if raws else 0
            else:
                end = bisect_left(sks[ci], sk)
        while ci >= 0 and len(out) < count:
            chunk = raws[ci]
            begin = max(0, end - (count - len(out)))
            out += chunk[begin:end][::-1]
            ci -= 1
            end = len(raws[ci]) if ci >= 0 else 0
        return out

    def memory(self) -> int:
        """Bytes held by the index's own lists (what ``ets.info(t, "memory")`` counts)."""
        size = sys.getsizeof(self._sks) + sys.getsizeof(self._raws) + sys.getsizeof(self._maxes)
        size += sum(sys.getsizeof(chunk) for chunk in self._sks)
        size += sum(sys.getsizeof(chunk) for chunk in self._raws)
        return size + sys.getsizeof(self.ords)
