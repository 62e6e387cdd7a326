"""The TensorRT backend on the CPU (the rest of the GPU backends' fakes: tests/runtime/test_gpu_fakes.py): engine
compatibility from the manifest, the TensorRT 10/11 API selection, and the whole TensorRT runner driven by a fake
TensorRT + fake device that compute the fake bundle's numpy network (scratch sharing, address binding, buffer reuse
across frames and paused sessions, graph re-capture, checked numerically).
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from hne_edge.bundle import read_manifest, write_manifest
from hne_edge.errors import BundleError
from hne_edge.runtime import AnytimeRunner

from runtime_fakes import FakeDevice, make_fake_bundle, reference_leaf_logits, unit_forward  # noqa: E402


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

        def set_tensor_address(self, name, ptr):  # the bindings return a bool: False for a name the engine lacks
            self.addr[name] = ptr
            log.append(("address", self.f.path, name))
            return name in {*(t.name for t in self.f.inputs), *(t.name for t in self.f.outputs)}

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
    monkeypatch.setattr(trt_backend, "load_tensorrt", lambda exporting=False: fake)
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


def test_tensorrt_graphs_are_all_captured_when_the_runner_opens_and_none_while_serving(fake_trt_bundle):
    """docs/gpu.md: graphs are all captured when the runner opens, and max_graphs bounds only those beyond. TensorRT
    once warmed the optimal batch size only and pinned nothing: serving more row counts than max_graphs (4) evicted
    and re-captured graphs in every frame (40-48 captures a round of 6 row counts). A frame beside a paused session
    runs eagerly (another slot's buffers) and captures nothing either."""
    fx = fake_trt_bundle
    rng = np.random.default_rng(0)
    with AnytimeRunner(fx.root, backend="tensorrt", device="cuda", plan="segments", cuda_graph=True,
                       load_profile=False) as runner:  # fmt: skip
        lo, _, hi = runner.input_spec.batch
        assert runner.warmup_report["batch_sizes"] == list(range(lo, hi + 1))
        captured = fx.dev.captures
        for _ in range(2):
            for rows in range(1, 7):
                x = rng.standard_normal((rows, 3, 4, 4)).astype(np.float32)
                np.testing.assert_allclose(runner.run(x).leaf_logits, reference_leaf_logits(fx.tree, x, 4),
                                           rtol=1e-5, atol=1e-6)  # fmt: skip
                s = runner.start(x)
                s.step()
                x2 = rng.standard_normal((rows, 3, 4, 4)).astype(np.float32)
                np.testing.assert_allclose(runner.run(x2).leaf_logits, reference_leaf_logits(fx.tree, x2, 4),
                                           rtol=1e-5, atol=1e-6)  # fmt: skip
                while s.step():
                    pass
                np.testing.assert_allclose(s.result().leaf_logits, reference_leaf_logits(fx.tree, x, 4),
                                           rtol=1e-5, atol=1e-6)  # fmt: skip
        assert fx.dev.captures == captured and fx.dev.replays > 0


def test_tensorrt_backend_refuses_engines_from_another_version(fake_trt_bundle, monkeypatch):
    import hne_edge.runtime.backends.tensorrt as trt_backend

    fake = trt_backend.load_tensorrt()
    fake.__version__ = "10.8.0"
    with pytest.raises(BundleError, match=r"built with TensorRT 10.3.0; this device has TensorRT 10.8.0"):
        AnytimeRunner(fake_trt_bundle.root, backend="tensorrt", device="cuda", load_profile=False)
    fake.__version__ = "10.3.0"
    with pytest.raises(BundleError, match="no tensorrt/fp16/segments model files.*rebuild the engines"):
        AnytimeRunner(fake_trt_bundle.root, backend="tensorrt", device="cuda", precision="fp16", load_profile=False)


@pytest.mark.parametrize("options, message", [
    (dict(cuda_graph="false"), r"cuda_graph: received 'false'; expected True or False"),  # bool("false") is True
    (dict(max_graphs=0), r"max_graphs: received 0; expected an int >= 1"),
])  # fmt: skip
def test_tensorrt_backend_refuses_bad_options_as_input_errors_naming_them(fake_trt_bundle, options, message):
    from hne_edge.errors import InputError

    with pytest.raises(InputError, match=message):
        AnytimeRunner(fake_trt_bundle.root, backend="tensorrt", device="cuda", load_profile=False, **options)


def test_version_compatible_engines_are_loaded_with_their_embedded_runtime(tiny_bundle, reference64, tmp_path,
                                                                             monkeypatch):  # fmt: skip
    """`export --format tensorrt --version-compatible` embeds TensorRT's lean runtime (host code) in each engine,
    which a Runtime refuses to deserialize unless told (engine_host_code_allowed, False by default: TensorRT's
    docs, Polygraphy's and trtexec's loaders). Built by the real exporter, run by the real backend on the fakes."""
    import shutil

    from hne_edge.exporters.tensorrt import build_engines
    from runtime_fakes import run_gpu_backends_on_fakes

    run_gpu_backends_on_fakes(monkeypatch)
    x, ref = reference64
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    build_engines(bundle, plans=("segments",), precisions=("fp32",), version_compatible=True)
    with AnytimeRunner(bundle, backend="tensorrt", device="cuda", plan="segments", load_profile=False) as runner:
        np.testing.assert_allclose(runner.run(x[:2]).logits, ref[:2].mean(1), rtol=1e-4, atol=1e-4)


def test_an_address_tensorrt_refuses_is_an_error_naming_the_tensor(fake_trt_bundle):
    """set_tensor_address answers False for a name the engine lacks or an address it cannot take; running on
    would read or write memory nobody bound."""
    from hne_edge.errors import DeviceError

    root = fake_trt_bundle.root
    with AnytimeRunner(root, backend="tensorrt", device="cuda", load_profile=False, warmup=0) as runner:
        for r in runner._runners:
            r.context.set_tensor_address = lambda name, ptr: name != "image"
        with pytest.raises(DeviceError, match=r"TensorRT refused address 0x[0-9a-f]+ for tensor 'image'"):
            runner.run(np.zeros((1, 3, 4, 4), np.float32))


def test_a_cuda_python_device_is_made_current_in_the_thread_that_uses_it(monkeypatch):
    """CUDA keeps the current device per host thread, and a thread starts on device 0: a `cuda:1` device made on
    the main thread and used by the stream scheduler's worker would allocate, wait for and time device 0. Modelled
    on a cudart whose current device is per thread, as the CUDA runtime's is; the thread's own is restored after."""
    import threading

    import hne_edge.runtime.backends.cuda as cuda_mod

    local = threading.local()
    seen: list[tuple[str, int]] = []

    def call(name):
        def run(*args):
            seen.append((name, getattr(local, "device", 0)))
            return (0, {"cudaMalloc": 0x1000, "cudaMemGetInfo": (1, 2), "cudaEventCreate": object()}.get(name))
        return run

    def set_device(i):
        local.device = i
        return (0,)

    rt = types.SimpleNamespace(cudaSetDevice=set_device, cudaGetDevice=lambda: (0, getattr(local, "device", 0)),
                               cudaStreamCreateWithFlags=lambda flags: (0, 5), cudaStreamNonBlocking=1,
                               cudaFree=lambda ptr: (0,), **{n: call(n) for n in (
                                   "cudaMalloc", "cudaMemGetInfo", "cudaDeviceSynchronize", "cudaEventCreate")})  # fmt: skip
    monkeypatch.setattr(cuda_mod, "import_cudart", lambda: rt)
    device = cuda_mod.CudaPython(1)
    seen.clear()

    def worker() -> None:
        local.device = 0  # a new thread's
        device.malloc(64)
        device.used_bytes()
        device.device_synchronize()
        device.timer()
        seen.append(("after", local.device))

    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    assert seen == [("cudaMalloc", 1), ("cudaMemGetInfo", 1), ("cudaDeviceSynchronize", 1), ("cudaEventCreate", 1),
                    ("cudaEventCreate", 1), ("after", 0)]  # fmt: skip


def test_cuda_python_graphs_the_cache_drops_are_destroyed_on_the_device(monkeypatch):
    """cuda-python's graph handles have no destructor: a graph the cache evicts (max_graphs) or clears (TensorRT's
    scratch re-bound, a runner released) stayed instantiated on the device (18 of 18 captured, in the review's
    rotation of six shapes). Modelled on a cudart that counts the graphs and executable graphs alive."""
    import gc
    import itertools

    import hne_edge.runtime.backends.cuda as cuda_mod

    ids, live = itertools.count(1), {"graph": set(), "exec": set()}

    def make(kind):
        def run(*args):
            live[kind].add(handle := next(ids))
            return (0, handle)
        return run

    ok = lambda *a: (0,)  # noqa: E731
    rt = types.SimpleNamespace(
        cudaSetDevice=ok, cudaGetDevice=lambda: (0, 0), cudaStreamNonBlocking=1,
        cudaStreamCreateWithFlags=lambda flags: (0, 5), cudaStreamSynchronize=ok, cudaStreamBeginCapture=ok,
        cudaStreamCaptureMode=types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1), cudaGraphLaunch=ok,
        cudaStreamEndCapture=make("graph"), cudaGraphInstantiate=make("exec"),
        cudaGraphDestroy=lambda g: (live["graph"].discard(g), (0,))[1],
        cudaGraphExecDestroy=lambda e: (live["exec"].discard(e), (0,))[1],
    )  # fmt: skip
    monkeypatch.setattr(cuda_mod, "import_cudart", lambda: rt)
    device = cuda_mod.CudaPython(0)
    cache = cuda_mod.GraphCache(lambda key: device.capture(lambda: None), max_graphs=4)
    for _ in range(3):
        for rows in range(1, 7):  # six shapes in rotation: each evicts another
            cache.get(rows)()
    gc.collect()
    assert cache.captures == 18 and len(live["exec"]) == len(live["graph"]) == len(cache.graphs) == 4
    cache.clear()
    gc.collect()
    assert live == {"graph": set(), "exec": set()}
