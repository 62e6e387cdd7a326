"""benchmarks/gpu_acceptance.py: --smoke runs every stage's code path on the CPU and reports; a run cut off by
its cap still reports; CIFAR parts made by ../shared/tools/npz_chunks.py (spread over two folders, as they travel)
are joined byte for byte."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import CPU_DEVICE, REPO, run_cli
from gpu_env import HAS_CUDA


SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"
TOOL = REPO.parent / "shared" / "tools" / "npz_chunks.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_smoke_runs_every_stage_on_the_cpu_and_writes_the_report(tmp_path):
    out = tmp_path / "acceptance"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=1200)  # fmt: skip  (not the checkout: the script must find it itself)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "acceptance.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages) == ["doctor", "gpu-tests", "bench-gpu", "record-steps", "kernels", "levers", "mobilenet", "ort-gpu",
                            "bench-train", "reference", "streams", "losses"]  # fmt: skip
    ran = {k: s for k, s in stages.items() if k not in ("ort-gpu", "streams", "losses")}
    assert all(s["status"] == "ok" for s in ran.values()), {k: (s["status"], s["summary"]) for k, s in stages.items()}
    assert stages["ort-gpu"]["status"] == "skipped" and "--ort-gpu-parts" in stages["ort-gpu"]["summary"]
    assert stages["losses"]["status"] == "skipped"  # not a default stage any more: `reference` covers it
    assert stages["streams"]["status"] == "skipped"  # named when wanted (test below)
    assert report["smoke"] is True and report["elapsed_s"] <= report["cap_s"]
    assert all(c["ok"] for c in stages["doctor"]["figures"]["checks"])
    tests = stages["gpu-tests"]["figures"]
    assert tests["failed"] == 0 and (tests["skipped"] > 0 if not HAS_CUDA else tests["passed"] > 0)
    rows = stages["bench-gpu"]["figures"]["rows"]
    assert {r["plan"] for r in rows} == {"segments", "subtrees", "mixed", "fused"} and all("error" not in r for r in rows)
    assert all("leaves_vs_split_bound" in r for r in rows if r["plan"] != "fused")
    traces = stages["record-steps"]["figures"]["files"]
    assert sorted(traces) == ["steps_hne_tiny_torch_b1.json", "steps_hne_tiny_torch_b4.json"]
    assert all(t["frames"] >= 5 and t["fused_ms"] > 0 for t in traces.values())
    kernels = stages["kernels"]["figures"]
    assert [u["unit"] for u in kernels["units"]["units"]] == ["fused tree", "first leaf"]
    assert all(u["max_error_vs_float64"] < 1e-4 for u in kernels["units"]["units"] + kernels["compiled"]["units"])
    levers = stages["levers"]["figures"]["rows"]
    assert {r["lever"].split(" (")[0] for r in levers} >= {"as shipped", "bfloat16", "1x1 as bmm", "dense <= 16 groups"}
    assert all(r["ms"] > 0 and not r["wrong"] for r in levers) and "fastest right" in stages["levers"]["summary"]
    assert {r["model"] for r in stages["mobilenet"]["figures"]["rows"]} == {"hne_tiny"}  # --smoke: its code path
    train = stages["bench-train"]["figures"]
    assert set(train["step"]) == {"conv", "bmm"} and all(s["images_per_s"] > 0 and s["ops"] > 0 for s in train["step"].values())
    assert len(train["pairs"]) == 1 and train["loop_vs_step"] > 0 and "overhead_pct" in train
    reference = stages["reference"]["figures"]["objectives"]
    assert list(reference) == ["hierarchical"] and reference["hierarchical"]["status"] == "ok"
    assert set(reference["hierarchical"]["accuracy_pct"]) == {str(n) for n in range(1, 17)}
    assert {"checkpoint.pt", "config.yaml", "record.json"} <= {p.name for p in out.iterdir()}
    md = (out / "acceptance.md").read_text()
    assert "--smoke on the CPU: not figures" in md and "## Where each figure goes" in md
    assert "## bench-gpu: GPU runtime targets" in md and "## kernels: Kernels per unit" in md
    assert "BENCHMARKS.md 'How fast does it train'" in proc.stdout
    assert "BENCHMARKS.md 'How fast is anytime against one network on a GPU'" in proc.stdout
    assert not list(out.rglob("*.npz"))  # the joined data sets stayed in the scratch folder, which is gone
    # what a GPU machine hands back: at most 8 files, at most 2 folders deep
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files), files
    with tarfile.open(out / "raw.tar.gz") as tar:
        names = tar.getnames()
    assert {"logs/doctor.log", "raw/doctor.json", "raw/bench_gpu.md", "logs/bench-train.log", "raw/bench_train.json",
            "logs/reference.log"} <= set(names), names


def test_the_streams_stage_replays_cameras_of_different_rates_for_both_plans_and_says_which_targets_held(tmp_path):
    """Issue 39, item 5: `--stages streams` runs bench_streams on the GPU (here: its --smoke on the CPU) for plans mixed
    and segments, with cameras of different rates and a bursty one; its figures are the rows and the verdicts."""
    out = tmp_path / "acceptance"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--stages", "streams", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    stage = {s["name"]: s for s in json.loads((out / "acceptance.json").read_text())["stages"]}["streams"]
    assert stage["status"] == "ok", stage["summary"]
    rows = stage["figures"]["rows"]
    assert set(rows) == {"mixed", "segments"}
    for plan_rows in rows.values():
        assert {r["method"] for r in plan_rows} == {"runners", "fifo", "scheduler"}
        assert any("30/60 (burst 3)" == str(r["fps"]) for r in plan_rows)
    assert stage["figures"]["verdicts"] and "targets" in stage["summary"]


def test_the_reference_stage_writes_a_checkpoint_and_record_that_eval_and_export_accept(tmp_path):
    """--smoke --stages reference: hne_tiny on synthetic CIFAR parts (joined, as the real ones), three variants, each
    to its share of the time, the second with issue 41's recipe options (an average of the weights, the decay
    --reference-ema's default, auto, as the GPU call runs it; batch 16, half an epoch of warm-up, lr 0.05 at 128), the third without warm-up; OUT holds at
    most 8 files, at most 2 folders deep (what a GPU machine hands back); the
    checkpoint is what `hne-edge eval` and `hne-edge export` read, and the record says how it was made."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--stages", "reference", "--out", str(out), "--work",
                           str(work), "--reference-objectives", "hierarchical", "independent-ema-b16-w0.5-lr0.05",
                           "hierarchical-w0"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["acceptance.json", "acceptance.md", "checkpoint.pt", "config.yaml",
                     "independent-ema-b16-w0.5-lr0.05/checkpoint.pt", "independent-ema-b16-w0.5-lr0.05/record.json",
                     "raw.tar.gz", "record.json"]  # the log is in raw.tar.gz
    assert all((out / f).stat().st_size < 16 * 2**20 for f in files)
    stage = {s["name"]: s for s in json.loads((out / "acceptance.json").read_text())["stages"]}["reference"]
    runs, second_name = stage["figures"]["objectives"], "independent-ema-b16-w0.5-lr0.05"
    assert stage["status"] == "ok" and list(runs) == ["hierarchical", second_name, "hierarchical-w0"]
    # a third variant: its figures in the report, its record in raw.tar.gz, its checkpoint left in scratch (8 files)
    third_run = runs["hierarchical-w0"]
    assert third_run["status"] == "ok" and set(third_run["accuracy_pct"]) == set(runs["hierarchical"]["accuracy_pct"])
    with tarfile.open(out / "raw.tar.gz") as tar:
        third = json.load(tar.extractfile("raw/reference-hierarchical-w0.json"))
    assert third["config"]["optim"]["warmup_epochs"] == 0
    assert (work / "reference-out" / "hierarchical-w0" / "checkpoint.pt").is_file()
    record = json.loads((out / "record.json").read_text())
    data = work / "data" / "cifar_train.npz"
    from hne_edge.train.data import npz_fingerprint

    assert record["status"] == "ok" and record["data"]["sha256"] == npz_fingerprint(data)
    assert record["config"]["loss"] == {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0, "weighting": "paper",
                                        "temperature_squared": False, "normalize": "none"}  # fmt: skip
    assert record["config"]["data"]["holdout"] == "last" and record["data"]["validation_images"] == 26  # 10% of 256
    assert record["config"]["optim"]["ema"] is None  # the paper's recipe
    assert record["images_seen"] > 0 and record["plan"]["total_steps"] * 32 == record["images_seen"]
    assert [r["n"] for r in record["held_out"]] == list(range(1, 17)) and record["machine"]["torch"]
    second = json.loads((out / second_name / "record.json").read_text())["config"]
    assert second["loss"]["kind"] == "independent" and second["optim"]["ema"] == "auto"
    assert [second["optim"][k] for k in ("batch_size", "warmup_epochs", "lr", "lr_batch")] == [16, 0.5, 0.05, 128]
    preset = [record["config"]["optim"][k] for k in ("batch_size", "warmup_epochs", "lr")]
    assert preset == [32, 2.0, 0.1]  # the smoke's batch, the preset's warm-up and rate
    run_cli("export", str(out / second_name / "checkpoint.pt"), "--out", str(tmp_path / "ema-bundle"), check=True)
    ev = run_cli("eval", str(out / "checkpoint.pt"), "--data-dir", str(data), "--out", str(tmp_path / "eval"), "--no-plots",
                 *CPU_DEVICE, check=True)  # fmt: skip  (the record's accuracy is the CPU run's)
    held_out = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert held_out["num_images"] == 26 and "16" in ev.stdout
    assert held_out["anytime"][-1]["accuracy"] == pytest.approx(record["held_out"][-1]["accuracy"])
    run_cli("export", str(out / "checkpoint.pt"), "--out", str(tmp_path / "bundle"), check=True)
    assert (tmp_path / "bundle" / "manifest.json").is_file()


def test_reference_variants_name_the_recipe_options_and_bad_ones_are_refused(capsys):
    """--reference-objectives: an objective and issue 41's recipe options after it, each to train_reference.py's flag;
    a variant that is not one says which part is wrong and what is expected, before anything runs."""
    ga = _module()
    assert ga.reference_variant("hierarchical", 0.999) == ("hierarchical", [])
    assert ga.reference_variant("independent-ema-b1024-w5-lr0.2", 0.99) == (
        "independent", ["--ema", "0.99", "--batch-size", "1024", "--warmup-epochs", "5", "--lr", "0.2"])
    assert ga.reference_variant("hierarchical-w0", 0.999) == ("hierarchical", ["--warmup-epochs", "0"])
    assert ga.parse_args([]).reference_ema == "auto"  # a run's length is not known before the call
    assert ga.reference_variant("hierarchical-ema", "auto") == ("hierarchical", ["--ema", "auto"])
    for bad in ("1", "0", "auto2", "x"):
        with pytest.raises(SystemExit):
            ga.parse_args(["--reference-ema", bad])
        assert f"--reference-ema: received {bad!r}; expected auto or a decay" in capsys.readouterr().err
    for bad, says in (("distill", "objective 'distill'"),
                      ("hierarchical-b1024.5", "'b1024.5' needs a whole number > 0 after 'b'"),
                      ("hierarchical-b0", "'b0' needs a whole number > 0 after 'b'"),
                      ("hierarchical-x3", "'x3' unknown"), ("hierarchical-ema-ema", "'ema' twice"),
                      ("hierarchical-lr", "'lr' needs a number > 0 after 'lr'"),
                      ("hierarchical-w-1", "'w' needs a number >= 0 after 'w'")):
        with pytest.raises(ValueError, match=re.escape(says)):
            ga.reference_variant(bad, 0.999)
        with pytest.raises(SystemExit) as exit_info:
            ga.parse_args(["--reference-objectives", bad])
        assert exit_info.value.code == 2 and "expected OBJECTIVE[-ema][-bBATCH]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ga.parse_args(["--reference-objectives", "hierarchical", "hierarchical"])
    assert "expected each variant once" in capsys.readouterr().err


def test_a_failed_reference_run_still_writes_its_record(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an archive")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "train_reference.py"), "--data", str(bad), "--out",
                           str(tmp_path / "out"), "--time-budget", "30", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1
    record = json.loads((tmp_path / "out" / "record.json").read_text())
    assert record["status"] == "failed" and "bad.npz" in record["error"] and record["traceback"]
    assert not (tmp_path / "out" / "checkpoint.pt").exists()


def test_a_run_cut_off_by_its_cap_still_reports(tmp_path, monkeypatch):
    """A stage that runs past its time is stopped (its whole process group) and reported; the report is on disk
    after every stage; stages with no time left are 'not run'; the exit status is 1."""
    ga = _module()
    args = ga.parse_args(["--out", str(tmp_path / "out"), "--cap-s", "100", "--stages", "doctor,gpu-tests,bench-gpu"])
    run = ga.Run(args)
    seen = []

    pids = tmp_path / "pids"
    child = (f"import os, subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}'); time.sleep(60)")  # fmt: skip

    def doctor(result, budget):  # a child that would outlive the cap, and a grandchild of it
        seen.append(json.loads((run.out / "acceptance.json").read_text())["stages"][0]["status"])
        code = run.command(result, [sys.executable, "-c", child], 3.0)
        result.status, result.summary = ("timeout", "stopped") if code is None else ("ok", "")

    def gpu_tests(result, budget):
        run.deadline = time.monotonic() + 5  # the cap is all but spent
        result.status = "ok"

    monkeypatch.setattr(run, "stage_doctor", doctor)
    monkeypatch.setattr(run, "stage_gpu_tests", gpu_tests)
    started = time.monotonic()
    assert run.run() == 1
    assert time.monotonic() - started < 40  # the sleeping child was stopped, not waited for
    for pid in map(int, pids.read_text().split()):  # the stage's whole process group is gone (reaped or a zombie)
        try:
            state = open(f"/proc/{pid}/stat").read().split()[2] if sys.platform == "linux" else "Z"
        except FileNotFoundError:
            continue
        assert state == "Z", f"process {pid} of the timed-out stage is still running"
    assert seen == ["pending"]  # the report existed before the first stage ran
    stages = {s["name"]: s for s in json.loads((run.out / "acceptance.json").read_text())["stages"]}
    assert stages["doctor"]["status"] == "timeout" and stages["gpu-tests"]["status"] == "ok"
    assert stages["bench-gpu"]["status"] == "not run" and "cap was reached" in stages["bench-gpu"]["summary"]
    assert all(stages[s]["status"] == "skipped" for s in ("bench-train", "reference", "losses"))
    assert "| 3 | bench_gpu.py (hne_resnet_small" in (run.out / "acceptance.md").read_text()


def test_a_run_packs_only_the_files_it_wrote_and_a_second_run_adds_to_its_archive(tmp_path, monkeypatch):
    """Files the user had under OUT/logs/ and OUT/raw/ were packed into raw.tar.gz and deleted from disk after the
    first stage. A second run into the same --out (the staged-device workflow) keeps the first one's files."""
    ga = _module()
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "raw").mkdir()
    (out / "logs" / "notes.txt").write_text("my notes")
    (out / "raw" / "mydata.csv").write_text("a,b")

    def run_once(name: str) -> None:
        run = ga.Run(ga.parse_args(["--out", str(out), "--stages", "doctor", "--work", str(tmp_path / "w")]))

        def doctor(result, budget):
            run.command(result, [sys.executable, "-c", "print('checked')"], 30, log=name)
            run.raw(f"{name}.json").write_text("{}")
            result.status = "ok"

        monkeypatch.setattr(run, "stage_doctor", doctor)
        assert run.run() == 0

    run_once("first")
    run_once("second")
    assert (out / "logs" / "notes.txt").read_text() == "my notes" and (out / "raw" / "mydata.csv").read_text() == "a,b"
    with tarfile.open(out / "raw.tar.gz") as archive:
        assert sorted(archive.getnames()) == ["logs/first.log", "logs/second.log", "raw/first.json", "raw/second.json"]


@pytest.mark.parametrize("name", ["acceptance.md", "acceptance.json", "raw.tar.gz"])
def test_a_report_file_no_acceptance_run_wrote_is_refused_before_any_stage(tmp_path, name):
    """acceptance.md/.json were overwritten, and a raw.tar.gz of the user's merged into, without a check."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("mine")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--stages", "doctor", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("Error: --out: ") and str(out / name) in line and "move it away" in line
    assert (out / name).read_text() == "mine" and sorted(p.name for p in out.iterdir()) == [name]


def _images(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return x, rng.integers(0, 10, n), np.array(["c%d" % i for i in range(10)])


@pytest.mark.skipif(not TOOL.is_file(), reason=f"the shared tool is not here: {TOOL}")
def test_parts_made_by_the_shared_tool_join_byte_for_byte(tmp_path):
    ga = _module()
    x, y, classes = _images()
    np.savez(tmp_path / "train.npz", x=x, y=y, classes=classes)
    subprocess.run([sys.executable, str(TOOL), "split", str(tmp_path / "train.npz"), str(tmp_path / "a"), "--max-mib", "0.1"],
                   check=True, capture_output=True)  # fmt: skip
    parts = sorted((tmp_path / "a").glob("part*.xz"))
    assert len(parts) >= 2
    (tmp_path / "b").mkdir()  # the parts travel separately: the later ones in a folder of their own, with meta.npz
    shutil.copy(tmp_path / "a" / "meta.npz", tmp_path / "b")
    for part in parts[1:]:
        shutil.move(part, tmp_path / "b" / part.name)
    joined = ga.join_npz_parts([tmp_path / "b", tmp_path / "a"], tmp_path / "joined.npz")
    with np.load(joined) as data:
        np.testing.assert_array_equal(data["x"], x)
        np.testing.assert_array_equal(data["y"], y)
        np.testing.assert_array_equal(data["classes"], classes)
    # and the other way: the smoke run's parts are what the tool joins
    ga.split_npz_parts(tmp_path / "train.npz", [tmp_path / "c", tmp_path / "d"])
    for f in (tmp_path / "d").iterdir():
        shutil.copy(f, tmp_path / "c" / f.name)
    subprocess.run([sys.executable, str(TOOL), "join", str(tmp_path / "c"), str(tmp_path / "tool.npz")], check=True, capture_output=True)
    with np.load(tmp_path / "tool.npz") as data:
        np.testing.assert_array_equal(data["x"], x)


def test_missing_or_mismatched_parts_are_named(tmp_path):
    ga = _module()
    x, y, _ = _images(seed=1)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    ga.split_npz_parts(tmp_path / "train.npz", [tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    with pytest.raises(SystemExit, match=r"received \['part00.xz', 'part02.xz'\]; expected .*'part01.xz'"):
        ga.join_npz_parts([tmp_path / "a", tmp_path / "c"], tmp_path / "j.npz")
    np.savez(tmp_path / "other.npz", x=x[:10], y=y[:10])
    ga.split_npz_parts(tmp_path / "other.npz", [tmp_path / "o"])
    shutil.copy(tmp_path / "o" / "meta.npz", tmp_path / "b" / "meta.npz")
    with pytest.raises(SystemExit, match="differs from .*different splits"):
        ga.join_npz_parts([tmp_path / "a", tmp_path / "b", tmp_path / "c"], tmp_path / "j.npz")
    with pytest.raises(SystemExit, match="which is not a folder"):
        ga.join_npz_parts([tmp_path / "nope"], tmp_path / "j.npz")


def test_a_part_lost_between_calls_fails_the_stages_that_need_it_and_the_rest_run(tmp_path, monkeypatch):
    """A GPU machine idle for ~30 s is handed back with its /tmp: the part the first call left there is gone when the
    second comes. The run used to stop before its first stage (an empty OUT, one line on stderr); now the reference
    and losses stages fail with the part named, bench-train measures on synthetic images and says so, the rest run."""
    ga = _module()
    x, y, _ = _images(seed=2)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    ga.split_npz_parts(tmp_path / "train.npz", [tmp_path / "a", tmp_path / "b"])
    args = ga.parse_args(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--stages",
                          "doctor,bench-train,reference,losses", "--cifar-parts", str(tmp_path / "b")])  # fmt: skip
    run = ga.Run(args)
    ga.prepare_data(run)
    assert run.train_npz is None and "part00.xz" in run.data_errors["train_npz"]

    def doctor(result, budget):
        result.status = "ok"

    def bench_train_child(result, cmd, budget, **kw):  # the child's figures, without running it
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"batch": 512, "step": {}}))
        return 0

    monkeypatch.setattr(run, "stage_doctor", doctor)
    monkeypatch.setattr(run, "command", bench_train_child)
    assert run.run() == 1
    stages = {s["name"]: s for s in json.loads((run.out / "acceptance.json").read_text())["stages"]}
    assert stages["doctor"]["status"] == "ok"
    assert stages["bench-train"]["status"] == "ok" and "on synthetic images: cifar_train.npz not prepared" in \
        stages["bench-train"]["summary"]
    for name in ("reference", "losses"):
        assert stages[name]["status"] == "failed" and "part00.xz" in stages[name]["summary"], stages[name]


def test_a_cifar_part_travels_beside_the_checkout_in_a_64_mib_copy():
    """The first call carries the checkout and CIFAR's first part (npz_chunks.py split, the size docs/gpu.md gives)
    with its meta.npz: at most 64 MiB together. CIFAR-10's training set packs to a 97.84 MiB xz stream and a 0.38
    MiB meta.npz (npz_chunks.py, 2026-11-29); parts of 58 MiB made a 65.02 MiB copy once the checkout grew to 6.6 MiB."""
    import math

    stream_mib, meta_mib = 97.84, 0.38
    note = (REPO / "docs" / "gpu.md").read_text()
    (max_mib,) = {float(m) for m in re.findall(r"npz_chunks\.py split \S+ \S+ --max-mib (\S+)", note)}
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    checkout = sum((REPO / p.decode()).stat().st_size for p in tracked if p and (REPO / p.decode()).is_file())
    assert math.ceil(stream_mib / max_mib) == 2  # two copies, as the plan has them
    assert (max_mib + meta_mib) * 2**20 + checkout <= 63 * 2**20, f"checkout {checkout / 2**20:.2f} MiB"  # 1 MiB spare


def test_a_reference_run_stopped_by_sigterm_keeps_its_last_epoch_and_says_so(tmp_path):
    """The acceptance run stops a stage that outlives its cap with SIGTERM: the record then says so and the last epoch's
    weights are kept (status "partial"), loadable by every reader."""
    import signal

    from hne_edge.train import model_from_checkpoint

    data = tmp_path / "train.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.integers(0, 256, (120, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 120))
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "train_reference.py"), "--data", str(data), "--out",
                             str(tmp_path / "out"), "--run-dir", str(run), "--time-budget", "1h", "--model", "hne_tiny",
                             "--device", "cpu", "--threads", "1", "--batch-size", "32", "--eval-every", "1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoint.pt").is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (run / "checkpoint.pt").is_file(), "no epoch ended"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 1
    finally:
        proc.kill()
    record = json.loads((tmp_path / "out" / "record.json").read_text())
    assert record["status"] == "partial" and "stopped by signal 15" in record["error"] and record["partial"] is True
    assert record["epochs_completed"] >= 1 and record["images_seen"] >= 96
    model, state = model_from_checkpoint(tmp_path / "out" / "checkpoint.pt")
    assert state["extra"]["partial"] is True


def test_a_sigterm_during_an_import_stops_the_run_after_the_import_not_inside_it(tmp_path):
    """Found under load: the stop met the first epoch's ``import yaml``, the half-made module stayed behind and the
    stopped run could not keep its last epoch. A module whose body receives SIGTERM is still imported whole; the
    stop comes after it."""
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "end = time.monotonic() + 0.3\n"
        "while time.monotonic() < end:\n"
        "    pass\n"
        "COMPLETE = True\n")  # fmt: skip
    script = f"""
import importlib.util, sys, time
sys.path.insert(0, {str(tmp_path)!r})
spec = importlib.util.spec_from_file_location("train_reference", {str(REPO / "benchmarks" / "train_reference.py")!r})
tr = importlib.util.module_from_spec(spec); spec.loader.exec_module(tr)
tr.stop_on_sigterm(time.monotonic())
try:
    import slow_module
    sys.stdout.write("imported " + str(slow_module.COMPLETE) + "\\n")  # one write: print() writes its parts one by one
    time.sleep(30)
    print("never stopped")
except tr.Stopped as exc:
    print("Stopped:", exc, "| imported whole:", getattr(sys.modules.get("slow_module"), "COMPLETE", False))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # the deferred stop is taken within 50 ms of the import's end: before or after the print that follows it (a
    # process descheduled there on a loaded machine took it before, CI 2026-11-30; and inside print()'s parts,
    # "importedStopped: ...", 2026-12-01 - hence one write); never inside the import
    assert lines[-1].startswith("Stopped: stopped by signal 15"), out.stdout + out.stderr
    assert lines[-1].endswith("imported whole: True") and "never stopped" not in out.stdout, out.stdout
    assert lines[:-1] in ([], ["imported True"]), out.stdout


# -- caps (the plan shared with issue 25) ----------------------------------------------------------------------


def test_stage_caps_are_seconds_and_the_runtime_group_fits_in_4_minutes():
    ga = _module()
    caps = {s.name: s.cap_s for s in ga.STAGES}
    assert list(caps)[:7] == list(ga.RUNTIME_GROUP)
    assert sum(caps[n] for n in ga.RUNTIME_GROUP) <= 240
    assert "ort-gpu" not in ga.RUNTIME_GROUP and caps["ort-gpu"] == 150  # only with --ort-gpu-parts, a call of its own
    args = ga.parse_args(["--stage-cap", "kernels=120"])
    assert {s.name: s.cap_s for s in ga.stages_for(args)}["kernels"] == 120 and args.cap_s == 480
    assert "losses" not in args.stages and "ort-gpu" in args.stages and "reference" in args.stages  # losses only when named
    assert caps["reference"] is None and {s.name: s.min_s for s in ga.STAGES}["reference"] == 240
    smoke = ga.parse_args(["--smoke"])
    assert smoke.cap_s == 1800 and {s.name: s.cap_s for s in ga.stages_for(smoke)}["doctor"] == 4 * caps["doctor"]
    with pytest.raises(SystemExit):
        ga.parse_args(["--stage-cap", "kernels"])


# -- onnxruntime-gpu from wheel parts --------------------------------------------------------------------------

STAND_IN = '''"""A stand-in for an onnxruntime-gpu wheel (tests/test_gpu_acceptance.py): the machine's onnxruntime, marked,
with a preload_dlls that records its call."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("onnxruntime", _rest)
_real = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _real
_spec.loader.exec_module(_real)
_real.STAND_IN = __file__


def _preload_dlls(cuda=True, cudnn=True, msvc=True, directory=None):
    _real.PRELOADED = True


_real.preload_dlls = _preload_dlls
'''


def stand_in_wheel(folder, version="99.0.0"):
    """A tiny pure-Python wheel named like onnxruntime-gpu's (its onnxruntime delegates to the machine's)."""
    import base64
    import hashlib

    name = f"onnxruntime_gpu-{version}-py3-none-any.whl"
    info = f"onnxruntime_gpu-{version}.dist-info"
    files = {
        "onnxruntime/__init__.py": STAND_IN,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},{len(t.encode())}"
              for p, t in files.items()] + [f"{info}/RECORD,,"]  # fmt: skip
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return folder / name


def _wheel_parts():
    spec = importlib.util.spec_from_file_location("wheel_parts", REPO / "benchmarks" / "wheel_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheel_parts_split_into_folders_and_join_byte_for_byte(tmp_path):
    wp = _wheel_parts()
    wheel = stand_in_wheel(tmp_path / "w")
    with zipfile.ZipFile(wheel, "a") as z:  # big enough for several parts of 1 KiB, hard to compress
        z.writestr("onnxruntime/capi/blob.bin", np.random.default_rng(0).bytes(5000), compress_type=zipfile.ZIP_STORED)
    parts = wp.split_wheel(wheel, tmp_path / "parts", max_mib=1 / 1024, folders=2)
    assert len(parts) >= 4 and all(p.stat().st_size <= 1024 for p in parts)
    assert {p.parent.name for p in parts} == {"a", "b"} and parts[0].name == wheel.name + ".xz.part00"
    joined = wp.join_wheel([tmp_path / "parts" / "b", tmp_path / "parts" / "a"], tmp_path / "out")
    assert joined.name == wheel.name and joined.read_bytes() == wheel.read_bytes()
    # the shell's way makes the same parts: an xz stream cut anywhere
    (tmp_path / "c").mkdir()
    blob = b"".join(p.read_bytes() for p in sorted(parts, key=lambda p: p.name))
    for i in range(0, len(blob), 700):
        (tmp_path / "c" / f"{wheel.name}.xz.part{i // 700:02d}").write_bytes(blob[i : i + 700])
    assert wp.join_wheel([tmp_path / "c"], tmp_path / "out2").read_bytes() == wheel.read_bytes()


def test_wheel_parts_that_do_not_make_a_wheel_are_named(tmp_path):
    wp = _wheel_parts()
    wheel = stand_in_wheel(tmp_path / "w")
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("onnxruntime/capi/blob.bin", np.random.default_rng(1).bytes(4000), compress_type=zipfile.ZIP_STORED)
    parts = wp.split_wheel(wheel, tmp_path / "p", max_mib=1 / 1024)
    shutil.move(parts[1], tmp_path / "aside")
    with pytest.raises(SystemExit, match=r"missing \['part01'\]"):
        wp.join_wheel([tmp_path / "p"], tmp_path / "out")
    shutil.move(tmp_path / "aside", parts[1])
    parts[-1].unlink()
    with pytest.raises(SystemExit, match="ends early"):
        wp.join_wheel([tmp_path / "p"], tmp_path / "out")
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / parts[0].name).write_bytes(b"not the same")
    with pytest.raises(SystemExit, match="in two folders with different bytes"):
        wp.join_wheel([tmp_path / "p", tmp_path / "q"], tmp_path / "out")
    with pytest.raises(SystemExit, match="expected the WHEEL.xz.partNN files of one wheel"):
        wp.join_wheel([tmp_path / "w"], tmp_path / "out")


def test_a_wheel_installs_without_pip_by_unpacking_it(tmp_path):
    ga = _module()
    wheel = stand_in_wheel(tmp_path / "w")
    how = ga.install_wheel(shutil.which("false") or "/bin/false", wheel, tmp_path / "t")  # a Python without pip
    assert how.startswith("unzipped") and (tmp_path / "t" / "onnxruntime" / "__init__.py").read_text() == STAND_IN


def test_ort_gpu_stage_stages_a_wheel_from_parts_for_its_children(tmp_path):
    """--ort-gpu-parts: the parts joined, pip install --no-deps --target into scratch, that folder first on the children's
    PYTHONPATH, torch then onnxruntime.preload_dlls() in each child; then the ONNX Runtime GPU tests (here: skipped, no
    GPU) and bench rows (here: bench_gpu's CPU smoke). A stand-in wheel on the CPU: what the children import is it."""
    wp = _wheel_parts()
    wheel = stand_in_wheel(tmp_path / "w")
    wp.split_wheel(wheel, tmp_path / "parts", max_mib=1 / 2048, folders=2)
    out = tmp_path / "acceptance"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--stages", "ort-gpu", "--out", str(out), "--ort-gpu-parts",
                           str(tmp_path / "parts" / "a"), str(tmp_path / "parts" / "b")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)  # fmt: skip
    stage = {s["name"]: s for s in json.loads((out / "acceptance.json").read_text())["stages"]}["ort-gpu"]
    assert proc.returncode == 0 and stage["status"] == "ok", (stage["status"], stage["summary"], proc.stdout[-3000:], proc.stderr[-3000:])
    figures = stage["figures"]
    assert figures["wheel"] == wheel.name and figures["installed_with"] == "pip install --no-deps --target"
    probe = figures["probe"]
    assert figures["staged_onnxruntime_imported"] and probe["onnxruntime_found"].endswith("onnxruntime/__init__.py")
    assert probe["preload_dlls"] == "called" and "CPUExecutionProvider" in probe["providers"]
    assert figures["tests"]["failed"] == 0 and figures["bench"]["status"] == "ok" and figures["bench"]["rows"]
    tests = next(c for c in stage["commands"] if "ort_gpu_child.py -m pytest" in c)
    assert all(t in tests for t in ("test_gpu_onnxruntime_cuda_every_prefix", "torch-True-segments", "cuda_fp16"))
    # every step's time and the first-leaf file's, on ONNX Runtime (here: the CPU), in raw.tar.gz (OUT keeps few files)
    (trace,) = figures["steps"].values()
    assert trace["frames"] >= 5 and trace["leaf0_ms"] > 0 and trace["first_leaf_file_ms"] > 0
    with tarfile.open(out / "raw.tar.gz") as tar:
        assert "raw/ort_steps/steps_hne_tiny_onnxruntime_b1.json" in tar.getnames()
    # the levers through the runner (here the CPU's: as shipped and without spinning), each against float64 first
    levers = figures["levers"]
    assert levers["status"] == "ok" and [(r["lever"].split(" (")[0], r["unit"]) for r in levers["rows"]] == [
        (lever, unit) for lever in ("as shipped", "no spinning") for unit in ("fused tree", "first leaf")]
    assert all(r["ms"] > 0 and not r["wrong"] for r in levers["rows"]), levers["rows"]
    assert "levers: as shipped fused tree 1.00x" in stage["summary"]


def test_the_wheel_travels_in_five_parts_each_beside_a_checkout_in_a_64_mib_copy():
    """onnxruntime-gpu 1.31.1's cp312 wheel xz-packs to a 209 MiB stream (the H200 run of 2026-11-28 staged it so): parts
    of 52 MiB make five, and each travels with the checkout (its tracked files) in a copy of at most 64 MiB; 59 MiB
    parts (four) left 5 MiB for the checkout, which is more."""
    import math

    wp = _wheel_parts()
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    checkout = sum((REPO / p.decode()).stat().st_size for p in tracked if p and (REPO / p.decode()).is_file())
    assert wp.MAX_MIB == 52 and math.ceil(wp.XZ_STREAM_MIB / wp.MAX_MIB) == 5
    assert wp.MAX_MIB * 2**20 + checkout <= 64 * 2**20, checkout
    note = (REPO / "docs" / "gpu.md").read_text()
    assert "5 parts of at most 52 MiB" in note and "split -b 52M" in note and "--folders 5" in note


def test_the_ort_gpu_stage_installs_a_wheel_once_per_work_folder(tmp_path):
    """A later call with the same --work and the same wheel (its sha256, from the parts' .sha256 file) reuses what the
    first installed: no second join (a 209 MiB stream) nor install; another wheel is installed afresh."""
    ga, wp = _module(), _wheel_parts()
    wp.split_wheel(stand_in_wheel(tmp_path / "w"), tmp_path / "parts", max_mib=1 / 2048, folders=2)
    folders = [tmp_path / "parts" / "a", tmp_path / "parts" / "b"]
    name, target, how = ga.staged_wheel(sys.executable, folders, tmp_path / "work")
    assert how == "pip install --no-deps --target" and (target / "onnxruntime" / "__init__.py").is_file()
    assert ga.staged_wheel(sys.executable, folders, tmp_path / "work") == (name, target, "reused: installed by an earlier call")
    wp.split_wheel(stand_in_wheel(tmp_path / "w2", version="99.0.1"), tmp_path / "parts2", max_mib=1 / 2048)
    name2, _, how2 = ga.staged_wheel(sys.executable, [tmp_path / "parts2"], tmp_path / "work")
    assert name2 != name and how2 == "pip install --no-deps --target"


def test_the_ort_gpu_stage_runs_a_subset_of_the_gpu_tests_that_exists_and_counts_a_cut_off_run(tmp_path):
    """The H200's nine ONNX Runtime tests took longer than the stage's time (2026-11-28: cut off, 0 reported): the stage
    runs a named subset (both buffer modes and fp16), every name of which is a test, and a run cut off before its
    junit report is counted from its verbose log."""
    ga = _module()
    assert len(ga.ORT_GPU_TESTS) == 3
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ga.ORT_GPU_TESTS],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and f"{len(ga.ORT_GPU_TESTS)} tests collected" in proc.stdout, proc.stdout[-2000:]
    log = tmp_path / "tests.log"
    log.write_text(f"{ga.ORT_GPU_TESTS[0]} PASSED [ 33%]\n{ga.ORT_GPU_TESTS[1]} FAILED [ 66%]\n")
    counts = ga.junit_counts(tmp_path / "absent.xml", log)
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (1, 1, 0)
    assert counts["failed_tests"] == [ga.ORT_GPU_TESTS[1].split("::")[1]]
