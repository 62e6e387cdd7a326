"""Training: losses, data, the training loop, checkpoints and evaluation (needs torch).

    from hne_edge.train import TrainConfig, fit
    from hne_edge.train.evaluation import evaluate_checkpoint

    result = fit(TrainConfig.from_preset("digits", {"out": "runs/digits"}))
    metrics = evaluate_checkpoint(result.checkpoint)
"""

from .checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from .config import DataConfig, LossConfig, ModelSpec, OptimConfig, TrainConfig
from .engine import FitResult, evaluate, fit, train_one_epoch
from .evaluation import evaluate_checkpoint
from .losses import hne_loss

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
