"""TensorRT engines from a bundle's ONNX files (per node and per segment), built on the target device.

Layout: ``tensorrt/trt{major}.{minor}_sm{cc}/{precision}/{plan}/{name}.plan``,
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
pure function it shares with this module (TensorRT not needed).

Only :func:`build_engines` imports TensorRT (lazily); without it, or without a
CUDA device, it raises :class:`BackendUnavailable` with an install hint.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..bundle import MANIFEST_NAME, Manifest, ModelFile, bundle_path, read_manifest, sha256_file, write_manifest
from ..errors import BackendUnavailable, ExportError, InputError

__all__ = [
    "INSTALL_HINT",
    "HARDWARE_LEVELS",
    "engine_dir",
    "engine_path",
    "engine_compatibility",
    "normalize_compute_capability",
    "load_tensorrt",
    "device_info",
    "build_engines",
    "engine_entry",
    "add_files",
]

INSTALL_HINT = (
    "TensorRT is not available: install it on the target (x86_64: pip install 'hne-edge[tensorrt]'; "
    "Jetson: the JetPack 6 python3-libnvinfer package) and run on a machine with an NVIDIA GPU"
)
HARDWARE_LEVELS = ("none", "same_compute_capability", "ampere_plus")


# -- naming and compatibility (pure, shared with the runtime) ----------------------------------------


def normalize_compute_capability(cc: str | Sequence[int] | float) -> str:
    """``(8, 7)``, ``"8.7"``, ``"sm_87"``, ``"sm87"``, ``87`` -> ``"8.7"``."""
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    text = str(cc).strip().lower().removeprefix("sm").lstrip("_")
    if re.fullmatch(r"\d+\.\d+", text):
        return text
    if re.fullmatch(r"\d{2,3}", text):  # "87" -> 8.7, "100" -> 10.0, "121" -> 12.1
        return f"{text[:-1]}.{text[-1]}"
    raise InputError(f"compute capability must look like 8.7, sm_87 or (8, 7); received {cc!r}")


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", str(version))
    if len(parts) < 2:
        raise InputError(f"TensorRT version must look like 10.3.0; received {version!r}")
    return tuple(int(p) for p in parts[:3]) + (0,) * (3 - min(3, len(parts)))


def engine_dir(trt_version: str, compute_capability: str | Sequence[int]) -> str:
    """``tensorrt/trt10.3_sm87``: engines of one TensorRT minor version and one GPU architecture."""
    major, minor, _ = _version_tuple(trt_version)
    cc = normalize_compute_capability(compute_capability).replace(".", "")
    return f"tensorrt/trt{major}.{minor}_sm{cc}"


def engine_path(
    trt_version: str,
    compute_capability: str | Sequence[int],
    precision: str,
    plan: str,
    *,
    node: str | None = None,
    leaf: int | None = None,
    num_leaves: int = 16,
) -> str:
    """Bundle-relative engine path, e.g. ``tensorrt/trt10.3_sm87/fp16/segments/leaf00.plan``."""
    base = f"{engine_dir(trt_version, compute_capability)}/{precision}/{plan}"
    if plan == "nodes":
        if node is None:
            raise InputError("engine_path(plan='nodes') needs node=")
        return f"{base}/{node}.plan"
    if leaf is None:
        raise InputError("engine_path(plan='segments') needs leaf=")
    return f"{base}/leaf{leaf:0{max(2, len(str(num_leaves - 1)))}d}.plan"


def engine_compatibility(build_info: dict, trt_version: str, compute_capability: str | Sequence[int]) -> str | None:
    """Why an engine cannot run here (``None``: it can).

    Rules (TensorRT documentation, "Engine Compatibility"):
      * version: by default only the exact TensorRT version that built it
        (major.minor.patch); built with ``VERSION_COMPATIBLE``, any later
        version of the same major.
      * hardware: by default only the same compute capability;
        ``ampere_plus`` engines run on any GPU of compute capability >= 8.0.
    """
    try:
        built = _version_tuple(build_info["tensorrt_version"])
        built_cc = normalize_compute_capability(build_info["compute_capability"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"engine build info is incomplete or malformed ({exc}); rebuild the engines"
    here = _version_tuple(trt_version)
    here_cc = normalize_compute_capability(compute_capability)
    flags = {str(f).upper() for f in build_info.get("flags", [])}
    v_built, v_here = ".".join(map(str, built)), ".".join(map(str, here))
    if "VERSION_COMPATIBLE" in flags:
        if here[0] != built[0] or here < built:
            return (
                f"engine built with TensorRT {v_built} (version-compatible) needs TensorRT {built[0]}.x >= {v_built}; "
                f"this device has {v_here}"
            )
    elif here != built:
        return f"engine built with TensorRT {v_built}; this device has TensorRT {v_here} (engines need the exact version)"
    level = str(build_info.get("hardware_compatibility", "none")).lower()
    if level == "ampere_plus":
        if float(here_cc) < 8.0:
            return f"engine built for Ampere and newer (compute capability >= 8.0); this GPU is sm_{here_cc.replace('.', '')}"
    elif here_cc != built_cc:
        return (
            f"engine built for compute capability {built_cc} (sm_{built_cc.replace('.', '')}); "
            f"this GPU is {here_cc} (sm_{here_cc.replace('.', '')})"
        )
    return None


# -- TensorRT and device (lazy) ---------------------------------------------------------------------


def load_tensorrt():
    """``import tensorrt``, or :class:`BackendUnavailable` with the install hint."""
    try:
        import tensorrt as trt  # noqa: PLC0415
    except ImportError as exc:
        raise BackendUnavailable(f"{INSTALL_HINT} (import tensorrt failed: {exc})") from None
    return trt


def device_info() -> tuple[str, str]:
    """``(gpu name, compute capability "8.7")`` of CUDA device 0, without torch if possible."""
    try:
        try:
            from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        except ImportError:
            from cuda import cudart  # older cuda-python
        err, prop = cudart.cudaGetDeviceProperties(0)
        if int(err) == 0:
            name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
            return name.strip("\x00 "), f"{prop.major}.{prop.minor}"
    except Exception:  # not installed / no device: try the next source
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip().splitlines()  # fmt: skip
        if out:
            name, cc = (s.strip() for s in out[0].rsplit(",", 1))
            return name, normalize_compute_capability(cc)
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), normalize_compute_capability(torch.cuda.get_device_capability(0))
    except Exception:
        pass
    raise BackendUnavailable("TensorRT engines are built on the target GPU, but no CUDA device was found")


# -- manifest entries (pure) ------------------------------------------------------------------------


def engine_entry(bundle_dir: Path, source: ModelFile, rel: str, build: dict) -> ModelFile:
    """The manifest entry of an engine written at ``bundle_dir/rel`` from ``source`` (an ONNX entry)."""
    target = Path(bundle_dir) / rel
    return replace(
        source,
        path=rel,
        format="tensorrt",
        sha256=sha256_file(target),
        bytes=target.stat().st_size,
        source=source.path,
        build=dict(build),
    )


def add_files(bundle_dir: str | os.PathLike, entries: Sequence[ModelFile]) -> Manifest:
    """Add (or replace, by path) entries in a bundle's manifest; written atomically, then re-read strictly."""
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir, verify_files=False)
    new_paths = {e.path for e in entries}
    files = tuple(f for f in manifest.files if f.path not in new_paths) + tuple(entries)
    updated = replace(manifest, files=files)
    tmp = bundle_dir / f".{MANIFEST_NAME}.partial"
    tmp.mkdir(exist_ok=True)
    try:
        write_manifest(tmp, updated)
        os.replace(tmp / MANIFEST_NAME, bundle_dir / MANIFEST_NAME)
    finally:
        for p in tmp.glob("*"):
            p.unlink()
        tmp.rmdir()
    return read_manifest(bundle_dir, verify_files=True)


# -- the builder ------------------------------------------------------------------------------------


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
) -> list[ModelFile]:
    """Build one engine per ONNX file of the chosen precisions/plans and add them to the bundle's manifest.

    Args:
        bundle_dir: an exported bundle (its ONNX files are the sources).
        precisions / plans: which ONNX variants to build (default: all present).
        batch: optimization profile ``(min, opt, max)`` (default: the bundle's ``input.batch``).
        workspace_mb: builder workspace limit (default: TensorRT's).
        optimization_level: ``builder_optimization_level`` 0..5 (default: TensorRT's, 3).
        hardware_compatibility: ``"none"`` | ``"same_compute_capability"`` | ``"ampere_plus"``.
        version_compatible: set ``VERSION_COMPATIBLE`` (later TensorRT of the same major can run it).
    """
    if hardware_compatibility not in HARDWARE_LEVELS:
        raise InputError(f"hardware_compatibility must be one of {list(HARDWARE_LEVELS)}; received {hardware_compatibility!r}")
    trt = load_tensorrt()
    gpu, cc = device_info()
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir, verify_files=True)
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
    wanted += [(p, q) for p, q in onnx_variants if p == "first" and (p, q) not in wanted and any(w[1] == q for w in wanted)]

    version = trt.__version__
    major = _version_tuple(version)[0]
    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if hardware_compatibility != "none" and not hasattr(trt.HardwareCompatibilityLevel, hardware_compatibility.upper()):
        raise ExportError(f"TensorRT {trt.__version__} has no hardware compatibility level {hardware_compatibility!r}")
    flags = ["STRONGLY_TYPED"]
    if version_compatible:
        flags.append("VERSION_COMPATIBLE")
    out_dir = bundle_dir / engine_dir(version, cc)
    out_dir.mkdir(parents=True, exist_ok=True)
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
    timing_cache = None
    entries: list[ModelFile] = []
    for plan, precision in wanted:
        # fp32 engines: no TF32 (on by default on Ampere+, Jetson Orin included), so an "fp32" engine
        # computes in the fp32 that was verified; fp16 engines get their types from the fp16 ONNX
        no_tf32 = precision == "fp32" and hasattr(trt.BuilderFlag, "TF32")
        build_info = {**base_info, "flags": flags + (["NO_TF32"] if no_tf32 else [])}
        for source in manifest.files_for(plan, precision, "onnx"):
            rel = engine_path(version, cc, precision, plan, node=source.nodes[0] if plan == "nodes" else None,
                              leaf=source.leaf, num_leaves=manifest.tree.num_leaves)  # fmt: skip
            # strongly typed: the ONNX's own types decide the precision (always on, and the flag gone, in 11)
            net_flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if major < 11 else 0
            network = builder.create_network(net_flags)
            parser = trt.OnnxParser(network, logger)
            if not parser.parse_from_file(str(bundle_path(bundle_dir, source))):
                errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                raise ExportError(f"TensorRT could not parse {source.path}: {errors}")
            config = builder.create_builder_config()
            if timing_cache is None:  # one cache for every file of the bundle (and later builds)
                timing_cache = config.create_timing_cache(cache_file.read_bytes() if cache_file.exists() else b"")
            config.set_timing_cache(timing_cache, False)
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
            target = bundle_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bytes(serialized))
            entries.append(engine_entry(bundle_dir, source, rel, build_info))
    if timing_cache is not None:
        cache_file.write_bytes(bytes(timing_cache.serialize()))
    add_files(bundle_dir, entries)
    return entries
