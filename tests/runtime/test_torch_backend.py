"""The PyTorch backend on the CPU: fp16 from fp32 weights, BatchNorm folded into the unit modules, the levers that
compute the same units another way (bmm, block-diagonal dense convolutions, bfloat16, compiled).

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
                   "--precision", "fp16", "--batch-size", "3", "--device", "cpu", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)["records"]
    assert [r["leaves"] for r in records] == [16] * 3
    assert [r["class"] for r in records] == list(ref.mean(1).argmax(1))


# -- compiled units (torch.compile), the cheapest reduction toward the launch floor (issue 26 item 6) ----------


def _every_stop(runner, x, ref, tol):
    for n in runner.stops:
        np.testing.assert_allclose(runner.run(x, max_leaves=n).logits, ref[:, :n].mean(1), **tol)


@pytest.mark.parametrize("plan", ["fused", "mixed"])  # mixed: every unit of segments, subtrees and fused
def test_compiled_units_equal_the_float64_model_at_every_stop(steps_bundle, reference64, plan):
    """``compile=`` runs each unit through torch.compile: dynamo's trace of every unit (here with the aot_eager
    backend, which checks the tracing without code generation: inductor takes minutes on this CPU; the slow test
    below runs it) gives every prefix of every plan within the fp32 tolerance of the float64 fused model."""
    x, ref = reference64
    with AnytimeRunner(steps_bundle, backend="torch", plan=plan, compile="aot_eager", load_profile=False) as runner:
        assert runner.backend.describe()["compile"] == "aot_eager"
        assert all(type(r.module).__name__ == "OptimizedModule" for r in runner._runners)
        _every_stop(runner, x, ref, FP32)
        if plan == "fused":
            _every_stop(runner, x[:1], ref[:1], FP32)  # another batch size: compiled again (static shapes)


def test_compiled_units_run_in_the_cuda_graphs_of_the_torch_cuda_backend(steps_bundle, reference64, fake_torch_cuda):
    """On the torch CUDA backend (a fake device: CPU tensors) a compiled unit is captured and replayed like an eager
    one: every stop exact, graphs (one per capture size, 1, 2, 4, 8) replayed from the first frame."""
    x, ref = reference64
    with AnytimeRunner(steps_bundle, backend="torch", device="cuda", plan="fused", compile="aot_eager",
                       load_profile=False) as runner:  # fmt: skip
        (dev,) = fake_torch_cuda
        assert dev.captures == 4 and runner.backend.describe()["compile"] == "aot_eager"
        _every_stop(runner, x[:1], ref[:1], FP32)
        assert dev.replays >= 5 and dev.captures == 4


def test_every_compiled_unit_stays_compiled_at_every_capture_size(tiny_bundle, reference64, fake_torch_cuda):
    """Units of one class share one ``forward``, and dynamo compiles a code object at most ``recompile_limit`` (8)
    times, then runs it eagerly with one warning: 16 segments warmed at 4 capture sizes (64 compilations) left
    most units uncompiled, and a compile lever measured nothing. Made loud here, and raised by the backend."""
    import torch

    config = torch._dynamo.config  # its own patch: pytest's monkeypatch would delete (hide) its entries on undo
    limits = {name: getattr(config, name) for name in ("recompile_limit", "accumulated_recompile_limit")}
    x, ref = reference64
    with config.patch(fail_on_recompile_limit_hit=True, **limits):  # the limits the backend raises: restored after
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", plan="segments", compile="eager",
                           load_profile=False) as runner:  # fmt: skip
            assert len(runner._runners) * len(runner.backend.capture_sizes) > 8
            _every_stop(runner, x, ref, FP32)
    assert config.recompile_limit == limits["recompile_limit"] and not config.fail_on_recompile_limit_hit


def test_a_bfloat16_profile_is_not_loaded_by_a_runner_computing_fp32(tiny_bundle, tmp_path):
    import shutil

    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "b")
    with AnytimeRunner(bundle, backend="torch", plan="segments", bfloat16=True, warmup=0) as runner:
        runner.profile(batch_sizes=[1], warmup=0, repeats=2)
    with AnytimeRunner(bundle, backend="torch", plan="segments", warmup=0) as runner:
        assert runner.profile_data is None, runner.profile_status
    with AnytimeRunner(bundle, backend="torch", plan="segments", bfloat16=True, warmup=0) as runner:
        assert runner.profile_data.backend_info["bfloat16"] is True


READ_ONLY_INPUT = """
import sys, numpy as np
from hne_edge.runtime import AnytimeRunner

x = np.load(sys.argv[2], mmap_mode="r")  # read-only, as np.frombuffer's
with AnytimeRunner(sys.argv[1], backend="torch", plan="segments", load_profile=False, warmup=0) as runner:
    ran = runner.run(x).logits
    session = runner.start(x)
    session.refine()
    np.save(sys.argv[3], np.stack([ran, session.result().logits, runner.run(np.array(x)).logits]))
"""


def test_a_read_only_input_runs_on_torch_without_a_warning_and_is_never_written(tiny_bundle, tmp_path):
    """torch's "The given NumPy array is not writable ..." UserWarning reached the caller (once a process: hence a
    fresh one) for an input np.load(mmap_mode="r") or np.frombuffer had made."""
    import subprocess
    import sys

    from conftest import REPO

    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-W", "default", "-c", READ_ONLY_INPUT, str(tiny_bundle.bundle_dir),
                           str(tmp_path / "x.npy"), str(tmp_path / "out.npy")], capture_output=True, text=True,
                          cwd=REPO, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    ran, started, writable = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(ran, writable, rtol=1e-5, atol=1e-6)  # the same answer as from a writable copy
    np.testing.assert_allclose(started, writable, rtol=1e-5, atol=1e-6)
    assert np.array_equal(np.load(tmp_path / "x.npy"), x)  # the caller's file was never written


def test_compile_option_is_checked(tiny_bundle):
    from hne_edge.errors import InputError

    with pytest.raises(InputError, match=r"compile: received 3; expected True, False or a torch.compile backend name"):
        AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", compile=3, load_profile=False)


@pytest.mark.slow
def test_inductor_compiled_fused_tree_equals_the_float64_model(steps_bundle, reference64):
    """The default compiler (inductor: bias, activation and residual fused into fewer kernels) on the whole tree:
    every leaf within the fp32 tolerance of the float64 model (measured here: 3.7e-9; 220 s of compilation on this
    2-core machine for hne_tiny's fused forward)."""
    import torch._inductor.config

    x, ref = reference64
    # one compile thread: with a cold compile cache (a fresh machine) inductor starts a pool of worker threads that
    # it keeps, which the suite's check for threads left running refuses (seen on a cache emptied on purpose)
    with torch._inductor.config.patch(compile_threads=1), AnytimeRunner(
            steps_bundle, backend="torch", plan="fused", compile=True, load_profile=False, warmup=0) as runner:
        np.testing.assert_allclose(runner.run(x).leaf_logits, ref.transpose(1, 0, 2), **FP32)


# -- the levers: the same units computed another way (issue 40 item 4), each prefix against float64 ----------------

BF16 = dict(rtol=3e-2, atol=6e-2)  # bfloat16 (8 significant bits) end to end vs the float64 model, O(1) logits
LEVERS = {"bmm": dict(pointwise="bmm"), "dense": dict(dense_groups=16), "dense<=2": dict(dense_groups=2),
          "bf16": dict(bfloat16=True), "bmm+unfolded": dict(pointwise="bmm", fold_batchnorm=False)}  # fmt: skip


def _grouped(module):
    """The group counts of the non-depthwise convolutions of ``module``."""
    import torch

    return {m.groups for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels != m.groups}


@pytest.mark.parametrize("lever", sorted(LEVERS))
@pytest.mark.parametrize("plan", ["subtrees", "fused"])  # the units with branches side by side (a segment has one)
def test_each_lever_computes_every_prefix_as_the_float64_model(steps_bundle, reference64, lever, plan):
    """``pointwise="bmm"`` (the folded BatchNorm's bias added to the matrix multiply), ``dense_groups`` (block-diagonal
    dense convolutions) and ``bfloat16``: every prefix of every frame, every leaf of a stepped session, against the
    float64 fused model; and each lever really changed the units (the kernels a GPU would run are another kind)."""
    import torch

    from hne_edge.models.layers import PointwiseConv2d

    x, ref = reference64
    options = LEVERS[lever]
    tol = BF16 if options.get("bfloat16") else FP32
    with AnytimeRunner(steps_bundle, backend="torch", plan=plan, load_profile=False, **options) as runner:
        info = runner.backend.describe()
        assert {k: info[k] for k in options} == options
        modules = [r.module for r in runner._runners]
        if "dense_groups" in options:  # no group count left in 2..dense_groups (hne_tiny's run to 16 branches)
            assert not any(1 < g <= options["dense_groups"] for m in modules for g in _grouped(m))
            assert any(g > 2 for m in modules for g in _grouped(m)) == (options["dense_groups"] == 2)
        if "pointwise" in options:
            pw = [p for m in modules for p in m.modules() if isinstance(p, PointwiseConv2d) and p.groups > 1]
            assert pw and all(p.pointwise == "bmm" for p in pw)
            assert all(p.bias is not None for p in pw) == options.get("fold_batchnorm", True)
        grouped = [_grouped(m) for m in modules]
        want = torch.bfloat16 if options.get("bfloat16") else torch.float32
        assert {p.dtype for m in modules for p in m.parameters()} == {want}
        for n in runner.stops:
            r = runner.run(x, max_leaves=n)
            assert r.logits.dtype == np.float32 and r.leaves == n
            np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **tol)
        s = runner.start(x[:2])
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref[:2].transpose(1, 0, 2), **tol)
    if options.get("bfloat16"):  # really bfloat16: measurably off the float64 model, unlike fp32
        assert np.abs(r.leaf_logits - ref.transpose(1, 0, 2)).max() > 1e-4
    with AnytimeRunner(steps_bundle, backend="torch", plan=plan, load_profile=False) as plain:
        assert ([_grouped(r.module) for r in plain._runners] == grouped) == ("dense_groups" not in options)


@pytest.mark.parametrize("lever", ["dense", "bf16", "bmm"])
def test_levers_run_in_the_cuda_graphs_of_the_torch_cuda_backend(steps_bundle, reference64, fake_torch_cuda, lever):
    """The levers on the torch CUDA backend (a fake device: CPU tensors): captured and replayed like the plain units
    (bfloat16's cast of the image inside the graph), every stop of plan mixed within its tolerance."""
    x, ref = reference64
    options = LEVERS[lever]
    with AnytimeRunner(steps_bundle, backend="torch", device="cuda", plan="mixed", load_profile=False,
                       **options) as runner:
        (dev,) = fake_torch_cuda
        captured = dev.captures
        assert captured > 0 and {k: runner.backend.describe()[k] for k in options} == options
        _every_stop(runner, x[:1], ref[:1], BF16 if options.get("bfloat16") else FP32)
        _every_stop(runner, x, ref, BF16 if options.get("bfloat16") else FP32)
        assert dev.captures == captured and dev.replays > captured  # served by replays: nothing captured while serving


@pytest.mark.parametrize("options, message", [
    (dict(dense_groups=0), r"dense_groups: received 0; expected an int >= 1 \(1: no convolution densified\)"),
    (dict(dense_groups=2.0), r"dense_groups: received 2.0; expected an int >= 1"),
    (dict(pointwise="gemm"), r"pointwise: received 'gemm'; expected one of conv, bmm"),
    (dict(bfloat16="yes"), r"bfloat16: received 'yes'; expected True or False"),
    (dict(fold_batchnorm="false"), r"fold_batchnorm: received 'false'; expected True or False"),  # bool() read True
    (dict(compile_mode="max-autotune-no-cudagraphs"), r"compile_mode: received 'max-autotune-no-cudagraphs' with "
                                                      r"compile=False; expected None, or one of default, "
                                                      r"max-autotune-no-cudagraphs with compile=True"),
    (dict(compile=True, compile_mode="reduce-overhead"), r"compile_mode: received 'reduce-overhead' .*capture CUDA "
                                                         r"graphs of their own are refused"),
    (dict(bfloat16=True, precision="fp16"), r"bfloat16 computes an fp32 bundle in bfloat16; received precision "
                                            r"'fp16' too"),
])  # fmt: skip
def test_lever_options_are_checked(tiny_bundle, options, message):
    from hne_edge.errors import InputError

    with pytest.raises(InputError, match=message):
        AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", load_profile=False, **options)
