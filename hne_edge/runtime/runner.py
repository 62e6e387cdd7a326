"""``AnytimeRunner``: loads a bundle once and owns the runners' lifecycle and the one-call-at-a-time lock.

It loads one backend runner per model file, compiles the tree's depth-first
schedule (:func:`~.program.compile_program`: the steps of the plan, and for
plan "mixed" the bigger steps it may take instead) and opens sessions over it:
``run(x)`` is ``start`` + :meth:`AnytimeSession.advance` + ``result``, in
one locked call. Sessions (:mod:`.session`) hold one frame's state; the
profiler (:mod:`.profiler`) times the same loop through its unit hook.

Time: every time value (``deadline``, the budget, the cost model) is in
seconds of the backend's clock, ``time.perf_counter()`` for the real
backends. ``deadline`` is therefore an absolute ``time.perf_counter()``
value; ``budget_ms`` counts from the call's entry (``run``: including the
input check).
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..bundle import (
    DEFAULT_PLAN,
    FIRST,
    FUSED,
    MIXED,
    MIXED_BASE,
    MIXED_NEEDS,
    MIXED_PLANS,
    PRECISIONS,
    RUNNER_PLANS,
    read_manifest_and_digest,
)
from ..errors import BundleError, HNEError, InputError, short_repr
from ..limits import check_memory, cpu_count, load_average
from ..progress import Progress
from . import profiler
from .backends import Backend, create_backend
from .cost_model import CostModel, check_quantile
from .inputs import check_input, preprocess
from .profile_file import Profile, find_profile, host_info, save_profile
from .program import Program, compile_program
from .result import AnytimeResult
from .session import (
    UNOBSERVED,
    AnytimeSession,
    NoResultError,
    RunnerClosedError,
    SessionCancelled,
    check_batch_sizes,
    check_count,
    check_limits,
    check_stop_at,
)

__all__ = ["AnytimeRunner", "AnytimeSession", "ConcurrentUseError", "RunnerClosedError", "NoResultError", "SessionCancelled"]


MAX_WARMUP = 1000  # full passes over the tree at construction; more only delays the first frame
LOAD_FRAMES = 50  # the budgeted frames the load watch looks back on
LOAD_MIN_FRAMES = 20  # ... and how many it needs before it says anything
LOAD_MISSES = 0.2  # it warns when this share of them missed a budget that fits their forced leaves


class ConcurrentUseError(HNEError, RuntimeError):
    """Two threads used one AnytimeRunner at the same time."""


class _LoadWatch:
    """Says once per runner when the machine is too slow to keep budgets, with the slowdown it measured (issue 28).

    A busy machine misses budgets frame after frame, and a miss is counted but says nothing of why. A miss is the
    machine's when the budget fits the frame's forced leaves as the saved profile measured them (their p95: a
    budget at their median is missed half the time on any machine; without a profile: when it is not a forced
    miss, :attr:`AnytimeResult.overran_min_leaves`). After :data:`LOAD_MIN_FRAMES`
    budgeted ``run()`` frames, when :data:`LOAD_MISSES` of the last :data:`LOAD_FRAMES` or fewer are such misses,
    it warns once (``warnings.warn``; the CLI prints a ``warning:`` line) with the time those frames took over the
    profile's medians of their steps, and the load average. It never changes what runs.
    """

    def __init__(self) -> None:
        self.frames: deque[tuple[bool, float]] = deque(maxlen=LOAD_FRAMES)  # (the machine's miss, time / profiled)
        self.count = self.missed = 0  # frames seen; the machine's misses among those kept (a frame costs no sum)
        self.said = False

    def frame(self, runner: "AnytimeRunner", session: AnytimeSession, result: AnytimeResult, n_min: int) -> None:
        machine, ratio = False, math.nan
        if not result.met_budget:
            profiled = runner._profiled_s(session.batch)
            if profiled is None:
                machine = not result.overran_min_leaves
            else:
                median, p95 = profiled
                machine = result.budget_ms / 1e3 >= sum(p95[j] for j in runner._program.walk(0, n_min))
                taken = session.steps_taken
                expected = sum(median[j] for j, *_ in taken)
                ratio = sum(t for *_, t in taken) / expected if machine and expected > 0 else math.nan
        if len(self.frames) == LOAD_FRAMES:
            self.missed -= self.frames[0][0]
        self.frames.append((machine, ratio))
        self.count += 1
        self.missed += machine
        missed = self.missed
        if self.count < LOAD_MIN_FRAMES or missed < LOAD_MISSES * len(self.frames):
            return
        self.said = True
        ratios = sorted(r for _, r in self.frames if r == r)
        if ratios:
            why = (f"those frames took a median {ratios[len(ratios) // 2]:.2g}x what "
                   f"{runner.profile_path or 'the profile'} measured for their steps")
        else:
            why = "with no profile for this batch size the slowdown is not measured (hne-edge profile saves one)"
        load = load_average()
        busy = f"; load average {load:.1f} on {cpu_count()} CPUs" if load is not None else ""
        warnings.warn(
            f"this machine is too busy to keep its budgets (the last: {result.budget_ms:.3g} ms): {missed} of the last "
            f"{len(self.frames)} frames missed budgets that fit their forced leaves; {why}{busy}. A quieter machine, a "
            "higher priority (nice, chrt) or longer budgets keep them; said once per runner", stacklevel=3)


class AnytimeRunner:
    """Anytime inference over an exported bundle.

    Args:
        bundle_dir: the bundle (see :mod:`hne_edge.bundle`); read and validated once.
        backend: "onnxruntime" (default), "torch", or a :class:`Backend` instance.
        device: "cpu" (default), "cuda" or "cuda:N" (GPU backends; see docs/gpu.md). With a built backend: its
            device, the default; another is refused (InputError).
        plan: "segments" (one model file per leaf chain; fewer calls), "nodes" (one per node),
            "subtrees" (leaf 0's chain, then one call per whole subtree: B + 1 calls, stopping at
            1, 2, 4, ..., N leaves), "fused" (the whole tree in one call: no anytime stop before N) or
            "mixed" (per frame, leaf by leaf or a whole subtree - or the whole tree - in one call where
            the budget fits it and the cost model measures it no slower; needs "segments" and "subtrees"
            files, uses "fused" ones when present; see :mod:`.program`).
        precision: "fp32" or "fp16" (what the bundle holds).
        threads: intra-op threads for the backend (None: its default).
        load_profile: load a matching saved cost profile (see :mod:`.cost_model`).
        quantile: the cost model's prediction quantile.
        verify: check the sha256 of every file this runner loads, on the bytes it loads (the same bytes
            go to the backend; a file swapped after the check is never what runs).
        first_leaf: when a frame stops after leaf 0 (``max_leaves=1``, or a budgeted ``run()`` whose budget holds
            no step after leaf 0 at the cost model's predictions), run the bundle's export-free first-leaf file
            (plan "first") if it has one for this backend and precision: it costs what a standalone network costs,
            up to ~10% less than leaf 0's exporting segment on ONNX Runtime CPU and ~25% less on ONNX Runtime CUDA
            (an H200: 1.43 ms a frame against about 1.9, issue 40), so a budget between the two is met (one more
            session).
        warmup: full passes over the tree at the bundle's optimal batch size on construction (0..1000), so
            the first real frame does not pay for lazy allocations (not recorded by the cost model). What
            they hold is checked against the machine's available memory first (:class:`ResourceExhausted`).
        **backend_options: passed to the backend (e.g. ``spinning`` for onnxruntime).

    Thread safety: a runner serves one call at a time. A call while another
    thread is inside ``run`` / ``start`` / ``step`` / ``refine`` / ``profile``
    raises :class:`ConcurrentUseError` (backend buffers and contexts are per
    runner); use one runner per thread. ``session.cancel()`` is meant for
    another thread, and so is ``close()``: it refuses new calls at once
    (:class:`RunnerClosedError`) and waits for a running call to finish
    before it frees anything.
    """

    def __init__(
        self,
        bundle_dir: str | Path,
        backend: str | Backend = "onnxruntime",
        device: str | None = None,
        plan: str = DEFAULT_PLAN,
        precision: str = "fp32",
        *,
        threads: int | None = None,
        load_profile: bool = True,
        quantile: float = 0.99,
        verify: bool = True,
        warmup: int = 1,
        first_leaf: bool = True,
        **backend_options: Any,
    ) -> None:
        self._closed = True  # until fully built
        self._runners: list[Any] = []
        self._first_runner: Any = None
        if not isinstance(bundle_dir, (str, os.PathLike)):
            raise InputError(f"bundle_dir: received {type(bundle_dir).__name__}; expected the path of a bundle folder")
        if plan not in RUNNER_PLANS:
            raise InputError(f"plan: received {plan!r}; expected one of {list(RUNNER_PLANS)}")
        if precision not in PRECISIONS:
            raise InputError(f"precision: received {precision!r}; expected one of {list(PRECISIONS)}")
        warmup = check_count(warmup, "warmup", 0, MAX_WARMUP)
        quantile = check_quantile(quantile)  # the cost model is built last: refused before any session opens
        self.bundle_dir = Path(bundle_dir)
        # the files this runner loads are hashed as they are loaded (Backend.read_file), on the bytes that run
        self.manifest, self.manifest_sha256 = read_manifest_and_digest(self.bundle_dir, verify_files=False)
        self.plan, self.precision = plan, precision
        if threads is not None:
            backend_options["threads"] = threads
        self.backend = create_backend(backend, device, **backend_options)
        self.backend.verify = verify
        self.device = self.backend.device
        tree = self.manifest.tree
        self.tree = tree
        self.num_leaves = tree.num_leaves
        self.class_names = self.manifest.class_names
        self.num_classes = self.manifest.num_classes
        self.input_spec = self.manifest.input
        try:
            loaded = self.backend.load(self.manifest, self.bundle_dir, MIXED_BASE if plan == MIXED else plan, precision)
            self._runners = [self.backend.create_runner(u, loaded) for u in loaded.units]
            alternatives = []
            if plan == MIXED:  # the whole subtrees (one leaf: the same call as the segment) and the whole tree
                for part in MIXED_PLANS[1:]:  # after its base
                    if part in MIXED_NEEDS or self.backend.has_plan(self.manifest, part, precision):
                        units = self.backend.load(self.manifest, self.bundle_dir, part, precision)
                        alternatives += [self.backend.create_runner(u, units) for u in units.units if u.num_leaves > 1]
                self._runners += alternatives
            for r in self._runners:
                r.activate()
            if first_leaf and plan != FUSED and (self.backend.format, FIRST, precision) in self.manifest.variants():
                first = self.backend.load(self.manifest, self.bundle_dir, FIRST, precision)
                self._first_runner = self.backend.create_runner(first.units[0], first).activate()
            try:
                base = self._runners[: len(self._runners) - len(alternatives)]
                self._program: Program = compile_program(tree, base, self._first_runner, alternatives)
            except BundleError as exc:
                raise BundleError(f"{plan}: {exc}") from None
            # a warm-up the machine cannot hold fails before it runs, in one line; after the files are loaded, as
            # their check that the manifest's shapes are the graphs' comes first (the estimate trusts those shapes)
            if warmup:
                opt = self.manifest.input.batch[1]
                check_memory(
                    opt * self.manifest.sample_bytes(plan, precision),
                    f"the warm-up at batch {opt} (the bundle's opt batch)",
                    hint="pass warmup=0, or re-export the bundle with a smaller opt batch (batch=(min, opt, max))",
                    cli_hint="re-export the bundle with a smaller OPT (--batch-range MIN:OPT:MAX)",
                )  # fmt: skip
        except BaseException:
            self._release_all()
            raise
        self._clock = self.backend.clock
        self._to_host = self.backend.to_host
        self._from_host = self.backend.from_host
        # the boundary cast: check_input accepts the manifest's input dtype; the files may read another (fp16)
        image_dtype = np.dtype(loaded.image_dtype)
        if image_dtype == np.dtype(self.input_spec.dtype):
            self._upload = self._from_host
        else:
            self._upload = lambda x, up=self._from_host, dt=image_dtype: up(x.astype(dt))
        self._lock = threading.Lock()
        self._owner: str | None = None
        # what each step adds to the MACs: the nodes first computed for its leaves (each node once, depth-first)
        self.step_macs = [sum(self.manifest.node_macs[n.id] for n in tree.nodes if s.lo <= n.leaves[0] < s.hi)
                          for s in self._program.steps]  # fmt: skip
        self.stops = self._program.stops  # the leaf counts a frame can end at
        self.profile_data: Profile | None = None
        self.profile_path: Path | None = None
        self.profile_status = "not loaded"
        if load_profile:
            self.profile_data, self.profile_path, self.profile_status = find_profile(
                self.bundle_dir, self.manifest_sha256, self.backend.name, self.device, plan, precision,
                len(self._program.steps), self.input_spec.batch, self.backend.changed_options(), self._timing(),
            )
        self.quantile = quantile
        self.cost = self._cost_model(self.profile_data)
        self._load_watch = _LoadWatch()
        self._said_stops = False
        self._closed = False
        self.warmup_report: dict[str, Any] | None = None
        if warmup:
            opt = self.input_spec.batch[1]
            self._warm({b: (warmup if b == opt else 1) for b in sorted({*self._warm_sizes(), opt})})

    def warmup(self, batch_sizes: Sequence[int] | None = None) -> dict[str, Any]:
        """Run every step of the program once at each of ``batch_sizes`` (default: what the backend warms at open,
        :meth:`~.backends.base.Backend.warm_batch_sizes`), so no frame of those sizes pays a first call (a GPU's graph
        capture and autotuning: 100-1,500 ms on an H200). Not recorded by the cost model. Returns (and keeps as
        :attr:`warmup_report`) ``{"batch_sizes", "seconds", "device_bytes"}``: the device memory it added (None where
        the backend does not say)."""
        lo, _, hi = self.input_spec.batch
        sizes = sorted(set(self._warm_sizes() if batch_sizes is None else check_batch_sizes(batch_sizes, lo, hi)))
        self._acquire()
        try:
            return self._warm({b: 1 for b in sizes})
        finally:
            self._release()

    def _warm_sizes(self) -> list[int]:
        """The row counts a warm-up runs by default: what the backend says for the bundle's batch range."""
        return self.backend.warm_batch_sizes(*self.input_spec.batch)

    def _warm(self, passes: dict[int, int]) -> dict[str, Any]:
        spec = self.input_spec
        before, t0 = self.backend.device_bytes(), time.perf_counter()
        self.backend.warming()
        try:
            for batch, count in passes.items():
                x = np.zeros((batch, spec.channels, *spec.spatial), dtype=spec.dtype)
                for _ in range(count):
                    for route in self._program.routes():  # every step of a mixed program, once each
                        self._session(self._upload(x), len(x), UNOBSERVED, route).advance(
                            self._clock(), None, None, self.num_leaves, self.num_leaves
                        )
                    if self._first_runner is not None:
                        self._to_host(self._first_runner.run_logits_impl((self._upload(x),)))
        finally:  # a warm-up cut short still pins what it built: the cache's bound holds again after it
            self.backend.warmed()
        after = self.backend.device_bytes()
        self.warmup_report = {"batch_sizes": sorted(passes), "seconds": time.perf_counter() - t0,
                              "device_bytes": None if before is None or after is None else after - before}  # fmt: skip
        return self.warmup_report

    # -- construction ----------------------------------------------------------
    def _session_model(self, batch: int) -> Any:
        """This batch's cost model for a new session, the last frame's deferred observation still kept (the session
        makes it once its first step is issued); a stand-in cost model without that split gives its ``for_batch``."""
        cost = self.cost
        return cost.session_model(batch) if hasattr(cost, "session_model") else cost.for_batch(batch)

    def _session(self, handle: Any, batch: int, model: Any = None, program: Program | None = None) -> AnytimeSession:
        """A session over an uploaded image (``model``: the cost model it feeds, default this batch's;
        ``program``: one of the program's routes, default the program)."""
        return AnytimeSession(
            self._program if program is None else program,
            handle,
            batch,
            num_classes=self.num_classes,
            class_names=self.class_names,
            model=self._session_model(batch) if model is None else model,
            clock=self._clock,
            to_host=self._to_host,
            guard=(self._acquire, self._release),
            plan=repr(self.plan),
            cold_calls=lambda: getattr(self.backend, "cold_calls", 0),
        )

    def _cost_model(self, profile: Profile | None, measured_here: frozenset[int] = frozenset()) -> CostModel:
        return CostModel(self.step_macs, profile, quantile=self.quantile, path=self._program.path,
                         clock=self.backend.clock, measured_here=measured_here)  # fmt: skip

    @property
    def first_leaf_file(self) -> str | None:
        """The export-free file that frames stopping after leaf 0 run (None: they run leaf 0's segment)."""
        return None if self._first_runner is None else self._first_runner.name

    # -- locking / lifecycle ---------------------------------------------------
    def _acquire(self) -> None:
        if self._closed:
            raise RunnerClosedError("AnytimeRunner is closed; create a new runner")
        if not self._lock.acquire(blocking=False):
            if self._closed:  # close() holds the lock to free the runner
                raise RunnerClosedError("AnytimeRunner is closed; create a new runner")
            raise ConcurrentUseError(
                f"AnytimeRunner is busy: received a call from thread {threading.current_thread().name!r} while "
                f"thread {getattr(self._owner, 'name', None)!r} is running it; expected one call at a time (a runner's backend buffers "
                "and caches serve one thread): use one runner per thread, or serialize calls with a lock"
            )
        if self._closed:  # closed between the check above and the lock
            self._lock.release()
            raise RunnerClosedError("AnytimeRunner is closed; create a new runner")
        self._owner = threading.current_thread()

    def _release(self) -> None:
        self._owner = None
        if self._closed:  # close() was called from inside this call (a stop_when callback): free now
            self._free()
        self._lock.release()

    def _free(self) -> None:
        if self._runners or self._first_runner is not None:
            self._release_all()
            self.backend.close()

    def _release_all(self) -> None:
        for r in [*self._runners, self._first_runner]:
            if r is None:
                continue
            try:
                r.release()
            except Exception:  # pragma: no cover - best effort
                pass
        self._runners = []
        self._first_runner = None

    def close(self) -> None:
        """Release every session/engine; later calls raise :class:`RunnerClosedError`. Idempotent."""
        if self._closed:
            return
        self._closed = True  # from now on every call raises RunnerClosedError
        if self._owner is threading.current_thread():
            return  # called from inside a running call: its _release frees
        with self._lock:  # wait for a running call (another thread's) to finish; never free under it
            self._free()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "AnytimeRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            if not self._closed:
                self._closed = True
                self._release_all()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._runners)} runners"
        return (
            f"AnytimeRunner({str(self.bundle_dir)!r}, backend={self.backend.name!r}, device={self.device!r}, "
            f"plan={self.plan!r}, precision={self.precision!r}; {self.num_leaves} leaves, {state})"
        )

    # -- inference -------------------------------------------------------------
    def preprocess(self, images: Any) -> np.ndarray:
        """uint8 HWC / NHWC images (or a list) -> normalised NCHW input (manifest mean/std)."""
        return preprocess(images, self.input_spec)

    def start(self, x: np.ndarray) -> AnytimeSession:
        """Check ``x`` and open a session (no leaf evaluated yet) that owns a copy of ``x``."""
        self._acquire()
        try:
            checked = check_input(x, self.input_spec)
            # the session outlives this call: the caller may reuse x (a camera buffer)
            handle = self.backend.owned(self._upload(checked), x)
            return self._session(handle, checked.shape[0])
        finally:
            self._release()

    def run(
        self,
        x: np.ndarray,
        budget_ms: float | None = None,
        deadline: float | None = None,
        max_leaves: int | None = None,
        min_leaves: int = 1,
        stop_when: Callable[[np.ndarray], bool] | None = None,
    ) -> AnytimeResult:
        """Evaluate the first leaves of the ensemble on ``x`` (normalised NCHW float, batch first).

        Args:
            x: input batch; checked once (dtype, rank, channels, size, batch range, finite).
            budget_ms: time budget from this call's entry; a step (a leaf, or a whole subtree) starts
                only if its predicted cost fits in the time left.
            deadline: absolute ``time.perf_counter()`` value; with ``budget_ms`` the earlier wins.
            max_leaves: stop after this many leaves (default: all); rounded down to one of the plan's
                ``runner.stops`` (plan "subtrees": 1, 2, 4, ..., N).
            min_leaves: always evaluate at least this many (>= 1), budget or not; rounded up to a stop.
            stop_when: e.g. ``Agreement(...)``; called between steps with the leaf logits so far.
        """
        t0 = self._clock()
        stop_at, budget = check_stop_at(t0, budget_ms, deadline)
        n_stop, n_min = check_limits(self._program, max_leaves, min_leaves, repr(self.plan))
        self._acquire()
        try:
            cold = getattr(self.backend, "cold_calls", 0)
            x = check_input(x, self.input_spec)
            session = self._session(self._upload(x), x.shape[0])  # start, without a copy: it ends in this call
            session.advance(t0, stop_at, budget, n_stop, n_min, stop_when, final=True)
            warm = getattr(self.backend, "cold_calls", 0) == cold
        finally:
            self._release()
        result = session.result()
        if stop_at is not None and warm:  # a frame that captured a graph says nothing of the machine's load
            if result.overran_min_leaves and n_min > min_leaves and not self._said_stops:
                self._say_stops(result, min_leaves, n_min)
            if not self._load_watch.said:
                self._load_watch.frame(self, session, result, n_min)
        return result

    def _say_stops(self, result: AnytimeResult, asked: int, forced: int) -> None:
        """Once per runner: the plan's first stop forced more leaves than asked, and the budget could not hold them
        (plan "fused" ran all 16 leaves of every budgeted frame without a word, issue 28)."""
        self._said_stops = True
        warnings.warn(
            f"plan {self.plan!r} stops only at {', '.join(map(str, self.stops))} leaves, so a frame runs {forced} leaves "
            f"at least ({asked} asked): a budget of {result.budget_ms:.3g} ms cannot hold them (this frame took "
            f"{result.elapsed_ms:.3g} ms and missed it; every such frame will); plan 'segments' or 'mixed' stops within "
            "a budget", stacklevel=3)

    __call__ = run

    # -- cost model --------------------------------------------------------------
    def _profiled_s(self, batch: int) -> tuple[list[float], list[float]] | None:
        """The saved profile's median and p95 seconds per step at ``batch`` (None: no profile of that batch size)."""
        profile = self.profile_data
        if profile is None or batch not in profile.batches:
            return None
        steps = profile.batches[batch]["leaves"]
        return [s["median_ms"] / 1e3 for s in steps], [s.get("p95_ms", s["median_ms"]) / 1e3 for s in steps]

    def predicted_ms(self, batch: int = 1) -> list[float]:
        """The cost model's current predictions (ms) for ``batch`` (within the bundle's batch range), per step of
        the program (for plans "segments" and "nodes", step i is leaf i; see :attr:`steps`)."""
        lo, _, hi = self.input_spec.batch
        return [p * 1e3 for p in self.cost.predict(check_count(batch, "batch", lo, hi))]

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The program's steps: ``{"step", "leaves": (first, end), "kind", "name", "macs"}`` each (cost-model order)."""
        return [{"step": j, "leaves": (s.lo, s.hi), "kind": s.kind, "name": s.name, "macs": m}
                for j, (s, m) in enumerate(zip(self._program.steps, self.step_macs))]  # fmt: skip

    def time_steps(self, x: np.ndarray) -> list[float]:
        """Every step's wall time (seconds) on ``x``, as one frame pays it: each route of the program (leaf by
        leaf; a mixed runner's subtree by subtree and whole tree too) run once, unbudgeted, unseen by the cost
        model. What an oracle knows of this frame (``program.best_leaves``); the benchmarks' deadline rows and
        ``benchmarks/record_steps.py`` use it. Indexed like :attr:`steps`."""
        self._acquire()
        try:
            x = check_input(x, self.input_spec)
            return profiler.step_seconds(lambda route: self._session(self._upload(x), len(x), UNOBSERVED, route),
                                         self._program, self._clock)  # fmt: skip
        finally:
            self._release()

    def profile(
        self,
        batch_sizes: Sequence[int] | None = None,
        warmup: int = 10,
        repeats: int = 50,
        save: bool = True,
        seed: int = 0,
        progress: Progress | None = None,
    ) -> Profile:
        """Measure every step and unit on this device (median/p90/p95 after warm-up); use and save it.

        ``batch_sizes``: default the bundle's min and opt batch sizes (one when they are equal). Between
        profiled sizes the cost model interpolates; beyond the largest it follows the measured slope of the
        two largest; with one size it predicts no other (see :func:`~.cost_model.profile_at_batch`).

        A mixed runner times each of its routes (leaf by leaf, subtree by subtree, the whole tree) in turn,
        so every step it may choose is measured.

        ``progress`` (:mod:`hne_edge.progress`) counts the passes over the tree.

        Saves to ``<bundle>/profiles/<device>-<backend>-<plan>-<precision>.json`` (``-<digest>`` before
        ``.json`` when the backend's options that change what a step costs are not its defaults)
        (or the user cache if the bundle is read-only, gone or replaced since; ``self.profile_path`` says where).
        A later runner loads whichever of the two was measured last (:func:`~.profile_file.find_profile`).
        """
        lo, opt, hi = self.input_spec.batch
        if batch_sizes is None:  # two sizes when the bundle has them: the cost model interpolates (cost_model.profile_at_batch)
            batch_sizes = sorted({lo, opt})
        sizes = check_batch_sizes(batch_sizes, lo, hi)
        if not sizes:
            raise InputError("batch_sizes: received an empty list; expected at least one batch size")
        check_count(repeats, "repeats", 1, 10**6)
        check_count(warmup, "warmup", 0, 10**6)
        self._acquire()
        try:
            batches = profiler.measure(
                lambda x, route: self._session(self._upload(x), len(x), UNOBSERVED, route),
                self._program,
                self.backend,
                self.input_spec,
                [r.name for r in self._runners],
                sizes,
                warmup,
                repeats,
                seed,
                progress,
            )
        finally:
            self._release()
        profile = Profile(
            model_name=self.manifest.model_name,
            manifest_sha256=self.manifest_sha256,
            backend=self.backend.name,
            device=self.device,
            plan=self.plan,
            precision=self.precision,
            batches=batches,
            backend_info={**self.backend.describe(), "options": self.backend.changed_options()},  # options: its name
            host=host_info(),
        )
        measured = frozenset(profile.batches)  # measured here, now: what a profile's audit would ask (not the rest)
        if self.profile_data is not None:  # keep other batch sizes of the loaded profile
            for b, v in self.profile_data.batches.items():
                profile.batches.setdefault(b, v)
        self.profile_data, self.profile_status = profile, "measured, not saved"
        self.cost = self._cost_model(profile, measured)
        if save:
            self.profile_path, fell_back = save_profile(profile, self.bundle_dir)
            self.profile_status = f"saved {self.profile_path}" + (" (bundle dir not writable)" if fell_back else "")
        return profile

    def _timing(self) -> dict[str, Any]:
        """The backend's options that change what a step costs, as its describe() says them (and a profile records)."""
        info = self.backend.describe()
        return {k: info[k] for k in self.backend.timing_options() if k in info}

    def use_profile(self, profile: Profile) -> None:
        """Predict from ``profile`` (e.g. another runner's of the same bundle, backend, device, plan and precision:
        several runners in one process measured once); the cost model starts over from it."""
        if not isinstance(profile, Profile):
            raise InputError(f"use_profile: received {short_repr(profile)}; expected a Profile (runner.profile_data "
                             "of a runner that measured or loaded one)")
        if (profile.manifest_sha256, profile.backend, profile.device, profile.plan, profile.precision) != (
                self.manifest_sha256, self.backend.name, self.device, self.plan, self.precision):  # fmt: skip
            raise InputError(f"use_profile: received a profile of {profile.backend} {profile.device} plan {profile.plan} "
                             f"{profile.precision} (manifest {profile.manifest_sha256[:12]}); expected this runner's "
                             f"{self.backend.name} {self.device} plan {self.plan} {self.precision} "
                             f"(manifest {self.manifest_sha256[:12]})")  # fmt: skip
        self.profile_data = profile
        self.profile_status = "given"
        self.cost = self._cost_model(profile)
