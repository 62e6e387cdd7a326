"""The tiny HNE that ``hne-edge doctor`` runs, and the pre-exported copy the package ships.

The model is ``hne_tiny`` (16 leaves, 16x16 input) slimmed to 15k parameters, with random weights drawn
from NumPy's legacy ``RandomState`` (its stream is frozen by NumPy's compatibility policy, so the weights
rebuild bit for bit on any machine) and scaled so that the logits are O(1): an absolute tolerance means
something and every layer matters. The reference is the fused PyTorch model in float64 on a fixed input,
which shares no code with the exporter's per-node slicing, BatchNorm folding or the runtime.

Two ways to get the bundle:

* :func:`export_tiny` (torch and onnx present): export it now, with every anytime plan this version has,
  fp32 and fp16, the export-free first leaf and the torch weights; compute the reference now.
* :func:`unpack_shipped` (a runtime-only install: numpy + onnxruntime): unpack
  ``hne_edge/assets/doctor_tiny.tar.xz``, the same bundle exported when the asset was built, with its float64
  reference stored beside it. ``python -m hne_edge.doctor.tiny --write`` rebuilds the asset and its record
  ``doctor_tiny.json``; ``tests/doctor/test_tiny.py`` rebuilds it and checks that it matches.

Why one compressed archive: the bundle is ~100 small files (0.78 MB) that share most of their bytes (graph
structure, the manifest's repeated keys); a solid xz tar holds them in ~0.15 MB where a zip (per-file
deflate) needs 0.36 MB. Unpacking writes real files, and ``read_manifest`` checks every one's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import platform
import sys
import tempfile
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import ALL, PRECISIONS, read_manifest
from ..errors import BundleError
from ..fileio import atomic_write_bytes, atomic_write_json

__all__ = [
    "MODEL",
    "OVERRIDES",
    "ASSET",
    "RECORD",
    "TinyBundle",
    "tiny_model",
    "tiny_input",
    "reference_logits",
    "export_tiny",
    "unpack_shipped",
    "write_asset",
]

MODEL = "hne_tiny"
# hne_tiny's tree and input, narrower: 15k parameters (hne_tiny: 44k), so the shipped bundle stays small
OVERRIDES = {"stem_channels": (4, 8), "blocks": ((8, 1, 1), (8, 1, 1), (16, 2, 1), (16, 1, 1), (16, 1, 1))}
WEIGHT_SEED, INPUT_SEED = 0, 1
BATCH = 2  # > 1, so a runtime that mixed up the batch dimension is caught
BATCH_RANGE = (1, 1, 4)
ASSETS = Path(__file__).resolve().parents[1] / "assets"
ASSET = ASSETS / "doctor_tiny.tar.xz"
RECORD = ASSETS / "doctor_tiny.json"
REFERENCE = "reference.npz"  # in the archive, beside bundle/: x (float32) and logits (float64, batch x leaves x classes)


@dataclass(frozen=True)
class TinyBundle:
    """A bundle to check and the independent reference to check it against."""

    bundle_dir: Path
    x: np.ndarray  # (BATCH, C, H, W) float32: the input every check feeds
    reference: np.ndarray  # (BATCH, leaves, classes) float64: the fused torch model in float64 on ``x``
    origin: str  # "fresh" (exported now) or "shipped" (the package's pre-exported copy)

    def prefix(self, n: int) -> np.ndarray:
        """The reference anytime output after ``n`` leaves: the mean of the first ``n`` leaves' logits."""
        return self.reference[:, :n].mean(axis=1)


def tiny_model():
    """The slim hne_tiny with its deterministic weights (eval mode, float32). Needs torch."""
    import torch
    from torch import nn

    from ..models import create_model

    model = create_model(MODEL, **OVERRIDES).eval()
    rng = np.random.RandomState(WEIGHT_SEED)
    filled: set[int] = set()

    def fill(tensor: torch.Tensor, values: np.ndarray) -> None:
        tensor.copy_(torch.from_numpy(values.astype(np.float32)))
        filled.add(tensor.data_ptr())

    with torch.no_grad():
        for module in model.modules():  # named_modules order: deterministic for a given architecture
            if isinstance(module, nn.Conv2d):
                fan_in = int(np.prod(module.weight.shape[1:]))
                fill(module.weight, rng.standard_normal(module.weight.shape) / np.sqrt(fan_in))
                if module.bias is not None:
                    fill(module.bias, rng.standard_normal(module.bias.shape) * 0.1)
            elif isinstance(module, nn.BatchNorm2d):  # non-identity statistics: a folding or slicing slip shows
                n = module.num_features
                fill(module.running_mean, rng.standard_normal(n) * 0.1)
                fill(module.running_var, rng.uniform(0.75, 1.25, n))
                fill(module.weight, rng.uniform(0.75, 1.25, n))
                fill(module.bias, rng.standard_normal(n) * 0.1)
    missed = [k for k, v in model.state_dict().items() if v.is_floating_point() and v.data_ptr() not in filled]
    if missed:  # a layer type this function does not know: its weights would depend on torch's RNG
        raise RuntimeError(f"tiny_model: no deterministic values for {missed[:5]}; add their layer type to tiny_model")
    return model


def tiny_input(channels: int = 3, size: int = 16) -> np.ndarray:
    """The fixed input every check feeds: standard-normal (a normalised image), float32."""
    return np.random.RandomState(INPUT_SEED).standard_normal((BATCH, channels, size, size)).astype(np.float32)


def reference_logits(model, x: np.ndarray) -> np.ndarray:
    """(batch, leaves, classes) logits of the fused model computed in float64 (a copy; ``model`` is untouched)."""
    import copy

    import torch

    with torch.no_grad():
        return copy.deepcopy(model).double().eval()(torch.from_numpy(x).double()).numpy()


def export_tiny(out_dir: str | os.PathLike, *, precisions: tuple[str, ...] = PRECISIONS, timestamp: bool = True) -> TinyBundle:
    """Export the tiny bundle to ``out_dir/bundle`` now and compute its float64 reference. Needs torch and onnx.

    Every anytime plan (``plan="all"``: each plan of ``bundle.ANYTIME_PLANS``), ``precisions``, the
    export-free first leaf and the torch weights. The exporter's own verification is skipped: the doctor
    compares every prefix with the float64 reference itself. ``timestamp=False`` leaves the time out of the
    manifest's provenance, so the same versions of torch and onnx rebuild the same bytes (the shipped asset).
    """
    from ..exporters import export_onnx

    out = Path(out_dir)
    model = tiny_model()
    x = tiny_input(model.config.in_chans, model.config.input_size)
    bundle = export_onnx(model, out / "bundle", precisions=precisions, plan=ALL, batch=BATCH_RANGE,
                         verify=False, torch_weights=True,
                         extra_provenance=None if timestamp else {"created": "not recorded (rebuilt bit for bit)"})  # fmt: skip
    return TinyBundle(Path(bundle), x, reference_logits(model, x), "fresh")


def unpack_shipped(out_dir: str | os.PathLike, asset: str | os.PathLike | None = None) -> TinyBundle:
    """Unpack the shipped asset (default :data:`ASSET`) into ``out_dir`` (real files; their sha256 are checked
    here) with its reference."""
    out = Path(out_dir)
    asset = Path(ASSET if asset is None else asset)
    if not asset.is_file():
        raise BundleError(f"the doctor's shipped bundle {asset} is missing; reinstall hne-edge (it is package data)")
    try:
        with tarfile.open(asset, "r:xz") as archive:
            for member in archive.getmembers():  # regular files under out_dir only: no links, no '..', no absolute paths
                parts = member.name.split("/")
                if not member.isfile() or member.name.startswith("/") or ".." in parts:
                    raise BundleError(f"{asset}: member {member.name!r} is not a plain file inside the archive's folder")
                target = out.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.extractfile(member).read())
    except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
        raise BundleError(f"{asset} is not a valid .tar.xz ({exc}); reinstall hne-edge") from None
    read_manifest(out / "bundle", verify_files=True)  # every file as the asset's manifest recorded it
    with np.load(out / REFERENCE) as ref:
        x, logits = ref["x"], ref["logits"]
    return TinyBundle(out / "bundle", x, logits, "shipped")


def _archive(root: Path) -> bytes:
    """The files under ``root`` as a .tar.xz, byte-identical for identical files (sorted; no times, owners or modes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME)


def write_asset(asset: str | os.PathLike = ASSET, record: str | os.PathLike | None = RECORD) -> dict[str, Any]:
    """Rebuild the shipped archive (bundle + float64 reference) and its JSON record; returns the record."""
    import onnx
    import torch

    from .. import __version__

    with tempfile.TemporaryDirectory(prefix="hne-doctor-asset-") as tmp:
        tiny = export_tiny(tmp, timestamp=False)
        np.savez(Path(tmp) / REFERENCE, x=tiny.x, logits=tiny.reference)
        files = sorted(p.relative_to(tmp).as_posix() for p in Path(tmp).rglob("*") if p.is_file())
        unpacked = sum((Path(tmp) / f).stat().st_size for f in files)
        data = _archive(Path(tmp))
    atomic_write_bytes(Path(asset), data)
    info = {
        "what": "the bundle `hne-edge doctor` runs where torch is absent, and its float64 reference (hne_edge/doctor/tiny.py)",
        "command": "python -m hne_edge.doctor.tiny --write",
        "model": MODEL,
        "overrides": {k: [list(r) for r in v] if k == "blocks" else list(v) for k, v in OVERRIDES.items()},
        "weight_seed": WEIGHT_SEED,
        "input_seed": INPUT_SEED,
        "input_shape": list(tiny.x.shape),
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "unpacked_bytes": unpacked,
        "files": len(files),
        "built_with": {"hne_edge": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                       "numpy": np.__version__, "python": platform.python_version()},  # fmt: skip
    }
    if record is not None:
        atomic_write_json(Path(record), info, indent=1)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hne_edge.doctor.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rebuild {ASSET.name} and {RECORD.name} (needs torch and onnx)")
    args = parser.parse_args(argv)
    if not args.write:
        print(RECORD.read_text() if RECORD.is_file() else f"{RECORD} is missing; run with --write")
        return 0
    info = write_asset()
    print(f"wrote {ASSET} ({info['bytes'] / 1024:.0f} KiB; {info['files']} files, {info['unpacked_bytes'] / 1024:.0f} KiB unpacked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
