"""TensorRT engines from a bundle's ONNX files (every plan: per node, per segment, per subtree unit, the fused
tree), built on the target device.

Layout (:func:`hne_edge.bundle.file_path`): ``tensorrt/trt{major}.{minor}_sm{cc}/{precision}/{plan}/{name}.plan``,
e.g. ``tensorrt/trt10.3_sm87/fp16/segments/leaf00.plan``, plus one timing
cache per directory ``tensorrt/trt10.3_sm87/timing.cache`` shared by every
build of the bundle (not a model file, so not listed in the manifest).

Precision: every engine is built from the ONNX file of its own precision
with a **strongly typed** network, on TensorRT 10 and 11 alike. The fp16
ONNX files are fp16 end to end (weights, I/O and activations) and already
verified against PyTorch, so the engine computes in exactly the types that
were verified. TensorRT 11 only knows strong typing (the FP16/INT8 builder
flags and calibrators are removed); on TensorRT 10 (JetPack 6) the FP16
builder flag would also work but lets the builder choose per-layer types
that no ONNX verification saw, so it is not used.

Engines are tied to the TensorRT version and GPU they were built with; the
runtime refuses a mismatched engine using :func:`engine_compatibility`, a
pure function of :mod:`hne_edge.tensorrt_compat` that both share (TensorRT not needed).

Only :func:`build_engines` imports TensorRT (lazily); without it, or without a
CUDA device, it raises :class:`BackendUnavailable` with an install hint.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..bundle import (
    FIRST,
    ModelFile,
    bundle_path,
    engine_dir,
    file_key,
    file_path,
    read_manifest,
    read_verified,
    sha256_bytes,
    update_manifest,
)
from ..errors import ExportError, InputError
from ..fileio import atomic_write_bytes, new_folders, remove_new_folders, replace_files_then, scratch_path
from ..progress import NULL_PROGRESS, Progress
from ..tensorrt_compat import (  # noqa: F401 - the exporter's public names; the rules live in tensorrt_compat
    INSTALL_HINT,
    device_info,
    engine_compatibility,
    load_tensorrt,
    normalize_compute_capability,
    version_tuple,
)

log = logging.getLogger("hne_edge.export")

__all__ = [
    "INSTALL_HINT",
    "HARDWARE_LEVELS",
    "engine_compatibility",
    "normalize_compute_capability",
    "load_tensorrt",
    "device_info",
    "build_engines",
    "engine_entry",
]

HARDWARE_LEVELS = ("none", "same_compute_capability", "ampere_plus")


# -- manifest entries (pure) ------------------------------------------------------------------------


def engine_entry(source: ModelFile, rel: str, build: dict, data: bytes) -> ModelFile:
    """The manifest entry of the engine ``data`` written at ``rel`` from ``source`` (an ONNX entry).

    Hashed from the bytes written (the file is not read back): :func:`bundle.update_manifest` trusts it.
    """
    return replace(
        source,
        path=rel,
        format="tensorrt",
        sha256=sha256_bytes(data),
        bytes=len(data),
        source=source.path,
        build=dict(build),
    )


# -- the builder ------------------------------------------------------------------------------------


def _timing_cache(config, cache_file: Path):
    """The folder's timing cache, set on ``config``, when TensorRT takes it; else a new one (which replaces the file
    after the build). The folder holds one TensorRT minor version's engines, and a cache serves only the exact
    version and device that wrote it: TensorRT reports another's as a failure of ``set_timing_cache``."""
    if cache_file.exists():
        cache = config.create_timing_cache(cache_file.read_bytes())
        if cache is not None and config.set_timing_cache(cache, False):
            return cache
        log.warning("TensorRT did not take %s (written by another TensorRT or device); starting a new one", cache_file)
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, False):
        raise ExportError("TensorRT refused a new timing cache (see the TensorRT log)")
    return cache


def build_engines(
    bundle_dir: str | os.PathLike,
    *,
    precisions: Sequence[str] | None = None,
    plans: Sequence[str] | None = None,
    batch: tuple[int, int, int] | None = None,
    workspace_mb: int | None = None,
    optimization_level: int | None = None,
    hardware_compatibility: str = "none",
    version_compatible: bool = False,
    verbose: bool = False,
    progress: Progress | None = None,
) -> list[ModelFile]:
    """Build one engine per ONNX file of the chosen precisions/plans and add them to the bundle's manifest.

    Args:
        bundle_dir: an exported bundle (its ONNX files are the sources).
        precisions / plans: which ONNX variants to build (default: all present).
        batch: optimization profile ``(min, opt, max)`` (default: the bundle's ``input.batch``).
        workspace_mb: builder workspace limit (default: TensorRT's).
        optimization_level: ``builder_optimization_level`` 0..5 (default: TensorRT's, 3).
        hardware_compatibility: ``"none"`` | ``"same_compute_capability"`` | ``"ampere_plus"``.
        version_compatible: set ``VERSION_COMPATIBLE``: later TensorRT of the same major (and 11 for 10) can run it;
            each engine then embeds a lean runtime, which the runtime backend allows when it loads it.
        progress: counts the engines as they are built (each takes seconds to minutes); None: silent.
    """
    if hardware_compatibility not in HARDWARE_LEVELS:
        raise InputError(f"hardware_compatibility must be one of {list(HARDWARE_LEVELS)}; received {hardware_compatibility!r}")
    trt = load_tensorrt(exporting=True)
    gpu, cc = device_info()
    bundle_dir = Path(bundle_dir)
    # each ONNX source is hashed once, on the bytes the parser reads (read_verified below)
    manifest = read_manifest(bundle_dir, verify_files=False)
    batch = tuple(batch or manifest.input.batch)
    onnx_variants = [(p, q) for fmt, p, q in manifest.variants() if fmt == "onnx"]
    wanted = [(p, q) for p, q in onnx_variants if (plans is None or p in plans) and (precisions is None or q in precisions)]
    missing = [f"{p}/{q}" for p in (plans or ()) for q in (precisions or ()) if (p, q) not in onnx_variants]
    if missing or not wanted:
        have = ", ".join(f"{p}/{q}" for p, q in onnx_variants) or "none"
        raise ExportError(
            f"no ONNX source for TensorRT engine(s) {missing or 'requested'}; the bundle has ONNX {have} "
            "(export those precisions/plans first)"
        )
    # the export-free first leaf (plan "first") goes with whichever full plan is built
    wanted += [(p, q) for p, q in onnx_variants if p == FIRST and (p, q) not in wanted and any(w[1] == q for w in wanted)]

    version = trt.__version__
    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if hardware_compatibility != "none" and not hasattr(trt.HardwareCompatibilityLevel, hardware_compatibility.upper()):
        raise ExportError(f"TensorRT {trt.__version__} has no hardware compatibility level {hardware_compatibility!r}")
    flags = ["STRONGLY_TYPED"]
    if version_compatible:
        flags.append("VERSION_COMPATIBLE")
    out_rel = engine_dir(version, cc)
    out_dir = bundle_dir / out_rel
    cache_file = out_dir / "timing.cache"
    base_info = {
        "tensorrt_version": version,
        "gpu": gpu,
        "compute_capability": cc,
        "flags": flags,
        "batch_profile": list(batch),
        "hardware_compatibility": hardware_compatibility,
        "builder_optimization_level": optimization_level,
        "workspace_mb": workspace_mb,
    }
    # each engine (and the timing cache) is staged beside its place and moved there only once all are built, the
    # listed ones put back if the manifest then cannot be written: a build failing or interrupted part-way, up to
    # the manifest's write, leaves the bundle as it was (no unlisted engine, no new folder, listed ones untouched)
    staged: dict[Path, Path] = {}
    created = new_folders(out_dir)
    try:
        entries = _build_all(trt, builder, logger, manifest, wanted, bundle_dir, out_rel, cache_file, base_info, flags,
                             staged, created, workspace_mb=workspace_mb, optimization_level=optimization_level,
                             version_compatible=version_compatible, hardware_compatibility=hardware_compatibility,
                             progress=progress or NULL_PROGRESS)  # fmt: skip
        replace_files_then(staged, lambda: update_manifest(bundle_dir, entries))
    except BaseException:
        for scratch in staged:
            scratch.unlink(missing_ok=True)
        remove_new_folders(created)
        raise
    return entries


def _build_all(trt, builder, logger, manifest, wanted, bundle_dir: Path, out_rel: str, cache_file: Path,
               base_info: dict, flags: list, staged: dict, created: list, *, workspace_mb, optimization_level,
               version_compatible, hardware_compatibility, progress: Progress) -> list[ModelFile]:  # fmt: skip
    """:func:`build_engines`' loop: each engine written to a scratch sibling of its place (``staged``: scratch ->
    place; ``created``: the folders made for them), the timing cache staged last; returns the manifest entries."""
    version = trt.__version__
    major = version_tuple(version)[0]
    batch = base_info["batch_profile"]
    timing_cache = None
    entries: list[ModelFile] = []
    progress.restart(sum(len(manifest.files_for(p, q, "onnx")) for p, q in wanted), "tensorrt", "engine")
    for plan, precision in wanted:
        # fp32 engines: no TF32 (on by default on Ampere+, Jetson Orin included), so an "fp32" engine
        # computes in the fp32 that was verified; fp16 engines get their types from the fp16 ONNX
        no_tf32 = precision == "fp32" and hasattr(trt.BuilderFlag, "TF32")
        build_info = {**base_info, "flags": flags + (["NO_TF32"] if no_tf32 else [])}
        for source in manifest.files_for(plan, precision, "onnx"):
            progress.set(note=f"building from {source.path}")
            rel = file_path("tensorrt", precision, plan, engine_dir=out_rel, **file_key(source, manifest.tree))
            # strongly typed: the ONNX's own types decide the precision (always on, and the flag gone, in 11)
            net_flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if major < 11 else 0
            network = builder.create_network(net_flags)
            parser = trt.OnnxParser(network, logger)
            source_path = bundle_path(bundle_dir, source)
            if not parser.parse(read_verified(source_path, source), str(source_path)):
                errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                raise ExportError(f"TensorRT could not parse {source.path}: {errors}")
            config = builder.create_builder_config()
            if timing_cache is None:  # one cache for every file of the bundle (and later builds)
                timing_cache = _timing_cache(config, cache_file)
            elif not config.set_timing_cache(timing_cache, False):
                raise ExportError(f"TensorRT {version} refused the timing cache it made itself (see the TensorRT log)")
            if workspace_mb:
                config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
            if optimization_level is not None:
                config.builder_optimization_level = int(optimization_level)
            if version_compatible:
                config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
            if no_tf32:
                config.clear_flag(trt.BuilderFlag.TF32)
            if hardware_compatibility != "none":
                config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, hardware_compatibility.upper())
            profile = builder.create_optimization_profile()
            for i in range(network.num_inputs):
                tensor = network.get_input(i)
                rest = tuple(tensor.shape)[1:]
                profile.set_shape(tensor.name, (batch[0], *rest), (batch[1], *rest), (batch[2], *rest))
            config.add_optimization_profile(profile)
            serialized = builder.build_serialized_network(network, config)
            if serialized is None:
                raise ExportError(f"TensorRT failed to build an engine from {source.path} (see the TensorRT log above)")
            data = bytes(serialized)
            target = bundle_dir / rel
            created += [p for p in new_folders(target.parent) if p not in created]
            scratch = scratch_path(target, "partial")
            staged[scratch] = target
            atomic_write_bytes(scratch, data)  # a killed build leaves no half engine beside the manifest
            entries.append(engine_entry(source, rel, build_info, data))
            progress.update(note=rel)
    if timing_cache is not None:
        scratch = scratch_path(cache_file, "partial")
        staged[scratch] = cache_file
        atomic_write_bytes(scratch, bytes(timing_cache.serialize()))
    return entries
