"""``tab2file``/``file2tab``: a table saved to a file and loaded back (Erlang's
``ets:tab2file/2,3`` and ``ets:file2tab/1,2``), in the project's own encoding, never pickle.

The file (all integers big-endian, as in ``wire/SPEC.md``)::

    magic    8 bytes   89 45 54 53 0d 0a 1a 0a   (b"\\x89ETS\\r\\n\\x1a\\n": text mode breaks it)
    version  u16       1
    records  kind u8, length u32, then one canonical CBOR item (wire/SPEC.md section 5)
             "H" (once, first): a map of the table's options (name, type, access, ...)
             "O" (any number): an array of at most 1024 objects (tuples)
    trailer  "F", u64 count of objects, 32-byte SHA-256 of every byte before the trailer

``file2tab`` checks the magic, the version and the checksum before it decodes anything, then
decodes under ``wire``'s limits, so a damaged, truncated or altered file raises
:class:`TableFileError` naming the file and never builds a table. The checksum detects
damage, not a forger who rewrites it: load only files you trust the origin of.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import trio

import wire

from .._dist_values import value_from_wire, value_to_wire
from .._errors import BadArg
from .._process import current_process
from ._access import reader
from ._errors import EtsError, brief
from ._lifecycle import delete
from ._new import new
from ._table import describe
from ._types import TableRef
from ._write import insert

MAGIC = b"\x89ETS\r\n\x1a\n"
VERSION = 1
_HEADER = b"H"
_OBJECTS = b"O"
_TRAILER = b"F"
_RECORD = struct.Struct(">cI")
_TRAILER_SIZE = 1 + 8 + 32
#: Objects per "O" record: a record stays far below wire's item and payload limits.
CHUNK = 1024


class TableFileError(EtsError, ValueError):
    """A file ``file2tab`` cannot load: not a table file, a version this code does not read,
    truncated, damaged or altered (the checksum disagrees), or malformed inside.

    Attributes:
        path: the file.
        reason: ``"magic"``, ``"version"``, ``"truncated"``, ``"checksum"`` or
            ``"malformed"``.
    """

    def __init__(self, message: str, *, path: str, reason: str) -> None:
        super().__init__(message, operation="file2tab")
        self.path = path
        self.reason = reason


async def tab2file(table: TableRef, path: str | os.PathLike[str], *, sync: bool = False) -> None:
    """Save the table to ``path`` (Erlang's ``ets:tab2file/3``): its options and every object,
    as they are at the call (one atomic snapshot, unlike OTP's dump of a public table).

    The file is written in a worker thread to a temporary file that then replaces ``path``,
    so ``path`` holds either the old file or the whole new one, even if the caller is
    cancelled or the node dies meanwhile. ``sync=True`` also flushes it to the disk first.
    Expiry deadlines are not saved: a loaded table gives its objects its ``expire_after``.

    Raises:
        AccessDenied: the table is private and the caller is not its owner.
        EtsError: an object holds a value the wire encoding has no form for (only None, bool,
            int, float, str, bytes, list, tuple, dict, Pid, Ref and exit reasons are saved).
        OSError: the file cannot be written.
    """
    tab = reader(table, "tab2file")
    name = os.fspath(path)
    hints = tab.hints
    header = {
        "name": tab.name,
        "type": tab.kind.value,
        "access": tab.access.value,
        "named": tab.named,
        "keypos": tab.kp,
        "expire_after": tab.default_ttl,
        "read_concurrency": hints.read_concurrency,
        "write_concurrency": hints.write_concurrency,
        "compressed": hints.compressed,
        "decentralized_counters": hints.decentralized_counters,
    }
    objects = []
    for obj in tab.objects():
        try:
            objects.append(value_to_wire(obj))
        except BadArg as exc:
            raise EtsError(
                f"ets.tab2file({describe(table)}, {name!r}): {brief(obj)} cannot be saved: {exc}",
                table=table,
                operation="tab2file",
            ) from None
    try:
        await trio.to_thread.run_sync(_write, Path(name), header, objects, sync)
    except wire.WireError as exc:
        raise EtsError(
            f"ets.tab2file({describe(table)}, {name!r}): the table cannot be encoded: {exc}",
            table=table,
            operation="tab2file",
        ) from exc


def _write(path: Path, header: dict[str, Any], objects: list[Any], sync: bool) -> None:
    digest = hashlib.sha256()
    # A fresh name per call: two saves to one path never share a temporary file.
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:

            def put(data: bytes) -> None:
                digest.update(data)
                out.write(data)

            put(MAGIC + struct.pack(">H", VERSION))
            _put_record(put, _HEADER, header)
            for at in range(0, len(objects), CHUNK):
                _put_record(put, _OBJECTS, objects[at : at + CHUNK])
            out.write(_TRAILER + struct.pack(">Q", len(objects)) + digest.digest())
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _put_record(put: Any, kind: bytes, value: Any) -> None:
    item = wire.cbor_encode(value)
    put(_RECORD.pack(kind, len(item)) + item)


async def file2tab(path: str | os.PathLike[str]) -> Any:
    """Create the table saved in ``path`` (Erlang's ``ets:file2tab/2`` with
    ``{verify, true}``): same name, type, access, keypos, options and objects, owned by the
    calling process (no heir: pids do not outlive their node). Returns what ``new`` returns.

    The file is read and checked in a worker thread; the table appears at once, complete.

    Raises:
        TableFileError: the file is not a valid table file (see its ``reason``).
        NameTaken: the table was named and a table with the name exists.
        OSError: the file cannot be read.
    """
    name = os.fspath(path)
    proc = current_process()
    header, objects = await trio.to_thread.run_sync(_read, Path(name))
    node = proc.node
    try:
        table = new(
            _field(header, "name", str, name),
            type=_field(header, "type", str, name),
            access=_field(header, "access", str, name),
            named=_field(header, "named", bool, name),
            keypos=_field(header, "keypos", int, name),
            expire_after=_field(header, "expire_after", (int, float, type(None)), name),
            read_concurrency=_field(header, "read_concurrency", bool, name),
            write_concurrency=_field(header, "write_concurrency", (bool, str), name),
            compressed=_field(header, "compressed", bool, name),
            decentralized_counters=_field(
                header, "decentralized_counters", (bool, type(None)), name
            ),
        )
    except TableFileError:
        raise
    except EtsError as exc:
        if exc.__class__ is not EtsError:
            raise  # NameTaken: the file is fine, the node is not ready for it
        raise _bad(name, "malformed", f"its header is invalid: {exc}") from exc
    try:
        insert(table, [value_from_wire(obj, node) for obj in objects])
    except EtsError as exc:
        delete(table)
        raise _bad(name, "malformed", f"an object is invalid: {exc}") from exc
    return table


def _field(header: dict[str, Any], key: str, kind: Any, name: str) -> Any:
    value = header.get(key)
    if key not in header or not isinstance(value, kind):
        raise _bad(name, "malformed", f"its header has no valid {brief(key)} (got {brief(value)})")
    return value


def _bad(name: str, reason: str, what: str) -> TableFileError:
    advice = {
        "magic": "it was not written by ets.tab2file",
        "version": "it was written by a newer otp.ets; load it with that version",
        "truncated": "the file is incomplete (a copy or a write was cut short)",
        "checksum": "the file was damaged or altered after tab2file wrote it",
        "malformed": "the file is not what tab2file writes",
    }[reason]
    return TableFileError(
        f"ets.file2tab({name!r}): cannot load the table: {what} ({advice})",
        path=name,
        reason=reason,
    )


def _read(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """Check and decode a table file (runs in a worker thread)."""
    data = path.read_bytes()
    name = str(path)
    head = data[: len(MAGIC)]
    if head != MAGIC[: len(head)]:
        raise _bad(name, "magic", f"it does not start with {MAGIC!r}")
    if len(data) < len(MAGIC) + 2 + _TRAILER_SIZE:
        raise _bad(name, "truncated", f"it has {len(data)} bytes, too few for a table file")
    (version,) = struct.unpack_from(">H", data, len(MAGIC))
    if version != VERSION:
        raise _bad(name, "version", f"it is format version {version}, this reads {VERSION}")
    body_end = len(data) - _TRAILER_SIZE
    if data[body_end : body_end + 1] != _TRAILER:
        raise _bad(name, "truncated", "it does not end with the trailer")
    (count,) = struct.unpack_from(">Q", data, body_end + 1)
    if hashlib.sha256(data[:body_end]).digest() != data[body_end + 9 :]:
        raise _bad(name, "checksum", "its SHA-256 does not match its trailer")
    return _records(data, len(MAGIC) + 2, body_end, count, name)


def _records(
    data: bytes, at: int, end: int, count: int, name: str
) -> tuple[dict[str, Any], list[Any]]:
    header: dict[str, Any] | None = None
    objects: list[Any] = []
    while at < end:
        if end - at < _RECORD.size:
            raise _bad(name, "malformed", f"a record header is cut at offset {at}")
        kind, length = _RECORD.unpack_from(data, at)
        at += _RECORD.size
        if length > end - at:
            raise _bad(name, "malformed", f"the record at offset {at} overruns the file")
        try:
            value = wire.cbor_decode(data[at : at + length])
        except wire.WireError as exc:
            raise _bad(name, "malformed", f"the record at offset {at}: {exc}") from exc
        if kind == _HEADER and header is None and isinstance(value, dict):
            header = value
        elif kind == _OBJECTS and header is not None and isinstance(value, list):
            objects.extend(value)
        else:
            raise _bad(name, "malformed", f"unexpected record {brief(kind)} at offset {at}")
        at += length
    if header is None:
        raise _bad(name, "malformed", "it has no header record")
    if len(objects) != count:
        raise _bad(name, "malformed", f"it holds {len(objects)} objects, its trailer says {count}")
    return header, objects
