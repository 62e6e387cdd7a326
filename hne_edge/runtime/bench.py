"""Measurements over the anytime levels n = 1..N (used by ``hne-edge bench``; numpy only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..progress import NULL_PROGRESS, Progress
from .profile_file import summarize
from .inputs import check_labels
from .runner import AnytimeRunner

__all__ = ["level_latencies", "level_accuracy", "load_arrays", "frame_oracles"]


def level_latencies(runner: AnytimeRunner, batch: int = 1, warmup: int = 5, repeats: int = 30, seed: int = 0,
                    progress: Progress | None = None) -> list[dict]:
    """Wall time of ``runner.run(x, max_leaves=n)`` for every stop n of its plan: median, p90, p95, p99 and mean
    (ms), and the throughput that mean gives (``samples_per_s``: batch / mean, what trtexec and Polygraphy call
    throughput).

    Levels are interleaved within each repetition so load changes hit every level alike. ``progress`` counts
    the repetitions (warm-up ones included).
    """
    progress = progress or NULL_PROGRESS
    progress.restart(warmup + repeats, "bench", "repetition")
    spec = runner.input_spec
    x = np.random.default_rng(seed).standard_normal((batch, spec.channels, *spec.spatial)).astype(spec.dtype)
    clock = runner.backend.clock
    stops = runner.stops
    times: list[list[float]] = [[] for _ in stops]
    for rep in range(warmup + repeats):
        for k, n in enumerate(stops):
            t0 = clock()
            runner.run(x, max_leaves=n)
            t = clock() - t0
            if rep >= warmup:
                times[k].append(t)
        progress.update(note="warm-up" if rep < warmup else "")
    macs = runner.manifest.prefix_macs()
    return [{"n": n, "macs": macs[n - 1], **_stats(t, batch)} for n, t in zip(stops, times)]


def _stats(seconds: list[float], batch: int) -> dict[str, float]:
    """:func:`~.profile_file.summarize`'s median / p90 / p95 / mean (ms), with p99 and the throughput (samples/s)."""
    stats = summarize(seconds)
    stats["p99_ms"] = float(np.quantile(np.asarray(seconds, dtype=np.float64) * 1e3, 0.99))
    stats["samples_per_s"] = batch * 1e3 / stats["mean_ms"] if stats["mean_ms"] > 0 else float("inf")
    return stats


def frame_oracles(runner: AnytimeRunner, x: np.ndarray, result: Any, budget_ms: float) -> dict[str, int]:
    """The oracles of the frame a budgeted ``runner.run(x)`` just ran as ``result``, in leaves (the deadline
    benchmarks' comparison; the rule itself is ``program.best_leaves``):

    * ``oracle``: the plan-achievable oracle, the best sequence of the plan's own steps that fits;
    * ``leaf_by_leaf``: the same restricted to the plan's leaf-by-leaf walk (a mixed plan's base);
    * ``split_bound``: the even-split upper bound (a step's time spread over its leaves, stopping anywhere).

    Every step's true time in this frame: the steps ``result`` took, their own; the others from
    ``runner.time_steps(x)`` right after (each route once, unbudgeted, unseen by the cost model). The oracles pay
    what the run paid outside its steps (input check, upload), so all count from the same call entry."""
    from .program import best_leaves

    seconds = runner.time_steps(x)
    by_range = {tuple(s["leaves"]): j for j, s in enumerate(runner.steps)}
    ran = 0.0
    for lo, hi, ms in result.step_ms:
        seconds[by_range[(lo, hi)]] = ms / 1e3
        ran += ms
    budget_s = (budget_ms - max(0.0, result.elapsed_ms - ran)) / 1e3
    program = runner._program
    return {"oracle": best_leaves(program, seconds, budget_s), "split_bound": best_leaves(program, seconds, budget_s, split=True),
            "leaf_by_leaf": best_leaves(program.routes()[0], seconds, budget_s)}  # fmt: skip


def level_accuracy(runner: AnytimeRunner, x: np.ndarray, y: np.ndarray, batch_size: int | None = None,
                   progress: Progress | None = None) -> list[float]:
    """Top-1 accuracy of the first-n-leaves ensemble for every n, over (x, y); ``progress`` counts the frames."""
    y = check_labels(y, len(x), runner.num_classes)
    progress = progress or NULL_PROGRESS
    progress.restart(len(x), "accuracy", "frame")
    batch_size = batch_size or runner.input_spec.batch[2]
    correct = np.zeros(runner.num_leaves, dtype=np.int64)
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        ll = runner.run(xb).leaf_logits  # (N, B, C)
        means = np.cumsum(ll, axis=0) / np.arange(1, runner.num_leaves + 1)[:, None, None]
        correct += (means.argmax(-1) == yb[None]).sum(axis=1)
        progress.update(len(yb))
    return (correct / len(x)).tolist()


def load_arrays(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(x, y or None) from a .npy (x) or .npz (``x`` and optional ``y``); x holds at least one image."""
    from ..errors import InputError

    try:
        data: Any = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:  # not numpy, truncated, pickled objects
        raise InputError(f"{path}: cannot read as a numpy .npy/.npz file ({type(exc).__name__}); expected x (and y)") from exc
    if isinstance(data, np.ndarray):
        x, y = data, None
    else:
        with data:
            if "x" not in data.files:
                raise InputError(f"{path}: received arrays {data.files}; expected 'x' (and optionally 'y')")
            x, y = data["x"], (data["y"] if "y" in data.files else None)
    if x.ndim < 2:  # a scalar or a vector is no image
        raise InputError(f"{path}: received x of shape {x.shape} ({x.ndim}-d); expected images: (N, C, H, W) float "
                         "or (N, H, W, C) uint8 (or one image without the N)")  # fmt: skip
    if x.size == 0:  # an empty frame file would run nothing and report nothing
        raise InputError(f"{path}: received x of shape {x.shape}, which holds no samples; expected at least one image")
    return x, y
