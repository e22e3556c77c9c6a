"""BlobCache: content-addressed files, verified reads, LRU eviction, packing of values."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from apps.matching import ConfigurationError
from apps.matching._blobs import NEEDS_IO, BlobCache, BlobCorrupted, InvalidBlobKey, blob_key


def _key(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def cache(tmp_path) -> BlobCache:
    return BlobCache(tmp_path / "blobs", inline_limit=8)


def test_put_get_round_trip_under_the_sha256_key(cache):
    key = cache.put(b"hello world")
    assert key == _key(b"hello world") == blob_key(b"hello world")
    assert cache.has(key)
    assert cache.get(key) == b"hello world"
    assert os.path.basename(cache.path_of(key)) == key.removeprefix("sha256:")


def test_put_twice_is_one_file(cache):
    assert cache.put(b"x" * 20) == cache.put(bytearray(b"x" * 20))
    assert len(os.listdir(cache.directory)) == 1


def test_put_leaves_no_temporary_file(cache):
    cache.put(b"abc")
    assert [n for n in os.listdir(cache.directory) if n.startswith(".tmp-")] == []


def test_get_of_a_missing_key_is_a_key_error_naming_it(cache):
    key = _key(b"nope")
    with pytest.raises(KeyError, match=key):
        cache.get(key)
    assert not cache.has(key)


def test_corrupt_file_is_an_error_naming_key_and_path_and_is_removed(cache):
    key = cache.put(b"precious bytes")
    path = cache.path_of(key)
    with open(path, "wb") as f:
        f.write(b"precious bytez")
    with pytest.raises(BlobCorrupted) as info:
        cache.get(key)
    assert key in str(info.value) and path in str(info.value)
    assert not os.path.exists(path)
    with pytest.raises(KeyError):
        cache.get(key)


@pytest.mark.parametrize(
    "key",
    [
        "sha256:../../etc/passwd",
        "../" + "a" * 64,
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 64 + "/x",
        "md5:" + "a" * 32,
        "",
        None,
    ],
)
def test_invalid_keys_are_refused_before_any_path_is_built(cache, key):
    with pytest.raises(InvalidBlobKey, match="64 lowercase hex"):
        cache.get(key)
    with pytest.raises(InvalidBlobKey):
        cache.has(key)


def test_default_directory_is_per_user_and_private(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    cache = BlobCache()
    assert cache.directory.startswith(str(tmp_path))
    assert str(os.getuid()) in os.path.basename(cache.directory)
    assert stat.S_IMODE(os.stat(cache.directory).st_mode) == 0o700


def test_directory_that_is_a_symlink_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(ConfigurationError, match="symlink"):
        BlobCache(tmp_path / "link")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inline_limit": -1}, "BlobCache.inline_limit must be an int >= 0 \\(got -1\\)"),
        ({"max_bytes": 0}, "BlobCache.max_bytes must be an int >= 1 or None \\(got 0\\)"),
    ],
)
def test_bad_arguments_are_configuration_errors(tmp_path, kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        BlobCache(tmp_path, **kwargs)


def test_max_bytes_evicts_the_least_recently_used(tmp_path):
    cache = BlobCache(tmp_path, max_bytes=30)
    a = cache.put(b"a" * 10)
    b = cache.put(b"b" * 10)
    c = cache.put(b"c" * 10)
    cache.get(a)  # a is now the most recently used
    d = cache.put(b"d" * 10)
    assert not cache.has(b)
    assert all(cache.has(k) for k in (a, c, d))
    assert cache.total_bytes == 30


def test_max_bytes_keeps_the_newest_blob_even_if_alone_too_big(tmp_path):
    cache = BlobCache(tmp_path, max_bytes=5)
    small = cache.put(b"abc")
    big = cache.put(b"x" * 10)
    assert cache.has(big) and not cache.has(small)


def test_max_bytes_counts_files_left_by_an_earlier_cache(tmp_path):
    first = BlobCache(tmp_path)
    old = first.put(b"o" * 10)
    second = BlobCache(tmp_path, max_bytes=15)
    assert second.total_bytes == 10
    second.put(b"n" * 10)
    assert not second.has(old)


def test_pack_replaces_large_bytes_at_any_depth_and_unpack_restores(cache):
    big, other = b"B" * 9, bytearray(b"C" * 100)
    value = {"a": [1, big, ("t", other)], "small": b"tiny", "n": None}
    packed = cache.pack(value)
    assert packed == {
        "a": [
            1,
            {"$blob": _key(big), "size": 9},
            ("t", {"$blob": _key(bytes(other)), "size": 100}),
        ],
        "small": b"tiny",
        "n": None,
    }
    assert cache.unpack(packed) == {"a": [1, big, ("t", bytes(other))], "small": b"tiny", "n": None}


def test_bytes_of_exactly_the_inline_limit_stay_inline(cache):
    assert cache.pack([b"12345678"]) == [b"12345678"]


@pytest.mark.parametrize(
    "value", [1, "s", None, 2.5, True, b"small", [], [1, "a", None, 2.5], [[1]], {"a": [1]}, (1,)]
)
def test_a_value_without_blobs_packs_and_unpacks_now_as_an_equal_copy(cache, value):
    for now in (cache.pack_now, cache.unpack_now):
        copy = now(value)
        assert copy == value
        assert type(copy) is type(value)
        if isinstance(value, list):
            assert copy is not value


def test_a_value_with_blobs_needs_io_to_pack_or_unpack(cache):
    large = b"x" * (cache.inline_limit + 1)
    assert cache.pack_now([1, large]) is NEEDS_IO
    assert cache.pack_now(large) is NEEDS_IO
    ref = {"$blob": blob_key(large), "size": len(large)}
    assert cache.unpack_now([1, ref]) is NEEDS_IO
    assert cache.unpack_now(ref) is NEEDS_IO


def test_unpack_checks_the_reference_size(cache):
    key = cache.put(b"123456789")
    with pytest.raises(BlobCorrupted, match="reference says 4"):
        cache.unpack({"$blob": key, "size": 4})


async def test_pack_async_uploads_each_blob_once(tmp_path):
    cache = BlobCache(tmp_path, inline_limit=4)
    uploaded: list[bytes] = []

    async def upload(data: bytes) -> str:
        uploaded.append(data)
        return _key(data)

    packed = await cache.pack_async([b"xxxxx", {"k": b"xxxxx"}, b"yyyyyy", b"z"], upload)
    assert packed == [
        {"$blob": _key(b"xxxxx"), "size": 5},
        {"k": {"$blob": _key(b"xxxxx"), "size": 5}},
        {"$blob": _key(b"yyyyyy"), "size": 6},
        b"z",
    ]
    assert sorted(uploaded) == [b"xxxxx", b"yyyyyy"]
    assert cache.get(_key(b"yyyyyy")) == b"yyyyyy"


async def test_pack_async_refuses_an_upload_answered_with_another_key(tmp_path):
    cache = BlobCache(tmp_path, inline_limit=1)

    async def upload(data: bytes) -> str:
        return _key(b"other")

    with pytest.raises(BlobCorrupted, match="another key"):
        await cache.pack_async([b"abc"], upload)


async def test_unpack_async_fetches_missing_blobs_verifies_and_stores(tmp_path):
    remote = BlobCache(tmp_path / "remote", inline_limit=2)
    local = BlobCache(tmp_path / "local", inline_limit=2)
    packed = remote.pack({"x": b"remote-bytes"})
    fetched: list[str] = []

    async def fetch(key: str) -> bytes:
        fetched.append(key)
        return remote.get(key)

    assert await local.unpack_async(packed, fetch) == {"x": b"remote-bytes"}
    assert local.has(_key(b"remote-bytes"))
    assert await local.unpack_async(packed, fetch) == {"x": b"remote-bytes"}
    assert fetched == [_key(b"remote-bytes")]  # the second time it was local


async def test_unpack_async_refetches_a_corrupt_local_file(tmp_path):
    cache = BlobCache(tmp_path, inline_limit=2)
    key = cache.put(b"good bytes")
    with open(cache.path_of(key), "wb") as f:
        f.write(b"bad")

    async def fetch(k: str) -> bytes:
        return b"good bytes"

    assert await cache.unpack_async([{"$blob": key, "size": 10}], fetch) == [b"good bytes"]
    assert cache.get(key) == b"good bytes"


async def test_unpack_async_refuses_fetched_bytes_of_another_hash(tmp_path):
    cache = BlobCache(tmp_path)
    key = _key(b"wanted")

    async def fetch(k: str) -> bytes:
        return b"something else"

    with pytest.raises(BlobCorrupted, match=key):
        await cache.unpack_async({"$blob": key, "size": 6}, fetch)
    assert not cache.has(key)


async def test_unpack_async_refuses_a_reference_with_a_bad_key(tmp_path):
    cache = BlobCache(tmp_path)

    async def fetch(k: str) -> bytes:
        raise AssertionError("never fetched")

    with pytest.raises(InvalidBlobKey):
        await cache.unpack_async({"$blob": "sha256:../x", "size": 1}, fetch)


async def test_packing_a_value_without_blobs_is_a_cancel_point_but_no_schedule_point(tmp_path):
    import trio

    cache = BlobCache(str(tmp_path))

    async def never(data: bytes) -> str:
        raise AssertionError("no blob to move")

    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await cache.pack_async([1, {"a": "b"}], never)
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await cache.unpack_async([1, {"a": "b"}], never)
    # Not cancelled: the value comes straight back, nothing else runs in between.
    ran = []

    async def other() -> None:
        ran.append(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        assert await cache.pack_async([1, 2], never) == [1, 2]
        assert await cache.unpack_async([1, 2], never) == [1, 2]
        assert ran == []
