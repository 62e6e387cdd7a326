"""A fake bundle and a numpy backend with a virtual clock, for deterministic runtime tests.

The fake backend computes a real (tiny) tree network in numpy, so the
scheduler's caching is checked numerically against each path computed
independently; its runners advance a virtual clock by a known cost per
node, so budget and deadline behaviour is exact (no sleeping, no flakiness).

:class:`FakeTorchCuda` stands in for the torch CUDA backend's device, so the
real ``TorchCudaBackend`` / ``TorchCudaRunner`` run on CPU tensors.
TensorRT's fakes are in tensorrt_fakes.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from hne_edge.bundle import InputSpec, Manifest, ModelFile, TensorSpec, activation_name, write_manifest
from hne_edge.runtime.backends.base import Backend, Runner
from hne_edge.runtime.backends.cuda import CudaDevice
from hne_edge.tree import TreeSpec

C, H, W, D = 3, 4, 4, 6


def make_fake_bundle(root: Path, branching=(1, 2, 2), classes: int = 4, batch=(1, 1, 8), plans=("segments", "nodes")) -> Path:
    """A valid bundle whose "onnx" files are placeholders (only the fake backend can run it)."""
    tree = TreeSpec(tuple(branching))
    root.mkdir(parents=True, exist_ok=True)
    node_macs = {n.id: 100 * (n.depth + 1) for n in tree.nodes}

    def spec(node, logits=False):
        if node is None:
            return TensorSpec("image", None, "float32", ("batch", C, H, W))
        return TensorSpec("logits" if logits else activation_name(node), node, "float32", ("batch", classes if logits else D))

    files = []

    def add(rel, nodes, leaf, src, outs):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"fake {rel}".encode())
        files.append(
            ModelFile(
                path=rel, format="onnx", plan=rel.split("/")[2], precision="fp32",
                sha256=hashlib.sha256(path.read_bytes()).hexdigest(), bytes=path.stat().st_size,
                nodes=tuple(nodes), leaf=leaf, macs=sum(node_macs[n] for n in nodes),
                inputs=(spec(src),), outputs=tuple(outs),
            )
        )

    if "segments" in plans:
        for seg in tree.segments:
            outs = [spec(e) for e in seg.exports] + [spec(seg.nodes[-1], logits=True)]
            add(f"onnx/fp32/segments/leaf{seg.leaf:02d}.onnx", seg.nodes, seg.leaf, seg.input, outs)
    if "first" in plans:
        seg = tree.segments[0]
        add("onnx/fp32/first/leaf00.onnx", seg.nodes, 0, None, [spec(seg.nodes[-1], logits=True)])
    if "nodes" in plans:
        for n in tree.nodes:
            add(f"onnx/fp32/nodes/{n.id}.onnx", (n.id,), n.leaves[0] if n.is_leaf else None, n.parent,
                [spec(n.id, logits=n.is_leaf)])
    if "subtrees" in plans:
        for u in tree.subtree_units:
            outs = [spec(e) for e in u.exports] + [
                spec(u.nodes[-1], logits=True) if u.index == 0
                else TensorSpec("logits", u.root, "float32", ("batch", u.num_leaves, classes))
            ]  # fmt: skip
            add(f"onnx/fp32/subtrees/unit{u.index:02d}.onnx", u.nodes, u.first_leaf, u.input, outs)
    if "fused" in plans:
        add("onnx/fp32/fused/tree.onnx", [n.id for n in tree.nodes], 0, None,
            [TensorSpec("logits", None, "float32", ("batch", tree.num_leaves, classes))])
    manifest = Manifest(
        model_name="fake", model_config={}, class_names=tuple(f"c{i}" for i in range(classes)),
        input=InputSpec("image", ("batch", C, H, W), "float32", "NCHW", (0.5,) * C, (0.25,) * C, tuple(batch)),
        tree=tree, node_macs=node_macs, files=tuple(files), provenance={"fake": True},
    )
    write_manifest(root, manifest)
    return root


def node_weights(node_id: str, din: int, classes: int, leaf: bool):
    seed = int(hashlib.md5(node_id.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((din, D)) / np.sqrt(din)).astype(np.float32)
    head = (rng.standard_normal((D, classes)) * 2).astype(np.float32) if leaf else None
    return w, head


def node_forward(tree: TreeSpec, node_id: str, x: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(activation, logits or None) of one node from its parent's activation (or the image)."""
    node = tree.node(node_id)
    flat = x.reshape(len(x), -1)
    w, head = node_weights(node_id, flat.shape[1], classes, node.is_leaf)
    act = np.tanh(flat @ w)
    return act, (act @ head if head is not None else None)


def unit_forward(tree: TreeSpec, unit, x: np.ndarray, classes: int, on_node=None) -> tuple[np.ndarray, ...]:
    """The outputs of ``unit`` (a manifest file or a runtime Unit: its nodes, input and outputs) from ``x``:
    a chain or a whole subtree, each node from its parent's activation; several leaves' logits are stacked
    as (batch, leaves, classes) in depth-first order when the unit declares a 3-d logits output."""
    acts, logits = {unit.inputs[0].node: x}, {}
    for nid in unit.nodes:
        acts[nid], logits[nid] = node_forward(tree, nid, acts[tree.node(nid).parent], classes)
        if on_node is not None:
            on_node(nid)
    out = []
    for t in unit.outputs:
        if t.name != "logits":
            out.append(acts[t.node])
        elif len(t.shape) == 3:
            out.append(np.stack([logits[n] for n in unit.nodes if tree.node(n).is_leaf], axis=1))
        else:
            out.append(logits[unit.nodes[-1]])
    return tuple(out)


def reference_leaf_logits(tree: TreeSpec, x: np.ndarray, classes: int) -> np.ndarray:
    """(N, B, classes): every path computed independently, no caching."""
    out = []
    for leaf in range(tree.num_leaves):
        h = x
        for nid in tree.path(leaf):
            h, logits = node_forward(tree, nid, h, classes)
        out.append(logits)
    return np.stack(out)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeRunner(Runner):
    def __init__(self, unit, backend: "FakeBackend") -> None:
        super().__init__(unit)
        self.backend = backend

    def activate_impl(self) -> None:
        self.backend.active += 1

    def release_impl(self) -> None:
        self.backend.active -= 1

    def run_impl(self, inputs):
        b = self.backend
        if b.gate is not None:
            b.entered.set()
            b.gate.wait(10)
        def computed(nid):
            b.calls.append(nid)
            b.charge(b.cost(nid, len(inputs[0])))

        outs = unit_forward(b.tree, self.unit, inputs[0], b.classes, computed)
        b.charge(b.call_cost(self.unit, len(inputs[0])))
        b.files.append(self.unit.name)
        return outs


class FakeBackend(Backend):
    """numpy backend reading the fake bundle's "onnx" entries; ``cost(node, batch)`` seconds of virtual time per
    node, plus ``call_cost(unit, batch)`` per call (a fixed cost, or a fused subtree's different speed)."""

    name = "fake"
    format = "onnx"
    devices = ("cpu",)

    def __init__(self, tree: TreeSpec, classes: int, cost: Callable[[str, int], float] | None = None,
                 call_cost: Callable[..., float] | None = None, upload_cost: Callable[[int], float] | None = None) -> None:  # fmt: skip
        super().__init__("cpu")
        self.tree, self.classes = tree, classes
        self.cost = cost or (lambda node, batch: 0.001)
        self.call_cost = call_cost or (lambda unit, batch: 0.0)  # seconds per call on top of its nodes
        self.upload_cost = upload_cost or (lambda batch: 0.0)  # seconds per image upload (a GPU's copy in)
        self.clock = FakeClock()
        self.queued = False  # True: calls return once queued and the clock waits at to_host (a GPU's), else when done
        self.device_free = 0.0  # (queued) when the device's last queued work ends
        self.calls: list[str] = []  # nodes computed, in order
        self.files: list[str] = []  # model files run, in order
        self.active = 0
        self.closed = False
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def create_runner(self, unit, loaded):
        return FakeRunner(unit, self)

    def from_host(self, array):
        self.clock.t += self.upload_cost(len(array))
        return array

    def charge(self, seconds: float) -> None:
        """A call's cost: on the host's clock, or (``queued``: a GPU's calls return once queued) on the device's
        timeline, which ``to_host`` and ``synchronize`` wait for."""
        if self.queued:
            self.device_free = max(self.device_free, self.clock.t) + seconds
        else:
            self.clock.t += seconds

    def to_host(self, handle):
        self.synchronize()
        return handle

    def synchronize(self) -> None:
        self.clock.t = max(self.clock.t, self.device_free)

    def close(self) -> None:
        self.closed = True


class FakeTorchCuda:
    """``cuda.TorchCuda`` on the CPU: no stream, and "graphs" with a real graph's contract.

    ``capture_outputs(fn)`` runs ``fn`` once to get output tensors, then fills
    them with NaN (a real capture computes nothing: its outputs are garbage
    until the first replay); ``replay()`` runs ``fn`` again and writes into those
    same tensors (fixed addresses, reading the static input as it is now).
    ``phase`` says what a module call is part of ("eager", "capture", "replay"),
    so tests can count real computations.
    """

    kind = "fake-torch"

    def __init__(self, device_id: int = 0) -> None:
        import torch

        self.torch = torch
        self.device_id = device_id
        self.device = torch.device("cpu")
        self.stream = None
        self.stream_handle = 0
        self.captures = 0
        self.replays = 0
        self.phase = "eager"

    def stream_context(self):
        return contextlib.nullcontext()

    def gpu_name(self) -> str:
        return "FakeGPU (CPU tensors)"

    def synchronize(self) -> None:
        pass

    def device_synchronize(self) -> None:
        pass

    def timer(self):
        return (lambda: None), (lambda: 0.001)

    def memory_reserved(self) -> int:
        return 0

    def _in_phase(self, phase: str, fn):
        self.phase = phase
        try:
            return fn()
        finally:
            self.phase = "eager"

    def capture_outputs(self, fn):
        outs = self._in_phase("capture", fn)
        self.captures += 1
        for o in outs:
            o.fill_(float("nan"))

        def replay() -> None:
            self.replays += 1
            for o, v in zip(outs, self._in_phase("replay", fn)):
                o.copy_(v)

        return replay, outs


class SimulatedGpu(FakeTorchCuda):
    """A :class:`FakeTorchCuda` whose calls cost what an NVIDIA H200 charges, on a virtual clock (issue 39): the real
    ``TorchCudaBackend`` / ``TorchCudaRunner`` run the tiny model on CPU tensors, and each unit call advances
    :attr:`clock` by the device time it would take there, so a CPU machine's tests see the GPU's stalls.

    * a graph's replay: ``floor_s`` (the per-call launch floor) plus ``replay_s`` per row-scaled call
      (``1 + row_cost * (rows - 1)``: a small batch is launch-bound, about flat);
    * an eager call: ``eager_factor`` (4) times the replay;
    * the first eager call of a (unit, shape): cuDNN's autotuning, ``first_call_s`` (0.1 s); a capture:
      ``capture_s`` (0.2-1.4 s, drawn): together the 100-1,500 ms a new shape cost on the H200 (2026-11-28).

    ``calls`` counts each kind; :meth:`install` makes the backend read this clock and charge every unit call."""

    kind = "simulated-h200"

    def __init__(self, device_id: int = 0, *, floor_s: float = 20e-6, replay_s: float = 60e-6, row_cost: float = 0.02,
                 eager_factor: float = 4.0, first_call_s: float = 0.1, capture_s: tuple[float, float] = (0.2, 1.4),
                 seed: int = 0) -> None:  # fmt: skip
        super().__init__(device_id)
        self.clock = FakeClock()
        self.floor_s, self.replay_s, self.row_cost = floor_s, replay_s, row_cost
        self.eager_factor, self.first_call_s, self.capture_s = eager_factor, first_call_s, capture_s
        self.rng = np.random.default_rng(seed)
        self.seen: set = set()
        self.calls = {"eager": 0, "first": 0, "capture": 0, "replay": 0}
        self.log: list[tuple[str, int, float]] = []  # (phase, rows, seconds) of every unit call

    def gpu_name(self) -> str:
        return "SimulatedGpu (an H200's costs on CPU tensors)"

    def replay_cost(self, rows: int) -> float:
        return self.floor_s + self.replay_s * (1 + self.row_cost * (rows - 1))

    def charge(self, module, x) -> None:
        """Advance the clock by what this unit call costs on the simulated device, by the phase it is part of."""
        rows, phase, t0 = int(x.shape[0]), self.phase, self.clock.t
        if phase == "replay":
            self.clock.t += self.replay_cost(rows)
        elif phase == "capture":
            self.clock.t += float(self.rng.uniform(*self.capture_s))
        else:
            key = (id(module), tuple(x.shape))
            if key not in self.seen:
                self.seen.add(key)
                self.calls["first"] += 1
                self.clock.t += self.first_call_s
            self.clock.t += self.eager_factor * self.replay_cost(rows)
        self.calls[phase] += 1
        self.log.append((phase, rows, self.clock.t - t0))

    def timer(self):
        t0 = {}
        return (lambda: t0.setdefault("t", self.clock.t)), (lambda: self.clock.t - t0["t"])

    def memory_reserved(self) -> int:
        return 4096 * self.captures  # a graph's share of the pool, 4 KiB each: the warm-up report has a figure

    @staticmethod
    def install(monkeypatch) -> list["SimulatedGpu"]:
        """``TorchCudaBackend`` builds SimulatedGpu devices, reads their clock, and charges every unit call."""
        import hne_edge.runtime.backends.torch_cuda as tc

        devices: list[SimulatedGpu] = []

        def make(device_id=0):
            devices.append(SimulatedGpu(device_id))
            return devices[-1]

        call = tc.TorchCudaRunner._call_unscoped

        def charged(runner, x):
            runner._backend.cuda.charge(runner.module, x)
            return call(runner, x)

        monkeypatch.setattr(tc, "require_cuda", lambda backend, device_id, torch: None)
        monkeypatch.setattr(tc, "TorchCuda", make)
        monkeypatch.setattr(tc.TorchCudaRunner, "_call_unscoped", charged)
        monkeypatch.setattr(tc.TorchCudaBackend, "clock", property(lambda self: self.cuda.clock), raising=False)
        return devices


class FakeDevice(CudaDevice):
    """Device memory as numpy byte arrays keyed by fake pointers; graphs replay the captured launch."""

    kind = "fake"

    def __init__(self) -> None:
        self.mem: dict[int, np.ndarray] = {}
        self.next = 0x1000
        self.stream_handle = 7
        self.captures = 0
        self.replays = 0

    def malloc(self, nbytes):
        ptr, self.next = self.next, self.next + ((nbytes + 255) // 256 + 1) * 256
        self.mem[ptr] = np.zeros(nbytes, np.uint8)
        return ptr, self.mem[ptr]

    def view(self, ptr, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.mem[ptr][:n].view(dtype).reshape(shape)

    def upload(self, dst, array):
        self.mem[dst][: array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)

    def download(self, src, out):
        out[...] = self.view(src, out.shape, out.dtype)

    def synchronize(self):
        pass

    def device_synchronize(self):
        pass

    def timer(self):
        return (lambda: None), (lambda: 0.001)

    def capture(self, launch):
        self.captures += 1

        def replay():
            self.replays += 1
            launch()

        return replay


def ort_values_on_cpu_backend(**options):
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


def cuda_provider_on_cpu(monkeypatch, version: str | None = None) -> list:
    """The real ``OnnxRuntimeCudaBackend._open_cuda`` (the CUDA provider's options as the backend builds them) with
    everything a GPU supplies faked: onnxruntime lists the CUDA provider, the stream is a :class:`FakeDevice`'s, and
    every ``InferenceSession`` records the ``providers`` it was given, then opens on the CPU provider (which the
    sessions must report first). Returns the recorded providers lists, one per session, in order (``.kwargs``:
    their other keyword arguments). ``version``:
    the onnxruntime version the backend sees (the CUDA provider's options depend on it)."""
    import onnxruntime as ort

    import hne_edge.runtime.backends.onnxruntime_cuda as ort_cuda

    class Seen(list):
        kwargs: list  # each session's other keyword arguments, in order

    seen = Seen()
    seen.kwargs = []
    real = ort.InferenceSession

    def session(data, sess_options=None, providers=None, **kwargs):
        seen.append(providers)
        seen.kwargs.append(kwargs)
        return real(data, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    if version is not None:
        monkeypatch.setattr(ort, "__version__", version)
    cls = ort_cuda.OnnxRuntimeCudaBackend
    monkeypatch.setattr(cls, "ort_device", "cpu")
    monkeypatch.setattr(cls, "execution_provider", "CPUExecutionProvider")
    monkeypatch.setattr(ort_cuda, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(ort_cuda, "open_device", lambda device_id, memory: FakeDevice())
    return seen


def run_gpu_backends_on_fakes(monkeypatch) -> "OrtTensorRT":
    """Patch the ONNX Runtime CUDA and TensorRT backends (and the TensorRT exporter) to run on the CPU: ONNX
    Runtime CUDA on CPU OrtValues with the CPU provider, TensorRT on :class:`OrtTensorRT` (engines built by the
    real exporter, run by the real backend) on a :class:`FakeDevice`; returns the fake TensorRT. The torch CUDA
    backend's fake is conftest's ``fake_torch_cuda`` fixture. ``monkeypatch``: a fixture's, or a
    ``pytest.MonkeyPatch.context()`` for a longer-lived setup (a session fixture building engines)."""
    import hne_edge.exporters.tensorrt as trt_exporter
    import hne_edge.runtime.backends.onnxruntime_cuda as ort_cuda
    import hne_edge.runtime.backends.tensorrt as trt_backend

    cls = ort_cuda.OnnxRuntimeCudaBackend
    monkeypatch.setattr(cls, "ort_device", "cpu")
    monkeypatch.setattr(cls, "execution_provider", "CPUExecutionProvider")
    monkeypatch.setattr(cls, "_open_cuda", lambda self, memory, extra: (FakeDevice(), ["CPUExecutionProvider"]))
    from tensorrt_fakes import OrtTensorRT

    device = FakeDevice()
    fake = OrtTensorRT(device)
    for module in (trt_backend, trt_exporter):
        monkeypatch.setattr(module, "load_tensorrt", lambda exporting=False: fake)
        monkeypatch.setattr(module, "device_info", lambda device_id=0: ("FakeGPU", "8.7"))
    monkeypatch.setattr(trt_backend, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(trt_backend, "open_device", lambda device_id, memory: device)
    return fake


def every_stop_twice_and_an_interleaved_session(runner, x, ref) -> None:
    """Each stop twice (the second frame reuses the runners' slot-0 buffers / "graphs"), then a session
    stepped around another frame: its cached activations must survive it (``ref``: the float64 leaf logits)."""
    fp32 = dict(rtol=1e-4, atol=1e-4)
    for n in runner.stops:
        for _ in range(2):
            np.testing.assert_allclose(runner.run(x, max_leaves=n).logits, ref[:, :n].mean(1), **fp32)
    s = runner.start(x)
    s.step()
    np.testing.assert_allclose(runner.run(x[::-1].copy()).logits, ref[::-1].mean(1), **fp32)
    while s.step():
        pass
    np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **fp32)
