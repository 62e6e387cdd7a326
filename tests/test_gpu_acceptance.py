"""benchmarks/gpu_acceptance.py: --smoke runs every stage's code path on the CPU and reports; a run cut off by
its cap still reports; CIFAR parts made by ../shared/tools/npz_chunks.py (spread over two folders, as they travel)
are joined byte for byte."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, run_cli
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
    assert list(stages) == ["doctor", "gpu-tests", "bench-gpu", "bench-train", "reference", "losses"]
    assert stages.pop("losses")["status"] == "skipped"  # not a default stage: `reference` covers it
    assert all(s["status"] == "ok" for s in stages.values()), {k: (s["status"], s["summary"]) for k, s in stages.items()}
    assert report["smoke"] is True and report["elapsed_s"] <= report["cap_s"]
    assert all(c["ok"] for c in stages["doctor"]["figures"]["checks"])
    tests = stages["gpu-tests"]["figures"]
    assert tests["failed"] == 0 and (tests["skipped"] > 0 if not HAS_CUDA else tests["passed"] > 0)
    rows = stages["bench-gpu"]["figures"]["rows"]
    assert {r["plan"] for r in rows} == {"segments", "subtrees", "mixed"} and all("error" not in r for r in rows)
    train = stages["bench-train"]["figures"]
    assert set(train["step"]) == {"conv", "bmm"} and all(s["images_per_s"] > 0 and s["ops"] > 0 for s in train["step"].values())
    assert len(train["pairs"]) == 1 and train["loop_vs_step"] > 0 and "overhead_pct" in train
    reference = stages["reference"]["figures"]["objectives"]
    assert list(reference) == ["hierarchical"] and reference["hierarchical"]["status"] == "ok"
    assert set(reference["hierarchical"]["accuracy_pct"]) == {str(n) for n in range(1, 17)}
    assert {"checkpoint.pt", "config.yaml", "record.json"} <= {p.name for p in out.iterdir()}
    md = (out / "acceptance.md").read_text()
    assert "--smoke on the CPU: not figures" in md and "## Where each figure goes" in md
    assert "BENCHMARKS.md 'Training throughput" in proc.stdout and "BENCHMARKS.md 'GPU runtime" in proc.stdout
    assert not list(out.rglob("*.npz"))  # the joined data sets stayed in the scratch folder, which is gone


def test_the_reference_stage_writes_a_checkpoint_and_record_that_eval_and_export_accept(tmp_path):
    """--smoke --stages reference: hne_tiny on synthetic CIFAR parts (joined, as the real ones), two objectives, each to its
    share of the time; OUT holds at most 8 files, at most 2 folders deep (what a GPU machine hands back); the
    checkpoint is what `hne-edge eval` and `hne-edge export` read, and the record says how it was made."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--stages", "reference", "--out", str(out), "--work",
                           str(work), "--reference-objectives", "hierarchical", "independent"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["acceptance.json", "acceptance.md", "checkpoint.pt", "config.yaml", "independent/checkpoint.pt",
                     "independent/record.json", "logs/reference.log", "record.json"]  # fmt: skip
    assert all((out / f).stat().st_size < 16 * 2**20 for f in files)
    stage = {s["name"]: s for s in json.loads((out / "acceptance.json").read_text())["stages"]}["reference"]
    assert stage["status"] == "ok" and set(stage["figures"]["objectives"]) == {"hierarchical", "independent"}
    record = json.loads((out / "record.json").read_text())
    data = work / "data" / "cifar_train.npz"
    from hne_edge.train.data import npz_fingerprint

    assert record["status"] == "ok" and record["data"]["sha256"] == npz_fingerprint(data)
    assert record["config"]["loss"] == {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0, "weighting": "paper",
                                        "temperature_squared": False, "normalize": "none"}  # fmt: skip
    assert record["config"]["data"]["holdout"] == "last" and record["data"]["validation_images"] == 26  # 10% of 256
    assert record["images_seen"] > 0 and record["plan"]["total_steps"] * 32 == record["images_seen"]
    assert [r["n"] for r in record["held_out"]] == list(range(1, 17)) and record["machine"]["torch"]
    assert json.loads((out / "independent" / "record.json").read_text())["config"]["loss"]["kind"] == "independent"
    ev = run_cli("eval", str(out / "checkpoint.pt"), "--data-dir", str(data), "--out", str(tmp_path / "eval"), "--no-plots",
                 check=True)  # fmt: skip
    held_out = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert held_out["num_images"] == 26 and "16" in ev.stdout
    assert held_out["anytime"][-1]["accuracy"] == pytest.approx(record["held_out"][-1]["accuracy"])
    run_cli("export", str(out / "checkpoint.pt"), "--out", str(tmp_path / "bundle"), check=True)
    assert (tmp_path / "bundle" / "manifest.json").is_file()


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
    assert "| 3 | bench_gpu.py short" in (run.out / "acceptance.md").read_text()


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
