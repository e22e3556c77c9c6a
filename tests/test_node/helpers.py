"""Applications shared by the node tests that boot a node in process."""

from __future__ import annotations

from typing import Any

import otp
import supervisors


class _Recorder(otp.GenServer):
    """Appends ``init``/``terminate`` events to a shared list; fails its init if asked."""

    def init(self, label: str, events: list[str], fail: bool = False) -> otp.Ok:
        if fail:
            raise RuntimeError(f"{label} cannot start")
        otp.process_flag(trap_exit=True)
        events.append(f"init {label}")
        return otp.Ok((label, events))

    def terminate(self, reason: Any, state: tuple[str, list[str]]) -> None:
        label, events = state
        events.append(f"terminate {label} {otp.format_reason(reason)}")


def _app(name: str, events: list[str], *labels: str, fail: str = "") -> supervisors.Application:
    return supervisors.Application(
        name,
        (
            supervisors.SupFlags(strategy="one_for_one"),
            [
                supervisors.ChildSpec(label, (_Recorder.start_link, label, events, label == fail))
                for label in labels
            ],
        ),
    )
