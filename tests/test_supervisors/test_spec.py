"""ChildSpec and SupFlags: OTP's defaults and error cases, validated at construction."""

from __future__ import annotations

import pytest

import supervisors
from supervisors import (
    AutoShutdown,
    ChildSpec,
    ChildSpecError,
    ChildType,
    DynamicSupFlags,
    Restart,
    Strategy,
    Supervisor,
    SupervisorError,
    SupFlags,
    SupFlagsError,
    check_childspecs,
)

from .helpers import Worker


def test_child_spec_defaults_are_otps() -> None:
    spec = ChildSpec("w", Worker)
    assert spec.restart is Restart.PERMANENT
    assert spec.type is ChildType.WORKER
    assert spec.shutdown == 5.0
    assert spec.significant is False
    assert spec.start == (Worker.start_link,)


def test_supervisor_child_defaults_to_infinity_shutdown() -> None:
    assert ChildSpec("s", Supervisor, type="supervisor").shutdown == "infinity"
    assert ChildSpec("s", Supervisor).type is ChildType.SUPERVISOR


def test_start_accepts_fn_and_args_tuple() -> None:
    spec = ChildSpec("w", (Worker.start_link, "w", None))
    assert spec.start == (Worker.start_link, "w", None)
    assert spec.with_args(["x"]).start == (Worker.start_link, "w", None, "x")
    assert spec.with_args(["x"], prepend=True).start == (Worker.start_link, "x", "w", None)


def test_invalid_shutdown_message_names_field_expected_and_got() -> None:
    with pytest.raises(ChildSpecError) as info:
        ChildSpec("w", Worker, shutdown=-1)
    assert str(info.value) == (
        'ChildSpec.shutdown must be a number of seconds >= 0, "brutal_kill" or "infinity" (got -1)'
    )
    assert info.value.reason == ("invalid_shutdown", -1)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"restart": "sometimes"}, ("invalid_restart_type", "sometimes")),
        ({"type": "manager"}, ("invalid_child_type", "manager")),
        ({"significant": "yes"}, ("invalid_significant", "yes")),
        ({"shutdown": "soon"}, ("invalid_shutdown", "soon")),
        ({"shutdown": True}, ("invalid_shutdown", True)),
        (
            {"significant": True},
            ("bad_combination", [("restart", "permanent"), ("significant", True)]),
        ),
    ],
)
def test_child_spec_errors_carry_otps_reason(kwargs: dict[str, object], reason: object) -> None:
    with pytest.raises(ChildSpecError) as info:
        ChildSpec("w", Worker, **kwargs)  # type: ignore[arg-type]
    assert info.value.reason == reason


def test_invalid_start_is_rejected() -> None:
    with pytest.raises(ChildSpecError, match=r"ChildSpec\.start must be"):
        ChildSpec("w", 42)


def test_from_map_requires_id_and_start() -> None:
    with pytest.raises(ChildSpecError) as info:
        ChildSpec.from_map({"start": Worker})
    assert info.value.reason == "missing_id"
    with pytest.raises(ChildSpecError) as info:
        ChildSpec.from_map({"id": "w"})
    assert info.value.reason == "missing_start"
    with pytest.raises(ChildSpecError, match="unknown keys"):
        ChildSpec.from_map({"id": "w", "start": Worker, "restrat": "temporary"})


def test_sup_flags_defaults_are_otps() -> None:
    flags = SupFlags()
    assert (flags.strategy, flags.intensity, flags.period, flags.auto_shutdown) == (
        Strategy.ONE_FOR_ONE,
        1,
        5,
        AutoShutdown.NEVER,
    )
    assert SupFlags.from_term(("one_for_all", 3, 10)) == SupFlags(Strategy.ONE_FOR_ALL, 3, 10)
    assert SupFlags.from_term({"intensity": 0}).intensity == 0


@pytest.mark.parametrize(
    ("kwargs", "reason", "message"),
    [
        (
            {"strategy": "one_for_some"},
            ("invalid_strategy", "one_for_some"),
            "SupFlags.strategy must be one of",
        ),
        ({"intensity": -1}, ("invalid_intensity", -1), "SupFlags.intensity must be an int >= 0"),
        ({"period": 0}, ("invalid_period", 0), "SupFlags.period must be an int > 0"),
        ({"auto_shutdown": "maybe"}, ("invalid_auto_shutdown", "maybe"), "auto_shutdown"),
    ],
)
def test_sup_flags_errors(kwargs: dict[str, object], reason: object, message: str) -> None:
    with pytest.raises(SupFlagsError, match=message) as info:
        SupFlags(**kwargs)  # type: ignore[arg-type]
    assert info.value.reason == reason


def test_check_childspecs_reports_duplicates_and_bad_combinations() -> None:
    assert check_childspecs([ChildSpec("a", Worker), {"id": "b", "start": Worker}]) == "ok"
    assert check_childspecs([ChildSpec("a", Worker), ChildSpec("a", Worker)]) == (
        "error",
        ("duplicate_child_name", "a"),
    )
    significant = ChildSpec("s", Worker, restart="transient", significant=True)
    assert check_childspecs([significant]) == (
        "error",
        ("bad_combination", [("auto_shutdown", "never"), ("significant", True)]),
    )
    assert check_childspecs([significant], "any_significant") == "ok"
    assert check_childspecs([{"id": "x"}]) == ("error", "missing_start")


def test_errors_share_one_root() -> None:
    assert issubclass(ChildSpecError, supervisors.SupervisorError)
    assert issubclass(ChildSpecError, ValueError)
    assert issubclass(SupFlagsError, ValueError)


def test_dynamic_extra_arguments_given_as_a_str_are_rejected() -> None:
    with pytest.raises(SupervisorError, match="extra_arguments"):
        DynamicSupFlags(extra_arguments="cfg")


def test_bad_module_names_are_child_spec_errors() -> None:
    with pytest.raises(ChildSpecError, match=r"ChildSpec\.modules must hold module names") as info:
        ChildSpec("b", Worker, modules=["ok", 5])
    assert info.value.reason == ("invalid_module", 5)
    assert ChildSpec("b", Worker, modules=["m1", "m2"]).modules == ("m1", "m2")
    assert check_childspecs([{"id": "b", "start": Worker, "modules": 5}]) == (
        "error",
        ("invalid_modules", 5),
    )


def test_dynamic_sup_flags_errors_name_dynamic_sup_flags() -> None:
    with pytest.raises(SupervisorError, match=r"^DynamicSupFlags\.intensity must be"):
        DynamicSupFlags(intensity=-1)
    with pytest.raises(SupervisorError, match=r"^DynamicSupFlags\.period must be"):
        DynamicSupFlags(period=0)
    with pytest.raises(SupervisorError, match=r"^DynamicSupFlags\.extra_arguments") as info:
        DynamicSupFlags(extra_arguments=None)  # type: ignore[arg-type]
    assert info.value.reason == ("invalid_extra_arguments", None)
    with pytest.raises(SupervisorError, match=r"^SupFlags\.intensity must be"):
        SupFlags(intensity=-1)
    assert DynamicSupFlags(extra_arguments=["cfg"]).extra_arguments == ("cfg",)
