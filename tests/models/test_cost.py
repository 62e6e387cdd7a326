"""MAC accounting: cross-checked against torch's FlopCounterMode and the paper's closed form."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import hne_edge
from hne_edge.models import tree_cost
from hne_edge.models.hne import ResNetHNEConfig, HNE
from hne_edge.tree import hne_tree
from conftest import one_line_error, run_cli


def counted_macs(module, x) -> float:
    """Independent counter: FlopCounterMode counts 2 FLOPs per multiply-add."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(x)
    return counter.get_total_flops() / 2


@pytest.mark.parametrize("name", hne_edge.list_models())
def test_macs_match_flop_counter(name):
    model = hne_edge.create_model(name).eval()
    cost = tree_cost(model)
    x = torch.zeros(1, *model.config.input_shape)
    whole_tree = counted_macs(model, x)  # the fused model computes every node once
    assert cost.total_macs == pytest.approx(whole_tree, rel=0.01)
    one_path = counted_macs(model.path_module(0), x)
    assert cost.path_macs[0] == pytest.approx(one_path, rel=0.01)
    # independent ensemble of n networks = n paths; prefix shares nodes
    n = model.num_leaves
    assert cost.independent_macs[-1] == sum(cost.path_macs)
    assert cost.prefix_macs[0] == cost.path_macs[0]
    assert all(a < b for a, b in zip(cost.prefix_macs, cost.prefix_macs[1:]))
    assert cost.ratio == pytest.approx(sum(cost.path_macs) / whole_tree, rel=0.01)
    assert cost.params == sum(p.numel() for p in model.parameters())
    assert len(cost.prefix_macs) == n


def test_ratio_closed_form_on_measured_equal_cost_tree():
    """A real network whose blocks all cost the same (no stem, no head cost): the measured R is exact."""
    from torch import nn

    from hne_edge.models.layers import ConvBNAct

    class Equal(ResNetHNEConfig):
        def build_block(self, depth, branches):
            return ConvBNAct(4, 4, 3, branches=branches)

        def build_head(self, branches):
            from hne_edge.models.layers import ClassifierHead

            head = ClassifierHead(4, 2, branches)
            head.fc = nn.Sequential(nn.Identity())  # a parameter-free head keeps blocks equal
            head.num_classes = 4
            return head

    for levels in (1, 2, 3, 4, 5):
        tree = hne_tree(levels)
        cfg = Equal(name="eq", tree=tree, in_chans=4, input_size=6, blocks=((4, 1, 1),) * tree.num_blocks)
        cost = tree_cost(HNE(cfg))
        assert len({c.macs for c in cost.nodes.values()}) == 1
        assert cost.ratio == (levels + 1) / (2 - 2**-levels)


def test_info_cli_json():
    proc = run_cli("info", "hne_resnet_small", "--json", check=True)
    data = json.loads(proc.stdout)
    assert [a["n"] for a in data["anytime"]] == list(range(1, 17))
    assert data["tree"]["leaf_order"][0] == "b4.0"
    assert data["nodes"][0]["id"] == "b0.0" and data["tree"]["nodes"][1]["parent"] == "b0.0"
    assert data["mac_convention"].startswith("1 multiply-add = 1 MAC")


def test_info_cli_table_and_errors(tmp_path):
    proc = run_cli("info", "hne_tiny", "--tree", "independent", "--plot", str(tmp_path / "tree.png"), check=True)
    assert "b0.15" in proc.stdout and "R = " in proc.stdout
    assert (tmp_path / "tree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_cli("info", "hne_tiny", "--tree", "1,0,2,2,2")
    assert bad.returncode == 2
    assert "received (1, 0, 2, 2, 2)" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("info", "nosuchmodel")
    assert bad.returncode == 2 and "unknown model 'nosuchmodel'" in bad.stderr


def test_info_tree_of_the_wrong_length_names_the_flag_and_what_to_type():
    """`info hne_tiny --tree 1,2,2` said "the architecture table has 5 rows; they must match", naming neither --tree
    nor what to type."""
    one_line_error(run_cli("info", "hne_tiny", "--tree", "1,2,2"), "--tree 1,2,2", "5 blocks", "1,2,2,2,2")
