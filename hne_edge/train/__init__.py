"""Training: losses, data, the training loop, checkpoints and evaluation (needs torch)."""

from .checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint", "model_from_checkpoint"]
