"""Branch-parallel layers: one module evaluates ``branches`` copies of a layer at once.

Every layer keeps its branches side by side along the channel axis
(``[branch 0 channels | branch 1 channels | ...]``) and uses grouped
convolutions so branches never mix. That layout is what makes the fused HNE
a single ordinary network and what lets :func:`copy_branch_weights` cut one
branch out as a standalone module with the same numerics.

Only ``nn.Conv2d`` and ``nn.BatchNorm2d`` hold weights here; linear layers
are 1x1 grouped convolutions on pooled features, so every parameter and
buffer stacks its branches along dim 0. Keep it that way: the branch
slicer, the MAC counter and the ONNX exporters rely on it.

The 1x1 convolutions of a block (:class:`PointwiseConv2d`) can also run as one
batched matrix multiply over the branches (``pointwise = "bmm"``): the same
weights, the same function, another kernel. Training may choose it where it
is faster (``TrainConfig.pointwise``); exports always see the convolution.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

__all__ = [
    "POINTWISE_MODES",
    "PointwiseConv2d",
    "branch_matmul",
    "set_pointwise",
    "ConvBNAct",
    "Bottleneck",
    "InvertedResidual",
    "ClassifierHead",
    "replicate_branches",
    "copy_branch_weights",
    "fold_batchnorm",
    "densify_groups",
    "ComputeIn",
]

ActLayer = Callable[[], nn.Module] | None
POINTWISE_MODES = ("conv", "bmm")


class PointwiseConv2d(nn.Conv2d):
    """A 1x1 convolution whose groups may run as a batched matrix multiply.

    ``pointwise = "conv"`` (the default) is ``nn.Conv2d``; ``"bmm"`` computes the same function with
    :func:`branch_matmul`. It is an ``nn.Conv2d`` with the same parameters and state-dict keys either way. It is
    built without a bias; folding its BatchNorm (:func:`fold_batchnorm`) gives it one, which both paths add.
    """

    pointwise: str = "conv"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pointwise == "bmm" and self.groups > 1 and not torch.onnx.is_in_onnx_export():
            y = branch_matmul(x, self.weight, self.groups, self.stride[0])
            return y if self.bias is None else y + self.bias.view(1, -1, 1, 1)
        return super().forward(x)


def branch_matmul(x: torch.Tensor, weight: torch.Tensor, groups: int, stride: int = 1) -> torch.Tensor:
    """``conv2d(x, weight, stride=stride, groups=groups)`` for a 1x1 ``weight`` (groups*cout, cin, 1, 1), as one
    ``bmm`` over the groups. A channels-last ``x`` is read in place (each group's rows are a strided view);
    a contiguous one is reordered once. The result has ``x``'s memory format."""
    if stride != 1:
        x = x[:, :, ::stride, ::stride]
    b, c, h, w = x.shape
    cin, cout = c // groups, weight.shape[0] // groups
    wt = weight.view(groups, cout, cin)
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        rows = x.permute(0, 2, 3, 1).reshape(b * h * w, groups, cin).transpose(0, 1)  # (g, bhw, cin), a view
        y = torch.bmm(rows, wt.transpose(1, 2))  # (g, bhw, cout)
        return y.transpose(0, 1).reshape(b, h, w, groups * cout).permute(0, 3, 1, 2)  # (b, g*cout, h, w) channels-last
    cols = x.reshape(b, groups, cin, h * w).permute(1, 2, 0, 3).reshape(groups, cin, b * h * w)  # (g, cin, b*hw)
    y = torch.bmm(wt, cols)  # (g, cout, b*hw)
    return y.view(groups, cout, b, h * w).permute(2, 0, 1, 3).reshape(b, groups * cout, h, w)


def set_pointwise(model: nn.Module, mode: str) -> nn.Module:
    """Run every :class:`PointwiseConv2d` of ``model`` as ``mode`` (``conv`` or ``bmm``); returns ``model``."""
    if mode not in POINTWISE_MODES:
        raise ValueError(f"pointwise: received {mode!r}; expected one of {', '.join(POINTWISE_MODES)}")
    for m in model.modules():
        if isinstance(m, PointwiseConv2d):
            m.pointwise = mode
    return model


class ConvBNAct(nn.Sequential):
    """Conv -> BatchNorm -> activation, for ``branches`` parallel branches.

    Args:
        in_channels: input channels of one branch.
        out_channels: output channels of one branch.
        kernel_size: square kernel size; padding keeps "same" size at stride 1.
        stride: convolution stride.
        groups: groups within one branch (``in_channels`` for depthwise).
        branches: number of parallel branches.
        act_layer: activation constructor, or None for a linear output.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 1,
        stride: int = 1,
        groups: int = 1,
        branches: int = 1,
        act_layer: ActLayer = nn.ReLU,
    ) -> None:
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"channels must be divisible by groups; received in_channels={in_channels}, "
                f"out_channels={out_channels}, groups={groups}"
            )
        conv = PointwiseConv2d if kernel_size == 1 else nn.Conv2d
        layers: list[nn.Module] = [
            conv(
                in_channels * branches,
                out_channels * branches,
                kernel_size,
                stride,
                padding=kernel_size // 2,
                groups=groups * branches,
                bias=False,
            ),
            nn.BatchNorm2d(out_channels * branches),
        ]
        if act_layer is not None:
            layers.append(act_layer())
        super().__init__(*layers)


class Bottleneck(nn.Module):
    """ResNet bottleneck with a depthwise-separable 3x3: 1x1 reduce -> depthwise 3x3 -> 1x1 expand.

    The depthwise 3x3 and the 1x1 expand together form the separable 3x3
    convolution. The shortcut is the identity, or a strided 1x1 projection
    when the shape changes.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int = 1, branches: int = 1, reduction: int = 4
    ) -> None:
        super().__init__()
        if out_channels % reduction:
            raise ValueError(
                f"bottleneck out_channels must be divisible by reduction; received out_channels={out_channels}, "
                f"reduction={reduction}"
            )
        mid = out_channels // reduction
        self.reduce = ConvBNAct(in_channels, mid, 1, branches=branches)
        self.depthwise = ConvBNAct(mid, mid, 3, stride, groups=mid, branches=branches)
        self.expand = ConvBNAct(mid, out_channels, 1, branches=branches, act_layer=None)
        self.shortcut = (
            nn.Identity()
            if stride == 1 and in_channels == out_channels
            else ConvBNAct(in_channels, out_channels, 1, stride, branches=branches, act_layer=None)
        )
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.expand(self.depthwise(self.reduce(x))) + self.shortcut(x))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand (ReLU6) -> depthwise 3x3 (ReLU6) -> 1x1 linear projection."""

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, expand_ratio: int, branches: int = 1
    ) -> None:
        super().__init__()
        hidden = in_channels * expand_ratio
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNAct(in_channels, hidden, 1, branches=branches, act_layer=nn.ReLU6))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden, branches=branches, act_layer=nn.ReLU6),
            ConvBNAct(hidden, out_channels, 1, branches=branches, act_layer=None),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class ClassifierHead(nn.Module):
    """Global average pool, optional hidden layers, linear classifier; per branch.

    Returns ``(batch, branches, num_classes)``.

    Args:
        in_channels: features of one branch.
        num_classes: classifier outputs.
        branches: number of parallel branches.
        hidden: widths of hidden fully-connected layers (each followed by ``act_layer``).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        branches: int = 1,
        hidden: tuple[int, ...] = (),
        act_layer: Callable[[], nn.Module] = nn.ReLU6,
    ) -> None:
        super().__init__()
        self.branches = branches
        self.num_classes = num_classes
        self.pool = nn.AdaptiveAvgPool2d(1)
        layers: list[nn.Module] = []
        width = in_channels
        for h in hidden:
            layers += [nn.Conv2d(width * branches, h * branches, 1, groups=branches), act_layer()]
            width = h
        layers.append(nn.Conv2d(width * branches, num_classes * branches, 1, groups=branches))
        self.fc = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(self.pool(x))  # (B, branches * classes, 1, 1)
        return x.flatten(1).unflatten(1, (self.branches, self.num_classes))  # (B, branches, classes)


def replicate_branches(x: torch.Tensor, branches: int, factor: int) -> torch.Tensor:
    """Split point: copy each of ``branches`` channel groups ``factor`` times, children adjacent.

    ``(B, branches*C, H, W) -> (B, branches*factor*C, H, W)`` with the copies of
    branch ``p`` at positions ``p*factor .. p*factor+factor-1``, matching the
    tree's child numbering.
    """
    if factor == 1:
        return x
    if torch.onnx.is_in_onnx_export():  # one Gather with constant indices: no shape arithmetic on the symbolic batch
        per = int(x.shape[1]) // branches  # channels are fixed: a constant of the graph
        index = [p * per + i for p in range(branches) for _ in range(factor) for i in range(per)]
        return x.index_select(1, torch.tensor(index, dtype=torch.long, device=x.device))
    b, c, h, w = x.shape
    per = c // branches
    return x.view(b, branches, 1, per, h, w).expand(b, branches, factor, per, h, w).reshape(b, -1, h, w)


@torch.no_grad()
def copy_branch_weights(fused: nn.Module, single: nn.Module, index: int) -> nn.Module:
    """Fill ``single`` (the same layers built with ``branches=1``) with branch ``index`` of ``fused``.

    Every parameter and buffer of a branch-parallel layer stacks its branches
    along dim 0, so branch ``index`` is rows ``index*k .. (index+1)*k`` with
    ``k`` the single-branch size.
    """
    fused_state = fused.state_dict()
    target = single.state_dict()
    if fused_state.keys() != target.keys():
        raise ValueError(f"modules differ: {sorted(set(fused_state) ^ set(target))[:5]}")
    for key, dst in target.items():
        src = fused_state[key]
        if dst.dim() == 0:  # num_batches_tracked
            dst.copy_(src)
            continue
        k = dst.shape[0]
        if src.shape[1:] != dst.shape[1:] or src.shape[0] < (index + 1) * k:
            raise ValueError(f"{key}: cannot take branch {index} of {tuple(src.shape)} into {tuple(dst.shape)}")
        dst.copy_(src[index * k : (index + 1) * k])
    return single


def fold_batchnorm(module: nn.Module) -> nn.Module:
    """An eval-mode copy of ``module`` with every Conv2d -> BatchNorm2d pair folded into the conv.

    The layers keep every BatchNorm right after its conv inside one
    ``nn.Sequential`` (:class:`ConvBNAct`), which is the only pattern handled; a
    BatchNorm left over afterwards is a ``ValueError``, not a silent slowdown.
    The ONNX exporter and the runtime's torch backend both fold with this.
    """
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    module = copy.deepcopy(module).eval()
    for seq in module.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        names = list(seq._modules)
        for a, b in zip(names, names[1:]):
            conv, bn = seq._modules[a], seq._modules[b]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                seq._modules[a] = fuse_conv_bn_eval(conv, bn)
                seq._modules[b] = nn.Identity()
    left = [name for name, m in module.named_modules() if isinstance(m, nn.BatchNorm2d)]
    if left:
        raise ValueError(f"BatchNorm folding left {len(left)} BatchNorm2d layer(s) (e.g. {left[0]}); expected none")
    return module


def densify_groups(module: nn.Module, max_groups: int) -> nn.Module:
    """``module`` with every grouped convolution of 2 to ``max_groups`` groups, each of more than one input channel,
    turned into one dense convolution whose weight is block-diagonal (zeros between the groups), in place.

    The same function: every product the grouped convolution forms is formed, and the others multiply zeros (only
    the order of a sum may change). More multiplies, one kernel of a kind the GPU libraries tune most - a lever for
    small group counts at batch 1 (issue 40 item 4); depthwise convolutions (one channel per group) are left alone.
    A 1x1 one stays a :class:`PointwiseConv2d`, now of one group (the ``bmm`` path then does not apply).
    """
    if not (type(max_groups) is int and max_groups >= 1):
        raise ValueError(f"dense_groups: received {max_groups!r}; expected an int >= 1 (1: leave every group alone)")
    for conv in module.modules():
        g = getattr(conv, "groups", 1)
        if not isinstance(conv, nn.Conv2d) or not 1 < g <= max_groups or conv.in_channels == g:
            continue
        w = conv.weight.detach()
        cout, cin = w.shape[0] // g, w.shape[1]
        dense = w.new_zeros((w.shape[0], cin * g, *w.shape[2:]))
        for i in range(g):
            dense[i * cout : (i + 1) * cout, i * cin : (i + 1) * cin] = w[i * cout : (i + 1) * cout]
        conv.weight = nn.Parameter(dense, requires_grad=conv.weight.requires_grad)
        conv.groups = 1
    return module


class ComputeIn(nn.Module):
    """``module`` run in ``dtype``: its weights cast once here, its input cast on entry (on the device, inside a CUDA
    graph when captured in one); its outputs stay in ``dtype`` (a reader casts what it takes to the host)."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module.to(dtype)
        self.dtype = dtype

    def forward(self, x: torch.Tensor):
        return self.module(x.to(self.dtype))
