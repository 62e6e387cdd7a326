"""The bundle: the on-disk contract between the exporters and every device runtime.

A bundle is a directory::

    bundle/
      manifest.json                 # this module's schema, version SCHEMA_VERSION
      onnx/fp32/nodes/b0.0.onnx     # one file per tree node  (plan "nodes")
      onnx/fp32/segments/leaf00.onnx# one file per leaf chain (plan "segments")
      onnx/fp32/first/leaf00.onnx   # optional: leaf 0's chain with no exports (plan "first")
      onnx/fp32/subtrees/unit00.onnx# leaf 0's chain, then one whole fused subtree per file (plan "subtrees")
      onnx/fp32/fused/tree.onnx     # the whole fused tree in one file: image -> every leaf (plan "fused")
      tensorrt/...                  # engines, when built on the target
      torch/model.pt                # optional: the fused state_dict, for the PyTorch backend
      profiles/*.json               # cost models written by the runtime (not listed in the manifest)

and nothing else (:data:`BUNDLE_LAYOUT`): a folder holding anything more is
not a bundle, and an export never replaces it (:func:`why_not_replaceable`).

The manifest is the only thing the runtime reads to know what to run. Reading
it validates everything: the schema version, the exact key set of every
object (missing and unknown keys are errors), that every file path stays
inside the bundle (no ``..``, no absolute path, no symlink that leads out),
that each file exists with the recorded sha256, and that the tree and the
files agree (every node or leaf covered exactly once per plan).

This module is pure Python (json, hashlib, pathlib): the edge runtime
imports it without torch.

Tensor naming inside model files: the image is ``image``; the activation of
node ``b2.1`` is ``act_b2.1``; a leaf's logits are ``logits``, shape
``(batch, classes)``. A file that outputs several leaves (plans "subtrees"
and "fused") outputs one ``logits`` tensor of shape ``(batch, leaves,
classes)``, in depth-first order: the fused model's own head layout, so no
per-leaf split in the graph. Its ``node`` is the subtree's root (``None`` for
the whole tree). Every tensor entry also names its ``node`` so nothing
depends on parsing names.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import BundleError, short_repr
from .fileio import atomic_write_json, foreign_entry, is_scratch
from .limits import MAX_BATCH, MAX_COUNT
from .tree import TreeSpec

__all__ = [
    "PLANS",
    "ANYTIME_PLANS",
    "RUNNER_PLANS",
    "MIXED_PLANS",
    "PRECISIONS",
    "DTYPES",
    "DTYPE_OF",
    "file_path",
    "file_key",
    "engine_dir",
    "update_manifest",
    "sha256_bytes",
    "variant_label",
    "SCHEMA_VERSION",
    "MANIFEST_NAME",
    "PROFILES_DIR",
    "PROFILE_FORMAT",
    "profile_filename",
    "BUNDLE_LAYOUT",
    "why_not_replaceable",
    "TensorSpec",
    "InputSpec",
    "ModelFile",
    "Manifest",
    "read_manifest",
    "read_manifest_and_digest",
    "not_a_bundle",
    "write_manifest",
    "parse_json",
    "path_component",
    "sha256_file",
    "read_verified",
    "onnx_external_data",
    "check_self_contained",
    "activation_name",
    "batch_range_ok",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
FORMATS = ("onnx", "tensorrt", "torch")
PROFILES_DIR = "profiles"  # cost models a runtime measured on this bundle (cost_model.py)
PROFILE_FORMAT = "hne-edge-profile"  # the "format" of every profile file (runtime/cost_model.py writes and reads them)
# the top-level entries of a bundle folder: its manifest, one folder per format, the profiles; nothing else
BUNDLE_LAYOUT = {MANIFEST_NAME: "file", **dict.fromkeys(FORMATS, "dir"), PROFILES_DIR: "dir"}
# "first": leaf 0's chain (image -> logits) without the exported activations, which a run that stops
# after the first leaf never reads and which cost up to ~10% (layout reorders, no fusion across them).
# "subtrees": leaf 0's chain, then each later whole subtree as one fused (grouped-convolution) call
# (TreeSpec.subtree_units): the tree in B + 1 calls, stopping at n = 1, 2, 4, ..., N.
# "fused": the whole fused tree as one file (image -> every leaf's logits), the one-call baseline.
# "weights": one torch file holding the fused state_dict.
PLANS = ("nodes", "segments", "subtrees", "fused", "first", "weights")
# the plans that run the whole tree (what a runtime and `hne-edge run --plan` choose from); default first
ANYTIME_PLANS = ("segments", "nodes", "subtrees", "fused")
# "mixed" is a runtime plan, not files: leaf by leaf ("segments"), or a whole subtree ("subtrees") or the
# whole tree ("fused") in one call where the budget fits it (runtime/program.py says when)
MIXED_PLANS = ("segments", "subtrees", "fused")
RUNNER_PLANS = ANYTIME_PLANS + ("mixed",)
PRECISIONS = ("fp32", "fp16")
DTYPES = ("float32", "float16")
DTYPE_OF = dict(zip(PRECISIONS, DTYPES))  # a precision's tensor dtype: {"fp32": "float32", "fp16": "float16"}
_ITEMSIZE = {"float32": 4, "float16": 2}
_SUFFIX = {"onnx": ".onnx", "tensorrt": ".plan"}


def batch_range_ok(batch: Any) -> bool:
    """The one rule for a bundle's batch range ``(min, opt, max)``: ints with ``1 <= min <= opt <= max <=``
    :data:`~hne_edge.limits.MAX_BATCH` (what ``export`` accepts and what :func:`read_manifest` accepts)."""
    return (
        isinstance(batch, (tuple, list)) and len(batch) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in batch)
        and 1 <= batch[0] <= batch[1] <= batch[2] <= MAX_BATCH
    )  # fmt: skip


def profile_filename(device: str, backend: str, plan: str, precision: str) -> str:
    """The name of a cost profile in a bundle's ``profiles/`` (one per device, backend, runner plan and precision)."""
    return f"{device}-{backend}-{plan}-{precision}.json"


# what profile_filename makes (a device name has no "-"; a backend name may); a profile is at most this big
_PROFILE_NAME = re.compile(rf"[^-/\x00]+-[^/\x00]+-(?:{'|'.join(RUNNER_PLANS)})-(?:{'|'.join(PRECISIONS)})\.json")
MAX_PROFILE_BYTES = 64 << 20


def activation_name(node_id: str | None) -> str:
    """Tensor name of a node's activation (``None``: the image)."""
    return "image" if node_id is None else f"act_{node_id}"


def file_path(
    fmt: str,
    precision: str,
    plan: str,
    *,
    node: str | None = None,
    leaf: int | None = None,
    unit: int | None = None,
    num_leaves: int = 16,
    engine_dir: str | None = None,
) -> str:
    """Bundle-relative path of a model file (the one layout rule; see the module docstring).

    ``onnx/fp32/nodes/b1.0.onnx``, ``onnx/fp16/segments/leaf03.onnx``, ``onnx/fp32/first/leaf00.onnx``,
    ``onnx/fp32/subtrees/unit02.onnx``, ``onnx/fp32/fused/tree.onnx``,
    ``tensorrt/trt10.3_sm87/fp16/segments/leaf00.plan`` (``engine_dir``: from :func:`engine_dir`),
    ``torch/model.pt`` (plan "weights"). Leaves and units are zero-padded to at least 2 digits.
    """
    if fmt == "torch" and plan == "weights":
        return "torch/model.pt"
    if fmt not in _SUFFIX or plan not in PLANS or plan == "weights" or precision not in PRECISIONS:
        raise ValueError(
            f"file_path: received format {fmt!r}, plan {plan!r}, precision {precision!r}; expected a format of "
            f"{list(_SUFFIX)}, a plan of {list(PLANS[:-1])} and a precision of {list(PRECISIONS)} (or torch weights)"
        )
    if fmt == "tensorrt" and engine_dir is None:
        raise ValueError("file_path(format='tensorrt') needs engine_dir= (see bundle.engine_dir)")
    base = f"{engine_dir if fmt == 'tensorrt' else fmt}/{precision}/{plan}"
    digits = max(2, len(str(num_leaves - 1)))
    if plan == "nodes":
        if node is None:
            raise ValueError("file_path(plan='nodes') needs node=")
        return f"{base}/{node}{_SUFFIX[fmt]}"
    if plan == "fused":
        return f"{base}/tree{_SUFFIX[fmt]}"
    if plan == "subtrees":
        if unit is None:
            raise ValueError("file_path(plan='subtrees') needs unit=")
        return f"{base}/unit{unit:0{digits}d}{_SUFFIX[fmt]}"
    if leaf is None:
        raise ValueError(f"file_path(plan={plan!r}) needs leaf=")
    return f"{base}/leaf{leaf:0{digits}d}{_SUFFIX[fmt]}"


def file_key(model_file: "ModelFile", tree: TreeSpec) -> dict[str, Any]:
    """The :func:`file_path` keyword that names ``model_file`` within its plan (``node=``, ``leaf=`` or ``unit=``),
    so a file of one format (an ONNX source) gives the path of its counterpart in another (its engine)."""
    if model_file.plan == "nodes":
        return {"node": model_file.nodes[0], "num_leaves": tree.num_leaves}
    if model_file.plan == "subtrees":
        index = next(u.index for u in tree.subtree_units if u.first_leaf == model_file.leaf)
        return {"unit": index, "num_leaves": tree.num_leaves}
    return {"leaf": model_file.leaf, "num_leaves": tree.num_leaves}


_ENGINE_DIR = re.compile(r"trt[0-9]+\.[0-9]+_sm[0-9]+")  # the last part of what engine_dir makes


def engine_dir(trt_version: str, compute_capability: Any) -> str:
    """``tensorrt/trt10.3_sm87``: engines of one TensorRT minor version and one GPU architecture."""
    from .tensorrt_compat import normalize_compute_capability, version_tuple

    major, minor, _ = version_tuple(trt_version)
    cc = normalize_compute_capability(compute_capability).replace(".", "")
    return f"tensorrt/trt{major}.{minor}_sm{cc}"


def sha256_bytes(data: bytes) -> str:
    """The sha256 of bytes already in memory (a file's, as loaded or as written)."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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


# -- schema ----------------------------------------------------------------------------------------


def variant_label(fmt: str, plan: str, precision: str) -> str:
    """How a variant is named to users: in the order of its folders on disk (``onnx/fp32/nodes``)."""
    return f"{fmt}/{precision}/{plan}"


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
        if plan == "nodes":
            order = {n.id: i for i, n in enumerate(self.tree.nodes)}
            return sorted(chosen, key=lambda f: order[f.nodes[0]])
        if plan == "weights":
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
        exported = ("nodes", "segments", "subtrees", "fused")  # what export --plan writes (first, weights: by default)
        plans = [p for p in PLANS if p in exported and (p == plan or any(v[1] == p for v in has))] or ["both"]
        precisions = [q for q in PRECISIONS if q == precision or any(v[2] == q for v in has)]
        ckpt = self.provenance.get("checkpoint") if isinstance(self.provenance.get("checkpoint"), str) else "CHECKPOINT"
        also = {"first": " (without --no-first-leaf)", "weights": " (without --no-torch-weights)"}.get(plan, "")
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
        image = math.prod(self.input.shape[1:]) * _ITEMSIZE[self.input.dtype]
        for fmt in FORMATS:
            files = [f for f in self.files if (f.format, f.plan, f.precision) == (fmt, plan, precision)]
            if files:
                return image + sum(
                    math.prod(d for d in t.shape[1:] if isinstance(d, int)) * _ITEMSIZE[t.dtype]
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
        files = tuple(ModelFile.from_dict(f, f"files[{i}]") for i, f in enumerate(_typed(d["files"], list, "files")))
        manifest = cls(
            model_name=_typed(model["name"], str, "model.name"),
            model_config=_typed(model["config"], dict, "model.config"),
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
            if plan in ("subtrees", "fused"):
                self._check_units(plan, label, group)
            if (fmt == "torch") != (plan == "weights"):
                raise BundleError(f"manifest: {label}: plan 'weights' is for format 'torch' only, and torch files use it")
            if plan == "weights":
                if len(group) != 1 or sorted(group[0].nodes) != sorted(n.id for n in self.tree.nodes):
                    raise BundleError(f"manifest: {label} must be one file covering every tree node")
                continue
            if plan == "first":
                first = self.tree.segments[0]
                if len(group) != 1 or group[0].leaf != 0 or tuple(group[0].nodes) != first.nodes:
                    raise BundleError(
                        f"manifest: {label} must be one file computing leaf 0's chain {list(first.nodes)}; received "
                        f"{[(f.path, list(f.nodes), f.leaf) for f in group]}"
                    )
                if [o.name for o in group[0].outputs] != ["logits"]:
                    raise BundleError(f"manifest: {group[0].path} outputs {[o.name for o in group[0].outputs]}; expected ['logits']")
                hosts = [p for p in ANYTIME_PLANS if p != "fused"]  # plans whose first call is leaf 0 alone
                if not any((fmt, p, precision) in variants for p in hosts):
                    raise BundleError(f"manifest: {label} is an add-on to a full plan; expected "
                                      f"{' or '.join(variant_label(fmt, p, precision) for p in hosts)} beside it")  # fmt: skip
            elif plan in ("subtrees", "fused"):
                pass  # _check_units above
            elif plan == "nodes":
                got = sorted(n for f in group for n in f.nodes)
                if any(len(f.nodes) != 1 for f in group) or got != sorted(n.id for n in self.tree.nodes):
                    raise BundleError(f"manifest: {label} must have exactly one file per tree node")
            else:
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
                expected_in = self.tree.node(f.nodes[0]).parent
                if len(f.inputs) != 1 or f.inputs[0].node != expected_in:
                    raise BundleError(
                        f"manifest: {f.path} must read exactly one input, {activation_name(expected_in)}; "
                        f"received {[t.name for t in f.inputs]}"
                    )


    def _check_units(self, plan: str, label: str, group: list[ModelFile]) -> None:
        """Plan "subtrees": one file per :attr:`TreeSpec.subtree_units` unit; "fused": one file, every node.

        A unit of several leaves outputs one ``logits`` tensor ``(batch, leaves, classes)`` (node: its root,
        None for the whole tree); leaf 0's chain outputs the activations later units read, then its logits.
        """
        tree = self.tree
        if plan == "fused":
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
            several = plan == "fused" or first > 0  # leaf 0's chain is a segment: (batch, classes)
            shape = ("batch", count, self.num_classes) if several else ("batch", self.num_classes)
            if len(logits.shape) != len(shape) or tuple(logits.shape[1:]) != shape[1:] or (several and logits.node != root):
                raise BundleError(
                    f"manifest: {f.path} outputs logits {list(logits.shape)} of node {logits.node}; expected "
                    f"{list(shape)}" + (f" of node {root}" if several else "")
                )


# -- files -----------------------------------------------------------------------------------------


def resolve_in_bundle(bundle_dir: Path, relpath: str, where: str) -> Path:
    """The absolute path of ``relpath``, refusing anything that leaves the bundle directory."""
    if not relpath or relpath.startswith(("/", "\\")) or (len(relpath) > 1 and relpath[1] == ":"):
        raise BundleError(f"manifest: {where} path {relpath!r} must be relative to the bundle directory")
    parts = relpath.replace("\\", "/").split("/")
    if ".." in parts:
        raise BundleError(f"manifest: {where} path {relpath!r} contains '..'; files must stay inside the bundle")
    root = bundle_dir.resolve()
    target = (root / relpath).resolve()  # follows symlinks
    if target == root:
        raise BundleError(f"manifest: {where} path {relpath!r} names the bundle folder itself; expected a file inside it")
    if root not in target.parents:
        raise BundleError(f"manifest: {where} path {relpath!r} resolves to {target}, outside the bundle {root}")
    return target


def _check_on_disk(target: Path, f: "ModelFile", where: str, listed: str = "is listed in the manifest but not on disk") -> None:
    """A listed model file must be a regular file (a folder or a device in its place is not "missing")."""
    if target.is_file():
        return
    if target.exists():
        kind = "a folder" if target.is_dir() else "not a regular file"
        raise BundleError(f"bundle file {f.path} ({where}) is {kind}; expected a file (the bundle was modified)")
    raise BundleError(f"bundle file missing: {f.path} ({where}) {listed}")


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


def parse_json(data: bytes, where: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity (nor literals that overflow to them), no integers of
    thousands of digits, bounded nesting; errors are BundleError."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                          parse_float=_finite_float, parse_int=_short_int)  # fmt: skip
    except BundleError as exc:
        raise BundleError(f"{where}: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise BundleError(f"{where}: not valid JSON ({short_repr(str(exc))})") from None
    except RecursionError:
        raise BundleError(f"{where}: JSON nested too deeply; expected a manifest") from None


def path_component(name: str, limit: int = 64) -> str:
    """``name`` (read from a file) made safe as one path component: no separators, no ``..``, no control characters."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in str(name))[:limit].lstrip(".")
    return safe or "model"


def read_manifest(bundle_dir: str | os.PathLike, verify_files: bool = True) -> Manifest:
    """Read and validate ``bundle_dir/manifest.json``; with ``verify_files`` also check every file's sha256."""
    return _read_manifest(bundle_dir, verify_files)[0]


def read_manifest_and_digest(bundle_dir: str | os.PathLike, verify_files: bool = True) -> tuple[Manifest, str]:
    """:func:`read_manifest`, and the sha256 of the very bytes it parsed (what a profile is keyed to)."""
    manifest, raw = _read_manifest(bundle_dir, verify_files)
    return manifest, sha256_bytes(raw)


def why_not_replaceable(folder: str | os.PathLike) -> str | None:
    """Why an export may not replace ``folder`` (deleting everything in it), or None when it may.

    It may when ``folder`` is empty, or is a bundle: it holds nothing but :data:`BUNDLE_LAYOUT`'s
    entries (no symbolic links), its ``manifest.json`` parses as an hne-edge manifest of this
    schema version, and nothing at any depth but what that manifest lists and what the bundle's
    own tools write beside it (:func:`_foreign_in_bundle`). Its model files are not checked: a
    damaged bundle is still ours to replace. The reason names the first entry that is not a bundle's.
    """
    folder = Path(folder)
    entry = foreign_entry(folder, BUNDLE_LAYOUT)
    if entry is not None:
        return f"it holds {entry}, which is not part of a bundle"
    if not any(folder.iterdir()):
        return None
    try:
        manifest, _ = _parse_manifest(folder / MANIFEST_NAME)
    except BundleError as exc:
        return f"it is not an hne-edge bundle ({exc})"
    entry = _foreign_in_bundle(folder, manifest)
    if entry is not None:
        return f"it holds {entry}, which is not part of the bundle"
    return None


def _foreign_in_bundle(folder: Path, manifest: Manifest) -> str | None:
    """The first entry, at any depth of ``folder``, that is not the bundle's (described for an error), or None.

    The bundle's entries: ``manifest.json``, each file the manifest lists and the folders that hold them,
    the folders of :data:`BUNDLE_LAYOUT`, each TensorRT engine folder (:func:`engine_dir`) and its timing
    cache (``build_engines`` writes both, the folder before its first engine), ``profiles/`` holding
    profiles (:func:`profile_filename`, whose JSON says ``"format": PROFILE_FORMAT``), and a killed
    writer's scratch file beside any of these (:func:`~hne_edge.fileio.is_scratch`, its seal checked).
    Anything else - a file, a folder (even empty), a link, a device, a folder it cannot list - is the user's.
    """
    files = {MANIFEST_NAME} | {"/".join(p for p in f.path.split("/") if p not in ("", ".")) for f in manifest.files}
    folders = {"/".join(p.split("/")[:k]) for p in files for k in range(1, p.count("/") + 1)}
    folders |= {name for name, kind in BUNDLE_LAYOUT.items() if kind == "dir"}  # onnx/, tensorrt/, torch/, profiles/
    engines = [e.name for e in _scandir_or_empty(folder / "tensorrt") if _ENGINE_DIR.fullmatch(e.name) and e.is_dir()]
    folders |= {f"tensorrt/{name}" for name in engines}  # build_engines makes it before its first engine
    files |= {f"tensorrt/{name}/timing.cache" for name in engines}  # ... and keeps its timing cache there
    stack: list[tuple[str, set[str], Any]] = []  # (prefix, its listed names, entries left): depth first, by name

    def enter(path: str, prefix: str) -> str | None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as exc:  # what cannot be listed cannot be known to be ours
            return f"{prefix.rstrip('/') or '.'!r} (not readable: {exc.strerror})"
        here = prefix.rstrip("/")
        stack.append((prefix, {rel.rpartition("/")[2] for rel in files if rel.rpartition("/")[0] == here}, iter(entries)))
        return None

    found = enter(str(folder), "")
    while stack and found is None:
        prefix, listed, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        rel = prefix + entry.name
        if entry.is_symlink():
            return f"{rel!r} (a symbolic link)"
        if entry.is_dir():
            if rel not in folders:
                return f"{rel!r} (a folder, where a file belongs)" if rel in files else repr(rel)
            found = enter(entry.path, rel + "/")
        elif not entry.is_file():
            return f"{rel!r} (not a regular file)"
        elif rel in folders:
            return f"{rel!r} (a file, where a folder belongs)"
        elif rel not in files and not is_scratch(entry.name, listed, ("tmp",)) and not (
            prefix == PROFILES_DIR + "/" and _is_profile(entry)
        ):
            return repr(rel)
    return found


def _scandir_or_empty(path: Path) -> list[os.DirEntry]:
    try:
        return list(os.scandir(path)) if path.is_dir() and not path.is_symlink() else []
    except OSError:
        return []


class _ProfileNames:
    """The names :func:`profile_filename` makes, as a container (for :func:`~hne_edge.fileio.is_scratch`)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _PROFILE_NAME.fullmatch(name) is not None


def _is_profile(entry: os.DirEntry) -> bool:
    """Whether ``entry`` (in ``profiles/``) is a profile the runtime wrote, or a killed writer's scratch of one."""
    if is_scratch(entry.name, _ProfileNames(), ("tmp",)):
        return True
    if entry.name not in _ProfileNames() or entry.stat().st_size > MAX_PROFILE_BYTES:
        return False
    try:
        data = parse_json(Path(entry.path).read_bytes(), entry.name)
    except (BundleError, OSError):
        return False
    return isinstance(data, dict) and data.get("format") == PROFILE_FORMAT


def _parse_manifest(path: Path) -> tuple[Manifest, bytes]:
    """The manifest in file ``path``, validated (not the files it lists), and the bytes it was parsed from."""
    if not path.is_file():
        raise BundleError(f"{path.parent} is not a bundle: {MANIFEST_NAME} is missing")
    raw = path.read_bytes()
    return Manifest.from_dict(parse_json(raw, str(path))), raw


def not_a_bundle(path: str | os.PathLike) -> BundleError | None:
    """The error for a file given where a bundle folder goes, naming what it likely is and how it becomes a bundle
    (a checkpoint is exported first); None when ``path`` is not a file."""
    if not os.path.isfile(path):
        return None
    suffix = Path(path).suffix.lower()
    if suffix in (".pt", ".pth", ".ckpt"):
        return BundleError(f"{path}: received a file (a checkpoint?); expected a bundle folder",
                           hint=f"export the checkpoint to one first: hne_edge.exporters.export_checkpoint({str(path)!r}, 'BUNDLE')",
                           cli_hint=f"export the checkpoint to one first: hne-edge export {path} --out BUNDLE")  # fmt: skip
    if suffix in (".onnx", ".engine", ".plan", ".json"):
        return BundleError(f"{path}: received one file of a bundle; expected the bundle folder",
                           hint=f"pass the folder that holds {MANIFEST_NAME}")  # fmt: skip
    return BundleError(f"{path}: received a file; expected a bundle folder (what hne-edge export writes)")


def _read_manifest(bundle_dir: str | os.PathLike, verify_files: bool) -> tuple[Manifest, bytes]:
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise not_a_bundle(bundle_dir) or BundleError(f"bundle directory not found: {bundle_dir}")
    manifest, raw = _parse_manifest(bundle_dir / MANIFEST_NAME)
    for i, f in enumerate(manifest.files):
        target = resolve_in_bundle(bundle_dir, f.path, f"files[{i}]")
        if f.source is not None:
            resolve_in_bundle(bundle_dir, f.source, f"files[{i}].source")
        _check_on_disk(target, f, f"files[{i}]")
        if verify_files:
            _check_size(f, target.stat().st_size, f"files[{i}].bytes")  # a stat first: cheap
            _check_digest(f, sha256_file(target), f"files[{i}].sha256")
    return manifest, raw


def _check_size(f: ModelFile, actual: int, where: str) -> None:
    if actual != f.bytes:
        raise BundleError(
            f"bundle file {f.path} ({where}) is {actual} bytes on disk; the manifest says {f.bytes}; the file was "
            "modified or corrupted"
        )


def _check_digest(f: ModelFile, actual: str, where: str) -> None:
    if actual != f.sha256:
        raise BundleError(
            f"bundle file {f.path} ({where}) does not match the manifest: "
            f"expected {f.sha256}, found {actual}; the file was modified or corrupted"
        )


def read_verified(path: str | os.PathLike, model_file: ModelFile | None) -> bytes:
    """The bytes of a model file, checked against ``model_file.bytes`` and ``.sha256`` (``None``: not checked).

    Backends load these bytes, never the path again: a file swapped after the
    check cannot be what runs.
    """
    data = Path(path).read_bytes()
    if model_file is not None:
        _check_size(model_file, len(data), "bytes at load")
        _check_digest(model_file, sha256_bytes(data), "sha256 at load")
    return data


# onnx.proto field numbers: which fields of each message hold messages that can hold tensors
_ONNX_WALK = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION, _TENSOR_NAME = 13, 14, 8


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def onnx_external_data(data: bytes) -> list[str]:
    """Names of the tensors of a serialized ONNX model that keep their values in external files.

    Reads the protobuf wire format directly (no onnx package on the edge). A
    bundle's files must be self-contained: ONNX Runtime would read external
    data from paths the manifest does not list or hash.
    """
    found: list[str] = []
    stack: list[tuple[str, int, int, int]] = [("model", 0, len(data), 0)]
    while stack:
        kind, pos, end, depth = stack.pop()
        if depth > 64:
            raise BundleError("ONNX model nests subgraphs more than 64 deep")
        name, external = "?", False
        while pos < end:
            key, pos = _varint(data, pos)
            field_no, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = _varint(data, pos)
                if kind == "tensor" and field_no == _TENSOR_DATA_LOCATION and value == 1:
                    external = True
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                length, pos = _varint(data, pos)
                if pos + length > end:
                    raise ValueError("length past the end of its message")
                if kind == "tensor" and field_no == _TENSOR_EXTERNAL_DATA:
                    external = True
                elif kind == "tensor" and field_no == _TENSOR_NAME:
                    name = data[pos : pos + length].decode("utf-8", "replace")
                child = _ONNX_WALK.get(kind, {}).get(field_no)
                if child is not None:
                    stack.append((child, pos, pos + length, depth + 1))
                pos += length
            else:
                raise ValueError(f"unsupported protobuf wire type {wire}")
        if external:
            found.append(name)
    return found


def check_self_contained(data: bytes, name: str) -> None:
    """Refuse ONNX bytes that are no valid protobuf, or that keep tensors in external files (the one rule for
    every loader: the runtime's sessions and ``verify``): those files are neither listed nor hashed, and
    their paths may point anywhere."""
    try:
        external = onnx_external_data(data)
    except ValueError as exc:
        raise BundleError(f"{name}: not a valid ONNX file ({exc})") from None
    if external:
        raise BundleError(
            f"{name}: {len(external)} tensor(s) ({', '.join(external[:3])}) keep their values in external "
            "files, which the manifest neither lists nor hashes; expected one self-contained ONNX file per entry"
        )


def write_manifest(bundle_dir: str | os.PathLike, manifest: Manifest) -> Path:
    """Write ``manifest.json`` (after checking it reads back)."""
    data = manifest.to_dict()
    Manifest.from_dict(json.loads(json.dumps(data)))  # never write what we could not read
    return atomic_write_json(Path(bundle_dir) / MANIFEST_NAME, data, indent=2)


def update_manifest(bundle_dir: str | os.PathLike, entries: "list[ModelFile] | tuple[ModelFile, ...]") -> Manifest:
    """Add (or replace, by path) ``entries`` in a bundle's manifest, written atomically; returns the new manifest.

    Hashes nothing: each entry's sha256 is the one computed when its file was written (from the
    bytes written), and the files already listed were verified by whoever read them. The new
    manifest is validated once - the structure by :func:`write_manifest`'s read-back, the paths
    and the presence of every file by :func:`read_manifest` - and only then replaces the old one.
    """
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir, verify_files=False)
    new_paths = {e.path for e in entries}
    files = tuple(f for f in manifest.files if f.path not in new_paths) + tuple(entries)
    updated = replace(manifest, files=files)
    for i, f in enumerate(updated.files):
        _check_on_disk(resolve_in_bundle(bundle_dir, f.path, f"files[{i}]"), f, f"files[{i}]", "would be listed in the manifest but is not on disk")
    write_manifest(bundle_dir, updated)
    return updated


def bundle_path(bundle_dir: str | os.PathLike, model_file: ModelFile) -> Path:
    """Absolute path of a model file (validated)."""
    return resolve_in_bundle(Path(bundle_dir), model_file.path, model_file.path)
