"""The manifest's schema: the dataclasses a runtime reads (:class:`Manifest`, :class:`ModelFile`,
:class:`InputSpec`, :class:`TensorSpec`) and the strict reader they are read with.

The strict reader (:func:`parse_json`, ``_take``, ``_typed``, ``_choice``, ``_count``): every error names the
location, what was received and what was expected; unknown and missing keys, NaN, duplicate keys and
out-of-bounds numbers are errors. Reading a manifest checks that the tree and the files agree (every node or
leaf covered exactly once per plan, :meth:`Manifest._check_coverage`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import BundleError, InputError, short_repr
from ..limits import MAX_BATCH, MAX_COUNT, check_model_size
from ..tree import TreeSpec
from .vocabulary import (
    BOTH,
    DTYPES,
    EXPORT_PLANS,
    FIRST,
    FIRST_HOSTS,
    FORMATS,
    FUSED,
    ITEMSIZE,
    NODES,
    PLAN_TABLE,
    PLANS,
    PRECISIONS,
    SEGMENTS,
    SUBTREES,
    WEIGHTS,
    activation_name,
    variant_label,
)

__all__ = [
    "SCHEMA_VERSION",
    "TensorSpec",
    "InputSpec",
    "ModelFile",
    "Manifest",
    "batch_range_ok",
    "normalisation_overflow",
    "parse_json",
]

SCHEMA_VERSION = 1


def batch_range_ok(batch: Any) -> bool:
    """The one rule for a bundle's batch range ``(min, opt, max)``: ints with ``1 <= min <= opt <= max <=``
    :data:`~hne_edge.limits.MAX_BATCH` (what ``export`` accepts and what :func:`read_manifest` accepts)."""
    return (
        isinstance(batch, (tuple, list)) and len(batch) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in batch)
        and 1 <= batch[0] <= batch[1] <= batch[2] <= MAX_BATCH
    )  # fmt: skip


# -- strict dict reading ---------------------------------------------------------------------------


def _take(data: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    """Check ``data`` is a dict with exactly the required keys (plus optional ones)."""
    if not isinstance(data, dict):
        raise BundleError(f"manifest: {where} must be an object; received {type(data).__name__}")
    missing = sorted(required - set(data))
    if missing:
        raise BundleError(f"manifest: {where} is missing key(s) {missing}")
    extra = sorted(set(data) - required - optional)
    if extra:
        raise BundleError(
            f"manifest: {where} has unknown key(s) {short_repr(extra)}; expected only {sorted(required | optional)}"
        )
    return data


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """``value`` when it is of ``kind`` and within the schema's bounds: a number finite and at most
    :data:`~hne_edge.limits.MAX_COUNT` in magnitude, a string UTF-8 text without NUL (it may name a file)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool and bool not in tuple(kind if isinstance(kind, tuple) else ())):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BundleError(f"manifest: {where} must be {expected}; received {short_repr(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BundleError(f"manifest: {where} must be a finite number; received {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not -MAX_COUNT <= value <= MAX_COUNT:
        raise BundleError(f"manifest: {where} must be a number within +-2**50 (|value| <= 2**50); "
                          f"received {short_repr(value)}")  # fmt: skip
    if isinstance(value, str):
        if "\x00" in value:
            raise BundleError(f"manifest: {where} holds a NUL character; expected text without one; received {short_repr(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BundleError(f"manifest: {where} is not UTF-8 text (a lone surrogate); received {short_repr(value)}") from None
    return value


def _count(value: Any, where: str) -> int:
    """A non-negative int (sizes, MACs), at most :data:`~hne_edge.limits.MAX_COUNT`."""
    if not 0 <= _typed(value, int, where) <= MAX_COUNT:
        raise BundleError(f"manifest: {where} must be an int in 0..2**50; received {short_repr(value)}")
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise BundleError(f"manifest: {where} must be one of {list(choices)}; received {short_repr(value)}")
    return value


def _shape(value: Any, where: str) -> tuple[int | str, ...]:
    _typed(value, list, where)
    for dim in value:
        if isinstance(dim, str):
            _typed(dim, str, f"{where} dims")
        elif not (isinstance(dim, int) and not isinstance(dim, bool) and 0 < dim <= MAX_COUNT):
            raise BundleError(f"manifest: {where} dims must be positive ints (at most 2**50) or symbolic names; "
                              f"received {short_repr(value)}")  # fmt: skip
    return tuple(value)


# -- strict JSON ---------------------------------------------------------------------------------------


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise BundleError(f"duplicate key {short_repr(dup)} in one JSON object; expected each key once")
    return out


def _no_constant(name: str) -> Any:
    raise BundleError(f"{name} is not a JSON number; expected finite numbers only")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a valid JSON literal that json reads as inf
        raise BundleError(f"{short_repr(text)} is not a finite JSON number (it overflows a float); expected finite numbers only")
    return value


def _short_int(text: str) -> int:
    if len(text) > 4000:  # int() refuses 4300+ digits (ValueError); the schema's own fields say where, within that
        raise BundleError(f"an integer of {len(text.lstrip('-'))} digits is not a number a bundle holds; expected "
                          "integers within +-2**50")  # fmt: skip
    return int(text)


def parse_json(data: bytes, where: str, expected: str = "a manifest") -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity (nor literals that overflow to them), no integers of
    thousands of digits, bounded nesting; errors are BundleError (``expected``: what the file should be, for the
    nesting error; a manifest, a saved profile, an accuracy record all read JSON through this)."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                          parse_float=_finite_float, parse_int=_short_int)  # fmt: skip
    except BundleError as exc:
        raise BundleError(f"{where}: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise BundleError(f"{where}: not valid JSON ({short_repr(str(exc))})") from None
    except RecursionError:
        raise BundleError(f"{where}: JSON nested too deeply; expected {expected}") from None


# -- schema ----------------------------------------------------------------------------------------


_FLOAT32_MAX = float.fromhex("0x1.fffffep+127")  # 3.4e38
_FLOAT32_TINY = 2.0**-126  # the smallest positive normal float32, 1.2e-38
_FLOAT16_MAX = 65504.0


def _check_normalisation(mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """Every std a positive normal float32 and every pixel in [0, 1] normalised to a finite float32: the runtime
    computes ``(pixel - mean) * (1 / std)`` in float32 (``preprocess``), so ``std = 1e-300`` made every finite
    image inf, and the user's input was then blamed as non-finite."""
    for i, (m, s) in enumerate(zip(mean, std)):
        if not _FLOAT32_TINY <= s <= _FLOAT32_MAX:
            raise BundleError(f"manifest: input.std[{i}] = {s!r} is not a positive normal float32 ({_FLOAT32_TINY:.3g} "
                              f"to {_FLOAT32_MAX:.3g}), which the runtime normalises with; expected a pixel std such "
                              "as 0.25")  # fmt: skip
    problem = normalisation_overflow(mean, std, fp16=False, where="input.")
    if problem:
        raise BundleError(f"manifest: {problem}")


def normalisation_overflow(mean, std, fp16: bool, where: str) -> str | None:
    """Why a pixel in [0, 1] normalised by ``mean`` / ``std`` (named ``where``: "input.", "normalization.") is not a
    finite number of the type the files read - float32, or float16 (largest 65504) where ``fp16`` files read the
    image: a finite image made inf, then blamed as non-finite - or None. The one home of this rule: the manifest's
    reader and the exporter ask it."""
    top, kind = (_FLOAT16_MAX, "float16 (its fp16 files read the image so)") if fp16 else (_FLOAT32_MAX, "float32")
    for i, (m, s) in enumerate(zip(mean, std)):
        if max(abs(m), abs(1 - m)) / s > top:
            return (f"{where}mean[{i}] = {m!r} with {where}std[{i}] = {s!r} normalises a pixel in [0, 1] beyond {kind}'s "
                    f"largest value ({top:.6g}); expected a pixel mean and std such as 0.5 and 0.25")  # fmt: skip
    return None


def _check_model_config(config: dict, num_classes: int, shape: tuple[int | str, ...]) -> None:
    """The model sizes ``model.config`` states (a torch runner builds the model from it; those it does not state
    are not checked): within :func:`~hne_edge.limits.check_model_size`'s bounds, and what the manifest's own
    fields say (the class names, the image's channels and side)."""
    try:
        check_model_size(config, "manifest: model.config.")
    except InputError as exc:
        raise BundleError(str(exc)) from None
    _, c, h, w = shape
    for key, ok, found in (("num_classes", config.get("num_classes") == num_classes, f"model.class_names has {num_classes} classes"),
                           ("in_chans", config.get("in_chans") == c, f"input.shape has {c} channels"),
                           ("input_size", config.get("input_size") == h == w, f"input.shape is {h}x{w}")):  # fmt: skip
        if key in config and not ok:
            raise BundleError(f"manifest: model.config.{key} is {config[key]}; {found}; expected them to agree")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model file."""

    name: str
    node: str | None  # the tree node whose activation/logits this is; None: the image
    dtype: str
    shape: tuple[int | str, ...]  # symbolic batch dim first, e.g. ("batch", 64, 32, 32)

    def to_dict(self) -> dict:
        return {"name": self.name, "node": self.node, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "TensorSpec":
        d = _take(data, where, {"name", "node", "dtype", "shape"})
        return cls(
            name=_typed(d["name"], str, f"{where}.name"),
            node=_typed(d["node"], (str, type(None)), f"{where}.node"),
            dtype=_choice(d["dtype"], DTYPES, f"{where}.dtype"),
            shape=_shape(d["shape"], f"{where}.shape"),
        )


@dataclass(frozen=True)
class InputSpec:
    """What the bundle expects from the application: a normalised NCHW float tensor."""

    name: str
    shape: tuple[int | str, ...]  # ("batch", C, H, W)
    dtype: str
    layout: str
    mean: tuple[float, ...]  # per channel, on [0, 1] pixel values: x = (pixel/255 - mean) / std
    std: tuple[float, ...]
    batch: tuple[int, int, int]  # (min, opt, max) batch sizes the model files were built/verified for

    @property
    def channels(self) -> int:
        return int(self.shape[1])

    @property
    def spatial(self) -> tuple[int, int]:
        return int(self.shape[2]), int(self.shape[3])

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "layout": self.layout,
            "mean": list(self.mean),
            "std": list(self.std),
            "batch": list(self.batch),
        }

    @classmethod
    def from_dict(cls, data: Any) -> "InputSpec":
        d = _take(data, "input", {"name", "shape", "dtype", "layout", "mean", "std", "batch"})
        shape = _shape(d["shape"], "input.shape")
        if len(shape) != 4 or not all(isinstance(v, int) for v in shape[1:]):
            raise BundleError(f"manifest: input.shape must be [batch, C, H, W] with fixed C, H, W; received {list(shape)}")
        _choice(d["layout"], ("NCHW",), "input.layout")
        mean = tuple(_typed(v, (int, float), "input.mean[]") for v in _typed(d["mean"], list, "input.mean"))
        std = tuple(_typed(v, (int, float), "input.std[]") for v in _typed(d["std"], list, "input.std"))
        if len(mean) != shape[1] or len(std) != shape[1] or any(s <= 0 for s in std):
            raise BundleError(
                f"manifest: input.mean/std need {shape[1]} values (std > 0); received mean={list(mean)} std={list(std)}"
            )
        _check_normalisation(mean, std)
        batch = tuple(_typed(v, int, "input.batch[]") for v in _typed(d["batch"], list, "input.batch"))
        if not batch_range_ok(batch):
            raise BundleError(
                f"manifest: input.batch must be [min, opt, max] with 1 <= min <= opt <= max <= {MAX_BATCH}; "
                f"received {short_repr(list(batch))}"
            )
        return cls(
            name=_typed(d["name"], str, "input.name"),
            shape=shape,
            dtype=_choice(d["dtype"], DTYPES, "input.dtype"),
            layout=d["layout"],
            mean=mean,
            std=std,
            batch=batch,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class ModelFile:
    """One model file of the bundle: a node (plan "nodes"), a leaf's chain (plan "segments"), a subtree unit
    (plan "subtrees") or the whole tree (plan "fused")."""

    path: str  # relative to the bundle directory, POSIX separators
    format: str  # onnx | tensorrt | torch
    plan: str  # nodes | segments | subtrees | fused | first (onnx, tensorrt) | weights (torch)
    precision: str  # fp32 | fp16
    sha256: str
    bytes: int
    nodes: tuple[str, ...]  # tree nodes computed by this file, root side first
    # depth-first position of the (first) leaf whose logits it outputs; None for inner nodes. A file of
    # several leaves outputs a (batch, leaves, classes) logits tensor: which leaves, the tree spec says.
    leaf: int | None
    macs: int  # per sample
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int | None = None  # ONNX opset (onnx files, and the ONNX an engine was built from)
    source: str | None = None  # engines: path of the ONNX file they were built from
    build: dict | None = None  # engines: tensorrt_version, gpu, compute_capability, flags, batch profile

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "plan": self.plan,
            "precision": self.precision,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "nodes": list(self.nodes),
            "leaf": self.leaf,
            "macs": self.macs,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "opset": self.opset,
            "source": self.source,
            "build": self.build,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "ModelFile":
        d = _take(
            data,
            where,
            {"path", "format", "plan", "precision", "sha256", "bytes", "nodes", "leaf", "macs", "inputs", "outputs"},
            {"opset", "source", "build"},
        )
        sha = _typed(d["sha256"], str, f"{where}.sha256")
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise BundleError(f"manifest: {where}.sha256 must be 64 lowercase hex digits; received {sha!r}")
        nodes = tuple(_typed(v, str, f"{where}.nodes[]") for v in _typed(d["nodes"], list, f"{where}.nodes"))
        if not nodes:
            raise BundleError(f"manifest: {where}.nodes must list at least one node")
        return cls(
            path=_typed(d["path"], str, f"{where}.path"),
            format=_choice(d["format"], FORMATS, f"{where}.format"),
            plan=_choice(d["plan"], PLANS, f"{where}.plan"),
            precision=_choice(d["precision"], PRECISIONS, f"{where}.precision"),
            sha256=sha,
            bytes=_count(d["bytes"], f"{where}.bytes"),
            nodes=nodes,
            leaf=_typed(d["leaf"], (int, type(None)), f"{where}.leaf"),
            macs=_count(d["macs"], f"{where}.macs"),
            inputs=tuple(
                TensorSpec.from_dict(t, f"{where}.inputs[{i}]")
                for i, t in enumerate(_typed(d["inputs"], list, f"{where}.inputs"))
            ),
            outputs=tuple(
                TensorSpec.from_dict(t, f"{where}.outputs[{i}]")
                for i, t in enumerate(_typed(d["outputs"], list, f"{where}.outputs"))
            ),
            opset=_typed(d.get("opset"), (int, type(None)), f"{where}.opset"),
            source=_typed(d.get("source"), (str, type(None)), f"{where}.source"),
            build=_typed(d.get("build"), (dict, type(None)), f"{where}.build"),
        )


@dataclass(frozen=True)
class Manifest:
    """Everything a runtime needs to know about a bundle."""

    model_name: str
    model_config: dict  # HNEConfig.to_dict(): lets tools with torch rebuild the architecture
    class_names: tuple[str, ...]
    input: InputSpec
    tree: TreeSpec
    node_macs: dict[str, int]  # per node, per sample
    files: tuple[ModelFile, ...]
    provenance: dict
    schema_version: int = SCHEMA_VERSION

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def variants(self) -> list[tuple[str, str, str]]:
        """The (format, plan, precision) combinations present, in a stable order."""
        seen = {(f.format, f.plan, f.precision) for f in self.files}
        return sorted(seen, key=lambda v: (FORMATS.index(v[0]), PLANS.index(v[1]), PRECISIONS.index(v[2])))

    def files_for(self, plan: str, precision: str = "fp32", format: str = "onnx") -> list[ModelFile]:
        """The model files of one plan, in execution order (nodes: breadth-first; segments: by leaf)."""
        chosen = [f for f in self.files if (f.format, f.plan, f.precision) == (format, plan, precision)]
        if not chosen:
            raise self._missing(format, plan, precision)
        if plan == NODES:
            order = {n.id: i for i, n in enumerate(self.tree.nodes)}
            return sorted(chosen, key=lambda f: order[f.nodes[0]])
        if plan == WEIGHTS:
            return chosen
        return sorted(chosen, key=lambda f: f.leaf)

    def _missing(self, format: str, plan: str, precision: str) -> BundleError:
        """A variant this bundle lacks: what it has, and the export that adds the variant and keeps the others."""
        has = self.variants()
        message = (f"bundle has no {variant_label(format, plan, precision)} model files; it has "
                   f"{', '.join(variant_label(*v) for v in has) or 'none'}")  # fmt: skip
        if format == "tensorrt":  # engines are built from the bundle's own ONNX files, on the target GPU
            fix = f"build them on the target GPU: hne-edge export BUNDLE --format tensorrt --plan {plan} --precision {precision}"
            return BundleError(message, hint="build them on the target GPU (hne_edge.exporters.tensorrt.build_engines)", cli_hint=fix)
        # what export --plan writes (the others by default, unless a flag leaves them out)
        plans = [p for p in EXPORT_PLANS if p == plan or any(v[1] == p for v in has)] or [BOTH]
        precisions = [q for q in PRECISIONS if q == precision or any(v[2] == q for v in has)]
        ckpt = self.provenance.get("checkpoint") if isinstance(self.provenance.get("checkpoint"), str) else "CHECKPOINT"
        flag = PLAN_TABLE[plan].omitted_by if plan in PLAN_TABLE else None
        also = f" (without {flag})" if flag else ""
        return BundleError(
            message,
            hint=f"export it again with it: hne_edge.exporters.export_checkpoint({ckpt!r}, BUNDLE, plan={','.join(plans)!r}, "
                 f"precisions={tuple(precisions)!r}, force=True)",
            cli_hint=f"export it again with it: hne-edge export {ckpt} --out BUNDLE --plan {','.join(plans)} "
                     f"--precision {','.join(precisions)} --force{also}",
        )  # fmt: skip

    def sample_bytes(self, plan: str, precision: str) -> int:
        """Bytes per sample of the image and of every tensor the files of ``plan`` / ``precision`` output.

        A pass over the whole tree holds at most these (the activations it exports and the leaves'
        logits), plus the backend's own scratch: what :class:`~hne_edge.runtime.AnytimeRunner`'s warm-up
        checks against the machine's memory. The files of the first format that has the variant are read.
        """
        image = math.prod(self.input.shape[1:]) * ITEMSIZE[self.input.dtype]
        for fmt in FORMATS:
            files = [f for f in self.files if (f.format, f.plan, f.precision) == (fmt, plan, precision)]
            if files:
                return image + sum(
                    math.prod(d for d in t.shape[1:] if isinstance(d, int)) * ITEMSIZE[t.dtype]
                    for f in files for t in f.outputs
                )  # fmt: skip
        return image

    def prefix_macs(self) -> list[int]:
        """MACs of the first n leaves (shared nodes once), n = 1..N."""
        out, total = [], 0
        for seg in self.tree.segments:
            total += sum(self.node_macs[n] for n in seg.nodes)
            out.append(total)
        return out

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "model": {"name": self.model_name, "config": self.model_config, "class_names": list(self.class_names)},
            "input": self.input.to_dict(),
            "tree": {
                "branching": list(self.tree.branching),
                "leaf_order": list(self.tree.leaf_order),
                "nodes": [
                    {
                        "id": n.id,
                        "parent": n.parent,
                        "children": list(n.children),
                        "depth": n.depth,
                        "macs": self.node_macs[n.id],
                    }
                    for n in self.tree.nodes
                ],
            },
            "files": [f.to_dict() for f in self.files],
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Manifest":
        d = _take(data, "manifest", {"schema_version", "model", "input", "tree", "files", "provenance"})
        version = d["schema_version"]
        if type(version) is not int or version != SCHEMA_VERSION:
            raise BundleError(
                f"manifest: schema_version {short_repr(version)} is not supported by this hne-edge (reads {SCHEMA_VERSION}); "
                "re-export the bundle or upgrade hne-edge"
            )
        model = _take(d["model"], "model", {"name", "config", "class_names"})
        class_names = tuple(_typed(c, str, "model.class_names[]") for c in _typed(model["class_names"], list, "model.class_names"))
        input_spec = InputSpec.from_dict(d["input"])
        tree_d = _take(d["tree"], "tree", {"branching", "leaf_order", "nodes"})
        try:
            tree = TreeSpec(tuple(_typed(tree_d["branching"], list, "tree.branching")))
        except ValueError as exc:
            raise BundleError(f"manifest: tree.branching: {exc}") from None
        if _typed(tree_d["leaf_order"], list, "tree.leaf_order") != list(tree.leaf_order):
            raise BundleError(
                f"manifest: tree.leaf_order {short_repr(tree_d['leaf_order'])} does not match the depth-first order of "
                f"branching {list(tree.branching)}: expected {short_repr(list(tree.leaf_order))}"
            )
        node_macs: dict[str, int] = {}
        nodes_list = _typed(tree_d["nodes"], list, "tree.nodes")
        for i, nd in enumerate(nodes_list):
            nd = _take(nd, f"tree.nodes[{i}]", {"id", "parent", "children", "depth", "macs"})
            nid = _typed(nd["id"], str, f"tree.nodes[{i}].id")
            try:
                ref = tree.node(nid)
            except KeyError:
                raise BundleError(f"manifest: tree.nodes[{i}].id {short_repr(nid)} is not a node of branching {list(tree.branching)}") from None
            if nd["parent"] != ref.parent or nd["children"] != list(ref.children) or type(nd["depth"]) is not int or nd["depth"] != ref.depth:
                raise BundleError(f"manifest: tree.nodes[{i}] ({nid}) parent/children/depth disagree with the branching")
            node_macs[nid] = _count(nd["macs"], f"tree.nodes[{i}].macs")
        if set(node_macs) != {n.id for n in tree.nodes} or len(nodes_list) != len(tree.nodes):
            raise BundleError(f"manifest: tree.nodes must list each of the {len(tree.nodes)} nodes exactly once")
        if len(class_names) < 2:
            raise BundleError(f"manifest: model.class_names needs at least 2 classes; received {list(class_names)}")
        if len(set(class_names)) != len(class_names):
            raise BundleError(f"manifest: model.class_names has duplicates; received {short_repr(list(class_names))}")
        model_config = _typed(model["config"], dict, "model.config")
        _check_model_config(model_config, len(class_names), input_spec.shape)
        files = tuple(ModelFile.from_dict(f, f"files[{i}]") for i, f in enumerate(_typed(d["files"], list, "files")))
        if any(f.precision == "fp16" for f in files):  # the image is cast to float16 for them
            problem = normalisation_overflow(input_spec.mean, input_spec.std, fp16=True, where="input.")
            if problem:
                raise BundleError(f"manifest: {problem}")
        manifest = cls(
            model_name=_typed(model["name"], str, "model.name"),
            model_config=model_config,
            class_names=class_names,
            input=input_spec,
            tree=tree,
            node_macs=node_macs,
            files=files,
            provenance=_typed(d["provenance"], dict, "provenance"),
            schema_version=version,
        )
        manifest._check_coverage()
        return manifest

    def _check_coverage(self) -> None:
        """Each plan must cover the tree exactly as the tree spec says."""
        if not self.files:
            raise BundleError("manifest: files is empty; a bundle needs at least one plan")
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise BundleError("manifest: files lists the same path more than once")
        variants = self.variants()
        # the model files' (the torch weights, run in float32 whatever was exported, state their own)
        images = sorted({t.dtype for f in self.files if f.plan != WEIGHTS for t in f.inputs if t.node is None})
        wanted = ("float32" if "float32" in images else images[0]) if images else self.input.dtype
        if self.input.dtype != wanted:
            raise BundleError(f"manifest: input.dtype {self.input.dtype}; its files read the image as {images}: expected "
                              f"{wanted} (what preprocess returns)")  # fmt: skip
        for f in self.files:  # the runtime fills a (leaves, batch, classes) array with every file's logits
            for t in f.outputs:
                if t.name == "logits" and (not t.shape or t.shape[-1] != self.num_classes):
                    raise BundleError(
                        f"manifest: {f.path} outputs logits of shape {list(t.shape)}; model.class_names has "
                        f"{self.num_classes} classes, so the last dim must be {self.num_classes}"
                    )
            for t in f.inputs:
                if t.node is None and tuple(t.shape[1:]) != self.input.shape[1:]:
                    raise BundleError(
                        f"manifest: {f.path} reads image {list(t.shape)}; input.shape is {list(self.input.shape)}"
                    )
        for fmt, plan, precision in variants:
            group = [f for f in self.files if (f.format, f.plan, f.precision) == (fmt, plan, precision)]
            label = variant_label(fmt, plan, precision)
            if plan in (SUBTREES, FUSED):
                self._check_units(plan, label, group)
            if (fmt == "torch") != (plan == WEIGHTS):
                raise BundleError(f"manifest: {label}: plan 'weights' is for format 'torch' only, and torch files use it")
            if plan == WEIGHTS:
                if len(group) != 1 or sorted(group[0].nodes) != sorted(n.id for n in self.tree.nodes):
                    raise BundleError(f"manifest: {label} must be one file covering every tree node")
                continue
            if plan == FIRST:
                first = self.tree.segments[0]
                if len(group) != 1 or group[0].leaf != 0 or tuple(group[0].nodes) != first.nodes:
                    raise BundleError(
                        f"manifest: {label} must be one file computing leaf 0's chain {list(first.nodes)}; received "
                        f"{[(f.path, list(f.nodes), f.leaf) for f in group]}"
                    )
                if [o.name for o in group[0].outputs] != ["logits"]:
                    raise BundleError(f"manifest: {group[0].path} outputs {[o.name for o in group[0].outputs]}; expected ['logits']")
                if not any((fmt, p, precision) in variants for p in FIRST_HOSTS):
                    raise BundleError(f"manifest: {label} is an add-on to a full plan; expected "
                                      f"{' or '.join(variant_label(fmt, p, precision) for p in FIRST_HOSTS)} beside it")  # fmt: skip
            elif plan in (SUBTREES, FUSED):
                pass  # _check_units above
            elif plan == NODES:
                got = sorted(n for f in group for n in f.nodes)
                if any(len(f.nodes) != 1 for f in group) or got != sorted(n.id for n in self.tree.nodes):
                    raise BundleError(f"manifest: {label} must have exactly one file per tree node")
            else:
                leafless = next((f for f in group if f.leaf is None), None)  # an inner node file's; sorted() below
                if leafless is not None:
                    raise BundleError(f"manifest: files[{self.files.index(leafless)}] ({leafless.path}) has leaf None; "
                                      f"expected the leaf its chain ends at, 0..{self.tree.num_leaves - 1}")
                by_leaf = {f.leaf: f for f in group}
                if sorted(by_leaf) != list(range(self.tree.num_leaves)) or len(group) != self.tree.num_leaves:
                    raise BundleError(f"manifest: {label} must have exactly one file per leaf 0..{self.tree.num_leaves - 1}")
                for seg in self.tree.segments:
                    f = by_leaf[seg.leaf]
                    if tuple(f.nodes) != seg.nodes:
                        raise BundleError(
                            f"manifest: {f.path} computes {list(f.nodes)}; the tree's segment for leaf {seg.leaf} "
                            f"is {list(seg.nodes)}"
                        )
                    wanted = [activation_name(n) for n in seg.exports] + ["logits"]
                    if [o.name for o in f.outputs] != wanted:
                        raise BundleError(f"manifest: {f.path} outputs {[o.name for o in f.outputs]}; expected {wanted}")
            for f in group:
                if plan in (SEGMENTS, NODES, FIRST) or (plan == SUBTREES and f.leaf == 0):  # leaf 0's chain
                    self._check_outputs_name_their_nodes(f)  # the runtime stores each output in its node's slot
                    self._check_one_leafs_logits(f)
                expected_in = self.tree.node(f.nodes[0]).parent
                if len(f.inputs) != 1 or f.inputs[0].node != expected_in:
                    raise BundleError(
                        f"manifest: {f.path} must read exactly one input, {activation_name(expected_in)}; "
                        f"received {[t.name for t in f.inputs]}"
                    )


    def _check_outputs_name_their_nodes(self, f: ModelFile) -> None:
        """A file of nodes, segments or first, or subtrees' leaf 0 chain: each output the activation of a node it
        computes, as act_<node>, and the logits of the leaf it ends at (a node file: its node's one output)."""
        last = self.tree.node(f.nodes[-1])
        for i, t in enumerate(f.outputs):
            if t.name == "logits" and (t.node, i, last.is_leaf) == (last.id, len(f.outputs) - 1, True):
                continue
            if t.name == "logits" or t.node not in f.nodes or t.name != activation_name(t.node):
                raise BundleError(f"manifest: {f.path} outputs {t.name} as node {t.node}; expected the activation "
                                  f"act_<node> of a node it computes ({', '.join(f.nodes)}) or the logits of its "
                                  "last node, a leaf")  # fmt: skip
        if f.plan == NODES and [t.node for t in f.outputs] != [last.id]:
            raise BundleError(f"manifest: {f.path} outputs {[t.name for t in f.outputs]}; expected its node's one "
                              f"output, {'logits' if last.is_leaf else activation_name(last.id)}")  # fmt: skip

    def _check_one_leafs_logits(self, f: ModelFile) -> None:
        """A one-leaf file's logits fill its leaf's ``(batch, classes)`` slot (subtrees/fused units: _check_units)."""
        for t in f.outputs:
            if t.name == "logits" and (len(t.shape) != 2 or t.shape[1] != self.num_classes):
                raise BundleError(f"manifest: {f.path} outputs logits of shape {list(t.shape)}; expected one leaf's "
                                  f"{['batch', self.num_classes]}")

    def _check_units(self, plan: str, label: str, group: list[ModelFile]) -> None:
        """Plan "subtrees": one file per :attr:`TreeSpec.subtree_units` unit; "fused": one file, every node.

        A unit of several leaves outputs one ``logits`` tensor ``(batch, leaves, classes)`` (node: its root,
        None for the whole tree); leaf 0's chain outputs the activations later units read, then its logits.
        """
        tree = self.tree
        if plan == FUSED:
            units = [(tuple(n.id for n in tree.nodes), 0, tree.num_leaves, (), None)]
        else:
            units = [(u.nodes, u.first_leaf, u.num_leaves, u.exports, u.root) for u in tree.subtree_units]
        by_leaf = {f.leaf: f for f in group}
        if len(by_leaf) != len(group) or sorted(by_leaf, key=str) != sorted((u[1] for u in units), key=str):
            raise BundleError(
                f"manifest: {label} must have exactly one file per unit, starting at leaves {[u[1] for u in units]}; "
                f"received {sorted((f.leaf for f in group), key=str)}"
            )
        for nodes, first, count, exports, root in units:
            f = by_leaf[first]
            if tuple(f.nodes) != nodes:
                raise BundleError(f"manifest: {f.path} computes {short_repr(list(f.nodes))}; the tree's {plan} unit "
                                  f"starting at leaf {first} is {short_repr(list(nodes))}")  # fmt: skip
            wanted = [activation_name(n) for n in exports] + ["logits"]
            if [o.name for o in f.outputs] != wanted:
                raise BundleError(f"manifest: {f.path} outputs {[o.name for o in f.outputs]}; expected {wanted}")
            logits = f.outputs[-1]
            several = plan == FUSED or first > 0  # leaf 0's chain is a segment: (batch, classes)
            shape = ("batch", count, self.num_classes) if several else ("batch", self.num_classes)
            if len(logits.shape) != len(shape) or tuple(logits.shape[1:]) != shape[1:] or (several and logits.node != root):
                raise BundleError(
                    f"manifest: {f.path} outputs logits {list(logits.shape)} of node {logits.node}; expected "
                    f"{list(shape)}" + (f" of node {root}" if several else "")
                )

