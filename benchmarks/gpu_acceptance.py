"""The GPU acceptance run (issue 22): one command that proves a GPU machine and measures it, within a time cap.

    PYTHONPATH=. python benchmarks/gpu_acceptance.py --out runs/acceptance          # every stage, 8 minutes at most
    make gpu-acceptance                                                              # the same
    PYTHONPATH=. python benchmarks/gpu_acceptance.py --cifar-parts parts_a parts_b --test-data cifar10_test.npz
    python benchmarks/gpu_acceptance.py --smoke                                      # every stage's code path, on the CPU

Runs from the checkout with the machine's Python (``PYTHONPATH=.``, nothing to install): every stage is a
subprocess of this checkout's own tools, so a crash or a hang in one stage is that stage's result, not the
run's. Stages, in priority order; each writes its result into ``OUT/acceptance.md`` and ``OUT/acceptance.json``
the moment it ends, so a run cut off by the cap (or by the machine going away) still reports what it did:

1. ``doctor``: ``hne-edge doctor --json`` on this machine (every backend present, every prefix vs float64).
2. ``gpu-tests``: ``pytest tests/runtime/test_gpu_hardware.py -m "gpu or tensorrt"`` (the real-GPU tests).
3. ``bench-gpu``: ``benchmarks/bench_gpu.py`` short, on hne_resnet_small: full tree / fused, first leaf /
   standalone, 16 independent / HNE against the MAC ratio, deadlines; every GPU backend present, every
   anytime plan the bundle has, CUDA graphs on and off, batch 1 and 16.
4. ``bench-train``: ``benchmarks/bench_train.py`` for hne_resnet_small at batch 128, without and with
   ``--compile``: images/s, TFLOP/s, % of peak, GPU utilisation.
5. ``losses`` (only with CIFAR training data and a test set): ``benchmarks/cifar_losses.py``, one run per
   objective of ``--objectives`` (default L^I, the paper's L^HD objective and its ``+label`` normalisation)
   for ``--loss-epochs`` epochs, each scored on the test set; each objective gets an equal share of the time left.

The cap (``--cap-s``, default 480 s) is wall-clock for the whole run. A stage may use at most its share of
the cap (doctor 20%, tests 25%, bench-gpu 30%, bench-train 40%, losses whatever is left) and never more than
what is left; a stage that would start with less than 15 s left is reported "not run". The CIFAR set does
not fit through a 64 MiB copy in one piece: ``npz_chunks.py split`` makes two ~60 MiB parts, which travel
separately (one folder each, or both in one); ``--cifar-parts`` takes those folders and joins them here.

``--smoke`` runs every stage on the CPU in a minute or two: doctor without the fresh export, the GPU tests
(which skip), bench_gpu ``--device cpu --smoke`` on hne_tiny, bench_train on 128 images (the compiled run
with ``TORCHDYNAMO_DISABLE=1``: inductor on a small CPU takes minutes), and the losses on a synthetic
CIFAR-shaped set that is split into two parts folders and joined back, as real data would be. Its figures
are not figures. Exit status: 0 when every stage that ran passed and none was cut off, else 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import lzma
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_CAP_S = 480.0
MIN_STAGE_S = 15.0  # a stage that would get less than this is not started
OBJECTIVES = ("independent", "hierarchical", "hierarchical+label")  # cifar_losses.py run names


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    share: float  # the most of the cap this stage may use
    where: str  # where its figures go in the docs


STAGES = (
    Stage("doctor", "hne-edge doctor on this machine", 0.20,
          "docs/results.md 'Honest limits' and docs/gpu.md: which backends ran on which GPU (the doctor table's rows, "
          "first leaf / full tree of the tiny bundle); BENCHMARKS.md header: the GPU machine's line"),
    Stage("gpu-tests", "real-GPU tests (tests/runtime/test_gpu_hardware.py)", 0.25,
          "docs/results.md 'Honest limits' (GPU): which backends passed their real-GPU tests, replacing "
          "'never ran on a GPU' for those that did"),
    Stage("bench-gpu", "bench_gpu.py short (hne_resnet_small, every plan)", 0.30,
          "BENCHMARKS.md 'GPU runtime (issues 6 and 12)': the target table (full/fused, first/standalone, "
          "16 indep./HNE vs MACs, misses, leaves vs oracle) per backend, plan and graphs, naming the GPU; "
          "issue 21's GPU row (full tree via each plan vs the fused call)"),
    Stage("bench-train", "bench_train.py (hne_resnet_small, batch 128, eager and compiled)", 0.40,
          "BENCHMARKS.md 'Training throughput: the trainer's loop (issue 11)': the GPU rows (images/s, TFLOP/s, "
          "% of peak, utilisation), replacing 'GPU: not measured'; the >= 30,000 img/s target met or not"),
    Stage("losses", "L^I vs L^HD (and the normalised objective) scored on the test set", 1.0,
          "RESULTS.md (docs/results.md) 'CIFAR-10: L^I vs L^D vs L^HD': a GPU row per objective (hne_resnet_small, "
          "the epochs used, test set, n = 1..16), and issue 22 item 3's question for GPU budgets"),
)


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


# -- the stages -----------------------------------------------------------------------------------


class Run:
    """The acceptance run: its arguments, deadline, results and report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        # the joined data sets stay out of the report folder (a GPU machine hands that folder back; 150 MB would not fit)
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_acceptance_"))
        self.py = sys.executable
        self.env = child_env()
        self.started = time.monotonic()
        self.deadline = self.started + args.cap_s
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.machine = machine_info()
        self.results = {s.name: StageResult(s.name, s.title, where=s.where) for s in STAGES}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def budget(self, stage: Stage) -> float:
        return min(stage.share * self.args.cap_s, self.left())

    def command(self, result: StageResult, cmd: list[str], timeout: float, *, stdout: Path | None = None,
                env: dict | None = None, log: str | None = None) -> int | None:  # fmt: skip
        log_path = self.out / "logs" / f"{log or result.name}.log"
        result.commands.append(shlex.join([f"{k}={v}" for k, v in (env or {}).items()] + cmd))
        if str(log_path) not in result.logs:
            result.logs.append(str(log_path.relative_to(self.out)))
        code, _ = run_command(cmd, log_path, timeout, stdout=stdout, env={**self.env, **(env or {})})
        return code

    def run(self) -> int:
        chosen = [s for s in STAGES if s.name in self.args.stages]
        for stage in STAGES:
            if stage not in chosen:
                self.results[stage.name].status, self.results[stage.name].summary = "skipped", "not in --stages"
        self.write()
        for stage in chosen:
            result = self.results[stage.name]
            budget = self.budget(stage)
            if budget < MIN_STAGE_S:
                result.status = "not run"
                result.summary = f"the {self.args.cap_s:.0f} s cap was reached ({max(self.left(), 0):.0f} s left)"
                self.write()
                continue
            print(f"gpu_acceptance: {stage.name} (at most {budget:.0f} s)", flush=True)
            t0 = time.monotonic()
            try:
                getattr(self, "stage_" + stage.name.replace("-", "_"))(result, budget)
            except SystemExit as exc:  # bad data arguments: that stage fails with the message, the others ran
                result.status, result.summary = "failed", str(exc)
            except Exception as exc:  # a bug in this script must still leave a report
                result.status, result.summary = "failed", f"{type(exc).__name__}: {exc}"
            result.seconds = time.monotonic() - t0
            print(f"gpu_acceptance: {stage.name}: {result.status} in {result.seconds:.0f} s - {result.summary}", flush=True)
            self.write()
        print(self.where_text())
        print(f"gpu_acceptance: report in {self.out / 'acceptance.md'} and {self.out / 'acceptance.json'}")
        bad = [r for r in self.results.values() if r.status in ("failed", "timeout", "not run")]
        return 1 if bad else 0

    # 1 --------------------------------------------------------------------------------------------
    def stage_doctor(self, result: StageResult, budget: float) -> None:
        report = self.out / "doctor.json"
        cmd = [self.py, "-m", "hne_edge", "doctor", "--json", "--repeats", "3" if self.args.smoke else "20"]
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
        junit = self.out / "gpu_tests.xml"
        cmd = [self.py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/runtime/test_gpu_hardware.py",
               "-m", "gpu or tensorrt", f"--junitxml={junit}"]  # fmt: skip
        code = self.command(result, cmd, budget)
        if code is None:
            result.status, result.summary = "timeout", f"the GPU tests ran past {budget:.0f} s"
            return
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        failed, skip_reasons = [], set()
        if junit.is_file():
            for case in ET.parse(junit).getroot().iter("testcase"):
                name = case.get("name", "?")
                if case.find("failure") is not None or case.find("error") is not None:
                    counts["failed"] += 1
                    failed.append(name)
                elif (skip := case.find("skipped")) is not None:
                    counts["skipped"] += 1
                    skip_reasons.add(skip.get("message", ""))
                else:
                    counts["passed"] += 1
        result.figures = {**counts, "failed_tests": failed, "skip_reasons": sorted(skip_reasons)}
        result.status = "ok" if code == 0 else "failed"
        result.summary = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped" + (
            f" ({'; '.join(sorted(skip_reasons))[:200]})" if counts["skipped"] else "") + (
            f"; failed: {', '.join(failed[:8])}" if failed else "") + ("" if junit.is_file() else f"; exit {code}")  # fmt: skip

    # 3 --------------------------------------------------------------------------------------------
    def stage_bench_gpu(self, result: StageResult, budget: float) -> None:
        md = self.out / "bench_gpu.md"
        cmd = [self.py, "benchmarks/bench_gpu.py", "--out", str(md)]
        if self.args.smoke:
            cmd += ["--device", "cpu", "--smoke", "--models", "hne_tiny"]
        else:
            cmd += ["--models", "hne_resnet_small", "--warmup", "5", "--repeats", "30", "--profile-repeats", "10", "--frames", "50"]
        code = self.command(result, cmd, budget)
        if code is None:
            result.status, result.summary = "timeout", f"bench_gpu ran past {budget:.0f} s (rows so far in logs/bench-gpu.log)"
            return
        rows_file = md.with_suffix(".json")
        if not rows_file.is_file():
            skipped = "skipped" in _tail(self.out / "logs" / "bench-gpu.log", 5)
            result.status = "skipped" if code == 0 and skipped else "failed"
            result.summary = _tail(self.out / "logs" / "bench-gpu.log", 2)
            return
        data = json.loads(rows_file.read_text())
        rows = data["rows"]
        result.figures = {"where": data["where"], "rows": rows, "table": md.name}
        errors = [r for r in rows if "error" in r]
        result.status = "ok" if code == 0 and not errors else "failed"
        full = [f"{r['backend']}/{r.get('plan')}/{'graphs' if r['cuda_graph'] else 'eager'}/b{r['batch']}: full/fused "
                f"{r['full_vs_fused']:.2f}x" for r in rows if "full_vs_fused" in r][:4]  # fmt: skip
        result.summary = f"{len(rows)} rows on {data['where']}" + (f"; {'; '.join(full)}" if full else "") + (
            f"; {len(errors)} failed: {errors[0]['error'][:200]}" if errors else "")

    # 4 --------------------------------------------------------------------------------------------
    def stage_bench_train(self, result: StageResult, budget: float) -> None:
        base = [self.py, "benchmarks/bench_train.py"]
        if self.args.smoke:
            base += ["--device", "cpu", "--model", "hne_tiny", "--batch", "32", "--limit", "128", "--epochs", "2", "--threads", "1"]
        else:
            base += ["--device", "cuda", "--model", "hne_resnet_small", "--batch", "128", "--limit", "25600", "--epochs", "2"]
        train = getattr(self, "train_npz", None)
        base += ["--data", str(train)] if train else ["--data", ""]  # "": synthetic CIFAR-shaped images (throughput only)
        runs = {}
        t_end = time.monotonic() + budget
        no_inductor = {"TORCHDYNAMO_DISABLE": "1"} if self.args.smoke else None  # see the module docstring
        for variant, extra, env in (("eager", [], None), ("compile", ["--compile"], no_inductor)):
            left = t_end - time.monotonic()
            timeout = left / 2 if variant == "eager" else left  # the compiled run compiles: it gets the rest
            out = self.out / f"bench_train_{variant}.json"
            code = self.command(result, base + extra + ["--json", str(out)], timeout, env=env, log=f"bench-train-{variant}")
            if code is None:
                runs[variant] = {"status": "timeout", "seconds_allowed": round(timeout)}
            elif code != 0 or not out.is_file():
                runs[variant] = {"status": "failed", "error": _tail(self.out / "logs" / f"bench-train-{variant}.log")}
            else:
                runs[variant] = {"status": "ok", **json.loads(out.read_text())}
        result.figures = runs
        statuses = {r["status"] for r in runs.values()}
        result.status = "ok" if statuses == {"ok"} else ("timeout" if "timeout" in statuses and "failed" not in statuses else "failed")

        def line(v: str, r: dict) -> str:
            if r["status"] != "ok":
                return f"{v}: {r['status']}" + (f" ({r.get('error', '')[:160]})" if r.get("error") else "")
            util = f", GPU {r['utilisation_pct']:.0f}%" if r.get("utilisation_pct") is not None else ""
            return f"{v}: {r['images_per_s']:,.0f} img/s, {r['tflops']:.2f} TFLOP/s{util}"

        result.summary = "; ".join(line(v, r) for v, r in runs.items())
        result.summary += " (compile: dynamo disabled in --smoke)" if self.args.smoke else ""

    # 5 --------------------------------------------------------------------------------------------
    def stage_losses(self, result: StageResult, budget: float) -> None:
        t_end = time.monotonic() + budget
        a = self.args
        train, test = getattr(self, "train_npz", None), getattr(self, "test_npz", None)
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

    # -- report -------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "started": self.started_at,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "cap_s": self.args.cap_s,
            "smoke": self.args.smoke,
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "machine": self.machine,
            "stages": [asdict(r) for r in self.results.values()],
        }

    def where_text(self) -> str:
        lines = ["Where each figure goes:"]
        for s in STAGES:
            r = self.results[s.name]
            if r.status in ("ok", "failed", "timeout"):
                lines.append(f"  {s.name} ({r.status}): {s.where}")
        if self.args.smoke:
            lines.append("  (--smoke: CPU stand-ins, not figures; nothing goes anywhere)")
        return "\n".join(lines)

    def markdown(self) -> str:
        m = self.machine
        title = "GPU acceptance run" + (" (--smoke on the CPU: not figures)" if self.args.smoke else "")
        lines = [f"# {title}", "",
                 f"Started {self.started_at}, {time.monotonic() - self.started:.0f} s of the {self.args.cap_s:.0f} s cap. "
                 f"Machine: {m['gpus'] or 'no GPU'}; {m['cpu']}; Python {m['python']}, torch {m['torch']}, "
                 f"onnxruntime {m['onnxruntime']}, TensorRT {m['tensorrt']}.", "",
                 f"Command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`", "",
                 "| # | stage | status | seconds | result |", "|---|---|---|---|---|"]  # fmt: skip
        for i, r in enumerate(self.results.values(), start=1):
            lines.append(f"| {i} | {r.title} | {r.status} | {r.seconds:.0f} | {r.summary.replace('|', '/')} |")
        bench = self.out / "bench_gpu.md"
        if bench.is_file():
            lines += ["", bench.read_text().replace("# GPU runtime targets", "## bench_gpu.py: GPU runtime targets")]
        lines += ["", "## " + self.where_text().replace("Where each figure goes:", "Where each figure goes"), ""]
        for r in self.results.values():
            if r.commands:
                lines += [f"- {r.name}: " + "; ".join(f"`{c}`" for c in r.commands) + f" (logs: {', '.join(r.logs)})"]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        from hne_edge.fileio import atomic_write_json, atomic_write_text

        atomic_write_json(self.out / "acceptance.json", self.to_dict(), indent=1)
        atomic_write_text(self.out / "acceptance.md", self.markdown())


def machine_info() -> dict[str, str]:
    from hne_edge.doctor.environment import cpu_info, list_gpus

    def version(module: str) -> str:
        try:
            return str(__import__(module).__version__)
        except Exception:
            return "not installed"

    gpus, _ = list_gpus()
    cpu = cpu_info()
    return {
        "gpus": ", ".join(f"{g.name} ({g.memory_mib} MiB, driver {g.driver}, sm {g.compute_capability})" for g in gpus),
        "cpu": f"{cpu.model}, {cpu.logical_cores} cores",
        "python": platform.python_version(),
        "torch": version("torch"),
        "onnxruntime": version("onnxruntime"),
        "tensorrt": version("tensorrt"),
        "platform": platform.platform(),
    }


def prepare_data(run: Run) -> None:
    """The training and test sets of stages 4 and 5: given, joined from parts, or (--smoke) synthesized and split."""
    a = run.args
    data = run.work / "data"
    if a.smoke and not (a.cifar or a.cifar_parts):
        data.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            synthetic_cifar(Path(tmp) / "train.npz", 256, seed=0)
            split_npz_parts(Path(tmp) / "train.npz", [data / "parts_a", data / "parts_b"])  # two folders, as copied
        a.cifar_parts = [str(data / "parts_a"), str(data / "parts_b")]
        a.test_data = a.test_data or str(synthetic_cifar(data / "test.npz", 128, seed=1))
    run.train_npz = data_file(a.cifar, a.cifar_parts, data, "cifar_train.npz")
    run.test_npz = data_file(a.test_data, a.test_parts, data, "cifar_test.npz")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "runs" / "gpu_acceptance"), help="report folder (acceptance.md, .json, logs/)")
    p.add_argument("--work", default=None, help="scratch folder for joined data sets (default: a new temporary folder)")
    p.add_argument("--cap-s", type=float, default=DEFAULT_CAP_S, help="wall-clock cap of the whole run, seconds (default 480)")
    p.add_argument("--stages", default=",".join(s.name for s in STAGES), help="comma list, in priority order")
    p.add_argument("--smoke", action="store_true", help="every stage's code path on the CPU, in a minute or two; not figures")
    p.add_argument("--cifar", default=None, help="CIFAR-10 training .npz (x: N,32,32,3 uint8; y: N)")
    p.add_argument("--cifar-parts", nargs="+", default=None, metavar="FOLDER",
                   help="folders holding npz_chunks.py split's part*.xz and meta.npz (joined here)")
    p.add_argument("--test-data", default=None, help="the test set .npz that stage 5 scores on")
    p.add_argument("--test-parts", nargs="+", default=None, metavar="FOLDER", help="the test set as npz_chunks.py parts")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES),
                   help="cifar_losses.py run names for stage 5 (LOSS[@WEIGHTING][+NORMALIZE]; default: %(default)s)")
    p.add_argument("--loss-model", default="hne_resnet_small")
    p.add_argument("--loss-epochs", type=int, default=5)
    p.add_argument("--loss-limit", type=int, default=None, help="train stage 5 on this many images (default: all)")
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(args.stages) - {s.name for s in STAGES})
    if unknown:
        p.error(f"--stages: received {unknown}; expected some of {[s.name for s in STAGES]}")
    if args.cap_s <= 0:
        p.error(f"--cap-s: received {args.cap_s}; expected a positive number of seconds")
    if args.smoke:
        args.loss_epochs = min(args.loss_epochs, 1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    try:
        prepare_data(run)
        return run.run()
    finally:
        if args.work is None:
            shutil.rmtree(run.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
