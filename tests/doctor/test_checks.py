"""The doctor's backend rules and its GPU rows, on the CPU: which backends count as present and what an absent
one is told; the ONNX Runtime CUDA, torch CUDA and TensorRT rows through the fakes (the real backends' code on
CPU OrtValues / tensors, TensorRT engines that are their ONNX files run by ONNX Runtime), so every prefix is
checked against the float64 reference; and GPU rows that fail are failures (exit 1), not absences."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hne_edge.bundle import PRECISIONS, RUNNER_PLANS
from hne_edge.doctor import checks, run_doctor
from hne_edge.doctor.environment import Gpu, Library, collect_environment
from hne_edge.runtime.backends import BACKENDS
from hne_edge.runtime.backends.cuda import CudaProbe


GPU = Gpu(0, "FakeGPU", 8192, "555.42", "8.7", "nvidia-smi")


@pytest.fixture(scope="module")
def here():
    return collect_environment()


def gpu_env(here, *, providers=("CUDAExecutionProvider", "CPUExecutionProvider"), torch_cuda="12.4", trt="10.3.0",
            support=None, cuda_python=True):  # fmt: skip
    """This machine as if it had one GPU (sm_87) and the GPU libraries asked for."""
    libraries = dict(here.libraries)
    libraries["tensorrt"] = Library("tensorrt", trt) if trt else Library("tensorrt")
    libraries["cuda-python"] = Library("cuda-python", "12.6.0") if cuda_python else Library("cuda-python")
    devices = 1 if (torch_cuda or cuda_python) else 0
    probe = CudaProbe(torch=libraries["torch"].version, torch_cuda_build=torch_cuda, torch_devices=1 if torch_cuda else 0,
                      cuda_python=cuda_python, device_count=devices)  # fmt: skip
    return dataclasses.replace(
        here, libraries=libraries, ort_providers=list(providers), torch_cuda_build=torch_cuda, cuda=probe, gpus=[GPU],
        tensorrt_support={0: support} if trt else {},
    )  # fmt: skip


def by_key(env):
    return {(a.backend, a.device): a for a in checks.availability(env)}


def test_without_a_gpu_no_gpu_package_is_suggested(here):
    env = dataclasses.replace(here, gpus=[], cuda=CudaProbe(), ort_providers=["CPUExecutionProvider"])
    avail = by_key(env)
    assert set(avail) == set(BACKENDS)
    for (name, kind), a in avail.items():
        if kind == "cuda":
            assert not a.present and a.reason == checks.NO_GPU and a.how == ""
        else:
            assert a.present


def test_with_a_gpu_each_missing_piece_is_named_with_how_to_get_it(here):
    avail = by_key(gpu_env(here))
    assert all(avail[k].present for k in BACKENDS)
    cpu_ort = by_key(gpu_env(here, providers=("CPUExecutionProvider",)))[("onnxruntime", "cuda")]
    assert not cpu_ort.present and "has no CUDAExecutionProvider" in cpu_ort.reason
    assert "pip uninstall onnxruntime && pip install 'hne_edge-0.1.0-py3-none-any.whl[gpu]'" in cpu_ort.how
    no_stream = by_key(gpu_env(here, torch_cuda=None, cuda_python=False))
    assert "neither torch with CUDA nor cuda-python" in no_stream[("onnxruntime", "cuda")].reason
    assert "neither torch with CUDA nor cuda-python" in no_stream[("tensorrt", "cuda")].reason
    assert "pip install 'hne_edge-0.1.0-py3-none-any.whl[tensorrt]' (the wheel of a checkout: docs/guide.md#installing-on-a-device) (brings cuda-python)" in no_stream[("tensorrt", "cuda")].how
    assert no_stream[("torch", "cuda")].reason.endswith("is a CPU-only build")
    assert "pytorch.org" in no_stream[("torch", "cuda")].how
    no_trt = by_key(gpu_env(here, trt=None))[("tensorrt", "cuda")]
    assert not no_trt.present and "pip install 'hne_edge-0.1.0-py3-none-any.whl[tensorrt]'" in no_trt.how and "JetPack" in no_trt.how
    broken = dataclasses.replace(gpu_env(here), libraries={**gpu_env(here).libraries,
                                 "tensorrt": Library("tensorrt", error="OSError: libnvinfer.so.10: cannot open")})  # fmt: skip
    assert by_key(broken)[("tensorrt", "cuda")].present  # installed but broken: checked, so it fails by name


def test_gpu_rows_run_every_precision_and_plan_through_the_fakes(here, fake_gpu):
    report = run_doctor(environment=gpu_env(here), export=False, repeats=2)
    rows = {(c.backend, c.device, c.precision, c.plan): c for c in report.checks}
    for name, kind in BACKENDS:
        for precision in PRECISIONS:
            for plan in RUNNER_PLANS:
                c = rows[(name, kind, precision, plan)]
                assert c.ok, c.label + ": " + str(c.error)
                assert c.prefixes[-1] == c.leaves == 16 and c.max_error <= c.bound and c.cancel.startswith("ok")
    # TensorRT: the exporter built one engine per ONNX file of every plan and precision, at optimisation level 0
    assert len(fake_gpu.built) == len(set(fake_gpu.built)) and {o.get("builder_optimization_level") for o in fake_gpu.options} == {0}
    assert {p.split("/")[-3:-1][0] for p in fake_gpu.built} == set(PRECISIONS)
    assert report.ok and not [a for a in report.available if not a.present]
    table = report.format_table()
    assert "GPU 0        FakeGPU, 8192 MiB, driver 555.42, compute capability 8.7 (from nvidia-smi)" in table
    assert "tensorrt     10.3.0; GPU 0: supported" in table
    assert table.count("tensorrt     cuda") == len(PRECISIONS) * len(RUNNER_PLANS)


def test_a_gpu_backend_that_is_present_but_fails_is_a_failure(here, fake_gpu, monkeypatch):
    """TensorRT too old for the GPU (tensorrt_compat.device_support), and torch CUDA that cannot reach the GPU."""
    import hne_edge.runtime.backends.torch_cuda as tc
    from hne_edge.errors import BackendUnavailable

    def no_device(backend, device_id, torch):
        raise BackendUnavailable("backend 'torch' on device 'cuda': torch sees no CUDA device (driver too old)")

    monkeypatch.setattr(tc, "require_cuda", no_device)
    env = gpu_env(here, support="TensorRT 10.5.0 supports compute capability 7.5 and newer; this GPU is 7.0 (sm_70)")
    report = run_doctor(environment=env, export=False, repeats=2)
    failed = {c.label: c.error for c in report.failures}
    assert not report.ok
    assert failed["tensorrt cuda engine build (shipped bundle)"].endswith("this GPU is 7.0 (sm_70)")
    assert fake_gpu.built == []  # nothing was built for a GPU TensorRT does not support
    torch_rows = [label for label in failed if label.startswith("torch cuda")]
    assert len(torch_rows) == len(PRECISIONS) * len(RUNNER_PLANS)
    assert all("driver too old" in failed[label] for label in torch_rows)
    assert all(c.ok for c in report.checks if c.backend == "onnxruntime")


def test_the_budget_column_says_whether_the_budget_was_kept_and_why_not():
    """Issue 42: the column read "1/16 leaves, 0.12 of 0.04 ms" beside "ok": over the budget, unexplained. The
    budgeted session checks stopping and resuming, not times (never judged): the cell says which it was."""
    assert checks.budget_cell(6, 16, 0.41, 0.52, met=True, forced=False) == "6/16 leaves in 0.41 ms, within 0.52 ms"
    assert checks.budget_cell(16, 16, 0.12, 0.04, met=False, forced=True) == (
        "16/16 leaves in 0.12 ms, over 0.04 ms (its first step is forced)")
    assert checks.budget_cell(7, 16, 0.60, 0.52, met=False, forced=False) == (
        "7/16 leaves in 0.60 ms, over 0.52 ms (a late step; not judged)")


def test_the_prefixes_column_says_which_prefixes_were_checked(here, tmp_path):
    """The column showed the largest prefix checked: plan fused (1 prefix, all 16 leaves) and subtrees (5) both
    read "16/16", as segments (16 prefixes) does."""
    from hne_edge.doctor import DoctorReport
    from hne_edge.doctor.tiny import unpack_shipped

    tiny = unpack_shipped(tmp_path)
    rows = {plan: checks.check_variant(tiny, "onnxruntime", "cpu", "fp32", plan, repeats=1)
            for plan in ("fused", "subtrees", "segments")}  # fmt: skip
    assert all(c.ok for c in rows.values()), {p: c.error for p, c in rows.items()}
    assert rows["fused"].prefixes == [16] and rows["subtrees"].prefixes == [1, 2, 4, 8, 16]
    assert rows["segments"].prefixes == list(range(1, 17))
    table = DoctorReport(here, [], list(rows.values())).format_table()
    cells = [re.split(r"\s{2,}", line)[5] for line in table.splitlines() if line.startswith("onnxruntime  cpu")]
    assert cells == ["1 up to 16/16", "5 up to 16/16", "16 up to 16/16"], table


def test_a_driver_too_old_for_the_cuda_libraries_is_named_with_its_fix(here):
    """A GPU whose driver is older than the installed CUDA libraries (cudaErrorInsufficientDriver): the doctor told
    the machine to install cuda-python or a CUDA torch, both installed, and the driver's error appeared nowhere."""
    from hne_edge.doctor import DoctorReport

    env = gpu_env(here)
    old = dataclasses.replace(env, gpus=[dataclasses.replace(GPU, driver="470.82")], cuda=CudaProbe(
        torch=env.cuda.torch, torch_cuda_build="12.4", cuda_python=True,
        notes=["cudaGetDeviceCount failed: <cudaError_t.cudaErrorInsufficientDriver: 35>"]))  # fmt: skip
    rows = by_key(old)
    for key in (("onnxruntime", "cuda"), ("tensorrt", "cuda")):
        a = rows[key]
        assert not a.present and "driver 470.82 is too old" in a.reason and "cudaErrorInsufficientDriver" in a.reason, a
        assert "update the NVIDIA driver" in a.how and "--device cpu" in a.how, a
        assert "pip install" not in a.how and "build of torch" not in a.how, a
    table = DoctorReport(old, checks.availability(old), []).format_table()
    assert "cudaErrorInsufficientDriver" in table.split("absent")[0], table  # in the environment, where it was found
