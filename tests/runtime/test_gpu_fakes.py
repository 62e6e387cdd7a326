"""GPU backends (ONNX Runtime CUDA, TensorRT, PyTorch CUDA) on the CPU: registry and lazy imports, error
messages without CUDA / TensorRT, engine compatibility from the manifest, the TensorRT 10/11 API selection,
buffer pools and CUDA-graph caches, the profile timing hook, the whole TensorRT runner driven by a fake
TensorRT + fake device that compute the fake bundle's numpy network (scratch sharing, address binding,
buffer reuse across frames and paused sessions, graph re-capture, checked numerically), and the ONNX
Runtime CUDA runner's IOBinding / fixed-buffer logic on real onnxruntime with CPU OrtValues.

The same backends on a real GPU: tests/runtime/test_gpu_hardware.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from hne_edge.bundle import read_manifest, write_manifest
from hne_edge.errors import BackendUnavailable, BundleError
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.backends import BACKENDS, Backend, Runner, create_backend
from hne_edge.runtime.backends.cuda import GraphCache, Slot, SlotPool, parse_device

from gpu_env import HAS_CUDA, HAS_ORT_CUDA, HAS_TORCH_CUDA, HAS_TRT  # noqa: E402
from runtime_fakes import FakeDevice, make_fake_bundle, ort_values_on_cpu_backend, reference_leaf_logits, unit_forward  # noqa: E402

FP32 = dict(rtol=1e-4, atol=1e-4)
FP16 = dict(rtol=1e-2, atol=3e-2)  # fp16 end to end vs the fp32 (or float64) fused model, O(1) logits

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
    assert "tensorrt -> TensorRT is not available: install it" in proc.stdout
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


@pytest.mark.skipif(HAS_ORT_CUDA and HAS_CUDA, reason="CUDA is usable here")
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_machine_without_a_gpu_is_told_to_run_on_the_cpu_not_to_install_gpu_packages(monkeypatch, tmp_path, backend):
    """Issue 20 item 7: a machine with no GPU was told to install onnxruntime-gpu."""
    import sys

    import hne_edge.runtime.backends.cuda as cuda

    monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path / "nvidia0"),))  # no driver device
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
def test_tensorrt_missing_gives_the_install_hint(tiny_bundle):
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not available: install it .*pip install 'hne_edge-0\.1\.0-py3-none-any\.whl\[tensorrt\]'"):
        AnytimeRunner(tiny_bundle.bundle_dir, backend="tensorrt", device="cuda")


# -- engine compatibility from the manifest -------------------------------------------------------


def _engine_files(build: dict | None, n: int = 3):
    from hne_edge.bundle import ModelFile

    return [
        ModelFile(f"tensorrt/trt10.3_sm87/fp32/segments/leaf{i:02d}.plan", "tensorrt", "segments", "fp32", "0" * 64, 1,
                  ("b0.0",), i, 1, (), (), build=build)  # fmt: skip
        for i in range(n)
    ]


def test_engine_files_built_here_pass():
    from hne_edge.runtime.backends.tensorrt import check_engine_files

    check_engine_files(_engine_files({"tensorrt_version": "10.3.0", "compute_capability": "8.7"}), "10.3.0", "8.7")


def test_engine_files_for_another_tensorrt_version_are_refused_naming_both():
    from hne_edge.runtime.backends.tensorrt import check_engine_files

    files = _engine_files({"tensorrt_version": "10.3.0", "compute_capability": "8.7"})
    with pytest.raises(BundleError) as info:
        check_engine_files(files, "10.8.0", "8.7")
    msg = str(info.value)
    assert "built with TensorRT 10.3.0" in msg and "this device has TensorRT 10.8.0" in msg
    assert "leaf00.plan and 2 more" in msg and "rebuild the engines on this device" in msg


def test_engine_files_for_another_gpu_are_refused_naming_both():
    from hne_edge.runtime.backends.tensorrt import check_engine_files

    files = _engine_files({"tensorrt_version": "10.3.0", "compute_capability": "8.7"})
    with pytest.raises(BundleError, match=r"compute capability 8.7 \(sm_87\); this GPU is 9.0 \(sm_90\)"):
        check_engine_files(files, "10.3.0", "9.0")
    with pytest.raises(BundleError, match="build info is incomplete"):
        check_engine_files(_engine_files(None), "10.3.0", "8.7")


# -- TensorRT 10 / 11 API selection ---------------------------------------------------------------


def test_context_creation_follows_the_available_api():
    from hne_edge.runtime.backends.tensorrt import create_context_without_memory, engine_memory_size, set_context_memory

    user = "USER_MANAGED"
    trt_new = types.SimpleNamespace(ExecutionContextAllocationStrategy=types.SimpleNamespace(USER_MANAGED=user))
    calls = []

    class Config:
        def set_execution_context_allocation_strategy(self, s):
            calls.append(("strategy", s))

    class Engine11:  # runtime config (TensorRT 10.11+ / 11)
        device_memory_size_v2 = 123

        def create_runtime_config(self):
            return Config()

        def create_execution_context(self, arg):
            calls.append(("context", type(arg).__name__))
            return "ctx11"

    class Engine10:  # strategy argument (10.0+)
        device_memory_size = 77
        device_memory_size_v2 = None

        def create_execution_context(self, arg):
            calls.append(("context", arg))
            return "ctx10"

    class EngineOld:
        device_memory_size = 5

        def create_execution_context_without_device_memory(self):
            return "ctx-old"

    assert create_context_without_memory(Engine11(), trt_new) == "ctx11"
    assert calls == [("strategy", user), ("context", "Config")]
    assert create_context_without_memory(Engine10(), trt_new) == "ctx10" and calls[-1] == ("context", user)
    assert create_context_without_memory(EngineOld(), types.SimpleNamespace()) == "ctx-old"
    assert engine_memory_size(Engine11()) == 123 and engine_memory_size(Engine10()) == 77

    class CtxV2:
        def set_device_memory(self, ptr, size):
            self.got = (ptr, size)

    class CtxV1:
        device_memory = None

    a, b = CtxV2(), CtxV1()
    set_context_memory(a, 4096, 100)
    set_context_memory(b, 4096, 100)
    assert a.got == (4096, 100) and b.device_memory == 4096


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
    with pytest.raises(ValueError, match="max_graphs"):
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


# -- the TensorRT runner on a fake TensorRT and a fake device -------------------------------------


def _fake_trt(manifest, tree, classes, dev, log):
    by_path = {f.path: f for f in manifest.files}

    class Context:
        def __init__(self, f):
            self.f, self.addr, self.shape, self.memory = f, {}, None, None

        def set_device_memory(self, ptr, size):
            self.memory = (ptr, size)
            log.append(("memory", self.f.path, ptr, size))

        def set_input_shape(self, name, shape):
            self.shape = tuple(shape)
            log.append(("shape", self.f.path, self.shape))
            return True

        def get_tensor_shape(self, name):
            out = next(t for t in self.f.outputs if t.name == name)
            return (self.shape[0], *out.shape[1:])  # (batch, D), (batch, classes) or (batch, leaves, classes)

        def set_tensor_address(self, name, ptr):
            self.addr[name] = ptr
            log.append(("address", self.f.path, name))

        def execute_async_v3(self, stream):
            assert stream == dev.stream_handle and self.memory is not None
            log.append(("execute", self.f.path))
            x = dev.view(self.addr[self.f.inputs[0].name], self.shape, np.float32)
            for t, out in zip(self.f.outputs, unit_forward(tree, self.f, x, classes)):  # a chain or a whole subtree
                dev.view(self.addr[t.name], out.shape, np.float32)[...] = out
            return True

    class Engine:
        def __init__(self, f):
            self.f = f
            self.names = [t.name for t in f.inputs] + [t.name for t in f.outputs]
            self.num_io_tensors = len(self.names)
            self.device_memory_size_v2 = 1000 * len(f.nodes)

        def get_tensor_name(self, i):
            return self.names[i]

        def get_tensor_mode(self, name):
            return "in" if name == self.f.inputs[0].name else "out"

        def get_tensor_dtype(self, name):
            return np.float32

        def create_execution_context(self, strategy):
            assert strategy == "user"
            return Context(self.f)

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data):
            return Engine(by_path[data.decode().removeprefix("fake ")])

    return types.SimpleNamespace(
        __version__="10.3.0",
        TensorIOMode=types.SimpleNamespace(INPUT="in"),
        ExecutionContextAllocationStrategy=types.SimpleNamespace(USER_MANAGED="user"),
        Logger=types.SimpleNamespace(WARNING=1, VERBOSE=0, __call__=None),
        Runtime=Runtime,
        nptype=lambda dt: dt,
    )


@pytest.fixture
def fake_trt_bundle(tmp_path, monkeypatch):
    """A fake bundle whose files are "engines" built with TensorRT 10.3.0 for sm_87, plus the fakes."""
    import hne_edge.runtime.backends.tensorrt as trt_backend

    root = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2, 2), classes=4,
                            plans=("segments", "nodes", "first", "subtrees", "fused"))  # fmt: skip
    manifest = read_manifest(root)
    build = {"tensorrt_version": "10.3.0", "compute_capability": "8.7", "gpu": "Fake", "flags": ["STRONGLY_TYPED"]}
    manifest = dataclasses.replace(
        manifest, files=tuple(dataclasses.replace(f, format="tensorrt", build=build) for f in manifest.files)
    )
    write_manifest(root, manifest)
    dev, log = FakeDevice(), []
    fake = _fake_trt(manifest, manifest.tree, 4, dev, log)
    fake.Logger = lambda level: None
    fake.Logger.WARNING, fake.Logger.VERBOSE = 1, 0
    monkeypatch.setattr(trt_backend, "load_tensorrt", lambda: fake)
    monkeypatch.setattr(trt_backend, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(trt_backend, "device_info", lambda i: ("FakeGPU", "8.7"))
    monkeypatch.setattr(trt_backend, "open_device", lambda i, memory: dev)
    return types.SimpleNamespace(root=root, manifest=manifest, dev=dev, log=log, tree=manifest.tree)


@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_tensorrt_runner_logic_on_fakes(fake_trt_bundle, plan, cuda_graph):
    fx = fake_trt_bundle
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    x2 = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    ref1, ref2 = (reference_leaf_logits(fx.tree, x, 4) for x in (x1, x2))
    with AnytimeRunner(fx.root, backend="tensorrt", device="cuda", plan=plan, cuda_graph=cuda_graph,
                       load_profile=False, warmup=0) as runner:  # fmt: skip
        n_units = len(runner._runners)
        assert runner.first_leaf_file == "onnx/fp32/first/leaf00.onnx"  # the fake keeps the ONNX paths
        for n in range(1, runner.num_leaves + 1):
            r = runner.run(x1, max_leaves=n)
            np.testing.assert_allclose(r.leaf_logits, ref1[:n], rtol=1e-5, atol=1e-6)
            if n == 1:  # the first-leaf engine alone (twice with graphs: one enqueue before the capture)
                assert {e[1] for e in fx.log if e[0] == "execute"} == {"onnx/fp32/first/leaf00.onnx"}
        # one scratch allocation, sized to the largest engine (the first-leaf one included), shared by every context
        mem = {(p, s) for k, _, p, s in (e for e in fx.log if e[0] == "memory")}
        engines = [*runner.backend.load(fx.manifest, fx.root, plan, "fp32").units, runner._first_runner.unit]
        assert len(mem) == 1 and mem.pop()[1] == max(1000 * len(u.nodes) for u in engines)
        shapes_before = sum(e[0] == "shape" for e in fx.log)
        assert shapes_before == n_units + 1  # set_input_shape once per context (+ the first-leaf one) while the batch stays
        addresses_before = sum(e[0] == "address" for e in fx.log)
        runner.run(x1)
        assert sum(e[0] == "address" for e in fx.log) == addresses_before  # buffers reused across frames
        # a new batch size: new shapes, and the outputs are still right
        np.testing.assert_allclose(runner.run(x2).leaf_logits, ref2, rtol=1e-5, atol=1e-6)
        assert sum(e[0] == "shape" for e in fx.log) == 2 * n_units + 1  # full frames: not the first-leaf engine
        # a paused session keeps its cached activations while other frames, of another and of the same
        # batch size (same buffers: a second slot), run on the same runners
        s = runner.start(x1)
        s.step()
        x1b = rng.standard_normal(x1.shape).astype(np.float32)
        for _ in range(2):
            np.testing.assert_allclose(runner.run(x2).leaf_logits, ref2, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(runner.run(x1b).leaf_logits, reference_leaf_logits(fx.tree, x1b, 4), rtol=1e-5, atol=1e-6)
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref1, rtol=1e-5, atol=1e-6)
        if cuda_graph:
            # captured per runner and input shape; the shape change re-captured; later frames replay
            assert n_units <= fx.dev.captures <= 2 * n_units + n_units and fx.dev.replays > fx.dev.captures
        else:
            assert fx.dev.captures == 0
        prof = runner.profile(batch_sizes=(2,), warmup=0, repeats=1, save=False)
        assert all(u["median_ms"] == 1.0 for u in prof.batches[2]["units"].values())  # the (fake) CUDA events


@pytest.mark.parametrize("plan", ["subtrees", "fused", "mixed"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_tensorrt_runs_steps_of_several_leaves_on_fakes(fake_trt_bundle, plan, cuda_graph):
    """Plans subtrees / fused / mixed on the TensorRT runner: (batch, leaves, classes) logits engines bound and
    downloaded like the others, every stop right, buffers reused, a paused session kept apart, graphs replayed."""
    fx = fake_trt_bundle
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal((b, 3, 4, 4)).astype(np.float32) for b in (2, 3))
    ref1, ref2 = (reference_leaf_logits(fx.tree, x, 4) for x in (x1, x2))
    with AnytimeRunner(fx.root, backend="tensorrt", device="cuda", plan=plan, cuda_graph=cuda_graph,
                       load_profile=False, warmup=0) as runner:  # fmt: skip
        for _ in range(2):
            for n in runner.stops:
                np.testing.assert_allclose(runner.run(x1, max_leaves=n).leaf_logits, ref1[:n], rtol=1e-5, atol=1e-6)
        executed = {e[1] for e in fx.log if e[0] == "execute"}
        if plan != "segments":
            assert any("subtrees" in p or "fused" in p for p in executed)
        if plan != "mixed":  # (a mixed frame may take steps the earlier ones did not: real clock, its choice)
            addresses = sum(e[0] == "address" for e in fx.log)
            runner.run(x1)
            assert sum(e[0] == "address" for e in fx.log) == addresses  # buffers reused across frames
        s = runner.start(x1)
        s.step()
        for _ in range(2):
            np.testing.assert_allclose(runner.run(x2).leaf_logits, ref2, rtol=1e-5, atol=1e-6)
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref1, rtol=1e-5, atol=1e-6)
        assert (fx.dev.replays > 0) == cuda_graph
        prof = runner.profile(batch_sizes=(2,), warmup=0, repeats=1, save=False)
        assert len(prof.batches[2]["leaves"]) == len(runner.steps)


def test_tensorrt_backend_refuses_engines_from_another_version(fake_trt_bundle, monkeypatch):
    import hne_edge.runtime.backends.tensorrt as trt_backend

    fake = trt_backend.load_tensorrt()
    fake.__version__ = "10.8.0"
    with pytest.raises(BundleError, match=r"built with TensorRT 10.3.0; this device has TensorRT 10.8.0"):
        AnytimeRunner(fake_trt_bundle.root, backend="tensorrt", device="cuda", load_profile=False)
    fake.__version__ = "10.3.0"
    with pytest.raises(BundleError, match="no tensorrt/fp16/segments model files.*rebuild the engines"):
        AnytimeRunner(fake_trt_bundle.root, backend="tensorrt", device="cuda", precision="fp16", load_profile=False)


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


def _every_stop_twice_and_an_interleaved_session(runner, x, ref) -> None:
    """Each stop twice (the second frame reuses the runners' slot-0 buffers / "graphs"), then a session
    stepped around another frame: its cached activations must survive it."""
    for n in runner.stops:
        for _ in range(2):
            np.testing.assert_allclose(runner.run(x, max_leaves=n).logits, ref[:, :n].mean(1), **FP32)
    s = runner.start(x)
    s.step()
    np.testing.assert_allclose(runner.run(x[::-1].copy()).logits, ref[::-1].mean(1), **FP32)
    while s.step():
        pass
    np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **FP32)


@pytest.mark.parametrize("plan", ["subtrees", "fused", "mixed"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_onnxruntime_cuda_runs_steps_of_several_leaves_on_cpu_ortvalues(steps_bundle, reference64, plan, cuda_graph):
    x, ref = reference64
    backend = ort_values_on_cpu_backend(cuda_graph=cuda_graph)
    with AnytimeRunner(steps_bundle, backend=backend, plan=plan, load_profile=False, warmup=0) as runner:
        _every_stop_twice_and_an_interleaved_session(runner, x, ref)
        if cuda_graph:
            assert all(r._graphs.captures >= 1 for r in runner._runners if r.unit.kind != "tree" or plan == "fused")


# -- the torch CUDA backend's logic on a fake device (CPU tensors) ---------------------------------


def _count_calls(runner, dev):
    """{phase: module calls} for every unit module of ``runner`` (eager, capture, replay)."""
    counts = {"eager": 0, "capture": 0, "replay": 0}
    for r in runner._runners:
        r.module.register_forward_pre_hook(lambda m, a: counts.__setitem__(dev.phase, counts[dev.phase] + 1))
    return counts


@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_torch_cuda_runner_logic_on_a_fake_device(tiny_bundle, reference64, fake_torch_cuda, plan, cuda_graph, precision):
    """The real TorchCudaBackend / Runner on CPU tensors: fp16 from fp32 weights, channels-last, graphs by
    default (captured at construction, replayed from the first frame), every prefix vs the float64 model."""
    import torch

    x, ref = reference64
    tol = FP16 if precision == "fp16" else FP32
    options = {} if cuda_graph else {"cuda_graph": False}  # graphs are the default
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", plan=plan, precision=precision,
                       load_profile=False, **options) as runner:  # fmt: skip
        (dev,) = fake_torch_cuda
        n_units = len(runner._runners)
        info = runner.backend.describe()
        assert info["cuda_graph"] is cuda_graph and info["allow_tf32"] is False and info["gpu"].startswith("FakeGPU")
        want = torch.float16 if precision == "fp16" else torch.float32
        for r in runner._runners:
            assert {p.dtype for p in r.module.parameters()} == {want}
            assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in r.module.modules())
            convs = [m for m in r.module.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
            assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
        # the construction warm-up (batch 1, the bundle's optimal size) ran each unit once, eagerly, captured it and
        # launched the new graph once (a graph's first launch uploads it: not in a frame)
        assert dev.captures == dev.replays == (n_units if cuda_graph else 0)
        counts = _count_calls(runner, dev)
        r1 = runner.run(x[:1])  # the first real frame: replays only
        np.testing.assert_allclose(r1.logits, ref[:1].mean(1), **tol)
        assert counts == ({"eager": 0, "capture": 0, "replay": n_units} if cuda_graph else {"eager": n_units, "capture": 0, "replay": 0})
        # a new batch size: its first frame computes each unit once (eagerly), capturing after; then replays
        for n in range(1, runner.num_leaves + 1):
            for k in range(2):
                before = dict(counts)
                r = runner.run(x, max_leaves=n)
                np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **tol)
                assert r.logits.dtype == np.float32
                if n == runner.num_leaves and k == 1 and cuda_graph:
                    assert counts["eager"] == before["eager"] and counts["replay"] > before["replay"]
        assert counts["eager"] == (n_units if cuda_graph else counts["eager"])  # each unit's new shape: once eagerly
        # a paused session holds graph outputs while frames of the same batch size run (they go eager), then resumes
        s = runner.start(x)
        s.step()
        other = runner.run(x[::-1].copy())
        np.testing.assert_allclose(other.logits, ref[::-1].mean(1), **tol)
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **tol)
        if cuda_graph:
            assert dev.captures == 2 * n_units  # batch 1 (construction) and batch 3
        prof = runner.profile(batch_sizes=(3,), warmup=0, repeats=1, save=False)
        assert all(u["median_ms"] == 1.0 for u in prof.batches[3]["units"].values())  # the fake's CUDA events


@pytest.mark.parametrize("plan", ["subtrees", "fused", "mixed"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_torch_cuda_graph_per_unit_and_batch_size_for_steps_of_several_leaves(steps_bundle, reference64, fake_torch_cuda,
                                                                             plan, cuda_graph):  # fmt: skip
    """Plans subtrees / fused / mixed on the torch CUDA backend (fake device): the construction warm-up runs every
    route, so every unit (the mixed runner's subtrees and tree too) is captured once per batch size and real
    frames replay; every stop against the float64 model."""
    x, ref = reference64
    options = {} if cuda_graph else {"cuda_graph": False}
    with AnytimeRunner(steps_bundle, backend="torch", device="cuda", plan=plan, load_profile=False, **options) as runner:
        (dev,) = fake_torch_cuda
        n_units = len(runner._runners)
        assert dev.captures == (n_units if cuda_graph else 0)  # batch 1 at construction, every route
        counts = _count_calls(runner, dev)
        for n in runner.stops:
            np.testing.assert_allclose(runner.run(x[:1], max_leaves=n).logits, ref[:1, :n].mean(1), **FP32)
        if cuda_graph:
            assert counts["eager"] == 0 and counts["replay"] > 0  # batch 1: replays only
        _every_stop_twice_and_an_interleaved_session(runner, x, ref)
        if cuda_graph:
            used = {r.name for r in runner._runners}  # every unit ran at batch 3 too (the mixed one: by its choice)
            assert n_units < dev.captures <= 2 * len(used)


def _tf32_flags():
    import torch

    b = torch.backends
    return (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.benchmark)  # matmul: never touched


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_torch_cuda_tf32_policy_is_scoped_to_the_backends_calls(tiny_bundle, fake_torch_cuda, allow_tf32):
    """Inside every unit call (eager and capture): TF32 off for convolutions unless allow_tf32, cudnn.benchmark
    on, matmul as the user set it; outside: exactly the user's process-wide settings, whatever they were."""
    import torch

    saved = _tf32_flags()
    try:
        torch.backends.cudnn.conv.fp32_precision = "tf32"  # the user's choices, to be left alone
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.benchmark = False
        user = _tf32_flags()
        seen = set()
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", allow_tf32=allow_tf32,
                           load_profile=False, warmup=0) as runner:  # fmt: skip
            (dev,) = fake_torch_cuda

            def record(module, args):  # a replay runs captured kernels: torch's flags play no part in it
                if dev.phase != "replay":
                    seen.add((dev.phase, *_tf32_flags()))

            for r in runner._runners:
                r.module.register_forward_pre_hook(record)
            x = np.zeros((2, 3, 16, 16), np.float32)
            runner.run(x)  # eager + capture
            assert _tf32_flags() == user
            runner.run(x)  # replays (no flags needed: the kernels were chosen at capture)
            assert _tf32_flags() == user
        mode = "tf32" if allow_tf32 else "ieee"
        assert seen == {("eager", mode, "tf32", True), ("capture", mode, "tf32", True)}
        torch.backends.cudnn.conv.fp32_precision = "ieee"  # the user changes their mind: still theirs afterwards
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", cudnn_benchmark=None,
                           cuda_graph=False, load_profile=False, warmup=0) as runner:  # fmt: skip
            runner.run(x)
            assert _tf32_flags() == ("ieee", "tf32", False)
    finally:
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.benchmark = saved


def test_fp32_policy_on_a_torch_without_the_fp32_precision_api():
    """torch < 2.9 has only the allow_tf32 flags: the policy sets and restores those (nested entries too)."""
    from hne_edge.runtime.backends.torch_cuda import Fp32Policy

    cudnn = types.SimpleNamespace(allow_tf32=True, benchmark=False)
    fake = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=cudnn))
    policy = Fp32Policy(fake, allow_tf32=False, cudnn_benchmark=True)
    with policy:
        assert (cudnn.allow_tf32, cudnn.benchmark) == (False, True)
        with policy:
            pass
        assert (cudnn.allow_tf32, cudnn.benchmark) == (False, True)
    assert (cudnn.allow_tf32, cudnn.benchmark) == (True, False)
    cudnn.allow_tf32 = False
    with Fp32Policy(fake, allow_tf32=True, cudnn_benchmark=None):
        assert (cudnn.allow_tf32, cudnn.benchmark) == (True, False)
    assert (cudnn.allow_tf32, cudnn.benchmark) == (False, False)


def test_torch_cuda_refuses_a_graph_warmup_below_one(fake_torch_cuda):
    with pytest.raises(ValueError, match="graph_warmup: received 0; expected >= 1"):
        create_backend("torch", device="cuda", graph_warmup=0)


# -- benchmarks/bench_gpu.py runs (CPU smoke mode; its GPU figures need a GPU) ---------------------


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
    text = out.read_text()
    assert "smoke run: not figures" in text and "leaves vs plan-achievable oracle" in text
    assert [text.count(f"| hne_tiny | torch | {plan} | off |") for plan in plans] == [2, 2, 2, 2]
    if not HAS_CUDA:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "bench_gpu: skipped - no CUDA device" in proc.stdout
