"""GPU backends (ONNX Runtime CUDA, TensorRT, PyTorch CUDA) on the CPU: registry and lazy imports, error
messages without CUDA / TensorRT, engine compatibility from the manifest, the TensorRT 10/11 API selection,
buffer pools and CUDA-graph caches, the profile timing hook, the whole TensorRT runner driven by a fake
TensorRT + fake device that compute the fake bundle's numpy network (scratch sharing, address binding,
buffer reuse across frames and paused sessions, graph re-capture, checked numerically), and the ONNX
Runtime CUDA runner's IOBinding / fixed-buffer logic on real onnxruntime with CPU OrtValues.

Each backend's own runner on fakes is in its file: tests/runtime/test_gpu_fakes_tensorrt.py (engine compatibility,
the TensorRT 10/11 API, the runner on a fake TensorRT), test_gpu_fakes_onnxruntime_cuda.py (IOBinding on CPU
OrtValues) and test_gpu_fakes_torch_cuda.py (the torch CUDA runner on a fake device). The same backends on a real
GPU: tests/runtime/test_gpu_hardware.py.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hne_edge.errors import BackendUnavailable, InputError
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.backends import BACKENDS, Backend, Runner, create_backend
from hne_edge.runtime.backends.cuda import GraphCache, Slot, SlotPool, parse_device

from gpu_env import HAS_CUDA, HAS_ORT_CUDA, HAS_TORCH_CUDA, HAS_TRT  # noqa: E402


GPU_BACKENDS = {
    ("onnxruntime", "cuda"): ("onnxruntime_cuda", "OnnxRuntimeCudaBackend", "OnnxRuntimeCudaRunner"),
    ("torch", "cuda"): ("torch_cuda", "TorchCudaBackend", "TorchCudaRunner"),
    ("tensorrt", "cuda"): ("tensorrt", "TensorRTBackend", "TensorRTRunner"),
}


# -- interface contract and registry --------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(GPU_BACKENDS))
def test_registry_entries_are_backends_with_runners(key):
    module, backend_cls, runner_cls = GPU_BACKENDS[key]
    assert BACKENDS[key] == f"hne_edge.runtime.backends.{module}:{backend_cls}"
    mod = importlib.import_module(f"hne_edge.runtime.backends.{module}")
    cls = getattr(mod, backend_cls)
    assert issubclass(cls, Backend) and issubclass(getattr(mod, runner_cls), Runner)
    assert cls.devices == ("cuda",) and cls.format in ("onnx", "torch", "tensorrt")
    for method in ("create_runner", "from_host", "to_host", "synchronize", "timed_run", "describe", "close"):
        assert callable(getattr(cls, method))


def test_runtime_imports_without_torch_and_gpu_modules_are_lazy(tmp_path):
    """`import hne_edge.runtime` and importing every GPU backend module pull in no torch / TensorRT / cuda."""
    (tmp_path / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import sys
            class _Block:
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in ("torch", "tensorrt", "cuda"):
                        raise ImportError(name + " is blocked in this test")
                    return None
            sys.meta_path.insert(0, _Block())
            """
        )
    )
    code = textwrap.dedent(
        """
        import sys
        import hne_edge.runtime
        from hne_edge.runtime.backends import create_backend
        from hne_edge.errors import BackendUnavailable
        for m in ("cuda", "onnxruntime_cuda", "tensorrt", "torch_cuda"):
            __import__("hne_edge.runtime.backends." + m)
        for name in ("torch", "tensorrt"):
            try:
                create_backend(name, device="cuda")
            except BackendUnavailable as e:
                print(name, "->", e)
        bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "tensorrt", "cuda")]
        assert not bad, bad
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "torch -> backend 'torch' needs PyTorch" in proc.stdout
    from hne_edge.runtime.backends.cuda import no_gpu_here

    # without a driver, installing TensorRT cannot help: the machine is told it has no GPU (issue 42)
    assert ("tensorrt -> TensorRT runs on an NVIDIA GPU, and this machine has no NVIDIA GPU" if no_gpu_here() else
            "tensorrt -> TensorRT is not available: install it") in proc.stdout, proc.stdout  # fmt: skip
    assert proc.stdout.strip().endswith("ok")


def test_create_backend_picks_the_cuda_variant_by_device():
    with pytest.raises(BackendUnavailable, match="received device 'cpu'; expected one of \\['cuda'\\]"):
        create_backend("tensorrt")  # TensorRT has no CPU device: the message says what to pass
    with pytest.raises(BackendUnavailable, match="received backend 'nope'"):
        create_backend("nope", device="cuda")


def test_parse_device():
    assert parse_device("x", "cuda", ("cuda",)) == 0
    assert parse_device("x", "cuda:3", ("cuda",)) == 3
    with pytest.raises(BackendUnavailable, match="received device 'gpu'; expected one of \\['cuda'\\] or 'cuda:N'"):
        parse_device("x", "gpu", ("cuda",))


# -- error paths without CUDA / TensorRT ----------------------------------------------------------


@pytest.mark.skipif(HAS_ORT_CUDA, reason="onnxruntime-gpu is installed")
def test_onnxruntime_cuda_without_the_cuda_provider_names_what_is_missing(monkeypatch, tmp_path):
    import hne_edge.runtime.backends.cuda as cuda

    monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path),))  # a GPU machine with the CPU onnxruntime
    with pytest.raises(BackendUnavailable) as info:
        create_backend("onnxruntime", device="cuda")
    msg = str(info.value)
    assert "expected CUDAExecutionProvider" in msg and "onnxruntime-gpu" in msg and "fallback_to_cpu=True" in msg
    assert "has providers [" in msg


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_machine_without_a_gpu_is_told_to_run_on_the_cpu_not_to_install_gpu_packages(monkeypatch, tmp_path, backend):
    """Issue 20 item 7: a machine with no GPU was told to install onnxruntime-gpu."""
    import sys

    import hne_edge.runtime.backends.cuda as cuda

    monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path / "nvidia0"),))  # no driver device
    monkeypatch.setattr(cuda, "probe_cuda", cuda.CudaProbe)  # ... so neither torch nor cuda-python sees a device
    monkeypatch.setattr(sys, "platform", "linux")
    with pytest.raises(BackendUnavailable) as info:
        create_backend(backend, device="cuda")
    msg, cli = str(info.value), info.value.cli_message()
    assert "this machine has no NVIDIA GPU" in msg and "device='cpu'" in msg and "fallback_to_cpu=True" in msg
    assert "--device cpu" in cli and "=" not in cli.split("GPU", 1)[1]  # flags, not Python arguments
    assert "install" not in msg and "onnxruntime-gpu" not in msg


@pytest.mark.skipif(HAS_ORT_CUDA and HAS_CUDA, reason="CUDA is usable here")
def test_onnxruntime_cuda_falls_back_to_cpu_only_when_asked(tiny_bundle, caplog):
    ref_x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    import torch

    with torch.no_grad():
        ref = tiny_bundle.model.eval()(torch.from_numpy(ref_x)).numpy()
    with caplog.at_level(logging.WARNING, logger="hne_edge.runtime.gpu"):
        runner = AnytimeRunner(tiny_bundle.bundle_dir, device="cuda", fallback_to_cpu=True, load_profile=False)
    with runner:
        assert runner.device == "cpu" and runner.backend.fallback_reason
        assert "onnxruntime: cuda requested but unusable, falling back to the CPU" in caplog.text
        r = runner.run(ref_x, max_leaves=5)
        np.testing.assert_allclose(r.logits, ref[:, :5].mean(1), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(HAS_TORCH_CUDA, reason="torch sees a CUDA device")
def test_torch_cuda_without_a_device_names_what_is_missing(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    import hne_edge.runtime.backends.cuda as cuda

    monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path),))  # a driver, but torch sees no device
    with pytest.raises(BackendUnavailable, match=r"backend 'torch' on device 'cuda': torch .*expected a CUDA build"):
        create_backend("torch", device="cuda")


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed")
def test_tensorrt_missing_gives_the_install_hint(tiny_bundle, monkeypatch, tmp_path):
    import hne_edge.runtime.backends.cuda as cuda

    monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path),))  # a driver: TensorRT is what is missing
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not available: install it .*pip install 'hne_edge-0\.1\.0-py3-none-any\.whl\[tensorrt\]'"):
        AnytimeRunner(tiny_bundle.bundle_dir, backend="tensorrt", device="cuda")


# -- buffer pool and graph cache ------------------------------------------------------------------


class _H:  # a handle object
    pass


def test_slot_pool_reuses_free_slots_and_adds_one_while_a_session_holds_it():
    pool, made = SlotPool(max_slots=2), []

    def make():
        made.append(Slot((_H(), _H())))
        return made[-1]

    i, slot = pool.acquire(4, make)
    assert i == 0 and len(made) == 1
    assert pool.acquire(4, make) == (0, slot)  # nothing holds it: reused
    held = slot.handles[1]  # a paused session's cache keeps one output
    i2, slot2 = pool.acquire(4, make)
    assert i2 == 1 and slot2 is not slot
    cache = [slot2.handles[0]]
    with pytest.raises(RuntimeError, match="paused sessions hold this runner's buffers"):
        pool.acquire(4, make)
    del held, cache
    assert pool.acquire(4, make) == (0, slot)
    assert pool.acquire(8, make)[0] == 0 and len(made) == 3  # other key, own slots


def test_graph_cache_captures_once_per_shape_recaptures_on_change_and_evicts_lru():
    captured = []

    def capture(key):
        captured.append(key)
        return lambda: ("replay", key)

    cache = GraphCache(capture, max_graphs=2)
    assert cache.get((1, 3))() == ("replay", (1, 3))
    cache.get((1, 3))
    assert captured == [(1, 3)]
    cache.get((4, 3))  # shape change: a new capture
    cache.get((1, 3))
    cache.get((8, 3))  # evicts (4, 3), the least recently used
    assert captured == [(1, 3), (4, 3), (8, 3)] and set(cache.graphs) == {(1, 3), (8, 3)}
    cache.get((4, 3))  # comes back: re-captured
    assert captured[-1] == (4, 3) and cache.captures == 4
    with pytest.raises(InputError, match=r"max_graphs: received 0; expected an int >= 1"):
        GraphCache(capture, max_graphs=0)


# -- the profile hook: units timed by the backend's timer ----------------------------------------


def test_profile_times_units_with_the_backends_timer(tiny_bundle):
    from hne_edge.runtime.backends.onnxruntime import OnnxRuntimeBackend

    class Timed(OnnxRuntimeBackend):
        calls = 0

        def timed_run(self, run_impl, inputs):
            Timed.calls += 1
            return run_impl(inputs), 0.25  # "device seconds"

    with AnytimeRunner(tiny_bundle.bundle_dir, backend=Timed(threads=1), load_profile=False, warmup=0) as runner:
        prof = runner.profile(warmup=0, repeats=2, save=False)
    units = prof.batches[1]["units"]
    assert Timed.calls == 2 * len(units) and all(u["median_ms"] == 250.0 for u in units.values())
    assert all(leaf["median_ms"] < 250 for leaf in prof.batches[1]["leaves"])  # leaves stay host wall time


# -- benchmarks/bench_gpu.py runs (CPU smoke mode; its GPU figures need a GPU) ---------------------


def test_bench_gpu_passes_capture_sizes_to_the_torch_cuda_runner_only(monkeypatch):
    """``--capture-sizes 1,8`` (the acceptance run's mobilenet stage: graphs for the sizes it measures, half the
    captures when a runner opens) reaches torch on a GPU with graphs on, and nothing else."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_gpu

    assert bench_gpu.runner_options("torch", "cuda", True, (1, 8)) == {"cuda_graph": True, "capture_sizes": [1, 8]}
    assert bench_gpu.runner_options("torch", "cuda", True, None) == {"cuda_graph": True}
    assert bench_gpu.runner_options("torch", "cuda", False, (1, 8)) == {"cuda_graph": False}
    assert bench_gpu.runner_options("onnxruntime", "cuda", True, (1, 8)) == {"cuda_graph": True}
    assert bench_gpu.runner_options("torch", "cpu", False, (1, 8)) == {"threads": 1}


@pytest.mark.slow
def test_bench_gpu_runs_in_cpu_smoke_mode(tmp_path):
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    script = repo / "benchmarks" / "bench_gpu.py"
    out = tmp_path / "gpu.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}  # this checkout's
    proc = subprocess.run([sys.executable, str(script), "--device", "cpu", "--smoke", "--models", "hne_tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    plans = ("segments", "subtrees", "mixed", "fused")
    assert [(r["model"], r["plan"], r["batch"], r["device"]) for r in rows] == [
        ("hne_tiny", plan, b, "cpu") for plan in plans for b in (1, 16)]  # fmt: skip
    for r in rows:
        assert r["full_ms"] > 0 and r["fused_ms"] > 0 and r["sixteen_ms"] > 0 and r["mac_ratio"] > 1
        if r["plan"] == "fused":  # one step: no first leaf, no deadlines
            assert "first_ms" not in r and "miss_rate" not in r
            continue
        assert r["standalone_ms"] > 0 and 0 <= r["miss_rate"] <= 1
        # the plan-achievable oracle, and the even-split bound above it (a budget a run missed may beat either)
        assert 0 < r["leaves_vs_split_bound"] <= r["leaves_vs_oracle"]
    assert all("ratio" in r["batch_model"] for r in rows if r["batch"] == 1 and r["plan"] != "fused")
    # where each row's seconds went (a stage cut off by its cap says what to cut), also in the log as it goes
    assert all(set(r["seconds"]) == {"bundle", "open", "warmup", "profile", "row"} and r["seconds"]["row"] > 0 for r in rows)
    assert proc.stdout.count("bench_gpu: hne_tiny torch/") == 4 and "bench_gpu: hne_tiny: bundle ready in" in proc.stdout
    text = out.read_text()
    assert "smoke run: not figures" in text and "leaves vs plan-achievable oracle" in text
    assert [text.count(f"| hne_tiny | torch | {plan} | off |") for plan in plans] == [2, 2, 2, 2]
    if not HAS_CUDA:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "bench_gpu: skipped - no CUDA device" in proc.stdout
