"""The fp16 verification bound on trained models: correct fp16 files pass, wrong ones still fail.

The bound (``TOLERANCES["fp16"]``) was first measured on randomized models; a trained model's correct fp16 files
exceeded it one image at a time (2026-11-30: the shipped demo checkpoint by up to 1.8x on real CIFAR-10 images, the
shipped reference checkpoint's own ``export --precision fp16`` failed at its default seed). The wrong exports below
are the reference model perturbed: what an export that computes another model looks like to ``verify``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import REPO, run_cli
from hne_edge.exporters import export_checkpoint
from hne_edge.exporters.verify import verify_bundle
from hne_edge.runtime.inputs import preprocess
from hne_edge.train.checkpoint import model_from_checkpoint

ASSETS = REPO / "hne_edge" / "assets"
DEMO = ASSETS / "cifar10_demo.pt"
# held-out images (the training file's last 5,000; here counted from its end) whose correct fp16 files exceeded the
# former bound (1e-3 + 5e-3 x max|ref|) at batch 1: by 1.21, 1.22, 1.09, 1.01, 1.51 and 1.83x (6 of the 60 measured)
OVER_THE_OLD_BOUND = [-104, -94, -89, -67, -66, -65]


@pytest.fixture(scope="module")
def demo_fp16(tmp_path_factory):
    """The shipped demo checkpoint exported in fp16 (segments and fused), unverified, and its fp32 model."""
    out = tmp_path_factory.mktemp("fp16") / "bundle"
    export_checkpoint(DEMO, out, precisions=("fp16",), plan="segments,fused", batch=(1, 1, 16), verify=False)
    model, state = model_from_checkpoint(DEMO)
    return out, model, state


def test_fp16_export_of_the_shipped_reference_checkpoint_verifies(tmp_path):
    """Reported 2026-12-01: `hne-edge export hne_edge/assets/cifar10_reference.pt --precision fp16` failed its own
    verification with default options ("leaf12.onnx (vs torch (logits)): max abs difference 0.0124 exceeds the
    bound 0.0121"), exit 2, nothing written - the files were right, the bound too tight for a trained model."""
    out = tmp_path / "ref16"
    proc = run_cli("export", str(ASSETS / "cifar10_reference.pt"), "--out", str(out), "--precision", "fp16", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(verified against PyTorch)" in proc.stdout and (out / "manifest.json").is_file()


def test_fp16_files_of_a_trained_model_pass_on_real_images_one_at_a_time(demo_fp16, shared_cifar10):
    out, model, state = demo_fp16
    x = np.load(shared_cifar10)["x"]
    from hne_edge.bundle import read_manifest

    spec = read_manifest(out, verify_files=False).input
    for i in OVER_THE_OLD_BOUND:
        report = verify_bundle(out, model=model, checkpoint=state, inputs=preprocess(x[i:][:1], spec))
        assert report.ok, (i, [c.message() for c in report.failures])


def _stem_scaled(model, factor):
    model.blocks[0][0][0].weight.data *= factor


def _level1_branches_swapped(model):  # the two branches of level 1 exchanged: a wrong branch order
    w = model.blocks[1][0].expand[0].weight.data
    half = w.shape[0] // 2
    w[:] = torch.cat([w[half:], w[:half]])


def _bn_bias_shifted(model):  # a BatchNorm folded with another shift (the last depthwise block)
    model.blocks[4][0].depthwise[1].bias.data += 0.05


@pytest.mark.parametrize("wrong", [lambda m: _stem_scaled(m, 1.05), _level1_branches_swapped, _bn_bias_shifted],
                         ids=["stem weights x1.05", "level-1 branches swapped", "BatchNorm bias +0.05"])
def test_fp16_verification_still_fails_an_export_of_another_model(demo_fp16, wrong):
    """Measured 2026-12-01 on 10 real images each: these are caught on every image at 1.6x (stem x1.05: x1.03
    gave 1.9x median), 44x and 4.1x the bound (median); a 1 % weight error in the stem is caught on 3 of 10 only -
    the fp16 files' own error (up to 0.025 on these logits) is that large."""
    out, model, state = demo_fp16
    wrong_model = copy.deepcopy(model)
    wrong(wrong_model)
    for seed in range(3):
        report = verify_bundle(out, model=wrong_model.eval(), checkpoint=state, seed=seed, batch_sizes=[1])
        assert not report.ok, seed
        assert any("vs torch" in c.check for c in report.failures)
