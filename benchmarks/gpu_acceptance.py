"""The GPU acceptance run (issues 22, 25, 26): one command that proves a GPU machine and measures it, within a time cap.

    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out runs/acceptance         # every default stage, 8 minutes at most
    make gpu-acceptance                                                              # the same
    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out OUT --cap-s 280 \
        --stages doctor,gpu-tests,bench-gpu,record-steps,kernels,levers,mobilenet,bench-train  # runtime group + bench-train
    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out OUT --stages reference --cap-s 330 \
        --cifar-parts /tmp/stage_a runs/stage_b                                      # the reference HNE_small, its own call
    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out OUT --work /tmp/acceptance --stages ort-gpu \
        --ort-gpu-parts runs/ort/a runs/ort/b ...                                     # ONNX Runtime CUDA, its own call
    python benchmarks/gpu_acceptance.py --smoke                                      # every stage's code path, on the CPU

This file is the runner and its report; the stages (the table, what each runs and reads back) are in
``benchmarks/acceptance_stages.py``.

Runs from the checkout with the machine's Python (``PYTHONPATH=.``, nothing to install): every stage is a
subprocess of this checkout's own tools, so a crash or a hang in one stage is that stage's result, not the
run's. Each stage writes its result into ``OUT/acceptance.md`` and ``OUT/acceptance.json`` the moment it ends,
so a run cut off by the cap (or by the machine going away) still reports what it did. Stages, in this order,
each with a fixed cap (seconds; the runtime group, 1-7, within 240 s together):

1. ``doctor`` (30): ``hne-edge doctor --json`` on this machine (every backend present, every prefix vs float64).
2. ``gpu-tests`` (30): ``pytest tests/runtime/test_gpu_hardware.py -m "gpu or tensorrt"`` (the real-GPU tests).
3. ``bench-gpu`` (45): ``benchmarks/bench_gpu.py`` on hne_resnet_small, torch CUDA, every plan (mixed, subtrees,
   segments, fused), CUDA graphs on, batch 1 and 16: full tree / fused, first leaf / standalone, 16 independent /
   HNE against the MAC ratio, deadlines (200 frames) against the plan-achievable oracle and the even-split bound,
   the profile at the bundle's min and opt batch (1, 16) and its batch model (batch 8 predicted vs measured).
4. ``record-steps`` (20): ``benchmarks/record_steps.py --device cuda``: every step's time of the mixed program,
   frame by frame, and each run()'s upload, at batch 1 and 16 -> ``OUT/steps_hne_resnet_small_torch_cuda_b*.json``,
   the traces tests/runtime/test_deadlines.py replays once they are in tests/data.
5. ``kernels`` (25): ``benchmarks/bench_kernels.py --device cuda``: kernels per class and time of the fused tree
   and the first leaf, the kernels of every unit per plan; then (the rest of the cap) the same two units compiled
   (``compile=True``), each checked against float64. A compile takes longer than this cap allows on most
   machines: ``--stage-cap kernels=120`` gives it time in a separate call.
6. ``levers`` (35): ``benchmarks/bench_kernels.py --levers --device cuda``: the fused tree and the first leaf, one
   lever at a time from the torch backend as shipped (NCHW, no cuDNN autotuning, TF32, fp16, bfloat16, the 1x1
   convolutions as one bmm, grouped convolutions of at most 4 / 16 groups as block-diagonal dense ones), every
   prefix against float64 first (an fp32 lever off by more than 1e-4 of the largest logit is marked wrong), then
   each timed against the shipped units, alternated ABBA, its row written at once (issue 40 item 4). The compiled
   levers (``--compile``: inductor, and its ``max-autotune-no-cudagraphs`` mode) take minutes: run
   ``bench_kernels.py --levers --compile`` in a call of its own.
7. ``mobilenet`` (50): ``bench_gpu.py`` on hne_mobilenetv2 at 224x224 (the compute-bound regime), every plan,
   batch 1 and 8 (60 deadline frames), graphs captured for those two sizes only (``--capture-sizes 1,8``: on the
   H200 the stage got one row in 85 s); its summary says where the first row's seconds went.
8. ``ort-gpu`` (150, outside the runtime group; only with ``--ort-gpu-parts``, else "skipped"): onnxruntime-gpu from
   wheel parts: the parts joined (``benchmarks/wheel_parts.py``), ``pip install --no-deps --target`` into
   ``WORK/ort_gpu`` (unzipped where the machine's Python has no pip; a later call with the same ``--work`` and the
   same wheel reuses it), that folder put first on the children's ``PYTHONPATH``, and every child started through
   ``benchmarks/ort_gpu_child.py`` (torch first, then ``onnxruntime.preload_dlls()``): a probe of what the children
   import, three of the ONNX Runtime real-GPU tests (``ORT_GPU_TESTS``: both buffer modes and fp16), bench_gpu's
   mixed row at batch 1 with ``--backends onnxruntime``, ``record_steps.py --backend onnxruntime`` (every step's
   time and the first-leaf file's, frame by frame, in raw.tar.gz), then ``bench_kernels.py --levers --backend
   onnxruntime``: the fused tree and the first leaf through the runner, as shipped and with a CUDA graph, NHWC
   (``prefer_nhwc``), the heuristic convolution search and TF32, each checked against float64 and timed against the
   shipped (issue 40 item 3: where the 2x against torch CUDA goes). Each part gets a share of what is left.
9. ``bench-train`` (35): ``benchmarks/bench_train.py`` for hne_resnet_small at the trainer's CUDA defaults
   (batch 512, bf16, channels-last): the loop against its step alone on device-resident data (their ratio: the
   loop's overhead), each ``--pointwise`` formulation's step alone and operators per step, the trainer (``fit``)
   itself when time is left, TFLOP/s, % of peak, GPU utilisation (all in acceptance.json; the JSON in raw.tar.gz).
10. ``reference`` (whatever is left, at least 240 s; only with CIFAR training data, else "skipped"):
   ``benchmarks/train_reference.py`` trains hne_resnet_small to a time budget (what the cap leaves) with the
   paper's recipe, and issue 41's options beside it when ``--reference-objectives`` names variants, the time split
   evenly: ``OBJECTIVE[-ema][-bBATCH][-wWARMUP_EPOCHS][-lrLR_AT_128]`` (``independent``: L^I; ``-ema``: an average
   of the weights, the decay ``--reference-ema``, by default a window of a twentieth of the run's steps;
   ``-b1024``: batch 1024, the learning rate scaled linearly; ``-w5``: 5 epochs of warm-up; ``-lr0.2``: 0.2 at
   batch 128), the file's last 5,000 images held out; writes ``OUT/checkpoint.pt`` (float32 weights),
   ``OUT/config.yaml`` and ``OUT/record.json`` (the second variant: ``OUT/<variant>/checkpoint.pt`` and
   ``record.json``, its config in the record; a third and later: the record in raw.tar.gz, the checkpoint left in
   the scratch folder; every variant's figures in acceptance.json), which ``benchmarks/ship_reference.py OUT``
   makes the package's pretrained model. Its own call (the CIFAR parts travel in two copies): ``--stages reference
   --cap-s 330``; OUT then holds at most 8 files.
11. ``streams`` (60; only when named in ``--stages``): ``benchmarks/bench_streams.py --device cuda`` for plans mixed
   and segments: 3 and 6 cameras at 30/60/120 fps, the last one delivering its frames 4 at a time, each deadline one
   period of its camera, 3 s a row; the stream scheduler beside K runners and one FIFO runner, and issue 39's
   targets (rejections <= 1 % where FIFO misses <= 2 %, misses <= 1 %, expected accuracy >= both baselines).
12. ``losses`` (whatever is left; only when named in ``--stages``, and only with CIFAR training data and a test
   set): ``benchmarks/cifar_losses.py``, one run per objective of ``--objectives`` for ``--loss-epochs`` epochs,
   each scored on the test set; each objective gets an equal share of the time left.

The cap (``--cap-s``, default 480 s) is wall-clock for the whole run. A stage runs at most its own cap
(``--stage-cap NAME=SECONDS`` changes one; ``--smoke`` multiplies them by 4 and caps the run at 1800 s) and never
more than what is left; a stage that would start with less
than 15 s left is reported "not run". The CIFAR set does not fit through a 64 MiB copy in one piece:
``npz_chunks.py split --max-mib 49`` makes two parts, which travel separately (one folder each, or both in one);
``--cifar-parts`` takes those folders and joins them here. The onnxruntime-gpu wheel (1.31.1, cp312: ~255 MB, a
209 MiB xz stream) travels the same way in 5 parts of 52 MiB, each beside a checkout in a 64 MiB copy:
``python3 benchmarks/wheel_parts.py split WHEEL runs/ort --folders 5`` makes ``runs/ort/a`` .. ``runs/ort/e``, one
per copy; ``--ort-gpu-parts`` takes the folders.

What comes back stays small (a GPU machine returns at most 8 files): ``acceptance.md`` and ``acceptance.json``
(every stage's figures and tables), ``raw.tar.gz`` (the logs and the stages' side files, repacked after every
stage), the step traces, and the reference run's checkpoint, config and record. Only the files a run wrote are
packed (a user's under OUT/logs/ and OUT/raw/ stay); a report or archive in OUT that no run wrote is refused.

``--smoke`` runs every stage's code path on the CPU: doctor without the fresh export, the GPU tests (which
skip), bench_gpu / record_steps / bench_kernels ``--device cpu --smoke`` on hne_tiny (the compiled units with
``TORCHDYNAMO_DISABLE=1``: inductor on a small CPU takes minutes), bench_train on 32 images of hne_tiny, the
reference on hne_tiny for about a minute, and the losses on a synthetic CIFAR-shaped set split into two parts folders and joined back, as
real data would be; ort-gpu only with ``--ort-gpu-parts`` (tests/test_gpu_acceptance.py gives it a stand-in
wheel). Its figures are not figures. Exit status: 0 when every stage that ran passed and none was cut off, else 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):  # hne_edge, and the stages beside this file (also when loaded by path)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from acceptance_stages import (  # noqa: E402  (the stages and the tools they share: acceptance_stages.py)
    DEFAULT_CAP_S,
    EMA_AUTO,
    MIN_STAGE_S,
    OBJECTIVES,
    ORT_GPU_TESTS,
    RUNTIME_GROUP,
    SMOKE_CAP_FACTOR,
    STAGES,
    Stage,
    StageResult,
    StageRuns,
    child_env,
    data_file,
    ema_setting,
    install_wheel,
    join_npz_parts,
    junit_counts,
    reference_variant,
    run_command,
    split_npz_parts,
    staged_wheel,
    synthetic_cifar,
)

__all__ = ["Run", "main", "parse_args", "stages_for", "STAGES", "RUNTIME_GROUP", "ORT_GPU_TESTS", "join_npz_parts",
           "split_npz_parts", "install_wheel", "staged_wheel", "junit_counts"]
from harness import ArgumentParser  # noqa: E402  (one-line errors, as every benchmark's)

REPORT_FORMAT = "hne-edge-gpu-acceptance/1"  # acceptance.json's "format": what marks a folder's report as a run's


def _acceptance_record(path: Path) -> str | None:
    """The judge of acceptance.json (:func:`hne_edge.fileio.foreign_file`): ours when it says its format, or when it
    has a report's fields (a run before the format was written)."""
    import json

    from hne_edge.fileio import json_record

    if json_record(REPORT_FORMAT)(path) is None:
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        record = None
    if isinstance(record, dict) and isinstance(record.get("stages"), list) and {"started", "machine"} <= set(record):
        return None
    return f'it is not an acceptance report (no "format": "{REPORT_FORMAT}")'


def report_refused(out: Path) -> str | None:
    """Why this run may not write its report into ``out`` (a command replaces only what it wrote): acceptance.json
    not a run's, or acceptance.md or raw.tar.gz (a run's archive is added to) without a run's acceptance.json."""
    from hne_edge.fileio import foreign_file

    record = out / "acceptance.json"
    ours = record.is_file() and foreign_file(record, _acceptance_record) is None
    beside = lambda path: None if ours else "no acceptance.json of a run beside it"  # noqa: E731
    for path, judge in ((record, _acceptance_record), (out / "acceptance.md", beside), (out / "raw.tar.gz", beside)):
        why = foreign_file(path, judge)
        if why is not None:
            return f"refusing to replace {path}: {why}; move it away, or choose another --out"
    return None


class Run(StageRuns):
    """The acceptance run: its arguments, deadline, results and report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.others = self._loose()  # files under logs/ and raw/ before the run: the user's, never packed
        # the joined data sets stay out of the report folder (a GPU machine hands that folder back; 150 MB would not fit)
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_acceptance_"))
        self.py = sys.executable
        self.env = child_env()
        self.started = time.monotonic()
        self.deadline = self.started + args.cap_s
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.machine = machine_info()
        self.stages = stages_for(args)
        self.results = {s.name: StageResult(s.name, s.title, where=s.where) for s in self.stages}
        self.data_errors: dict[str, str] = {}  # "train_npz" / "test_npz": why that data set could not be prepared

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def budget(self, stage: Stage) -> float:
        return min(stage.cap_s if stage.cap_s is not None else float("inf"), self.left())

    def raw(self, name: str) -> Path:
        """Where a stage writes a side file: OUT/raw/, packed into OUT/raw.tar.gz after the stage (a GPU machine
        hands back at most 8 files; the figures are in acceptance.json)."""
        path = self.out / "raw" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _loose(self) -> dict[Path, tuple[int, int, int]]:
        """The files under OUT/logs/ and OUT/raw/, each with its inode, size and modification time."""
        files = [p for d in ("logs", "raw") for p in sorted((self.out / d).rglob("*"))
                 if p.is_file() and not p.is_symlink()]
        return {p: (s.st_ino, s.st_size, s.st_mtime_ns) for p in files for s in (p.stat(),)}

    def pack(self) -> None:
        """Move the files this run wrote under OUT/logs/ and OUT/raw/ (new or changed since it started) into
        OUT/raw.tar.gz (rewritten with what it held), so OUT keeps few files. The user's files there stay."""
        import tarfile

        loose = [p for p, sig in self._loose().items() if self.others.get(p) != sig]
        if not loose:
            return
        archive, tmp = self.out / "raw.tar.gz", self.out / ".raw.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as out:
            if archive.is_file():
                with tarfile.open(archive, "r:gz") as old:
                    names = {str(p.relative_to(self.out)) for p in loose}
                    for member in old.getmembers():
                        if member.name not in names and member.isfile():
                            out.addfile(member, old.extractfile(member))
            for p in loose:
                out.add(p, arcname=str(p.relative_to(self.out)))
        os.replace(tmp, archive)
        for p in loose:
            p.unlink()
        for d in ("logs", "raw"):  # the folders left empty (the user's files keep theirs)
            for sub in [*sorted((self.out / d).rglob("*"), reverse=True), self.out / d]:
                if sub.is_dir() and not sub.is_symlink() and not any(sub.iterdir()):
                    sub.rmdir()

    def command(self, result: StageResult, cmd: list[str], timeout: float, *, stdout: Path | None = None,
                env: dict | None = None, log: str | None = None) -> int | None:  # fmt: skip
        log_path = self.out / "logs" / f"{log or result.name}.log"
        result.commands.append(shlex.join([f"{k}={v}" for k, v in (env or {}).items()] + cmd))
        if str(log_path) not in result.logs:
            result.logs.append(str(log_path.relative_to(self.out)))
        code, _ = run_command(cmd, log_path, timeout, stdout=stdout, env={**self.env, **(env or {})})
        return code

    def run(self) -> int:
        chosen = [s for s in self.stages if s.name in self.args.stages]
        for stage in self.stages:
            if stage not in chosen:
                self.results[stage.name].status, self.results[stage.name].summary = "skipped", "not in --stages"
        self.write()
        for stage in chosen:
            result = self.results[stage.name]
            budget = self.budget(stage)
            if budget < stage.min_s:
                result.status = "not run"
                result.summary = (f"the {self.args.cap_s:.0f} s cap was reached ({max(self.left(), 0):.0f} s left"
                                  + (f"; it needs {stage.min_s:.0f} s)" if stage.min_s > MIN_STAGE_S else ")"))  # fmt: skip
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
            try:
                self.pack()
            except Exception as exc:  # the files stay loose: a report with them beats none
                result.summary += f" (logs not packed: {type(exc).__name__}: {exc})"
            self.write()
        print(self.where_text())
        print(f"gpu_acceptance: report in {self.out / 'acceptance.md'} and {self.out / 'acceptance.json'}")
        bad = [r for r in self.results.values() if r.status in ("failed", "timeout", "not run")]
        return 1 if bad else 0

    # -- report -------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": REPORT_FORMAT,
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
        for s in self.stages:
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
        for r in self.results.values():  # the tables the stages made (their files are in raw.tar.gz)
            tables = [r.figures.get("markdown")] + [v.get("markdown") for v in r.figures.values() if isinstance(v, dict)]
            for table in filter(None, tables):
                lines += ["", f"## {r.name}: {table[2:]}" if table.startswith("# ") else table]
        lines += ["", "## " + self.where_text().replace("Where each figure goes:", "Where each figure goes"), ""]
        for r in self.results.values():
            if r.commands:
                lines += [f"- {r.name}: " + "; ".join(f"`{c}`" for c in r.commands) + f" (logs: {', '.join(r.logs)}, in raw.tar.gz)"]
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
    """The training and test sets (bench-train, reference, losses): given, joined from parts, or (--smoke) synthesized
    and split."""
    a = run.args
    data = run.work / "data"
    if a.smoke and not (a.cifar or a.cifar_parts):
        data.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            synthetic_cifar(Path(tmp) / "train.npz", 256, seed=0)
            split_npz_parts(Path(tmp) / "train.npz", [data / "parts_a", data / "parts_b"])  # two folders, as copied
        a.cifar_parts = [str(data / "parts_a"), str(data / "parts_b")]
        a.test_data = a.test_data or str(synthetic_cifar(data / "test.npz", 128, seed=1))
    # a part lost on the way (a machine handed back between two calls) fails the stages that need it, with the
    # reason, and the others still run: an empty OUT would lose the whole call
    for attr, path, parts, name in (("train_npz", a.cifar, a.cifar_parts, "cifar_train.npz"),
                                    ("test_npz", a.test_data, a.test_parts, "cifar_test.npz")):  # fmt: skip
        try:
            setattr(run, attr, data_file(path, parts, data, name))
        except SystemExit as exc:
            setattr(run, attr, None)
            run.data_errors[attr] = f"{name} not prepared: {exc}"


def stages_for(args: argparse.Namespace) -> tuple[Stage, ...]:
    """The stage table with the caps ``--stage-cap`` changed (``--smoke``: every other cap x SMOKE_CAP_FACTOR, the
    CPU stand-ins being slower than a GPU, more so on a shared machine)."""
    caps = getattr(args, "stage_caps", {})
    factor = SMOKE_CAP_FACTOR if getattr(args, "smoke", False) else 1.0
    return tuple(replace(s, cap_s=caps[s.name]) if s.name in caps else
                 replace(s, cap_s=s.cap_s * factor) if s.cap_s is not None else s for s in STAGES)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "runs" / "gpu_acceptance"), help="report folder (acceptance.md, .json, logs/)")
    p.add_argument("--work", default=None, help="scratch folder for joined data sets (default: a new temporary folder)")
    p.add_argument("--cap-s", type=float, default=None,
                   help="wall-clock cap of the whole run, seconds (default 480; --smoke: 1800)")
    p.add_argument("--stages", default=",".join(s.name for s in STAGES if s.default),
                   help="comma list (run in the table's order; default: every stage but losses)")
    p.add_argument("--stage-cap", action="append", default=[], metavar="NAME=SECONDS",
                   help="another cap for one stage, e.g. kernels=120 to give the compiled units time (repeatable)")
    p.add_argument("--ort-gpu-parts", nargs="+", default=None, metavar="FOLDER",
                   help="folders holding an onnxruntime-gpu wheel's parts (benchmarks/wheel_parts.py split): stage ort-gpu")
    p.add_argument("--smoke", action="store_true", help="every stage's code path on the CPU, in a minute or two; not figures")
    p.add_argument("--cifar", default=None, help="CIFAR-10 training .npz (x: N,32,32,3 uint8; y: N)")
    p.add_argument("--cifar-parts", nargs="+", default=None, metavar="FOLDER",
                   help="folders holding npz_chunks.py split's part*.xz and meta.npz (joined here)")
    p.add_argument("--test-data", default=None, help="the test set .npz that the losses stage scores on")
    p.add_argument("--test-parts", nargs="+", default=None, metavar="FOLDER", help="the test set as npz_chunks.py parts")
    p.add_argument("--reference-objectives", nargs="+", default=["hierarchical"], metavar="VARIANT",
                   help="the reference stage's runs, each to its share of the time: OBJECTIVE (hierarchical, "
                        "independent) and recipe options, e.g. hierarchical-ema-b1024-w5 (-ema: an average of the "
                        "weights; -bN: batch N, the LR scaled linearly; -wE: E epochs of warm-up; -lrX: the LR at "
                        "batch 128) (default: %(default)s)")
    p.add_argument("--reference-ema", type=ema_setting, default=EMA_AUTO, metavar="DECAY",
                   help="the decay of the reference stage's -ema objectives: auto (a window of a twentieth of each "
                        "run's steps) or a number (train --ema; default: %(default)s)")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES),
                   help="cifar_losses.py run names for the losses stage (LOSS[@WEIGHTING][+NORMALIZE]; default: %(default)s)")
    p.add_argument("--loss-model", default="hne_resnet_small")
    p.add_argument("--loss-epochs", type=int, default=5)
    p.add_argument("--loss-limit", type=int, default=None, help="train the losses stage on this many images (default: all)")
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(args.stages) - {s.name for s in STAGES})
    if unknown:
        p.error(f"--stages: received {unknown}; expected some of {[s.name for s in STAGES]}")
    caps = {}
    for item in args.stage_cap:
        name, _, value = item.partition("=")
        try:
            caps[name] = float(value)
        except ValueError:
            caps[name] = -1.0
        if name not in {s.name for s in STAGES} or not caps[name] > 0:
            p.error(f"--stage-cap: received {item!r}; expected NAME=SECONDS with a stage name and a positive number")
    args.stage_caps = caps
    for variant in args.reference_objectives:
        try:
            reference_variant(variant, args.reference_ema)
        except ValueError as exc:
            p.error(f"--reference-objectives: {exc}")
    if len(set(args.reference_objectives)) < len(args.reference_objectives):
        p.error(f"--reference-objectives: received {args.reference_objectives}; expected each variant once")
    if args.cap_s is None:
        args.cap_s = 1800.0 if args.smoke else DEFAULT_CAP_S
    if args.cap_s <= 0:
        p.error(f"--cap-s: received {args.cap_s}; expected a positive number of seconds")
    if args.smoke:
        args.loss_epochs = min(args.loss_epochs, 1)
    refused = report_refused(Path(args.out))
    if refused:
        p.error(f"--out: {refused}")
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
