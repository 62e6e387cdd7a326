"""Cost profiling: every step and every unit timed through the session's ``on_unit`` hook.

The steps run in the one loop (:meth:`AnytimeSession.advance`), so a
profile measures exactly what a frame runs. Steps are host wall time up to
the logits on the host (``to_host`` blocks), which is what a deadline sees.
A mixed program is run along each of its routes (:meth:`Program.routes`:
leaf by leaf, subtree by subtree, the whole tree), so every step it may
choose has samples. Units are timed by ``backend.timed_run`` when the
backend has one (GPU backends: CUDA events on their stream), else by the
clock around the unit and ``backend.synchronize()``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..bundle import InputSpec
from ..progress import NULL_PROGRESS, Progress
from .profile_file import summarize
from .program import Call, Program
from .session import AnytimeSession, UnitHook

__all__ = ["unit_timer", "measure", "step_seconds"]


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


def step_seconds(open_session: Callable[[Program], AnytimeSession], program: Program, clock: Callable[[], float]) -> list[float]:
    """Every step's wall time (seconds) on one frame: each route of ``program`` once, unbudgeted, through the
    one loop (no hook, so each step costs what a frame pays); a step on several routes is timed on the first.

    ``open_session(route)``: a session over the frame's uploaded image running ``route`` that does not feed
    the cost model. What an oracle knows of a frame (:func:`~.program.best_leaves`)."""
    seconds = [float("nan")] * len(program.steps)
    for route in program.routes():
        session = open_session(route)
        n = session.num_leaves
        session.advance(clock(), None, None, n, n)
        for j, _, _, t in session.steps_taken:
            if seconds[j] != seconds[j]:  # nan: not timed yet
                seconds[j] = t
    return seconds


def measure(
    open_session: Callable[[np.ndarray, Program], AnytimeSession],
    program: Program,
    backend: Any,
    spec: InputSpec,
    unit_names: Sequence[str],
    sizes: Sequence[int],
    warmup: int,
    repeats: int,
    seed: int,
    progress: Progress | None = None,
) -> dict[int, dict[str, Any]]:
    """``Profile.batches``: per batch size, step / unit / level statistics of ``repeats`` full passes per route.

    ``open_session(x, route)``: a session over ``x`` running ``route`` (one of ``program.routes()``) that
    does not feed the cost model (the caller holds the lock). The profile's ``leaves`` list has one entry
    per step of ``program`` (``leaf``: the step index, ``adds``: its leaves ``[first, end)``); ``levels``:
    the latency of the first ``n`` leaves at each stop of the base walk.
    ``progress`` counts the passes (every route's, warm-up ones included).
    """
    progress = progress or NULL_PROGRESS
    progress.restart(len(sizes) * len(program.routes()) * (warmup + repeats), "profile", "pass")
    rng = np.random.default_rng(seed)
    clock = backend.clock
    steps = program.steps
    batches: dict[int, dict[str, Any]] = {}
    for b in sizes:
        x = rng.standard_normal((b, spec.channels, *spec.spatial)).astype(spec.dtype)
        step_t: dict[int, list[float]] = {}
        unit_t: dict[str, list[float]] = {name: [] for name in unit_names}
        levels: list[list[float]] = []
        for k, route in enumerate(program.routes()):
            mine = [j for j in route.path if j not in step_t]  # a step on several routes: timed on the first
            for j in mine:
                step_t[j] = []
            for rep in range(warmup + repeats):
                session = open_session(x, route)
                n = session.num_leaves
                session.advance(clock(), None, None, n, n, on_unit=unit_timer(backend, unit_t if rep >= warmup else None))
                progress.update(note=f"batch {b}{', warm-up' if rep < warmup else ''}")
                if rep < warmup:
                    continue
                taken = session.steps_taken
                for j, _, _, t in taken:
                    if j in mine:
                        step_t[j].append(t)
                if k == 0:
                    levels.append(list(np.cumsum([t for *_, t in taken])))
        level_t = [list(t) for t in zip(*levels)]  # (stops of the base walk, repeats)
        stops = [steps[j].hi for j in program.routes()[0].path]
        batches[b] = {
            "warmup": warmup,
            "repeats": repeats,
            "leaves": [
                {"leaf": j, "adds": [steps[j].lo, steps[j].hi], **summarize(step_t[j]),
                 "samples_ms": [round(v * 1e3, 5) for v in step_t[j]]}
                for j in range(len(steps))
            ],  # fmt: skip
            "units": {name: summarize(t) for name, t in unit_t.items() if t},
            "levels": [{"n": n, **summarize(t)} for n, t in zip(stops, level_t)],
        }
    return batches
