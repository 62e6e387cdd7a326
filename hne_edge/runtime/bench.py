"""Measurements over the anytime levels n = 1..N (used by ``hne-edge bench``), and camera streams replayed in real
time through the stream scheduler and its two baselines (``hne-edge bench-streams``, benchmarks/bench_streams.py,
examples/multi_camera.py). numpy only."""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import zipfile
import zlib
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ..errors import InputError, ResourceExhausted
from ..limits import check_memory, check_replay, check_runners, format_bytes, open_regular_file
from ..progress import NULL_PROGRESS, Progress
from .profile_file import summarize
from .inputs import as_samples, check_labels, frames
from .runner import AnytimeRunner
from .session import check_count

__all__ = ["level_latencies", "level_accuracy", "load_arrays", "frame_oracles", "Arrival", "camera_arrivals",
           "stream_profile_sizes", "replay_streams", "summarize_streams", "STREAM_METHODS"]


MIN_SAMPLES, DURATION_S = 100, 3.0  # bench's defaults: a p99 of at least 100 samples, and trtexec's 3 s
MAX_SAMPLES = 10**6  # per level, whatever the duration asks


def level_latencies(runner: AnytimeRunner, batch: int = 1, warmup: int = 5, repeats: int | None = None, seed: int = 0,
                    progress: Progress | None = None, *, min_samples: int = MIN_SAMPLES,
                    duration_s: float = DURATION_S) -> list[dict]:  # fmt: skip
    """Wall time of ``runner.run(x, max_leaves=n)`` for every stop n of its plan: median, p90, p95, p99 and mean
    (ms), the throughput that mean gives (``samples_per_s``: batch / mean, what trtexec and Polygraphy call
    throughput) and how many ``samples`` each level's statistics are of.

    As trtexec's ``--iterations`` and ``--duration``: repetitions go on until there are at least ``min_samples``
    and their timed runs add up to at least ``duration_s`` seconds (a p99 of 30 samples is their second largest);
    ``repeats``: exactly that many instead. Levels are interleaved within each repetition so load changes hit
    every level alike. ``progress`` counts the repetitions (warm-up ones included); its total grows with the
    estimate of the repetitions the duration takes.
    """
    if repeats is not None:
        min_samples, duration_s = check_count(repeats, "repeats", 1, MAX_SAMPLES), 0.0
    check_count(min_samples, "min_samples", 1, MAX_SAMPLES)
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not 0 <= duration_s <= 86_400:
        raise InputError(f"duration_s: received {duration_s!r}; expected seconds in 0..86400")
    progress = progress or NULL_PROGRESS
    progress.restart(warmup + min_samples, "bench", "repetition")
    spec = runner.input_spec
    x = np.random.default_rng(seed).standard_normal((batch, spec.channels, *spec.spatial)).astype(spec.dtype)
    clock = runner.backend.clock
    stops = runner.stops
    times: list[list[float]] = [[] for _ in stops]
    rep, timed, done = 0, 0.0, False  # repetitions run; seconds of the timed ones
    while not done:
        for k, n in enumerate(stops):
            t0 = clock()
            runner.run(x, max_leaves=n)
            t = clock() - t0
            if rep >= warmup:
                times[k].append(t)
                timed += t
        rep += 1
        samples = len(times[0])
        # MAX_SAMPLES: enough for any quantile (a clock too coarse to count the runs would never reach the duration)
        done = samples >= min_samples and timed >= duration_s or samples >= MAX_SAMPLES
        if done:
            progress.total = rep  # the last line reads 100%
        elif samples and timed < duration_s:  # the total: what the rest of the duration takes at this pace
            progress.total = warmup + max(min_samples, samples + math.ceil((duration_s - timed) * samples / max(timed, 1e-9)))
        progress.update(note="warm-up" if rep <= warmup else "")
    macs = runner.manifest.prefix_macs()
    return [{"n": n, "macs": macs[n - 1], **_stats(t, batch)} for n, t in zip(stops, times)]


def _stats(seconds: list[float], batch: int) -> dict[str, float]:
    """:func:`~.profile_file.summarize`'s median / p90 / p95 / mean (ms), with p99 and the throughput (samples/s)."""
    stats = summarize(seconds)
    stats["p99_ms"] = float(np.quantile(np.asarray(seconds, dtype=np.float64) * 1e3, 0.99))
    stats["samples_per_s"] = batch * 1e3 / stats["mean_ms"] if stats["mean_ms"] > 0 else float("inf")
    stats["samples"] = len(seconds)
    return stats


def frame_oracles(runner: AnytimeRunner, x: np.ndarray, result: Any, budget_ms: float) -> dict[str, int]:
    """The oracles of the frame a budgeted ``runner.run(x)`` just ran as ``result``, in leaves (the deadline
    benchmarks' comparison; the rule itself is ``program.best_leaves``):

    * ``oracle``: the plan-achievable oracle, the best sequence of the plan's own steps that fits;
    * ``leaf_by_leaf``: the same restricted to the plan's leaf-by-leaf walk (a mixed plan's base);
    * ``split_bound``: the even-split upper bound (a step's time spread over its leaves, stopping anywhere).

    Every step's true time in this frame: the steps ``result`` took, their own (but for a frame that ended after leaf
    0, which may have run the first-leaf file); the others from ``runner.time_steps(x)`` right after (each route once, unbudgeted, unseen by the cost model). The oracles pay
    what the run paid outside its steps (input check, upload), so all count from the same call entry."""
    from .program import best_leaves

    seconds = runner.time_steps(x)
    by_range = {tuple(s["leaves"]): j for j, s in enumerate(runner.steps)}
    # a frame that ended after leaf 0 may have run the first-leaf file: not the time of leaf 0's step, which going on
    # needs (its exports), so that step keeps time_steps' time
    first_file = result.leaves == 1 and runner.first_leaf_file is not None
    ran = 0.0
    for lo, hi, ms in result.step_ms:
        if not (first_file and lo == 0):
            seconds[by_range[(lo, hi)]] = ms / 1e3
        ran += ms
    budget_s = (budget_ms - max(0.0, result.elapsed_ms - ran)) / 1e3
    program = runner._program
    return {"oracle": best_leaves(program, seconds, budget_s), "split_bound": best_leaves(program, seconds, budget_s, split=True),
            "leaf_by_leaf": best_leaves(program.routes()[0], seconds, budget_s)}  # fmt: skip


def level_accuracy(runner: AnytimeRunner, x: np.ndarray, y: np.ndarray, batch_size: int | None = None,
                   progress: Progress | None = None) -> list[float]:
    """Top-1 accuracy of the first-n-leaves ensemble for every n = 1..N (index n - 1), over (x, y); ``progress``
    counts the frames. ``x``: normalised float NCHW, or uint8 images (normalised a frame at a time). A last frame
    below the bundle's batch range is padded (:func:`~.inputs.frames`): every sample counts once."""
    spec = runner.input_spec
    x = as_samples(x, spec)
    y = check_labels(y, len(x), runner.num_classes)
    progress = progress or NULL_PROGRESS
    progress.restart(len(x), "accuracy", "frame")
    batch_size = batch_size or spec.batch[2]
    correct = np.zeros(runner.num_leaves, dtype=np.int64)
    for start, xb, count in frames(x, spec, batch_size, pad=True):
        yb = y[start : start + count]
        ll = runner.run(xb).leaf_logits[:, :count]  # (N, B, C), padding dropped
        means = np.cumsum(ll, axis=0) / np.arange(1, runner.num_leaves + 1)[:, None, None]
        correct += (means.argmax(-1) == yb[None]).sum(axis=1)
        progress.update(count)
    return (correct / len(x)).tolist()


def load_arrays(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(x, y or None) from a .npy (x) or .npz (``x`` and optional ``y``); x holds at least one image.

    Bounded before it is read: a regular file only, and the arrays its headers declare (an .npz's members'
    headers, read from the archive first) must be in the file and fit the memory available now
    (:func:`~hne_edge.limits.check_memory`): numpy allocates what a header says, so a 1 KB .npy declaring
    10**9 frames, or a 1.2 MB .npz inflating to 1.2 GB, was a MemoryError traceback."""
    with open_regular_file(path, "a numpy .npy/.npz file of x (and y)") as f:
        try:
            x, y = _read_npz(f, path) if zipfile.is_zipfile(f) else (_read_npy(f, path), None)
        except InputError:
            raise
        except (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error, NotImplementedError) as exc:  # not numpy, truncated, pickled objects
            raise InputError(f"{path}: cannot read as a numpy .npy/.npz file ({type(exc).__name__}); expected x (and y)") from exc
        except MemoryError:  # a limit the available memory does not show (ulimit -v)
            raise ResourceExhausted(f"{path}: the arrays it declares could not be allocated", hint=_SMALLER) from None
    if x.ndim < 2:  # a scalar or a vector is no image
        raise InputError(f"{path}: received x of shape {x.shape} ({x.ndim}-d); expected images: (N, C, H, W) float "
                         "or (N, H, W, C) uint8 (or one image without the N)")  # fmt: skip
    if x.size == 0:  # an empty frame file would run nothing and report nothing
        raise InputError(f"{path}: received x of shape {x.shape}, which holds no samples; expected at least one image")
    return x, y


_SMALLER = "split the frames into smaller files"


def _declared(stream: Any, size: int, where: str) -> tuple[str, int]:
    """What an .npy stream's header declares (``"float32 (N, C, H, W)"``) and its bytes, checked against the
    ``size`` bytes the stream has (header included): numpy allocates the declared size before reading."""
    fmt = np.lib.format
    version = fmt.read_magic(stream)
    if version not in ((1, 0), (2, 0)):  # 3.0: utf-8 field names of structured arrays, no image
        raise ValueError(f"npy format version {version}")
    shape, _, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(stream)
    need, held = math.prod(shape) * dtype.itemsize, size - stream.tell()  # Python ints: no overflow
    if need > held:
        raise InputError(f"{where}: its header declares {dtype} {shape} ({format_bytes(need)}); it holds "
                         f"{format_bytes(held)} of data; expected a complete .npy (truncated, or not written by numpy)")  # fmt: skip
    return f"{dtype} {shape}", need


def _read_npy(f: Any, path: str) -> np.ndarray:
    f.seek(0)  # zipfile.is_zipfile read its end
    what, need = _declared(f, os.fstat(f.fileno()).st_size, str(path))
    check_memory(need, f"{path} ({what})", hint=_SMALLER)
    f.seek(0)
    return np.lib.format.read_array(f, allow_pickle=False)


def _read_npz(f: Any, path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``x.npy`` and ``y.npy`` of an .npz, each header read first and checked against the size the archive gives
    the member (all that inflating it may produce), their sum against the memory available."""
    with zipfile.ZipFile(f) as archive:
        names = archive.namelist()
        if "x.npy" not in names:
            raise InputError(f"{path}: received arrays {[n.removesuffix('.npy') for n in names][:20]}; expected 'x' "
                             "(and optionally 'y')")  # fmt: skip
        members = [archive.getinfo(name) for name in ("x.npy", "y.npy") if name in names]
        declared = []
        for info in members:
            with archive.open(info) as member:
                declared.append((info.filename, *_declared(member, info.file_size, f"{path} member {info.filename}")))
        what = ", ".join(f"{name}: {shape}" for name, shape, _ in declared)
        check_memory(sum(need for *_, need in declared), f"{path} ({what})", hint=_SMALLER)
        arrays = []
        for info in members:
            with archive.open(info) as member:
                arrays.append(np.lib.format.read_array(member, allow_pickle=False))
    return arrays[0], (arrays[1] if len(arrays) > 1 else None)


# -- camera streams, replayed in real time -----------------------------------------------------------------

#: how a replay serves K streams: the stream scheduler; K runners in K threads, each frame's budget the time to its
#: deadline; one runner serving the frames first in, first out, budget the time left to each frame's deadline
STREAM_METHODS = ("scheduler", "runners", "fifo")


class Arrival(NamedTuple):
    """One camera frame: when it arrives and its deadline, in seconds from the replay's start."""

    time: float
    stream: int
    index: int  # its number in its stream
    deadline: float


MAX_JITTER_MS = 60_000  # a camera's arrivals jittered by a minute either way: far past any replay's sense


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def camera_arrivals(streams: int, fps: float, seconds: float, deadline_ms: float | None = None, jitter_ms: float = 0.0,
                    seed: int = 0, rates: Sequence[float] | None = None, burst: int = 1) -> list[Arrival]:  # fmt: skip
    """``streams`` cameras at ``fps`` (or camera ``k`` at ``rates[k % len(rates)]``) for ``seconds``, each with its own
    phase (uniform over a period) and every frame jittered uniformly by +-``jitter_ms``; a frame's deadline is its
    arrival plus ``deadline_ms`` (default: one period of its camera). ``burst`` > 1: the last camera delivers its
    frames ``burst`` at a time, each group when its last frame is due (a camera behind a link that batches), each
    frame's deadline one period after that. Sorted by arrival. At most :data:`~hne_edge.limits.MAX_REPLAY_FRAMES`
    frames, at least one a camera (:func:`~hne_edge.limits.check_replay`)."""
    rates = [float(fps)] * streams if not rates else [float(rates[k % len(rates)]) for k in range(streams)]
    for rate in set(rates):
        check_replay(streams, rate, seconds)
    if not (_is_number(jitter_ms) and 0 <= jitter_ms <= MAX_JITTER_MS):  # a NaN or 1e308 broke rng.uniform
        raise InputError(f"jitter_ms: received {jitter_ms!r}; expected ms from 0 to {MAX_JITTER_MS:,}")
    if deadline_ms is not None and not (_is_number(deadline_ms) and 0 < deadline_ms < math.inf):
        raise InputError(f"deadline_ms: received {deadline_ms!r}; expected a finite number of ms > 0 (or None: a period)")
    if not (type(burst) is int and burst >= 1):
        raise InputError(f"burst: received {burst!r}; expected frames per burst, an int >= 1")
    rng = np.random.default_rng(seed)
    out = []
    for k, rate in enumerate(rates):
        period = 1.0 / rate
        budget = period if deadline_ms is None else deadline_ms / 1e3
        phase = rng.uniform(0, period)
        group = burst if k == streams - 1 else 1
        for i in range(int(seconds * rate)):
            due = phase + (i - i % group + group - 1) * period  # a burst arrives when its last frame is due
            t = max(0.0, due + rng.uniform(-jitter_ms, jitter_ms) / 1e3)
            out.append(Arrival(t, k, i, t + budget))
    return sorted(out)


def _sleep_until(t: float) -> None:
    left = t - time.perf_counter()
    if left > 0:
        time.sleep(left)


def _pin(cores: Sequence[int] | None, thread_id: int = 0) -> None:
    """Pin a thread (0: the calling one) to ``cores`` where the platform can (Linux); None: leave it."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(thread_id, cores)


def _weigh(nice: int | str | None, cameras: int) -> None:
    """Weigh the calling thread as a :class:`~.streams.StreamScheduler` weighs its worker (:mod:`.weight`): ``nice=
    "streams"``, the nice of ``cameras`` ordinary threads and the short time slice; an int, that nice; None, as it
    is. Refused (no ``CAP_SYS_NICE``), it stays as it is - as the scheduler's threads do."""
    from . import weight

    if nice is None or not weight.supported():
        return
    value = weight.nice_for_streams(cameras, weight.thread_nice()) if nice == "streams" else int(nice)
    weight.set_thread_nice([threading.get_native_id()], value)


def stream_profile_sizes(batch: tuple[int, int, int]) -> list[int]:
    """The batch sizes a streams replay profiles, of a bundle's ``(min, opt, max)``: 2, 4, 8 for the stacked calls'
    curve and both ends - the max being the most rows a scheduler stacks, so no size it runs is extrapolated."""
    lo, _, hi = batch
    return sorted({b for b in (lo, 2, 4, 8, hi) if lo <= b <= hi})


def replay_streams(method: str, open_runner: Callable[[], AnytimeRunner], frames: np.ndarray, arrivals: Sequence[Arrival],
                   on_result: Callable[[dict], None] | None = None, device_cores: Sequence[int] | None = None,
                   host_cores: Sequence[int] | None = None, **scheduler_options: Any) -> dict:  # fmt: skip
    """Serve ``arrivals`` in real time by ``method`` (:data:`STREAM_METHODS`); frame ``a`` is
    ``frames[a.index % len(frames)]`` (normalised, one batch-first image). ``open_runner()`` opens a runner (with
    its cost profile; the method closes it); ``scheduler_options`` go to the :class:`~.streams.StreamScheduler`, and
    their ``nice`` (default "streams") weighs the baselines' serving threads as the scheduler's worker is weighed.

    ``device_cores`` / ``host_cores`` (Linux; a CPU standing in for one accelerator): every thread that runs the
    model - K runners' threads, the FIFO worker, the scheduler's worker - is pinned to ``device_cores``, and the
    submitting (calling) thread to ``host_cores`` while it submits, so every method has the same compute, and the
    camera threads' own work is not taken from it. Runners are opened before the calling thread moves: a
    backend's threads started then keep its cores.

    Returns ``{"records": [...], "wall_s", "busy_s"}``; a record per frame: ``stream``, ``arrival`` and
    ``deadline`` (clock seconds), ``finished`` (its answer), ``leaves``, ``met`` (answered by its deadline),
    ``rejected``, ``late``. ``busy_s``: the time the device ran steps (the scheduler's), runs (one runner) or
    any run (K runners: the union of their runs). ``on_result(record)`` is called as each frame is answered."""
    if method not in STREAM_METHODS:
        raise InputError(f"method: received {method!r}; expected one of {list(STREAM_METHODS)}")
    before = os.sched_getaffinity(0) if host_cores and hasattr(os, "sched_getaffinity") else None
    try:
        return _replay(method, open_runner, frames, arrivals, on_result, device_cores, host_cores, **scheduler_options)
    finally:
        if before is not None:  # the calling thread's cores back
            os.sched_setaffinity(0, before)


def _replay(method: str, open_runner: Callable[[], AnytimeRunner], frames: np.ndarray, arrivals: Sequence[Arrival],
            on_result: Callable[[dict], None] | None, device_cores: Sequence[int] | None, host_cores: Sequence[int] | None,
            **scheduler_options: Any) -> dict:  # fmt: skip
    records: list[dict] = []
    lock = threading.Lock()

    def record(rec: dict) -> None:
        with lock:
            records.append(rec)
        if on_result is not None:
            on_result(rec)

    def image(a: Arrival) -> np.ndarray:
        return frames[a.index % len(frames)][None]

    # the baselines' threads weighed as the scheduler weighs its worker (nice "streams", the default of every
    # method): a FIFO worker as the K cameras it serves, a runner's thread as its one camera - each with the short
    # time slice - so that beside busy neighbours a comparison is of serving policies, not of priorities
    nice = scheduler_options.get("nice", "streams")
    if method == "runners":
        per_stream: dict[int, list[Arrival]] = {}
        for a in arrivals:
            per_stream.setdefault(a.stream, []).append(a)
        check_runners(len(per_stream), "streams (method 'runners': a runner and a thread per camera)")
        runners = [open_runner() for _ in per_stream]
        intervals: list[tuple[float, float]] = []
        _pin(host_cores)
        t0 = time.perf_counter() + 0.05

        def serve(runner: AnytimeRunner, mine: list[Arrival]) -> None:
            _pin(device_cores)
            _weigh(nice, 1)
            for a in mine:
                _sleep_until(t0 + a.time)
                start = time.perf_counter()
                r = runner.run(image(a), deadline=t0 + a.deadline)
                end = time.perf_counter()
                with lock:
                    intervals.append((start, end))
                record({"stream": a.stream, "arrival": t0 + a.time, "deadline": t0 + a.deadline, "finished": end,
                        "leaves": r.leaves, "met": end <= t0 + a.deadline, "rejected": False, "late": False})  # fmt: skip

        threads = [threading.Thread(target=serve, args=(r, mine)) for r, mine in zip(runners, per_stream.values())]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        for r in runners:
            r.close()
        busy, end = 0.0, -math.inf
        for a, b in sorted(intervals):  # the union of the runs
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        return {"records": records, "wall_s": wall, "busy_s": busy}

    runner = open_runner()
    if method == "fifo":
        todo: queue.Queue = queue.Queue()
        busy_s = [0.0]

        cameras = len({a.stream for a in arrivals})

        def work() -> None:
            _pin(device_cores)
            _weigh(nice, cameras)
            while (item := todo.get()) is not None:
                a, t0 = item
                start = time.perf_counter()
                r = runner.run(image(a), deadline=t0 + a.deadline)
                end = time.perf_counter()
                busy_s[0] += end - start
                record({"stream": a.stream, "arrival": t0 + a.time, "deadline": t0 + a.deadline, "finished": end,
                        "leaves": r.leaves, "met": end <= t0 + a.deadline, "rejected": False, "late": False})  # fmt: skip

        worker = threading.Thread(target=work)
        worker.start()
        _pin(host_cores)
        t0 = time.perf_counter() + 0.05
        for a in arrivals:
            _sleep_until(t0 + a.time)
            todo.put((a, t0))
        todo.put(None)
        worker.join()
        runner.close()
        return {"records": records, "wall_s": time.perf_counter() - t0, "busy_s": busy_s[0]}

    from .streams import StreamScheduler

    with runner, StreamScheduler(runner, **scheduler_options) as streams:
        if streams._worker is not None and streams._worker.native_id is not None:
            _pin(device_cores, streams._worker.native_id)
        if streams._watcher is not None and streams._watcher.native_id is not None:  # it runs no model: a host thread, as the cameras'
            _pin(host_cores, streams._watcher.native_id)
        _pin(host_cores)
        # no list of the handles: a frame's record is all that is kept, as for the runners. 4,800 handles kept
        # with their results (300 fps) made every full garbage collection scan them: 8-12 ms with the interpreter's
        # lock held, four times a run, and the frames pending then missed.
        errors: list[BaseException] = []

        def answered(h, a: Arrival) -> None:
            # finished: when the handle got its result - in the hands of a caller waiting on it, as a runner's
            # return. The callback runs after, on its stream's thread (issue 42): timed here, a loaded host's
            # callback threads counted their own wake-up as the scheduler's lateness (37 % "misses" at 8 cameras)
            try:
                r = h.result()
                record({"stream": a.stream, "arrival": t0 + a.time, "deadline": t0 + a.deadline, "finished": r.finished,
                        "leaves": r.leaves, "met": r.met_deadline and r.finished <= t0 + a.deadline,
                        "rejected": r.stopped_by == "rejected", "late": r.late})  # fmt: skip
            except BaseException as exc:  # raised below, in the calling thread
                errors.append(exc)

        t0 = time.perf_counter() + 0.05
        for a in arrivals:
            _sleep_until(t0 + a.time)
            streams.submit(a.stream, image(a), deadline=t0 + a.deadline).add_done_callback(lambda h, a=a: answered(h, a))
        streams.close()  # returns once every frame is answered, its callback run
        if errors:
            raise errors[0]
        wall = time.perf_counter() - t0
        busy = streams.busy_seconds
    return {"records": records, "wall_s": wall, "busy_s": busy, "calls": streams.calls, "stacked_calls": streams.stacked_calls}


def summarize_streams(run: dict, accuracy: Sequence[float]) -> dict:
    """One row of a streams replay: ``frames``; ``rejected``; ``misses`` (answered after their deadline) and
    ``miss_rate`` (of the frames answered); ``mean_leaves`` (answered frames); ``expected_accuracy`` over every
    frame (:func:`~.streams.expected_accuracy`: ``accuracy[n]`` of the leaves in time, 0 rejected or late);
    ``latency_ms`` p50 / p99 from arrival to answer (answered frames); ``busy`` (fraction of the wall time)."""
    from .streams import expected_accuracy

    recs = run["records"]
    answered = [r for r in recs if not r["rejected"]]
    misses = sum(not r["met"] for r in answered)
    lat = np.asarray([(r["finished"] - r["arrival"]) * 1e3 for r in answered]) if answered else np.zeros(1)
    return {
        "frames": len(recs),
        "rejected": len(recs) - len(answered),
        "misses": misses,
        "miss_rate": misses / max(1, len(answered)),
        "mean_leaves": float(np.mean([r["leaves"] for r in answered])) if answered else 0.0,
        "expected_accuracy": expected_accuracy([r["leaves"] if r["met"] and not r["rejected"] else 0 for r in recs], accuracy),
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))},
        "busy": run["busy_s"] / run["wall_s"] if run["wall_s"] > 0 else 0.0,
    }
