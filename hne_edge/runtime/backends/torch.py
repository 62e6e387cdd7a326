"""PyTorch backend: runs the bundle's fused weights (``torch/model.pt``) as per-segment or per-node modules.

The model is rebuilt from the manifest's ``model.config`` and the state dict
is loaded with ``weights_only=True``; units are ``model.segment_module(i)``
(plan "segments"), ``model.node_module(id)`` (plan "nodes"), ``model.unit_module(i)``
(plan "subtrees": leaf 0's chain, then each whole subtree fused) or the fused model
itself (plan "fused"), each built by
:meth:`TorchBackend.prepare`: BatchNorm folded into the convolutions (in fp32,
``fold_batchnorm=True``), then cast to fp16 for ``precision="fp16"``. Bundles
carry fp32 torch weights only, so fp16 always converts them; on the CPU torch
runs fp16 convolutions correctly but slower than fp32 (a numerics check, not a
speed-up; BENCHMARKS.md). :meth:`TorchBackend.load` reads the weights once (the
checked bytes) and builds the model; its :class:`~.base.LoadedPlan` carries the
units (``kind`` "segment" or "node", ``key`` the leaf or node id), the image
dtype (fp16 for ``precision="fp16"``: the runner casts the image) and the weights
file. Handles are torch tensors; ``from_host`` wraps the numpy image without a
copy (``owned`` copies it for a session, which outlives the call) and ``to_host`` returns fp32 logits as numpy.
The CUDA variant (:mod:`.torch_cuda`) moves the modules to the GPU.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...bundle import ANYTIME_PLANS, WEIGHTS, Manifest, bundle_path
from ...errors import BackendUnavailable, BundleError, InputError, install_hint
from ...limits import check_threads
from .base import Backend, Handle, LoadedPlan, Runner, Unit, check_flag, check_positive, image_dtype, units_from_tree

__all__ = ["TorchBackend", "TorchRunner", "COMPILE_MODES"]

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")  # torch.compile modes that leave CUDA graphs to the backend
#: shapes each compiled unit may be compiled for: units of a class share one ``forward``, and dynamo's limit of 8
#: compilations a code object (``recompile_limit``) ran the rest eagerly - 16 segments at 5 capture sizes compiled 8
RECOMPILES_PER_UNIT = 32


def _allow_recompiles(torch: Any, needed: int) -> None:
    """Raise dynamo's per-code-object and accumulated compile limits to at least ``needed`` (never lower them)."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        if hasattr(config, name) and getattr(config, name) < needed:
            setattr(config, name, needed)


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable(f"backend 'torch' needs PyTorch ({exc}); {install_hint('train')}") from None
    return torch


class TorchRunner(Runner):
    def __init__(self, unit: Unit, backend: "TorchBackend", loaded: LoadedPlan) -> None:
        super().__init__(unit)
        self._backend = backend
        self._model = loaded.model
        self._half = loaded.precision == "fp16"
        self.module = None

    def activate_impl(self) -> None:
        unit, model = self.unit, self._model
        if unit.kind == "segment":
            module = model.segment_module(unit.key)
        elif unit.kind == "subtree":
            module = model.unit_module(unit.key)
        elif unit.kind == "tree":
            module = copy.deepcopy(model)  # prepare() may cast it in place; the model is shared
        else:
            module = model.node_module(unit.key)
        self.module = self._backend.prepare(module, half=self._half)
        self._torch = self._backend.torch
        self._tuple = unit.kind in ("segment", "subtree")  # their modules return a tuple of outputs

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        with self._torch.inference_mode():
            out = self.module(inputs[0])
        return out if self._tuple else (out,)

    def release_impl(self) -> None:
        self.module = None


class TorchBackend(Backend):
    """Args:
    device: "cpu".
    threads: torch intra-op threads (``torch.set_num_threads``; process-wide), None: leave as is; at most
        :func:`hne_edge.limits.max_threads`.
    fold_batchnorm: fold each BatchNorm into its convolution when a unit's module is built
        (fewer kernels; the same function up to fp32 rounding).
    compile: ``torch.compile`` each unit's module once it is built (off by default): ``True`` for the
        default compiler (inductor: fuses a convolution's bias, activation and residual add into fewer kernels),
        or the name of a ``torch.compile`` backend (``"aot_eager"`` checks the tracing without code generation).
        Shapes are static (``dynamic=False``): each batch size compiles once, on its first call. The first call
        of each unit and batch size pays the compilation (seconds to minutes), so construct the runner with its
        warm-up and profile before deadlines matter. Meant for plans with few units (``fused``, ``subtrees``).
    compile_mode: the ``torch.compile`` mode with ``compile=True`` (None: inductor's default);
        ``"max-autotune-no-cudagraphs"`` autotunes each kernel (minutes). Modes that capture CUDA graphs of their
        own (``"reduce-overhead"``, ``"max-autotune"``) are refused: the CUDA backend captures each unit itself.

    The levers below compute the same function another way (issue 40 item 4: measured one at a time by
    ``benchmarks/bench_kernels.py --levers``, each prefix against float64); all off by default:

    pointwise: ``"bmm"`` runs every branch-parallel 1x1 convolution as one batched matrix multiply over its
        branches (:class:`~hne_edge.models.layers.PointwiseConv2d`; the folded bias added), ``"conv"`` as is.
    dense_groups: grouped convolutions of 2 to ``dense_groups`` groups (not depthwise) run as one dense
        convolution with a block-diagonal weight (:func:`~hne_edge.models.layers.densify_groups`); 1: none.
    bfloat16: each unit computes in bfloat16 (weights cast after folding, the fp32 image cast on the device,
        activations between units in bfloat16, logits cast to fp32 on the way to the host): about three
        significant digits, for fp32 bundles (``precision="fp16"`` is the bundle's own reduced precision).
    """

    name = "torch"
    format = "torch"
    devices = ("cpu",)

    def __init__(self, device: str = "cpu", threads: int | None = None, fold_batchnorm: bool = True,
                 compile: bool | str = False, compile_mode: str | None = None, pointwise: str = "conv",
                 dense_groups: int = 1, bfloat16: bool = False) -> None:  # fmt: skip
        super().__init__(device)
        threads = check_threads(threads)
        if not isinstance(compile, (bool, str)) or compile == "":
            raise InputError(f"compile: received {compile!r}; expected True, False or a torch.compile backend name")
        if compile_mode is not None and (compile is not True or compile_mode not in COMPILE_MODES):
            raise InputError(f"compile_mode: received {compile_mode!r} with compile={compile!r}; expected None, or "
                             f"one of {', '.join(COMPILE_MODES)} with compile=True (modes that capture CUDA graphs "
                             "of their own are refused: the CUDA backend captures each unit itself)")
        dense_groups = check_positive(dense_groups, "dense_groups", " (1: no convolution densified)")
        check_flag(bfloat16, "bfloat16")
        check_flag(fold_batchnorm, "fold_batchnorm")
        self.torch = _import_torch()
        from ...models.layers import POINTWISE_MODES

        if pointwise not in POINTWISE_MODES:
            raise InputError(f"pointwise: received {pointwise!r}; expected one of {', '.join(POINTWISE_MODES)}")
        if threads is not None:
            self.torch.set_num_threads(threads)
        self.threads = threads
        self.fold_batchnorm = fold_batchnorm
        self.compile = compile
        self.compile_mode = compile_mode
        self.pointwise = pointwise
        self.dense_groups = dense_groups
        self.bfloat16 = bfloat16
        self._compiled_units = 0  # dynamo's compile limits grow with them (prepare)

    def has_plan(self, manifest: Manifest, plan: str, precision: str) -> bool:
        """Every plan is a view of the weights file: the bundle needs only that (fp32 serves fp16 too)."""
        return plan in ANYTIME_PLANS and any(v[:2] == ("torch", WEIGHTS) for v in manifest.variants())

    def load(self, manifest: Manifest, bundle_dir: Path, plan: str, precision: str) -> LoadedPlan:
        """Units from the tree over the bundle's (fp32) weights, read once and built into the model here."""
        if self.bfloat16 and precision != "fp32":
            raise InputError(f"bfloat16 computes an fp32 bundle in bfloat16; received precision {precision!r} too: "
                             "expected precision 'fp32' with bfloat16=True, or bfloat16=False")  # fmt: skip
        try:
            (weights,) = manifest.files_for(WEIGHTS, precision, "torch")
        except BundleError:
            if precision != "fp16":
                raise
            (weights,) = manifest.files_for(WEIGHTS, "fp32", "torch")  # converted by prepare()
        path = bundle_path(bundle_dir, weights)
        units = tuple(units_from_tree(manifest, plan, precision, weights.path, path))
        model = self._build(manifest, path, self.read_file(path, weights))  # the checked bytes, not the path again
        return LoadedPlan(plan, precision, units, image_dtype(units, manifest), weights, model)

    def prepare(self, module: Any, half: bool) -> Any:
        """A unit's module as it runs: BatchNorm folded (in fp32, before any cast), the convolution levers
        (``dense_groups``, ``pointwise``), then fp16 if ``half`` or bfloat16 if ``bfloat16``, placed on the device
        (:meth:`place`), then compiled if ``compile``."""
        from ...models.layers import ComputeIn, densify_groups, fold_batchnorm, set_pointwise

        module = module.float().eval()
        if self.fold_batchnorm:
            module = fold_batchnorm(module)
        else:
            module = copy.deepcopy(module)  # the levers change it in place; the bundle's model is shared
        if self.dense_groups > 1:
            module = densify_groups(module, self.dense_groups)
        module = set_pointwise(module, self.pointwise)
        if half:
            module = module.half()
        elif self.bfloat16:
            module = ComputeIn(module, self.torch.bfloat16)
        module = self.place(module)
        if self.compile is False:
            return module
        backend = "inductor" if self.compile is True else self.compile
        mode = {"mode": self.compile_mode} if self.compile_mode else {}
        self._compiled_units += 1
        _allow_recompiles(self.torch, RECOMPILES_PER_UNIT * self._compiled_units)
        return self.torch.compile(module, backend=backend, dynamic=False, **mode)

    def place(self, module: Any) -> Any:
        """Where and how a prepared module's weights live (the CPU: as they are)."""
        return module

    def _build(self, manifest: Manifest, path: Path, data: bytes) -> Any:
        from ...models import build_model

        from ...train.checkpoint import safe_torch_load

        state = safe_torch_load(io.BytesIO(data), f"{path} (a torch state_dict)", error=BundleError)
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # tolerate a checkpoint-shaped file
        model = build_model(manifest.model_config)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise BundleError(f"{path}: weights do not match model.config: {exc}") from None
        return model.eval()

    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        return TorchRunner(unit, self, loaded)

    def from_host(self, array: np.ndarray) -> Handle:
        # already in the units' dtype (the runner casts it). A read-only array (np.load(mmap_mode="r"), np.frombuffer)
        # is copied: a tensor over it could be written, so torch warns; start() keeps that copy (owned: no second)
        return self.torch.from_numpy(array) if array.flags.writeable else self.torch.tensor(array)

    def owned(self, handle: Handle, array: np.ndarray) -> Handle:
        shared = handle.device.type == "cpu" and np.may_share_memory(handle.numpy(), array)  # from_numpy shares
        return handle.clone() if shared else handle

    def to_host(self, handle: Handle) -> np.ndarray:
        return handle.float().numpy()  # fp16 logits as fp32; no copy when already fp32

    def concat_rows(self, handles: Sequence[Handle]) -> Handle:
        return self.torch.cat(list(handles), dim=0)

    def split_rows(self, handle: Handle, rows: Sequence[int]) -> list[Handle]:
        return list(self.torch.split(handle, list(rows), dim=0))  # views of a fresh output: nothing reuses it

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device": self.device,
            "torch": self.torch.__version__,
            "threads": self.threads,
            "fold_batchnorm": self.fold_batchnorm,
            **self.levers(),
        }

    def timing_options(self) -> dict[str, Any]:
        return {"threads": self.threads, "fold_batchnorm": self.fold_batchnorm, **self.levers()}

    def levers(self) -> dict[str, Any]:
        """The options that compute the same units another way, as :meth:`describe` reports them."""
        return {"compile": self.compile, "compile_mode": self.compile_mode, "pointwise": self.pointwise,
                "dense_groups": self.dense_groups, "bfloat16": self.bfloat16}  # fmt: skip
