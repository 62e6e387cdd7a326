"""HNE models: branch-parallel layers, the fused model, the zoo and cost accounting (needs torch)."""

from .cost import NodeCost, TreeCost, tree_cost
from .hne import HNE, HNEConfig, MobileNetV2HNEConfig, NodeModule, ResNetHNEConfig, SegmentModule, config_from_dict
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
]
