"""Training: losses, data, the training loop, checkpoints and evaluation.

    from hne_edge.train import TrainConfig, fit
    from hne_edge.train.evaluation import evaluate_checkpoint

    result = fit(TrainConfig.from_preset("digits", {"out": "runs/digits"}))
    metrics = evaluate_checkpoint(result.checkpoint)

The config (:mod:`.config`) is torch-free, so a config can be validated on a
machine without torch; everything else needs torch and is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import DataConfig, LossConfig, ModelSpec, OptimConfig, TrainConfig

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "TrainConfig",
    "DataConfig",
    "ModelSpec",
    "LossConfig",
    "OptimConfig",
    "FitResult",
    "fit",
    "train_one_epoch",
    "evaluate",
    "evaluate_checkpoint",
    "hne_loss",
]

_LAZY = {
    "save_checkpoint": ".checkpoint",
    "load_checkpoint": ".checkpoint",
    "model_from_checkpoint": ".checkpoint",
    "FitResult": ".engine",
    "fit": ".engine",
    "train_one_epoch": ".engine",
    "evaluate": ".evaluation",
    "evaluate_checkpoint": ".evaluation",
    "hne_loss": ".losses",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
