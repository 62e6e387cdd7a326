"""TensorRT's Python API, faked for the CPU (split from runtime_fakes.py, which keeps the other GPU fakes).

:class:`OrtTensorRT` is a ``tensorrt`` module whose engines are the ONNX files they were built from, run by ONNX
Runtime on a :class:`~runtime_fakes.FakeDevice`'s memory; :class:`FakeTensorRT` is the slice of the API the engine
builder uses, recording its calls. Both follow the real bindings where the code's behaviour depends on them: the
network creation flags' values per major version, ``set_timing_cache`` / ``set_tensor_address`` answering a bool, a
Runtime that refuses version-compatible engines (their embedded lean runtime) unless ``engine_host_code_allowed``.
"""

from __future__ import annotations

import numpy as np


class OrtTensorRT:
    """A fake ``tensorrt`` module whose engines are the ONNX files they were built from, run by ONNX Runtime
    (CPU) on a :class:`FakeDevice`'s memory.

    The real exporter (``exporters.tensorrt.build_engines``: parser, builder config, optimization profile,
    timing cache, manifest entries) and the real ``TensorRTBackend`` / ``TensorRTRunner`` (engine checks,
    contexts without memory, the shared scratch, shapes, addresses, staging, downloads) run on it, so what
    comes out is the model's real numerics. What it cannot tell: anything TensorRT itself does on a GPU.
    """

    MAGIC = b"ORT-ENGINE\0"
    HOST_CODE = b"LEAN-RUNTIME\0"  # a version-compatible engine's embedded runtime

    def __init__(self, device: "FakeDevice", version: str = "10.3.0") -> None:
        import types

        self.__version__ = version
        self.device = device
        self.built: list[str] = []  # source paths, in build order
        self.options: list[dict] = []  # each build's builder settings
        ns = types.SimpleNamespace
        # NvInfer.h: kEXPLICIT_BATCH = 0 (ignored), kSTRONGLY_TYPED = 1 in 10.x; 11 keeps only kSTRONGLY_TYPED = 0
        self.NetworkDefinitionCreationFlag = ns(EXPLICIT_BATCH=0, STRONGLY_TYPED=1) if version.startswith("10.") \
            else ns(STRONGLY_TYPED=0)
        self.BuilderFlag = ns(TF32="TF32", VERSION_COMPATIBLE="VERSION_COMPATIBLE")
        self.MemoryPoolType = ns(WORKSPACE="WORKSPACE")
        self.HardwareCompatibilityLevel = ns(AMPERE_PLUS="AMPERE_PLUS", SAME_COMPUTE_CAPABILITY="SAME_COMPUTE_CAPABILITY")
        self.TensorIOMode = ns(INPUT="INPUT", OUTPUT="OUTPUT")
        self.ExecutionContextAllocationStrategy = ns(USER_MANAGED="USER_MANAGED")

        class Logger:
            WARNING, VERBOSE = 1, 0

            def __init__(self, level: int) -> None:
                pass

        self.Logger = Logger

    # -- building --------------------------------------------------------------------------------
    def Builder(self, logger):  # noqa: N802 - TensorRT's name
        trt = self

        class Network:
            def __init__(self) -> None:
                self.onnx: bytes | None = None

            @property
            def num_inputs(self) -> int:
                return len(self._session().get_inputs())

            def get_input(self, i):
                import types

                meta = self._session().get_inputs()[i]
                return types.SimpleNamespace(name=meta.name, shape=tuple(-1 if not isinstance(d, int) else d for d in meta.shape))

            def _session(self):
                import onnxruntime as ort

                return ort.InferenceSession(self.onnx, providers=["CPUExecutionProvider"])

        class Parser:
            num_errors = 0

            def __init__(self, network, logger) -> None:
                self.network = network

            def parse(self, data: bytes, path: str) -> bool:
                self.network.onnx, self.network.path = bytes(data), path
                return True

        class Config:
            def __init__(self) -> None:
                self.settings: dict = {"flags": set(), "profiles": []}

            def create_timing_cache(self, data: bytes):
                import types

                return types.SimpleNamespace(serialize=lambda: b"fake timing cache")

            def set_timing_cache(self, cache, ignore_mismatch: bool) -> bool:
                return True

            def set_memory_pool_limit(self, pool, size: int) -> None:
                self.settings["workspace"] = size

            def set_flag(self, flag) -> None:
                self.settings["flags"].add(flag)

            def clear_flag(self, flag) -> None:
                self.settings["flags"].discard(flag)

            def add_optimization_profile(self, profile) -> None:
                self.settings["profiles"].append(profile.shapes)

            def __setattr__(self, name, value) -> None:
                if name != "settings":
                    self.settings[name] = value
                object.__setattr__(self, name, value)

        class Profile:
            def __init__(self) -> None:
                self.shapes: dict = {}

            def set_shape(self, name, lo, opt, hi) -> None:
                self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

        class Builder:
            def create_network(self, flags: int) -> Network:
                return Network()

            def create_builder_config(self) -> Config:
                return Config()

            def create_optimization_profile(self) -> Profile:
                return Profile()

            def build_serialized_network(self, network: Network, config: Config) -> bytes:
                trt.built.append(network.path)
                trt.options.append(config.settings)
                lean = trt.BuilderFlag.VERSION_COMPATIBLE in config.settings["flags"]  # embeds a lean runtime
                return (trt.HOST_CODE if lean else b"") + trt.MAGIC + network.onnx

        self.OnnxParser = Parser
        return Builder()

    # -- running ---------------------------------------------------------------------------------
    @staticmethod
    def nptype(dtype):
        return dtype

    def Runtime(self, logger):  # noqa: N802 - TensorRT's name
        trt = self

        class Runtime:
            engine_host_code_allowed = False  # TensorRT's default: engines with host code are refused

            def deserialize_cuda_engine(self, data: bytes):
                if data.startswith(trt.HOST_CODE):
                    if not self.engine_host_code_allowed:
                        return None  # as TensorRT: an error in its log, no engine
                    data = data[len(trt.HOST_CODE):]
                return trt._engine(data)

        return Runtime()

    def _engine(self, data: bytes):
        import onnxruntime as ort

        if not data.startswith(self.MAGIC):
            return None
        session = ort.InferenceSession(data[len(self.MAGIC):], providers=["CPUExecutionProvider"])
        return _OrtEngine(session, self)


_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class _OrtEngine:
    def __init__(self, session, trt: OrtTensorRT) -> None:
        self.session, self.trt = session, trt
        self.inputs = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]
        self.dtypes = {m.name: _ORT_DTYPES[m.type] for m in [*session.get_inputs(), *session.get_outputs()]}
        self.num_io_tensors = len(self.inputs) + len(self.outputs)
        self.device_memory_size_v2 = 4096

    def get_tensor_name(self, i: int) -> str:
        return [*self.inputs, *self.outputs][i]

    def get_tensor_mode(self, name: str) -> str:
        return self.trt.TensorIOMode.INPUT if name in self.inputs else self.trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str):
        return self.dtypes[name]

    def create_execution_context(self, strategy):
        assert strategy == self.trt.ExecutionContextAllocationStrategy.USER_MANAGED
        return _OrtContext(self)


class _OrtContext:
    def __init__(self, engine: _OrtEngine) -> None:
        self.engine, self.address, self.shape, self.memory = engine, {}, None, None
        self.out_shapes: dict = {}

    def set_device_memory(self, ptr: int, size: int) -> None:
        self.memory = (ptr, size)

    def set_input_shape(self, name: str, shape) -> bool:
        self.shape = tuple(shape)
        e = self.engine
        zeros = np.zeros(self.shape, e.dtypes[name])  # what the outputs' shapes are at this input shape
        self.out_shapes = {n: o.shape for n, o in zip(e.outputs, e.session.run(None, {name: zeros}))}
        return True

    def get_tensor_shape(self, name: str):
        return self.out_shapes[name]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        if name not in self.engine.dtypes:
            return False  # the bindings' answer for a name the engine does not have
        self.address[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        e, dev = self.engine, self.engine.trt.device
        assert self.memory is not None and stream == dev.stream_handle
        (name,) = e.inputs
        x = dev.view(self.address[name], self.shape, e.dtypes[name]).copy()
        for out_name, value in zip(e.outputs, e.session.run(None, {name: x})):
            dev.view(self.address[out_name], value.shape, value.dtype)[...] = value
        return True


class FakeTensorRT:
    """The slice of the documented TensorRT Python API that build_engines uses, recording the calls.

    Not a substitute for a real build (see tests/exporters/test_tensorrt.py::test_build_real_engines): it checks our side of the
    contract — network flags per major version, one shared timing cache, the optimization profile,
    TF32 off for fp32 — and that the manifest entries written afterwards are valid.
    """

    def __init__(self, version):
        import types

        self.__version__ = version
        self.calls = {"networks": [], "profiles": [], "cleared": [], "caches_created": 0, "set_cache": 0}
        self.cache_accepted = True  # set_timing_cache's answer: False for a cache of another TensorRT / device
        fake = self
        self.Logger = type("Logger", (), {"WARNING": 1, "VERBOSE": 0, "__init__": lambda s, level: None})
        # NvInfer.h: kEXPLICIT_BATCH = 0 (ignored), kSTRONGLY_TYPED = 1 in 10.x; 11 keeps only kSTRONGLY_TYPED = 0
        self.NetworkDefinitionCreationFlag = (types.SimpleNamespace(EXPLICIT_BATCH=0, STRONGLY_TYPED=1)
                                              if version.startswith("10.") else types.SimpleNamespace(STRONGLY_TYPED=0))
        self.BuilderFlag = types.SimpleNamespace(TF32=7, VERSION_COMPATIBLE=8)
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)
        self.HardwareCompatibilityLevel = types.SimpleNamespace(AMPERE_PLUS=1)

        class Tensor:
            def __init__(self, name, shape):
                self.name, self.shape = name, shape

        class Network:
            def __init__(self, flags):
                fake.calls["networks"].append(flags)
                self.inputs = []

            @property
            def num_inputs(self):
                return len(self.inputs)

            def get_input(self, i):
                return self.inputs[i]

        class OnnxParser:
            def __init__(self, network, logger):
                self.network = network
                self.num_errors = 0

            def parse(self, model, path=None):  # TensorRT's OnnxParser.parse(model: bytes, path: str = None)
                import onnx

                g = onnx.load_from_string(model).graph
                for v in g.input:
                    dims = [d.dim_value or -1 for d in v.type.tensor_type.shape.dim]
                    self.network.inputs.append(Tensor(v.name, tuple(dims)))
                return True

        class Cache:
            def __init__(self, data):
                self.data = bytes(data)

            def serialize(self):
                return b"timing-cache"

        class Config:
            def create_timing_cache(self, data):
                fake.calls["caches_created"] += 1
                return Cache(data)

            def set_timing_cache(self, cache, ignore_mismatch):
                fake.calls["set_cache"] += 1
                return fake.cache_accepted or not cache.data  # a new cache is always this TensorRT's

            def set_flag(self, flag):
                pass

            def clear_flag(self, flag):
                fake.calls["cleared"].append(flag)

            def add_optimization_profile(self, profile):
                fake.calls["profiles"].append(profile.shapes)

        class Profile:
            def __init__(self):
                self.shapes = {}

            def set_shape(self, name, lo, opt, hi):
                self.shapes[name] = (lo, opt, hi)

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                return Network(flags)

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                return b"plan:" + network.inputs[0].name.encode()

        self.Builder, self.OnnxParser = Builder, OnnxParser
