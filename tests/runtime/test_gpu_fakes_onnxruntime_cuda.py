"""The ONNX Runtime CUDA runner on the CPU (the rest of the GPU backends' fakes: tests/runtime/test_gpu_fakes.py): its
IOBinding / fixed-buffer logic and CUDA-graph replays on real onnxruntime with CPU OrtValues.
"""

from __future__ import annotations

import numpy as np
import pytest

from hne_edge.errors import BackendUnavailable, InputError
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.backends import create_backend

from runtime_fakes import (  # noqa: E402
    FakeDevice, cuda_provider_on_cpu, every_stop_twice_and_an_interleaved_session, ort_values_on_cpu_backend,
)

FP32 = dict(rtol=1e-4, atol=1e-4)


# -- the ONNX Runtime CUDA runner's IOBinding plumbing on real onnxruntime, with CPU OrtValues -------


def test_onnxruntime_cuda_session_without_the_cuda_provider_says_which_libraries(tiny_bundle):
    # onnxruntime-gpu falls back to the CPU provider (with a log line) when libcudart / cuDNN are missing
    backend = ort_values_on_cpu_backend()
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
    backend = ort_values_on_cpu_backend(cuda_graph=cuda_graph)
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
    backend = ort_values_on_cpu_backend(cuda_graph=True)
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
    backend = ort_values_on_cpu_backend(cuda_graph=cuda_graph)
    with AnytimeRunner(steps_bundle, backend=backend, plan=plan, load_profile=False, warmup=0) as runner:
        every_stop_twice_and_an_interleaved_session(runner, x, ref)
        if cuda_graph:
            assert all(r._graphs.captures >= 1 for r in runner._runners if r.unit.kind != "tree" or plan == "fused")


# -- fp32 means fp32: TF32 off on the CUDA provider unless asked (issue 40) -----------------------------


@pytest.mark.parametrize("allow_tf32", [None, False, True])
def test_fp32_sessions_turn_tf32_off_on_the_cuda_provider_unless_asked(tiny_bundle, reference64, monkeypatch, allow_tf32):
    """ONNX Runtime's CUDA provider runs fp32 convolutions in TF32 unless told not to (its ``use_tf32`` option, default
    on): the H200 (2026-11-28) put every prefix of the real-GPU tests up to 1.7e-4 off, over their 1e-4. Every
    session the runner opens gets ``use_tf32`` "0" by default, "1" only with ``allow_tf32=True``; the numerics are
    the CPU provider's here (never run with TF32 off on a GPU: the acceptance run's ort-gpu stage owes it)."""
    seen = cuda_provider_on_cpu(monkeypatch, version="1.31.1")
    x, ref = reference64
    options = {} if allow_tf32 is None else {"allow_tf32": allow_tf32}
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="onnxruntime", device="cuda", plan="segments", load_profile=False,
                       warmup=0, **options) as runner:  # fmt: skip
        np.testing.assert_allclose(runner.run(x).leaf_logits, ref.transpose(1, 0, 2), **FP32)
        assert runner.backend.describe()["allow_tf32"] is bool(allow_tf32)
        files = len(runner._runners) + (runner._first_runner is not None)
    assert len(seen) == files  # every session of the runner, each with the CUDA provider's options
    expected = "1" if allow_tf32 else "0"
    for providers in seen:
        (name, opts), = providers
        assert name == "CUDAExecutionProvider" and opts["use_tf32"] == expected
        assert opts["cudnn_conv_algo_search"] == "EXHAUSTIVE" and opts["user_compute_stream"] == str(FakeDevice().stream_handle)


def test_an_onnxruntime_without_use_tf32_is_refused_for_fp32_and_says_why(tiny_bundle, monkeypatch):
    """``use_tf32`` came with ONNX Runtime 1.18 (its CUDA provider refuses options it does not know): an older one
    cannot compute fp32 in fp32, so the backend says so instead of a session error; ``allow_tf32=True`` runs on it
    (TF32 is its only mode) without the option."""
    seen = cuda_provider_on_cpu(monkeypatch, version="1.17.3")
    with pytest.raises(BackendUnavailable, match=r"onnxruntime 1\.17\.3 .*TF32.*expected onnxruntime-gpu >= 1\.18.*allow_tf32=True"):
        AnytimeRunner(tiny_bundle.bundle_dir, backend="onnxruntime", device="cuda", load_profile=False, warmup=0)
    assert seen == []  # refused before any session opened
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="onnxruntime", device="cuda", allow_tf32=True, load_profile=False,
                       warmup=0) as runner:  # fmt: skip
        assert runner.backend.describe()["allow_tf32"] is True
    assert seen and all("use_tf32" not in opts for (_, opts), in seen)


def test_tf32_has_one_switch_not_a_provider_option_beside_it(monkeypatch):
    cuda_provider_on_cpu(monkeypatch, version="1.31.1")
    with pytest.raises(InputError, match=r"provider_options: received 'use_tf32'.*expected allow_tf32=True or False"):
        create_backend("onnxruntime", device="cuda", provider_options={"use_tf32": "1"})
