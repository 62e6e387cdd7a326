"""ONNX exporter: a trained fused HNE -> a bundle of ONNX files per node, per leaf segment, per subtree unit
(plan "subtrees") and for the whole fused tree (plan "fused"), as the plans asked for.

Why the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) stays
the default although PyTorch deprecates it (issue 20 item 11; measured side by
side by ``bench_exporters.py`` at 8691e0c, ``benchmarks/results/exporters.md``,
torch 2.14.1, hne_tiny, every plan): the dynamo exporter

* cannot write the bundle's default opset 17: it implements opset >= 18 and its
  down-conversion of a leaf's ``ReduceMean`` fails, so it leaves an opset-18 file
  (which the manifest recorded as 17 until the check below refused it);
* cannot write fp16 bundles: that ``ReduceMean`` (TorchScript writes
  ``GlobalAveragePool``) is outside the ops the fp16 conversion handles;
* took 20.4 s per file against 0.35 s (58x; a bundle is ~50 files per
  precision), and wrote files 2.7x larger (1.54 MB against 0.57 MB for the
  same weights: names, metadata and shape information);
* at opset 18 in fp32 it passes the same verification (every file and every
  anytime prefix within 1.2e-6 of PyTorch) and runs as fast in ONNX Runtime
  (all 16 leaves 10.2 ms against 11.0 ms, a loaded 2-core machine, round-robin).

``exporter="dynamo"`` (``--exporter dynamo --opset 18``, fp32) is kept for when
the TorchScript path is removed from PyTorch; both are checked the same way
afterwards, the opset included.

Every file is checked after export, whatever the exporter did: ``onnx.checker``,
a symbolic batch dimension on every input and output, the expected tensor
names, no ``BatchNormalization`` op (BatchNorm is folded into the
convolutions in PyTorch, on copies, before export) and no external-data
side file.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ..bundle import (
    BOTH,
    DTYPE_OF,
    FIRST,
    FIRST_HOSTS,
    FUSED,
    NODES,
    SEGMENTS,
    SUBTREES,
    WEIGHTS,
    InputSpec,
    Manifest,
    ModelFile,
    TensorSpec,
    activation_name,
    file_path,
    normalisation_overflow,
    read_manifest,
    sha256_file,
    write_manifest,
)
from ..errors import ExportError, InputError
from ..fileio import atomic_write_bytes, scratch_path
from ..limits import MAX_BATCH
from ..progress import NULL_PROGRESS, Progress
from .base import (
    DEFAULT_OPSET,
    ShapeError,
    atomic_output_dir,
    check_normalization,
    check_opset,
    parse_batch,
    parse_plan,
    parse_precisions,
    provenance,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from ..models import HNE
    from ..tree import TreeSpec

__all__ = [
    "export_onnx",
    "export_standalone_network",
    "export_module",
    "fold_batchnorm",
    "EXPORTERS",
    "exporter_opset",
]

EXPORTERS = ("torchscript", "dynamo")
# what the dynamo exporter cannot write (module docstring): opsets under 18 (its down-conversion of a leaf's
# ReduceMean fails) and fp16 (that ReduceMean is outside the fp16 conversion's ops)
DYNAMO_MIN_OPSET = 18
BATCH_DIM = "batch"
EXAMPLE_BATCH = 2  # > 1, so an exporter that specialised the batch dim would be caught by the check below


def exporter_opset(exporter: str, opset: int | None, precisions: str | Sequence[str] = ("fp32",)) -> int:
    """The opset ``exporter`` writes the files in: ``opset``, or the exporter's own default when None (17, or 18
    for the dynamo exporter). What the exporter cannot write is refused here, before any work: the dynamo
    exporter's failures came only after its first file (20 s each), or after the whole export."""
    if exporter not in EXPORTERS:
        raise InputError(f"exporter must be one of {list(EXPORTERS)}; received {exporter!r}")
    if exporter != "dynamo":
        return check_opset(DEFAULT_OPSET if opset is None else opset)
    if "fp16" in parse_precisions(precisions):
        raise InputError("the dynamo exporter cannot write fp16 files: the fp16 conversion does not handle the "
                         "ReduceMean it writes for the head's pooling", hint="pass exporter='torchscript' for fp16",
                         cli_hint="pass --exporter torchscript (the default) for --precision fp16")  # fmt: skip
    if opset is None:
        return DYNAMO_MIN_OPSET
    if check_opset(opset) < DYNAMO_MIN_OPSET:
        raise InputError(f"opset: received {opset}; the dynamo exporter writes {DYNAMO_MIN_OPSET} or later (its "
                         "conversion of these models to older ones fails)",
                         hint=f"pass opset={DYNAMO_MIN_OPSET} or leave it unset, or exporter='torchscript'",
                         cli_hint=f"pass --opset {DYNAMO_MIN_OPSET} or leave it out (--exporter dynamo's default), "
                                  f"or --exporter torchscript")  # fmt: skip
    return opset


@contextlib.contextmanager
def _exporter_logs_silenced() -> Iterator[None]:
    """The exporters' own log records (torch.onnx's "Setting ONNX exporter to use operator set version 18",
    onnxscript's tracebacks of a failed version conversion) held back while they run, whatever ``--quiet`` says:
    every file is checked afterwards and a failure is raised as one :class:`ExportError`."""
    import logging

    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# -- torch side -------------------------------------------------------------------------------------


def fold_batchnorm(module: "nn.Module") -> "nn.Module":
    """An eval-mode copy of ``module`` with every Conv2d -> BatchNorm2d pair folded into the conv
    (:func:`hne_edge.models.layers.fold_batchnorm`; the runtime's torch backend folds with it too)."""
    from ..models.layers import fold_batchnorm as fold

    try:
        return fold(module)
    except ValueError as exc:
        raise ExportError(str(exc)) from None


def export_module(
    module: "nn.Module",
    path: str | os.PathLike,
    example: "torch.Tensor",
    input_names: Sequence[str],
    output_names: Sequence[str],
    *,
    opset: int = DEFAULT_OPSET,
    exporter: str = "torchscript",
    precision: str = "fp32",
    metadata: dict[str, str] | None = None,
) -> Path:
    """Export one fp32 module to one self-contained ONNX file with a symbolic batch dim, then check it.

    ``precision="fp16"`` converts the exported graph to half precision
    (:func:`to_float16`): weights, inputs, outputs and every intermediate
    tensor. Tracing in fp32 and converting afterwards is ~100x faster here
    than tracing a ``.half()`` module, whose CPU fp16 convolutions are slow.
    """
    import onnx
    import torch

    if exporter not in EXPORTERS:
        raise InputError(f"exporter must be one of {list(EXPORTERS)}; received {exporter!r}")
    path = Path(path)
    with warnings.catch_warnings(), _exporter_logs_silenced(), torch.no_grad():
        warnings.simplefilter("ignore")  # TorchScript-exporter deprecation and tracer notices
        if exporter == "torchscript":
            buffer = io.BytesIO()  # in memory: the one write below goes through fileio (a full disk names the file)
            torch.onnx.export(
                module,
                (example,),
                buffer,
                input_names=list(input_names),
                output_names=list(output_names),
                opset_version=opset,
                dynamic_axes={name: {0: BATCH_DIM} for name in (*input_names, *output_names)},
                do_constant_folding=True,
                dynamo=False,
            )
        else:
            batch = torch.export.Dim(BATCH_DIM, min=1, max=MAX_BATCH)
            program = torch.onnx.export(
                module,
                (example,),
                input_names=list(input_names),
                output_names=list(output_names),
                opset_version=opset,
                dynamic_shapes=({0: batch},),
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    proto = onnx.load_from_string(buffer.getvalue()) if exporter == "torchscript" else program.model_proto
    if precision == "fp16":
        proto = to_float16(proto, path)
    for key, value in (metadata or {}).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    got = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if got != opset:  # the manifest records `opset` for every file: TensorRT and old runtimes read it as such
        raise ExportError(
            f"{path.name}: the {exporter} exporter wrote an opset-{got} graph; the bundle records opset {opset} "
            f"(the exporter could not convert its graph to it)", hint=f"pass opset={got}", cli_hint=f"pass --opset {got}")
    check_onnx_model(proto, path, input_names, output_names)
    atomic_write_bytes(path, proto.SerializeToString())  # small graphs: one file, weights inline
    return path


# Ops whose float inputs/outputs can all be switched to float16 with no other change (type-polymorphic
# in ONNX, fp16 kernels in TensorRT and ONNX Runtime). Anything else refuses the conversion.
_FP16_OPS = {
    "Add", "Clip", "Concat", "Constant", "Conv", "Flatten", "Gather", "GlobalAveragePool", "Identity",
    "Mod", "Relu", "Reshape", "Shape", "Slice", "Squeeze", "Unsqueeze", "Mul", "Expand",
}  # fmt: skip


def to_float16(proto, path: Path | None = None):
    """Convert an fp32 graph of our op set to fp16 end to end (in place; returns it)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    unknown = sorted({n.op_type for n in proto.graph.node} - _FP16_OPS)
    if unknown:
        raise ExportError(
            f"{path.name if path else 'model'}: fp16 conversion does not handle op(s) {unknown}; "
            f"supported: {sorted(_FP16_OPS)}"
        )

    def half(t):
        if t.data_type != TensorProto.FLOAT:
            return t
        h = numpy_helper.from_array(numpy_helper.to_array(t).astype("float16"), t.name)
        return h

    for i, t in enumerate(list(proto.graph.initializer)):
        proto.graph.initializer[i].CopyFrom(half(t))
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                attr.t.CopyFrom(half(attr.t))
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)  # any fp32/fp16 mix fails here
    return proto


def check_onnx_model(proto, path: Path, input_names: Sequence[str], output_names: Sequence[str]) -> None:
    """The properties every bundle file must have, whatever exported it (raises ShapeError/ExportError)."""
    import onnx

    onnx.checker.check_model(proto)
    got_in = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    got_out = [o.name for o in proto.graph.output]
    if got_in != list(input_names) or got_out != list(output_names):
        raise ShapeError(
            f"{path.name}: graph inputs {got_in} / outputs {got_out}; expected {list(input_names)} / {list(output_names)}"
        )
    for value in [*proto.graph.input, *proto.graph.output]:
        if value.name not in got_in + got_out:
            continue
        dim0 = value.type.tensor_type.shape.dim[0]
        if not dim0.dim_param:
            raise ShapeError(
                f"{path.name}: tensor {value.name} has a fixed batch dimension {dim0.dim_value}; "
                "expected a symbolic one (dynamic batch)"
            )
    ops = {n.op_type for n in proto.graph.node}
    if "BatchNormalization" in ops:
        raise ExportError(f"{path.name}: BatchNormalization op left in the graph; expected it folded into Conv")
    external = [t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ExportError(f"{path.name}: {len(external)} initializer(s) stored as external data; expected one self-contained file")


def _example(model: "HNE") -> "torch.Tensor":
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(EXAMPLE_BATCH, *model.config.input_shape, generator=g)


def _activation_inputs(model: "HNE", folded: dict[str, "nn.Module"]) -> dict[str | None, "torch.Tensor"]:
    """Example inputs for every node: the image and each inner node's activation."""
    import torch

    acts: dict[str | None, torch.Tensor] = {None: _example(model)}
    with torch.no_grad():
        for node in model.tree.nodes:
            if not node.is_leaf:
                acts[node.id] = folded[node.id](acts[node.parent])
    return acts


# -- bundle: the export as named steps --------------------------------------------------------------
#
# export_onnx: check the request, take a float32 copy of the model, list the files each plan writes (_units),
# then inside the atomic output folder: slice the model once (_Parts), write every file through the one writer
# (_write_unit; the weights through _write_weights), write the manifest, verify, and swap into place.


@dataclass(frozen=True)
class _Request:
    """What the caller asked for, checked before any work (one line naming the option on any error)."""

    class_names: tuple[str, ...]
    normalization: dict
    precisions: tuple[str, ...]
    plans: tuple[str, ...]
    batch: tuple[int, int, int]
    opset: int
    exporter: str
    first_leaf: bool
    torch_weights: bool


def _check_request(model: "HNE", class_names, normalization, precisions, plan, batch, opset, exporter, first_leaf,
                   torch_weights) -> _Request:  # fmt: skip
    config = model.config
    precisions, plans, batch = parse_precisions(precisions), parse_plan(plan), parse_batch(batch)
    opset = exporter_opset(exporter, opset, precisions)
    if class_names is None:
        class_names = [str(i) for i in range(config.num_classes)]
    if len(class_names) != config.num_classes:
        raise InputError(f"class_names has {len(class_names)} entries; the model has {config.num_classes} classes")
    normalization = normalization or {"mean": [0.0] * config.in_chans, "std": [1.0] * config.in_chans}
    check_normalization(normalization, config.in_chans)
    problem = normalisation_overflow(normalization["mean"], normalization["std"], fp16="fp16" in precisions,
                                     where="normalization.")  # fmt: skip
    if problem:  # before any file is written (the manifest's reader would refuse it at the end)
        raise InputError(problem)
    return _Request(tuple(class_names), normalization, precisions, plans, batch, opset, exporter, bool(first_leaf),
                    bool(torch_weights))  # fmt: skip


def _exportable(model: "HNE") -> "HNE":
    """A float32 eval-mode copy of ``model`` on the CPU (the caller's model is never touched), refused when no
    export of its weights could verify (the checkpoint rule, :func:`hne_edge.train.checkpoint.unusable_reason`)."""
    from ..train.checkpoint import unusable_reason

    why = unusable_reason(model.state_dict())
    if why is not None:
        raise ExportError(f"cannot export {model.config.name}: {why}")
    return copy.deepcopy(model).eval().float().cpu()


class _Tensors:
    """The :class:`TensorSpec` of every tensor a file reads or writes, from the model's per-node output shapes."""

    def __init__(self, model: "HNE", cost) -> None:
        self.config, self.cost = model.config, cost

    def of(self, node: str | None, dtype: str, logits: bool = False) -> TensorSpec:
        """The image (``node=None``), a node's activation, or a leaf's logits (``logits=True``)."""
        shape = self.config.input_shape if node is None else self.cost.nodes[node].output_shape
        return TensorSpec(name="logits" if logits else activation_name(node), node=node, dtype=dtype,
                          shape=(BATCH_DIM, *shape))  # fmt: skip

    def leaves(self, root: str | None, count: int, dtype: str) -> TensorSpec:
        """The logits of several leaves (a subtree's, or the whole tree's: ``root=None``), in one tensor."""
        return TensorSpec(name="logits", node=root, dtype=dtype, shape=(BATCH_DIM, count, self.config.num_classes))


class _Parts:
    """The model's pieces, each built once: every node sliced (slicing copies the fused block, the dominant cost
    on big trees; the unfolded slices are also the verification's per-node reference) and folded, the whole
    subtrees and the tree folded when first asked for, and an example input for every node."""

    def __init__(self, model: "HNE") -> None:
        self.model = model
        self.sliced = model.node_modules()
        self.folded = {nid: fold_batchnorm(module) for nid, module in self.sliced.items()}
        self.examples = _activation_inputs(model, self.folded)
        self._fused: dict[str | None, "nn.Module"] = {}

    def node(self, node: str) -> "nn.Module":
        return self.folded[node]

    def chain(self, segment) -> "nn.Module":
        """A leaf's chain (a :class:`~hne_edge.tree.Segment`) as one call, exporting ``segment.exports``."""
        from ..models import SegmentModule

        return SegmentModule(segment, [self.folded[n] for n in segment.nodes]).eval()

    def bare_chain(self, segment) -> "nn.Module":
        """A leaf's chain without exports: image -> logits."""
        import torch

        return torch.nn.Sequential(*(self.folded[n] for n in segment.nodes)).eval()

    def fused(self, root: str | None) -> "nn.Module":
        """The whole subtree under ``root`` in one call (``None``: the whole tree)."""
        if root not in self._fused:
            self._fused[root] = fold_batchnorm(self.model if root is None else self.model.subtree_module(root))
        return self._fused[root]


@dataclass(frozen=True)
class _Unit:
    """One ONNX file a plan writes: where, what it computes (built from :class:`_Parts` when written), its tensors."""

    path: str
    plan: str
    precision: str
    module: Callable[[_Parts], "nn.Module"]
    nodes: tuple[str, ...]
    leaf: int | None  # the (first) leaf whose logits it outputs
    input: str | None  # the node whose activation it reads (None: the image)
    outputs: tuple[TensorSpec, ...]
    name_nodes: bool = True  # record its nodes in the file's metadata (not for the whole tree)


def _node_units(tree: "TreeSpec", t: _Tensors, precision: str) -> list[_Unit]:
    dtype, leaf_index = DTYPE_OF[precision], {nid: i for i, nid in enumerate(tree.leaf_order)}
    return [_Unit(file_path("onnx", precision, NODES, node=n.id), NODES, precision, partial(_Parts.node, node=n.id), (n.id,),
                  leaf_index.get(n.id), n.parent, (t.of(n.id, dtype, logits=n.is_leaf),))
            for n in tree.nodes]  # fmt: skip


def _segment_units(tree: "TreeSpec", t: _Tensors, precision: str) -> list[_Unit]:
    dtype = DTYPE_OF[precision]
    return [_Unit(file_path("onnx", precision, SEGMENTS, leaf=s.leaf, num_leaves=tree.num_leaves), SEGMENTS, precision,
                  partial(_Parts.chain, segment=s), s.nodes, s.leaf, s.input,
                  tuple(t.of(n, dtype) for n in s.exports) + (t.of(s.nodes[-1], dtype, logits=True),))
            for s in tree.segments]  # fmt: skip


def _subtree_units(tree: "TreeSpec", t: _Tensors, precision: str) -> list[_Unit]:
    from ..tree import Segment

    dtype, units = DTYPE_OF[precision], []
    for u in tree.subtree_units:
        if u.index == 0:  # leaf 0's chain, exporting what later units read
            chain = Segment(leaf=0, nodes=u.nodes, input=None, exports=u.exports)
            module = partial(_Parts.chain, segment=chain)
            outputs = tuple(t.of(n, dtype) for n in u.exports) + (t.of(u.nodes[-1], dtype, logits=True),)
        else:  # the whole subtree, fused
            module = partial(_Parts.fused, root=u.root)
            outputs = (t.leaves(u.root, u.num_leaves, dtype),)
        units.append(_Unit(file_path("onnx", precision, SUBTREES, unit=u.index, num_leaves=tree.num_leaves), SUBTREES,
                           precision, module, u.nodes, u.first_leaf, u.input, outputs))  # fmt: skip
    return units


def _fused_units(tree: "TreeSpec", t: _Tensors, precision: str) -> list[_Unit]:
    return [_Unit(file_path("onnx", precision, FUSED), FUSED, precision, partial(_Parts.fused, root=None),
                  tuple(n.id for n in tree.nodes), 0, None, (t.leaves(None, tree.num_leaves, DTYPE_OF[precision]),),
                  name_nodes=False)]  # fmt: skip


def _first_units(tree: "TreeSpec", t: _Tensors, precision: str) -> list[_Unit]:
    s = tree.segments[0]
    return [_Unit(file_path("onnx", precision, FIRST, leaf=0, num_leaves=tree.num_leaves), FIRST, precision,
                  partial(_Parts.bare_chain, segment=s), s.nodes, 0, None, (t.of(s.nodes[-1], DTYPE_OF[precision], logits=True),))]


_UNITS_OF = {NODES: _node_units, SEGMENTS: _segment_units, SUBTREES: _subtree_units, FUSED: _fused_units,
             FIRST: _first_units}  # fmt: skip


def _units(tree: "TreeSpec", t: _Tensors, request: _Request) -> list[_Unit]:
    """Every ONNX file the request writes, per precision, in the manifest's order of plans. The first-leaf file
    stands in for a plan's first steps: it is written beside a plan of :data:`FIRST_HOSTS` (not ``fused`` alone,
    whose one call is every leaf)."""
    hosted = request.first_leaf and any(p in FIRST_HOSTS for p in request.plans)
    plans = request.plans + ((FIRST,) if hosted else ())
    return [unit for precision in request.precisions for plan in plans for unit in _UNITS_OF[plan](tree, t, precision)]


def _write_unit(tmp: Path, unit: _Unit, parts: _Parts, t: _Tensors, request: _Request) -> ModelFile:
    """The one writer of a bundle's ONNX files: export the unit's module, check it, and record it."""
    in_spec = t.of(unit.input, DTYPE_OF[unit.precision])
    meta = {"hne_edge.model": parts.model.config.name, "hne_edge.precision": unit.precision}
    export_module(
        unit.module(parts), tmp / unit.path, parts.examples[unit.input], [in_spec.name], [o.name for o in unit.outputs],
        opset=request.opset, exporter=request.exporter, precision=unit.precision,
        metadata={**meta, "hne_edge.nodes": ",".join(unit.nodes)} if unit.name_nodes else meta,
    )  # fmt: skip
    return _model_file(tmp, unit.path, "onnx", unit.plan, unit.precision, unit.nodes, unit.leaf,
                       sum(t.cost.nodes[n].macs for n in unit.nodes), (in_spec,), unit.outputs, request.opset)  # fmt: skip


def _write_weights(tmp: Path, model: "HNE", t: _Tensors) -> ModelFile:
    """``torch/model.pt``: a plain dict of tensors (loads with ``torch.load(weights_only=True)``; the architecture is
    in the manifest)."""
    from ..train.checkpoint import torch_bytes

    rel, tree = file_path("torch", "fp32", WEIGHTS), model.tree
    atomic_write_bytes(tmp / rel, torch_bytes({k: v.detach().cpu() for k, v in model.state_dict().items()}))
    return _model_file(tmp, rel, "torch", WEIGHTS, "fp32", [n.id for n in tree.nodes], None, t.cost.total_macs,
                       (t.of(None, "float32"),), (t.leaves(None, tree.num_leaves, "float32"),))  # fmt: skip


def _model_file(tmp: Path, rel: str, fmt: str, plan: str, precision: str, nodes, leaf, macs, inputs, outputs,
                opset: int | None = None) -> ModelFile:  # fmt: skip
    """The manifest entry of a file just written (its sha256 and size read back from disk)."""
    target = tmp / rel
    return ModelFile(path=rel, format=fmt, plan=plan, precision=precision, sha256=sha256_file(target),
                     bytes=target.stat().st_size, nodes=tuple(nodes), leaf=leaf, macs=int(macs), inputs=tuple(inputs),
                     outputs=tuple(outputs), opset=opset)  # fmt: skip


def _manifest(model: "HNE", cost, files: list[ModelFile], request: _Request, extra_provenance: dict | None) -> Manifest:
    config = model.config
    return Manifest(
        model_name=config.name,
        model_config=config.to_dict(),
        class_names=request.class_names,
        input=InputSpec(
            name="image",
            shape=(BATCH_DIM, *config.input_shape),
            dtype=DTYPE_OF[request.precisions[0]],  # fp32 whenever it is exported; each file states its own dtype
            layout="NCHW",
            mean=tuple(float(v) for v in request.normalization["mean"]),
            std=tuple(float(v) for v in request.normalization["std"]),
            batch=request.batch,
        ),
        tree=model.tree,
        node_macs={nid: c.macs for nid, c in cost.nodes.items()},
        files=tuple(files),
        provenance=provenance(exporter=f"torch.onnx ({request.exporter})", opset=request.opset, bn_folded=True,
                              **(extra_provenance or {})),  # fmt: skip
    )


def export_onnx(
    model: "HNE",
    out_dir: str | os.PathLike,
    *,
    class_names: Sequence[str] | None = None,
    normalization: dict | None = None,
    precisions: str | Sequence[str] = ("fp32",),
    plan: str = BOTH,
    batch: str | tuple[int, int, int] = (1, 1, 16),
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    torch_weights: bool = True,
    exporter: str = "torchscript",
    extra_provenance: dict | None = None,
    verify_batch_sizes: Sequence[int] | None = None,
    post_export: Callable[[Path], None] | None = None,
    progress: Progress | None = None,
    first_leaf: bool = True,
    keep: Sequence[str | os.PathLike] = (),
) -> Path:
    """Export a trained fused HNE to a verified ONNX bundle at ``out_dir``; returns its path.

    Args:
        model: the fused model (its eval-mode numerics are exported; the model is not modified).
        out_dir: the bundle directory; refused if it exists unless ``force``.
        force: replace ``out_dir`` if it is a bundle (holds ``manifest.json``) or empty; anything else,
            the current directory, or a folder holding a path in ``keep`` is refused.
        class_names: one name per class (default ``"0".."C-1"``).
        normalization: ``{"mean": [...], "std": [...]}`` the images are normalised with (default 0/1).
        precisions: ``"fp32"``, ``"fp16"`` or both (``("fp32", "fp16")`` or ``"fp32,fp16"``).
        plan: ``"nodes"`` (one file per tree node), ``"segments"`` (one per leaf), ``"subtrees"`` (leaf 0's
            chain, then one fused file per later whole subtree: B + 1 files), ``"fused"`` (the whole tree in
            one file), a comma-separated list of those, ``"both"`` (nodes and segments) or ``"all"``
            (:data:`hne_edge.bundle.PLAN_TABLE`).
        batch: ``(min, opt, max)`` batch sizes the bundle is meant for (the files have a symbolic batch).
        opset: ONNX opset of every file (None: the exporter's default, :func:`exporter_opset`).
        verify: compare every file and every anytime prefix with the PyTorch model before publishing.
        torch_weights: also write ``torch/model.pt`` (the fused state_dict) for the PyTorch backend.
        exporter: ``"torchscript"`` (default, see module docstring) or ``"dynamo"``.
        extra_provenance: merged into the manifest's provenance (e.g. the source checkpoint).
        verify_batch_sizes: batch sizes the verification runs at (default: min and up to 4).
        post_export: called with the temporary bundle directory after verification, before it is
            published (the TensorRT path builds its engines there, so they are atomic too).
        progress: counts the files as they are written (a total, a rate and an ETA: big trees take minutes),
            then the verification's steps (:func:`~hne_edge.exporters.verify.verify_bundle`); None: silent.
        first_leaf: also write leaf 0's chain without exports (plan ``"first"``, one file per precision)
            beside a plan that runs leaf 0 first (``nodes``, ``segments``, ``subtrees``; not ``fused`` alone):
            the runtime runs it when a frame stops after the first leaf, at the cost of a standalone
            network instead of the exporting segment's (up to ~10% more; BENCHMARKS.md).
        keep: paths ``force`` must never delete (the CLI passes the source checkpoint).

    Raises:
        ExportError: ``out_dir`` exists without ``force``; a file fails its checks
            (:class:`ShapeError`) or its numerics (:class:`ToleranceError`). Nothing
            is left at ``out_dir`` in that case.
    """
    from ..models import tree_cost

    request = _check_request(model, class_names, normalization, precisions, plan, batch, opset, exporter, first_leaf,
                             torch_weights)  # fmt: skip
    model = _exportable(model)
    cost = tree_cost(model)
    tensors = _Tensors(model, cost)
    units = _units(model.tree, tensors, request)  # what each plan writes, nothing built yet
    progress = progress or NULL_PROGRESS
    with atomic_output_dir(out_dir, force=force, keep=keep) as tmp:  # swapped into place when the block ends well
        progress.restart(len(units) + request.torch_weights, "export", "file")
        progress.set(note="slicing the tree into its nodes")
        parts = _Parts(model)
        files = []
        for unit in units:
            files.append(_write_unit(tmp, unit, parts, tensors, request))
            progress.update(note=unit.path)
        if request.torch_weights:
            files.append(_write_weights(tmp, model, tensors))
            progress.update(note=files[-1].path)
        write_manifest(tmp, _manifest(model, cost, files, request, extra_provenance))
        # the runtime's reader must accept what we publish; the sha256s were just computed from these files
        # and the verification below (or the user's `hne-edge verify`) checks them once more
        read_manifest(tmp, verify_files=False)
        if verify:
            from .verify import verify_bundle

            verify_bundle(tmp, model=model, batch_sizes=verify_batch_sizes, node_modules=parts.sliced,
                          progress=progress).raise_for_failures()  # fmt: skip
        if post_export is not None:
            post_export(tmp)
    return Path(out_dir)


def export_standalone_network(
    model: "HNE",
    leaf: int,
    path: str | os.PathLike,
    *,
    precision: str = "fp32",
    opset: int | None = None,
    exporter: str = "torchscript",
    verify: bool = True,
) -> Path:
    """Write ONE ONNX file: the single network root -> ``leaf`` (``model.path_module(leaf)``), ``image`` -> ``logits``.

    The baseline the anytime benchmarks compare against ("first leaf vs a
    standalone single network"). Same folding, dynamic batch and checks as
    the bundle files; with ``verify`` its logits are compared with the fused
    model's leaf ``leaf`` (ONNX Runtime CPU).
    """
    import torch

    precisions = parse_precisions(precision)
    if len(precisions) != 1:
        raise InputError(f"export_standalone_network writes one precision; received {precision!r}")
    precision = precisions[0]
    opset = exporter_opset(exporter, opset, precision)
    model = copy.deepcopy(model).eval().float().cpu()
    if not 0 <= leaf < model.num_leaves:
        raise InputError(f"leaf must be in 0..{model.num_leaves - 1}; received {leaf}")
    module = fold_batchnorm(model.path_module(leaf))
    path = Path(path)
    tmp = scratch_path(path, "tmp")  # ours alone: a user's ".NAME.partial" beside it is neither replaced nor removed
    try:
        export_module(
            module, tmp, _example(model), ["image"], ["logits"], opset=opset, exporter=exporter, precision=precision,
            metadata={"hne_edge.model": model.config.name, "hne_edge.nodes": ",".join(model.tree.path(leaf))},
        )  # fmt: skip
        if verify:
            from .verify import compare_outputs, ort_session

            x = _example(model)
            with torch.no_grad():
                ref = model(x)[:, leaf].numpy()
            sess = ort_session(tmp)
            (got,) = sess.run(None, {"image": x.numpy().astype(DTYPE_OF[precision])})
            compare_outputs(path.name, "logits", got, ref, precision).raise_if_failed()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
