"""Checkpoints: one dict, written atomically, loaded with ``weights_only=True``.

Layout (all values are tensors or plain Python containers, so the safe
unpickler accepts them)::

    {
      "format": "hne-edge-checkpoint", "version": 1,
      "model": state_dict, "model_config": HNEConfig.to_dict(), "tree": TreeSpec.to_dict(),
      "class_names": [...], "normalization": {"mean": [...], "std": [...]},
      "optimizer": ..., "scheduler": ..., "epoch": int, "config": train config dict,
      "extra": {...}   # anything else a trainer wants back on resume (RNG states, history)
    }

The exporters read ``model``, ``model_config``, ``class_names`` and
``normalization``; the trainer reads the rest on ``--resume``. A checkpoint
handed out (:func:`save_release`: the shipped demo and reference models) has no
optimizer state and may store its weights in float16; every reader builds the
float32 model and loads them into it (:func:`model_from_checkpoint`).
"""

from __future__ import annotations

import io
import os
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, HNEError, InputError
from ..fileio import atomic_write_bytes
from ..limits import check_model_size
from ..models import HNE, build_model

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "save_checkpoint", "save_release", "load_checkpoint", "load_resumable",
           "model_from_checkpoint", "check_usable", "unusable_reason", "torch_bytes", "safe_torch_load"]

CHECKPOINT_FORMAT = "hne-edge-checkpoint"
CHECKPOINT_VERSION = 1
_REQUIRED = ("format", "version", "model", "model_config", "tree", "class_names", "normalization")


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: HNE,
    class_names: list[str] | None = None,
    normalization: dict[str, list[float]] | None = None,
    optimizer: dict | None = None,
    scheduler: dict | None = None,
    epoch: int | None = None,
    config: dict | None = None,
    extra: dict | None = None,
    weights_dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint atomically: a temporary file in the same folder, fsync, then rename.

    A crash at any point leaves either the previous checkpoint or the new one, never a truncated file.
    ``weights_dtype``: store the floating weights and statistics in it (integer buffers stay as they are).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # unwrap DistributedDataParallel
    num_classes = model.config.num_classes
    class_names = list(class_names) if class_names is not None else [str(i) for i in range(num_classes)]
    if len(class_names) != num_classes:
        raise InputError(f"class_names has {len(class_names)} entries; the model has {num_classes} classes")
    if normalization is None:
        normalization = {"mean": [0.0] * model.config.in_chans, "std": [1.0] * model.config.in_chans}
    state = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model": {k: v.to(weights_dtype) if weights_dtype is not None and v.is_floating_point() else v
                  for k, v in model.state_dict().items()},
        "model_config": model.config.to_dict(),
        "tree": model.tree.to_dict(),
        "class_names": class_names,
        "normalization": {"mean": [float(v) for v in normalization["mean"]], "std": [float(v) for v in normalization["std"]]},
        "optimizer": optimizer,
        "scheduler": scheduler,
        "epoch": epoch,
        "config": config,
        "extra": extra or {},
    }
    atomic_write_bytes(path, torch_bytes(state))
    return path


def save_release(path: str | os.PathLike, checkpoint: str | os.PathLike | dict[str, Any], *,
                 weights_dtype: torch.dtype = torch.float32, extra: dict | None = None) -> Path:
    """The checkpoint to hand out from a training run's ``checkpoint``: its final weights, model config, class
    names, normalisation, epoch, config and history, without optimizer state; floating weights stored in
    ``weights_dtype`` (float16 halves the file; readers load them into the float32 model). ``extra`` adds to
    its ``extra`` (``extra["weights_dtype"]`` says how the weights are stored)."""
    state = checkpoint if isinstance(checkpoint, dict) else load_checkpoint(checkpoint)
    model, _ = model_from_checkpoint(state)
    kept = {k: v for k, v in (state.get("extra") or {}).items() if k in ("history", "data")}  # data: its images' sha256
    return save_checkpoint(path, model=model, class_names=state["class_names"], normalization=state["normalization"],
                           epoch=state.get("epoch"), config=state.get("config"), weights_dtype=weights_dtype,
                           extra={"history": [], **kept, "weights_dtype": str(weights_dtype).replace("torch.", ""),
                                  **(extra or {})})  # fmt: skip


def torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)`` into memory. Files are then written by :mod:`hne_edge.fileio`, whose errors name
    the file: torch's own writer reports a full disk as ``RuntimeError: [enforce fail at inline_container.cc]``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


#: what torch's weights-only unpickler says it refused (its wording since torch 2.4), and how an error names it
_REFUSED = (
    (re.compile(r"GLOBAL ([\w.]+)"), "global {!r}"),  # not allowlisted, or of a blocked module (posix.system)
    (re.compile(r"unrecognized function (<[^>]*>|\S+)"), "a call of {}"),  # a reduce of a function not allowed
    (re.compile(r"but got <class '([^']+)'>"), "an object of class {!r}"),  # built or created, not allowed
    (re.compile(r"Unsupported operand (\d+)"), "pickle opcode {}"),
)


def safe_torch_load(source: Any, what: str, error: type[HNEError] = CheckpointError, map_location: Any = "cpu") -> Any:
    """``torch.load(source, weights_only=True)``; a file it refuses is ``error`` naming ``what`` and the refused
    object (a global, a call, a class, an opcode), never torch's advice to load it with ``weights_only=False``
    (which would run its code); one it cannot read otherwise is called corrupt."""
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except Exception as exc:  # damaged archive, a pickle holding objects the safe loader refuses, ...
        text = str(exc)
        refused = next((name.format(m.group(1)) for pattern, name in _REFUSED if (m := pattern.search(text))), None)
        if refused is not None:
            raise error(f"cannot read {what}: it holds {refused}, which the safe loader (weights_only=True) refuses: "
                        "only tensors and plain containers are loaded (not a file hne-edge wrote)") from None  # fmt: skip
        raise error(f"cannot read {what}: {type(exc).__name__} while loading with weights_only=True (a corrupt file, "
                    "or one not written by hne-edge)") from None  # fmt: skip


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and validate a checkpoint written by :func:`save_checkpoint` (archive, layout, :func:`check_usable`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"cannot read checkpoint {path}: not a PyTorch archive (corrupt, truncated or another kind of file); "
            "expected a file written by hne-edge train"
        )
    check_archive(path)
    state = safe_torch_load(path, f"checkpoint {path}", map_location=map_location)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{path} is not an hne-edge checkpoint: expected a dict with format={CHECKPOINT_FORMAT!r}; found {found}"
        )
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {state.get('version')!r} is not supported (expected {CHECKPOINT_VERSION})"
        )
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{path}: checkpoint is missing keys {missing}")
    config = state["model_config"]
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: model_config is {type(config).__name__}; expected a dict (HNEConfig.to_dict())")
    try:  # the model sizes it states, bounded where they are read (hne_edge.limits), before a model is built
        check_model_size(config, f"{path}: model_config.")
    except InputError as exc:
        raise CheckpointError(str(exc)) from None
    check_usable(state, path)  # every reader (eval, export, verify, --resume) holds it to one rule
    return state


def load_resumable(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint of a training run to continue (``--resume``), or an error that says why there is none."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"--resume: no checkpoint at {path}, so there is nothing to resume; a run writes it at the end of each "
            "epoch and when Ctrl-C stops it", hint="start the run with resume=False", cli_hint="start the run without --resume")
    state = load_checkpoint(path)
    for key in ("optimizer", "scheduler", "epoch", "config"):
        if state.get(key) is None or (key != "epoch" and not state[key]):
            raise CheckpointError(f"{path}: no {key} state to resume from (a weights-only checkpoint, not a training run)")
    return state


def check_archive(path: Path) -> None:
    """Every member's CRC-32 (the zip format stores one per member; torch.save writes them).

    torch.load does not check them, so a flipped byte in a weight would load silently. This detects
    accidental corruption (disk, copy, truncation), not deliberate tampering: a CRC is not a signature.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: damaged archive ({exc})") from None
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: member {bad!r} fails its CRC-32 check (the file changed after it was "
            "written); restore it from a copy or re-train"
        )


def unusable_reason(model_state: dict[str, Any]) -> str | None:
    """Why a model's ``state_dict`` is not usable, or None: the one rule, shared by every reader of a checkpoint
    (:func:`check_usable`) and by the trainer before it saves one.

    Usable: every floating tensor finite (NaN/Inf come from a diverged run or a damaged file: every metric
    and every export of them would be NaN), and every BatchNorm ``running_var`` >= 0 (a variance; a negative
    one makes ``sqrt(var + eps)`` NaN in eval mode although every weight is finite).
    """
    for name, value in model_state.items():
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            return f"{int((~finite).sum())} non-finite value(s) (NaN/Inf) in weight {name!r}; expected finite weights"
        if name.endswith("running_var") and bool((value < 0).any()):
            return (f"BatchNorm statistic {name!r} holds {int((value < 0).sum())} negative value(s); expected "
                    "variances >= 0")  # fmt: skip
    return None


def check_usable(state: dict[str, Any], path: Any) -> None:
    """Refuse a checkpoint whose model weights break :func:`unusable_reason`'s rule, or whose optimizer state
    (what ``--resume`` continues from) holds NaN/Inf; :class:`CheckpointError` names the file and the tensor."""
    model = state.get("model")
    why = unusable_reason(model) if isinstance(model, dict) else None
    if why is not None:
        raise CheckpointError(f"checkpoint {path}: {why} (the run diverged, or the file was edited or damaged)")
    optimizer = state.get("optimizer")
    per_param = optimizer.get("state") if isinstance(optimizer, dict) else None
    for key, entry in (per_param or {}).items():
        for name, value in (entry.items() if isinstance(entry, dict) else ()):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise CheckpointError(
                    f"checkpoint {path}: optimizer state {name!r} of parameter {key} holds non-finite values (NaN/Inf); "
                    "expected finite state to resume from (the run diverged, or the file was damaged)"
                )


def model_from_checkpoint(checkpoint: str | os.PathLike | dict[str, Any]) -> tuple[HNE, dict[str, Any]]:
    """Rebuild the model (eval mode) from a checkpoint path or loaded dict; returns ``(model, checkpoint)``."""
    if isinstance(checkpoint, dict):
        state = checkpoint
        check_usable(state, "(dict)")
    else:
        state = load_checkpoint(checkpoint)
    name = "(dict)" if isinstance(checkpoint, dict) else str(checkpoint)
    model = None
    try:
        model = build_model(state["model_config"])
        model.load_state_dict(state["model"])
    except (ValueError, RuntimeError, TypeError) as exc:
        # torch's message lists every key (KBs on one line): count them and name the first
        why = _misfit(model.state_dict(), state["model"]) if model is not None else None
        why = why or str(exc).strip().splitlines()[0][:300]
        raise CheckpointError(f"checkpoint {name}: its weights do not fit its model_config ({why}); expected the "
                              "weights of the model it describes (another hne-edge version or block layout?)") from exc
    return model.eval(), state


def _misfit(want: dict, have: dict) -> str | None:
    """How ``have`` (a checkpoint's state_dict) misses ``want`` (the model's): counts, and the first one or two keys."""

    def shape(t) -> str:
        return "x".join(map(str, getattr(t, "shape", ()))) or "?"

    if not isinstance(have, dict):
        return None
    missing = [k for k in want if k not in have]
    unexpected = [k for k in have if k not in want]
    other = [f"{k} {shape(have[k])} vs {shape(want[k])}" for k in want
             if k in have and tuple(getattr(have[k], "shape", ())) != tuple(want[k].shape)]  # fmt: skip
    parts = [f"{len(keys)} {what}, e.g. {', '.join(map(str, keys[:2]))}" for keys, what in
             ((missing, "missing"), (unexpected, "unexpected"), (other, "of another shape")) if keys]  # fmt: skip
    return "; ".join(parts) or None
