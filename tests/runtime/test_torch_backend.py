"""The PyTorch backend on the CPU: fp16 from fp32 weights, BatchNorm folded into the unit modules.

References are independent of the backend: the fused hne_tiny model evaluated in float64.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hne_edge.runtime import AnytimeRunner

from conftest import run_cli

FP32 = dict(rtol=1e-4, atol=1e-4)
FP16 = dict(rtol=1e-2, atol=3e-2)  # fp16 end to end vs the float64 fused model, O(1) logits



@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_torch_every_prefix_vs_float64_fused_model(tiny_bundle, reference64, plan, precision):
    """fp16 converts the bundle's fp32 weights (the bundle has no fp16 torch weights)."""
    x, ref = reference64
    tol = FP16 if precision == "fp16" else FP32
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", plan=plan, precision=precision, load_profile=False) as runner:
        modules = [r.module for r in runner._runners]
        dtypes = {p.dtype for m in modules for p in m.parameters()}
        assert dtypes == {__import__("torch").float16 if precision == "fp16" else __import__("torch").float32}
        for n in range(1, runner.num_leaves + 1):
            r = runner.run(x, max_leaves=n)
            assert r.logits.dtype == np.float32
            np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **tol)
        s = runner.start(x)
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **tol)
    if precision == "fp16":  # really fp16: measurably off the float64 model, unlike fp32
        assert np.abs(r.logits - ref.mean(1)).max() > 1e-5


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_torch_units_have_batchnorm_folded_with_the_same_numerics(tiny_bundle, reference64, precision):
    import torch

    x, ref = reference64
    outs = {}
    for fold in (True, False):
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", precision=precision, fold_batchnorm=fold,
                           load_profile=False, warmup=0) as runner:  # fmt: skip
            bns = [m for r in runner._runners for m in r.module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
            assert (len(bns) == 0) == fold
            assert runner.backend.describe()["fold_batchnorm"] is fold
            outs[fold] = runner.run(x).leaf_logits
    if precision == "fp32":
        np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outs[True], ref.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(outs[True], ref.transpose(1, 0, 2), **FP16)


def test_cli_run_torch_fp16_on_cpu(tiny_bundle, reference64, tmp_path):
    """What a user types: `hne-edge run BUNDLE X --backend torch --precision fp16` (once: 'no torch/weights/fp16')."""
    x, ref = reference64
    np.save(tmp_path / "x.npy", x)
    proc = run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "x.npy"), "--backend", "torch",
                   "--precision", "fp16", "--batch-size", "3", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)["records"]
    assert [r["leaves"] for r in records] == [16] * 3
    assert [r["class"] for r in records] == list(ref.mean(1).argmax(1))
