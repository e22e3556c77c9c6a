"""The node's configuration: node.toml, command-line flags and ``--app`` paths. What a user of
``python -m otp.node`` expects of a bad node.toml, a bad ``--app`` and a bad ``--listen`` (a
typed :class:`ConfigError` naming the setting, exit code 2, no traceback), checked in process."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import supervisors
from otp.node import ConfigError, NodeConfig, load_config, load_object, main, resolve_application

from .helpers import _app

FAKE = "audit_node_fake_apps"


@pytest.fixture
def fake_apps(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A module holding two applications and an ``add_arguments`` that adds one flag, as a
    user's package that defines several applications would."""
    module = types.ModuleType(FAKE)
    events: list[str] = []
    module.events = events  # type: ignore[attr-defined]
    module.web = _app("web", events, "w")  # type: ignore[attr-defined]
    module.worker = _app("worker", events, "k")  # type: ignore[attr-defined]

    def add_arguments(parser: Any) -> None:
        parser.add_argument("--fake-level", type=int, default=1)

    module.add_arguments = add_arguments  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE, module)
    yield module


def _toml(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "node.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def _cookie(tmp_path: Path) -> Path:
    path = tmp_path / "cookie"
    path.write_bytes(b"audit-node-cookie-0123456789")
    path.chmod(0o600)
    return path


# -- node.toml -------------------------------------------------------------------------------------


def test_flags_win_over_node_toml_which_fills_in_the_rest(
    tmp_path: Path, fake_apps: types.ModuleType
) -> None:
    config = _toml(
        tmp_path,
        f'[node]\nname = "t@host"\napps = ["{FAKE}:worker"]\nlog_level = "error"\n'
        "[worker]\nbatch = 4\n",
    )
    from_toml = load_config(["--config", config])
    assert (from_toml.name, from_toml.apps, from_toml.log_level) == (
        "t@host",
        (f"{FAKE}:worker",),
        "error",
    )
    assert from_toml.settings["worker"] == {"batch": 4}
    assert from_toml.distribution is None
    flags = load_config(
        ["--config", config, "--name", "f@host", "--app", f"{FAKE}:web", "--log-level", "debug"]
    )
    assert (flags.name, flags.apps, flags.log_level) == ("f@host", (f"{FAKE}:web",), "debug")
    assert flags.settings["flags"]["fake_level"] == 1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[node]\napps = "x:app"\n', "node.apps must be a list"),
        ('[node]\napps = ["x:app", 3]\n', "node.apps must be a list"),
        ('[node]\nlog_level = "verbose"\n', "log_level must be one of"),
        ("[node\n", "not valid TOML"),
    ],
)
def test_bad_node_toml_values_that_are_refused_with_a_config_error(
    tmp_path: Path, text: str, error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        load_config(["--config", _toml(tmp_path, text)])


def test_a_log_level_that_is_not_a_string_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="log_level"):
        load_config(["--config", _toml(tmp_path, "[node]\nlog_level = 3\n")])


def test_a_node_key_that_is_not_a_table_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\bnode\b"):
        load_config(["--config", _toml(tmp_path, "node = 3\n")])


def test_a_node_name_that_is_not_a_string_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="name"):
        load_config(["--config", _toml(tmp_path, "[node]\nname = 3\n")])


@pytest.mark.parametrize(
    "text",
    ['[node]\nnmae = "a@host"\n', '[node]\nlisten = ["unix:/tmp/a.sock"]\n'],
    ids=["typo", "a flag-only setting"],
)
def test_an_unknown_key_in_the_node_table_is_refused(tmp_path: Path, text: str) -> None:
    key = text.split("\n")[1].split(" ")[0]
    with pytest.raises(ConfigError, match=key):
        load_config(["--config", _toml(tmp_path, text)])


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config"):
        load_config(["--config", _toml(tmp_path, b'[node]\nname = "\xff"\n')])


# -- --app and the flags applications add ----------------------------------------------------------


@pytest.mark.parametrize("path", ["x", "x:", ":x"])
def test_a_malformed_object_path_is_a_config_error(path: str) -> None:
    with pytest.raises(ConfigError, match="as 'module:attr'"):
        load_object(path)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("no_such_module_for_audit:app", "cannot import module 'no_such_module_for_audit'"),
        (f"{FAKE}:nothing", "has no attribute 'nothing'"),
        (f"{FAKE}:events", "is a list, not a supervisors.Application"),
    ],
)
def test_resolve_application_names_what_is_wrong(
    fake_apps: types.ModuleType, path: str, error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        resolve_application(path, NodeConfig())


def test_a_factory_that_refuses_its_settings_is_a_config_error_naming_it(
    fake_apps: types.ModuleType,
) -> None:
    def factory(config: NodeConfig) -> supervisors.Application:
        raise ValueError(f"needs [web] port (got {config.settings.get('web')})")

    fake_apps.factory = factory  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=rf"{FAKE}:factory: needs \[web\] port \(got None\)"):
        resolve_application(f"{FAKE}:factory", NodeConfig())


@pytest.mark.parametrize("path", [":application", ".relative:application"])
def test_an_app_path_with_an_empty_or_relative_module_is_a_config_error(path: str) -> None:
    with pytest.raises(ConfigError, match="module"):
        load_config(["--app", path])


def test_two_applications_from_one_module_that_adds_flags(fake_apps: types.ModuleType) -> None:
    config = load_config(["--app", f"{FAKE}:web", "--app", f"{FAKE}:worker", "--fake-level", "3"])
    assert config.apps == (f"{FAKE}:web", f"{FAKE}:worker")
    assert config.settings["flags"]["fake_level"] == 3


def test_flags_of_applications_named_in_node_toml_are_accepted(
    tmp_path: Path, fake_apps: types.ModuleType
) -> None:
    config = _toml(tmp_path, f'[node]\napps = ["{FAKE}:worker"]\n')
    loaded = load_config(["--config", config, "--fake-level", "3"])
    assert loaded.settings["flags"]["fake_level"] == 3


# -- boot ------------------------------------------------------------------------------------------


def test_a_listen_address_that_cannot_be_bound_is_a_clear_error(
    tmp_path: Path, fake_apps: types.ModuleType, capfd: pytest.CaptureFixture[str]
) -> None:
    address = f"unix:{tmp_path}/no-such-dir/a.sock"
    argv = ["--name", "a@localhost", "--listen", address, "--cookie-file", str(_cookie(tmp_path))]
    code = main([*argv, "--app", f"{FAKE}:web"])
    err = capfd.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert err.startswith("python -m otp.node: ") and address in err
    assert fake_apps.events == []
