"""The README's examples run as they stand, and its two commands are the ones CI uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index: int) -> None:
    exec(compile(EXAMPLES[index], f"README.md example {index + 1}", "exec"), {})


def test_the_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", README, re.S)
    assert len(commands) == 2
    run_node, run_tests = commands
    assert "python -m otp.node" in run_node
    assert "pytest" in run_tests
    assert run_tests in (ROOT / ".ci" / "run").read_text()
