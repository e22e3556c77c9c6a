"""Worker and client options (the seed's PullWorkerOptions table) and server addresses."""

from __future__ import annotations

import os

import pytest

from apps.matching import (
    ClientOptions,
    ConfigurationError,
    PullWorkerOptions,
    ServerAddress,
    WorkerOptions,
    parse_server_address,
)


def test_defaults_follow_the_seed():
    pull = PullWorkerOptions()
    cpus = max(1, os.cpu_count() or 1)
    assert pull.resolved_max_concurrent_tasks == cpus
    assert pull.resolved_reserved_rpc_tasks == (1 if cpus >= 2 else 0)
    assert pull.idle_streams_per_queue == 1
    assert pull.stop_drain_timeout == 30.0
    assert pull.stop_on_permanent_stream_rejection is False
    assert pull.inline_quick_handlers is True
    assert pull.keepalive_interval == 20.0
    assert pull.idle_stream_linger == 5.0


def test_reserved_defaults_to_one_from_a_cap_of_two_and_zero_below():
    assert PullWorkerOptions(max_concurrent_tasks=2).resolved_reserved_rpc_tasks == 1
    one = PullWorkerOptions(max_concurrent_tasks=1)
    assert one.resolved_reserved_rpc_tasks == 0
    assert one.warns_unreserved
    assert not PullWorkerOptions(max_concurrent_tasks=1, reserved_rpc_tasks=0).warns_unreserved
    assert (
        PullWorkerOptions(max_concurrent_tasks=8, reserved_rpc_tasks=0).resolved_reserved_rpc_tasks
        == 0
    )


@pytest.mark.parametrize("reserved", [-1, 8, 9, 1.0, "1"])
def test_reserved_must_be_below_the_cap(reserved):
    with pytest.raises(
        ConfigurationError, match=r"reserved_rpc_tasks must be an int >= 0 and below"
    ):
        PullWorkerOptions(max_concurrent_tasks=8, reserved_rpc_tasks=reserved)


def test_the_cap_is_bounded_by_the_servers_per_worker_cap():
    assert PullWorkerOptions(max_concurrent_tasks=256).resolved_max_concurrent_tasks == 256
    with pytest.raises(ConfigurationError, match="at most 256"):
        PullWorkerOptions(max_concurrent_tasks=257)
    with pytest.raises(ConfigurationError, match="max_concurrent_tasks must be an int >= 1"):
        PullWorkerOptions(max_concurrent_tasks=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("idle_streams_per_queue", 0),
        ("stop_drain_timeout", 0),
        ("stop_drain_timeout", float("inf")),
        ("keepalive_interval", -1),
        ("stop_on_permanent_stream_rejection", 1),
        ("inline_quick_handlers", "yes"),
        ("idle_stream_linger", 0),
        ("idle_stream_linger", "5"),
    ],
)
def test_bad_pull_options_are_refused(field, value):
    with pytest.raises((ConfigurationError, TypeError), match=field):
        PullWorkerOptions(**{field: value})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("unix:/run/m.sock", ServerAddress("unix", path="/run/m.sock")),
        ("unix:///run/m.sock", ServerAddress("unix", path="/run/m.sock")),
        ("/run/m.sock", ServerAddress("unix", path="/run/m.sock")),
        ("tcp://example.org:7233", ServerAddress("tcp", host="example.org", port=7233)),
        ("127.0.0.1:7233", ServerAddress("tcp", host="127.0.0.1", port=7233)),
        ("tcp://[::1]:7233", ServerAddress("tcp", host="::1", port=7233)),
    ],
)
def test_addresses_parse(text, expected):
    assert parse_server_address(text) == expected


@pytest.mark.parametrize("text", ["", "unix:", "host", "host:0", "host:99999", "tcp://:1", 5])
def test_bad_addresses_are_refused_naming_the_option(text):
    with pytest.raises(ConfigurationError, match=r"WorkerOptions\.server_address"):
        WorkerOptions(server_address=text)


def test_tls_is_on_for_tcp_unless_turned_off():
    assert ClientOptions(server_address="tcp://h:1").uses_tls
    assert not ClientOptions(server_address="tcp://h:1", tls=False).uses_tls
    assert not ClientOptions(server_address="unix:/x").uses_tls


def test_credentials_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("OTP_MATCHING_TOKEN", "from-env")
    assert ClientOptions(server_address="unix:/x").token == "from-env"
    assert ClientOptions(server_address="unix:/x", credentials="given").token == "given"
    monkeypatch.delenv("OTP_MATCHING_TOKEN")
    assert ClientOptions(server_address="unix:/x").token == ""


def test_worker_options_take_the_seeds_form():
    options = WorkerOptions(
        server_address="unix:/tmp/dex.sock",
        pull=PullWorkerOptions(max_concurrent_tasks=8, reserved_rpc_tasks=1),
    )
    assert options.pull.resolved_reserved_rpc_tasks == 1
    assert options.app_worker_id is None
    with pytest.raises(ConfigurationError, match=r"WorkerOptions\.pull must be"):
        WorkerOptions(server_address="unix:/x", pull={"max_concurrent_tasks": 8})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="app_worker_id must be a non-empty str"):
        WorkerOptions(server_address="unix:/x", app_worker_id="")


def test_a_bad_idle_stream_linger_message_names_the_field_and_the_value():
    with pytest.raises(ConfigurationError) as info:
        PullWorkerOptions(idle_stream_linger=-2)
    assert str(info.value) == (
        "PullWorkerOptions.idle_stream_linger must be a finite number of seconds > 0 (got -2)"
    )


def test_the_accept_delay_defaults_to_5_ms_and_may_be_zero():
    assert PullWorkerOptions().accept_delay == 0.005
    assert PullWorkerOptions(accept_delay=0).accept_delay == 0


@pytest.mark.parametrize("value", [-0.001, 1.5, float("nan"), float("inf"), "0.1", None])
def test_a_bad_accept_delay_message_names_the_field_the_range_and_the_value(value):
    with pytest.raises(ConfigurationError) as info:
        PullWorkerOptions(accept_delay=value)
    assert str(info.value) == (
        "PullWorkerOptions.accept_delay must be a number of seconds from 0 to 1.0"
        f" (got {value!r}); 0 accepts each task at once"
    )
