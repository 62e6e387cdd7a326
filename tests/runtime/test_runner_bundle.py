"""The runtime on a real exported bundle (hne_tiny): ONNX Runtime and torch backends vs the fused PyTorch model."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hne_edge.runtime import AnytimeRunner
from conftest import blocking_env


@pytest.fixture(scope="module")
def reference(tiny_bundle):
    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        ref = tiny_bundle.model.eval()(torch.from_numpy(x)).numpy()  # (B, N, classes)
    return x, ref


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
@pytest.mark.parametrize("plan", ["segments", "nodes"])
def test_every_prefix_equals_fused_pytorch_mean(tiny_bundle, reference, backend, plan):
    x, ref = reference
    with AnytimeRunner(tiny_bundle.bundle_dir, backend=backend, plan=plan, load_profile=False) as runner:
        assert runner.class_names == tuple(f"c{i}" for i in range(10))
        for n in range(1, runner.num_leaves + 1):
            r = runner.run(x, max_leaves=n)
            np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(r.leaf_logits, ref.transpose(1, 0, 2), rtol=1e-4, atol=1e-4)
        # the session path gives the same numbers, and its cache stays on one path
        session = runner.start(x)
        while session.step():
            assert len(session.cached_nodes) <= runner.tree.last_block
        np.testing.assert_allclose(session.result().logits, ref.mean(1), rtol=1e-4, atol=1e-4)


def test_budgeted_run_and_profile_on_onnxruntime(tiny_bundle, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    with AnytimeRunner(bundle, threads=1) as runner:
        prof = runner.profile(batch_sizes=(1, 2), warmup=1, repeats=3)
        assert runner.profile_path.parent == bundle / "profiles" and runner.profile_path.is_file()
        assert len(prof.batches[1]["leaves"]) == 16
        x = runner.preprocess(np.zeros((16, 16, 3), np.uint8))
        r = runner.run(x, budget_ms=10_000)
        assert r.leaves == 16 and r.met_budget
    with AnytimeRunner(bundle, threads=1) as runner:
        assert runner.profile_status.startswith("loaded")


def test_runtime_imports_and_runs_without_torch(tiny_bundle, tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from hne_edge.runtime import AnytimeRunner
        from hne_edge.errors import BackendUnavailable
        with AnytimeRunner({str(tiny_bundle.bundle_dir)!r}) as r:
            out = r.run(np.zeros((1, 3, 16, 16), np.float32), max_leaves=3)
        assert out.leaves == 3
        try:
            AnytimeRunner({str(tiny_bundle.bundle_dir)!r}, backend="torch")
        except BackendUnavailable as e:
            print("torch backend:", e)
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
        print("ok")
        """
    )
    env = {**os.environ, **blocking_env(tmp_path, "torch")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "torch backend: backend 'torch' needs PyTorch" in proc.stdout and proc.stdout.strip().endswith("ok")


@pytest.mark.parametrize("backend, options", [("onnxruntime", {}), ("torch", {}), ("torch", {"bfloat16": True})])
def test_start_owns_a_copy_of_the_frame_the_caller_may_reuse_its_buffer(tiny_bundle, reference, backend, options):
    """A camera writes its next frame into the buffer a session was started on: the session still answers the first."""
    if backend == "torch":
        pytest.importorskip("torch")
    x, _ = reference
    with AnytimeRunner(tiny_bundle.bundle_dir, backend=backend, load_profile=False, warmup=0, **options) as runner:
        want = runner.run(x, max_leaves=1).logits
        buffer = x.copy()
        session = runner.start(buffer)
        buffer[:] = 0.0
        session.step()
        np.testing.assert_allclose(session.result().logits, want, rtol=1e-5, atol=1e-5)


def test_results_and_stop_rules_get_read_only_leaf_logits_so_an_in_place_edit_cannot_change_an_answer(
    tiny_bundle, reference
):
    """An app that normalises the logits it is shown in place gets numpy's read-only error, not a changed answer."""
    x, _ = reference
    with AnytimeRunner(tiny_bundle.bundle_dir, load_profile=False, warmup=0) as runner:
        want = runner.run(x).logits

        def normalise_in_place(leaf_logits):
            leaf_logits -= leaf_logits.max(-1, keepdims=True)
            return False

        with pytest.raises(ValueError, match="read-only"):
            runner.run(x, stop_when=normalise_in_place)
        session = runner.start(x)
        first = session.refine(max_leaves=4)
        for result in (first, session.result()):
            with pytest.raises(ValueError, match="read-only"):
                result.leaf_logits -= result.leaf_logits.max(-1, keepdims=True)
        np.array(first.leaf_logits)[:] = 0.0  # a copy is the app's own
        np.testing.assert_allclose(session.refine().logits, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(first.logits, runner.run(x, max_leaves=4).logits, rtol=1e-5, atol=1e-5)
