"""The conformance runner reproduces real OTP 25 traces byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisors.conformance import check_file, format_term, main, run_scenario

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "conformance"
OWN = Path(__file__).parent / "scenarios"


def _scenarios(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@pytest.mark.parametrize("path", _scenarios(SHARED), ids=lambda p: p.stem)
def test_shared_scenario_trace_matches_otp(path: Path) -> None:
    lines, expected = check_file(path)
    assert lines == expected


@pytest.mark.parametrize("path", _scenarios(OWN), ids=lambda p: p.stem)
def test_own_scenario_trace_matches_expected(path: Path) -> None:
    lines, expected = check_file(path)
    assert lines == expected


def test_shared_folder_is_present() -> None:
    assert _scenarios(SHARED), f"no scenarios in {SHARED}"


def test_cli_check_passes_over_shared_folder() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "supervisors.conformance", "--check", *map(str, _scenarios(SHARED))],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == len(_scenarios(SHARED))


def test_cli_check_fails_with_a_diff_on_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = json.loads((SHARED / "01_one_for_one_basic.json").read_text())
    target = tmp_path / "x.json"
    target.write_text(json.dumps(scenario))
    expected = (SHARED / "01_one_for_one_basic.expected").read_text().replace('"n":2', '"n":9')
    (tmp_path / "x.expected").write_text(expected)
    assert main([str(target), "--check"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and '+{"ev":"start","id":"b","n":2}' in out


def test_cli_prints_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "s.json"
    target.write_text(json.dumps({"name": "s", "supervisor": {"id": "r", "children": []}}))
    assert main([str(target)]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        '{"ev":"begin","name":"s"}',
        '{"ev":"start","id":"r","n":1}',
    ]


def test_trace_is_deterministic_across_runs() -> None:
    scenario = json.loads((OWN / "128_simple_one_for_one.json").read_text())
    assert run_scenario(scenario) == run_scenario(scenario)


def test_root_ignore_and_final_shutdown_false() -> None:
    lines = run_scenario(
        {
            "name": "i",
            "final_shutdown": False,
            "supervisor": {"id": "r", "start_results": ["ignore"], "children": []},
            "events": [{"op": "which_children", "sup": "r"}, {"op": "call", "child": "zz"}],
        }
    )
    assert lines == [
        '{"ev":"begin","name":"i"}',
        '{"attempt":1,"ev":"start_failed","id":"r","result":"ignore"}',
        '{"ev":"root_start_result","result":"ignore"}',
        '{"ev":"op","n":1,"op":{"op":"which_children","sup":"r"}}',
        '{"ev":"result","value":"{exit,noproc}"}',
        '{"ev":"op","n":2,"op":{"child":"zz","op":"call"}}',
        '{"ev":"result","value":"{exit,noproc}"}',
        '{"ev":"final"}',
        '{"ev":"tree","value":"root_dead"}',
    ]


def test_no_shutdown_root_line_when_final_shutdown_is_false() -> None:
    lines = run_scenario(
        {"name": "k", "final_shutdown": False, "supervisor": {"id": "r", "children": [{"id": "a"}]}}
    )
    assert lines[-1] == '{"ev":"tree","value":{"children":[["a","pid","worker"]],"sup":"r"}}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("boom", "boom"),
        ("Boom", "'Boom'"),
        ("end", "'end'"),
        (None, "undefined"),
        (("error", ("already_started", None)), "{error,{already_started,undefined}}"),
        (
            [("restart", "permanent"), ("significant", True)],
            "[{restart,permanent},{significant,true}]",
        ),
        (7, "7"),
    ],
)
def test_format_term_writes_erlang_text(value: object, text: str) -> None:
    assert format_term(value) == text
