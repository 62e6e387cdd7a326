"""Anytime inference: the one place where the tree is scheduled depth-first.

``AnytimeRunner`` loads a bundle once (one backend runner per model file),
and evaluates the ensemble leaf by leaf in the tree's depth-first order
(:attr:`TreeSpec.segments`), so a node is computed once and each new leaf
costs only the nodes it does not share with the previous one. A
:class:`AnytimeSession` holds one frame's state: the cached activations of
the current path, the leaf logits so far, and the cancel flag.

Memory: after leaf ``i`` the session drops every activation whose subtree
has no leaf left (``node.leaves[-1] == i``), so at most one activation per
depth (the current path) plus the image is ever held - never the tree.

The hot loop (``AnytimeSession._advance``) only indexes precompiled
per-leaf programs ``(run_impl, input slot, output slots)``: no validation,
no dict building, no allocation beyond what the backend returns.

Time: every time value (``deadline``, the budget, the cost model) is in
seconds of the backend's clock, ``time.perf_counter()`` for the real
backends. ``deadline`` is therefore an absolute ``time.perf_counter()``
value; ``budget_ms`` counts from the call's entry (``run``: including the
input check).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..bundle import MANIFEST_NAME, read_manifest
from ..errors import BundleError, HNEError, InputError
from .backends import Backend, create_backend
from .cost_model import CostModel, Profile, find_profile, host_info, save_profile, summarize
from .inputs import check_input, preprocess
from .result import AnytimeResult

__all__ = ["AnytimeRunner", "AnytimeSession", "ConcurrentUseError", "RunnerClosedError", "NoResultError", "SessionCancelled"]

PLANS = ("segments", "nodes")


class ConcurrentUseError(HNEError, RuntimeError):
    """Two threads used one AnytimeRunner at the same time."""


class RunnerClosedError(HNEError, RuntimeError):
    """The runner (or the session's runner) was closed."""


class NoResultError(HNEError, RuntimeError):
    """A session was asked for a result before any leaf was evaluated."""


class SessionCancelled(NoResultError):
    """``cancel()`` came before the session's first leaf, so it has no result (and evaluates nothing more)."""


def _check_count(value: Any, name: str, lo: int, hi: int) -> int:
    if type(value) is int and lo <= value <= hi:  # the common case, fast
        return value
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not lo <= value <= hi:
        raise InputError(f"{name}: received {value!r}; expected an int in {lo}..{hi}")
    return int(value)


class AnytimeSession:
    """One frame's anytime evaluation: interrupt, inspect, resume.

    Created by :meth:`AnytimeRunner.start`. ``step()`` adds one leaf,
    ``refine(budget_ms=...)`` adds leaves under a budget, ``result()`` is
    valid once a leaf is evaluated, ``cancel()`` (any thread) stops the
    evaluation at the next leaf boundary and keeps what was done; a
    cancelled session evaluates nothing more. A session cancelled before its
    first leaf has no result: ``refine()`` and ``result()`` raise
    :class:`SessionCancelled` (an :class:`~hne_edge.errors.HNEError`).
    ``close()`` frees the cache.

    The session owns a copy of the input made by ``start(x)``: the caller may
    reuse ``x`` (a camera buffer) at once.
    """

    def __init__(self, runner: "AnytimeRunner", handle: Any, batch: int) -> None:
        self._runner = runner
        self.batch = batch
        self._cache: list[Any] | None = [None] * runner._n_slots
        self._cache[0] = handle
        self._leaf_logits = np.empty((runner.num_leaves, batch, runner.num_classes), dtype=np.float32)
        self._leaf_s = [0.0] * runner.num_leaves  # wall time of each leaf step
        self._next = 0
        self._cancelled = False
        self._elapsed = 0.0
        self._model = runner.cost.for_batch(batch)
        self._status = (True, False, None, "step")  # met_budget, overran_min_leaves, budget_ms, stopped_by

    # -- state ---------------------------------------------------------------
    @property
    def leaves(self) -> int:
        """Leaves evaluated so far."""
        return self._next

    @property
    def done(self) -> bool:
        """True when no more leaves will be evaluated (all done, cancelled or closed)."""
        return self._next >= self._runner.num_leaves or self._cancelled or self._cache is None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def cached_nodes(self) -> tuple[str, ...]:
        """Tree nodes whose activations the session currently holds (the current path)."""
        if self._cache is None:
            return ()
        return tuple(nid for nid, s in self._runner._slot.items() if nid is not None and self._cache[s] is not None)

    # -- control -------------------------------------------------------------
    def cancel(self) -> None:
        """Stop at the next leaf boundary (safe from any thread); keeps the leaves already done."""
        self._cancelled = True

    def close(self) -> None:
        """Drop the cached activations (the result stays readable)."""
        self._cache = None

    def step(self) -> bool:
        """Evaluate the next leaf. Returns False (evaluating nothing) when the session is done."""
        if self.done:
            return False
        runner = self._runner
        runner._acquire()
        try:
            t0 = runner._clock()
            self._advance(None, self._next + 1, 0, None)
            self._elapsed += runner._clock() - t0
        finally:
            runner._release()
        self._status = (True, False, None, "step")
        return True

    def refine(
        self,
        budget_ms: float | None = None,
        deadline: float | None = None,
        max_leaves: int | None = None,
        min_leaves: int | None = None,
        stop_when: Callable[[np.ndarray], bool] | None = None,
    ) -> AnytimeResult:
        """Continue from the cached activations; same options as :meth:`AnytimeRunner.run`.

        ``max_leaves`` / ``min_leaves`` count all leaves of the session (not
        just this call); ``min_leaves`` defaults to 1 so a result always exists.
        """
        runner = self._runner
        t0 = runner._clock()
        stop_at, budget = runner._stop_at(t0, budget_ms, deadline)
        n_stop, n_min = runner._limits(max_leaves, 1 if min_leaves is None else min_leaves)
        if self._cancelled and self._next == 0:
            raise SessionCancelled("session was cancelled before its first leaf: it has no result; start a new one")
        if self._cache is None and self._next == 0:
            raise RunnerClosedError("session is closed and has no leaf; start a new one with runner.start(x)")
        runner._acquire()
        try:
            if self.done:
                reason = "cancelled" if self._cancelled else ("complete" if self._next >= runner.num_leaves else "closed")
                t_forced = t0
            else:
                reason, t_forced = self._advance(stop_at, n_stop, n_min, stop_when)
            t1 = runner._clock()
        finally:
            runner._release()
        self._elapsed += t1 - t0
        self._status = (
            stop_at is None or t1 <= stop_at,
            stop_at is not None and t_forced > stop_at,
            budget,
            reason,
        )
        return self.result()

    def result(self) -> AnytimeResult:
        """The ensemble of the leaves evaluated so far (at least one)."""
        n = self._next
        if n == 0 and self._cancelled:
            raise SessionCancelled("session.result(): cancelled before its first leaf, so there is no result")
        if n == 0:
            raise NoResultError("session.result(): no leaf evaluated yet; call step() or refine() first")
        met, overran, budget, reason = self._status
        return AnytimeResult(
            leaf_logits=self._leaf_logits[:n],
            elapsed_ms=self._elapsed * 1e3,
            met_budget=met,
            overran_min_leaves=overran,
            budget_ms=budget,
            stopped_by=reason,
            class_names=self._runner.class_names,
            leaf_ms=[t * 1e3 for t in self._leaf_s[:n]],
        )

    # -- the hot loop --------------------------------------------------------
    def _advance(
        self,
        stop_at: float | None,
        n_stop: int,
        n_min: int,
        stop_when: Callable[[np.ndarray], bool] | None,
        final: bool = False,
    ) -> tuple[str, float]:
        """Evaluate leaves ``self._next .. n_stop-1``; return (why it stopped, time the forced leaves ended).

        Leaf ``i`` is started only if ``i < n_min`` (forced) or all of: not
        cancelled, ``stop_when`` does not fire, and ``now + predicted[i] <= stop_at``.
        ``final``: the session ends at ``n_stop`` (``run``), so leaf ``n_stop - 1`` skips its exports.
        """
        cache = self._cache
        if cache is None:
            raise RunnerClosedError("session is closed; its cached activations were dropped")
        runner = self._runner
        programs, drops, logits_slot = runner._programs, runner._drops, runner._logits_slot
        finals, last = runner._finals, (n_stop - 1 if final else -1)
        # the export-free first-leaf file costs less than leaf 0's segment: not a sample of the segment's cost
        unobserved = 0 if last == 0 and runner._first_runner is not None else -1
        to_host, clock = runner._to_host, runner._clock
        out = self._leaf_logits
        model = self._model
        pred, observe = model.pred, model.observe
        leaf_s = self._leaf_s
        i = self._next
        now = clock()
        t_forced = now
        reason = "max_leaves" if n_stop < runner.num_leaves else "complete"
        while i < n_stop:
            if i >= n_min:
                if self._cancelled:
                    reason = "cancelled"
                    break
                if stop_when is not None and i and stop_when(out[:i]):
                    reason = "stop_when"
                    break
                if stop_at is not None and now + pred[i] > stop_at:
                    reason = "budget"
                    break
            for run_impl, src, dsts in finals[i] if i == last else programs[i]:
                outs = run_impl((cache[src],))
                for d, o in zip(dsts, outs):
                    cache[d] = o
            out[i] = to_host(cache[logits_slot])
            for d in drops[i]:
                cache[d] = None
            t = clock()
            leaf_s[i] = t - now
            if i != unobserved:
                observe(i, t - now)
            now = t
            i += 1
            self._next = i
            if i == n_min:
                t_forced = now
        if self._cancelled and reason != "cancelled" and i < runner.num_leaves and i >= n_min:
            reason = "cancelled"
        if i >= runner.num_leaves:
            self._cache = None  # nothing left to compute: free the image too
        return reason, t_forced


class AnytimeRunner:
    """Anytime inference over an exported bundle.

    Args:
        bundle_dir: the bundle (see :mod:`hne_edge.bundle`); read and validated once.
        backend: "onnxruntime" (default), "torch", or a :class:`Backend` instance.
        device: "cpu", "cuda" or "cuda:N" (GPU backends; see the README's GPU section).
        plan: "segments" (one model file per leaf chain; fewer calls) or "nodes" (one per node).
        precision: "fp32" or "fp16" (what the bundle holds).
        threads: intra-op threads for the backend (None: its default).
        load_profile: load a matching saved cost profile (see :mod:`.cost_model`).
        quantile: the cost model's prediction quantile.
        verify: check the sha256 of every file this runner loads, on the bytes it loads (the same bytes
            go to the backend; a file swapped after the check is never what runs).
        first_leaf: when a frame stops after leaf 0 (``max_leaves=1``), run the bundle's export-free
            first-leaf file (plan "first") if it has one for this backend and precision: it costs what a
            standalone network costs, up to ~10% less than leaf 0's exporting segment (one more session).
        warmup: full passes over the tree at the bundle's optimal batch size on construction, so
            the first real frame does not pay for lazy allocations (not recorded by the cost model).
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
        device: str = "cpu",
        plan: str = "segments",
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
        if plan not in PLANS:
            raise InputError(f"plan: received {plan!r}; expected one of {list(PLANS)}")
        self.bundle_dir = Path(bundle_dir)
        # the files this runner loads are hashed as they are loaded (Backend.read_file), on the bytes that run
        self.manifest = read_manifest(self.bundle_dir, verify_files=False)
        self.manifest_sha256 = hashlib.sha256((self.bundle_dir / MANIFEST_NAME).read_bytes()).hexdigest()
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
            units = self.backend.units(self.manifest, self.bundle_dir, plan, precision)
            self._runners = [self.backend.create_runner(u, self.manifest, self.bundle_dir) for u in units]
            for r in self._runners:
                r.activate()
            if first_leaf and (self.backend.format, "first", precision) in self.manifest.variants():
                (first,) = self.backend.units(self.manifest, self.bundle_dir, "first", precision)
                self._first_runner = self.backend.create_runner(first, self.manifest, self.bundle_dir).activate()
            self._compile(units)
        except BaseException:
            self._release_all()
            raise
        self._clock = self.backend.clock
        self._to_host = self.backend.to_host
        self._from_host = self.backend.from_host
        # the boundary cast: check_input accepts the manifest's input dtype; the files may read another (fp16)
        image_dtype = np.dtype(next(u.inputs[0].dtype for u in units if u.inputs[0].node is None))
        if image_dtype == np.dtype(self.input_spec.dtype):
            self._upload = self._from_host
        else:
            self._upload = lambda x, up=self._from_host, dt=image_dtype: up(x.astype(dt))
        self._lock = threading.Lock()
        self._owner: str | None = None
        self.leaf_macs = [sum(self.manifest.node_macs[n] for n in seg.nodes) for seg in tree.segments]
        self.profile_data: Profile | None = None
        self.profile_path: Path | None = None
        self.profile_status = "not loaded"
        if load_profile:
            self.profile_data, self.profile_path, self.profile_status = find_profile(
                self.bundle_dir, self.manifest_sha256, self.backend.name, self.device, plan, precision, self.num_leaves
            )
        self.quantile = quantile
        self.cost = CostModel(self.leaf_macs, self.profile_data, quantile=quantile)
        self._closed = False
        if warmup:
            spec = self.input_spec
            x = np.zeros((spec.batch[1], spec.channels, *spec.spatial), dtype=spec.dtype)
            for _ in range(warmup):
                self._profile_once(AnytimeSession(self, self._upload(x), len(x)), None)
                if self._first_runner is not None:
                    self._to_host(self._first_runner.run_logits_impl((self._upload(x),)))

    # -- construction ----------------------------------------------------------
    def _compile(self, units: Sequence[Any]) -> None:
        """Per-leaf programs (run_impl, input slot, output slots) and drop lists from the tree's segments."""
        tree = self.tree
        slot: dict[str | None, int] = {None: 0}
        for k, node in enumerate(tree.nodes):
            slot[node.id] = k + 1
        self._slot = slot
        self._logits_slot = len(slot)
        self._n_slots = len(slot) + 1
        by_first = {u.nodes[0]: (u, r) for u, r in zip(units, self._runners)}
        programs, drops, finals = [], [], []

        def logits_only(run_logits, src):  # a call that returns only the leaf's logits (no exports)
            return (lambda inputs, f=run_logits: (f(inputs),), src, (self._logits_slot,))

        for seg in tree.segments:
            calls, k, prev = [], 0, seg.input
            while k < len(seg.nodes):
                if seg.nodes[k] not in by_first:
                    raise BundleError(f"{self.plan}: no model file starts at node {seg.nodes[k]} (needed by leaf {seg.leaf})")
                unit, runner = by_first[seg.nodes[k]]
                if tuple(unit.nodes) != tuple(seg.nodes[k : k + len(unit.nodes)]) or unit.inputs[0].node != prev:
                    raise BundleError(
                        f"{unit.name} computes {list(unit.nodes)} from {unit.inputs[0].node or 'image'}; leaf "
                        f"{seg.leaf} needs {list(seg.nodes[k:])} from {prev or 'image'}"
                    )
                dsts = tuple(self._logits_slot if t.name == "logits" else slot[t.node] for t in unit.outputs)
                calls.append((runner.run_impl, slot[prev], dsts))
                prev, k = unit.nodes[-1], k + len(unit.nodes)
            if calls[-1][2][-1] != self._logits_slot:
                raise BundleError(f"leaf {seg.leaf}: the last model file of its chain does not output logits last")
            programs.append(tuple(calls))
            if seg.leaf == 0 and self._first_runner is not None:  # leaf 0 alone, without the exports
                finals.append((logits_only(self._first_runner.run_logits_impl, slot[None]),))
            else:
                finals.append(tuple(calls[:-1]) + (logits_only(runner.run_logits_impl, calls[-1][1]),))
            done_here = [n for n in tree.path(seg.leaf) if tree.node(n).leaves[-1] == seg.leaf]
            drops.append(tuple(slot[n] for n in done_here) + (self._logits_slot,))
        self._programs = tuple(programs)
        self._finals = tuple(finals)  # same, but the last call returns only the logits (no one reads the exports)
        self._drops = tuple(drops)

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
            self._programs = ()
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

    # -- argument checks (at the boundary) --------------------------------------
    def _stop_at(self, t0: float, budget_ms: float | None, deadline: float | None) -> tuple[float | None, float | None]:
        stop_at = None
        if budget_ms is not None:
            if isinstance(budget_ms, (bool, np.bool_)) or not isinstance(budget_ms, numbers.Real) or not budget_ms > 0 or not math.isfinite(budget_ms):
                raise InputError(f"budget_ms: received {budget_ms!r}; expected a positive finite number of milliseconds")
            stop_at = t0 + float(budget_ms) / 1e3
        if deadline is not None:
            if isinstance(deadline, (bool, np.bool_)) or not isinstance(deadline, numbers.Real) or not math.isfinite(deadline):
                raise InputError(f"deadline: received {deadline!r}; expected an absolute time.perf_counter() value")
            stop_at = float(deadline) if stop_at is None else min(stop_at, float(deadline))
        return stop_at, (None if stop_at is None else (stop_at - t0) * 1e3)

    def _limits(self, max_leaves: int | None, min_leaves: int) -> tuple[int, int]:
        n = self.num_leaves
        n_stop = n if max_leaves is None else _check_count(max_leaves, "max_leaves", 1, n)
        n_min = _check_count(min_leaves, "min_leaves", 0, n)
        if n_min > n_stop:
            raise InputError(f"min_leaves: received {n_min} with max_leaves={n_stop}; expected min_leaves <= max_leaves")
        return n_stop, n_min

    # -- inference -------------------------------------------------------------
    def preprocess(self, images: Any) -> np.ndarray:
        """uint8 HWC / NHWC images (or a list) -> normalised NCHW input (manifest mean/std)."""
        return preprocess(images, self.input_spec)

    def start(self, x: np.ndarray) -> AnytimeSession:
        """Check ``x`` and open a session (no leaf evaluated yet) that owns a copy of ``x``."""
        self._acquire()
        try:
            checked = check_input(x, self.input_spec)
            handle = self._upload(checked)
            if isinstance(handle, np.ndarray) and np.may_share_memory(handle, x):
                handle = handle.copy()  # the session outlives this call: the caller may reuse x (a camera buffer)
            return AnytimeSession(self, handle, checked.shape[0])
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
            budget_ms: time budget from this call's entry; a leaf starts only if its
                predicted cost fits in the time left.
            deadline: absolute ``time.perf_counter()`` value; with ``budget_ms`` the earlier wins.
            max_leaves: stop after this many leaves (default: all).
            min_leaves: always evaluate at least this many (>= 1), budget or not.
            stop_when: e.g. ``Agreement(...)``; called between leaves with the leaf logits so far.
        """
        clock = self._clock
        t0 = clock()
        stop_at, budget = self._stop_at(t0, budget_ms, deadline)
        n_stop, n_min = self._limits(max_leaves, min_leaves)
        if n_min < 1:
            raise InputError(f"min_leaves: received {min_leaves}; expected >= 1 (a result needs a leaf)")
        self._acquire()
        try:
            x = check_input(x, self.input_spec)
            session = AnytimeSession(self, self._upload(x), x.shape[0])
            reason, t_forced = session._advance(stop_at, n_stop, n_min, stop_when, final=True)
            session._cache = None
            t1 = clock()
        finally:
            self._release()
        return AnytimeResult(
            leaf_logits=session._leaf_logits[: session._next],
            elapsed_ms=(t1 - t0) * 1e3,
            met_budget=stop_at is None or t1 <= stop_at,
            overran_min_leaves=stop_at is not None and t_forced > stop_at,
            budget_ms=budget,
            stopped_by=reason,
            class_names=self.class_names,
            leaf_ms=[t * 1e3 for t in session._leaf_s[: session._next]],
        )

    __call__ = run

    # -- cost model --------------------------------------------------------------
    def predicted_ms(self, batch: int = 1) -> list[float]:
        """The cost model's current per-leaf predictions (ms) for ``batch``."""
        return [p * 1e3 for p in self.cost.predict(batch)]

    def profile(
        self,
        batch_sizes: Sequence[int] = (1,),
        warmup: int = 10,
        repeats: int = 50,
        save: bool = True,
        seed: int = 0,
    ) -> Profile:
        """Measure every leaf step and unit on this device (median/p90/p95 after warm-up); use and save it.

        Saves to ``<bundle>/profiles/<device>-<backend>-<plan>-<precision>.json``
        (or the user cache if the bundle is read-only; ``self.profile_path`` says where).
        """
        lo, _, hi = self.input_spec.batch
        sizes = [_check_count(b, "batch_sizes[]", lo, hi) for b in batch_sizes]
        if not sizes:
            raise InputError("batch_sizes: received an empty list; expected at least one batch size")
        _check_count(repeats, "repeats", 1, 10**6)
        _check_count(warmup, "warmup", 0, 10**6)
        rng = np.random.default_rng(seed)
        spec = self.input_spec
        batches: dict[int, dict[str, Any]] = {}
        self._acquire()
        try:
            for b in sizes:
                x = rng.standard_normal((b, spec.channels, *spec.spatial)).astype(spec.dtype)
                leaf_t = [[] for _ in range(self.num_leaves)]
                unit_t: dict[str, list[float]] = {r.name: [] for r in self._runners}
                for rep in range(warmup + repeats):
                    times = self._profile_once(AnytimeSession(self, self._upload(x), b), unit_t if rep >= warmup else None)
                    if rep >= warmup:
                        for i, t in enumerate(times):
                            leaf_t[i].append(t)
                levels = np.cumsum(np.asarray(leaf_t), axis=0)  # (N, repeats)
                batches[b] = {
                    "warmup": warmup,
                    "repeats": repeats,
                    "leaves": [
                        {"leaf": i, **summarize(t), "samples_ms": [round(v * 1e3, 5) for v in t]}
                        for i, t in enumerate(leaf_t)
                    ],
                    "units": {name: summarize(t) for name, t in unit_t.items()},
                    "levels": [{"n": n + 1, **summarize(levels[n])} for n in range(self.num_leaves)],
                }
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
            backend_info=self.backend.describe(),
            host=host_info(),
        )
        if self.profile_data is not None:  # keep other batch sizes of the loaded profile
            for b, v in self.profile_data.batches.items():
                profile.batches.setdefault(b, v)
        if save:
            self.profile_path, fell_back = save_profile(profile, self.bundle_dir)
            self.profile_status = f"saved {self.profile_path}" + (" (bundle dir not writable)" if fell_back else "")
        self.profile_data = profile
        self.cost = CostModel(self.leaf_macs, profile, quantile=self.quantile)
        return profile

    def _profile_once(self, session: AnytimeSession, unit_t: dict[str, list[float]] | None) -> list[float]:
        """All leaves of one session, timing each leaf step and (synchronized) each unit.

        Leaf steps are host wall time up to the logits on the host (``to_host`` blocks), which is what
        a deadline sees. Units are timed by ``backend.timed_run`` when the backend has one (GPU
        backends: CUDA events on their stream), else by the clock around the unit and ``synchronize()``.
        """
        clock, sync = self._clock, self.backend.synchronize
        timed = getattr(self.backend, "timed_run", None) if unit_t is not None else None
        cache, out = session._cache, session._leaf_logits
        names = {r.run_impl: r.name for r in self._runners} if unit_t is not None else None
        times = []
        for i in range(self.num_leaves):
            t_leaf = clock()
            for run_impl, src, dsts in self._programs[i]:
                if timed is not None:
                    outs, dt = timed(run_impl, (cache[src],))
                    unit_t[names[run_impl]].append(dt)
                else:
                    t0 = clock()
                    outs = run_impl((cache[src],))
                    sync()
                    if unit_t is not None:
                        unit_t[names[run_impl]].append(clock() - t0)
                for d, o in zip(dsts, outs):
                    cache[d] = o
            out[i] = self._to_host(cache[self._logits_slot])
            for d in self._drops[i]:
                cache[d] = None
            times.append(clock() - t_leaf)
        return times
