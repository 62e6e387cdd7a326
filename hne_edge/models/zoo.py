"""Model zoo: short registered entrypoints over the config builders.

    >>> import hne_edge
    >>> hne_edge.list_models()
    ['hne_mobilenetv2', 'hne_resnet', 'hne_resnet_small', 'hne_tiny']
    >>> model = hne_edge.create_model("hne_resnet_small", num_classes=100)

Any config field can be overridden by keyword; ``tree`` also accepts
``"hne"``, ``"independent"``, ``"multi_branch"`` or a tuple of branching
factors, so the paper's baselines come from the same entrypoints.

Architecture choices where the paper's tables are inconsistent
-------------------------------------------------------------
* ResNet-HNE: the block-4 row of the supplementary table lists stride 2 yet
  keeps 8x8 maps. We keep the 8x8 maps (stride 1), the option consistent
  with the stated output size. Spatial sizes per block: 32, 32, 16, 8, 8.
* MobileNetV2-HNE: the block-3 row lists a 28x28 input right after a block
  whose output is 14x14. We follow the output sizes (MobileNetV2's own
  strides): blocks end at 56, 28, 14, 7, 7 for a 224 input.
"""

from __future__ import annotations

import fnmatch
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, Callable

from ..errors import InputError
from ..tree import hne_tree, resolve_tree
from .configs import HNEConfig, MobileNetV2HNEConfig, ResNetHNEConfig, config_from_dict

if TYPE_CHECKING:
    from .hne import HNE

__all__ = ["register_model", "list_models", "create_model", "model_config", "build_model"]

_REGISTRY: dict[str, Callable[[], HNEConfig]] = {}


def register_model(fn: Callable[[], HNEConfig]) -> Callable[[], HNEConfig]:
    """Register a zero-argument function returning the default config of a model."""
    _REGISTRY[fn.__name__] = fn
    return fn


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style ``pattern``."""
    return sorted(name for name in _REGISTRY if fnmatch.fnmatch(name, pattern))


def model_config(name: str, **overrides: Any) -> HNEConfig:
    """The config of zoo model ``name`` with ``overrides`` applied (validated)."""
    if name not in _REGISTRY:
        raise InputError(f"unknown model {name!r}; available: {', '.join(list_models())}")
    config = _REGISTRY[name]()
    known = {f.name for f in fields(config)} - {"name"}
    unknown = set(overrides) - known
    if unknown:
        raise InputError(f"{name}: unknown option(s) {sorted(unknown)}; accepted: {sorted(known)}")
    if "tree" in overrides:  # a preset is built for the model's own blocks, overridden ones included
        blocks = overrides.get("blocks", config.block_rows())
        num_blocks = len(blocks) if isinstance(blocks, (tuple, list)) else config.tree.num_blocks
        overrides["tree"] = resolve_tree(overrides["tree"], num_blocks)
    return replace(config, **overrides)


def build_model(config: HNEConfig | dict) -> HNE:
    """An HNE from a config object or its ``to_dict()`` form."""
    from .hne import HNE  # noqa: PLC0415

    return HNE(config_from_dict(config) if isinstance(config, dict) else config)


def create_model(name: str, num_classes: int | None = None, **overrides: Any) -> HNE:
    """Build zoo model ``name`` (see :func:`list_models`)."""
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    from .hne import HNE  # noqa: PLC0415 - the registry and configs need no torch; the model does

    return HNE(model_config(name, **overrides))


@register_model
def hne_resnet() -> HNEConfig:
    """The paper's CIFAR ResNet-HNE: B=4, 16 leaves, 64/128/256/256 channels per branch."""
    return ResNetHNEConfig(
        name="hne_resnet",
        tree=hne_tree(4),
        num_classes=10,
        input_size=32,
        stem_channels=(16, 64),
        # (channels, stride, repeats) per block; block 0 follows the stem.
        blocks=((64, 1, 3), (64, 1, 3), (128, 2, 3), (256, 2, 3), (256, 1, 3)),
        reduction=2,
    )


@register_model
def hne_resnet_small() -> HNEConfig:
    """HNE_small: ResNet-HNE with every channel count halved."""
    return ResNetHNEConfig(
        name="hne_resnet_small",
        tree=hne_tree(4),
        num_classes=10,
        input_size=32,
        stem_channels=(8, 32),
        blocks=((32, 1, 3), (32, 1, 3), (64, 2, 3), (128, 2, 3), (128, 1, 3)),
        reduction=2,
    )


@register_model
def hne_mobilenetv2() -> HNEConfig:
    """ImageNet MobileNetV2-HNE, width 1.4, 224x224, last conv 1344, fc 1792 (ReLU6)."""
    return MobileNetV2HNEConfig(
        name="hne_mobilenetv2",
        tree=hne_tree(4),
        num_classes=1000,
        input_size=224,
        width_mult=1.4,
        stem_channels=32,
        blocks=(
            ((1, 16, 1, 1), (6, 24, 2, 2)),  # 112 -> 56
            ((6, 32, 3, 2),),  # 56 -> 28
            ((6, 64, 4, 2),),  # 28 -> 14
            ((6, 96, 3, 1), (6, 160, 3, 2)),  # 14 -> 7
            ((6, 320, 1, 1),),  # 7, then 1x1 conv to 1344
        ),
        last_channels=1344,
        hidden=1792,
    )


@register_model
def hne_tiny() -> HNEConfig:
    """A tiny ResNet-HNE (16 leaves) for tests and the demo; milliseconds per batch on a CPU."""
    return ResNetHNEConfig(
        name="hne_tiny",
        tree=hne_tree(4),
        num_classes=10,
        input_size=16,
        stem_channels=(8, 16),
        blocks=((16, 1, 1), (16, 1, 1), (32, 2, 1), (32, 1, 1), (32, 1, 1)),
        reduction=2,
    )
