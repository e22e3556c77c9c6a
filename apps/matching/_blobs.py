"""BlobCache: content-addressed, out-of-band storage for large arguments and results.

A value sent to the server keeps its small parts inline; each ``bytes`` longer than the
cache's ``inline_limit`` travels as a reference ``{"$blob": "sha256:<hex>", "size": n}`` and its
bytes go through the server's ``put_blob``/``get_blob`` ops (the seed's ``BlobCache``). Files
are written atomically (a temporary file, then ``os.replace``) and verified against their key
on every read, so a torn or corrupted file is noticed and removed, never returned.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

import trio

from ._errors import BlobCorrupted, BlobNotFound, ConfigurationError, InvalidBlobKey

__all__ = [
    "NEEDS_IO",
    "BlobCache",
    "BlobIO",
    "LocalIO",
    "ServerIO",
    "BlobCorrupted",
    "InvalidBlobKey",
    "blob_key",
    "is_blob_ref",
]

_KEY = re.compile(r"sha256:[0-9a-f]{64}")
_PREFIX = "sha256:"
_TMP = ".tmp-"
#: The reference's marker key; a dict ``{"$blob": key, "size": n}`` in a value is a blob.
REF_KEY = "$blob"
#: What :meth:`BlobCache.pack_now` and :meth:`BlobCache.unpack_now` return for a value that
#: carries blobs (files and maybe the server are needed: use the async methods).
NEEDS_IO: Any = object()


def blob_key(data: bytes | bytearray | memoryview) -> str:
    """The key of ``data``: ``"sha256:<hex>"``."""
    return _PREFIX + hashlib.sha256(data).hexdigest()


def _check_key(key: object) -> str:
    if type(key) is not str or _KEY.fullmatch(key) is None:
        raise InvalidBlobKey(
            f"a blob key must be 'sha256:' followed by 64 lowercase hex digits (got {key!r})"
        )
    return key


def is_blob_ref(value: object) -> bool:
    """Whether ``value`` is a blob reference ``{"$blob": key, "size": n}``."""
    return (
        type(value) is dict
        and len(value) == 2
        and type(value.get(REF_KEY)) is str
        and type(value.get("size")) is int
    )


def _default_directory() -> str:
    try:
        user = str(os.getuid())  # type: ignore[attr-defined,unused-ignore]
    except AttributeError:  # pragma: no cover - Windows
        user = re.sub(r"[^A-Za-z0-9_.-]", "_", os.environ.get("USERNAME", "user"))
    return os.path.join(tempfile.gettempdir(), f"otp-matching-blobs-{user}")


class LocalIO:
    """A step of :meth:`BlobCache.pack_steps`: call ``fn(*args)`` (file I/O; blocks)."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args


class ServerIO:
    """A step of :meth:`BlobCache.pack_steps` (``put_blob`` of bytes) or ``unpack_steps``
    (``get_blob`` of a key): ask the server."""

    __slots__ = ("arg",)

    def __init__(self, arg: Any) -> None:
        self.arg = arg


BlobIO = LocalIO | ServerIO


async def _drive(
    steps: Generator[BlobIO, Any, Any], server: Callable[[Any], Awaitable[Any]]
) -> Any:
    """Carry out ``steps`` on trio: files in a worker thread, the server through ``server``."""
    answer: Any = None
    try:
        while True:
            step = steps.send(answer)
            if isinstance(step, LocalIO):
                answer = await trio.to_thread.run_sync(step.fn, *step.args)
            else:
                answer = await server(step.arg)
    except StopIteration as stop:
        await trio.lowlevel.checkpoint()
        return stop.value


class BlobCache:
    """Content-addressed blobs in a directory, plus the packing of values that carry them.

    Args:
        directory: Where the files live; created (mode 0700) if missing. None: a per-user
            directory under ``tempfile.gettempdir()``.
        inline_limit: ``bytes``/``bytearray`` values longer than this many bytes are packed as
            blob references; shorter ones stay inline.
        max_bytes: If given, the least recently used files are removed once the files add up
            to more than this (the blob just stored is never the one removed, so one blob
            larger than ``max_bytes`` is kept until the next one arrives). None: no limit.

    Every method may be called from any thread; the async ones do their file I/O in
    ``trio.to_thread``. Keys are validated before any path is built, so no key reaches outside
    the directory.

    Raises:
        ConfigurationError: An argument is invalid, or the directory is a symlink or not ours.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        inline_limit: int = 256 * 1024,
        max_bytes: int | None = None,
    ) -> None:
        if type(inline_limit) is not int or inline_limit < 0:
            raise ConfigurationError(
                f"BlobCache.inline_limit must be an int >= 0 (got {inline_limit!r})"
            )
        if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 1):
            raise ConfigurationError(
                f"BlobCache.max_bytes must be an int >= 1 or None (got {max_bytes!r})"
            )
        self.inline_limit = inline_limit
        self.max_bytes = max_bytes
        self.directory = os.fspath(directory) if directory is not None else _default_directory()
        self._lock = threading.Lock()
        #: key -> size, least recently used first (only kept when max_bytes is set).
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._total = 0
        self._prepare()

    def __repr__(self) -> str:
        return f"BlobCache({self.directory!r}, inline_limit={self.inline_limit})"

    def _prepare(self) -> None:
        path = self.directory
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError as exc:
            raise ConfigurationError(
                f"BlobCache.directory {path!r} cannot be created or read: {exc}; pass a"
                " writable directory"
            ) from exc
        if not os.path.isdir(path) or os.path.islink(path):
            raise ConfigurationError(
                f"BlobCache.directory {path!r} must be a directory, not a symlink or a file"
            )
        getuid = getattr(os, "getuid", None)
        if getuid is not None and st.st_uid != getuid():
            raise ConfigurationError(
                f"BlobCache.directory {path!r} belongs to uid {st.st_uid}, not to this user;"
                " pass a directory of your own"
            )
        if self.max_bytes is not None:
            entries = []
            with os.scandir(path) as it:
                for entry in it:
                    if _KEY.fullmatch(_PREFIX + entry.name) and entry.is_file():
                        est = entry.stat()
                        entries.append((est.st_mtime, _PREFIX + entry.name, est.st_size))
            for _, key, size in sorted(entries):
                self._lru[key] = size
                self._total += size

    def path_of(self, key: str) -> str:
        """The file that holds ``key``.

        Raises:
            InvalidBlobKey: ``key`` is not a valid key.
        """
        return os.path.join(self.directory, _check_key(key)[len(_PREFIX) :])

    # -- the store -------------------------------------------------------------------------

    def put(self, data: bytes | bytearray | memoryview) -> str:
        """Store ``data`` (atomically; storing it again is a no-op) and return its key."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"BlobCache.put takes bytes (got {type(data).__name__})")
        key = blob_key(data)
        self._store(key, data)
        return key

    def _store(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self.path_of(key)
        if os.path.exists(path):
            self._touch(key, path, len(data))
            return
        tmp = os.path.join(self.directory, f"{_TMP}{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._added(key, len(data))

    def get(self, key: str) -> bytes:
        """The bytes of ``key``, verified against it.

        Raises:
            InvalidBlobKey: ``key`` is not a valid key.
            KeyError: No blob has that key here.
            BlobCorrupted: The file does not hash to its key (it is removed).
        """
        path = self.path_of(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {key} in {self.directory}") from None
        if blob_key(data) != key:
            self._discard(key, path)
            raise BlobCorrupted(
                f"blob {key} at {path} is corrupt (its bytes hash to {blob_key(data)}); the file"
                " was removed, fetch or store the blob again"
            )
        self._touch(key, path, len(data))
        return data

    def has(self, key: str) -> bool:
        """Whether a file for ``key`` is here (not verified until :meth:`get`)."""
        return os.path.isfile(self.path_of(key))

    def remove(self, key: str) -> None:
        """Forget ``key`` (nothing happens if it is not here)."""
        self._discard(key, self.path_of(key))

    @property
    def total_bytes(self) -> int:
        """Bytes in the files this cache counts (only tracked when ``max_bytes`` is set)."""
        return self._total

    def _discard(self, key: str, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        with self._lock:
            size = self._lru.pop(key, None)
            if size is not None:
                self._total -= size

    def _touch(self, key: str, path: str, size: int) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                return
        self._added(key, size)

    def _added(self, key: str, size: int) -> None:
        if self.max_bytes is None:
            return
        victims: list[str] = []
        with self._lock:
            if key not in self._lru:
                self._lru[key] = size
                self._total += size
            self._lru.move_to_end(key)
            while self._total > self.max_bytes and len(self._lru) > 1:
                old, old_size = self._lru.popitem(last=False)
                self._total -= old_size
                victims.append(old)
        for old in victims:
            try:
                os.unlink(self.path_of(old))
            except FileNotFoundError:
                pass

    # -- values ----------------------------------------------------------------------------

    def _large(self, value: object) -> bool:
        return isinstance(value, bytes | bytearray) and len(value) > self.inline_limit

    def pack(self, value: Any) -> Any:
        """``value`` with each large ``bytes`` (in lists, tuples and dict values, at any depth)
        stored here and replaced by its reference. Local only: see :meth:`pack_async`."""
        return _walk(value, self._large, lambda data: _ref(self.put(data), len(data)))

    def unpack(self, value: Any) -> Any:
        """``value`` with each blob reference replaced by its bytes, read from here.

        Raises:
            KeyError: A referenced blob is not here.
            BlobCorrupted: A file is corrupt, or a reference's size is wrong.
        """
        return _walk(value, is_blob_ref, lambda ref: self._sized(ref, self.get(ref[REF_KEY])))

    async def pack_async(self, value: Any, upload: Callable[[bytes], Awaitable[str]]) -> Any:
        """As :meth:`pack`, and each blob the value carries is also handed to ``upload`` (the
        server's ``put_blob``) once, so a remote worker can fetch it.

        Cancellation leaves the blobs stored so far here (and maybe uploaded); nothing else.

        Raises:
            BlobCorrupted: ``upload`` answered with another key than the blob's.
        """
        copy = self.pack_now(value)
        if copy is not NEEDS_IO:  # (the usual case)
            # A cancel point but no schedule point: the caller's next step is a write to the
            # server, and a pass through the scheduler here cost a wake-up per call.
            await trio.lowlevel.checkpoint_if_cancelled()
            return copy
        return await _drive(self.pack_steps(value), upload)

    async def unpack_async(self, value: Any, fetch: Callable[[str], Awaitable[bytes]]) -> Any:
        """As :meth:`unpack`, fetching what is not here with ``fetch`` (the server's
        ``get_blob``): the fetched bytes are verified against their key and stored. A corrupt
        local file is removed and fetched again.

        Cancellation leaves the blobs fetched so far stored here.

        Raises:
            BlobCorrupted: ``fetch`` returned bytes that do not hash to the key, or a
                reference's size is wrong.
            InvalidBlobKey: A reference's key is not valid.
        """
        copy = self.unpack_now(value)
        if copy is not NEEDS_IO:  # (the usual case)
            await trio.lowlevel.checkpoint_if_cancelled()  # (as pack_async's)
            return copy
        return await _drive(self.unpack_steps(value), fetch)

    def pack_steps(self, value: Any) -> Generator[BlobIO, Any, Any]:
        """:meth:`pack_async` without I/O of its own (sans-io, for every transport): yields
        each step to carry out, a :class:`LocalIO` (this cache's files; its result is sent
        back) or the :class:`ServerIO` ``put_blob`` of a blob (its key is sent back), and
        returns the packed value."""
        found: dict[int, tuple[bytes | bytearray, str]] = {}
        _walk(value, self._large, lambda data: found.setdefault(id(data), (data, ""))[0])
        keys: dict[int, str] = {}
        uploaded: set[str] = set()
        for ident, (data, _) in found.items():
            key = yield LocalIO(self.put, (data,))
            keys[ident] = key
            if key in uploaded:
                continue
            answer = yield ServerIO(bytes(data))
            if answer != key:
                raise BlobCorrupted(f"the server stored blob {key} under another key ({answer!r})")
            uploaded.add(key)
        return _walk(value, self._large, lambda data: _ref(keys[id(data)], len(data)))

    def unpack_steps(self, value: Any) -> Generator[BlobIO, Any, Any]:
        """:meth:`unpack_async` without I/O of its own (as :meth:`pack_steps`; its
        :class:`ServerIO` is the ``get_blob`` of a key, the bytes are sent back)."""
        refs: dict[str, dict[str, Any]] = {}
        _walk(value, is_blob_ref, lambda ref: refs.setdefault(_check_key(ref[REF_KEY]), ref))
        loaded: dict[str, bytes] = {}
        for key in refs:
            data = yield LocalIO(self._get_or_none, (key,))
            if data is None:
                data = yield ServerIO(key)
                if not isinstance(data, bytes | bytearray) or blob_key(data) != key:
                    got = blob_key(data) if isinstance(data, bytes | bytearray) else type(data)
                    raise BlobCorrupted(f"blob {key} was fetched as other bytes ({got})")
                data = bytes(data)
                yield LocalIO(self._store, (key, data))
            loaded[key] = data
        return _walk(value, is_blob_ref, lambda ref: self._sized(ref, loaded[ref[REF_KEY]]))

    def pack_now(self, value: Any) -> Any:
        """A copy of ``value`` as :meth:`pack_async` sends it when it carries no ``bytes``
        over ``inline_limit`` (nothing to store or upload), else :data:`NEEDS_IO`. Never
        blocks: for the trio thread's code that must not wait."""
        if _plain(value):  # (the usual values: nothing to walk)
            return list(value) if type(value) is list else value
        large = False

        def mark(data: Any) -> Any:
            nonlocal large
            large = True
            return data

        copy = _walk(value, self._large, mark)
        return NEEDS_IO if large else copy

    def unpack_now(self, value: Any) -> Any:
        """A copy of ``value`` when it carries no blob reference (nothing to read or fetch),
        else :data:`NEEDS_IO`. Never blocks."""
        if _plain(value):  # (the usual values: nothing to walk)
            return list(value) if type(value) is list else value
        refs = False

        def mark(ref: Any) -> Any:
            nonlocal refs
            refs = True
            return ref

        copy = _walk(value, is_blob_ref, mark)
        return NEEDS_IO if refs else copy

    def _get_or_none(self, key: str) -> bytes | None:
        try:
            return self.get(key)
        except (KeyError, BlobCorrupted):
            return None

    @staticmethod
    def _sized(ref: Mapping[str, Any], data: bytes) -> bytes:
        if len(data) != ref["size"]:
            raise BlobCorrupted(
                f"blob {ref[REF_KEY]} has {len(data)} bytes, its reference says {ref['size']}"
            )
        return data


#: Values that hold no bytes and are no blob reference: packed and unpacked as they are.
_SCALARS = frozenset({int, float, str, bool, type(None)})


def _plain(value: Any) -> bool:
    """Whether ``value`` is a scalar (no bytes, no reference) or a list of scalars."""
    kind = type(value)
    return kind in _SCALARS or (kind is list and all(type(v) in _SCALARS for v in value))


def _ref(key: str, size: int) -> dict[str, Any]:
    return {REF_KEY: key, "size": size}


def _walk(value: Any, match: Callable[[Any], bool], replace: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt with every part that ``match``es replaced (lists, tuples and dict
    values are searched; everything else is kept as it is)."""
    if match(value):
        return replace(value)
    kind = type(value)
    if kind is list:
        return [_walk(v, match, replace) for v in value]
    if kind is tuple:
        return tuple(_walk(v, match, replace) for v in value)
    if kind is dict:
        return {k: _walk(v, match, replace) for k, v in value.items()}
    return value
