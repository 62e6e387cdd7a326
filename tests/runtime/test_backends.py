"""The backend interface: device parsing, the (name, device kind) registry, CPU fallback, explicit load()."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.errors import BackendUnavailable, InputError
from hne_edge.runtime.backends import BACKENDS, Backend, LoadedPlan, Runner, create_backend
from hne_edge.runtime.backends.base import device_name, parse_device, units_from_tree

from runtime_fakes import make_fake_bundle


class Probe(Backend):
    name, format, devices = "probe", "onnx", ("cpu", "cuda")

    def create_runner(self, unit, loaded) -> Runner:  # pragma: no cover - not used
        raise AssertionError


@pytest.mark.parametrize("device, kind, index, name", [("cpu", "cpu", 0, "cpu"), ("cuda", "cuda", 0, "cuda"),
                                                       ("cuda:0", "cuda", 0, "cuda"), ("cuda:2", "cuda", 2, "cuda:2")])  # fmt: skip
def test_backend_init_parses_the_device_once(device, kind, index, name):
    b = Probe(device)
    assert (b.device_kind, b.device_id, b.device) == (kind, index, name)
    assert device_name(kind, index) == name


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cpu:1", "", "cuda:-1"])
def test_parse_device_names_what_it_expected(device):
    with pytest.raises(BackendUnavailable, match=rf"backend 'probe': received device '{device}'; expected one of \['cpu', 'cuda'\] or 'cuda:N'"):
        parse_device("probe", device, ("cpu", "cuda"))


def test_registry_is_keyed_by_name_and_device_kind():
    assert set(BACKENDS) == {("onnxruntime", "cpu"), ("torch", "cpu"), ("onnxruntime", "cuda"), ("torch", "cuda"), ("tensorrt", "cuda")}
    assert type(create_backend("onnxruntime", "cpu")).__name__ == "OnnxRuntimeBackend"
    with pytest.raises(BackendUnavailable, match=r"received backend 'tpu'; expected one of \['onnxruntime', 'tensorrt', 'torch'\]"):
        create_backend("tpu")
    with pytest.raises(BackendUnavailable, match=r"backend 'tensorrt': received device 'cpu'; expected one of \['cuda'\] or 'cuda:N'"):
        create_backend("tensorrt", "cpu")
    for name in ("onnxruntime", "torch"):  # no CUDA graph is what the CPU does: asked for, it is not refused
        assert create_backend(name, "cpu", cuda_graph=False).device == "cpu"


def test_a_built_backend_asked_for_another_device_is_refused_naming_both():
    with pytest.raises(InputError, match=r"device: received 'cuda:1'; expected the built backend's device 'cpu'"):
        create_backend(Probe("cpu"), "cuda:1")
    gpu = Probe("cuda:1")
    assert create_backend(gpu) is gpu  # no device asked for: the built backend's own
    assert create_backend(Probe("cuda"), "cuda:0").device == "cuda"  # the same device, spelled another way
    with pytest.raises(InputError, match=r"received 'cuda'; expected the built backend's device 'cuda:1'"):
        create_backend(gpu, "cuda")


def test_fallback_to_cpu_returns_the_cpu_backend_with_the_reason(monkeypatch, caplog):
    import hne_edge.runtime.backends.onnxruntime_cuda as ort_cuda

    def unusable(self, memory, extra):
        raise BackendUnavailable("no CUDA here (test)")

    monkeypatch.setattr(ort_cuda.OnnxRuntimeCudaBackend, "_open_cuda", unusable)
    with pytest.raises(BackendUnavailable, match=r"no CUDA here \(test\); or pass fallback_to_cpu=True to run on the CPU") as info:
        create_backend("onnxruntime", "cuda:1", cuda_graph=True)
    assert info.value.cli_message() == "no CUDA here (test); or pass --device cpu to run on the CPU"
    with caplog.at_level(logging.WARNING, logger="hne_edge.runtime.gpu"):
        b = create_backend("onnxruntime", "cuda:1", fallback_to_cpu=True, cuda_graph=True, threads=1)
    assert type(b).__name__ == "OnnxRuntimeBackend" and b.device == "cpu" and b.threads == 1
    assert b.fallback_reason == "no CUDA here (test)" and b.describe()["fallback_reason"] == b.fallback_reason
    assert "onnxruntime: cuda:1 requested but unusable, falling back to the CPU: no CUDA here (test)" in caplog.text


def test_load_returns_units_and_image_dtype_explicitly(tmp_path):
    root = make_fake_bundle(tmp_path / "b", plans=("segments", "nodes"))
    manifest = read_manifest(root)
    loaded = Probe("cpu").load(manifest, root, "nodes", "fp32")
    assert isinstance(loaded, LoadedPlan) and (loaded.plan, loaded.precision, loaded.image_dtype) == ("nodes", "fp32", "float32")
    assert [(u.kind, u.key) for u in loaded.units] == [("node", n.id) for n in manifest.tree.nodes]
    assert all(u.path == root / u.name for u in loaded.units) and loaded.weights is None
    segs = Probe("cpu").load(manifest, root, "segments", "fp32").units
    assert [(u.kind, u.key) for u in segs] == [("segment", s.leaf) for s in manifest.tree.segments]


@pytest.mark.parametrize("precision, dtype", [("fp32", "float32"), ("fp16", "float16")])
def test_units_from_tree_say_what_they_compute(tmp_path, precision, dtype):
    manifest = read_manifest(make_fake_bundle(tmp_path / "b"))
    units = units_from_tree(manifest, "segments", precision, "torch/model.pt", None)
    assert [(u.name, u.kind, u.key) for u in units] == [(f"torch/model.pt#segment{s.leaf}", "segment", s.leaf)
                                                        for s in manifest.tree.segments]  # fmt: skip
    assert {t.dtype for u in units for t in (*u.inputs, *u.outputs)} == {dtype}  # the image too: the runner casts it
    nodes = units_from_tree(manifest, "nodes", precision, "torch/model.pt", None)
    assert [(u.name, u.kind, u.key) for u in nodes] == [(f"torch/model.pt#{n.id}", "node", n.id) for n in manifest.tree.nodes]
    assert np.dtype(nodes[0].inputs[0].dtype) == np.dtype(dtype)


def test_cuda_io_keeps_one_fixed_staging_buffer_per_shape_and_a_second_only_while_the_first_is_held():
    from hne_edge.runtime.backends.cuda import CudaIO

    def address(a):
        return a.__array_interface__["data"][0]

    io = CudaIO(lambda shape, dtype: np.empty(shape, dtype), address)
    image = np.zeros((1, 3, 8, 8), np.float32)
    first = address(io.stage(image))
    assert address(io.stage(image)) == first  # nobody held it: the same buffer (a graph may bind it)
    held = io.stage(image)
    other = io.stage(image)  # a paused session still holds `held`: another buffer, never an overwrite
    assert address(held) == first and address(other) != first
    # a graph binds the first only: `other` serves frames beside a paused session, which capture nothing
    assert io.is_fixed(held) and not io.is_fixed(other)
    assert not io.is_fixed(np.empty((1, 3, 8, 8), np.float32))  # ORT's own outputs may move
    assert address(io.stage(np.zeros((2, 3, 8, 8), np.float32))) not in (first, address(other))  # per batch size
    io.clear()
    assert not io.is_fixed(held)


def _spinning_of_each_session(runner) -> set:
    """What every ONNX Runtime session the runner opened was told about spinning ('' : nothing, its default)."""
    sessions = [r.session for r in runner._runners] + ([runner._first_runner.session] if runner._first_runner else [])
    told = set()
    for s in sessions:
        try:
            told.add(s.get_session_options().get_session_config_entry("session.intra_op.allow_spinning"))
        except RuntimeError:  # onnxruntime: no such entry
            told.add("")
    return told


@pytest.mark.parametrize("plan, spinning, expected", [
    ("segments", None, {"0"}),  # a chain of sessions, each its own pool: off unless asked
    ("mixed", None, {"0"}),  # the whole tree among the chain's sessions: off too
    ("fused", None, {""}),  # one pool: onnxruntime's default
    ("segments", True, {"1"}),  # what the caller asks for, either way
    ("fused", False, {"0"}),
])  # fmt: skip
def test_onnxruntime_sessions_of_a_chain_do_not_spin_unless_asked(steps_bundle, plan, spinning, expected):
    from hne_edge.runtime import AnytimeRunner

    with AnytimeRunner(steps_bundle, backend="onnxruntime", plan=plan, threads=2, warmup=0, spinning=spinning) as runner:
        assert _spinning_of_each_session(runner) == expected
        assert runner.backend.describe()["spinning"] == {"0": False, "1": True, "": None}[expected.pop()]
