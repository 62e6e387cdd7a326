"""Bundle verification with ONNX Runtime (CPU): per file, per anytime prefix, per plan.

Without a reference model (``hne-edge verify BUNDLE``): the manifest is
read strictly (schema, paths, sha256, tree coverage), every ONNX file loads
in ONNX Runtime with the inputs/outputs the manifest states, and the
anytime outputs of every plan present ("nodes", "segments", "subtrees",
"fused") agree with the first of them, the export-free
first leaf (plan "first") agrees with their leaf 0, and fp16 agrees with
fp32 when both are present. Every anytime output is computed by
:class:`~hne_edge.runtime.AnytimeRunner` from a float32 image, the path
``hne-edge run`` takes, so a variant the runtime cannot run does not pass.

With the PyTorch model (``--checkpoint``, and always at export): every
file's outputs, fed the reference input activation, are compared with the
PyTorch node/segment outputs, and the end-to-end anytime output for every
n = 1..N, computed by the runtime (only ONNX files, depth-first), is compared
with the fused model's mean of its first n leaves; plans whose calls add
several leaves ("subtrees", "fused") are also run to each of their stops
(``max_leaves=n``, the logits-only last call a frame that ends there makes).
The reference is the unfolded fused model in fp32, independent of what was
exported.

This module imports torch only when a model is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..bundle import (
    ANYTIME_PLANS,
    DTYPE_OF,
    FIRST,
    FUSED,
    PLANS,
    SUBTREES,
    ModelFile,
    bundle_path,
    check_self_contained,
    read_manifest,
)
from ..errors import BundleError, InputError
from ..limits import check_threads
from ..progress import NULL_PROGRESS, Progress
from .base import TOLERANCES, OutputMismatchError, ShapeError, Tolerance, ToleranceError

if TYPE_CHECKING:  # pragma: no cover
    from ..models import HNE

__all__ = [
    "Check",
    "VerifyReport",
    "ort_session",
    "compare_outputs",
    "check_session_io",
    "run_anytime",
    "verify_bundle",
]

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16"}


# -- loaders / runners ------------------------------------------------------------------------------


def ort_session(path: str | os.PathLike, threads: int | None = None, name: str | None = None):
    """An ONNX Runtime CPU session for one file (the loader): its bytes are read once, must be self-contained
    (the runtime's rule) and are what ONNX Runtime loads, so it never follows a path the file names."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a core dependency of the exporters
        from ..errors import BackendUnavailable, install_hint

        raise BackendUnavailable(f"verification needs onnxruntime: {install_hint('onnx')}") from exc
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: errors reach the caller as exceptions
    threads = check_threads(threads or None)
    if threads:
        options.intra_op_num_threads = threads
    name = name or str(path)
    data = Path(path).read_bytes()  # verify_bundle hashed every file when it read the manifest
    check_self_contained(data, name)  # the runtime's rule: never let ONNX Runtime follow external paths
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise BundleError(f"{name}: onnxruntime could not load the model: {exc}") from None


def check_session_io(session, model_file: ModelFile) -> None:
    """The file's graph inputs/outputs must be what the manifest says (names, dtypes, shapes)."""
    for kind, metas, specs in (
        ("input", session.get_inputs(), model_file.inputs),
        ("output", session.get_outputs(), model_file.outputs),
    ):
        got = [m.name for m in metas]
        want = [s.name for s in specs]
        if got != want:
            raise ShapeError(f"{model_file.path}: {kind}s {got}; the manifest expects {want}")
        for meta, s in zip(metas, specs):
            dtype = _ORT_TYPES.get(meta.type, meta.type)
            if dtype != s.dtype:
                raise ShapeError(f"{model_file.path}: {kind} {s.name} | received dtype {dtype}; expected {s.dtype}")
            fixed_got = [d if isinstance(d, int) else None for d in meta.shape]
            fixed_want = [d if isinstance(d, int) else None for d in s.shape]
            if fixed_got != fixed_want:
                raise ShapeError(
                    f"{model_file.path}: {kind} {s.name} | received shape {list(meta.shape)}; expected {list(s.shape)}"
                )


# plans whose calls add several leaves: verified at each stop too (a run that ends there skips the exports)
_STOP_CHECKED = (SUBTREES, FUSED)


def run_anytime(
    bundle_dir: str | os.PathLike,
    plan: str,
    precision: str,
    images: dict[int, np.ndarray],
    threads: int | None = None,
) -> tuple[dict[int, list[np.ndarray]], dict[int, np.ndarray] | None, dict[int, dict[int, np.ndarray]]]:
    """Per-leaf logits of each image batch through :class:`AnytimeRunner`, the path ``hne-edge run`` takes.

    The images are the user's (float32, the manifest's input dtype): the runner's input check, its cast to
    the files' dtype, the backend's sessions and the depth-first activation cache are all exercised, so a
    variant the runtime cannot run cannot pass. Returns ``({batch: [leaf logits (float32), ...]},
    {batch: leaf 0 through the export-free first-leaf file} or None when the variant has none,
    {batch: {n: run(max_leaves=n).logits for every stop n}} for the plans of several leaves per call, else {})``.
    """
    from ..runtime import AnytimeRunner  # the runtime never imports the exporters; this direction is fine

    with AnytimeRunner(bundle_dir, plan=plan, precision=precision, threads=threads, load_profile=False, warmup=0,
                       verify=False) as runner:  # fmt: skip  (the caller read the manifest and checked every sha256)
        chains = {b: list(runner.run(x).leaf_logits) for b, x in images.items()}
        first = {b: runner.run(x, max_leaves=1).logits for b, x in images.items()} if runner.first_leaf_file else None
        stops = {}
        if plan in _STOP_CHECKED:
            stops = {b: {n: runner.run(x, max_leaves=n).logits for n in runner.stops} for b, x in images.items()}
    return chains, first, stops


def anytime_means(per_leaf: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Index n-1: the mean logits of the first n leaves."""
    out, total = [], np.zeros_like(per_leaf[0], dtype=np.float64)
    for n, y in enumerate(per_leaf, start=1):
        total = total + y
        out.append((total / n).astype(np.float32))
    return out


# -- comparisons ------------------------------------------------------------------------------------


@dataclass
class Check:
    """One line of the verification table."""

    file: str
    check: str
    max_abs_diff: float
    bound: float
    ok: bool
    detail: str = ""

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise ToleranceError(self.message())

    def message(self) -> str:
        return (
            f"{self.file} ({self.check}): max abs difference {self.max_abs_diff:.3g} exceeds the bound "
            f"{self.bound:.3g}{'; ' + self.detail if self.detail else ''}"
        )


def compare_outputs(file: str, check: str, got: np.ndarray, ref: np.ndarray, precision: str,
                    tolerance: Tolerance | None = None) -> Check:
    """``max |got - ref|`` against the precision's bound (``tolerance``: another; shape mismatch is a
    :class:`ShapeError`). A per-element tolerance reports the element furthest over (or least under) its own
    bound: its difference and its bound."""
    got = np.asarray(got, dtype=np.float32)
    ref = np.asarray(ref, dtype=np.float32)
    if got.shape != ref.shape:
        raise ShapeError(f"{file} ({check}): received output shape {list(got.shape)}; expected {list(ref.shape)}")
    tolerance = tolerance or TOLERANCES[precision]
    finite_ref = np.isfinite(ref)
    scale = float(np.abs(ref[finite_ref]).max()) if finite_ref.any() else 0.0
    bound = tolerance.bound(scale)
    if not finite_ref.all():  # no bound can say anything: name the cause, not "exceeds the bound nan"
        return Check(file, check, float("inf"), bound, False,
                     "the PyTorch reference itself is not finite (NaN/Inf): check the model's weights and BatchNorm statistics")  # fmt: skip
    if not np.all(np.isfinite(got)):
        return Check(file, check, float("inf"), bound, False, "non-finite values in the output")
    if not got.size:
        return Check(file, check, 0.0, bound, True)
    diff = np.abs(got - ref)
    if tolerance.per_element:
        bounds = tolerance.atol + tolerance.rtol * np.abs(ref)
        k = int((diff - bounds).argmax())
        worst, bound = float(diff.flat[k]), float(bounds.flat[k])
    else:
        k = int(diff.argmax())
        worst = float(diff.flat[k])
    detail = ""
    if worst > bound:
        where = np.unravel_index(k, diff.shape)
        detail = f"at index {list(map(int, where))}: received {got[where]:.6g}, expected {ref[where]:.6g}"
    return Check(file, check, worst, bound, worst <= bound, detail)


def _against_checkpoint(manifest, state: dict) -> list[Check]:
    """The manifest's input normalisation and class names against the checkpoint's: exact (the exporter copies them)."""
    norm = state.get("normalization") or {}
    theirs = np.array([*norm.get("mean", ()), *norm.get("std", ())], np.float64)
    ours = np.array([*manifest.input.mean, *manifest.input.std], np.float64)
    diff = float(np.abs(theirs - ours).max()) if theirs.shape == ours.shape else float("inf")
    checks = [Check("manifest.json", "input mean/std == checkpoint's", diff, 0.0, diff == 0.0,
                    "" if diff == 0.0 else f"manifest mean {list(manifest.input.mean)} std {list(manifest.input.std)}, "
                    f"checkpoint mean {norm.get('mean')} std {norm.get('std')}")]  # fmt: skip
    names, trained = list(manifest.class_names), list(state.get("class_names") or manifest.class_names)
    wrong = sum(a != b for a, b in zip(names, trained)) + abs(len(names) - len(trained))
    first = next((i for i, (a, b) in enumerate(zip(names, trained)) if a != b), None)
    checks.append(Check("manifest.json", "class names == checkpoint's", float(wrong), 0.0, wrong == 0,
                        "" if first is None else f"output {first} is {names[first]!r} here, {trained[first]!r} "
                        "in the checkpoint"))  # fmt: skip
    return checks


def _bound(value: float, name: str) -> float:
    """``atol`` / ``rtol``: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 <= value < float("inf"):
        raise InputError(f"{name}: received {value!r}; expected a finite number >= 0")
    return float(value)


def _merge(checks: list[Check]) -> Check:
    """The worst (relative to its bound) of several comparisons of one file."""
    return max(checks, key=lambda c: (not c.ok, c.max_abs_diff / c.bound if c.bound else c.max_abs_diff))


@dataclass
class VerifyReport:
    """Result of :func:`verify_bundle`: one :class:`Check` per file/prefix/plan comparison."""

    bundle: Path
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def raise_for_failures(self) -> None:
        bad = self.failures
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise ToleranceError(f"bundle verification failed: {bad[0].message()}{more}")

    def format_table(self) -> str:
        width = max([len(c.file) for c in self.checks] + [4])
        cw = max([len(c.check) for c in self.checks] + [5])
        lines = [f"{'file':<{width}}  {'check':<{cw}}  {'max abs diff':>12}  {'bound':>9}  ok"]
        for c in self.checks:
            lines.append(
                f"{c.file:<{width}}  {c.check:<{cw}}  {c.max_abs_diff:>12.3e}  {c.bound:>9.2e}  {'yes' if c.ok else 'NO'}"
            )
        lines += [f"note: {n}" for n in self.notes]
        passed = sum(c.ok for c in self.checks)
        lines.append(f"{passed}/{len(self.checks)} checks passed: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


# -- the verification -------------------------------------------------------------------------------


def verify_bundle(
    bundle_dir: str | os.PathLike,
    *,
    model: "HNE | None" = None,
    batch_sizes: Sequence[int] | None = None,
    seed: int = 0,
    threads: int | None = None,
    node_modules: dict | None = None,
    progress: Progress | None = None,
    inputs: np.ndarray | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    checkpoint: dict | None = None,
) -> VerifyReport:
    """Verify a bundle (see module docstring). Raises BundleError/ShapeError for structural problems;
    numerical results are in the returned report (``report.raise_for_failures()`` to make them errors).

    The inputs are standard-normal images drawn with ``seed`` at ``batch_sizes``, or ``inputs``: the user's own
    batch (the manifest's input layout and dtype, as ``runner.preprocess`` returns it; one batch within the
    bundle's range). ``atol`` / ``rtol`` replace the precisions' bounds (:data:`~.base.TOLERANCES`, ``max |y - ref|
    <= atol + rtol * max |ref|`` per output tensor) with ``|y - ref| <= atol + rtol * |ref|`` for every element,
    as ``numpy.allclose`` and Polygraphy compare; the one not given keeps the precision's value.

    ``checkpoint`` (optional): the model's checkpoint state (``model_from_checkpoint``); the manifest's input
    normalisation and class names are compared with what it records (the manifest is not hashed: an edited one
    would preprocess and label otherwise than the model was trained to).

    ``node_modules`` (optional): ``model.node_modules()`` already computed by the caller, to skip re-slicing.
    ``progress`` counts steps: each file of a variant run through the runtime (which loads and runs them all),
    and with a model each file compared with PyTorch. It starts once the bundle's structure is checked (manifest,
    sha256, every file loaded, the torch weights read): a damaged bundle fails with its error alone.
    """
    bundle_dir = Path(bundle_dir)
    progress = progress or NULL_PROGRESS
    manifest = read_manifest(bundle_dir, verify_files=True)
    report = VerifyReport(bundle_dir)
    given = atol is not None or rtol is not None  # then per element, as numpy.allclose and Polygraphy
    bounds = {q: Tolerance(t.atol if atol is None else _bound(atol, "atol"), t.rtol if rtol is None else _bound(rtol, "rtol"),
                           per_element=given) for q, t in TOLERANCES.items()}  # fmt: skip
    if inputs is not None:
        from ..runtime.inputs import check_input

        if batch_sizes is not None:
            raise InputError("received batch sizes and input images: the images are the one batch verified",
                             hint="pass batch_sizes or inputs, not both", cli_hint="pass --batch-sizes or --frames, not both")
        images_given, top = len(inputs), manifest.input.batch[2]
        inputs = check_input(np.asarray(inputs)[:top], manifest.input)
        batch_sizes = [len(inputs)]
        report.notes.append(f"inputs: the first {top} of the {images_given} given images (one batch: the bundle's "
                            f"largest)" if images_given > top else f"inputs: {images_given} given images (one batch)")  # fmt: skip
    if checkpoint is not None:
        report.checks += _against_checkpoint(manifest, checkpoint)
    if model is not None and model.config.to_dict() != manifest.model_config:
        raise OutputMismatchError(
            f"the reference model ({model.config.name}) is not the architecture of the bundle "
            f"({manifest.model_name}): model configs differ"
        )
    if batch_sizes is None:
        lo, _, hi = manifest.input.batch
        batch_sizes = sorted({lo, max(lo, min(hi, 4))})
    onnx_files = [f for f in manifest.files if f.format == "onnx"]
    variants = [(p, q) for fmt, p, q in manifest.variants() if fmt == "onnx" and p in ANYTIME_PLANS]
    files_of = {v: len(manifest.files_for(*v, "onnx")) for v in variants}
    sessions = {}
    for f in onnx_files:
        sessions[f.path] = ort_session(bundle_path(bundle_dir, f), threads=threads, name=f.path)
        check_session_io(sessions[f.path], f)
    torch_states = {}
    if model is not None:
        from ..train.checkpoint import safe_torch_load

        for f in manifest.files:
            if f.format == "torch":
                # read by path: the manifest's hash of it was checked with the manifest (one sha256 per file)
                torch_states[f.path] = safe_torch_load(bundle_path(bundle_dir, f), f"{f.path} (a torch state_dict)",
                                                       error=BundleError)  # fmt: skip
    progress.restart(sum(files_of.values()) + (len(onnx_files) if model is not None else 0), "verify", "step")
    engines = [f for f in manifest.files if f.format == "tensorrt"]
    if engines:
        report.notes.append(
            f"{len(engines)} TensorRT engine(s) checked for path and sha256 only; run them with the runtime on the target"
        )

    rng = np.random.default_rng(seed)
    # in the bundle's input dtype (float16 for an fp16-only bundle), as a user would feed it; PyTorch gets float32
    if inputs is not None:
        images = {len(inputs): inputs}  # its note said above which images
    else:
        images = {b: rng.standard_normal((b, *manifest.input.shape[1:]), dtype=np.float32).astype(manifest.input.dtype)
                  for b in batch_sizes}  # fmt: skip
        report.notes.append(f"inputs: standard-normal images (seed {seed}) at batch sizes {list(batch_sizes)}")
    if given:
        report.notes.append("bounds: " + "; ".join(f"{q} {t.describe()}" for q, t in bounds.items())
                            + " (the table shows each check's worst element)")
    chains, firsts, stops = {}, {}, {}
    for p, q in sorted(variants, key=lambda v: PLANS.index(v[0])):  # the manifest's order: leaf 0 of "nodes" first
        progress.set(note=f"running onnx/{q}/{p} through the runtime")
        per_batch, first, at_stops = run_anytime(bundle_dir, p, q, images, threads)
        progress.update(files_of[(p, q)])
        chains.update({(p, q, b): leaves for b, leaves in per_batch.items()})
        stops.update({(p, q, b): by_n for b, by_n in at_stops.items()})
        if first is not None:
            firsts.setdefault(q, (p, first))

    if model is not None:
        _verify_against_torch(manifest, bundle_dir, sessions, model, images, chains, stops, report, node_modules,
                              progress, torch_states, bounds)  # fmt: skip

    # plan agreement (no torch needed): every plan must compute what the first one (in the manifest's order) does
    for precision in ("fp32", "fp16"):
        present = sorted((p for p, q in variants if q == precision), key=PLANS.index)
        for plan in present[1:]:
            checks = [
                compare_outputs(f"onnx/{precision}", "", s, n, precision, bounds[precision])
                for b in batch_sizes
                for s, n in zip(
                    anytime_means(chains[(plan, precision, b)]), anytime_means(chains[(present[0], precision, b)])
                )
            ]
            worst = _merge(checks)
            worst.file, worst.check = f"onnx/{precision}/{plan}", f"anytime == {present[0]} plan, n=1..{manifest.tree.num_leaves} (runtime)"
            report.checks.append(worst)
    # the export-free first leaf (what run(max_leaves=1) runs) must compute what the full plan's leaf 0 computes
    for f in manifest.files:
        if f.format == "onnx" and f.plan == FIRST:
            if f.precision not in firsts:
                raise ShapeError(f"{f.path}: a first-leaf file without a nodes or segments plan of {f.precision} to run it with")
            full, first = firsts[f.precision]
            checks = [compare_outputs(f.path, "", first[b], chains[(full, f.precision, b)][0], f.precision, bounds[f.precision])
                      for b in batch_sizes]  # fmt: skip
            worst = _merge(checks)
            worst.check = f"== {full} plan leaf 0 (runtime, max_leaves=1)"
            report.checks.append(worst)
    for plan in sorted(ANYTIME_PLANS, key=PLANS.index):
        if (plan, "fp32") in variants and (plan, "fp16") in variants:
            checks = [
                compare_outputs("", "", h, s, "fp16", bounds["fp16"])
                for b in batch_sizes
                for h, s in zip(anytime_means(chains[(plan, "fp16", b)]), anytime_means(chains[(plan, "fp32", b)]))
            ]
            worst = _merge(checks)
            worst.file, worst.check = f"onnx/fp16/{plan}", f"anytime == fp32 {plan}, n=1..{manifest.tree.num_leaves} (runtime)"
            report.checks.append(worst)
    if not report.checks:
        report.notes.append("no ONNX plan pair to compare and no reference model: only structure and sha256 were checked")
    return report


def _verify_against_torch(manifest, bundle_dir, sessions, model, images, chains, stops, report, node_modules=None,
                          progress: Progress = NULL_PROGRESS, torch_states: dict | None = None,
                          bounds: dict[str, Tolerance] | None = None) -> None:  # fmt: skip
    bounds = bounds or TOLERANCES
    import torch

    model = model.eval()
    tree = manifest.tree
    refs: dict[int, dict[str | None, np.ndarray]] = {}
    fused_means: dict[int, list[np.ndarray]] = {}
    with torch.no_grad():
        nodes = {k: v.eval() for k, v in (node_modules or model.node_modules()).items()}  # unfolded, fp32
        for b, image in images.items():
            image = image.astype(np.float32)
            acts: dict[str | None, torch.Tensor] = {None: torch.from_numpy(image)}
            for node in tree.nodes:  # breadth-first: parents first
                acts[node.id] = nodes[node.id](acts[node.parent])
            refs[b] = {k: v.numpy() for k, v in acts.items()}
            fused = model(torch.from_numpy(image)).numpy()  # (B, N, classes): the independent reference
            fused_means[b] = anytime_means([fused[:, i] for i in range(tree.num_leaves)])

    for f in manifest.files:
        if f.format != "onnx":
            continue
        checks = []
        for b in images:
            feed = refs[b][f.inputs[0].node].astype(DTYPE_OF[f.precision])
            outs = sessions[f.path].run(None, {f.inputs[0].name: feed})
            for spec, got in zip(f.outputs, outs):
                if spec.name == "logits" and len(spec.shape) == 3:  # several leaves: (batch, leaves, classes)
                    under = tree.leaf_order if spec.node is None else [tree.leaf_order[i] for i in tree.node(spec.node).leaves]
                    ref = np.stack([refs[b][leaf] for leaf in under], axis=1)
                else:
                    ref = refs[b][spec.node]
                checks.append(compare_outputs(f.path, spec.name, got, ref, f.precision, bounds[f.precision]))
        worst = _merge(checks)
        worst.check = f"vs torch ({worst.check})"
        report.checks.append(worst)
        progress.update(note=f"compared {f.path} with PyTorch")

    for fmt, plan, precision in manifest.variants():
        if fmt != "onnx" or plan not in ANYTIME_PLANS:
            continue
        checks = [
            compare_outputs(f"onnx/{precision}/{plan}", f"n={n}", got, want, precision, bounds[precision])
            for b in images
            for n, (got, want) in enumerate(zip(anytime_means(chains[(plan, precision, b)]), fused_means[b]), start=1)
        ]
        worst = _merge(checks)
        worst.file, worst.check = f"onnx/{precision}/{plan}", f"anytime vs fused, n=1..{tree.num_leaves} (runtime; worst {worst.check})"
        report.checks.append(worst)
        if (plan, precision, next(iter(images))) in stops:  # each stop as a run that ends there computes it
            checks = [
                compare_outputs(f"onnx/{precision}/{plan}", f"n={n}", got, fused_means[b][n - 1], precision, bounds[precision])
                for b in images
                for n, got in stops[(plan, precision, b)].items()
            ]
            worst = _merge(checks)
            ns = ",".join(str(n) for n in stops[(plan, precision, next(iter(images)))])
            worst.file, worst.check = f"onnx/{precision}/{plan}", f"each stop vs fused, n={ns} (runtime, max_leaves=n; worst {worst.check})"
            report.checks.append(worst)

    for f in manifest.files:
        if f.format == "torch":
            state = (torch_states or {})[f.path]  # read (and its pickle checked) before verify_bundle's progress
            ref = model.state_dict()
            if set(state) != set(ref):
                raise ShapeError(f"{f.path}: state_dict keys differ from the model's: {sorted(set(state) ^ set(ref))[:5]}")
            diff = max(float((state[k].float() - ref[k].float()).abs().max()) if ref[k].numel() else 0.0 for k in ref)
            report.checks.append(Check(f.path, "state_dict == model", diff, 0.0, diff == 0.0))
