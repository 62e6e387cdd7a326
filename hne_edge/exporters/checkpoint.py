"""A training checkpoint -> a verified bundle, in one call (what ``hne-edge export`` runs).

    from hne_edge.exporters import export_checkpoint
    export_checkpoint("runs/digits/checkpoint.pt", "bundle/", precisions="fp32,fp16")

The checkpoint carries the class names and the normalization the bundle
needs; its path and sha256 go into the manifest's provenance. With
``format="tensorrt"`` the engines are built into the bundle before it is
published, so the ONNX files and the engines appear together or not at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..bundle import BOTH, PLAN_GROUPS, sha256_file
from .base import package_version, parse_batch, parse_plan, parse_precisions

if TYPE_CHECKING:  # pragma: no cover
    from ..progress import Progress

__all__ = ["EXPORT_FORMATS", "export_checkpoint"]

EXPORT_FORMATS = ("onnx", "tensorrt")


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    format: str = "onnx",
    precisions: str | Sequence[str] = ("fp32",),
    plan: str = BOTH,
    batch: str | tuple[int, int, int] = (1, 1, 16),
    opset: int | None = None,
    force: bool = False,
    verify: bool = True,
    torch_weights: bool = True,
    first_leaf: bool = True,
    exporter: str = "torchscript",
    tensorrt_options: dict | None = None,
    progress: "Progress | None" = None,
) -> Path:
    """Export the model of ``checkpoint`` (written by ``hne-edge train``) to a bundle at ``out_dir``; returns its path.

    Args:
        format: ``"onnx"`` (the portable bundle) or ``"tensorrt"`` (ONNX plus engines built on this GPU).
        tensorrt_options: keyword arguments of :func:`hne_edge.exporters.tensorrt.build_engines`
            (``workspace_mb``, ``hardware_compatibility``, ``version_compatible``).
        progress: a :class:`~hne_edge.progress.Progress` for the files, the verification and the engines.
        The other arguments are :func:`hne_edge.exporters.onnx.export_onnx`'s. The checkpoint itself is never
        replaced, even with ``force``.
    """
    from ..errors import InputError

    if format not in EXPORT_FORMATS:
        raise InputError(f"format: received {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    precisions, batch = parse_precisions(precisions), parse_batch(batch)
    checkpoint = Path(checkpoint)
    build_after_verify: Callable[[Path], None] | None = None  # TensorRT: engines built in the unpublished folder
    if format == "tensorrt":
        from .tensorrt import build_engines, device_info, load_tensorrt

        load_tensorrt(exporting=True)  # fail before any work: a clear message and the install hint
        device_info()
        plans = None if plan in PLAN_GROUPS else parse_plan(plan)  # the default: every plan exported

        def build_engines_into(tmp: Path) -> None:
            build_engines(tmp, precisions=precisions, plans=plans, batch=batch, progress=progress, **(tensorrt_options or {}))

        build_after_verify = build_engines_into

    from ..train.checkpoint import model_from_checkpoint
    from .onnx import export_onnx

    model, state = model_from_checkpoint(checkpoint)  # the one read of the checkpoint (its weights checked)
    return export_onnx(
        model,
        out_dir,
        class_names=state["class_names"],
        normalization=state["normalization"],
        precisions=precisions,
        plan=plan,
        batch=batch,
        opset=opset,
        force=force,
        verify=verify,
        torch_weights=torch_weights,
        first_leaf=first_leaf,
        exporter=exporter,
        progress=progress,
        extra_provenance={"checkpoint": str(checkpoint), "checkpoint_sha256": sha256_file(checkpoint),
                          "tensorrt": package_version("tensorrt") if format == "tensorrt" else None},  # fmt: skip
        post_export=build_after_verify,
        keep=(checkpoint,),
    )
