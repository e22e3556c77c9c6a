"""The pool's configuration: specs, settings and allocation (pure functions), app loading, hooks,
dirty sections of node.toml and the command line (a bad setting is a typed error naming it)."""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from apps import dirty
from apps.dirty import AppSpec, _application, _proxy_start
from apps.dirty.worker import _main as worker_main
from otp import node

from .conftest import APPS, ECHO, HOOKS, LIMITED
from .dirty_apps import CallOnly, two_arg_worker_init
from .helpers import ROOT, _env


def test_spec_without_count_means_every_worker() -> None:
    assert dirty.parse_dirty_app_spec("myapp.ml:MLApp") == ("myapp.ml:MLApp", None)


def test_spec_with_count_limits_workers() -> None:
    assert dirty.parse_dirty_app_spec("myapp.ml:MLApp:2") == ("myapp.ml:MLApp", 2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "Invalid import path format: nocolon"),
        ("m:C:x", "Invalid worker count in spec: m:C:x. Expected integer, got 'x'"),
        ("m:C:0", "Worker count must be >= 1"),
    ],
)
def test_bad_specs_are_refused_with_gunicorns_error(spec: str, message: str) -> None:
    with pytest.raises(dirty.DirtyAppError, match=message):
        dirty.parse_dirty_app_spec(spec)


def test_config_spec_count_wins_over_class_attribute() -> None:
    config = dirty.DirtyConfig(dirty_apps=[f"{LIMITED}:3", ECHO], dirty_workers=3)
    assert config.dirty_apps == (AppSpec(LIMITED, 3), AppSpec(ECHO, None))


def test_class_attribute_limits_without_count() -> None:
    assert dirty.DirtyConfig(dirty_apps=[LIMITED], dirty_workers=1).dirty_apps == (
        AppSpec(LIMITED, 1),
    )


def test_gunicorn_defaults() -> None:
    config = dirty.DirtyConfig()
    assert (config.dirty_workers, config.dirty_timeout, config.dirty_threads) == (0, 300.0, 1)
    assert config.dirty_graceful_timeout == 30.0


def test_invalid_setting_message_names_it() -> None:
    with pytest.raises(
        dirty.DirtyConfigError, match=r"dirty_threads must be an int >= 1 \(got 0\)"
    ):
        dirty.DirtyConfig(dirty_threads=0)


def test_settings_from_toml_table_and_flags_flags_win() -> None:
    settings = {
        "dirty": {"dirty_apps": [ECHO], "dirty_workers": 2, "dirty_timeout": 10},
        "flags": {"dirty_workers": 4, "dirty_apps": None},
    }
    config = dirty.DirtyConfig.from_settings(settings)
    assert config.dirty_workers == 4 and config.dirty_timeout == 10.0
    assert config.dirty_apps == (AppSpec(ECHO),)


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="unknown settings \\['dirty_wrokers'\\]"):
        dirty.DirtyConfig.from_settings({"dirty": {"dirty_wrokers": 2}})


def test_client_bounds_are_settings_with_documented_defaults() -> None:
    config = dirty.DirtyConfig()
    assert (config.dirty_max_clients, config.dirty_frame_timeout) == (1024, 30.0)
    assert (config.dirty_idle_timeout, config.dirty_client_buffer) == (0.0, 32 << 20)
    table = {"dirty_max_clients": 10, "dirty_idle_timeout": 60, "dirty_client_buffer": 1 << 20}
    config = dirty.DirtyConfig.from_settings({"dirty": table})
    assert (config.dirty_max_clients, config.dirty_idle_timeout) == (10, 60)
    assert config.dirty_client_buffer == 1 << 20
    with pytest.raises(dirty.DirtyConfigError, match="dirty_max_clients must be an int >= 1"):
        dirty.DirtyConfig(dirty_max_clients=0)
    with pytest.raises(dirty.DirtyConfigError, match="dirty_frame_timeout must be a number"):
        dirty.DirtyConfig(dirty_frame_timeout=-1)


def test_allocation_gives_limited_apps_to_the_first_n_workers() -> None:
    specs = [AppSpec("a:A"), AppSpec("b:B", 2), AppSpec("c:C", 1)]
    assert dirty.initial_allocation(specs, 4) == [
        ["a:A", "b:B", "c:C"],
        ["a:A", "b:B"],
        ["a:A"],
        ["a:A"],
    ]


def test_allocation_skips_workers_with_nothing_to_load() -> None:
    assert dirty.initial_allocation([AppSpec("b:B", 2)], 4) == [["b:B"], ["b:B"]]


def test_new_worker_gets_apps_below_their_limit() -> None:
    specs = [AppSpec("a:A"), AppSpec("b:B", 2)]
    assert dirty.apps_for_new_worker(specs, {"a:A": 3, "b:B": 1}) == ["a:A", "b:B"]
    assert dirty.apps_for_new_worker(specs, {"a:A": 3, "b:B": 2}) == ["a:A"]


def test_minimum_workers_is_the_largest_per_app_n() -> None:
    assert dirty.minimum_workers([AppSpec("a:A"), AppSpec("b:B", 3)]) == 3
    assert dirty.minimum_workers([AppSpec("a:A")]) == 1


def test_dirty_app_refuses_private_and_unknown_actions() -> None:
    class App(dirty.DirtyApp):
        def hello(self) -> str:
            return "hi"

    app = App()
    assert app("hello") == "hi"
    for action in ("_private", "missing", "__init__"):
        with pytest.raises(ValueError, match="Unknown action"):
            app(action)


def test_errors_round_trip_through_their_dict_form() -> None:
    error = dirty.DirtyAppError("boom", app_path="m:A", action="go", traceback="tb")
    back = dirty.DirtyError.from_dict(error.to_dict())
    assert type(back) is dirty.DirtyAppError
    assert (back.app_path, back.action, back.traceback) == ("m:A", "go", "tb")
    timeout = dirty.DirtyError.from_dict(dirty.DirtyTimeoutError("slow", timeout=3).to_dict())
    assert isinstance(timeout, TimeoutError) and timeout.timeout == 3


def _outer() -> Any:
    def local_hook(info: Any) -> None:
        pass

    return local_hook


def _settings(**table: Any) -> node.NodeConfig:
    return node.NodeConfig(settings={"dirty": table})


@pytest.mark.parametrize("kind", ["relative", "raises", "syntax"])
def test_an_app_module_that_cannot_be_imported_is_a_config_error(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"audit_cfg_bad_{kind}"
    body = {"raises": "raise RuntimeError('no GPU')\n", "syntax": "def broken(:\n"}
    if kind == "relative":
        spec = ".audit_cfg_rel:App"
    else:
        (tmp_path / f"{name}.py").write_text(body[kind])
        spec = f"{name}:App"
    with pytest.raises(dirty.DirtyConfigError, match="dirty_apps"):
        dirty.application(_settings(dirty_apps=[spec]))


def test_a_limited_app_spec_with_a_missing_module_is_a_config_error() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="no_such_dirty_audit_mod"):
        dirty.application(_settings(dirty_apps=["no_such_dirty_audit_mod:App:2"]))


def test_a_missing_module_without_a_count_is_a_config_error() -> None:
    """The contrast to the test above: the unlimited form is checked up front."""
    with pytest.raises(dirty.DirtyConfigError, match="dirty_apps: cannot import module"):
        dirty.application(_settings(dirty_apps=["no_such_dirty_audit_mod:App"]))


@pytest.mark.parametrize("spec", ["os:getcwd", f"{APPS}:CallOnly"])
def test_an_app_without_dirty_app_methods_is_refused_with_the_config(spec: str) -> None:
    with pytest.raises(dirty.DirtyConfigError, match="init"):
        dirty.application(_settings(dirty_apps=[spec]))


@pytest.mark.parametrize(
    ("spec", "message"),
    [("os:getcwd", "init"), (f"{APPS}:CallOnly", "init"), (f"{APPS}:RaisesInInit", "boom")],
    ids=["function", "call-only-class", "constructor-raises"],
)
def test_load_dirty_app_refuses_what_cannot_be_a_dirty_app(spec: str, message: str) -> None:
    with pytest.raises(dirty.DirtyAppError, match=message) as info:
        dirty.load_dirty_app(spec)
    assert info.value.app_path == spec


def test_an_app_whose_stashes_is_not_a_list_is_a_typed_error() -> None:
    with pytest.raises(dirty.DirtyError, match="stashes"):
        app = dirty.application(_settings(dirty_apps=[f"{APPS}:BadStashes"]))
        _application.dirty_supervisor_spec(app.root[1])


@pytest.mark.parametrize("table", [5, "x", [1]])
def test_a_dirty_section_that_is_not_a_table_is_a_config_error(table: Any) -> None:
    with pytest.raises(dirty.DirtyConfigError, match=r"\[dirty\]"):
        dirty.DirtyConfig.from_settings({"dirty": table})


def test_the_default_application_refuses_a_dirty_section_that_is_not_a_table() -> None:
    # (python -m otp.node with no --app: before, a bare TypeError from dict(5))
    with pytest.raises(dirty.DirtyConfigError, match=r"\[dirty\]"):
        dirty.default_application(node.NodeConfig(settings={"dirty": 5}))


@pytest.mark.parametrize("value", [5, ".relative", "raising"])
def test_a_bad_dirty_config_module_is_a_config_error(
    value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value == "raising":
        monkeypatch.syspath_prepend(str(tmp_path))
        (tmp_path / "audit_cfg_hooks_raising.py").write_text("raise RuntimeError('bad')\n")
        value = "audit_cfg_hooks_raising"
    with pytest.raises(dirty.DirtyConfigError, match="dirty_config"):
        dirty.DirtyConfig.from_settings({"dirty": {"dirty_apps": [ECHO], "dirty_config": value}})


@pytest.mark.parametrize("path", [":dirty_worker_init", ".dirty_hooks:dirty_worker_init"])
def test_a_hook_path_with_an_empty_or_relative_module_is_a_config_error(path: str) -> None:
    with pytest.raises(dirty.DirtyConfigError, match="dirty_worker_init"):
        dirty.DirtyConfig(hooks={"dirty_worker_init": path})


def test_hooks_that_are_not_a_mapping_are_a_config_error() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="hooks"):
        dirty.DirtyConfig(hooks=["on_dirty_starting"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "hook",
    [f"{HOOKS}:dirty_post_fork", f"{APPS}:two_arg_worker_init", two_arg_worker_init],
    ids=["path-2-args", "path-here", "callable"],
)
def test_a_dirty_worker_init_hook_of_the_wrong_arity_is_refused(hook: Any) -> None:
    with pytest.raises(dirty.DirtyConfigError, match="dirty_worker_init"):
        dirty.DirtyConfig(hooks={"dirty_worker_init": hook})


@pytest.mark.parametrize(
    "hook",
    [
        lambda info: None,
        _outer(),
        functools.partial(two_arg_worker_init, None),
        CallOnly(),
    ],
    ids=["lambda", "local", "partial", "callable-object"],
)
def test_a_callable_dirty_worker_init_hook_reaches_the_worker_or_is_refused(hook: Any) -> None:
    try:
        config = dirty.DirtyConfig(hooks={"dirty_worker_init": hook})
    except dirty.DirtyConfigError as exc:  # refused up front, naming it: fine
        assert "dirty_worker_init" in str(exc)
        return
    # What the worker process does with the path the pool passes it in its JSON spec.
    loaded = worker_main._load_hook(_proxy_start._hook_path(config, "dirty_worker_init"))
    assert loaded is not None


def test_a_dirty_worker_init_defined_in_main_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importable as ``__main__:fn`` in the node, but the worker's ``__main__`` is its own."""

    def main_hook(info: Any) -> None:
        pass

    main_hook.__module__ = "__main__"
    main_hook.__qualname__ = "audit_main_hook"
    monkeypatch.setattr(sys.modules["__main__"], "audit_main_hook", main_hook, raising=False)
    with pytest.raises(dirty.DirtyConfigError, match="dirty_worker_init runs in the worker"):
        dirty.DirtyConfig(hooks={"dirty_worker_init": main_hook})


def test_node_side_hooks_may_be_any_callable_of_the_right_arity() -> None:
    """Only dirty_worker_init crosses to the worker; the others run in the node."""
    config = dirty.DirtyConfig(
        hooks={
            "on_dirty_starting": lambda ctx: None,
            "dirty_post_fork": functools.partial(two_arg_worker_init),
        }
    )
    assert config.hook("dirty_post_fork") is config.hooks["dirty_post_fork"]
    with pytest.raises(dirty.DirtyConfigError, match=r"on_dirty_starting is called with \(ctx\)"):
        dirty.DirtyConfig(hooks={"on_dirty_starting": two_arg_worker_init})


def test_the_same_app_in_both_forms_is_refused_naming_dirty_apps() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="dirty_apps names an app twice"):
        dirty.DirtyConfig(dirty_apps=[ECHO, f"{ECHO}:2"])


def test_a_count_in_the_spec_wins_over_a_bad_class_attribute_and_hooks_by_path_load() -> None:
    """``module:Class:N`` never reads ``workers`` (so a class with ``workers = 0`` is usable
    with a count); a module-level callable hook round-trips to the worker by path."""
    config = dirty.DirtyConfig(
        dirty_apps=[f"{APPS}:BadWorkers:2"],
        dirty_workers=2,
        hooks={"dirty_worker_init": f"{HOOKS}:dirty_worker_init"},
    )
    assert config.dirty_apps == (dirty.AppSpec(f"{APPS}:BadWorkers", 2),)
    with pytest.raises(dirty.DirtyConfigError, match=r"BadWorkers.workers must be an int >= 1"):
        dirty.DirtyConfig(dirty_apps=[f"{APPS}:BadWorkers"])
    from tests.test_apps.test_dirty import dirty_hooks

    fn_config = dirty.DirtyConfig(hooks={"dirty_worker_init": dirty_hooks.dirty_worker_init})
    path = _proxy_start._hook_path(fn_config, "dirty_worker_init")
    assert worker_main._load_hook(path) is dirty_hooks.dirty_worker_init


def _node_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otp.node", "--app", "apps.dirty", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dirty-workers", "-1"], "dirty_workers must be an int >= 0 (got -1)"),
        (["--dirty-app", "nocolon"], "Invalid import path format: nocolon"),
        (["--dirty-app", f"{ECHO}:0"], "Worker count must be >= 1"),
        (["--config", "{tmp}/node.toml"], "dirty_threads must be an int >= 1 (got 0)"),
    ],
    ids=["negative-workers", "bad-spec", "zero-count", "toml-threads"],
)
def test_a_bad_dirty_setting_at_the_command_line_is_a_one_line_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "node.toml").write_text(f'[dirty]\ndirty_apps = ["{ECHO}"]\ndirty_threads = 0\n')
    result = _node_cli(*(a.format(tmp=tmp_path) for a in args))
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("python -m otp.node: ")
    assert result.returncode == 2


@pytest.mark.parametrize(
    "setting",
    [
        {"dirty_timeout": math.nan},
        {"dirty_graceful_timeout": math.nan},
        {"dirty_socket": 5},
        {"dirty_pidfile": 5},
        {"handle_signals": "no"},
    ],
    ids=["nan-timeout", "nan-graceful", "int-socket", "int-pidfile", "str-handle-signals"],
)
def test_a_nonsense_setting_value_is_a_dirty_config_error(setting: dict[str, Any]) -> None:
    with pytest.raises(dirty.DirtyConfigError, match=next(iter(setting))):
        dirty.DirtyConfig.from_settings({"dirty": {"dirty_apps": [ECHO], **setting}})


@pytest.mark.parametrize(
    "hook", ["on_dirty_starting", "dirty_post_fork", "dirty_worker_init", "dirty_worker_exit"]
)
def test_a_hook_path_that_cannot_load_is_refused_with_the_config(hook: str) -> None:
    with pytest.raises(dirty.DirtyConfigError, match=hook):
        dirty.DirtyConfig.from_settings(
            {"dirty": {"dirty_apps": [ECHO], hook: "no_such_module_for_dirty:hook"}}
        )


def test_cli_flags_win_over_node_toml_and_zero_is_kept() -> None:
    """``--dirty-timeout 0`` (off) and ``--dirty-workers 0`` are real values, not "unset"; the
    toml fills in what the flags leave out. 0 workers with apps is refused, naming both."""
    settings: dict[str, Any] = {
        "dirty": {
            "dirty_apps": [f"{LIMITED}:3"],
            "dirty_workers": 5,
            "dirty_timeout": 10,
            "dirty_graceful_timeout": 7,
        },
        "flags": {
            "dirty_timeout": 0.0,
            "dirty_workers": 4,
            "dirty_apps": None,
            "dirty_graceful_timeout": None,
        },
    }
    config = dirty.DirtyConfig.from_settings(settings)
    assert config.dirty_timeout == 0.0 and config.dirty_workers == 4
    assert config.worker_count == 4
    assert config.dirty_graceful_timeout == 7.0
    assert isinstance(config.dirty_graceful_timeout, float)
    settings["flags"]["dirty_workers"] = 0
    with pytest.raises(dirty.DirtyConfigError, match=r"dirty_workers = 0 .* dirty_apps names 1"):
        dirty.DirtyConfig.from_settings(settings)


def test_the_cli_spec_count_wins_over_the_class_attribute_through_the_node_flags() -> None:
    from otp.node._config import load_config

    args = ["--app", "apps.dirty", "--dirty-app", f"{LIMITED}:2", "--dirty-app", ECHO]
    node = load_config([*args, "--dirty-workers", "2"])
    config = dirty.DirtyConfig.from_settings(node.settings)
    assert config.dirty_apps == (dirty.AppSpec(LIMITED, 2), dirty.AppSpec(ECHO, None))
    assert dirty.initial_allocation(config.dirty_apps, 3) == [
        [LIMITED, ECHO],
        [LIMITED, ECHO],
        [ECHO],
    ]
    assert config.worker_count == 2
