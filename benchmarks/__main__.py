"""``python -m benchmarks [--quick] [--only PREFIX]... [--json PATH] [--plot FILE.svg]``: run every
benchmark, print a table, write JSON, and draw each figure against its baseline. Each figure comes
with a baseline measured in the same run. ``--from PATH`` reads a saved JSON instead of running."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import pkgutil
import platform
import sys
from pathlib import Path

from ._harness import Benchmark, Result, run_all, select
from ._plot import render_svg
from ._results import ResultsFileError, describe, read_results


def discover() -> list[Benchmark]:
    """Every ``BENCHMARKS`` entry of every ``benchmarks/bench_*.py`` module, in name order."""
    found: list[Benchmark] = []
    package = Path(__file__).parent
    for module in sorted(pkgutil.iter_modules([str(package)]), key=lambda m: m.name):
        if module.name.startswith("bench_"):
            found.extend(importlib.import_module(f"benchmarks.{module.name}").BENCHMARKS)
    return found


def format_table(results: list[Result]) -> str:
    rows = [("benchmark", "value", "unit", "baseline", "baseline value", "ratio")]
    for r in results:
        rows.append(
            (
                r.name,
                f"{r.value:,.6g}",
                r.unit,
                r.baseline,
                f"{r.baseline_value:,.6g}",
                f"{r.ratio:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes; well under a minute")
    parser.add_argument(
        "--only",
        metavar="PREFIX",
        action="append",
        default=[],
        help="run only benchmarks whose name starts with PREFIX (repeatable: any of them)",
    )
    parser.add_argument(
        "--json", metavar="PATH", default="bench-results.json", help="where to write the results"
    )
    parser.add_argument(
        "--plot", metavar="FILE.svg", help="draw every figure's ratio to its baseline as SVG"
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        help="take the results from a JSON file --json wrote instead of running anything",
    )
    args = parser.parse_args(argv)
    if args.source is not None:
        if args.quick:
            parser.error("--quick says how to run; --from runs nothing")
        try:
            saved = read_results(Path(args.source))
        except ResultsFileError as error:
            print(f"{parser.prog}: error: --from {error}", file=sys.stderr)
            return 2
        results = [r for r in saved.results if not args.only or r.name.startswith(tuple(args.only))]
        about = f"{saved.about}; from {args.source}"
    else:
        try:
            chosen = select(discover(), args.only)
        except ValueError as error:
            parser.error(str(error))
        results = run_all(chosen, args.quick, sys.stderr)
        document = {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "quick": args.quick,
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "results": [r.as_json() for r in results],
        }
        about = describe(document)
    print(format_table(results))
    for r in results:
        if r.notes:
            print(f"note: {r.name}: {r.notes}")
    if args.source is None:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
        print(f"results written to {args.json}", file=sys.stderr)
    if args.plot:
        Path(args.plot).write_text(render_svg(results, about), encoding="utf-8")
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
