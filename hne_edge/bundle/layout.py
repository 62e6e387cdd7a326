"""The bundle's layout: where each file goes (:func:`file_path`), what a bundle folder holds at its top
(:data:`BUNDLE_LAYOUT`), the names of its profiles and engine folders, and that a listed path stays inside it."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BundleError
from ..limits import MAX_JSON_BYTES
from .vocabulary import FORMATS, PLAN_TABLE, PLANS, PRECISIONS, RUNNER_PLANS, WEIGHTS

if TYPE_CHECKING:  # pragma: no cover
    from ..tree import TreeSpec
    from .schema import ModelFile

__all__ = [
    "MANIFEST_NAME",
    "PROFILES_DIR",
    "PROFILE_FORMAT",
    "MAX_PROFILE_BYTES",
    "BUNDLE_LAYOUT",
    "file_path",
    "file_key",
    "engine_dir",
    "profile_filename",
    "path_component",
    "resolve_in_bundle",
    "bundle_path",
    "not_a_bundle",
]

MANIFEST_NAME = "manifest.json"
PROFILES_DIR = "profiles"  # cost models a runtime measured on this bundle (runtime/profile_file.py)
PROFILE_FORMAT = "hne-edge-profile"  # the "format" of every profile file (runtime/profile_file.py writes and reads them)
# the top-level entries of a bundle folder: its manifest, one folder per format, the profiles; nothing else
BUNDLE_LAYOUT = {MANIFEST_NAME: "file", **dict.fromkeys(FORMATS, "dir"), PROFILES_DIR: "dir"}
_SUFFIX = {"onnx": ".onnx", "tensorrt": ".plan"}


def profile_filename(device: str, backend: str, plan: str, precision: str, options: Any = None) -> str:
    """The name of a cost profile in a bundle's ``profiles/`` (one per device, backend, runner plan and precision,
    and backend options: ``options``, those not at their defaults, add a digest of theirs, so that another
    setup's profile is never overwritten; the default setup's name has none)."""
    if not options:
        return f"{device}-{backend}-{plan}-{precision}.json"
    digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{device}-{backend}-{plan}-{precision}-{digest}.json"


# what profile_filename makes (a device name has no "-"; a backend name may); a profile is at most this big
_PROFILE_NAME = re.compile(
    rf"[^-/\x00]+-[^/\x00]+-(?:{'|'.join(RUNNER_PLANS)})-(?:{'|'.join(PRECISIONS)})(?:-[0-9a-f]{{8}})?\.json")
MAX_PROFILE_BYTES = MAX_JSON_BYTES  # the bound the runtime reads a profile within (hne_edge.limits)


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
    """Bundle-relative path of a model file (the one layout rule; see :mod:`hne_edge.bundle`).

    ``onnx/fp32/nodes/b1.0.onnx``, ``onnx/fp16/segments/leaf03.onnx``, ``onnx/fp32/first/leaf00.onnx``,
    ``onnx/fp32/subtrees/unit02.onnx``, ``onnx/fp32/fused/tree.onnx``,
    ``tensorrt/trt10.3_sm87/fp16/segments/leaf00.plan`` (``engine_dir``: from :func:`engine_dir`),
    ``torch/model.pt`` (plan "weights"). Leaves and units are zero-padded to at least 2 digits; a plan's
    keyword (``node=``, ``leaf=``, ``unit=``) is its :attr:`~hne_edge.bundle.vocabulary.Plan.key`.
    """
    if fmt == "torch" and plan == WEIGHTS:
        return "torch/model.pt"
    models = [p for p in PLANS if p != WEIGHTS]
    if fmt not in _SUFFIX or plan not in models or precision not in PRECISIONS:
        raise ValueError(
            f"file_path: received format {fmt!r}, plan {plan!r}, precision {precision!r}; expected a format of "
            f"{list(_SUFFIX)}, a plan of {models} and a precision of {list(PRECISIONS)} (or torch weights)"
        )
    if fmt == "tensorrt" and engine_dir is None:
        raise ValueError("file_path(format='tensorrt') needs engine_dir= (see bundle.engine_dir)")
    base = f"{engine_dir if fmt == 'tensorrt' else fmt}/{precision}/{plan}"
    key = PLAN_TABLE[plan].key
    if key is None:  # one file per variant
        return f"{base}/tree{_SUFFIX[fmt]}"
    value = {"node": node, "leaf": leaf, "unit": unit}[key]
    if value is None:
        raise ValueError(f"file_path(plan={plan!r}) needs {key}=")
    if key == "node":
        return f"{base}/{value}{_SUFFIX[fmt]}"
    digits = max(2, len(str(num_leaves - 1)))
    return f"{base}/{key}{value:0{digits}d}{_SUFFIX[fmt]}"


def file_key(model_file: "ModelFile", tree: "TreeSpec") -> dict[str, Any]:
    """The :func:`file_path` keyword that names ``model_file`` within its plan (``node=``, ``leaf=`` or ``unit=``),
    so a file of one format (an ONNX source) gives the path of its counterpart in another (its engine)."""
    key = PLAN_TABLE[model_file.plan].key
    if key == "node":
        return {"node": model_file.nodes[0], "num_leaves": tree.num_leaves}
    if key == "unit":
        index = next(u.index for u in tree.subtree_units if u.first_leaf == model_file.leaf)
        return {"unit": index, "num_leaves": tree.num_leaves}
    return {"leaf": model_file.leaf, "num_leaves": tree.num_leaves}


_ENGINE_DIR = re.compile(r"trt[0-9]+\.[0-9]+_sm[0-9]+")  # the last part of what engine_dir makes


def engine_dir(trt_version: str, compute_capability: Any) -> str:
    """``tensorrt/trt10.3_sm87``: engines of one TensorRT minor version and one GPU architecture."""
    from ..tensorrt_compat import normalize_compute_capability, version_tuple

    major, minor = version_tuple(trt_version)[:2]
    cc = normalize_compute_capability(compute_capability).replace(".", "")
    return f"tensorrt/trt{major}.{minor}_sm{cc}"


def path_component(name: str, limit: int = 64) -> str:
    """``name`` (read from a file) made safe as one path component: no separators, no ``..``, no control characters."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in str(name))[:limit].lstrip(".")
    return safe or "model"


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


def bundle_path(bundle_dir: str | os.PathLike, model_file: ModelFile) -> Path:
    """Absolute path of a model file (validated)."""
    return resolve_in_bundle(Path(bundle_dir), model_file.path, model_file.path)


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
