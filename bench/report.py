"""Benchmark rows and their report: a Markdown table, a JSON file and a PNG bar chart per measure.

Every script of bench/ can return :class:`Row` objects; ``bench/run.py`` collects them and calls
:func:`write`. A row is one thing measured (ours, the floor, or a peer) in one measure; its
ratio is taken against another row of the same measure, named by ``reference``. A row that could
not be measured has ``value=None`` and says why in ``note``. Goals are checked here, never
asserted: ``met`` is True, False, or None when there is nothing to judge.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KINDS = {"floor": "#8c8c8c", "ours": "#1f77b4", "peer": "#ff7f0e"}


@dataclass
class Measure:
    """One chart and one table section: a title, a unit and what it compares."""

    key: str
    title: str
    unit: str
    about: str = ""
    lower_is_better: bool = True
    log: bool = False


@dataclass
class Row:
    """One measured thing: ``what`` it is, whose (``kind``: floor, ours or peer) and its value."""

    measure: str
    what: str
    kind: str
    value: float | None
    stat: str = "p50"
    n: int | None = None
    reference: str | None = None
    goal_ratio: float | None = None
    goal_max: float | None = None
    goal_min: float | None = None
    goal: str = ""
    note: str = ""
    ratio: float | None = None
    met: bool | None = None
    chart: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def unavailable(measure: str, what: str, kind: str, why: str, **goals: Any) -> Row:
    """A row that could not be measured, saying why."""
    return Row(measure, what, kind, None, stat="", note=f"not available: {why}", **goals)


def judge(rows: list[Row]) -> list[Row]:
    """Fill in each row's ratio (against its reference row) and whether its goals are met."""
    by_key = {(row.measure, row.what): row for row in rows}
    for row in rows:
        ref = by_key.get((row.measure, row.reference)) if row.reference else None
        if row.value is not None and ref is not None and ref.value:
            row.ratio = row.value / ref.value
        checks = []
        if row.goal_ratio is not None:
            checks.append(None if row.ratio is None else row.ratio <= row.goal_ratio)
        if row.goal_max is not None:
            checks.append(None if row.value is None else row.value <= row.goal_max)
        if row.goal_min is not None:
            checks.append(None if row.value is None else row.value >= row.goal_min)
        if checks:
            row.met = None if None in checks else all(checks)
    return rows


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if float(value).is_integer() and abs(value) < 1e6:
        return f"{value:.0f}"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _met(row: Row) -> str:
    if not row.goal:
        return ""
    return {True: "met", False: "**missed**", None: "not judged"}[row.met]


def markdown(measures: list[Measure], rows: list[Row], header: str = "") -> str:
    """The report as Markdown: one section per measure with its rows."""
    lines = [header] if header else []
    for measure in measures:
        mine = [row for row in rows if row.measure == measure.key]
        if not mine:
            continue
        lines += ["", f"### {measure.title} ({measure.unit})", ""]
        if measure.about:
            lines += [measure.about, ""]
        lines += ["| what | whose | value | stat | ratio | goal | met? | note |", "|---|---|---:|---|---|---|---|---|"]
        for row in mine:
            ratio = f"{row.ratio:.2f}× {row.reference}" if row.ratio is not None else ""
            stat = f"{row.stat} of {row.n}" if row.n and row.stat else row.stat
            lines.append(
                f"| {row.what} | {row.kind} | {_number(row.value)} | {stat} | {ratio} | {row.goal} | {_met(row)} | {row.note} |"
            )
    return "\n".join(lines) + "\n"


def plot(measures: list[Measure], rows: list[Row], path: Path, title: str) -> None:
    """A horizontal bar chart per measure: ours beside the floor and the peers, goals dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [row for row in rows if row.chart]
    values_by_what = {(row.measure, row.what): row.value for row in rows}
    shown = [m for m in measures if any(row.measure == m.key for row in rows)]
    heights = [0.75 + 0.3 * sum(row.measure == m.key for row in rows) for m in shown]
    fig, axes = plt.subplots(len(shown), 1, figsize=(13, sum(heights) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, measure in zip(axes.flat, shown):
        mine = [row for row in rows if row.measure == measure.key]
        values = [row.value if row.value is not None else 0.0 for row in mine]
        top = max(values, default=0) or 1.0
        ys = range(len(mine))
        ax.barh(ys, values, color=[KINDS.get(row.kind, "#444") for row in mine], height=0.7)
        if measure.log:
            ax.set_xscale("log")
            ax.set_xlim(min((v for v in values if v > 0), default=1) / 2, top * 30)
        else:
            ax.set_xlim(0, top * 1.45)
        for y, row in zip(ys, mine):
            ref = values_by_what.get((row.measure, row.reference))
            limit = row.goal_ratio * ref if row.goal_ratio is not None and ref else row.goal_max
            if limit is not None:
                ax.plot([limit, limit], [y - 0.45, y + 0.45], color="#d62728", linestyle="--", linewidth=1.3)
            if row.value is None:
                ax.text(0.005, y, "not available (see the table)", va="center", fontsize=8, style="italic",
                        color="#555", transform=ax.get_yaxis_transform())
                continue
            label = _number(row.value)
            if row.ratio is not None:
                label += f"  ({row.ratio:.2f}× {row.reference})"
            x = row.value * 1.1 if measure.log else row.value + top * 0.01
            ax.text(x, y, label, va="center", fontsize=7.5)
        ax.set_yticks(list(ys), [row.what for row in mine], fontsize=8)
        ax.invert_yaxis()
        better = "lower is better" if measure.lower_is_better else "higher is better"
        ax.set_title(f"{measure.title} ({measure.unit}, {better})", fontsize=9.5, loc="left", fontweight="bold")
        ax.tick_params(axis="x", labelsize=7.5)
        ax.spines[["top", "right"]].set_visible(False)
    handles = [Patch(color=color, label=kind) for kind, color in KINDS.items()]
    handles.append(plt.Line2D([], [], color="#d62728", linestyle="--", label="goal"))
    fig.legend(handles=handles, loc="upper right", ncol=4, fontsize=9, frameon=False)
    fig.suptitle(title, x=0.01, y=0.998, ha="left", va="top", fontsize=11)
    fig.subplots_adjust(left=0.4, right=0.98, top=1 - 0.95 / (sum(heights) + 1.2), bottom=0.02, hspace=0.9)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def write(measures: list[Measure], rows: list[Row], out_dir: Path, meta: dict[str, Any], stem: str = "bench") -> dict[str, Path]:
    """Judge ``rows`` and write ``stem``.md, .json and .png into ``out_dir``; return their paths."""
    judge(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("md", "json", "png")}
    header = "\n".join(f"- {key}: {value}" for key, value in meta.items())
    paths["md"].write_text(markdown(measures, rows, header))
    document = {"meta": meta, "measures": [asdict(m) for m in measures], "rows": [asdict(row) for row in rows]}
    paths["json"].write_text(json.dumps(_clean(document), indent=1, ensure_ascii=False) + "\n")
    title = f"kernel-sandbox benchmark, {meta.get('date', '')}, {meta.get('mode', '')}"
    if "before" in meta:
        title += f"\nbefore: {meta['before']}; after: {meta.get('after', '?')}"
    plot(measures, rows, paths["png"], title)
    return paths


def load(path: Path) -> tuple[list[Measure], list[Row], dict[str, Any]]:
    """Read back a JSON report written by :func:`write`."""
    document = json.loads(path.read_text())
    return [Measure(**m) for m in document["measures"]], [Row(**r) for r in document["rows"]], document["meta"]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the Markdown table and the PNG again from a JSON report.")
    parser.add_argument("json", type=Path, help="a bench.json written by bench/run.py")
    parser.add_argument("--out", type=Path, help="directory (default: the JSON file's)")
    args = parser.parse_args()
    measures, rows, meta = load(args.json)
    for path in write(measures, rows, args.out or args.json.parent, meta, stem=args.json.stem).values():
        print(f"wrote {path}")
