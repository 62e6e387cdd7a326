"""The GPU acceptance run's stages (``benchmarks/gpu_acceptance.py`` runs them and writes the report): the table
(:data:`STAGES`: each stage's cap and where its figures go), what each stage runs and reads back (:class:`StageRuns`,
one ``stage_*`` method per stage), and the tools they share (a command under a deadline, data parts, wheels)."""

from __future__ import annotations

import json
import lzma
import os
import re
import shlex
import signal
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hne_edge.demo import REFERENCE as REFERENCE_WEIGHTS  # noqa: E402  (the shipped reference, when it is)
from train_reference import EMA_AUTO, ema_setting, reference_variant  # noqa: E402  (a reference variant's one home)

DEFAULT_CAP_S = 480.0
SMOKE_CAP_FACTOR = 4.0  # --smoke: stage caps x this, and the run's cap 1800 s unless --cap-s is given
MIN_STAGE_S = 15.0  # a stage that would get less than this is not started
OBJECTIVES = ("independent", "hierarchical", "hierarchical+label")  # cifar_losses.py run names
SMOKE_REFERENCE_S = 80.0  # --smoke: the reference stage's time on the CPU (its min_s is the real run's)


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    cap_s: float | None  # the most this stage may run, seconds (None: whatever is left of the run's cap)
    where: str  # where its figures go in the docs
    default: bool = True  # in the default --stages
    min_s: float = MIN_STAGE_S  # a stage that would get less than this is "not run"


RUNTIME_GROUP = ("doctor", "gpu-tests", "bench-gpu", "record-steps", "kernels", "levers", "mobilenet")  # <= 240 s
# the ONNX Runtime GPU tests the ort-gpu stage runs: both buffer modes and fp16 (all nine took more than its time on the
# H200, 2026-11-28: 19 GPU tests in 121 s); the gpu-tests stage runs them all where onnxruntime-gpu is installed
ORT_GPU_TESTS = tuple(f"tests/runtime/test_gpu_hardware.py::{t}" for t in (
    "test_gpu_onnxruntime_cuda_every_prefix[torch-False-segments]", "test_gpu_onnxruntime_cuda_every_prefix[torch-True-segments]",
    "test_gpu_onnxruntime_cuda_fp16"))  # fmt: skip
STAGES = (
    Stage("doctor", "hne-edge doctor on this machine", 30,
          "docs/results.md 'Honest limits' and docs/gpu.md: which backends ran on which GPU (the doctor table's rows, "
          "first leaf / full tree of the tiny bundle); BENCHMARKS.md header: the GPU machine's line"),
    Stage("gpu-tests", "real-GPU tests (tests/runtime/test_gpu_hardware.py)", 30,
          "docs/results.md 'Honest limits' (GPU): which backends passed their real-GPU tests, replacing "
          "'never ran on a GPU' for those that did"),
    Stage("bench-gpu", "bench_gpu.py (hne_resnet_small, every plan, graphs on, batch 1 and 16)", 45,
          "BENCHMARKS.md 'How fast is anytime against one network on a GPU': the target table (full/fused, first/standalone, 16 indep./HNE vs MACs, misses, "
          "leaves vs the plan-achievable oracle and the even-split bound) per plan, naming the GPU; the batch model "
          "(batch 8 predicted from the profile at 1 and 16 vs measured)"),
    Stage("record-steps", "record_steps.py: every step's time per frame, mixed program, batch 1 and 16", 20,
          "tests/data/ (steps_hne_resnet_small_torch_cuda_b*.json): tests/runtime/test_deadlines.py replays every GPU "
          "trace there (misses <= 1% for subtrees and mixed); BENCHMARKS.md 'How fast is anytime against one network on a GPU': the recorded step medians"),
    Stage("kernels", "bench_kernels.py: kernels per unit (fused tree, first leaf), eager and compiled", 25,
          "BENCHMARKS.md 'Where the fused tree's time goes': kernels per class and time of the fused tree and the first leaf, "
          "graphs vs compiled units (targets on an H200: fused <= 0.6 ms, first leaf <= 0.3 ms)"),
    Stage("levers", "bench_kernels.py --levers: the fused tree and the first leaf, one lever at a time (NCHW, no "
          "autotuning, TF32, fp16, bfloat16, 1x1 as bmm, block-diagonal dense groups), every prefix vs float64, "
          "each timed against the shipped units", 35,
          "BENCHMARKS.md 'Where the fused tree's time goes': the table of levers (issue 40 item 4; what wins, within "
          "the fp32 tolerance, becomes the torch backend's default), the fused tree and the first leaf against the "
          "targets (H200: <= 0.6 ms, <= 0.3 ms)"),
    Stage("mobilenet", "bench_gpu.py (hne_mobilenetv2 224x224, every plan, batch 1 and 8)", 50,
          "BENCHMARKS.md 'How fast is anytime against one network on a GPU': the compute-bound rows (hne_mobilenetv2), next to hne_resnet_small's"),
    # not in the runtime group: it runs only with --ort-gpu-parts, in a call of its own on the H200 (its install ~12 s,
    # 3 GPU tests ~30 s, an export and the mixed row ~45 s, the step recording ~25 s)
    Stage("ort-gpu", "ONNX Runtime CUDA from wheel parts (--ort-gpu-parts): its GPU tests, bench rows, step times and "
          "levers", 150,
          "docs/results.md 'Honest limits' and docs/gpu.md: whether ONNX Runtime CUDA has run on a GPU; BENCHMARKS.md "
          "'How fast is anytime against one network on a GPU': its rows"),
    Stage("bench-train", "bench_train.py (hne_resnet_small, CUDA defaults: the loop vs the step alone, each formulation)", 35,
          "BENCHMARKS.md 'How fast does it train': the GPU rows (the loop, the step "
          "alone and their ratio; conv vs bmm; ops per step; the trainer's images/s, TFLOP/s, % of peak, utilisation), "
          "the >= 12,000 img/s target (stretch 25,000) met or not"),
    Stage("reference", "the reference HNE_small trained to a time budget (train_reference.py)", None,
          "benchmarks/ship_reference.py OUT makes it the package's pretrained model (hne_edge/assets/); RESULTS.md "
          "'CIFAR-10: the reference HNE_small on a GPU' and docs/results.md: the GPU row (held-out accuracy by n, epochs, "
          "images seen, the budget); BENCHMARKS.md: the trainer's throughput over a whole run", min_s=240),
    Stage("streams", "bench_streams.py on the GPU: cameras of 30/60/120 fps, one bursty, deadline one period, plans mixed "
          "and segments: the stream scheduler beside K runners and FIFO", 60,
          "BENCHMARKS.md 'How well does the stream scheduler serve K cameras': the GPU rows (rejected, misses, leaves, "
          "expected accuracy, p99, busy) and issue 39's targets (rejections <= 1% where FIFO misses <= 2%, misses <= 1%, "
          "expected accuracy >= both baselines)", default=False),
    Stage("losses", "L^I vs L^HD (and the normalised objective) scored on the test set", None,
          "RESULTS.md (docs/results.md) 'CIFAR-10: L^I vs L^D vs L^HD': a GPU row per objective (hne_resnet_small, "
          "the epochs used, test set, n = 1..16), and issue 22 item 3's question for GPU budgets", default=False),
)
assert sum(s.cap_s for s in STAGES if s.name in RUNTIME_GROUP) <= 240  # the plan: the runtime stages within 4 minutes


@dataclass
class StageResult:
    name: str
    title: str
    status: str = "pending"  # pending | ok | failed | timeout | skipped | not run
    seconds: float = 0.0
    summary: str = ""
    commands: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    where: str = ""


# -- running one command under a deadline ---------------------------------------------------------


def run_command(cmd: list[str], log: Path, timeout: float, *, stdout: Path | None = None,
                env: dict[str, str] | None = None) -> tuple[int | None, float]:  # fmt: skip
    """Run ``cmd`` (its own process group) with output to ``log`` (stdout to ``stdout`` if given).

    Returns (exit code, or None when it ran past ``timeout`` and its process group was stopped; seconds).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "ab") as err, open(stdout, "wb") if stdout else open(os.devnull, "wb") as out:
        err.write(f"$ {' '.join(cmd)}\n".encode())
        err.flush()
        proc = subprocess.Popen(cmd, stdout=out if stdout else err, stderr=err, cwd=REPO, start_new_session=True,
                                env={**os.environ, **(env or {})})  # fmt: skip
        try:
            code: int | None = proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code = None
    return code, time.monotonic() - started


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the stage's process group (only what this script started), SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def child_env() -> dict[str, str]:
    """Children import this checkout's hne_edge (PYTHONPATH=REPO first), whatever is installed."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


# -- CIFAR parts (the format of ../shared/tools/npz_chunks.py) --------------------------------------


def join_npz_parts(folders: list[Path], dst: Path) -> Path:
    """Join the parts that ``npz_chunks.py split`` made, spread over one or more folders, into ``dst``.

    Each folder holds some of ``part00.xz``, ``part01.xz``, ... and a copy of ``meta.npz``. The parts are the
    lzma stream of the images' left-neighbour deltas along the width, cut into pieces; the images come back
    byte-identical. Raises SystemExit naming a missing part or a folder that disagrees.
    """
    parts: dict[str, Path] = {}
    metas = []
    for folder in folders:
        if not folder.is_dir():
            raise SystemExit(f"--cifar-parts: received {folder}, which is not a folder; expected folders of part*.xz")
        for part in sorted(folder.glob("part*.xz")):
            if part.name in parts and parts[part.name].read_bytes() != part.read_bytes():
                raise SystemExit(f"--cifar-parts: {part.name} is in two folders with different bytes ({parts[part.name]}, {part})")
            parts[part.name] = part
        if (folder / "meta.npz").is_file():
            metas.append(folder / "meta.npz")
    if not parts or not metas:
        raise SystemExit(f"--cifar-parts: no part*.xz and meta.npz under {[str(f) for f in folders]}; "
                         "expected the output of npz_chunks.py split")  # fmt: skip
    expected = [f"part{i:02d}.xz" for i in range(len(parts))]
    if sorted(parts) != expected:
        missing = sorted(set(expected) - set(parts)) or sorted(parts)
        raise SystemExit(f"--cifar-parts: received {sorted(parts)}; expected {expected} (missing or extra: {missing})")
    with np.load(metas[0]) as meta:
        arrays = {k: meta[k] for k in meta.files}
    for other in metas[1:]:
        with np.load(other) as meta:
            if set(meta.files) != set(arrays) or any(not np.array_equal(meta[k], arrays[k]) for k in arrays):
                raise SystemExit(f"--cifar-parts: {other} differs from {metas[0]}; the parts come from different splits")
    shape = tuple(int(s) for s in arrays.pop("x_shape"))
    blob = b"".join(parts[name].read_bytes() for name in expected)
    delta = np.frombuffer(lzma.decompress(blob), np.uint8).reshape(shape)
    x = np.cumsum(delta, axis=2, dtype=np.uint8)  # undoes the delta modulo 256
    dst.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dst, x=x, **arrays)
    return dst


def split_npz_parts(src: Path, folders: list[Path]) -> None:
    """``npz_chunks.py split``'s format, cut into one part per folder (the smoke run's stand-in for real parts)."""
    with np.load(src) as data:
        x = data["x"]
        meta = {k: data[k] for k in data.files if k != "x"}
    blob = lzma.compress(np.diff(x.astype(np.int16), axis=2, prepend=0).astype(np.uint8).tobytes(), preset=6)
    step = -(-len(blob) // len(folders))
    for i, folder in enumerate(folders):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"part{i:02d}.xz").write_bytes(blob[i * step : (i + 1) * step])
        np.savez(folder / "meta.npz", x_shape=np.array(x.shape), **meta)


def data_file(path: str | None, parts: list[str] | None, out: Path, name: str) -> Path | None:
    """An .npz given as a file, or joined from parts folders into ``out/name``; None when neither was given."""
    if path:
        if not Path(path).is_file():
            raise SystemExit(f"received {path}, which is not a file; expected an .npz (x: N,H,W,C uint8; y: N)")
        return Path(path)
    if parts:
        return join_npz_parts([Path(p) for p in parts], out / name)
    return None


def synthetic_cifar(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, n))
    return path


def junit_counts(junit: Path, log: Path | None = None) -> dict:
    """passed / failed / skipped, the failed tests' names and the skip reasons of a pytest --junitxml file; without
    one (pytest cut off before it wrote it), what a ``-v`` run printed in ``log`` for each test that ended."""
    counts: dict = {"passed": 0, "failed": 0, "skipped": 0, "failed_tests": [], "skip_reasons": []}
    if not junit.is_file():
        text = log.read_text(errors="replace") if log is not None and log.is_file() else ""
        for test, outcome in re.findall(r"^\S+::(\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.M):
            key = {"PASSED": "passed", "SKIPPED": "skipped"}.get(outcome, "failed")
            counts[key] += 1
            if key == "failed":
                counts["failed_tests"].append(test)
        return counts
    reasons = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failed_tests"].append(case.get("name", "?"))
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reasons.add(skip.get("message", ""))
        else:
            counts["passed"] += 1
    counts["skip_reasons"] = sorted(reasons)
    return counts


def install_wheel(python: str, wheel: Path, target: Path) -> str:
    """``pip install --no-deps --no-index --target`` (what the stage does with onnxruntime-gpu); where this Python
    has no pip, the wheel unpacked by hand (a wheel is a zip: its root and ``*.data/purelib|platlib`` are the
    package files). Returns how it was installed."""
    import zipfile

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    try:
        proc = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                               "--quiet", "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)  # fmt: skip
        if proc.returncode == 0:
            return "pip install --no-deps --target"
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:160]
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"{type(exc).__name__}: {exc}"[:160]
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not needed to import the package
                parts = parts[2:]
            dest = target.joinpath(*parts)
            if info.is_dir() or not parts or ".." in parts:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(dest, mode)
    return f"unzipped (pip failed: {why})"


def staged_wheel(python: str, folders: list[Path], work: Path) -> tuple[str, Path, str]:
    """(the wheel's name, the folder it is installed in, how): onnxruntime-gpu from its parts (``wheel_parts.py``),
    joined and installed into ``work/ort_gpu`` once: a later call with the same ``--work`` and the same wheel (its
    sha256, from the parts' ``.sha256`` file) reuses it, without joining the 209 MiB stream again."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from wheel_parts import join_wheel, scan_parts

    name, _, digest = scan_parts(folders)
    target, stamp = work / "ort_gpu", work / "ort_gpu.installed.json"
    staged = {"wheel": name, "sha256": digest}
    if digest is not None and target.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == staged:
        return name, target, "reused: installed by an earlier call"
    stamp.unlink(missing_ok=True)
    wheel = join_wheel(folders, work / "wheels")
    how = install_wheel(python, wheel, target)
    wheel.unlink()  # installed: the 255 MB file is not needed again
    stamp.write_text(json.dumps(staged))
    return name, target, how


# -- the stages -----------------------------------------------------------------------------------


class StageRuns:
    """The stages, one method each (``stage_doctor`` for stage ``doctor``): what :class:`gpu_acceptance.Run` calls
    with the stage's result to fill and the seconds it may take. The run provides ``args``, ``out``, ``work``,
    ``py``, ``env``, ``left()``, ``raw()``, ``command()``, the data sets ``train_npz`` / ``test_npz`` (None: not
    given) and ``data_errors`` (why one given could not be prepared)."""

    def _data_failed(self, result: StageResult, *needs: str) -> bool:
        """The stage fails with the reason when a data set it needs was given but could not be prepared."""
        errors = [self.data_errors[n] for n in needs if n in getattr(self, "data_errors", {})]
        if errors:
            result.status, result.summary = "failed", "; ".join(errors)
        return bool(errors)

    # 1 --------------------------------------------------------------------------------------------
    def stage_doctor(self, result: StageResult, budget: float) -> None:
        report = self.raw("doctor.json")
        # 5 repeats: the H200 took 32 s with 20, over this stage's 30 s (the doctor reports its times, never judges them)
        cmd = [self.py, "-m", "hne_edge", "doctor", "--json", "--repeats", "3" if self.args.smoke else "5"]
        code = self.command(result, cmd + (["--no-export"] if self.args.smoke else []), budget, stdout=report)
        if code is None:
            result.status, result.summary = "timeout", f"doctor ran past {budget:.0f} s"
            return
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            result.status, result.summary = "failed", f"exit {code}, no JSON report: {_tail(self.out / 'logs' / 'doctor.log')}"
            return
        checks = data["checks"]
        result.figures = {
            "gpus": data["environment"]["gpus"],
            "checks": [{k: c[k] for k in ("label", "ok", "first_leaf_ms", "full_tree_ms", "max_error", "bound", "error")}
                       for c in checks],  # fmt: skip
            "absent": data["absent"],
        }
        gpus = ", ".join(g["name"] for g in data["environment"]["gpus"]) or "no GPU"
        passed = sum(c["ok"] for c in checks)
        result.status = "ok" if code == 0 and data["ok"] else "failed"
        result.summary = f"{passed}/{len(checks)} checks passed on {gpus}; absent: " + (
            ", ".join(f"{a['backend']} {a['device']}" for a in data["absent"]) or "none")
        if data["failures"]:
            result.summary += "; FAILED: " + "; ".join(data["failures"])

    # 2 --------------------------------------------------------------------------------------------
    def stage_gpu_tests(self, result: StageResult, budget: float) -> None:
        junit = self.raw("gpu_tests.xml")
        cmd = [self.py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/runtime/test_gpu_hardware.py",
               "-m", "gpu or tensorrt", f"--junitxml={junit}"]  # fmt: skip
        code = self.command(result, cmd, budget)
        if code is None:
            result.status, result.summary = "timeout", f"the GPU tests ran past {budget:.0f} s"
            return
        counts = junit_counts(junit)
        failed, skip_reasons = counts.pop("failed_tests"), counts.pop("skip_reasons")
        result.figures = {**counts, "failed_tests": failed, "skip_reasons": skip_reasons}
        result.status = "ok" if code == 0 else "failed"
        result.summary = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped" + (
            f" ({'; '.join(sorted(skip_reasons))[:200]})" if counts["skipped"] else "") + (
            f"; failed: {', '.join(failed[:8])}" if failed else "") + ("" if junit.is_file() else f"; exit {code}")  # fmt: skip

    # 3 --------------------------------------------------------------------------------------------
    def stage_bench_gpu(self, result: StageResult, budget: float) -> None:
        if self.args.smoke:
            extra = ["--device", "cpu", "--smoke", "--models", "hne_tiny"]
        else:  # the plans whose deadlines the H200 missed first; 200 frames: a miss rate to 0.5%
            extra = ["--models", "hne_resnet_small", "--plans", "mixed,subtrees,segments,fused", "--graphs", "on",
                     "--warmup", "5", "--repeats", "30", "--profile-repeats", "10", "--frames", "200"]  # fmt: skip
        self.bench_gpu_rows(result, budget, "bench_gpu", extra)

    def bench_gpu_rows(self, result: StageResult, budget: float, name: str, extra: list[str], *, env: dict | None = None,
                       prefix: list[str] | None = None) -> None:  # fmt: skip
        """Run bench_gpu.py (its rows written as they come: a timeout keeps them) and report its table."""
        md = self.raw(f"{name}.md")
        cmd = [*(prefix or [self.py]), "benchmarks/bench_gpu.py", "--out", str(md), "--workdir", str(self.work / "bundles"), *extra]
        code = self.command(result, cmd, budget, env=env, log=name)
        log = self.out / "logs" / f"{name}.log"
        rows_file = md.with_suffix(".json")
        if not rows_file.is_file():
            skipped = "skipped" in _tail(log, 5)
            result.status = "timeout" if code is None else ("skipped" if code == 0 and skipped else "failed")
            result.summary = (f"bench_gpu ran past {budget:.0f} s before its first row: {_tail(log, 2)}" if code is None
                              else _tail(log, 2))  # fmt: skip
            return
        data = json.loads(rows_file.read_text())
        rows = data["rows"]
        result.figures = {"where": data["where"], "rows": rows, "markdown": md.read_text()}
        errors = [r for r in rows if "error" in r]
        result.status = "timeout" if code is None else ("ok" if code == 0 and not errors else "failed")
        def line(r: dict) -> str:
            text = f"{r['backend']}/{r.get('plan')}/b{r['batch']}: full/fused {r['full_vs_fused']:.2f}x"
            if "miss_rate" in r:
                text += f", misses {100 * r['miss_rate']:.1f}%, {100 * r['leaves_vs_oracle']:.0f}% of the oracle"
            return text

        result.summary = (f"{len(rows)} rows on {data['where']}" + (f" (cut off at {budget:.0f} s)" if code is None else "")
                          + "; " + "; ".join(line(r) for r in rows if "full_vs_fused" in r)[:600]
                          + (f"; {len(errors)} failed: {errors[0]['error'][:200]}" if errors else ""))  # fmt: skip
        sec = rows[0].get("seconds")
        if sec:  # where the first row's time went: what a stage cut off by its cap needs cut next
            result.summary += (f"; first row: bundle {sec['bundle']:.1f} s, open {sec['open']:.1f} s (warm-up "
                               f"{sec['warmup']:.1f} s), profile {sec['profile']:.1f} s, row {sec['row']:.1f} s")  # fmt: skip

    # 4 --------------------------------------------------------------------------------------------
    def stage_record_steps(self, result: StageResult, budget: float) -> None:
        """Every step's time per frame on this GPU (mixed program, batch 1 and 16): the traces the deadline tests replay."""
        cmd = [self.py, "benchmarks/record_steps.py", "--out", str(self.out), "--workdir", str(self.work / "bundles"),
               "--seconds", str(max(budget - 6, 3))]  # fmt: skip
        if self.args.smoke:
            cmd += ["--backend", "torch", "--device", "cpu", "--batches", "1,4", "--smoke"]
        else:
            cmd += ["--backend", "torch", "--device", "cuda", "--batches", "1,16", "--frames", "400"]
        code = self.command(result, cmd, budget)
        files = sorted(self.out.glob("steps_*.json"))
        figures = {}
        for f in files:
            d = json.loads(f.read_text())
            t = np.asarray(d["frames_ms"])
            names = [st["name"] for st in d["steps"]]
            med = np.median(t, axis=0) if len(t) else np.zeros(len(names))
            figures[f.name] = {"frames": len(t), "batch": d["batch"], "backend": d["backend"],
                               "first_leaf_ms": round(float(med[0]), 4), "fused_ms": round(float(med[names.index("fused/tree.onnx")]), 4),
                               "leaf_by_leaf_ms": round(float(med[:16].sum()), 4),
                               "entry_ms_p50_p99": [round(float(v), 4) for v in np.quantile(d["entry_ms"] or [0], [0.5, 0.99])],
                               "step_p99_over_median_max": round(float((np.quantile(t, 0.99, axis=0) / med).max()), 3) if len(t) else None}  # fmt: skip
        result.figures = {"files": figures}
        result.status = "timeout" if code is None else ("ok" if code == 0 and files else "failed")
        result.summary = ("; ".join(f"{k}: {v['frames']} frames, first leaf {v['first_leaf_ms']:.3f} ms, fused {v['fused_ms']:.3f} ms, "
                                    f"entry p50/p99 {v['entry_ms_p50_p99'][0]:.3f}/{v['entry_ms_p50_p99'][1]:.3f} ms"
                                    for k, v in figures.items()) or _tail(self.out / "logs" / "record-steps.log", 2))  # fmt: skip

    # 5 --------------------------------------------------------------------------------------------
    def stage_kernels(self, result: StageResult, budget: float) -> None:
        """Kernels per unit (fused tree, first leaf) and the ops per plan; then the compiled units with what is left."""
        t_end = time.monotonic() + budget
        base = [self.py, "benchmarks/bench_kernels.py", "--workdir", str(self.work / "bundles")]
        base += ["--device", "cpu", "--smoke"] if self.args.smoke else ["--device", "cuda"]
        md, compiled_md = self.raw("kernels.md"), self.raw("kernels_compiled.md")
        first = min(budget * 0.6, 15 * (SMOKE_CAP_FACTOR if self.args.smoke else 1))  # the rest: the compiled units
        code = self.command(result, base + ["--out", str(md)], first, log="kernels")
        no_inductor = {"TORCHDYNAMO_DISABLE": "1"} if self.args.smoke else None  # --smoke: the code path, not inductor's minutes
        result.summary = ""
        code2 = self.command(result, base + ["--compile-only", "--out", str(compiled_md)], max(t_end - time.monotonic(), 1),
                             env=no_inductor, log="kernels-compiled")  # fmt: skip
        parts = {}
        for label, path, c in (("units", md, code), ("compiled", compiled_md, code2)):
            j = path.with_suffix(".json")
            parts[label] = {"status": "timeout" if c is None else ("ok" if c == 0 and j.is_file() else "failed")}
            if j.is_file():
                parts[label].update(json.loads(j.read_text()))
                parts[label]["markdown"] = path.read_text()
        result.figures = parts
        units = parts["units"].get("units", []) + parts["compiled"].get("units", [])
        # the units table is the stage's result; the per-plan counts and the compiled units are added when time allows
        result.status = "ok" if [u for u in parts["units"].get("units", []) if "error" not in u] else parts["units"]["status"]
        if parts["units"]["status"] != "ok" and result.status == "ok":
            result.summary = f"(per-plan counts {parts['units']['status']}: {', '.join(parts['units'].get('per_plan', {})) or 'none'} done) "
        result.summary += "; ".join(
            f"{u['unit']}{' compiled' if u['compiled'] else ''}: " + (u["error"][:120] if "error" in u else
            f"{u['ms']:.3f} ms, {u.get('kernels', u.get('ops'))} {'kernels' if 'kernels' in u else 'ops'}, error {u['max_error_vs_float64']:.1e}")
            for u in units) + (f"; compiled: {parts['compiled']['status']}" if parts["compiled"]["status"] != "ok" else "")  # fmt: skip
        result.summary += " (compile: dynamo disabled in --smoke)" if self.args.smoke else ""

    # 6 --------------------------------------------------------------------------------------------
    def stage_levers(self, result: StageResult, budget: float) -> None:
        """The fused tree and the first leaf, one lever at a time, checked against float64, timed against the shipped."""
        md = self.raw("levers.md")
        cmd = [self.py, "benchmarks/bench_kernels.py", "--levers", "--out", str(md)]
        cmd += ["--device", "cpu", "--smoke"] if self.args.smoke else ["--device", "cuda", "--repeats", "100"]
        if not self.args.smoke and REFERENCE_WEIGHTS.is_file():  # a trained model's activations and logits
            cmd += ["--checkpoint", str(REFERENCE_WEIGHTS)]
        code = self.command(result, cmd, budget, log="levers")
        j = md.with_suffix(".json")
        rows = json.loads(j.read_text()).get("levers", []) if j.is_file() else []
        result.figures = {"rows": rows, "markdown": md.read_text() if md.is_file() else ""}
        timed = [r for r in rows if "ms" in r]
        result.status = "timeout" if code is None else ("ok" if code == 0 and timed else "failed")
        summary = []
        for unit in ("fused tree", "first leaf"):
            mine = [r for r in timed if r["unit"] == unit]
            right = [r for r in mine if not r["wrong"]]
            if mine:
                best = min(right or mine, key=lambda r: r["ms"])
                summary.append(f"{unit}: shipped {mine[0]['ms']:.3f} ms, fastest right {best['lever']} "
                               f"{best['ms']:.3f} ms ({best['vs_shipped']:.2f}x)")  # fmt: skip
        wrong = sorted({r["lever"] for r in rows if r.get("wrong")})
        failed = sorted({r["lever"] for r in rows if "error" in r})
        result.summary = "; ".join(summary + ([f"wrong: {', '.join(wrong)}"] if wrong else [])
                                   + ([f"failed: {', '.join(failed)}"] if failed else [])) or _tail(
                                       self.out / "logs" / "levers.log", 2)  # fmt: skip

    # 7 --------------------------------------------------------------------------------------------
    def stage_mobilenet(self, result: StageResult, budget: float) -> None:
        """The compute-bound regime users deploy: hne_mobilenetv2 at 224x224, batch 1 and 8, every plan."""
        if self.args.smoke:
            extra = ["--device", "cpu", "--smoke", "--models", "hne_tiny", "--batches", "1,8", "--plans", "mixed,fused"]
        else:
            extra = ["--models", "hne_mobilenetv2", "--batches", "1,8", "--plans", "mixed,subtrees,segments,fused", "--graphs", "on",
                     "--warmup", "3", "--repeats", "10", "--profile-repeats", "5", "--frames", "60", "--no-batch-check",
                     "--capture-sizes", "1,8"]  # fmt: skip  (graphs for the sizes measured: half the captures at open)
        self.bench_gpu_rows(result, budget, "mobilenet", extra)

    # 8 --------------------------------------------------------------------------------------------
    def stage_ort_gpu(self, result: StageResult, budget: float) -> None:
        """onnxruntime-gpu from wheel parts, installed once (``staged_wheel``) and first on the children's PYTHONPATH;
        every child started through ort_gpu_child.py (torch, then onnxruntime.preload_dlls()): a probe, a subset of the
        real-GPU tests (ORT_GPU_TESTS), the mixed plan's bench row, then every step's time frame by frame (the trace
        tests/runtime/test_deadlines.py replays, with the first-leaf file's time: raw/ort_steps/). Each part gets a share
        of what is left, so a part that runs over leaves the next its time and the stage reports what ended."""
        if not self.args.ort_gpu_parts:
            result.status, result.summary = "skipped", "no --ort-gpu-parts given (onnxruntime-gpu is not installed here)"
            return
        t_end = time.monotonic() + budget
        left = lambda: t_end - time.monotonic()  # noqa: E731
        name, target, installed = staged_wheel(self.py, [Path(p) for p in self.args.ort_gpu_parts], self.work)
        env = {"PYTHONPATH": os.pathsep.join([str(target), str(REPO), os.environ.get("PYTHONPATH", "")])}
        child = [self.py, str(REPO / "benchmarks" / "ort_gpu_child.py")]
        probe_file = self.raw("ort_gpu_probe.json")
        self.command(result, child + ["--probe", str(probe_file)], max(min(30.0, left()), 1), env=env, log="ort-gpu-probe")
        probe = json.loads(probe_file.read_text()) if probe_file.is_file() else {"error": _tail(self.out / "logs" / "ort-gpu-probe.log")}
        staged = str(probe.get("onnxruntime_found", "")).startswith(str(target))
        junit = self.raw("ort_gpu_tests.xml")
        tests = [*child, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", *ORT_GPU_TESTS, f"--junitxml={junit}"]
        code = self.command(result, tests, max(left() * 0.3, 1), env=env, log="ort-gpu-tests")
        counts = junit_counts(junit, self.out / "logs" / "ort-gpu-tests.log")
        bench = StageResult("ort-gpu-bench", "")
        extra = (["--device", "cpu", "--smoke", "--models", "hne_tiny", "--plans", "segments", "--batches", "1"] if self.args.smoke else
                 ["--backends", "onnxruntime", "--models", "hne_resnet_small", "--plans", "mixed", "--batches", "1", "--graphs", "on",
                  "--warmup", "3", "--repeats", "10", "--profile-repeats", "5", "--frames", "100", "--no-batch-check"])  # fmt: skip
        self.bench_gpu_rows(bench, max(left() * 0.6, 1), "ort_gpu_bench", extra, env=env, prefix=child)
        result.commands += bench.commands
        result.logs += [x for x in bench.logs if x not in result.logs]
        steps_dir = self.raw("ort_steps")  # in raw.tar.gz: a GPU machine hands back at most 8 files
        steps_dir.mkdir(exist_ok=True)
        share = left() * 0.6  # the rest: the levers
        record = [*child, "benchmarks/record_steps.py", "--backend", "onnxruntime", "--batches", "1", "--out", str(steps_dir),
                  "--workdir", str(self.work / "bundles"), "--seconds", f"{max(share - 12, 3):.0f}"]  # fmt: skip
        record += ["--device", "cpu", "--smoke"] if self.args.smoke else ["--device", "cuda", "--frames", "300"]
        code_steps = self.command(result, record, max(share, 1), env=env, log="ort-gpu-steps")
        levers_md = self.raw("ort_levers.md")  # issue 40 item 3: CUDA graph, NHWC, the search, TF32, each vs shipped
        levers = [*child, "benchmarks/bench_kernels.py", "--levers", "--backend", "onnxruntime", "--workdir",
                  str(self.work / "bundles"), "--out", str(levers_md)]  # fmt: skip
        levers += ["--device", "cpu", "--smoke"] if self.args.smoke else ["--device", "cuda", "--repeats", "50"]
        code_levers = self.command(result, levers, max(left(), 1), env=env, log="ort-gpu-levers")
        levers_json = levers_md.with_suffix(".json")
        lever_rows = json.loads(levers_json.read_text()).get("levers", []) if levers_json.is_file() else []
        traces = {}
        for f in sorted(steps_dir.glob("steps_*.json")):
            d = json.loads(f.read_text())
            t = np.asarray(d["frames_ms"])
            traces[f.name] = {"frames": len(t), "leaf0_ms": round(float(np.median(t[:, 0])), 4) if len(t) else None,
                              "first_leaf_file_ms": round(float(np.median(d["first_ms"])), 4) if d.get("first_ms") else None}  # fmt: skip
        result.figures = {"wheel": name, "installed_with": installed, "probe": probe, "staged_onnxruntime_imported": staged,
                          "tests": counts, "bench": {"status": bench.status, "summary": bench.summary, **bench.figures},
                          "steps": traces, "levers": {"status": "timeout" if code_levers is None else
                                                      ("ok" if code_levers == 0 else "failed"), "rows": lever_rows,
                                                      "markdown": levers_md.read_text() if levers_md.is_file() else ""}}  # fmt: skip
        steps_ok = code_steps == 0 and bool(traces)
        ok = staged and code == 0 and counts["failed"] == 0 and bench.status == "ok" and steps_ok
        cut = code is None or bench.status == "timeout" or code_steps is None
        result.status = "ok" if ok else ("timeout" if cut and staged and counts["failed"] == 0 else "failed")
        result.summary = (f"{name} ({installed}); children import onnxruntime {probe.get('onnxruntime', '?')} from "
                          f"{'the staged wheel' if staged else probe.get('onnxruntime_found', '?')}, providers "
                          f"{probe.get('providers', '?')}, preload_dlls {probe.get('preload_dlls', '?')}; tests"
                          f"{' (cut off)' if code is None else ''}: {counts['passed']} passed, {counts['failed']} failed, "
                          f"{counts['skipped']} skipped; bench: {bench.summary[:300]}; steps"
                          f"{' (cut off)' if code_steps is None else ''}: "
                          + ("; ".join(f"{k}: {v['frames']} frames, leaf 0's segment {v['leaf0_ms']} ms, first-leaf file "
                                       f"{v['first_leaf_file_ms']} ms" for k, v in traces.items()) or "none")
                          + f"; levers{' (cut off)' if code_levers is None else ''}: "
                          + ("; ".join(f"{r['lever'].split(' (')[0]} {r['unit']} {r['vs_shipped']:.2f}x"
                                       + (" WRONG" if r.get("wrong") else "") for r in lever_rows if "ms" in r) or "none"))  # fmt: skip

    # 9 --------------------------------------------------------------------------------------------
    def stage_bench_train(self, result: StageResult, budget: float) -> None:
        out = self.raw("bench_train.json")  # its figures are all in acceptance.json too
        cmd = [self.py, "benchmarks/bench_train.py", "--pointwise", "conv,bmm", "--json", str(out),
               "--budget-s", f"{max(budget - 5, 5):.0f}"]  # fmt: skip  (its own clock starts after the interpreter's)
        if self.args.smoke:
            cmd += ["--device", "cpu", "--model", "hne_tiny", "--batch", "16", "--limit", "32", "--epochs", "1",
                    "--threads", "1", "--pairs", "1", "--step-seconds", "0.3"]  # fmt: skip
        else:  # the trainer's CUDA defaults (batch 512, bf16, channels-last); 25 steps an epoch
            cmd += ["--device", "cuda", "--model", "hne_resnet_small", "--limit", "12800", "--epochs", "2", "--pairs", "3"]
        train = getattr(self, "train_npz", None)
        cmd += ["--data", str(train)] if train else ["--data", ""]  # "": synthetic CIFAR-shaped images (throughput only)
        lost = getattr(self, "data_errors", {}).get("train_npz")  # its throughput does not need CIFAR: it runs, and says so
        code = self.command(result, cmd, budget)
        try:
            figures = json.loads(out.read_text())
        except (OSError, ValueError):
            figures = None
        if figures is None:
            result.status = "timeout" if code is None else "failed"
            result.summary = f"no figures ({'ran past ' + str(round(budget)) + ' s' if code is None else f'exit {code}'}): " + \
                _tail(self.out / "logs" / "bench-train.log")
            return
        result.figures = figures
        result.status = "ok" if code == 0 else ("timeout" if code is None else "failed")
        parts = []
        if "loop_vs_step" in figures:
            parts.append(f"loop / step {figures['loop_vs_step']:.2f} (overhead {figures['overhead_pct']:.0f}%)")
        for mode, st in figures.get("step", {}).items():
            if "images_per_s" in st:
                parts.append(f"step {mode} {st['images_per_s']:,.0f} img/s, {st['ops']} ops")
        if "bmm_vs_conv" in figures:
            parts.append(f"bmm / conv {figures['bmm_vs_conv']:.2f}")
        if figures.get("loop"):
            lp = figures["loop"]
            util = f", GPU {lp['utilisation_pct']:.0f}%" if lp.get("utilisation_pct") is not None else ""
            parts.append(f"fit {lp['images_per_s']:,.0f} img/s, {lp['tflops']:.2f} TFLOP/s{util}")
        parts += [f"not measured: {n}" for n in figures.get("not_measured", [])]
        result.summary = f"batch {figures.get('batch')}: " + "; ".join(parts) + (" (--smoke: CPU, hne_tiny)" if self.args.smoke else "")
        result.summary += f" (on synthetic images: {lost})" if lost else ""

    # 10 -------------------------------------------------------------------------------------------
    def stage_reference(self, result: StageResult, budget: float) -> None:
        if self.args.smoke:
            budget = min(budget, SMOKE_REFERENCE_S)
        t_end = time.monotonic() + budget
        train = getattr(self, "train_npz", None)
        if self._data_failed(result, "train_npz"):
            return
        if train is None:
            result.status = "skipped"
            result.summary = "no CIFAR training data given (--cifar or --cifar-parts)"
            return
        objectives = self.args.reference_objectives
        runs: dict[str, dict] = {}
        for i, objective in enumerate(objectives):
            share = (t_end - time.monotonic()) / (len(objectives) - i)  # an equal share of what is left
            # the first at OUT's top, the second one folder down; later ones in scratch, their record in raw.tar.gz
            # (a GPU machine hands back 8 files: the report's 3, the first run's 3, the second's checkpoint and record)
            folder = self.out if i == 0 else (self.out if i == 1 else self.work / "reference-out") / objective
            grace = 5.0 if self.args.smoke else 10.0  # it ends by its deadline; at the share's end SIGTERM, and it writes its record
            loss, options = reference_variant(objective, self.args.reference_ema)
            cmd = [self.py, "benchmarks/train_reference.py", "--data", str(train), "--out", str(folder),
                   "--run-dir", str(self.work / f"reference-{objective}"), "--objective", loss,
                   "--deadline", f"{time.time() + share - grace:.1f}",
                   "--parent-command", shlex.join([Path(sys.executable).name, *sys.argv])]  # fmt: skip
            if i:
                cmd += ["--no-config-file"]  # OUT keeps to 8 files: the config is in the record
            if self.args.smoke:  # a reserve of a sixth of the share: a time budget's plan is fixed from its first
                # seconds, and a CPU that slows after it overran the plan by 3 % alone and by 13 % under a test suite
                cmd += ["--device", "cpu", "--model", "hne_tiny", "--batch-size", "32", "--limit", "96", "--threads", "1",
                        "--eval-every", "1", "--reserve-s", f"{max(4.0, share / 6):.0f}"]  # fmt: skip
            else:
                cmd += ["--device", "cuda"]
            cmd += options  # the variant's recipe options, after the defaults they change
            code = self.command(result, cmd, share, log="reference")
            runs[objective] = self._reference_result(folder, code, share, "" if i == 0 else f"{objective}/")
            if i > 1 and (folder / "record.json").is_file():
                shutil.copy2(folder / "record.json", self.raw(f"reference-{objective}.json"))
                runs[objective]["files"] = [f"raw.tar.gz: raw/reference-{objective}.json (its checkpoint stayed in "
                                            f"{folder})"]  # fmt: skip
        result.figures = {"objectives": runs}
        statuses = {r["status"] for r in runs.values()}
        result.status = "ok" if statuses == {"ok"} else ("timeout" if statuses <= {"ok", "timeout", "stopped"} else "failed")

        def line(objective: str, r: dict) -> str:
            if r["status"] not in ("ok", "partial"):
                return f"{objective}: {r['status']}" + (f" ({r.get('error', '')[:200]})" if r.get("error") else "")
            acc = r.get("accuracy_pct") or {}
            shown = " / ".join(f"n={n} {acc[str(n)]:.1f}%" for n in (1, 2, 4, 8, 16) if str(n) in acc)
            why = f" (stopped by {r.get('error', '')[:300]})" if r["status"] == "partial" and r.get("error") else ""
            return (f"{objective}: {r['status']}, {r.get('epochs') or 0:.1f} epochs, {r.get('images_seen') or 0:,} images at "
                    f"{r.get('images_per_s') or 0:,.0f} img/s; held out {shown}{why}")  # fmt: skip

        result.summary = "; ".join(line(o, r) for o, r in runs.items()) + (" (--smoke: CPU, hne_tiny)" if self.args.smoke else "")

    @staticmethod
    def _reference_result(folder: Path, code: int | None, allowed: float, where: str) -> dict:
        try:
            record = json.loads((folder / "record.json").read_text())
        except (OSError, ValueError):
            return {"status": "timeout" if code is None else "failed", "seconds_allowed": round(allowed),
                    "error": f"no record.json (exit {code})"}  # fmt: skip
        status = record.get("status", "failed")
        if code is None and status in ("starting", "training"):
            status = "timeout"
        return {"status": status, "error": record.get("error"), "epochs": record.get("epochs"),
                "images_seen": record.get("images_seen"), "accuracy_pct": record.get("accuracy_pct"),
                "images_per_s": (record.get("throughput") or {}).get("images_per_s_mean"),
                "time_budget_s": record.get("time_budget_s"), "seconds": record.get("seconds"),
                "files": [f"{where}{name}" for name in ("checkpoint.pt", "config.yaml", "record.json") if (folder / name).is_file()]}  # fmt: skip

    # 11 -------------------------------------------------------------------------------------------
    def stage_streams(self, result: StageResult, budget: float) -> None:
        """The stream scheduler where it matters (issue 39): several cameras of different rates on one GPU, one of
        them bursty, each deadline one frame period, against K runners and one FIFO runner; plans mixed, then
        segments, each with half the budget. The rows and the targets' verdicts come back."""
        t_end = time.monotonic() + budget
        plans = ("mixed", "segments")
        rows, verdicts, statuses = {}, [], []
        for i, plan in enumerate(plans):
            md = self.raw(f"streams_{plan}.md")
            cmd = [self.py, "benchmarks/bench_streams.py", "--workdir", str(self.work / "bundles"), "--out", str(md),
                   "--plan", plan, "--overload-fps", "0"]  # fmt: skip
            if self.args.smoke:
                cmd += ["--smoke", "--device", "cpu", "--rates", "30,60", "--burst", "3"]
            else:
                cmd += ["--device", "cuda", "--streams", "3,6", "--rates", "30,60,120", "--burst", "4", "--seconds", "3",
                        "--repeats", "1", "--methods", "runners,fifo,scheduler"]  # fmt: skip
            timeout = max((t_end - time.monotonic()) / (len(plans) - i), 1)
            code = self.command(result, cmd, timeout, log=f"streams-{plan}")
            j = md.with_suffix(".json")
            statuses.append("timeout" if code is None else ("ok" if code == 0 and j.is_file() else "failed"))
            if j.is_file():
                rows[plan] = json.loads(j.read_text())
                verdicts += [f"{plan}: {line[2:]}" for line in md.read_text().splitlines() if line.startswith("- ")]
        result.figures = {"rows": rows, "verdicts": verdicts}
        result.status = "ok" if set(statuses) == {"ok"} else ("timeout" if "failed" not in statuses else "failed")
        missed = [v for v in verdicts if v.endswith("MISSED")]
        result.summary = (f"{sum(len(r) for r in rows.values())} rows ({', '.join(f'{p}: {s}' for p, s in zip(plans, statuses))}); "
                          + (f"{len(missed)} of {len(verdicts)} targets missed: " + "; ".join(missed)[:500] if missed
                             else f"all {len(verdicts)} targets met" if verdicts else "no targets judged"))  # fmt: skip

    # 12 -------------------------------------------------------------------------------------------
    def stage_losses(self, result: StageResult, budget: float) -> None:
        t_end = time.monotonic() + budget
        a = self.args
        train, test = getattr(self, "train_npz", None), getattr(self, "test_npz", None)
        if self._data_failed(result, "train_npz", "test_npz"):
            return
        if train is None or test is None:
            result.status = "skipped"
            result.summary = "no CIFAR training data and test set given (--cifar/--cifar-parts and --test-data/--test-parts)"
            return
        out = self.out / "losses"
        base = [self.py, "benchmarks/cifar_losses.py", "--data", str(train), "--test-data", str(test), "--val-split", "0",
                "--epochs", str(a.loss_epochs), "--out", str(out)]  # fmt: skip
        if a.smoke:
            base += ["--model", "slim", "--device", "cpu", "--threads", "1"]
        else:
            base += ["--model", a.loss_model, "--device", "cuda", "--threads", "4"]
        base += ["--limit", str(a.loss_limit)] if a.loss_limit else []
        runs: dict[str, dict] = {}
        for i, objective in enumerate(a.objectives):
            timeout = (t_end - time.monotonic()) / (len(a.objectives) - i)  # an equal share of what is left
            code = self.command(result, base + ["--runs", objective], timeout, log=f"losses-{objective}")
            metrics = out / objective / "test_metrics.json"
            if code is None:
                runs[objective] = {"status": "timeout", "seconds_allowed": round(timeout)}
            elif code != 0 or not metrics.is_file():
                runs[objective] = {"status": "failed", "error": _tail(self.out / "logs" / f"losses-{objective}.log")}
            else:
                m = json.loads(metrics.read_text())
                acc = {row["n"]: 100 * row["accuracy"] for row in m["anytime"]}
                runs[objective] = {"status": "ok", "images": m.get("num_images"), "epochs": a.loss_epochs,
                                   "accuracy_pct": {str(n): round(acc[n], 2) for n in (1, 2, 4, 8, 16) if n in acc},
                                   "train_wall_s": round(m.get("train_wall_s", 0), 1)}  # fmt: skip
        done = [o for o, r in runs.items() if r["status"] == "ok"]
        if done:
            self.command(result, base + ["--summary-only", "--runs", *done], max(t_end - time.monotonic(), 30), log="losses-summary")
        result.figures = {"objectives": runs, "summary": "losses/summary.md" if (out / "summary.md").is_file() else None}
        statuses = {r["status"] for r in runs.values()}
        result.status = "ok" if statuses == {"ok"} else ("timeout" if "failed" not in statuses else "failed")
        result.summary = "; ".join(
            f"{o}: " + (" / ".join(f"n={n} {v:.1f}%" for n, v in r["accuracy_pct"].items()) if r["status"] == "ok" else r["status"])
            for o, r in runs.items()
        ) + f" ({a.loss_epochs} epochs, test set {test.name})"
