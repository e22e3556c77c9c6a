"""Specs, settings and allocation: pure functions, no processes."""

from __future__ import annotations

import pytest

from apps import dirty
from apps.dirty import AppSpec

from .conftest import ECHO, LIMITED


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
