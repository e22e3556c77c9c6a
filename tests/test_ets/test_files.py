"""tab2file/file2tab: a table's options and objects round-trip through a file in the wire
encoding, and a bad, truncated or altered file raises TableFileError naming it."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
import trio

import otp
from otp import ets
from otp.ets._tabfile import MAGIC

OBJECTS = [
    (1, "one", 1.5),
    ("key", b"\x00bytes", None, True),
    ((2, "tuple"), [1, [2, 3]], {"map": (4,)}),
    (2**70, -3, ()),
]


@pytest.mark.parametrize("kind", list(ets.TableType))
async def test_a_table_round_trips_with_its_options_and_objects(kind, tmp_path):
    async with otp.open_node():
        table = ets.new(
            "saved", type=kind, access=ets.PUBLIC, write_concurrency="auto", compressed=True
        )
        objects = [*OBJECTS, (otp.self(), otp.make_ref())]
        ets.insert(table, objects)
        path = tmp_path / "saved.ets"
        await ets.tab2file(table, path)
        before = ets.info(table)
        ets.delete(table)
        loaded = await ets.file2tab(str(path))
        after = ets.info(loaded)
        assert sorted(map(repr, ets.tab2list(loaded))) == sorted(map(repr, objects))
        for field in (
            "name",
            "type",
            "access",
            "keypos",
            "named",
            "size",
            "expire_after",
            "read_concurrency",
            "write_concurrency",
            "compressed",
            "decentralized_counters",
        ):
            assert getattr(after, field) == getattr(before, field), field
        assert after.owner == otp.self()


async def test_pids_and_refs_come_back_as_the_same_values(tmp_path):
    async with otp.open_node():
        table = ets.new("t")
        ref = otp.make_ref()
        ets.insert(table, ("who", otp.self(), ref))
        await ets.tab2file(table, tmp_path / "t.ets")
        loaded = await ets.file2tab(tmp_path / "t.ets")
        assert ets.lookup(loaded, "who") == [("who", otp.self(), ref)]


async def test_a_named_table_loads_under_its_name_and_not_over_a_live_one(tmp_path):
    async with otp.open_node():
        ets.new("config", named=True, keypos=1, expire_after=30)
        ets.insert("config", ("v", "k"))
        await ets.tab2file("config", tmp_path / "c.ets")
        with pytest.raises(ets.NameTaken):
            await ets.file2tab(tmp_path / "c.ets")
        ets.delete("config")
        assert await ets.file2tab(tmp_path / "c.ets") == "config"
        assert ets.lookup("config", "k") == [("v", "k")]
        assert ets.info("config", "expire_after") == 30


async def _saved(tmp_path: Path) -> Path:
    table = ets.new("t")
    ets.insert(table, [(n, str(n)) for n in range(3000)])
    path = tmp_path / "t.ets"
    await ets.tab2file(table, path, sync=True)
    return path


def _reseal(body: bytes, count: int) -> bytes:
    """``body`` with a trailer whose checksum is right, as a forger would write it."""
    return body + b"F" + struct.pack(">Q", count) + hashlib.sha256(body).digest()


async def _load_error(path: Path, data: bytes) -> ets.TableFileError:
    path.write_bytes(data)
    with pytest.raises(ets.TableFileError) as caught:
        await ets.file2tab(path)
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)
    assert ets.all() == [] or all(ets.info(t, "name") != "t" for t in ets.all())
    return caught.value


async def test_a_truncated_file_is_refused_wherever_it_is_cut(tmp_path):
    async with otp.open_node():
        path = await _saved(tmp_path)
        data = path.read_bytes()
        ets.delete(ets.all()[0])
        for cut in (0, 5, 10, 60, len(data) // 2, len(data) - 1):
            error = await _load_error(tmp_path / f"cut{cut}.ets", data[:cut])
            assert error.reason in ("truncated", "checksum"), (cut, error)


async def test_a_changed_byte_fails_the_checksum(tmp_path):
    async with otp.open_node():
        path = await _saved(tmp_path)
        data = bytearray(path.read_bytes())
        ets.delete(ets.all()[0])
        data[len(data) // 2] ^= 0x01
        error = await _load_error(path, bytes(data))
        assert error.reason == "checksum"
        assert "damaged or altered" in str(error)


async def test_a_file_that_is_not_a_table_file_is_refused(tmp_path):
    async with otp.open_node():
        for data in (b"\x80\x04\x95pickle", b"{}" * 40, MAGIC[:4] + b"xxxx" + b"\x00" * 50):
            error = await _load_error(tmp_path / "other", data)
            assert error.reason == "magic"


async def test_a_newer_version_is_refused_with_its_version(tmp_path):
    async with otp.open_node():
        path = await _saved(tmp_path)
        data = path.read_bytes()
        ets.delete(ets.all()[0])
        body = MAGIC + struct.pack(">H", 2) + data[len(MAGIC) + 2 : -41]
        error = await _load_error(path, _reseal(body, 3000))
        assert error.reason == "version" and "format version 2" in str(error)


async def test_well_sealed_but_malformed_contents_are_refused(tmp_path):
    async with otp.open_node():
        path = await _saved(tmp_path)
        data = path.read_bytes()
        ets.delete(ets.all()[0])
        records = data[len(MAGIC) + 2 : -41]
        head = MAGIC + struct.pack(">H", 1)
        (header_length,) = struct.unpack(">I", records[1:5])
        cases = {
            "count": _reseal(head + records, 2999),
            "no header": _reseal(head + records[5 + header_length :], 3000),
            "garbage record": _reseal(head + records + b"O\x00\x00\x00\x02\xff\xff", 3000),
            "overrun": _reseal(head + records + b"O\xff\x00\x00\x00", 3000),
            "bad object": _reseal(head + records + b"O" + struct.pack(">I", 2) + b"\x81\x05", 3001),
        }
        for case, data in cases.items():
            error = await _load_error(path, data)
            assert error.reason == "malformed", (case, error)


async def test_an_object_without_a_wire_form_is_refused_and_the_old_file_stays(tmp_path):
    async with otp.open_node():
        path = await _saved(tmp_path)
        before = path.read_bytes()
        table = ets.new("other")
        ets.insert(table, ("k", object()))
        with pytest.raises(ets.EtsError, match=r"cannot be saved"):
            await ets.tab2file(table, path)
        assert path.read_bytes() == before
        assert [p.name for p in tmp_path.iterdir()] == ["t.ets"]


async def test_saving_a_private_table_from_another_process_is_denied(tmp_path):
    async with otp.open_node():
        table = ets.new("t", access=ets.PRIVATE)
        me = otp.self()

        async def save():
            try:
                await ets.tab2file(table, tmp_path / "x")
            except ets.AccessDenied as exc:
                otp.send(me, ("denied", exc.operation))

        otp.spawn(save)
        assert await otp.receive() == ("denied", "tab2file")
        assert not (tmp_path / "x").exists()


async def test_two_saves_to_one_path_at_once_leave_one_whole_file(tmp_path):
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [(n,) for n in range(5000)])
        path = tmp_path / "t.ets"
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ets.tab2file, table, path)
        ets.delete(table)
        loaded = await ets.file2tab(path)
        assert ets.info(loaded, "size") == 5000
        assert [p.name for p in tmp_path.iterdir()] == ["t.ets"]


async def test_a_value_over_the_wire_limits_is_refused_naming_the_table(tmp_path):
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, ("huge", 1 << 9000))  # a big int over wire's max_bigint_bytes
        with pytest.raises(ets.EtsError, match=r"ets.tab2file\(table .*cannot be encoded"):
            await ets.tab2file(table, tmp_path / "t.ets")
        assert list(tmp_path.iterdir()) == []
