"""The import layering of DESIGN.md, checked by scanning every module's imports.

wire (leaf) <- otp core <- supervisors <- otp.node (boot); apps use the public facades of all of
these, and nothing imports apps statically.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("wire", "otp", "supervisors", "apps", "benchmarks")


def _layer(module: str) -> str:
    if module == "otp.node" or module.startswith("otp.node."):
        return "otp.node"
    if module == "otp.observer.__main__.py":
        return "otp.node"  # an entry point, never imported: above what it runs
    return module.split(".")[0]


def _imports(path: Path) -> list[tuple[str, int]]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    return _imports_of(path.read_text(), package)


def _source_of(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` reads from."""
    if node.level:
        base = package.split(".")[: -node.level]
        return ".".join([*base, node.module] if node.module else base)
    return node.module or ""


def _imports_of(source: str, package: str) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = _source_of(node, package)
            found.append((name, node.lineno))
            for alias in node.names:
                found.append((f"{name}.{alias.name}", node.lineno))
    return found


def _modules(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


ALLOWED = {
    "wire": {"wire"},
    "otp": {"otp", "wire"},
    "supervisors": {"supervisors", "otp", "wire"},
    "otp.node": {"otp.node", "otp", "supervisors", "wire"},
    "apps": {"apps", "otp", "otp.node", "supervisors", "wire"},
    "benchmarks": {"benchmarks", "otp", "supervisors", "wire", "apps"},
}


@pytest.mark.parametrize("top", ["wire", "otp", "supervisors", "apps", "benchmarks"])
def test_imports_point_down_the_layers(top: str) -> None:
    offences = []
    for path in _modules(top):
        own = _layer(".".join(path.relative_to(ROOT).parts))
        for name, line in _imports(path):
            target = _layer(name)
            if name.split(".")[0] not in PROJECT:
                continue
            if target not in ALLOWED[own]:
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert offences == []


@pytest.mark.parametrize("top", ["supervisors", "apps"])
def test_upper_layers_use_only_public_facades_of_lower_ones(top: str) -> None:
    offences = []
    for path in _modules(top):
        for name, line in _imports(path):
            parts = name.split(".")
            if parts[0] in PROJECT and parts[0] != top and any(p.startswith("_") for p in parts):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports private {name}")
    assert offences == []


def _private_names(source: str, package: str) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` for each ``from module import _name`` (dunders aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = _source_of(node, package)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append((module, alias.name, node.lineno))
    return found


def _package_of(module: str) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    path = ROOT.joinpath(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def _is_module(module: str, name: str) -> bool:
    path = ROOT.joinpath(*module.split("."), name)
    return path.is_dir() or path.with_suffix(".py").exists()


@pytest.mark.parametrize("top", PROJECT)
def test_private_names_are_imported_only_inside_their_own_package(top: str) -> None:
    """A ``_name`` is private to its package: another package (``otp.ets`` of ``otp``, say)
    imports only names without the underscore, from modules meant for it
    (``otp._gen_server_core``). Importing a private module is fine; that is how the packages of
    one layer share code."""
    offences = []
    for path in _modules(top):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        own = package.rpartition(".")[0]
        if path.name == "__init__.py":
            package, own = own + ".__init__", own
        for module, name, line in _private_names(path.read_text(), package):
            if module.split(".")[0] not in PROJECT or _is_module(module, name):
                continue
            if _package_of(module) != own:
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {name} from {module}")
    assert offences == []


def test_the_private_name_check_tells_packages_apart() -> None:
    source = "from .._process import _CURRENT\nfrom ._table import _Nobody\nfrom . import _api\n"
    found = _private_names(source, "otp.ets._access")
    assert found == [("otp._process", "_CURRENT", 1), ("otp.ets._table", "_Nobody", 2),
                     ("otp.ets", "_api", 3)]  # fmt: skip
    assert _package_of("otp._process") == "otp" and _package_of("otp.ets._table") == "otp.ets"
    assert _package_of("otp.ets") == "otp.ets"
    assert _is_module("otp.ets", "_table") and not _is_module("otp._process", "_CURRENT")


def test_nothing_imports_apps_statically() -> None:
    offences = []
    for top in ("wire", "otp", "supervisors"):
        for path in _modules(top):
            for name, line in _imports(path):
                if name.split(".")[0] == "apps":
                    offences.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert offences == []


def test_the_scanner_resolves_absolute_and_relative_imports() -> None:
    source = "import supervisors\nfrom ..node import _boot\nfrom . import _api\n"
    names = [name for name, _ in _imports_of(source, "otp.x._mod")]
    assert names == ["supervisors", "otp.node", "otp.node._boot", "otp.x", "otp.x._api"]
    assert _layer("otp.node._boot") == "otp.node"
    assert "supervisors" not in ALLOWED["otp"]
