"""HNE models: branch-parallel layers, the fused model, the zoo and cost accounting.

The zoo's registry and the model configs are torch-free (a training config can
be validated without torch); the model, its layers and the cost counter need
torch and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .configs import HNEConfig, MobileNetV2HNEConfig, ResNetHNEConfig, config_from_dict
from .zoo import build_model, create_model, list_models, model_config, register_model

__all__ = [
    "HNE",
    "HNEConfig",
    "ResNetHNEConfig",
    "MobileNetV2HNEConfig",
    "NodeModule",
    "SegmentModule",
    "config_from_dict",
    "NodeCost",
    "TreeCost",
    "tree_cost",
    "build_model",
    "create_model",
    "list_models",
    "model_config",
    "register_model",
    "model_weight_bytes",
]

_LAZY = {"HNE": ".hne", "model_weight_bytes": ".hne", "NodeModule": ".hne", "SegmentModule": ".hne", "NodeCost": ".cost", "TreeCost": ".cost",
         "tree_cost": ".cost"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
