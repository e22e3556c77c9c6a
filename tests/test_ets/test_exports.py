"""The public facade: every name exported once and reported as ``otp.ets``."""

from __future__ import annotations

import otp.ets
from otp import ets


def test_every_public_name_is_exported_once_from_otp_ets():
    assert len(ets.__all__) == len(set(ets.__all__))
    for name in ets.__all__:
        obj = getattr(ets, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "otp.ets", name


def test_both_import_styles_reach_the_same_module():
    assert otp.ets is ets
