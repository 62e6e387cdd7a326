"""`hne-edge doctor` as users run it (subprocess): every backend present checked, JSON for scripts, the
runtime-only install (no torch), and exit 1 naming a backend broken on purpose."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from conftest import REPO, blocking_env, breaking_env, run_cli
from gpu_env import HAS_CUDA

from hne_edge.bundle import PRECISIONS, RUNNER_PLANS
from hne_edge.runtime.backends import BACKENDS

CPU_BACKENDS = [name for name, kind in BACKENDS if kind == "cpu"]


# a few ISA features and the /proc/cpuinfo flags that mean them (from the kernel's names, not hne_edge's table)
KNOWN_FLAGS = {"x86_64": {"AVX2": {"avx2"}, "FMA": {"fma"}, "AVX-512": {"avx512f"}},
               "arm": {"NEON": {"asimd", "neon"}, "SVE": {"sve"}}}  # fmt: skip


def cpu_features_from_proc(machine: str) -> dict[str, bool]:
    """What the doctor must say of those features on this CPU, read here independently of it: present or
    absent as /proc/cpuinfo's flags say (whatever this CPU has); nothing where there are no flags to read."""
    try:
        lines = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return {}
    flags = next((set(v.split()) for k, _, v in (line.partition(":") for line in lines) if k.strip() in ("flags", "Features")),
                 None)  # fmt: skip
    family = "x86_64" if machine.lower() in ("x86_64", "amd64", "i686", "i386") else "arm" if machine.lower().startswith(("arm", "aarch")) else None
    if flags is None or family is None:
        return {}
    return {name: bool(names & flags) for name, names in KNOWN_FLAGS[family].items()}


def test_doctor_json_checks_every_backend_precision_and_plan_present(tmp_path):
    proc = run_cli("doctor", "--json", "--repeats", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["failures"] == []
    env = report["environment"]
    assert env["libraries"]["onnxruntime"]["version"] and env["libraries"]["torch"]["version"]
    assert env["cpu"]["logical_cores"] >= 1
    expected = cpu_features_from_proc(env["cpu"]["machine"])  # not this machine's ISA: the CPU's own flags
    assert {name: env["cpu"]["features"].get(name) for name in expected} == expected, env["cpu"]
    assert bool(env["cpu"]["features"]) == bool(expected)  # features reported exactly where they can be read
    assert set(report["bundles"]) == {"fresh", "shipped"}
    rows = {(c["backend"], c["device"], c["precision"], c["plan"]): c for c in report["checks"]}
    for backend in CPU_BACKENDS:  # torch and onnxruntime are both installed here
        for precision in PRECISIONS:
            for plan in RUNNER_PLANS:
                assert (backend, "cpu", precision, plan) in rows, (backend, precision, plan)
    for c in report["checks"]:
        assert c["ok"] and c["error"] is None
        assert c["prefixes"][-1] == c["leaves"] == 16 and c["prefixes"] == sorted(set(c["prefixes"]))
        assert 0 <= c["max_error"] <= c["bound"] and c["full_tree_ms"] > 0
        assert c["first_leaf_ms"] > 0 if c["plan"] != "fused" else c["first_leaf_ms"] is None  # fused: 16 or nothing
        assert c["cancel"].startswith("ok") and "/16 leaves" in c["budget"]
        # issue 42: "1/16 leaves, 0.12 of 0.04 ms" beside ok; now within, or over and why
        assert re.fullmatch(r"\d+/16 leaves in [0-9.]+ ms, (within [0-9.]+ ms|over [0-9.]+ ms \(.+\))", c["budget"]), c
    # the fresh export is fp32; the shipped bundle's fp32 files are checked too, so the asset cannot rot
    assert {c["bundle"] for c in report["checks"] if c["precision"] == "fp32" and c["backend"] == "onnxruntime"} == {"fresh", "shipped"}
    absent = {(a["backend"], a["device"]): a for a in report["absent"]}
    if not HAS_CUDA:  # no GPU: every CUDA backend is absent, and nothing tells this machine to install a GPU package
        assert set(absent) == {k for k in BACKENDS if k[1] == "cuda"}
        for a in absent.values():
            assert "needs an NVIDIA GPU" in a["reason"] and a["how"] == ""


def test_doctor_on_a_runtime_only_install_runs_the_shipped_bundle(tmp_path):
    """numpy + onnxruntime, no torch and no onnx (an edge device's wheel with the `runtime` extra)."""
    env = blocking_env(tmp_path, "torch", "onnx", "torchvision")
    proc = run_cli("doctor", "--repeats", "3", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "torch        not installed" in out and "onnx         not installed (needed to export, not to run)" in out
    assert "shipped  doctor_tiny.tar.xz" in out and "fresh " not in out
    table = [line.split() for line in out.splitlines() if line.startswith("onnxruntime  cpu")]
    assert sorted((row[2], row[3]) for row in table) == sorted((p, q) for p in PRECISIONS for q in RUNNER_PLANS)
    assert all(row[4] == "shipped" and row[6:9] == ["up", "to", "16/16"] and row[-1] == "ok" for row in table)
    assert "torch cpu: torch is not installed; to get it: pip install 'hne_edge-0.1.0-py3-none-any.whl[train]'" in out
    # with onnxruntime-gpu and a GPU, its CUDA rows are checks too
    checks = [line for line in out.splitlines() if re.match(r"onnxruntime  cuda\S* ", line)] + table
    assert out.rstrip().splitlines()[-1].startswith(f"ok: {len(checks)} checks passed")


BREAK = """
import numpy as np
import hne_edge.runtime.backends.onnxruntime as ort_backend
import hne_edge.runtime.backends.torch as torch_backend

# onnxruntime: fp16 logits of leaf 3 on (and of every fused subtree) are off by 0.2 (a wrong kernel, a bad file;
# the tiny model's logits are at most 1.3, its fp16 bound 0.02 + 0.02 x max|logit|); fp32 untouched
run = ort_backend.OnnxRuntimeRunner.run_impl
def wrong(self, inputs):
    outs = run(self, inputs)
    whole = outs[-1].ndim == 3  # a whole subtree or the fused tree: (batch, its leaves, classes)
    if self.unit.leaf is not None and (self.unit.leaf >= 3 or whole) and self.unit.inputs[0].dtype == "float16":
        outs = (*outs[:-1], outs[-1] + np.float16(0.2))
    return outs
ort_backend.OnnxRuntimeRunner.run_impl = wrong
ort_backend.OnnxRuntimeRunner.run_logits_impl = lambda self, inputs: self.run_impl(inputs)[-1]

# torch: cannot load anything (a broken install)
def broken(self, *args, **kwargs):
    raise RuntimeError("broken on purpose by the test")
torch_backend.TorchBackend.load = broken
"""


def test_doctor_exits_1_naming_each_broken_backend(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(BREAK))
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}"}  # this checkout's hne_edge, imported by sitecustomize
    proc = run_cli("doctor", "--no-export", "--repeats", "2", env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = [line.split() for line in proc.stdout.splitlines() if line.endswith("FAILED") and not line.startswith("FAILED")]
    assert sorted((r[0], r[2], r[3]) for r in failed if r[1] == "cpu") == sorted(
        [("onnxruntime", "fp16", plan) for plan in RUNNER_PLANS] + [("torch", p, plan) for p in PRECISIONS for plan in RUNNER_PLANS]
    )
    # on a GPU machine the torch CUDA rows load through the same broken TorchBackend.load: they fail too
    assert all(r[0] == "torch" or (r[0], r[2]) == ("onnxruntime", "fp16") for r in failed), failed
    ok = [line.split() for line in proc.stdout.splitlines()
          if line.startswith("onnxruntime  cpu") and line.endswith(" ok")]
    assert sorted(r[3] for r in ok) == sorted(RUNNER_PLANS)  # fp32 still passes: only what is broken is named
    stderr = proc.stderr.strip().splitlines()[-1]
    assert stderr.startswith("doctor: FAILED: ")
    assert "onnxruntime cpu fp16 segments (shipped bundle): session after 4 leaves: max |logits - float64 reference|" in stderr
    assert "torch cpu fp32 segments (shipped bundle): RuntimeError: broken on purpose by the test" in stderr
    # the same through --json: ok false, the failures named
    proc = run_cli("doctor", "--no-export", "--repeats", "2", "--json", env=env)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False and "onnxruntime cpu fp16 nodes (shipped bundle)" in report["failures"]


def test_doctor_bad_threads_is_one_line_and_exit_2():
    proc = run_cli("doctor", "--threads", "100000")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("Error: --threads: received 100000; expected an int in 1..")


# -- a doctor that reports whatever breaks (issue 29, item 8) ------------------------------------------------------


def test_doctor_reports_a_torch_that_raises_oserror_on_import_as_a_failed_row(tmp_path):
    """Issue 29 (8): a broken libtorch raises OSError on `import torch`; the doctor stopped with "Error: ..." (exit 2)
    because runtime/backends/cuda.py:probe_cuda caught ImportError only."""
    env = breaking_env(tmp_path, "torch", "OSError('libtorch_cpu.so: cannot open shared object file')")
    proc = run_cli("doctor", "--repeats", "2", env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not any(line.startswith("Error:") for line in proc.stderr.splitlines())
    assert "torch        installed but does not import: OSError: libtorch_cpu.so: cannot open shared object file" in proc.stdout
    failed = [line.split() for line in proc.stdout.splitlines() if line.endswith("FAILED") and not line.startswith("FAILED")]
    assert ("torch", "cpu") in {tuple(r[:2]) for r in failed}, proc.stdout[-3000:]
    assert {r[0] for r in failed} == {"torch"}, proc.stdout[-3000:]  # on a GPU machine torch's CUDA rows fail too
    assert any(line.startswith("onnxruntime  cpu") and line.endswith(" ok") for line in proc.stdout.splitlines())
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("doctor: FAILED: torch cpu") and "libtorch_cpu.so" in last, last


@pytest.mark.parametrize("error", ["ImportError('numpy.core.multiarray failed to import')",
                                   "OSError('libopenblas.so.0: cannot open shared object file')"])
def test_doctor_reports_a_broken_numpy_as_a_failed_row_not_a_traceback(tmp_path, error):
    """Issue 29 (8): with numpy broken the doctor printed a traceback (its own modules import numpy)."""
    env = breaking_env(tmp_path, "numpy", error)
    for args in ((), ("--json",)):
        proc = run_cli("doctor", "--repeats", "2", *args, env=env)
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert not any(line.startswith("Error:") for line in proc.stderr.splitlines()), proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("doctor: FAILED: numpy") and "installed but does not import" in last, last
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["failures"] == ["numpy"]
    assert report["environment"]["libraries"]["numpy"]["error"].startswith(error.split("(")[0])
    proc = run_cli("doctor", "--repeats", "2", env=env)
    assert "numpy        installed but does not import: " in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("  numpy: installed but does not import")
