"""Command line of the conformance runner."""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import sys
from pathlib import Path
from typing import TextIO

from ._runner import run_scenario


def check_file(path: Path) -> tuple[list[str], list[str]]:
    """Run the scenario at ``path``; return (trace lines, expected lines or [] if none)."""
    scenario = json.loads(path.read_text(encoding="utf-8"))
    lines = run_scenario(scenario)
    expected_path = path.with_suffix(".expected")
    expected = (
        expected_path.read_text(encoding="utf-8").splitlines() if expected_path.exists() else []
    )
    return lines, expected


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the scenarios named in ``argv``; 0 on success, 1 on the first mismatch."""
    parser = argparse.ArgumentParser(
        prog="python -m supervisors.conformance",
        description="Play OTP supervisor conformance scenarios and print their traces.",
    )
    parser.add_argument("files", nargs="+", type=Path, help="scenario .json files")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare each trace with the .expected file beside it; stop at the first difference",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print the runtime's crash and supervisor reports"
    )
    args = parser.parse_args(argv)
    if not args.verbose:
        # Crashes are the point of the scenarios: keep their reports off the trace's terminal.
        for name in ("otp", "supervisors"):
            logging.getLogger(name).addHandler(logging.NullHandler())
    stream = out if out is not None else sys.stdout
    for path in args.files:
        lines, expected = check_file(path)
        if not args.check:
            for line in lines:
                print(line, file=stream)
            continue
        if not path.with_suffix(".expected").exists():
            print(f"{path}: no .expected file beside it", file=stream)
            return 1
        if lines != expected:
            print(f"FAIL {path}", file=stream)
            stream.writelines(
                difflib.unified_diff(
                    [e + "\n" for e in expected],
                    [line + "\n" for line in lines],
                    fromfile=str(path.with_suffix(".expected")),
                    tofile="trace",
                )
            )
            return 1
        print(f"ok   {path}", file=stream)
    return 0
