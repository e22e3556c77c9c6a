"""The public facade: every name exported once, from module "wire"; a leaf layer."""

from __future__ import annotations

import ast
from pathlib import Path

import wire

PACKAGE = Path(wire.__file__).parent


def test_every_public_name_is_exported_once_and_reads_as_wire() -> None:
    assert len(wire.__all__) == len(set(wire.__all__))
    for name in wire.__all__:
        obj = getattr(wire, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "wire", name


def test_errors_share_one_root_that_is_a_value_error() -> None:
    for name in wire.__all__:
        obj = getattr(wire, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, wire.WireError)
    assert issubclass(wire.WireError, ValueError)
    assert issubclass(wire.UnknownValueType, TypeError)


def test_wire_imports_only_the_stdlib_attrs_cbor2_and_trio() -> None:
    allowed = {"attrs", "cbor2", "trio"}
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or top in _stdlib(), f"{path.name} imports {name}"


def _stdlib() -> frozenset[str]:
    import sys

    return frozenset(sys.stdlib_module_names) | {"__future__"}


def test_nothing_is_ever_pickled() -> None:
    for path in PACKAGE.glob("*.py"):
        assert "pickle" not in path.read_text().replace("pickled", ""), path.name
