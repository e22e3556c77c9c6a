"""The OTP conformance runner: plays scenarios of ``../shared/conformance`` on the runtime.

``python -m supervisors.conformance FILE.json [FILE.json ...] [--check]`` prints each trace;
``--check`` compares each with the ``.expected`` file beside it and exits non-zero on the first
difference, showing a diff.
"""

from ._main import check_file as check_file
from ._main import main as main
from ._runner import Collector as Collector
from ._runner import ScenarioError as ScenarioError
from ._runner import run_scenario as run_scenario
from ._terms import format_term as format_term

__all__ = ["Collector", "ScenarioError", "check_file", "format_term", "main", "run_scenario"]


def _publish() -> None:
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_publish()
del _publish
