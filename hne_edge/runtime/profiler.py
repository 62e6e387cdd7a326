"""Cost profiling: every leaf step and every unit timed through the session's ``on_unit`` hook.

The leaves run in the one loop (:meth:`AnytimeSession.advance`), so a
profile measures exactly what a frame runs. Leaf steps are host wall time
up to the logits on the host (``to_host`` blocks), which is what a deadline
sees. Units are timed by ``backend.timed_run`` when the backend has one (GPU
backends: CUDA events on their stream), else by the clock around the unit
and ``backend.synchronize()``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..bundle import InputSpec
from ..progress import NULL_PROGRESS, Progress
from .cost_model import summarize
from .program import Call
from .session import AnytimeSession, UnitHook

__all__ = ["unit_timer", "measure"]


def unit_timer(backend: Any, samples: dict[str, list[float]] | None) -> UnitHook:
    """An ``on_unit`` hook that runs each call synchronized and appends its time to ``samples[call.name]``.

    ``samples=None``: synchronized but not recorded (warm-up repetitions).
    """
    clock, sync = backend.clock, backend.synchronize
    timed = getattr(backend, "timed_run", None) if samples is not None else None
    if timed is not None:

        def hook(call: Call, inputs: tuple[Any, ...]) -> Sequence[Any]:
            outs, dt = timed(call.run, inputs)
            samples[call.name].append(dt)
            return outs

        return hook

    def hook(call: Call, inputs: tuple[Any, ...]) -> Sequence[Any]:
        t0 = clock()
        outs = call.run(inputs)
        sync()
        if samples is not None:
            samples[call.name].append(clock() - t0)
        return outs

    return hook


def measure(
    open_session: Callable[[np.ndarray], AnytimeSession],
    backend: Any,
    spec: InputSpec,
    unit_names: Sequence[str],
    sizes: Sequence[int],
    warmup: int,
    repeats: int,
    seed: int,
    progress: Progress | None = None,
) -> dict[int, dict[str, Any]]:
    """``Profile.batches``: per batch size, leaf / unit / level statistics of ``repeats`` full passes.

    ``open_session(x)``: a session over ``x`` that does not feed the cost model (the caller holds the lock).
    ``progress`` counts the passes (warm-up ones included).
    """
    progress = progress or NULL_PROGRESS
    progress.restart(len(sizes) * (warmup + repeats), "profile", "pass")
    rng = np.random.default_rng(seed)
    clock = backend.clock
    batches: dict[int, dict[str, Any]] = {}
    for b in sizes:
        x = rng.standard_normal((b, spec.channels, *spec.spatial)).astype(spec.dtype)
        leaf_t: list[list[float]] = []
        unit_t: dict[str, list[float]] = {name: [] for name in unit_names}
        for rep in range(warmup + repeats):
            session = open_session(x)
            n = session.num_leaves
            session.advance(clock(), None, None, n, n, on_unit=unit_timer(backend, unit_t if rep >= warmup else None))
            if rep >= warmup:
                leaf_t.append(list(session.leaf_seconds))
            progress.update(note=f"batch {b}{', warm-up' if rep < warmup else ''}")
        per_leaf = [list(t) for t in zip(*leaf_t)]  # (N, repeats)
        levels = np.cumsum(np.asarray(per_leaf), axis=0)
        batches[b] = {
            "warmup": warmup,
            "repeats": repeats,
            "leaves": [
                {"leaf": i, **summarize(t), "samples_ms": [round(v * 1e3, 5) for v in t]} for i, t in enumerate(per_leaf)
            ],
            "units": {name: summarize(t) for name, t in unit_t.items()},
            "levels": [{"n": n + 1, **summarize(levels[n])} for n in range(len(per_leaf))],
        }
    return batches
