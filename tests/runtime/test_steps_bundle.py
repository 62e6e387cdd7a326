"""Plans "subtrees", "fused" and "mixed" on a real exported bundle (hne_tiny), on every backend available here:
ONNX Runtime and torch on the CPU, fp32 and fp16, every stop and every mixed schedule against the float64
fused model (conftest.reference64). The GPU backends run them in tests/runtime/test_gpu_fakes_*.py."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest

from hne_edge.runtime import AnytimeRunner
from conftest import run_cli

TOL = {"fp32": dict(rtol=1e-4, atol=1e-4), "fp16": dict(rtol=1e-2, atol=3e-2)}  # fp16 end to end vs float64


class Forced:
    """A cost model that makes a mixed runner take exactly the big steps ``take`` (test_steps.Forced)."""

    def __init__(self, runner, take):
        self.pred = [0.0 if j in take else (1.0 if s["kind"] == "leaf" else 1e9) for j, s in enumerate(runner.steps)]
        self.known = [True] * len(self.pred)
        self.base = self.pred  # medians: the same

    def observe(self, step, seconds):
        pass

    def for_batch(self, batch):
        return self


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
@pytest.mark.parametrize("plan", ["subtrees", "fused"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_stop_vs_float64_fused_model(steps_bundle, reference64, backend, plan, precision):
    x, ref = reference64
    with AnytimeRunner(steps_bundle, backend=backend, plan=plan, precision=precision, load_profile=False) as runner:
        assert runner.stops == ((1, 2, 4, 8, 16) if plan == "subtrees" else (16,))
        for n in runner.stops:
            r = runner.run(x, max_leaves=n)
            assert r.leaves == n and r.logits.dtype == np.float32
            np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **TOL[precision])
        np.testing.assert_allclose(r.leaf_logits, ref.transpose(1, 0, 2), **TOL[precision])
        s = runner.start(x)
        while s.step():
            assert s.leaves in runner.stops
        np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **TOL[precision])
        if backend == "onnxruntime" and plan == "subtrees":  # leaf 0 alone: the export-free first-leaf file
            assert runner.first_leaf_file == f"onnx/{precision}/first/leaf00.onnx"


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_every_mixed_schedule_vs_float64_fused_model(steps_bundle, reference64, backend):
    x, ref = reference64
    with AnytimeRunner(steps_bundle, backend=backend, plan="mixed", load_profile=False) as runner:
        big = [j for j, s in enumerate(runner.steps) if s["kind"] != "leaf"]
        assert [runner.steps[j]["leaves"] for j in big] == [(2, 4), (4, 8), (8, 16), (0, 16)]
        for k in range(len(big) + 1):
            for take in itertools.combinations(big, k):
                runner.cost = Forced(runner, set(take))
                for n in (1, 2, 3, 4, 6, 8, 12, 16):
                    r = runner.run(x, max_leaves=n)
                    np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **TOL["fp32"])
                    chosen = {runner.steps[j]["leaves"] for j in take}
                    assert all(hi - lo == 1 or (lo, hi) in chosen for lo, hi, _ in r.step_ms)  # only what was forced
                s = runner.start(x)
                s.refine(max_leaves=5)
                s.refine()
                np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **TOL["fp32"])


def test_mixed_profile_measures_every_step_and_is_reloaded(steps_bundle, tmp_path):
    bundle = shutil.copytree(steps_bundle, tmp_path / "b")
    with AnytimeRunner(bundle, plan="mixed", threads=1) as runner:
        prof = runner.profile(batch_sizes=(1,), warmup=1, repeats=3)
        steps = prof.batches[1]["leaves"]
        assert [tuple(s["adds"]) for s in steps] == [s["leaves"] for s in runner.steps]  # 16 leaves, 3 subtrees, the tree
        assert all(len(s["samples_ms"]) == 3 for s in steps)
        assert [lv["n"] for lv in prof.batches[1]["levels"]] == list(range(1, 17))
        r = runner.run(x := np.zeros((1, 3, 16, 16), np.float32), budget_ms=10_000)
        assert r.leaves == 16 and r.met_budget
        saved = runner.profile_path  # cpu-onnxruntime-mixed-fp32-DIGEST.json: threads=1 is not the default setup
    assert saved.parent == bundle / "profiles" and saved.is_file()
    assert saved.name.startswith("cpu-onnxruntime-mixed-fp32")
    with AnytimeRunner(bundle, plan="mixed", threads=1) as runner:
        assert runner.profile_status.startswith("loaded")
        assert np.isfinite(runner.predicted_ms(1)).all()
        assert runner.run(x).leaves == 16
    with AnytimeRunner(bundle, plan="subtrees", threads=1) as runner:  # another plan's profile is not this one
        assert runner.profile_data is None


def test_cli_run_profile_and_bench_with_the_new_plans(steps_bundle, reference64, tmp_path):
    x, ref = reference64
    np.save(tmp_path / "x.npy", x)
    bundle = shutil.copytree(steps_bundle, tmp_path / "b")
    for plan in ("subtrees", "fused", "mixed"):
        proc = run_cli("run", str(bundle), str(tmp_path / "x.npy"), "--plan", plan, "--batch-size", "3", "--json")
        assert proc.returncode == 0, proc.stderr
        assert [r["class"] for r in json.loads(proc.stdout)["records"]] == list(ref.mean(1).argmax(1))
    proc = run_cli("profile", str(bundle), "--plan", "subtrees", "--repeats", "2", "--warmup", "0", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "   4     8-15" in proc.stdout  # step 4 adds leaves 8-15
    proc = run_cli("bench", str(bundle), "--plan", "subtrees", "--repeats", "2", "--warmup", "0", "--out", str(tmp_path / "bench"),
                   "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [lv["n"] for lv in json.loads(proc.stdout)["levels"]] == [1, 2, 4, 8, 16]
    proc = run_cli("run", str(bundle), str(tmp_path / "x.npy"), "--plan", "subtrees", "--max-leaves", "3")
    assert proc.returncode == 0 and "leaves=2/16" in proc.stdout
    proc = run_cli("run", str(bundle), str(tmp_path / "x.npy"), "--plan", "fused", "--max-leaves", "3")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--max-leaves=3: plan 'fused' stops only at 16 leaves" in proc.stderr  # the flag typed (issue 28)
