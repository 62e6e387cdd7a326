"""Every picture the tool draws (matplotlib, imported lazily; torch-free).

Each picture has a builder that returns the matplotlib ``Figure``
(``*_figure``: what tests and notebooks inspect) and a writer that saves it
through :mod:`hne_edge.fileio` (``plot_*``). Figures are made with
``matplotlib.figure.Figure``, not pyplot: no global state, no backend switch
in the caller's process, nothing left open.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from .fileio import atomic_write_bytes, seal_png
from .tree import TreeSpec

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "can_draw",
    "save_figure",
    "tree_figure",
    "plot_tree",
    "budget_sweep_figure",
    "plot_budget_sweep",
    "metrics_figures",
    "plot_metrics",
    "bench_figure",
    "plot_bench",
    "METRICS_FIGURES",
]

# the figures plot_metrics draws (what `hne-edge eval` writes beside metrics.json)
METRICS_FIGURES = ("accuracy_vs_macs.png", "diversity_vs_macs.png", "leaf_accuracy.png")


def _figure(figsize: tuple[float, float], dpi: float = 110, nrows: int = 1, **subplots: Any):
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=figsize, dpi=dpi)
    return fig, fig.subplots(nrows, 1, **subplots)


def _accuracy_limits(percents: Sequence[float], min_span: float = 20.0) -> tuple[float, float]:
    """Y limits for accuracies in percent: inside [0, 100], and at least ``min_span`` points tall.

    Autoscaling stretches 0.4 points of run-to-run noise over the whole axis;
    a floor on the span keeps a flat curve flat.
    """
    lo, hi = min(percents), max(percents)
    span = max(hi - lo, min_span)
    mid, half = (lo + hi) / 2, 0.54 * span  # 4% padding on each side
    bottom, top = mid - half, mid + half
    if top > 100:
        bottom, top = bottom - (top - 100), 100.0
    if bottom < 0:
        bottom, top = 0.0, min(100.0, top - bottom)
    return bottom, top


# mantissas of round tick values, coarsest first: a log axis takes the coarsest that labels at least 3 ticks
_ROUND_MANTISSAS = ((1,), (1, 2, 5), (1, 2, 3, 5), (1, 1.5, 2, 3, 4, 5, 6, 8))
LOSS_LABELS = {  # the paper's names of the objectives (independent reads like a kind of tree)
    "independent": "$L^{I}$", "structured": "$L^{S}$", "distill": "$L^{I} + L^{D}$", "hierarchical": "$L^{I} + L^{HD}$",
}  # fmt: skip


def _tick_text(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.3g}"


def _label_log_x(ax, xs: Sequence[float], pad: float = 0.06, axis: str = "x") -> None:
    """Log x axis labelled at round values only (1, 2, 5 x 10^k, denser when the data spans little), every tick
    labelled; the axis runs ``pad`` of the data's span (in decades) beyond each end.

    matplotlib's log locator labels decades only, so a curve spanning less than a decade (0.13 .. 0.67 MMACs)
    had no label at all; labelling the data's ends instead gave odd numbers (0.97, 3.1). The points carry their
    ensemble size n (:func:`_label_points`), so the ends need no tick of their own.
    """
    from matplotlib.ticker import NullLocator  # noqa: PLC0415

    lo, hi = min(xs), max(xs)
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    span = math.log10(hi / lo) if hi > lo else 0.3
    left, right = lo / 10 ** (pad * span), hi * 10 ** (pad * span)
    ticks: list[float] = []
    for mantissas in _ROUND_MANTISSAS:
        ticks = [m * 10.0**k for k in range(math.floor(math.log10(left)) - 1, math.ceil(math.log10(right)) + 1)
                 for m in mantissas if left <= m * 10.0**k <= right]  # fmt: skip
        if len(ticks) >= 3:
            break
    if axis == "x":
        ax.set_xlim(left, right)
        ax.set_xticks(ticks, [_tick_text(v) for v in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    else:  # the same round ticks up the side (latencies: a p95 100x the median squashed it flat on a linear axis)
        ax.set_ylim(left, right)
        ax.set_yticks(ticks, [_tick_text(v) for v in ticks])
        ax.yaxis.set_minor_locator(NullLocator())


def _title_and_layout(ax, text: str, fontsize: float) -> None:
    """Title ``ax`` with ``text`` and lay the figure out (``tight_layout``), the title wrapped at spaces onto as few
    lines as it takes to lie inside the figure, of even lengths: it is centred over the axes, and tight_layout makes
    room above for its lines but never narrows it (issue 42: accuracy_vs_macs.png's title ran 66..618 px across a
    600 px figure and was cut off). A ``$...$`` formula (a loss's name) stays on one line."""
    fig = ax.figure
    words = re.findall(r"(?:\$[^$]*\$|[^\s$])+", text)
    lines = [text]
    for k in range(2, len(words) + 2):
        ax.set_title("\n".join(lines), fontsize=fontsize)
        fig.tight_layout()
        box, frame = ax.title.get_window_extent(), fig.bbox
        centre = (box.x0 + box.x1) / 2
        if box.width <= 2 * min(centre - frame.x0, frame.x1 - centre) - 4 or k > len(words):  # 2 px each side
            return
        lines = next(filled for chars in range(max(map(len, words)), len(text) + 1)  # k lines, the longest shortest
                     if len(filled := _fill(words, chars)) <= k)


def _fill(words: Sequence[str], chars: int) -> list[str]:
    """``words`` on lines of at most ``chars`` characters (a longer word alone on its line), each line as full as it
    goes."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def can_draw() -> bool:
    """Whether matplotlib can be imported here: a runtime-only install (a device) has none, and a command then writes
    no figure (nor judges a file of its figure's name)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ImportError:  # a finder that refuses it (the tests' runtime-only installs)
        return False


def save_figure(fig, path: str | os.PathLike, check: Callable[[str | os.PathLike], None] | None = None) -> Path:
    """Write ``fig`` to ``path`` as a PNG sealed as ours (:func:`~hne_edge.fileio.seal_png`: the next command that
    draws it may replace it; a figure the user edited since, it may not). ``check(path)``, run once the figure is
    rendered, just before it is written, raises to leave what is at ``path`` (a file the user saved meanwhile)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    data = seal_png(buffer.getvalue())
    if check is not None:
        check(path)
    return atomic_write_bytes(path, data)


# -- the tree ------------------------------------------------------------------------------------------------------


def tree_figure(tree: TreeSpec, node_macs: Mapping[str, int] | None = None, title: str | None = None) -> Figure:
    """The tree: blocks left to right, leaves numbered in depth-first (anytime) order.

    The first leaf's path is highlighted: it is what a one-leaf anytime answer costs.
    """
    n = tree.num_leaves
    y = {}
    for node in tree.nodes:  # a node sits at the middle of the leaves below it
        y[node.id] = -(node.leaves[0] + node.leaves[-1]) / 2
    first = set(tree.path(0))
    fig, ax = _figure((2.0 + 1.6 * tree.num_blocks, 1.6 + 0.32 * n))
    ax.plot([-0.8], [-(n - 1) / 2], marker="s", color="0.3", markersize=10)
    ax.annotate("image", (-0.8, -(n - 1) / 2), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8)
    for node in tree.nodes:
        px, py = (node.depth - 1, y[node.parent]) if node.parent else (-0.8, -(n - 1) / 2)
        on_first = node.id in first
        ax.plot([px, node.depth], [py, y[node.id]], color="tab:red" if on_first else "0.6", lw=2 if on_first else 1, zorder=1)
    labels: list[tuple[str, Any]] = []
    for node in tree.nodes:
        on_first = node.id in first
        ax.scatter([node.depth], [y[node.id]], s=60, color="tab:red" if on_first else "tab:blue", zorder=2)
        label = node.id
        if node_macs is not None:
            label += f"\n{node_macs[node.id] / 1e6:.3g} M MACs"
        if node.is_leaf:
            ax.annotate(f"leaf {node.leaves[0]}", (node.depth, y[node.id]), textcoords="offset points",
                        xytext=(8, -3), fontsize=7)
        elif len(node.leaves) >= n / 2 or tree.num_blocks <= 3:
            labels.append((label, node))
    def block_label(d: int) -> str:  # every block's cost, where the node labels would crowd (blocks >= 2)
        label = f"block {d}\n{tree.width(d)} node{'s' if tree.width(d) > 1 else ''}"
        if node_macs is not None:
            per_node = sorted({node_macs[n.id] for n in tree.nodes if n.depth == d})
            label += "\n" + "/".join(f"{m / 1e6:.3g}" for m in per_node) + (" M MACs each" if tree.width(d) > 1 else " M MACs")
        return label

    ax.set_xticks(range(tree.num_blocks), [block_label(d) for d in range(tree.num_blocks)], fontsize=8)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(-1.2, tree.num_blocks - 0.2)
    ax.set_ylim(-(n - 1) - 0.9, 0.9)  # room above and below the outer nodes for their labels
    _title_and_layout(ax, title or f"HNE tree, branching {tree.branching}: {n} networks; red = leaf 0's path", 9)
    edges = [ax.transData.transform(line.get_xydata()) for line in ax.get_lines()]
    for label, node in labels:  # after the layout: placed where no edge crosses them (issue 28: centred above, they did)
        _place_clear(ax, label, (node.depth, y[node.id]), edges)
    return fig


# where a tree node's label may go: (offset in points, ha, va), the first that no edge crosses wins
_NODE_LABEL_PLACES = ((-7, 7, "right", "bottom"), (-7, -7, "right", "top"), (0, 9, "center", "bottom"),
                      (0, -9, "center", "top"), (7, 7, "left", "bottom"), (7, -7, "left", "top"), (-9, 0, "right", "center"))


def _place_clear(ax, text: str, xy: tuple[float, float], polylines: Sequence[Any]) -> None:
    """Annotate ``text`` at ``xy`` in the first of :data:`_NODE_LABEL_PLACES` that no polyline (display points)
    crosses and that stays inside the axes; where none is clear, the first, over a white box."""
    frame = ax.get_window_extent()
    for dx, dy, ha, va in _NODE_LABEL_PLACES:
        note = ax.annotate(text, xy, textcoords="offset points", xytext=(dx, dy), ha=ha, va=va, fontsize=7)
        box = note.get_window_extent().padded(2)
        inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        if inside and not any(_crosses_box(box, line) for line in polylines):
            return
        note.remove()
    dx, dy, ha, va = _NODE_LABEL_PLACES[0]  # a crowded fan (4 children): over the edges, which its box hides
    ax.annotate(text, xy, textcoords="offset points", xytext=(dx, dy), ha=ha, va=va, fontsize=7, zorder=3,
                bbox={"fc": "white", "ec": "none", "alpha": 1.0, "pad": 0.5})


def _crosses_box(box: Any, points: Any, samples: int = 64) -> bool:
    """Whether the polyline through ``points`` (display coordinates) passes through ``box``."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        for t in np.linspace(0.0, 1.0, samples):
            if box.contains(x0 + t * (x1 - x0), y0 + t * (y1 - y0)):
                return True
    return False


def plot_tree(
    tree: TreeSpec,
    path: str | os.PathLike,
    node_macs: Mapping[str, int] | None = None,
    title: str | None = None,
    check: Callable[[str | os.PathLike], None] | None = None,
) -> Path:
    """Write :func:`tree_figure` to ``path`` (PNG); ``check``: as :func:`save_figure`'s (a command's check of ``path``
    again, just before the figure is written)."""
    return save_figure(tree_figure(tree, node_macs, title), path, check)


# -- the demo's budget sweep ---------------------------------------------------------------------------------------


def budget_sweep_figure(rows: Sequence[Mapping[str, Any]], num_leaves: int | None = None) -> Figure:
    """Accuracy (top) and mean leaves (bottom) against the per-frame budget.

    ``rows`` are :func:`hne_edge.demo.budget_sweep`'s (``budget_ms``,
    ``accuracy`` 0..1, ``mean_leaves``); a row with ``budget_ms`` None (no
    budget) is drawn as a dashed reference line in both panels. The leaves axis
    runs from 0 to ``num_leaves`` (default: the most any row evaluated).
    """
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    if not rows:
        raise ValueError("budget sweep: received no rows; expected at least one {budget_ms, accuracy, mean_leaves}")
    timed = [r for r in rows if r["budget_ms"] is not None]
    free = [r for r in rows if r["budget_ms"] is None]
    fig, (acc, leaves) = _figure((5.5, 5.0), nrows=2, sharex=True)
    x = [r["budget_ms"] for r in timed]
    acc.plot(x, [100 * r["accuracy"] for r in timed], "o-", color="tab:blue", label="accuracy", clip_on=False)
    leaves.plot(x, [r["mean_leaves"] for r in timed], "s-", color="tab:orange", label="mean leaves")
    for r in free[:1]:
        acc.axhline(100 * r["accuracy"], ls="--", color="0.4", lw=1, label=f"no budget: {r['accuracy']:.1%}")
        leaves.axhline(r["mean_leaves"], ls="--", color="0.4", lw=1, label=f"no budget: {r['mean_leaves']:.3g} leaves")
    acc.set_ylim(*_accuracy_limits([100 * r["accuracy"] for r in rows]))
    acc.set_ylabel("accuracy (%)")
    top = num_leaves or math.ceil(max(r["mean_leaves"] for r in rows))
    leaves.set_ylim(0, top * 1.06)
    leaves.yaxis.set_major_locator(MaxNLocator(integer=True))
    leaves.set_ylabel("mean leaves evaluated")
    leaves.set_xlabel("per-frame budget (ms)")
    for ax in (acc, leaves):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    _title_and_layout(acc, "Anytime inference under a per-frame budget", 10)
    return fig


def plot_budget_sweep(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, num_leaves: int | None = None
) -> Path:
    """Write :func:`budget_sweep_figure` to ``path`` (PNG)."""
    return save_figure(budget_sweep_figure(rows, num_leaves), path)


# -- evaluation (metrics.json) -------------------------------------------------------------------------------------


def metrics_figures(
    metrics: Mapping[str, Any] | Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None
) -> dict[str, Figure]:
    """``{file name: Figure}``: accuracy vs MACs, logit std vs MACs, per-leaf accuracy bars (paper style).

    ``metrics`` may be a list (one per run, e.g. one per loss) to draw the runs side by side.
    """
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    runs = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    labels = labels or [LOSS_LABELS.get(r.get("loss"), r.get("loss")) or r.get("model", "model") for r in runs]
    figures = {}
    first = runs[0]
    images = f", {first['num_images']} images" if first.get("num_images") else ""
    about = f"{first.get('model', '')} on {first.get('dataset') or first.get('data', '')} ({first.get('split', '')}{images})"
    legend_title = "loss" if all(r.get("loss") in LOSS_LABELS for r in runs) and labels == [
        LOSS_LABELS[r["loss"]] for r in runs] else None  # fmt: skip

    def curve(key: str, ylabel: str, name: str, scale: float = 1.0) -> None:
        fig, ax = _figure((5, 3.6), dpi=120)
        xs, ys, first_xy = [], [], None
        for run, label in zip(runs, labels):
            rows = run["anytime"]
            x = [r["macs"] / 1e6 if "macs" in r else r["n"] for r in rows]
            y = [r[key] * scale for r in rows]
            # accuracy: one binomial standard error of each point, sqrt(p (1 - p) / images)
            err = ([scale * math.sqrt(r[key] * (1 - r[key]) / run["num_images"]) for r in rows]
                   if key == "accuracy" and run.get("num_images") else None)  # fmt: skip
            ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2 if err else 0, elinewidth=0.8, label=label,
                        clip_on=False)  # fmt: skip
            xs += x
            ys += y + ([v + e for v, e in zip(y, err)] + [v - e for v, e in zip(y, err)] if err else [])
            first_xy = first_xy or (x, y, [r["n"] for r in rows], err)
        _label_log_x(ax, xs)
        if key == "accuracy":
            ax.set_ylim(*_accuracy_limits(ys))
        title = about + ("; bars: ± one standard error" if key == "accuracy" and first.get("num_images") else "")
        ax.set_xlabel("MMACs (first n leaves, shared nodes once)" if "macs" in runs[0]["anytime"][0] else "n (leaves)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, title=legend_title, title_fontsize=8)
        _title_and_layout(ax, title, 8)
        x, y, ns, err = first_xy  # every run has the same n at the same MACs: one run's points carry them
        _label_points(ax, x, y, [f"n={n}" if k == 0 else str(n) for k, n in enumerate(ns)], err)
        figures[name] = fig

    curve("accuracy", "accuracy (%)", METRICS_FIGURES[0], 100.0)
    curve("diversity", "logit std across members", METRICS_FIGURES[1])
    fig, ax = _figure((6, 3.4), dpi=120)
    width = 0.8 / len(runs)
    for k, (run, label) in enumerate(zip(runs, labels)):
        leaves = run["leaves"]
        ax.bar([r["leaf"] + (k - (len(runs) - 1) / 2) * width for r in leaves], [100 * r["accuracy"] for r in leaves],
               width=width, label=label)
    ax.set_xlabel("leaf (depth-first order)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(*_accuracy_limits([100 * r["accuracy"] for run in runs for r in run["leaves"]]))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(runs) == 1:  # the bars fill the plotting area: name the run in the title, or the runs beside it
        title = f"each leaf alone: {about}, loss {labels[0]}" if legend_title else f"each leaf alone: {about}, {labels[0]}"
    else:
        title = f"each leaf alone: {about}"
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, title=legend_title,
                  title_fontsize=8)  # fmt: skip
    _title_and_layout(ax, title, 9)
    figures[METRICS_FIGURES[2]] = fig
    return figures


def plot_metrics(metrics: Mapping[str, Any] | Sequence[Mapping[str, Any]], out_dir: str | os.PathLike,
                 labels: Sequence[str] | None = None) -> list[Path]:
    """Write :func:`metrics_figures` into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    return [save_figure(fig, out / name) for name, fig in metrics_figures(metrics, labels).items()]


# -- hne-edge bench ------------------------------------------------------------------------------------------------


def bench_figure(result: Mapping[str, Any]) -> Figure:
    """Latency of every anytime level, or accuracy against latency when the levels carry accuracy (``bench.json``)."""
    levels = result["levels"]
    fig, ax = _figure((5, 3.5), dpi=120)
    lat = [lv["median_ms"] for lv in levels]
    if "accuracy" in levels[0]:
        acc = [100 * lv["accuracy"] for lv in levels]
        ax.plot(lat, acc, "o-", clip_on=False)
        ax.set_ylim(*_accuracy_limits(acc))
        _label_log_x(ax, [v for v in lat if v > 0] or [1.0])  # one stalled level must not squash the others
        ax.set_xlabel("median latency (ms, log scale)")
        ax.set_ylabel("top-1 accuracy (%)")
    else:
        ns = [lv["n"] for lv in levels]
        p95 = [lv["p95_ms"] for lv in levels]
        ax.plot(ns, lat, "o-", label="median")
        ax.plot(ns, p95, "--", label="p95")
        _label_log_x(ax, [v for v in lat + p95 if v > 0] or [1.0], axis="y")  # a busy machine's p95 is 100x the median
        ax.set_xlabel("leaves evaluated (n)")
        ax.set_ylabel("latency (ms, log scale)")
        ax.legend()
    ax.grid(alpha=0.3)
    _title_and_layout(ax, f"{result['model']} {result['backend']}/{result['device']} batch {result['batch_size']}", 9)
    if "accuracy" in levels[0]:  # after the layout: the labels are placed in the final axes
        _label_points(ax, lat, [100 * lv["accuracy"] for lv in levels],
                      [f"n={lv['n']}" if k == 0 else str(lv["n"]) for k, lv in enumerate(levels)])
    return fig


def _label_points(ax, xs: Sequence[float], ys: Sequence[float], texts: Sequence[str],
                  errs: Sequence[float] | None = None, fontsize: float = 7) -> None:
    """Write ``texts[i]`` beside point i where it covers no point, no error bar and no other label, trying
    below, above, right and left of it in turn; a label with no free place is left out.

    Positions are computed in display space through the axes' transform (a log axis included: a linear estimate
    put labels of a log-MACs plot on top of the next points' error bars, issue 28). Latencies measured on a busy
    machine bunch up, and overlapping numbers read as none; the first and the last point are labelled first.
    """
    fig = ax.figure
    to_px = fig.dpi / 72  # points -> pixels
    pts = ax.transData.transform(list(zip(xs, ys)))
    if errs is not None:
        lows = ax.transData.transform([(x, y - e) for x, y, e in zip(xs, ys, errs)])[:, 1]
        highs = ax.transData.transform([(x, y + e) for x, y, e in zip(xs, ys, errs)])[:, 1]
    else:
        lows, highs = pts[:, 1], pts[:, 1]
    frame = ax.get_window_extent()  # inside the plotting area: not over the title, the ticks or off the figure
    marker, gap = 3.5 * to_px, 2.5 * to_px
    obstacles = [(px - marker, min(lo, py - marker), px + marker, max(hi, py + marker))
                 for (px, py), lo, hi in zip(pts, lows, highs)]  # fmt: skip
    placed: dict[int, tuple[tuple[float, float, float, float], tuple[float, float], str, str]] = {}

    def free(box: tuple[float, float, float, float], own: int) -> bool:
        x0, y0, x1, y1 = box
        if x0 < frame.x0 or x1 > frame.x1 or y0 < frame.y0 or y1 > frame.y1:
            return False
        others = [o for k, o in enumerate(obstacles) if k != own] + [p[0] for p in placed.values()]
        return all(x1 < o[0] or o[2] < x0 or y1 < o[1] or o[3] < y0 for o in others)

    for i in dict.fromkeys([0, len(xs) - 1, *range(len(xs))]):
        (px, py), lo, hi = pts[i], min(lows[i], pts[i][1] - marker), max(highs[i], pts[i][1] + marker)
        w, h = 0.6 * fontsize * len(texts[i]) * to_px + 2, 1.25 * fontsize * to_px  # the text's box, generously
        below, above = (lo - py) / to_px - 2.5, (hi - py) / to_px + 2.5  # offsets in points past the bar's ends
        side = 3.5 + 2.5
        candidates = [  # (box, offset in points from the point, ha, va); below and above first: off the curve
            ((px - w / 2, lo - gap - h, px + w / 2, lo - gap), (0, below), "center", "top"),
            ((px - w / 2, hi + gap, px + w / 2, hi + gap + h), (0, above), "center", "bottom"),
            ((px + marker + gap, py - h / 2, px + marker + gap + w, py + h / 2), (side, 0), "left", "center"),
            ((px - marker - gap - w, py - h / 2, px - marker - gap, py + h / 2), (-side, 0), "right", "center"),
            ((px, lo - gap - h, px + w, lo - gap), (0, below), "left", "top"),  # below, leaning right or left
            ((px - w, lo - gap - h, px, lo - gap), (0, below), "right", "top"),
            ((px, hi + gap, px + w, hi + gap + h), (0, above), "left", "bottom"),
            ((px - w, hi + gap, px, hi + gap + h), (0, above), "right", "bottom"),
        ]
        for box, offset, ha, va in candidates:
            if free(box, i):
                placed[i] = (box, offset, ha, va)
                break
    for i in sorted(placed):
        _, offset, ha, va = placed[i]
        ax.annotate(texts[i], (xs[i], ys[i]), textcoords="offset points", xytext=offset, ha=ha, va=va, fontsize=fontsize)


def plot_bench(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write :func:`bench_figure` to ``path`` (PNG)."""
    return save_figure(bench_figure(result), path)
