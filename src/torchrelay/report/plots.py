"""The HTML report's figures, rendered by matplotlib's Agg canvas to PNG ``data:`` URIs.

No pyplot (no global figure state, no GUI backend); no text from the ledger is drawn, only
numbers and the labels ``F1``, ``F2``... that the page's failure table explains, so ledger
text never reaches matplotlib's mathtext parser.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from torchrelay.report.timeline import Timeline

PHASE_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1")
_RECOVERED, _UNRECOVERED = "#f28e2b", "#e15759"


def _data_uri(figure: Figure) -> str:
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def progress_plot(timeline: Timeline) -> str:
    """Committed steps over wall-clock time: the ledger's points as markers joined by a dashed
    interpolation, each failure's onset marked and its stall shaded."""
    figure = Figure(figsize=(9, 3.6), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    ts = [p.t for p in timeline.points]
    steps = [p.steps for p in timeline.points]
    axes.plot(ts, steps, linestyle="--", color="#4e79a7", linewidth=1.2, label="interpolated")
    axes.plot(ts, steps, linestyle="none", marker="o", color="#4e79a7", label="ledger record")
    for row, stall in enumerate(timeline.stalls):
        color = _RECOVERED if stall.recovered else _UNRECOVERED
        axes.axvspan(stall.start, max(stall.end, stall.start), color=color, alpha=0.25, lw=0)
        axes.axvline(stall.start, color=color, linewidth=1.5)
        names = ",".join(f"F{n + 1}" for n in stall.failures)
        axes.annotate(
            names,
            (stall.start, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12 - 11 * (row % 3)),  # staggered: close failures stay legible
            textcoords="offset points",
            color=color,
            fontsize=9,
        )
    handles, _ = axes.get_legend_handles_labels()
    for recovered, color, label in ((True, _RECOVERED, "recovery (stalled)"),
                                    (False, _UNRECOVERED, "not recovered")):  # fmt: skip
        if any(s.recovered is recovered for s in timeline.stalls):
            handles.append(Patch(color=color, alpha=0.25, label=label))
    axes.set_xlim(0, max(timeline.wall_seconds, max(ts, default=0.0), 1e-3))
    axes.set_ylim(bottom=0)
    axes.set_xlabel("wall-clock seconds since job start")
    axes.set_ylabel("committed steps")
    axes.grid(alpha=0.3)
    axes.legend(handles=handles, loc="upper left", fontsize=8)
    return _data_uri(figure)


def recovery_bars(
    labels: Sequence[str], phases: Sequence[dict[str, float]], names: Sequence[str]
) -> str:
    """One horizontal bar per recovered failure, stacked by recovery phase (seconds).

    ``phases[i][name]`` is the seconds failure ``labels[i]`` spent in phase ``name``; a
    negative span (two processes' clocks disagreeing by a few milliseconds) is drawn as 0.
    """
    figure = Figure(figsize=(9, 1.5 + 0.4 * len(labels)), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    left = [0.0] * len(labels)
    for name, color in zip(names, PHASE_COLORS, strict=False):
        widths = [max(0.0, p.get(name, 0.0)) for p in phases]
        axes.barh(labels, widths, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.invert_yaxis()
    axes.set_xlabel("seconds from detection to the first step after recovery")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    return _data_uri(figure)
