"""The ONNX Runtime CUDA runner on the CPU (the rest of the GPU backends' fakes: tests/runtime/test_gpu_fakes.py): its
IOBinding / fixed-buffer logic and CUDA-graph replays on real onnxruntime with CPU OrtValues.
"""

from __future__ import annotations

import numpy as np
import pytest

from hne_edge.errors import BackendUnavailable
from hne_edge.runtime import AnytimeRunner

from runtime_fakes import FakeDevice, every_stop_twice_and_an_interleaved_session  # noqa: E402

FP32 = dict(rtol=1e-4, atol=1e-4)


# -- the ONNX Runtime CUDA runner's IOBinding plumbing on real onnxruntime, with CPU OrtValues -------


def _ort_values_on_cpu_backend(**options):
    """OnnxRuntimeCudaBackend with its OrtValues on "cpu" and the CPU provider: every onnxruntime call the
    CUDA runner makes (IOBinding, bound OrtValue outputs, staged image, run options with gpu_graph_id) is
    real; only the stream / events are the fake device (the CPU provider ignores gpu_graph_id)."""
    from hne_edge.runtime.backends.onnxruntime_cuda import OnnxRuntimeCudaBackend

    class OrtValuesOnCpu(OnnxRuntimeCudaBackend):
        ort_device = "cpu"
        execution_provider = "CPUExecutionProvider"

        def _open_cuda(self, memory, extra):
            return FakeDevice(), ["CPUExecutionProvider"]

    return OrtValuesOnCpu("cuda", threads=1, **options)


def test_onnxruntime_cuda_session_without_the_cuda_provider_says_which_libraries(tiny_bundle):
    # onnxruntime-gpu falls back to the CPU provider (with a log line) when libcudart / cuDNN are missing
    backend = _ort_values_on_cpu_backend()
    backend.execution_provider = "CUDAExecutionProvider"
    with pytest.raises(BackendUnavailable, match=r"providers \['CPUExecutionProvider'\]; expected CUDAExecutionProvider.*cuDNN 9"):
        AnytimeRunner(tiny_bundle.bundle_dir, backend=backend, load_profile=False, warmup=0)


@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_onnxruntime_cuda_runner_plumbing_on_cpu_ortvalues(tiny_bundle, plan, cuda_graph):
    import torch

    rng = np.random.default_rng(1)
    x, x2 = rng.standard_normal((2, 3, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        ref, ref2 = (tiny_bundle.model.eval()(torch.from_numpy(a)).numpy() for a in (x, x2))  # (B, N, classes)
    backend = _ort_values_on_cpu_backend(cuda_graph=cuda_graph)
    with AnytimeRunner(tiny_bundle.bundle_dir, backend=backend, plan=plan, load_profile=False, warmup=0) as runner:
        for n in range(1, runner.num_leaves + 1):
            for _ in range(2):  # the second frame reuses the runners' slot-0 buffers / "graphs"
                np.testing.assert_allclose(runner.run(x, max_leaves=n).logits, ref[:, :n].mean(1), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(runner.run(x[:1]).logits, ref[:1].mean(1), rtol=1e-4, atol=1e-5)
        # a paused session holds slot 0 of the root runner while two other frames of the same batch run
        s = runner.start(x)
        s.step()
        for _ in range(2):
            np.testing.assert_allclose(runner.run(x2).logits, ref2.mean(1), rtol=1e-4, atol=1e-5)
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
        runners = runner._runners
        if cuda_graph:
            # every runner's input is a fixed buffer (the staged image or a parent's slot 0): all "captured"
            assert all(r._graphs.captures >= 1 for r in runners)
            assert all(len(r._pool.slots[3]) == 2 for r in runners if r.unit.inputs[0].node is None)
            assert backend.is_fixed(backend.from_host(x))
        else:
            assert all(r._graphs is None for r in runners)
        assert backend.describe()["stream_from"] == "fake"


@pytest.mark.parametrize("plan", ["segments", "subtrees"])
def test_onnxruntime_cuda_graphs_keep_replaying_frame_after_frame(steps_bundle, reference64, plan):
    """onnxruntime's IOBinding keeps Python references to what it binds (1.32: ``_bound_inputs`` /
    ``_bound_outputs``). Those must not make a runner's slot-0 buffers (or the staged image) look held by a
    session: else every frame after the first runs eagerly into a second slot, and units first run after
    that never get a graph."""
    x, ref = reference64
    backend = _ort_values_on_cpu_backend(cuda_graph=True)
    with AnytimeRunner(steps_bundle, backend=backend, plan=plan, load_profile=False, warmup=0) as runner:
        runner.run(x)  # the first frame: every unit captured
        eager = []
        for r in runner._runners:
            for name in ("_run_eager", "_run_eager_into"):
                setattr(r, name, (lambda f, n: lambda *a: eager.append(n) or f(*a))(getattr(r, name), r.name))
        for _ in range(3):
            np.testing.assert_allclose(runner.run(x).leaf_logits, ref.transpose(1, 0, 2), **FP32)
        assert eager == []  # every call of every later frame replayed its graph
        assert all(len(r._pool.slots[3]) == 1 and r._graphs.captures == 1 for r in runner._runners)
        assert len(backend.io._staging.slots[((3, 3, 16, 16), "<f4")]) == 1


@pytest.mark.parametrize("plan", ["subtrees", "fused", "mixed"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_onnxruntime_cuda_runs_steps_of_several_leaves_on_cpu_ortvalues(steps_bundle, reference64, plan, cuda_graph):
    x, ref = reference64
    backend = _ort_values_on_cpu_backend(cuda_graph=cuda_graph)
    with AnytimeRunner(steps_bundle, backend=backend, plan=plan, load_profile=False, warmup=0) as runner:
        every_stop_twice_and_an_interleaved_session(runner, x, ref)
        if cuda_graph:
            assert all(r._graphs.captures >= 1 for r in runner._runners if r.unit.kind != "tree" or plan == "fused")
