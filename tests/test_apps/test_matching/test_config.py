"""MatchingConfig: defaults, validation (each message names the setting and what to do), the
``[matching]`` table and the ``--matching-*`` flags."""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trustme

from apps.matching._application import application
from apps.matching._config import MatchingConfig, add_arguments
from apps.matching._dispatch import MatchingLimits
from apps.matching._errors import ConfigurationError
from otp import node
from otp.node._boot import resolve_application
from otp.node._config import ConfigError


@pytest.fixture
def tls(tmp_path: Path) -> dict[str, Any]:
    cert = trustme.CA().issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    keyfile.chmod(0o600)
    return {"tls_certfile": str(certfile), "tls_keyfile": str(keyfile)}


def _refused(match: str, **kw: Any) -> None:
    with pytest.raises(ConfigurationError, match=match):
        MatchingConfig(**kw)


def test_the_defaults_are_a_unix_socket_in_the_temporary_directory_and_a_local_sqlite_file() -> (
    None
):
    config = MatchingConfig()
    path = os.path.join(tempfile.gettempdir(), f"otp-matching-{os.getpid()}.sock")
    assert config.listen == (f"unix:{path}",)
    assert config.store == "matching.sqlite3" and config.store_path == "matching.sqlite3"
    assert config.tokens("worker") == () and config.tokens("client") == ()
    assert config.limits == MatchingLimits()
    assert (config.ping_interval, config.peer_timeout) == (20.0, 60.0)


def test_a_bad_listen_address_is_named() -> None:
    _refused(r"matching.listen\[1\] must be 'unix:/path' or 'tcp://host:port'", listen=[
        "unix:/tmp/a.sock", "nowhere"])  # fmt: skip
    _refused(r"matching.listen must be a list of addresses", listen=[])
    _refused(r"matching.listen names an address twice", listen=["/tmp/a", "unix:/tmp/a"])


def test_tcp_without_a_certificate_needs_tls_off() -> None:
    _refused(
        r"TCP address tcp://0.0.0.0:7233, which uses TLS: set matching.tls_certfile and"
        r" matching.tls_keyfile .* or matching.tls = false",
        listen=["tcp://0.0.0.0:7233"],
        worker_tokens=["w"],
        client_tokens=["c"],
    )


def test_tcp_needs_tokens_for_both_roles(tls: dict[str, Any]) -> None:
    _refused(
        r"which needs authentication: set matching.worker_tokens or a matching.token_file",
        listen=["tcp://127.0.0.1:0"],
        **tls,
    )
    _refused(
        r"set matching.client_tokens",
        listen=["tcp://127.0.0.1:0"],
        worker_tokens=["w"],
        **tls,
    )
    config = MatchingConfig(
        listen=["tcp://127.0.0.1:0"], worker_tokens="w", client_tokens=["c"], **tls
    )
    assert config.uses_tls and config.tokens("worker") == ("w",)
    assert str(config.addresses[0]) == "tcp://127.0.0.1:0"


def test_plain_tcp_is_allowed_when_asked_for() -> None:
    config = MatchingConfig(
        listen=["tcp://127.0.0.1:7233"], tls=False, worker_tokens=["w"], client_tokens=["c"]
    )
    assert not config.uses_tls


def test_a_key_file_readable_by_others_is_refused(tls: dict[str, Any]) -> None:
    os.chmod(tls["tls_keyfile"], 0o644)
    _refused(
        rf"matching.tls_keyfile: {re.escape(tls['tls_keyfile'])} has mode 0644; .* run chmod 600",
        listen=["tcp://127.0.0.1:0"],
        worker_tokens=["w"],
        client_tokens=["c"],
        **tls,
    )


def test_a_missing_certificate_is_named(tls: dict[str, Any], tmp_path: Path) -> None:
    _refused(
        r"matching.tls_certfile: .*nope.pem is not a readable file",
        listen=["tcp://127.0.0.1:0"],
        worker_tokens=["w"],
        client_tokens=["c"],
        tls_certfile=str(tmp_path / "nope.pem"),
        tls_keyfile=tls["tls_keyfile"],
    )


def test_tokens_come_from_a_private_token_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# who may connect\nworker w-secret\n\nclient: c-secret\nclient c2\n")
    path.chmod(0o600)
    config = MatchingConfig(token_file=str(path), worker_tokens=["w0"])
    assert config.tokens("worker") == ("w0", "w-secret")
    assert config.tokens("client") == ("c-secret", "c2")


def test_a_token_file_readable_by_others_or_malformed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("worker w\n")
    path.chmod(0o640)
    _refused(r"matching.token_file: .* has mode 0640; .* chmod 600", token_file=str(path))
    path.chmod(0o600)
    path.write_text("worker w\nadmin x\n")
    _refused(r"line 2 must read 'worker TOKEN' or 'client TOKEN'", token_file=str(path))
    _refused(r"matching.token_file: cannot read", token_file=str(tmp_path / "missing"))


def test_empty_tokens_are_refused() -> None:
    _refused(r"matching.client_tokens must be a list of non-empty str", client_tokens=[""])


def test_the_store_is_sqlite_a_path_or_memory() -> None:
    assert MatchingConfig(store="sqlite:/var/lib/m.db").store_path == "/var/lib/m.db"
    assert MatchingConfig(store="/var/lib/m.db").store_path == "/var/lib/m.db"
    assert MatchingConfig(store=":memory:").store_path == ":memory:"
    _refused(
        r"matching.store: the stores are SQLite .* got 'mysql://u:\*\*\*@db/x'",
        store="mysql://u:pw@db/x",
    )
    _refused(r"matching.store must be 'sqlite:PATH', a file path, ':memory:' or a", store="")


def test_the_store_may_be_a_postgresql_url_checked_at_construction() -> None:
    config = MatchingConfig(store="postgresql://app:pw@db.example:5432/flows")
    assert config.store_is_postgres and not MatchingConfig().store_is_postgres
    _refused(
        r"'postgresql://app:\*\*\*@db:x/f' is not a valid PostgreSQL URL",
        store="postgresql://app:pw@db:x/f",
    )
    _refused(r"'postgresql:///flows' names no host", store="postgresql:///flows")
    assert MatchingConfig(store="postgresql:///flows?host=/run/postgresql").store_is_postgres


def test_the_table_and_its_limits_are_read() -> None:
    config = MatchingConfig.from_settings(
        {
            "matching": {
                "listen": "unix:/tmp/m.sock",
                "store": ":memory:",
                "dispatch_wait": 3,
                "ping_interval": 5.0,
                "limits": {"max_streams": 10},
            }
        }
    )
    assert config.listen == ("unix:/tmp/m.sock",)
    assert config.limits.dispatch_wait == 3 and config.limits.max_streams == 10
    assert config.limits.ping_interval == 5.0
    assert config.limits.peer_timeout == 15.0  # three ping intervals


def test_unknown_settings_are_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(ConfigurationError, match=r"\[matching\] has unknown settings \['lisen'\]"):
        MatchingConfig.from_settings({"matching": {"lisen": "unix:/tmp/x"}})
    with pytest.raises(ConfigurationError, match=r"unknown settings \['max_strims'\]"):
        MatchingConfig.from_settings({"matching": {"limits": {"max_strims": 1}}})
    with pytest.raises(ConfigurationError, match=r"\[matching\] must be a table"):
        MatchingConfig.from_settings({"matching": 3})


def test_a_bad_limit_names_the_setting() -> None:
    with pytest.raises(
        ConfigurationError, match=r"MatchingLimits.dispatch_wait must be a number of seconds > 0"
    ):
        MatchingConfig.from_settings({"matching": {"dispatch_wait": -1}})


def test_the_stop_drain_timeout_defaults_to_ten_seconds_and_is_validated() -> None:
    assert MatchingConfig().stop_drain_timeout == 10.0
    config = MatchingConfig.from_settings({"matching": {"stop_drain_timeout": 2.5}})
    assert config.stop_drain_timeout == 2.5
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--matching-stop-drain-timeout", "0.5"])
    flagged = MatchingConfig.from_settings(
        {"matching": {"stop_drain_timeout": 9}, "flags": vars(args)}
    )
    assert flagged.stop_drain_timeout == 0.5
    for bad in (0, -1, float("inf"), "10", True):
        _refused(
            r"matching.stop_drain_timeout must be a number of seconds > 0 \(got ",
            stop_drain_timeout=bad,
        )


def test_store_is_the_short_flag_of_matching_store() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--store", "postgresql://app@db.example/flows"])
    config = MatchingConfig.from_settings({"flags": vars(args)})
    assert config.store == "postgresql://app@db.example/flows" and config.store_is_postgres


def test_the_flags_win_over_the_table(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    tokens = tmp_path / "tokens"
    tokens.write_text("client c\n")
    tokens.chmod(0o600)
    args = parser.parse_args(
        [
            "--matching-listen", "unix:/tmp/a.sock", "--matching-listen", "unix:/tmp/b.sock",
            "--matching-store", "sqlite:/tmp/f.db", "--matching-token-file", str(tokens),
            "--matching-dispatch-wait", "2.5", "--matching-max-streams", "7",
        ]
    )  # fmt: skip
    config = MatchingConfig.from_settings(
        {"matching": {"store": ":memory:", "dispatch_wait": 9.0}, "flags": vars(args)}
    )
    assert config.listen == ("unix:/tmp/a.sock", "unix:/tmp/b.sock")
    assert config.store_path == "/tmp/f.db"
    assert config.tokens("client") == ("c",)
    assert config.limits.dispatch_wait == 2.5 and config.limits.max_streams == 7


def test_the_node_reports_a_bad_setting_as_a_config_error() -> None:
    config = node.NodeConfig(settings={"matching": {"store": "redis://x"}})
    with pytest.raises(ConfigurationError):
        application(config)
    with pytest.raises(ConfigError, match=r"the stores are SQLite"):
        resolve_application("apps.matching._application:application", config)
