"""Model configs: which blocks, which tree, how many classes (torch-free; layers are imported when a block is built).

A config validates itself on construction, so a training config naming a zoo
model can be checked on a machine without torch (``hne_edge.train.config``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import InputError, short_repr
from ..limits import check_model_size
from ..tree import TREE_PRESETS, TreeSpec, hne_tree

if TYPE_CHECKING:
    from torch import nn

__all__ = ["HNEConfig", "ResNetHNEConfig", "MobileNetV2HNEConfig", "config_from_dict"]


def _expect(ok: bool, field: str, value: Any, expected: str) -> None:
    """The one form of a config field's error: checked here, before anything is built (nothing crashes later)."""
    if not ok:
        raise InputError(f"{field}: received {short_repr(value)}; expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(row: Any, length: int) -> bool:
    """``row`` is a tuple (a list, from YAML/JSON) of ``length`` positive integers."""
    return isinstance(row, (tuple, list)) and len(row) == length and all(_is_int(v) and v >= 1 for v in row)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round channels to a multiple of ``divisor`` (MobileNet's rule: never drop more than 10%)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


@dataclass(frozen=True)
class HNEConfig:
    """What every HNE has.

    Attributes:
        name: zoo name the model was created from.
        tree: the tree spec (one branching factor per block).
        num_classes: classifier outputs per leaf (at most :data:`~hne_edge.limits.MAX_NUM_CLASSES`).
        in_chans: input image channels (at most :data:`~hne_edge.limits.MAX_IN_CHANS`).
        input_size: default square input side (FLOP counts and export use it; at most
            :data:`~hne_edge.limits.MAX_INPUT_SIZE`).
    """

    name: str
    tree: TreeSpec
    num_classes: int = 10
    in_chans: int = 3
    input_size: int = 32

    arch: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if isinstance(self.tree, (tuple, list)):
            object.__setattr__(self, "tree", TreeSpec(tuple(self.tree)))
        if not isinstance(self.tree, TreeSpec):
            raise TypeError(f"tree must be a TreeSpec or a tuple of branching factors; received {self.tree!r}")
        # bounded here, before anything is allocated (hne_edge.limits: the rule manifests and checkpoints read by too)
        check_model_size({name: getattr(self, name) for name in ("num_classes", "in_chans", "input_size")})
        blocks = len(self.block_rows())
        if blocks != self.tree.num_blocks:  # "TreeSpec.branching": the CLI names its --tree (cli.options.flag_names)
            raise InputError(
                f"TreeSpec.branching {','.join(map(str, self.tree.branching))}: {self.name} has {blocks} blocks, "
                f"this tree {self.tree.num_blocks}; expected {blocks} branching factors, one per block (e.g. "
                f"{','.join(map(str, hne_tree(blocks - 1).branching))}), or a preset ({', '.join(TREE_PRESETS)})"
            )

    def block_rows(self) -> tuple:  # pragma: no cover - overridden
        raise NotImplementedError

    def build_block(self, depth: int, branches: int) -> nn.Module:  # pragma: no cover - overridden
        raise NotImplementedError

    def build_head(self, branches: int) -> nn.Module:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.in_chans, self.input_size, self.input_size)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["tree"] = self.tree.to_dict()
        return {"arch": self.arch, **_to_lists(data)}


def _to_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_lists(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_lists(v) for v in value]
    return value


def _to_tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_to_tuples(v) for v in value)
    return value


@dataclass(frozen=True)
class ResNetHNEConfig(HNEConfig):
    """CIFAR ResNet-HNE: stem (conv3x3 + conv1x1) then depthwise-separable bottlenecks.

    Attributes:
        stem_channels: (conv3x3 width, conv1x1 width) of the root's stem.
        blocks: one ``(channels, stride, repeats)`` row per tree block; the
            first bottleneck of a row carries the stride.
        reduction: bottleneck width = channels // reduction.
    """

    stem_channels: tuple[int, int] = (16, 64)
    blocks: tuple[tuple[int, int, int], ...] = ()
    reduction: int = 4

    arch: ClassVar[str] = "resnet"

    def __post_init__(self) -> None:
        _expect(_ints(self.stem_channels, 2), "stem_channels", self.stem_channels,
                f"2 positive integers (conv3x3 width, conv1x1 width) for {self.name}")  # fmt: skip
        _expect(_is_int(self.reduction) and self.reduction >= 1, "reduction", self.reduction,
                f"a positive integer (bottleneck width = channels // reduction) for {self.name}")  # fmt: skip
        _expect(isinstance(self.blocks, (tuple, list)), "blocks", self.blocks, "a list of (channels, stride, repeats)")
        object.__setattr__(self, "stem_channels", _to_tuples(list(self.stem_channels)))
        object.__setattr__(self, "blocks", _to_tuples(list(self.blocks)))
        for row in self.blocks:
            _expect(_ints(row, 3), "blocks", row, f"each row of {self.name} (channels, stride, repeats), integers > 0")
            if row[0] % self.reduction:
                raise InputError(
                    f"{self.name}: block channels must be divisible by reduction={self.reduction}; received {row[0]}"
                )
        super().__post_init__()

    def block_rows(self) -> tuple:
        return self.blocks

    def block_in_channels(self, depth: int) -> int:
        return self.stem_channels[1] if depth == 0 else self.blocks[depth - 1][0]

    def build_block(self, depth: int, branches: int) -> nn.Module:
        from torch import nn  # noqa: PLC0415 - torch only to build the model

        from .layers import Bottleneck, ConvBNAct  # noqa: PLC0415

        channels, stride, repeats = self.blocks[depth]
        layers: list[nn.Module] = []
        if depth == 0:
            layers += [
                ConvBNAct(self.in_chans, self.stem_channels[0], 3, branches=branches),
                ConvBNAct(self.stem_channels[0], self.stem_channels[1], 1, branches=branches),
            ]
        width = self.block_in_channels(depth)
        for r in range(repeats):
            layers.append(Bottleneck(width, channels, stride if r == 0 else 1, branches, self.reduction))
            width = channels
        return nn.Sequential(*layers)

    def build_head(self, branches: int) -> nn.Module:
        from .layers import ClassifierHead  # noqa: PLC0415

        return ClassifierHead(self.blocks[-1][0], self.num_classes, branches)


@dataclass(frozen=True)
class MobileNetV2HNEConfig(HNEConfig):
    """ImageNet MobileNetV2-HNE.

    Attributes:
        width_mult: channel multiplier (the paper uses 1.4).
        stem_channels: first conv (3x3, stride 2) width before ``width_mult``.
        blocks: per tree block, the MobileNetV2 rows ``(t, c, n, s)`` it holds
            (expansion, channels before ``width_mult``, repeats, first stride).
        last_channels: the final 1x1 conv of the last block (paper: 1344).
        hidden: the fully-connected layer before the classifier (paper: 1792, ReLU6).
    """

    width_mult: float = 1.4
    stem_channels: int = 32
    blocks: tuple[tuple[tuple[int, int, int, int], ...], ...] = ()
    last_channels: int = 1344
    hidden: int = 1792

    arch: ClassVar[str] = "mobilenetv2"

    def __post_init__(self) -> None:
        width = self.width_mult
        finite = isinstance(width, (int, float)) and not isinstance(width, bool) and math.isfinite(width)
        _expect(finite and width > 0, "width_mult", width, f"a finite number > 0 for {self.name}")
        for field in ("stem_channels", "last_channels", "hidden"):
            value = getattr(self, field)
            _expect(_is_int(value) and value >= 1, field, value, f"a positive integer (channels) for {self.name}")
        _expect(isinstance(self.blocks, (tuple, list)), "blocks", self.blocks, "a list of blocks of (t, c, n, s) rows")
        object.__setattr__(self, "blocks", _to_tuples(list(self.blocks)))
        for block in self.blocks:  # a block with no rows has no output width (the next block reads its last row)
            _expect(isinstance(block, tuple) and len(block) > 0, "blocks", block,
                    f"each block of {self.name} a non-empty list of (t, c, n, s) rows")  # fmt: skip
            for row in block:
                _expect(_ints(row, 4), "blocks", row, f"each row of {self.name} (t, c, n, s), integers > 0")
        super().__post_init__()

    def block_rows(self) -> tuple:
        return self.blocks

    def _channels(self, c: int) -> int:
        return _make_divisible(c * self.width_mult)

    def block_in_channels(self, depth: int) -> int:
        if depth == 0:
            return self._channels(self.stem_channels)
        return self._channels(self.blocks[depth - 1][-1][1])

    def build_block(self, depth: int, branches: int) -> nn.Module:
        from torch import nn  # noqa: PLC0415 - torch only to build the model

        from .layers import ConvBNAct, InvertedResidual  # noqa: PLC0415

        layers: list[nn.Module] = []
        if depth == 0:
            layers.append(
                ConvBNAct(self.in_chans, self.block_in_channels(0), 3, 2, branches=branches, act_layer=nn.ReLU6)
            )
        width = self.block_in_channels(depth)
        for t, c, n, s in self.blocks[depth]:
            out = self._channels(c)
            for r in range(n):
                layers.append(InvertedResidual(width, out, s if r == 0 else 1, t, branches))
                width = out
        if depth == self.tree.last_block:
            layers.append(ConvBNAct(width, self.last_channels, 1, branches=branches, act_layer=nn.ReLU6))
        return nn.Sequential(*layers)

    def build_head(self, branches: int) -> nn.Module:
        from .layers import ClassifierHead  # noqa: PLC0415

        return ClassifierHead(self.last_channels, self.num_classes, branches, hidden=(self.hidden,))


_CONFIGS: dict[str, type[HNEConfig]] = {"resnet": ResNetHNEConfig, "mobilenetv2": MobileNetV2HNEConfig}


def config_from_dict(data: dict[str, Any]) -> HNEConfig:
    """Rebuild a config written by :meth:`HNEConfig.to_dict` (checkpoints, manifests)."""
    if not isinstance(data, dict) or data.get("arch") not in _CONFIGS:
        raise InputError(
            f"model config must be a dict with 'arch' in {sorted(_CONFIGS)}; "
            f"received arch={data.get('arch') if isinstance(data, dict) else data!r}"
        )
    cls = _CONFIGS[data["arch"]]
    known = {f.name for f in fields(cls)}
    extra = set(data) - known - {"arch"}
    if extra:
        raise InputError(f"model config for arch {data['arch']!r} has unknown keys {sorted(extra)}")
    kwargs = {k: _to_tuples(v) for k, v in data.items() if k != "arch"}
    kwargs["tree"] = TreeSpec.from_dict(data["tree"])
    return cls(**kwargs)
