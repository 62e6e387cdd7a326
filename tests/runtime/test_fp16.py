"""fp16 bundles through the runtime and every runtime command (issue 15 item 2), checked against the fp32 PyTorch model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from hne_edge.exporters import export_onnx
from hne_edge.exporters.base import TOLERANCES
from hne_edge.runtime import AnytimeRunner

PLANS = ["segments", "nodes"]


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory, tiny_bundle):
    out = tmp_path_factory.mktemp("fp16rt") / "bundle"
    return export_onnx(tiny_bundle.model, out, precisions="fp32,fp16", plan="both", batch=(1, 1, 8),
                       torch_weights=False, verify=False)  # fmt: skip


@pytest.fixture(scope="module")
def frames(tmp_path_factory, tiny_bundle):
    """An .npz of 6 normalised float32 frames and the fp32 PyTorch model's per-leaf logits on them."""
    x = np.random.default_rng(0).standard_normal((6, *tiny_bundle.model.config.input_shape)).astype(np.float32)
    with torch.no_grad():
        fused = tiny_bundle.model.eval()(torch.from_numpy(x)).numpy()  # (B, N, classes)
    path = tmp_path_factory.mktemp("frames") / "frames.npz"
    np.savez(path, x=x)
    return path, x, fused


def bound(ref):
    return TOLERANCES["fp16"].bound(float(np.abs(ref).max()))


@pytest.mark.parametrize("plan", PLANS)
def test_runner_runs_fp16_files_and_returns_float32_logits(fp16_bundle, frames, plan):
    _, x, fused = frames
    with AnytimeRunner(fp16_bundle, precision="fp16", plan=plan) as runner:
        r = runner.run(x[:4])
        first = runner.run(x[:4], max_leaves=1)  # the export-free first-leaf file (plan "first", fp16)
        session = runner.start(x[:4])
        session.step()
        stepped = session.refine()
    assert r.leaf_logits.dtype == np.float32 and r.logits.dtype == np.float32
    for n in range(1, r.leaves + 1):  # every anytime prefix vs the fp32 fused model
        ref = fused[:4, :n].mean(1)
        assert np.abs(r.leaf_logits[:n].mean(0) - ref).max() <= bound(ref), n
    assert np.abs(first.logits - fused[:4, 0]).max() <= bound(fused[:4, 0])
    np.testing.assert_array_equal(stepped.leaf_logits, r.leaf_logits)
    with AnytimeRunner(fp16_bundle, precision="fp32", plan=plan) as runner32:
        r32 = runner32.run(x[:4])
    assert np.abs(r.leaf_logits - r32.leaf_logits).max() > 0  # really computed in fp16


@pytest.mark.parametrize("plan", PLANS)
def test_cli_run_fp16(fp16_bundle, frames, plan):
    path, x, fused = frames
    proc = run_cli("run", str(fp16_bundle), str(path), "--precision", "fp16", "--plan", plan, "--batch-size", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)["records"]
    assert [r["leaves"] for r in records] == [16] * len(x)
    mean = fused.mean(1)
    ref_prob = np.exp(mean - mean.max(1, keepdims=True))
    ref_prob /= ref_prob.sum(1, keepdims=True)
    for rec in records:
        i = rec["index"]
        assert abs(rec["prob"] - ref_prob[i].max()) <= 1e-2, (rec, ref_prob[i].max())
        top2 = np.sort(mean[i])[-2:]
        if top2[1] - top2[0] > 2 * bound(mean):  # not a near-tie: the class must be the reference's
            assert rec["class"] == int(mean[i].argmax())


@pytest.mark.parametrize("plan", PLANS)
def test_cli_bench_and_profile_fp16(fp16_bundle, frames, plan, tmp_path):
    path, _, _ = frames
    proc = run_cli("bench", str(fp16_bundle), "--precision", "fp16", "--plan", plan, "--warmup", "1", "--repeats", "2",
                   "--out", str(tmp_path / "bench"), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["precision"] == "fp16" and [lv["n"] for lv in result["levels"]] == list(range(1, 17))
    proc = run_cli("profile", str(fp16_bundle), "--precision", "fp16", "--plan", plan, "--warmup", "1", "--repeats", "3")
    assert proc.returncode == 0, proc.stderr
    saved = fp16_bundle / "profiles" / f"cpu-onnxruntime-{plan}-fp16.json"
    assert f"saved {saved}" in proc.stdout
    assert len(json.loads(saved.read_text())["batch_sizes"]["1"]["leaves"]) == 16


def test_verify_runs_the_bundle_through_the_runtime(fp16_bundle, monkeypatch):
    """verify must exercise the path AnytimeRunner uses, so a bundle the runner cannot run does not pass."""
    from hne_edge.exporters.verify import verify_bundle
    from hne_edge.runtime.backends import onnxruntime as ort_backend

    report = verify_bundle(fp16_bundle)
    assert report.ok, report.format_table()
    assert any("runtime" in c.check for c in report.checks), report.format_table()

    def refuse(self, inputs):
        raise RuntimeError("the runtime path was taken")

    monkeypatch.setattr(ort_backend.OnnxRuntimeRunner, "run_impl", refuse)
    with pytest.raises(RuntimeError, match="the runtime path was taken"):
        verify_bundle(fp16_bundle)
