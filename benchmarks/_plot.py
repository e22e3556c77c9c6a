"""``--plot FILE.svg``: every figure's ratio to its baseline as a horizontal bar, 1.0 marked.

One bar per figure, grouped by benchmark (the part of the figure's name before its first dot).
Each bar starts at 1.0 and runs right when we beat the baseline and left when we trail it; the
ratio axis is logarithmic, because a ratio is a factor: on a log axis 2x better and 2x worse lie
equally far from 1.0, and 0.05x and 20x fit on one chart without squashing the figures near
parity, which a linear axis cannot do.

Written as SVG text directly (no plotting dependency); all text goes through
:mod:`xml.sax.saxutils`, so any figure or baseline name is safe to draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from xml.sax.saxutils import escape, quoteattr

from ._harness import Result

FONT_PX = 12
CHAR_PX = 7.3  # advance of one 12 px monospace character, so label widths are known in advance
MARGIN = 16
ROW = 34
GROUP_ROW = 24
HEADER = 86
AXIS_PAD = 56  # room beside the axis for the ratio labels of the longest bars
PLOT_WIDTH = 520
BAR_HEIGHT = 14
# Beyond these a ratio is drawn at the edge (its label still says the real figure).
LOWEST, HIGHEST = 1e-3, 1e3
BETTER, WORSE, INK, GRID = "#2e7d32", "#c62828", "#222", "#ddd"


def group_of(name: str) -> str:
    """The benchmark a figure belongs to: ``dirty.execute_8`` belongs to ``dirty``."""
    return name.split(".", 1)[0]


def number(x: float) -> str:
    """A figure as a reader wants it: ``12,345`` rather than ``1.235e+04``, ``0.0421`` as is."""
    if abs(x) >= 10_000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def axis_range(ratios: Sequence[float]) -> tuple[float, float, list[float]]:
    """``(low, high, ticks)`` on the 1-2-5 sequence, always spanning at least 0.5 to 2."""
    decades = range(round(math.log10(LOWEST)), round(math.log10(HIGHEST)) + 1)
    steps = [m * 10.0**e for e in decades for m in (1, 2, 5)]
    steps = [s for s in steps if LOWEST <= s <= HIGHEST]
    measured = [min(max(r, LOWEST), HIGHEST) for r in ratios if r > 0]
    smallest = min([0.5, *measured])
    largest = max([2.0, *measured])
    low = max(s for s in steps if s <= smallest * (1 + 1e-9))
    high = min(s for s in steps if s >= largest * (1 - 1e-9))
    ticks = [s for s in steps if low <= s <= high]
    if math.log10(high / low) > 3:  # many decades: a tick per decade is enough to read by
        ticks = [s for s in ticks if _is_decade(s)]
    return low, high, ticks


def _is_decade(x: float) -> bool:
    return math.isclose(10.0 ** round(math.log10(x)), x)


def _detail(r: Result) -> str:
    return f"{number(r.value)} {r.unit} vs {r.baseline} ({number(r.baseline_value)})"


def _text(x: float, y: float, text: str, **attributes: str) -> str:
    # Python names stand for SVG attributes: font_size is font-size, class_ is class.
    names = {k: k.rstrip("_").replace("_", "-") for k in attributes}
    extra = "".join(f" {names[k]}={quoteattr(v)}" for k, v in attributes.items())
    return f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{escape(text)}</text>'


def render_svg(results: Sequence[Result], subtitle: str = "") -> str:
    """The chart of ``results`` as a standalone SVG document."""
    label_chars = max([40, *(max(len(r.name), len(_detail(r))) for r in results)])
    label_width = label_chars * CHAR_PX + MARGIN
    x0 = MARGIN + label_width + AXIS_PAD
    low, high, ticks = axis_range([r.ratio for r in results])
    span = math.log(high / low)

    def x_of(ratio: float) -> float:
        clamped = min(max(ratio, low), high)
        return x0 + math.log(clamped / low) / span * PLOT_WIDTH

    groups: list[tuple[str, list[Result]]] = []
    for r in results:
        if not groups or groups[-1][0] != group_of(r.name):
            groups.append((group_of(r.name), []))
        groups[-1][1].append(r)
    rows_height = sum(GROUP_ROW + ROW * len(members) for _, members in groups)
    top = HEADER
    bottom = top + rows_height
    width = x0 + PLOT_WIDTH + AXIS_PAD + MARGIN
    height = bottom + 28 + MARGIN
    parity = x_of(1.0)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" '
        f'font-size="{FONT_PX}" fill="{INK}">',
        '<rect width="100%" height="100%" fill="#fff"/>',
        _text(
            MARGIN,
            24,
            "ours / baseline, same run: right of 1.0 is better",
            font_size="15",
            font_weight="bold",
        ),
        _text(MARGIN, 42, "ratio on a log axis: 2x better and 2x worse are equally far from 1.0"),
    ]
    if subtitle:
        out.append(_text(MARGIN, 58, subtitle, fill="#666"))
    for tick in ticks:
        x = x_of(tick)
        out.append(
            f'<line class="tick" x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" '
            f'y2="{bottom}" stroke="{GRID}"/>'
        )
        for y in (top - 8, bottom + 16):
            out.append(_text(x, y, f"{tick:g}", text_anchor="middle", fill="#666"))
    y = top
    for name, members in groups:
        out.append(
            f'<g class="group"><rect x="{MARGIN}" y="{y}" width="{width - 2 * MARGIN:.0f}" '
            f'height="{GROUP_ROW - 4}" fill="#f2f2f2"/>'
        )
        out.append(_text(MARGIN + 4, y + 15, name, font_weight="bold"))
        out.append("</g>")
        y += GROUP_ROW
        for r in members:
            out.append(_figure(r, y, x_of, parity))
            y += ROW
    out.append(
        f'<line class="parity" x1="{parity:.1f}" y1="{top - 2}" x2="{parity:.1f}" '
        f'y2="{bottom + 4}" stroke="{INK}" stroke-width="1.5" stroke-dasharray="4 3"/>'
    )
    out.append(
        _text(
            parity,
            top - 24,
            "1.0 = baseline",
            class_="parity-label",
            text_anchor="middle",
            font_weight="bold",
        )
    )
    if not results:
        out.append(_text(MARGIN, top + 16, "no figures"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _figure(r: Result, y: float, x_of: Callable[[float], float], parity: float) -> str:
    middle = y + ROW / 2
    parts = [
        '<g class="figure">',
        f"<title>{escape(f'{r.name}: {_detail(r)}, ratio {r.ratio:.3g}')}</title>",
        _text(MARGIN + 4, middle - 3, r.name, class_="name"),
        _text(MARGIN + 4, middle + 11, _detail(r), class_="detail", fill="#666"),
    ]
    if r.ratio <= 0:
        parts.append(
            _text(parity + 6, middle + 4, "not measured", class_="unmeasured", fill="#666")
        )
    else:
        end = x_of(r.ratio)
        better = r.ratio >= 1
        left, right = (parity, end) if better else (end, parity)
        parts.append(
            f'<rect class="bar" x="{left:.1f}" y="{middle - BAR_HEIGHT / 2:.1f}" '
            f'width="{max(right - left, 1):.1f}" height="{BAR_HEIGHT}" '
            f'fill="{BETTER if better else WORSE}"/>'
        )
        label_x = end + 5 if better else end - 5
        parts.append(
            _text(
                label_x,
                middle + 4,
                f"{r.ratio:.3g}x",
                class_="ratio",
                text_anchor="start" if better else "end",
            )
        )
    parts.append("</g>")
    return "\n".join(parts)
