"""The stash client: Gunicorn's ``StashClient``/``StashTable`` API over a :class:`DirtyClient`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._client import DirtyClient, get_dirty_client
from ._errors import StashKeyNotFoundError
from ._stash import StashExtOp

__all__ = [
    "ABSENT",
    "StashClient",
    "StashTable",
    "clear",
    "compare_and_set",
    "delete",
    "delete_table",
    "ensure",
    "exists",
    "get",
    "info",
    "insert_new",
    "keys",
    "put",
    "table",
    "tables",
    "update_counter",
]

_MISSING: Any = object()


class StashClient:
    """Stash operations through a dirty client (thread-safe, like the client).

    Args:
        client: The client to use; None uses :func:`get_dirty_client`.
    """

    def __init__(self, client: DirtyClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> DirtyClient:
        """The dirty client the operations go through."""
        return self._client or get_dirty_client()

    def _op(
        self, op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
    ) -> Any:
        return self.client.stash_request(op, table, key, value, pattern)

    def put(self, table: str, key: Any, value: Any, *, ttl: float | None = None) -> None:
        """Store ``value`` under ``key`` (the table is created if needed); with ``ttl`` the
        entry expires after that many seconds."""
        if ttl is None:
            self._op(1, table, key, value)
        else:
            self._op(StashExtOp.PUT_TTL, table, key, {"value": value, "ttl": ttl})

    def get(self, table: str, key: Any, default: Any = None) -> Any:
        """The value under ``key``, or ``default`` if the key (or table) is missing."""
        try:
            return self._op(2, table, key)
        except StashKeyNotFoundError:
            return default

    def delete(self, table: str, key: Any) -> bool:
        """Remove ``key``; True if it was there."""
        return bool(self._op(3, table, key))

    def keys(self, table: str, pattern: str | None = None) -> list[Any]:
        """The table's keys, optionally filtered by a glob ``pattern`` (``"user:*"``, at most
        1,024 characters: a longer one is refused with StashError)."""
        return list(self._op(4, table, pattern=pattern))

    def clear(self, table: str) -> None:
        """Remove every entry."""
        self._op(5, table)

    def info(self, table: str) -> dict[str, Any]:
        """``{"size", "table"}``.

        Raises:
            StashTableNotFoundError: No such table.
        """
        return dict(self._op(6, table))

    def ensure(self, table: str) -> None:
        """Create the table if it does not exist."""
        self._op(7, table)

    def exists(self, table: str, key: Any = None) -> bool:
        """Whether the table (or the key in it) exists."""
        return bool(self._op(10, table, key))

    def delete_table(self, table: str) -> bool:
        """Delete the table; True if it existed."""
        return bool(self._op(8, table))

    def tables(self) -> list[str]:
        """Every table's name."""
        return list(self._op(9, ""))

    def table(self, name: str) -> StashTable:
        """A dict-like view of one table."""
        return StashTable(self, name)

    def update_counter(self, table: str, key: Any, incr: int = 1, default: int = 0) -> int:
        """Add ``incr`` to the int under ``key`` (``default`` if missing), atomically; returns
        the new value.

        Raises:
            StashError: The value is not an int.
        """
        return int(self._op(StashExtOp.INCR, table, key, {"incr": incr, "default": default}))

    def insert_new(self, table: str, key: Any, value: Any, *, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is missing; True if it was stored."""
        return bool(self._op(StashExtOp.INSERT_NEW, table, key, {"value": value, "ttl": ttl}))

    def compare_and_set(
        self,
        table: str,
        key: Any,
        expected: Any,
        value: Any,
        *,
        ttl: float | None = None,
    ) -> bool:
        """Store ``value`` only if the current value equals ``expected`` (:data:`ABSENT`: only
        if the key is missing), atomically; True if it was stored."""
        args: dict[str, Any] = {"value": value, "ttl": ttl}
        if expected is ABSENT:
            args["absent"] = True
        else:
            args["expected"] = expected
        return bool(self._op(StashExtOp.CAS, table, key, args))


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: ``compare_and_set(..., expected=ABSENT, ...)``: set only if the key is missing.
ABSENT: Any = _Absent()


class StashTable:
    """A dict-like view of one stash table (Gunicorn's ``StashTable``)."""

    def __init__(self, client: StashClient, name: str) -> None:
        self._client = client
        self._name = name

    @property
    def name(self) -> str:
        """The table's name."""
        return self._name

    def __getitem__(self, key: Any) -> Any:
        value = self._client.get(self._name, key, _MISSING)
        if value is _MISSING:
            raise StashKeyNotFoundError(self._name, key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._client.put(self._name, key, value)

    def __delitem__(self, key: Any) -> None:
        if not self._client.delete(self._name, key):
            raise StashKeyNotFoundError(self._name, key)

    def __contains__(self, key: Any) -> bool:
        if key is None:
            # EXISTS without a key asks whether the table exists: None is looked up instead.
            return self._client.get(self._name, None, _MISSING) is not _MISSING
        return self._client.exists(self._name, key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._client.keys(self._name))

    def __len__(self) -> int:
        try:
            return int(self._client.info(self._name)["size"])
        except LookupError:
            return 0

    def get(self, key: Any, default: Any = None) -> Any:
        """The value under ``key`` or ``default``."""
        return self._client.get(self._name, key, default)

    def keys(self, pattern: str | None = None) -> list[Any]:
        """The keys, optionally glob-filtered."""
        return self._client.keys(self._name, pattern)

    def clear(self) -> None:
        """Remove every entry."""
        self._client.clear(self._name)

    def items(self) -> list[tuple[Any, Any]]:
        """``(key, value)`` pairs (one round trip per key)."""
        return [(k, self._client.get(self._name, k)) for k in self.keys()]

    def values(self) -> list[Any]:
        """The values."""
        return [v for _, v in self.items()]


def _default() -> StashClient:
    return StashClient()


def put(table_name: str, key: Any, value: Any, *, ttl: float | None = None) -> None:
    """:meth:`StashClient.put` on the shared client."""
    _default().put(table_name, key, value, ttl=ttl)


def get(table_name: str, key: Any, default: Any = None) -> Any:
    """:meth:`StashClient.get` on the shared client."""
    return _default().get(table_name, key, default)


def delete(table_name: str, key: Any) -> bool:
    """:meth:`StashClient.delete` on the shared client."""
    return _default().delete(table_name, key)


def keys(table_name: str, pattern: str | None = None) -> list[Any]:
    """:meth:`StashClient.keys` on the shared client."""
    return _default().keys(table_name, pattern)


def clear(table_name: str) -> None:
    """:meth:`StashClient.clear` on the shared client."""
    _default().clear(table_name)


def info(table_name: str) -> dict[str, Any]:
    """:meth:`StashClient.info` on the shared client."""
    return _default().info(table_name)


def ensure(table_name: str) -> None:
    """:meth:`StashClient.ensure` on the shared client."""
    _default().ensure(table_name)


def exists(table_name: str, key: Any = None) -> bool:
    """:meth:`StashClient.exists` on the shared client."""
    return _default().exists(table_name, key)


def delete_table(table_name: str) -> bool:
    """:meth:`StashClient.delete_table` on the shared client."""
    return _default().delete_table(table_name)


def tables() -> list[str]:
    """:meth:`StashClient.tables` on the shared client."""
    return _default().tables()


def table(name: str) -> StashTable:
    """:meth:`StashClient.table` on the shared client."""
    return _default().table(name)


def update_counter(table_name: str, key: Any, incr: int = 1, default: int = 0) -> int:
    """:meth:`StashClient.update_counter` on the shared client."""
    return _default().update_counter(table_name, key, incr, default)


def insert_new(table_name: str, key: Any, value: Any, *, ttl: float | None = None) -> bool:
    """:meth:`StashClient.insert_new` on the shared client."""
    return _default().insert_new(table_name, key, value, ttl=ttl)


def compare_and_set(
    table_name: str, key: Any, expected: Any, value: Any, *, ttl: float | None = None
) -> bool:
    """:meth:`StashClient.compare_and_set` on the shared client."""
    return _default().compare_and_set(table_name, key, expected, value, ttl=ttl)
