"""PyTorch backend: runs the bundle's fused weights (``torch/model.pt``) as per-segment or per-node modules.

The model is rebuilt from the manifest's ``model.config`` and the state dict
is loaded with ``weights_only=True``; units are ``model.segment_module(i)``
(plan "segments") or ``model.node_module(id)`` (plan "nodes"), each built by
:meth:`TorchBackend.prepare`: BatchNorm folded into the convolutions (in fp32,
``fold_batchnorm=True``), then cast to fp16 for ``precision="fp16"``. Bundles
carry fp32 torch weights only, so fp16 always converts them; on the CPU torch
runs fp16 convolutions correctly but slower than fp32 (a numerics check, not a
speed-up; BENCHMARKS.md). Handles are torch tensors; ``from_host`` wraps the
numpy image without a copy (cast to fp16 when needed) and ``to_host`` returns
fp32 logits as numpy. The CUDA variant (:mod:`.torch_cuda`) moves the modules
to the GPU.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...bundle import Manifest, bundle_path
from ...errors import BackendUnavailable, BundleError
from .base import Backend, Handle, Runner, Unit, units_from_tree

__all__ = ["TorchBackend", "TorchRunner"]


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable(f"backend 'torch' needs PyTorch ({exc}); pip install 'hne-edge[train]'") from None
    return torch


class TorchRunner(Runner):
    def __init__(self, unit: Unit, backend: "TorchBackend", kind: str, key: Any) -> None:
        super().__init__(unit)
        self._backend = backend
        self._kind = kind
        self._key = key
        self.module = None

    def activate_impl(self) -> None:
        model = self._backend.model
        module = model.segment_module(self._key) if self._kind == "segment" else model.node_module(self._key)
        self.module = self._backend.prepare(module)
        self._torch = self._backend.torch
        self._tuple = self._kind == "segment"

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        with self._torch.inference_mode():
            out = self.module(inputs[0])
        return out if self._tuple else (out,)

    def release_impl(self) -> None:
        self.module = None


class TorchBackend(Backend):
    """Args:
    device: "cpu".
    threads: torch intra-op threads (``torch.set_num_threads``; process-wide), None: leave as is.
    fold_batchnorm: fold each BatchNorm into its convolution when a unit's module is built
        (fewer kernels; the same function up to fp32 rounding).
    """

    name = "torch"
    format = "torch"
    devices = ("cpu",)

    def __init__(self, device: str = "cpu", threads: int | None = None, fold_batchnorm: bool = True) -> None:
        super().__init__(device)
        self.torch = _import_torch()
        if threads is not None:
            self.torch.set_num_threads(int(threads))
        self.threads = threads
        self.fold_batchnorm = bool(fold_batchnorm)
        self.half = False
        self.model = None
        self._weights: Path | None = None

    def units(self, manifest: Manifest, bundle_dir: Path, plan: str, precision: str) -> list[Unit]:
        self.half = precision == "fp16"
        try:
            (weights,) = manifest.files_for("weights", precision, "torch")
        except BundleError:
            if precision != "fp16":
                raise
            (weights,) = manifest.files_for("weights", "fp32", "torch")  # converted by prepare()
        self._weights = bundle_path(bundle_dir, weights)
        self._weights_file = weights
        return units_from_tree(manifest, plan, precision, weights.path, self._weights)

    def prepare(self, module: Any) -> Any:
        """A unit's module as it runs: BatchNorm folded (in fp32, before any cast), then fp16 if asked."""
        from ...models.layers import fold_batchnorm

        module = module.float().eval()
        if self.fold_batchnorm:
            module = fold_batchnorm(module)
        return module.half() if self.half else module

    def _load(self, manifest: Manifest) -> None:
        from ...models import build_model

        torch = self.torch
        try:
            data = self.read_file(self._weights, self._weights_file)  # the checked bytes, not the path again
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except BundleError:
            raise
        except Exception as exc:
            raise BundleError(f"{self._weights}: not a loadable torch state_dict ({exc})") from None
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # tolerate a checkpoint-shaped file
        model = build_model(manifest.model_config)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise BundleError(f"{self._weights}: weights do not match model.config: {exc}") from None
        self.model = model.eval()

    def create_runner(self, unit: Unit, manifest: Manifest, bundle_dir: Path) -> Runner:
        if self.model is None:
            self._load(manifest)
        if unit.name.rsplit("#", 1)[-1].startswith("segment"):
            return TorchRunner(unit, self, "segment", unit.leaf)
        return TorchRunner(unit, self, "node", unit.nodes[0])

    def from_host(self, array: np.ndarray) -> Handle:
        x = self.torch.from_numpy(array)
        return x.half() if self.half else x

    def to_host(self, handle: Handle) -> np.ndarray:
        return (handle.float() if self.half else handle).numpy()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device": self.device,
            "torch": self.torch.__version__,
            "threads": self.threads,
            "fp16": self.half,
            "fold_batchnorm": self.fold_batchnorm,
        }

    def close(self) -> None:
        self.model = None
