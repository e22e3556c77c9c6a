"""``--top``: the busiest processes of a node as a terminal table, in the spirit of Erlang's
``etop`` and ``recon:proc_window/3``: two samples an interval apart give each process's message
rate; the table shows the first ``count`` by message rate, mailbox length or memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

#: What the table may be sorted by, each with the column it sorts.
SORTS = {"rate": "msgs/s", "mailbox": "mailbox", "memory": "memory"}


@attrs.frozen
class TopRow:
    """One process in the table.

    Attributes:
        pid: Its pid, as text.
        name: Its registered name, or None.
        status: As ``otp.observer.ProcessSnapshot.status``.
        rate: Messages it took from its mailbox per second between the two samples (a process
            that started meanwhile counts from its start).
        mailbox: Messages waiting in its mailbox now.
        memory: Its memory estimate now, in bytes.
        current: Its behaviour or initial call.
    """

    pid: str
    name: str | None
    status: str
    rate: float
    mailbox: int
    memory: int
    current: str | None


@attrs.frozen
class Top:
    """The table at one moment: ``rows`` sorted, and the node's totals."""

    node: str
    interval: float
    sort: str
    processes: int
    mailbox_total: int
    rate_total: float
    memory_total: int
    rows: tuple[TopRow, ...]


def top(
    before: Mapping[str, Any], after: Mapping[str, Any], *, sort: str = "rate", count: int = 20
) -> Top:
    """The table from two ``"processes"`` samples of the agent (``RemoteNode.processes()``),
    ``before`` taken first.

    Raises:
        ValueError: ``sort`` is not one of :data:`SORTS`, or ``count`` is below 1.
    """
    if sort not in SORTS:
        raise ValueError(f"--sort {sort!r}: sort by one of {', '.join(SORTS)}")
    if count < 1:
        raise ValueError(f"--count {count}: show at least 1 process")
    columns = list(after["columns"])
    at = {name: columns.index(name) for name in columns}
    pid_at, handled_at = at["pid"], at["messages_handled"]
    earlier = {row[pid_at]: row[handled_at] for row in before["rows"]}
    interval = max(float(after["time"]) - float(before["time"]), 1e-9)
    rows = []
    for row in after["rows"]:
        handled = row[handled_at]
        rows.append(
            TopRow(
                pid=row[pid_at],
                name=row[at["name"]],
                status=row[at["status"]],
                rate=max(0, handled - earlier.get(row[pid_at], 0)) / interval,
                mailbox=row[at["message_queue_len"]],
                memory=row[at["memory"]],
                current=row[at["current"]],
            )
        )
    key = {"rate": _by_rate, "mailbox": _by_mailbox, "memory": _by_memory}[sort]
    rows.sort(key=key, reverse=True)
    return Top(
        node=str(after.get("node", "")),
        interval=interval,
        sort=sort,
        processes=len(rows),
        mailbox_total=sum(r.mailbox for r in rows),
        rate_total=sum(r.rate for r in rows),
        memory_total=sum(r.memory for r in rows),
        rows=tuple(rows[:count]),
    )


def _by_rate(row: TopRow) -> tuple[float, int, int]:
    return (row.rate, row.mailbox, row.memory)


def _by_mailbox(row: TopRow) -> tuple[float, float, int]:
    return (row.mailbox, row.rate, row.memory)


def _by_memory(row: TopRow) -> tuple[float, float, int]:
    return (row.memory, row.rate, row.mailbox)


_HEADER = ("pid", "name", "msgs/s", "mailbox", "memory", "status", "current")


def render(table: Top, width: int = 120) -> str:
    """``table`` as text lines no wider than ``width`` (the last column is cut to fit)."""
    lines = [
        f"{table.node}  processes {table.processes}  msgs/s {table.rate_total:.1f}"
        f"  mailboxes {table.mailbox_total}  memory {_bytes(table.memory_total)}"
        f"  (sorted by {SORTS[table.sort]}, over {table.interval:.1f} s)",
        "",
    ]
    cells = [
        (
            r.pid,
            "" if r.name is None else r.name,
            f"{r.rate:.1f}",
            str(r.mailbox),
            _bytes(r.memory),
            r.status,
            r.current or "",
        )
        for r in table.rows
    ]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(_HEADER[:-1])]
    numeric = {2, 3, 4}
    for row in [_HEADER, *cells]:
        parts = [
            cell.rjust(w) if i in numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row[:-1], widths, strict=True))
        ]
        lines.append(_fit("  ".join([*parts, row[-1]]), width))
    return "\n".join(lines)


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(0, width - 1)] + "~"


def _bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
