"""Reading back the JSON that ``python -m benchmarks --json PATH`` wrote, for ``--from``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import attrs

from ._harness import Direction, Result

# A results file is a few dozen figures; anything far beyond that is not one of ours.
MAX_BYTES = 16 * 1024 * 1024


class ResultsFileError(ValueError):
    """``path`` is missing, unreadable, or not a results file; the message says which and why."""


@attrs.frozen
class SavedRun:
    """A results file's figures, in the order they were measured, and the run they came from."""

    results: list[Result]
    about: str


def describe(document: Mapping[str, object]) -> str:
    """Where and how a run was measured, e.g. ``CPython 3.11.7, x86_64, --quick, 2026-12-02``."""
    python = " ".join(str(document[k]) for k in ("implementation", "python") if k in document)
    parts = [python, str(document.get("machine", ""))]
    if "quick" in document:
        parts.append("--quick" if document["quick"] else "full sizes")
    parts.append(str(document.get("date", "")))
    return ", ".join(p for p in parts if p)


def read_results(path: Path) -> SavedRun:
    """What ``path`` holds; :class:`ResultsFileError` says why when it is not a results file."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ResultsFileError(f"{path}: larger than {MAX_BYTES} bytes, not a results file")
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ResultsFileError(f"{path}: cannot read it ({error.strerror or error})")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultsFileError(f"{path}: not JSON ({error}); pass a file --json wrote")
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ResultsFileError(f'{path}: no "results" list; pass a file --json wrote')
    results = [_result(path, index, entry) for index, entry in enumerate(document["results"])]
    return SavedRun(results, describe(document))


def _result(path: Path, index: int, entry: object) -> Result:
    where = f'{path}: "results"[{index}]'
    if not isinstance(entry, dict):
        raise ResultsFileError(f"{where} is not an object")
    texts = {}
    for key in ("name", "unit", "baseline"):
        if not isinstance(entry.get(key), str):
            raise ResultsFileError(f"{where}: {key!r} must be a string")
        texts[key] = entry[key]
    numbers = {}
    for key in ("value", "baseline_value"):
        number = entry.get(key)
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ResultsFileError(f"{where}: {key!r} must be a number")
        if not math.isfinite(number) or number < 0:
            raise ResultsFileError(f"{where}: {key!r} must be finite and >= 0, not {number}")
        numbers[key] = float(number)
    notes = entry.get("notes", "")
    return Result(
        texts["name"],
        texts["unit"],
        numbers["value"],
        texts["baseline"],
        numbers["baseline_value"],
        _direction(where, entry, numbers["value"], numbers["baseline_value"]),
        notes if isinstance(notes, str) else "",
    )


def _direction(where: str, entry: dict[str, object], value: float, base: float) -> Direction:
    direction = entry.get("direction")
    if direction == "higher" or direction == "lower":
        return direction
    if direction is not None:
        raise ResultsFileError(f'{where}: "direction" must be "higher" or "lower"')
    # Files written before "direction" was saved still carry the ratio it produced.
    ratio = entry.get("ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        raise ResultsFileError(f'{where}: needs "direction" or "ratio"')
    if value == 0 or base == 0:
        return "higher"
    return "higher" if abs(ratio - value / base) <= abs(ratio - base / value) else "lower"
