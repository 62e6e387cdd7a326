"""GPU backends on a real GPU (``@pytest.mark.gpu`` / ``@pytest.mark.tensorrt``): every prefix of leaves
equals the fused PyTorch model's mean, per backend, plan, CUDA graphs on/off, fp32 (1e-4) and fp16
(atol 3e-2, rtol 1e-2). Skipped with the reason where there is no GPU; a machine with one runs them as
they are. The CPU-side logic of the same backends: tests/runtime/test_gpu_fakes*.py.
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from hne_edge.runtime import AnytimeRunner

from gpu_env import HAS_CUDA, HAS_ORT_CUDA, HAS_TORCH_CUDA, HAS_TRT  # noqa: E402

FP32 = dict(rtol=1e-4, atol=1e-4)
FP16 = dict(rtol=1e-2, atol=3e-2)  # fp16 end to end vs the fp32 (or float64) fused model, O(1) logits


# -- GPU: every prefix equals the fused PyTorch model, per backend ---------------------------------

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (neither torch nor cuda-python sees one)")
needs_torch_cuda = pytest.mark.skipif(not HAS_TORCH_CUDA, reason="no CUDA device for torch (torch.cuda.is_available() is False)")


@pytest.fixture(scope="module")
def gpu_reference(tiny_bundle):
    import torch

    x = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        ref = tiny_bundle.model.eval()(torch.from_numpy(x)).numpy()  # (B, N, classes)
    return x, ref


@pytest.fixture(scope="module")
def fp16_bundle(tiny_bundle, tmp_path_factory):
    """The tiny model exported in fp32 and fp16 (the ONNX backends need fp16 files for precision='fp16')."""
    from hne_edge.exporters import export_onnx

    return export_onnx(tiny_bundle.model, tmp_path_factory.mktemp("fp16") / "bundle", precisions=("fp32", "fp16"),
                       plan="both", batch=(1, 1, 8), torch_weights=True)  # fmt: skip


def _check_every_prefix(runner, x, ref, tol):
    for n in range(1, runner.num_leaves + 1):
        for _ in range(2):  # the second frame replays graphs / reuses buffers
            r = runner.run(x, max_leaves=n)
            np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **tol)
    # a batch-size change, and a paused session interleaved with frames of another batch size
    r1 = runner.run(x[:1])
    np.testing.assert_allclose(r1.logits, ref[:1].mean(1), **tol)
    s = runner.start(x)
    s.step()
    runner.run(x[:2])
    other = runner.run(x[::-1].copy())  # same batch size, other data: the paused session's buffers must survive
    np.testing.assert_allclose(other.logits, ref[::-1].mean(1), **tol)
    while s.step():
        pass
    np.testing.assert_allclose(s.result().logits, ref.mean(1), **tol)
    prof = runner.profile(batch_sizes=(1,), warmup=2, repeats=3, save=False)
    assert all(u["median_ms"] > 0 for u in prof.batches[1]["units"].values())


def _skip_unless_memory(memory: str) -> None:
    if memory == "cuda-python":
        pytest.importorskip("cuda.bindings", reason="cuda-python is not installed")
    elif not HAS_TORCH_CUDA:
        pytest.skip("torch has no CUDA device here (the stream can come from cuda-python instead)")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("memory", ["torch", "cuda-python"])
def test_gpu_device_operations_round_trip(memory):
    """The CudaDevice operations the ORT and TensorRT backends rely on, on a real GPU, for both implementations."""
    from hne_edge.runtime.backends.cuda import open_device

    _skip_unless_memory(memory)
    dev = open_device(0, memory)
    a = np.arange(4096, dtype=np.float32)
    src, keep_src = dev.malloc(a.nbytes)
    dst, keep_dst = dev.malloc(a.nbytes)
    dev.upload(src, a)
    dev.copy(dst, src, a.nbytes)
    out = np.empty_like(a)
    dev.download(dst, out)  # synchronizes the stream first
    np.testing.assert_array_equal(out, a)
    start, stop = dev.timer()
    start()
    dev.copy(dst, src, a.nbytes)
    assert 0 < stop() < 1.0  # seconds, from CUDA events
    dev.upload(src, a * 2)
    dev.synchronize()
    replay = dev.capture(lambda: dev.copy(dst, src, a.nbytes))  # captured, not run
    dev.upload(src, a * 3)
    replay()
    dev.download(dst, out)
    np.testing.assert_array_equal(out, a * 3)  # the replay copied what src holds now


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not HAS_ORT_CUDA, reason="onnxruntime-gpu (CUDAExecutionProvider) is not installed")
@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("memory", ["torch", "cuda-python"])
def test_gpu_onnxruntime_cuda_every_prefix(tiny_bundle, gpu_reference, plan, cuda_graph, memory):
    """Runs wherever onnxruntime-gpu finds a device: the stream from torch's CUDA, or from cuda-python."""
    _skip_unless_memory(memory)
    x, ref = gpu_reference
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="onnxruntime", device="cuda", plan=plan,
                       cuda_graph=cuda_graph, memory=memory, load_profile=False) as runner:  # fmt: skip
        info = runner.backend.describe()
        assert info["device"] == "cuda" and info["stream_from"] == memory and info["allow_tf32"] is False
        _check_every_prefix(runner, x, ref, FP32)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not HAS_ORT_CUDA, reason="onnxruntime-gpu (CUDAExecutionProvider) is not installed")
def test_gpu_onnxruntime_cuda_fp16(fp16_bundle, gpu_reference):
    x, ref = gpu_reference
    with AnytimeRunner(fp16_bundle, backend="onnxruntime", device="cuda", precision="fp16", load_profile=False) as runner:
        _check_every_prefix(runner, x, ref, FP16)


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_torch_cuda_every_prefix(tiny_bundle, gpu_reference, plan, cuda_graph, precision):
    """fp32 within 1e-4 needs TF32 off inside the backend's calls (an H200 gave 1.5e-4 with it on); the
    process's own TF32 / cudnn.benchmark settings are the same before and after."""
    import torch

    from hne_edge.runtime.backends.torch_cuda import Fp32Policy

    def flags():  # the flags the policy touches, through whichever API this torch has (2.11 on the H200)
        return [getattr(obj, name) for obj, name, *_ in Fp32Policy(torch).flags]

    x, ref = gpu_reference
    before = flags()
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", plan=plan, precision=precision,
                       cuda_graph=cuda_graph, load_profile=False) as runner:  # fmt: skip
        _check_every_prefix(runner, x, ref, FP16 if precision == "fp16" else FP32)
        if cuda_graph:
            assert all(r._graphs.captures >= 2 for r in runner._runners)  # batch 1 (warm-up), 3, 2...: one per shape
        assert flags() == before


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_cuda
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_tensorrt_every_prefix(fp16_bundle, gpu_reference, tmp_path, precision):
    from hne_edge.exporters.tensorrt import build_engines

    bundle = tmp_path / "b"
    shutil.copytree(fp16_bundle, bundle)
    build_engines(bundle, precisions=(precision,))
    x, ref = gpu_reference
    tol = FP16 if precision == "fp16" else FP32
    for plan in ("segments", "nodes"):
        for cuda_graph in (False, True):
            with AnytimeRunner(bundle, backend="tensorrt", device="cuda", plan=plan, precision=precision,
                               cuda_graph=cuda_graph, load_profile=False) as runner:  # fmt: skip
                _check_every_prefix(runner, x, ref, tol)


def test_gpu_tests_are_marked():
    """The GPU tests carry the markers pyproject.toml declares (so `-m gpu` selects them)."""
    mod = sys.modules[__name__]
    for name in ("test_gpu_device_operations_round_trip", "test_gpu_onnxruntime_cuda_every_prefix", "test_gpu_onnxruntime_cuda_fp16",
                 "test_gpu_torch_cuda_every_prefix", "test_gpu_tensorrt_every_prefix"):  # fmt: skip
        marks = {m.name for m in getattr(mod, name).pytestmark}
        assert "gpu" in marks and "skipif" in marks
    assert "tensorrt" in {m.name for m in test_gpu_tensorrt_every_prefix.pytestmark}

