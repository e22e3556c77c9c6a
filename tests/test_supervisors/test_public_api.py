"""The facade exports every public name once, each saying it comes from ``supervisors``."""

from __future__ import annotations

import supervisors
import supervisors.conformance


def test_every_public_name_is_exported_once_with_the_facade_module() -> None:
    for package in (supervisors, supervisors.conformance):
        assert len(package.__all__) == len(set(package.__all__))
        for name in package.__all__:
            obj = getattr(package, name)
            if isinstance(obj, type) or callable(obj):
                assert obj.__module__ == package.__name__, name


def test_supervisors_do_not_import_apps_or_the_node() -> None:
    import pathlib

    root = pathlib.Path(supervisors.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import apps" not in text and "from apps" not in text, path
        assert "otp.node" not in text, path
