"""Every package facade re-exports its public API once, and each name says it lives there."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import apps

FACADES = ["otp", "otp.ets", "otp.node", "otp.observer", "otp.pg", "supervisors", "wire"] + [
    f"apps.{m.name}" for m in pkgutil.iter_modules(apps.__path__) if not m.name.startswith("_")
]


def _facade(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:  # a facade a later issue has not written yet
        if exc.name == name:
            pytest.skip(f"{name} does not exist yet")
        raise


@pytest.mark.parametrize("name", FACADES)
def test_all_lists_each_public_name_once(name: str) -> None:
    module = _facade(name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "a name is listed twice in __all__"
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.__all__ names {symbol}, which is missing"
    public = {
        symbol
        for symbol, value in vars(module).items()
        if not symbol.startswith("_")
        and not isinstance(value, ModuleType)
        and getattr(value, "__module__", name).split(".")[0] == name.split(".")[0]
    }
    assert public <= set(exported), f"public but not in __all__: {sorted(public - set(exported))}"


@pytest.mark.parametrize("name", FACADES)
def test_exported_objects_name_the_facade_as_their_module(name: str) -> None:
    module = _facade(name)
    wrong = []
    for symbol in module.__all__:
        value = getattr(module, symbol)
        if isinstance(value, type) or callable(value):
            owner = getattr(value, "__module__", name)
            if owner.split(".")[0] == name.split(".")[0] and owner != name:
                wrong.append(f"{symbol}: {owner}")
    assert wrong == []
