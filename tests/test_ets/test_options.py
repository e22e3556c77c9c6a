"""Table options after creation: info/2 items, setopts (heir and access, as OTP 25 allows),
and new/2's performance options, accepted as hints."""

from __future__ import annotations

import pytest

import otp
from otp import ets

from .helpers import in_process, start_idle


async def test_each_info_item_is_what_info_reports_under_otps_name_or_the_field_name():
    async with otp.open_node():
        table = ets.new("t", type=ets.BAG, access=ets.PUBLIC, keypos=1, read_concurrency=True)
        ets.insert(table, [("a", 1), ("b", 1)])
        whole = ets.info(table)
        names = {"named_table": "named", "protection": "access"}
        for item in (
            "id",
            "name",
            "named_table",
            "type",
            "protection",
            "owner",
            "heir",
            "keypos",
            "size",
            "memory",
            "node",
            "read_concurrency",
            "write_concurrency",
            "compressed",
            "decentralized_counters",
            "expire_after",
            "access",
            "named",
        ):
            assert ets.info(table, item) == getattr(whole, names.get(item, item)), item
        assert ets.info(table, "size") == 2 and ets.info(table, "protection") is ets.PUBLIC


async def test_an_unknown_info_item_is_an_error_and_a_missing_table_is_none():
    async with otp.open_node():
        table = ets.new("t")
        with pytest.raises(ets.EtsError, match="'colour' is not an info item: the items are id"):
            ets.info(table, "colour")
        with pytest.raises(ets.EtsError, match="OTP's VM memory"):
            ets.info(table, "binary")
        ets.delete(table)
        assert ets.info(table, "size") is None
        assert ets.info("nobody", "owner") is None


async def test_setopts_changes_the_access_mode_and_the_checks_follow():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, ("k", 1))
        with pytest.raises(ets.AccessDenied):
            await in_process(ets.insert, table, ("k", 2))
        ets.setopts(table, access=ets.PUBLIC)
        await in_process(ets.insert, table, ("k", 2))
        assert ets.lookup(table, "k") == [("k", 2)]
        ets.setopts(table, access="private")
        with pytest.raises(ets.AccessDenied):
            await in_process(ets.lookup, table, "k")
        assert ets.info(table, "protection") is ets.PRIVATE


async def test_setopts_checks_every_option_before_setting_any():
    async with otp.open_node():
        table = ets.new("t")
        heir = await start_idle()
        with pytest.raises(ets.EtsError, match="access must be one of public, protected"):
            ets.setopts(table, heir=heir, access="open")
        assert ets.info(table, "heir") is None
        with pytest.raises(ets.EtsError, match="heir_data goes with heir"):
            ets.setopts(table, heir_data="x")
        ets.setopts(table, heir=heir, heir_data="x", access=ets.PUBLIC)
        assert (ets.info(table, "heir"), ets.info(table, "access")) == (heir, ets.PUBLIC)
        ets.setopts(table)  # nothing to set, as OTP's setopts(T, [])
        ets.setopts(table, heir=None)
        assert ets.info(table, "heir") is None


async def test_only_the_owner_may_setopts():
    async with otp.open_node():
        table = ets.new("t", access=ets.PUBLIC)
        with pytest.raises(ets.AccessDenied, match="only the table's owner"):
            await in_process(lambda: ets.setopts(table, access=ets.PRIVATE))


async def test_otps_performance_options_are_accepted_and_reported_as_given():
    async with otp.open_node():
        table = ets.new("t", read_concurrency=True, write_concurrency="auto", compressed=True)
        info = ets.info(table)
        assert (info.read_concurrency, info.write_concurrency, info.compressed) == (
            True,
            "auto",
            True,
        )
        assert info.decentralized_counters is True  # OTP 25's default with "auto"
        plain = ets.info(ets.new("u"))
        assert (plain.read_concurrency, plain.write_concurrency, plain.compressed) == (
            False,
            False,
            False,
        )
        assert plain.decentralized_counters is False
        assert (
            ets.info(
                ets.new("o", type=ets.ORDERED_SET, write_concurrency=True), "decentralized_counters"
            )
            is True
        )
        assert ets.info(ets.new("s", write_concurrency=True), "decentralized_counters") is False


async def test_performance_options_with_values_otp_refuses_are_errors():
    async with otp.open_node():
        with pytest.raises(ets.EtsError, match="read_concurrency must be True or False"):
            ets.new("t", read_concurrency=1)
        with pytest.raises(ets.EtsError, match="write_concurrency must be True, False or 'auto'"):
            ets.new("t", write_concurrency="yes")
        with pytest.raises(ets.EtsError, match="compressed must be True or False"):
            ets.new("t", compressed=None)
        with pytest.raises(ets.EtsError, match="decentralized_counters must be"):
            ets.new("t", decentralized_counters="on")
