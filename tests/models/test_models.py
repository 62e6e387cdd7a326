"""The fused HNE and its per-node views: shapes, leaf order, and exact equivalence."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import hne_edge
from hne_edge.models import config_from_dict, model_config
from hne_edge.models.layers import replicate_branches
from conftest import randomize_

ZOO = hne_edge.list_models()


def test_registry():
    assert ZOO == ["hne_mobilenetv2", "hne_resnet", "hne_resnet_small", "hne_tiny"]
    assert hne_edge.list_models("hne_resnet*") == ["hne_resnet", "hne_resnet_small"]
    with pytest.raises(ValueError, match="unknown model 'resnet50'; available: hne_mobilenetv2"):
        hne_edge.create_model("resnet50")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['depth'\]"):
        hne_edge.create_model("hne_tiny", depth=3)


@torch.no_grad()
@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("tree", ["hne", "independent", "multi_branch"])
def test_per_node_chain_matches_fused(name, tree):
    """Chaining node modules along each path reproduces the fused logits of that leaf (<= 1e-5).

    MobileNet's baselines at the paper's size are 126-133M parameters each; they are built narrow and at
    32x32 here (the same blocks, grouping and splits; their full size is counted in
    test_mobilenet_trees_at_full_size), with the classifier scaled up to give O(1) logits.
    """
    narrow = name == "hne_mobilenetv2" and tree != "hne"
    small = dict(width_mult=0.25, last_channels=64, hidden=64, num_classes=10, input_size=32) if narrow else {}
    model = randomize_(hne_edge.create_model(name, tree=tree, **small))
    if narrow:
        model.head.fc[-1].weight.mul_(10.0)
    cfg = model.config
    x = torch.randn(2, *cfg.input_shape, generator=torch.Generator().manual_seed(1))
    fused = model(x)
    assert fused.shape == (2, model.num_leaves, cfg.num_classes)
    assert fused.abs().max() > 0.5, "logits must be non-trivial for the tolerance to mean something"
    nodes = model.node_modules()
    acts: dict[str, torch.Tensor] = {}
    for node in model.tree.nodes:  # breadth-first: every parent before its children
        inp = x if node.parent is None else acts[node.parent]
        acts[node.id] = nodes[node.id](inp)
    for leaf, leaf_id in enumerate(model.tree.leaf_order):
        diff = (acts[leaf_id] - fused[:, leaf]).abs().max().item()
        assert diff <= 1e-5, f"{name}/{tree}: leaf {leaf} differs by {diff:.2e}"
    # the leaves are different networks (distinct weights), not copies
    assert (fused[:, 0] - fused[:, -1]).abs().max() > 1e-3


@torch.no_grad()
def test_node_module_holds_only_its_weights():
    model = hne_edge.create_model("hne_resnet_small")
    fused_params = sum(p.numel() for p in model.parameters())
    node_params = sum(sum(p.numel() for p in m.parameters()) for m in model.node_modules().values())
    assert node_params == fused_params
    # sliced copies: changing the node module does not touch the fused model
    leaf = model.node_module("b4.3")
    before = model.head.fc[0].weight.clone()
    next(leaf.head.parameters()).data.add_(1.0)
    assert torch.equal(model.head.fc[0].weight, before)


@torch.no_grad()
@pytest.mark.parametrize("name", ["hne_tiny", "hne_resnet_small"])
def test_path_and_segment_modules(name):
    model = randomize_(hne_edge.create_model(name))
    x = torch.randn(3, *model.config.input_shape)
    fused = model(x)
    assert torch.allclose(model.path_module(5)(x), fused[:, 5], atol=1e-5)
    # run the depth-first traversal through segment modules with a cache
    cache: dict[str, torch.Tensor] = {}
    for seg in model.tree.segments:
        outs = model.segment_module(seg)(x if seg.input is None else cache[seg.input])
        assert len(outs) == len(seg.exports) + 1
        cache.update(zip(seg.exports, outs[:-1]))
        assert torch.allclose(outs[-1], fused[:, seg.leaf], atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("name, tree", [("hne_tiny", "hne"), ("hne_tiny", (1, 4, 1, 2, 1)), ("hne_tiny", (2, 1, 2, 1, 2)),
                                        ("hne_resnet_small", "hne"),
                                        pytest.param("hne_mobilenetv2", "hne", marks=pytest.mark.slow)])  # fmt: skip
def test_subtree_units_match_the_fused_model(name, tree):
    """Plan "subtrees" as modules: leaf 0's chain exports what later units read, each later unit is a whole
    subtree still fused, and together they give every leaf's fused logits (checked in float64: exact slicing)."""
    model = randomize_(hne_edge.create_model(name, tree=tree)).double()
    x = torch.randn(1 if name == "hne_mobilenetv2" else 2, *model.config.input_shape, dtype=torch.double)  # 224x224: one
    fused = model(x)
    nodes = model.node_modules()
    acts = {None: x}
    for node in model.tree.nodes:
        acts[node.id] = nodes[node.id].double()(acts[node.parent])
    got = []
    for unit in model.tree.subtree_units:
        outs = model.unit_module(unit).double()(acts[unit.input])
        if unit.index == 0:
            assert len(outs) == len(unit.exports) + 1
            for nid, act in zip(unit.exports, outs):
                assert torch.equal(act, acts[nid])
            got.append(outs[-1][:, None])
        else:
            assert len(outs) == 1 and outs[0].shape == (len(x), unit.num_leaves, model.config.num_classes)
            got.append(outs[0])
    assert (torch.cat(got, dim=1) - fused).abs().max() <= 1e-10
    # a subtree holds exactly its nodes' weights
    sub = model.subtree_module(model.tree.subtree_units[-1].root)
    assert sum(p.numel() for p in sub.parameters()) == sum(
        sum(p.numel() for p in nodes[n].parameters()) for n in model.tree.subtree_units[-1].nodes
    )


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_per_node_views_take_the_models_dtype(dtype):
    """The views were built in float32 and moved to the model's device only: a float64 model's node_module said
    "expected scalar type Double but found Float". Each view now has the model's dtype and, in float64, its output
    is the fused model's."""
    model = randomize_(hne_edge.create_model("hne_tiny")).eval().to(dtype)
    views = [model.node_module("b0.0"), model.path_module(3), model.segment_module(1), model.subtree_module("b1.1"),
             model.unit_module(0), model.unit_module(len(model.tree.subtree_units) - 1)]  # fmt: skip
    assert all(p.dtype == dtype for view in views for p in view.parameters())
    if dtype != torch.float64:
        return
    x = torch.randn(2, *model.config.input_shape, dtype=dtype)
    fused, root = model(x), model.node_module("b0.0")(x)
    last = model.tree.subtree_units[-1]
    close = lambda a, b: (a - b).abs().max().item() <= 1e-10  # noqa: E731
    assert close(model.path_module(3)(x), fused[:, 3])
    assert close(model.segment_module(0)(x)[-1], fused[:, 0])
    assert close(model.unit_module(0)(x)[-1], fused[:, 0])
    assert close(model.subtree_module("b1.1")(root)[0], fused[:, model.tree.node("b1.1").leaves[0]:])
    assert close(model.unit_module(last)(root if last.input == "b0.0" else x)[0], fused[:, last.first_leaf:])


def test_replicate_branches_layout():
    x = torch.arange(2 * 2 * 3).float().view(1, 4, 3, 1)  # 2 branches of 2 channels
    y = replicate_branches(x, branches=2, factor=2)
    # children of branch p sit at 2p, 2p+1
    assert torch.equal(y[0, :, 0, 0], torch.tensor([0, 3, 0, 3, 6, 9, 6, 9]).float())


def test_replicate_branches_exports_as_one_gather_with_the_same_layout(tmp_path):
    import onnx
    import onnxruntime as ort

    class Split(torch.nn.Module):
        def forward(self, x):
            return replicate_branches(x, branches=2, factor=3)

    x = torch.randn(2, 4, 3, 5)
    path = tmp_path / "split.onnx"
    torch.onnx.export(Split(), (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17,
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)  # fmt: skip
    assert [n.op_type for n in onnx.load(str(path)).graph.node if n.op_type != "Constant"] == ["Gather"]
    x3 = torch.randn(3, 4, 3, 5)  # another batch size: nothing about the batch was baked in
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x3.numpy()})
    assert torch.equal(torch.from_numpy(y), replicate_branches(x3, branches=2, factor=3))


def test_forward_train_mode_and_grad():
    model = hne_edge.create_model("hne_tiny").train()
    out = model(torch.randn(4, 3, 16, 16))
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_config_round_trip_and_validation():
    for name in ZOO:
        cfg = model_config(name)
        again = config_from_dict(cfg.to_dict())
        assert again == cfg
    with pytest.raises(ValueError, match=r"TreeSpec.branching 1,2,2: .* has 5 blocks, this tree 3; expected 5 "):
        hne_edge.create_model("hne_resnet", tree=(1, 2, 2))
    with pytest.raises(ValueError, match="divisible by reduction=2; received 33"):
        hne_edge.create_model("hne_tiny", blocks=((33, 1, 1),) * 5)
    with pytest.raises(ValueError, match="num_classes must be at least 2; received 1"):
        hne_edge.create_model("hne_tiny", num_classes=1)
    with pytest.raises(ValueError, match="arch"):
        config_from_dict({"arch": "vgg"})


@pytest.mark.parametrize(
    "tree, branching", [("hne", (1, 2, 2)), ("independent", (16, 1, 1)), ("multi_branch", (1, 16, 1))]
)
def test_tree_presets_follow_overridden_blocks(tree, branching):
    """A preset is the preset for the model's own blocks: with 3 overridden blocks, "hne" said "hne_tiny has 3
    blocks, this tree 5" (it was resolved against the zoo default's 5 blocks), in the API and in a TrainConfig."""
    from hne_edge.train import TrainConfig

    blocks = ((16, 1, 1), (32, 2, 1), (32, 1, 1))
    model = hne_edge.create_model("hne_tiny", blocks=blocks, tree=tree)
    assert model.tree.branching == branching
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, model.num_leaves, 10)
    config = TrainConfig.from_dict({"preset": "digits", "model": {
        "name": "hne_tiny", "overrides": {"blocks": [list(b) for b in blocks], "tree": tree}}})  # fmt: skip
    assert config.model.overrides["tree"] == tree


_MOBILE = dict(width_mult=0.25, last_channels=32, hidden=16, input_size=32)
_MOBILE_BLOCKS = (((1, 16, 1, 1),), ((6, 32, 1, 2),), ((6, 32, 1, 2),), ((6, 32, 1, 1),))


@pytest.mark.parametrize("name, overrides, field", [
    ("hne_tiny", dict(stem_channels=(8,)), "stem_channels"),
    ("hne_tiny", dict(stem_channels=(8, 16, 4)), "stem_channels"),
    ("hne_tiny", dict(stem_channels=(0, 16)), "stem_channels"),
    ("hne_tiny", dict(stem_channels=(8, -1)), "stem_channels"),
    ("hne_tiny", dict(stem_channels=8), "stem_channels"),
    ("hne_tiny", dict(reduction=0), "reduction"),
    ("hne_tiny", dict(reduction=-2), "reduction"),
    ("hne_tiny", dict(blocks=((16, 1, 1),) * 4 + ((32, 1, True),)), "blocks"),
    ("hne_mobilenetv2", dict(_MOBILE, hidden=0), "hidden"),
    ("hne_mobilenetv2", dict(_MOBILE, last_channels=0), "last_channels"),
    ("hne_mobilenetv2", dict(_MOBILE, stem_channels=0), "stem_channels"),
    ("hne_mobilenetv2", dict(_MOBILE, width_mult=float("nan")), "width_mult"),
    ("hne_mobilenetv2", dict(_MOBILE, width_mult=float("inf")), "width_mult"),
    ("hne_mobilenetv2", dict(_MOBILE, width_mult="1.4"), "width_mult"),
    ("hne_mobilenetv2", dict(_MOBILE, blocks=((),) + _MOBILE_BLOCKS), "blocks"),
    ("hne_mobilenetv2", dict(_MOBILE, blocks=_MOBILE_BLOCKS[:1] + ((),) + _MOBILE_BLOCKS[1:]), "blocks"),
])  # fmt: skip
def test_model_config_refuses_what_cannot_be_built(name, overrides, field):
    """A config validates itself on construction: these passed it, then crashed building or running the model
    (IndexError, ZeroDivisionError, "negative dimension", a zero-width convolution) or silently ignored a value."""
    with pytest.raises(hne_edge.errors.InputError, match=rf"^{field}: received .*; expected "):
        hne_edge.create_model(name, **overrides)


def test_custom_input_channels_and_size():
    model = hne_edge.create_model("hne_tiny", in_chans=1, input_size=8, num_classes=10)
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 16, 10)


@pytest.mark.parametrize("tree", ["hne", "independent", "multi_branch"])
def test_mobilenet_trees_at_full_size(tree):
    """At the paper's size (224, width 1.4, 1000 classes) each tree holds, per block, one copy of the single
    network's block per node at that depth, and one head per leaf; counted on the meta device (no memory)."""
    from collections import Counter

    def per_block(model) -> Counter:
        counts: Counter = Counter()
        for pname, p in model.named_parameters():
            counts[".".join(pname.split(".")[:2])] += p.numel()  # blocks.0 .. blocks.4, head.fc
        return counts

    with torch.device("meta"):
        single = per_block(hne_edge.create_model("hne_mobilenetv2", tree=(1, 1, 1, 1, 1)))
        model = hne_edge.create_model("hne_mobilenetv2", tree=tree)
    branching = model.tree.branching
    assert branching == {"hne": (1, 2, 2, 2, 2), "independent": (16, 1, 1, 1, 1), "multi_branch": (1, 1, 1, 16, 1)}[tree]
    nodes_at = [int(np.prod(branching[: d + 1])) for d in range(5)]  # nodes at each depth
    expected = {f"blocks.{d}": nodes_at[d] * single[f"blocks.{d}"] for d in range(5)}
    expected["head.fc"] = 16 * single["head.fc"]
    assert dict(per_block(model)) == expected
    assert model.config.input_shape == (3, 224, 224) and model.config.num_classes == 1000


def test_mobilenet_spatial_sizes():
    """The documented choice: block outputs 56, 28, 14, 7, 7 at 224."""
    from hne_edge.models import tree_cost

    cost = tree_cost(hne_edge.create_model("hne_mobilenetv2"))
    sizes = [cost.nodes[f"b{d}.0"].output_shape for d in range(4)]
    assert [s[1] for s in sizes] == [56, 28, 14, 7]
    assert cost.nodes["b4.0"].output_shape == (1000,)


@pytest.mark.parametrize("channels_last", [False, True])
def test_pointwise_as_batched_matmul_is_the_same_function_and_gradient(channels_last):
    """TrainConfig.pointwise "bmm": every branch-parallel 1x1 convolution as one bmm over its groups. Against a float64
    reference (the grouped convolutions, in double), bmm and conv in float32 give the same training-mode logits and
    the same weight gradients (BatchNorm in eval mode there: training-mode statistics of a batch of 6 amplify float32
    rounding in some gradients, for either formulation alike), with the same parameters and state-dict keys."""
    from hne_edge.models.layers import PointwiseConv2d, set_pointwise

    torch.manual_seed(0)
    pristine = randomize_(hne_edge.create_model("hne_resnet_small"))  # a training-mode forward moves BatchNorm's statistics
    x = torch.randn(6, 3, 32, 32)
    y = torch.randint(0, 10, (6,)).repeat_interleave(16)
    reference = copy.deepcopy(pristine).double()
    reference.eval()(x.double()).flatten(0, 1).log_softmax(-1)[torch.arange(96), y].sum().backward()
    grads64 = {k: p.grad.clone() for k, p in reference.named_parameters()}
    logits64 = reference.train()(x.double())
    keys = list(pristine.state_dict())
    for mode in ("conv", "bmm"):
        model = set_pointwise(copy.deepcopy(pristine), mode)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        xin = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        model.eval()(xin).flatten(0, 1).log_softmax(-1)[torch.arange(96), y].sum().backward()
        assert (model.train()(xin).double() - logits64).abs().max().item() < 1e-4, mode
        for k, p in model.named_parameters():
            assert (p.grad.double() - grads64[k]).abs().max().item() < 1e-4 * grads64[k].abs().max().item(), (mode, k)
        assert list(model.state_dict()) == keys
    assert sum(isinstance(m, PointwiseConv2d) and m.groups > 1 for m in model.modules()) == 26  # blocks 1-4
    assert all(m.pointwise == "bmm" for m in model.modules() if isinstance(m, PointwiseConv2d))
    with pytest.raises(ValueError, match="pointwise: received 'gemm'; expected one of conv, bmm"):
        set_pointwise(model, "gemm")
