"""benchmarks/ as a few tools on one harness (issue 43): each script's smoke path runs in the suite, the folder keeps
at most 12 entry points, benchmarks/results/ holds results only, and the harness (benchmarks/harness.py) times,
records the load, pins and writes reports as every script relies on it to.

Each script is run as a user runs it (a subprocess of this checkout, ``--smoke`` or its quickest equivalent); the
figures of a smoke run mean nothing, so these tests check what the reports say, never a time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "benchmarks"
MAX_SCRIPTS = 12  # issue 43: the entry points a user or the acceptance run needs

# Every file of benchmarks/ and the test that runs its smoke path (a module: the test that runs what imports it).
SMOKE = {
    "acceptance_stages.py": "tests/test_gpu_acceptance.py::test_smoke_runs_every_stage_on_the_cpu_and_writes_the_report",
    "bench_gpu.py": "tests/runtime/test_gpu_fakes.py::test_bench_gpu_runs_in_cpu_smoke_mode",
    "bench_kernels.py": "tests/test_benchmarks.py::test_bench_kernels_smoke_counts_every_plans_ops",
    "bench_runtime.py": "tests/test_benchmarks.py::test_bench_runtime_smoke_writes_every_target_row",
    "bench_streams.py": "tests/runtime/test_streams_backends.py::test_bench_streams_runs_in_smoke_mode",
    "bench_train.py": "tests/test_benchmarks.py::test_bench_train_smoke_times_the_loop_and_the_step",
    "cifar_losses.py": "tests/train/test_cifar_losses_script.py::test_seeds_summary_and_normalised_runs",
    "gpu_acceptance.py": "tests/test_gpu_acceptance.py::test_smoke_runs_every_stage_on_the_cpu_and_writes_the_report",
    "harness.py": "tests/test_benchmarks.py::test_paired_calls_alternate_abba_and_give_medians",
    "ort_gpu_child.py": "tests/test_benchmarks.py::test_ort_gpu_child_probe_says_what_it_imported",
    "record_steps.py": "tests/test_benchmarks.py::test_record_steps_smoke_writes_a_trace_the_deadline_tests_read",
    "ship_reference.py": "tests/test_ship_reference.py::test_a_reference_run_ships_with_float16_weights_and_its_record",
    "train_reference.py": "tests/test_gpu_acceptance.py::test_the_reference_stage_writes_a_checkpoint_and_record_that_eval_and_export_accept",
    "wheel_parts.py": "tests/test_gpu_acceptance.py::test_wheel_parts_split_into_folders_and_join_byte_for_byte",
}


def entry_points() -> list[str]:
    """The scripts of benchmarks/ a user runs (a ``__main__`` block); the others are modules they import."""
    return sorted(p.name for p in BENCH.glob("*.py") if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M))


def run_script(name: str, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """``python benchmarks/NAME ARGS`` from the checkout, as a user runs it (this checkout's package first), with
    ``env`` added to the environment."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)  # fmt: skip


# -- the folder's shape ----------------------------------------------------------------------------------------


def test_every_benchmark_file_has_a_test_that_runs_it():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(SMOKE), "a script without a smoke test, or a stale entry"
    for name, node in SMOKE.items():
        path, _, test = node.partition("::")
        assert re.search(rf"^def {test}\(", (REPO / path).read_text(), re.M), f"{name}: {node} is no test"
        if path != "tests/test_benchmarks.py" and name not in ("harness.py", "acceptance_stages.py"):
            assert name in (REPO / path).read_text(), f"{node} does not name {name}"


def test_benchmarks_keep_at_most_12_entry_points_and_results_hold_no_code():
    scripts = entry_points()
    assert len(scripts) <= MAX_SCRIPTS, f"{len(scripts)} scripts in benchmarks/ (at most {MAX_SCRIPTS}): {scripts}"
    code = sorted(str(p.relative_to(REPO)) for p in (BENCH / "results").rglob("*.py"))
    assert not code, f"benchmarks/results/ holds results only; found {code}"
    modules = sorted(set(SMOKE) - set(scripts))
    assert modules == ["acceptance_stages.py", "harness.py"], modules  # the acceptance run's stages and the harness


# -- the harness -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCH))
    try:
        import harness as module
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_the_busy_neighbours_run_while_measured_and_end_with_the_block(harness, monkeypatch):
    """`bench_streams --busy N` starts its own busy loops and stops them (issue 39 item 5): they run while the block
    measures, none outlives it (killed on exit, and each ends by itself after its time should the parent die)."""
    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(harness.subprocess, "Popen", popen)
    with harness.cpu_load(2, seconds=60) as running:
        assert running() and len(started) == 2 and all(p.poll() is None for p in started)
    assert all(p.poll() is not None for p in started)  # killed and reaped at the block's end
    with harness.cpu_load(1, seconds=0.1) as running:
        started[-1].wait(timeout=30)  # the loop's own end: the block learns that it outlasted the load
        assert not running()


def test_paired_calls_alternate_abba_and_give_medians(harness):
    order: list[str] = []
    a_ms, b_ms = harness.paired(lambda: order.append("a"), lambda: order.append("b"), repeats=4)
    assert "".join(order) == "abbaabba"  # each follows the other as often as itself
    assert a_ms >= 0 and b_ms >= 0
    ta, tb = harness.paired_times(lambda: None, lambda: None, repeats=3)
    assert len(ta) == len(tb) == 3


def test_rotation_shifts_the_order_each_repeat_after_its_warmup(harness):
    order: list[str] = []
    medians = harness.rotation({k: (lambda k=k: order.append(k)) for k in "abc"}, repeats=3, warmup=1)
    assert "".join(order) == "abc" + "abc" + "bca" + "cab" and set(medians) == set("abc")


def test_a_report_is_written_whole_with_its_figures_beside_it(harness, tmp_path):
    out = harness.write_report(tmp_path / "deep" / "r.md", "# r\n", {"ms": float("nan"), "rows": [1]})
    assert out.read_text() == "# r\n" and json.loads(out.with_suffix(".json").read_text().replace("NaN", "null"))["rows"] == [1]
    assert harness.write_report(None, "x") is None and sorted(p.name for p in out.parent.iterdir()) == ["r.json", "r.md"]


def test_the_load_record_states_the_range_it_saw(harness, monkeypatch):
    record = harness.LoadRecord()
    assert str(record) == "load average unknown"
    for value in (2.04, 0.4, 3.71):
        monkeypatch.setattr(harness, "load_average", lambda value=value: value)
        record.note()
    assert str(record) == "load average 0.4-3.7"
    assert "CPUs" in harness.machine() and harness.machine(gpu="NVIDIA H200").startswith("NVIDIA H200; ")


def test_the_command_line_names_the_script_in_the_checkout(harness):
    assert harness.command_line([str(BENCH / "bench_runtime.py"), "--smoke"]) == "python benchmarks/bench_runtime.py --smoke"


def test_a_script_that_imports_the_harness_runs_this_checkout(tmp_path):
    """Run from elsewhere, with no PYTHONPATH: the checkout beside the script is what it measures, not an installed
    hne_edge (a virtualenv's editable install may point at another checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import harness, hne_edge; print(hne_edge.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve().is_relative_to(REPO), proc.stdout


# -- each script's smoke path (hne_tiny, a few calls: the code paths, not figures) ------------------------------


def test_bench_runtime_smoke_writes_every_target_row(tmp_path):
    """The runtime targets (make bench), with the deadline rows under load: every row for every batch size."""
    out = tmp_path / "runtime.md"
    proc = run_script("bench_runtime.py", "--smoke", "--load-seconds", "3", "--workdir", str(tmp_path / "w"), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text, data = out.read_text(), json.loads(out.with_suffix(".json").read_text())
    assert "smoke run: not figures" in text and text.count("| 1 |") == text.count("| 2 |") == 7, text
    assert data["command"].startswith("python benchmarks/bench_runtime.py --smoke") and "load average" in data["load"]
    for row in data["rows"]:
        assert row["overhead_ratio"] > 0 and 0 <= row["deadlines"]["miss_rate"] <= 1 and row["loaded"]["mean_leaves"] >= 1


@pytest.mark.parametrize("mode, rows", [("--plans", 2), ("--export", 1)])  # a row per batch size; per model
def test_bench_runtime_plans_and_export_smoke(tmp_path, mode, rows):
    """--plans (issue 21's rows per batch size) and --export (a row per plan and precision) run as written."""
    out = tmp_path / "r.md"
    proc = run_script("bench_runtime.py", "--smoke", mode, "--workdir", str(tmp_path / "w"), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert len(data["rows"]) == rows
    if mode == "--export":
        exports = data["rows"][0]["exports"]
        assert [(e["plan"], e["precision"]) for e in exports] == [("segments", "fp32"), ("segments", "fp16")]
        assert all(e["bytes"] > 0 and e["files"] > 16 for e in exports)  # 16 segments + the first-leaf file
    else:
        assert all(0 <= r["deadlines"]["mixed_misses"] <= 1 for r in data["rows"])


@pytest.mark.parametrize("script, args, flag", [
    ("bench_runtime.py", ["--repeats", "0"], "--repeats"), ("bench_runtime.py", ["--frames", "0"], "--frames"),
    ("bench_runtime.py", ["--batches", "0"], "--batches"), ("bench_runtime.py", ["--threads", "-1"], "--threads"),
    ("bench_streams.py", ["--seconds", "0"], "--seconds"), ("bench_streams.py", ["--streams", "0"], "--streams"),
    ("bench_streams.py", ["--repeats", "0"], "--repeats"), ("bench_streams.py", ["--threads", "-1"], "--threads"),
    ("record_steps.py", ["--frames", "0", "--out", "o"], "--frames"),
    ("record_steps.py", ["--seconds", "0", "--out", "o"], "--seconds"),
    ("bench_train.py", ["--pairs", "0"], "--pairs"), ("bench_train.py", ["--threads", "-1"], "--threads"),
])
def test_a_count_or_time_that_cannot_run_is_refused_when_parsed(tmp_path, script, args, flag):
    """--repeats 0, --frames 0, --threads -1 ... were tracebacks, some after minutes of export and timing."""
    proc = run_script(script, "--smoke", *args, "--workdir", str(tmp_path / "w"), timeout=60) if script != \
        "bench_train.py" else run_script(script, *args, "--json", str(tmp_path / "t.json"), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("Error: ") and flag in line and f"received {args[1]!r}" in line and "expected" in line
    assert not (tmp_path / "w").exists()  # refused before any export


def test_smoke_fills_only_the_options_the_user_did_not_give(tmp_path):
    """--smoke replaced --batches and --frames the user typed while the report recorded the command as typed."""
    out = tmp_path / "r.md"
    proc = run_script("bench_runtime.py", "--smoke", "--plans", "--batches", "3", "--frames", "2", "--workdir",
                      str(tmp_path / "w"), "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["batch"] for r in data["rows"]] == [3] and "--batches 3 --frames 2" in data["command"]
    assert [r["deadlines"]["frames"] for r in data["rows"]] == [2]


def test_bench_kernels_smoke_counts_every_plans_ops(tmp_path):
    out = tmp_path / "kernels.md"
    proc = run_script("bench_kernels.py", "--device", "cpu", "--smoke", "--workdir", str(tmp_path / "w"), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert set(data["per_plan"]) == {"segments", "subtrees", "fused"} and "smoke run: not figures" in data["where"]
    assert [u["unit"] for u in data["units"]] == ["fused tree", "first leaf"]


def test_bench_kernels_levers_check_every_prefix_then_time_them_side_by_side(tmp_path):
    """``--levers``: each lever this device has (the GPU-only ones left out on the CPU), both units, every prefix of
    the fused tree against float64, each timed against the backend as shipped (alternated ABBA)."""
    out = tmp_path / "levers.md"
    proc = run_script("bench_kernels.py", "--device", "cpu", "--smoke", "--levers", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.with_suffix(".json").read_text())["levers"]
    assert [r["lever"].split(" (")[0] for r in rows[::2]] == ["as shipped", "bfloat16", "fp16", "dense <= 16 groups",
                                                              "dense <= 4 groups", "1x1 as bmm"]  # fmt: skip
    assert all(r["unit"] == ("fused tree", "first leaf")[i % 2] and "error" not in r for i, r in enumerate(rows))
    assert [len(r["prefix_errors"]) for r in rows[:2]] == [5, 1]  # hne_tiny: 1, 2, 4, 8, 16 leaves; the first leaf
    assert not any(r["wrong"] for r in rows) and all(r["ms"] > 0 for r in rows)
    assert rows[0]["vs_shipped"] == rows[1]["vs_shipped"] == 1.0
    assert all(r["vs_shipped"] == r["ms"] / r["shipped_ms"] for r in rows[2:])  # each against the shipped, paired
    bf16 = next(r for r in rows if r["options"] == {"bfloat16": True})
    assert bf16["max_error_vs_float64"] > 1e-6 > rows[0]["max_error_vs_float64"]  # bfloat16 really computed
    assert "| dense <= 16 groups (dense_groups=16) | fused tree |" in out.read_text()


def test_bench_kernels_levers_score_each_levers_held_out_accuracy(tmp_path):
    """``--accuracy-data`` (with ``--checkpoint``): each lever's fused tree scored on the checkpoint's held-out split of
    a training file, at every prefix; levers that compute the same function in fp32 score as the shipped one. Here
    the demo's CPU-trained checkpoint on a small random CIFAR-shaped file (the code path, not a figure)."""
    import numpy as np

    data = tmp_path / "cifar.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.integers(0, 256, (400, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 400))
    out = tmp_path / "levers.md"
    proc = run_script("bench_kernels.py", "--device", "cpu", "--levers", "--repeats", "2", "--checkpoint",
                      str(REPO / "hne_edge" / "assets" / "cifar10_demo.pt"), "--accuracy-data", str(data), "--out",
                      str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    scored = {r["lever"].split(" (")[0]: r["accuracy_pct"] for r in json.loads(out.with_suffix(".json").read_text())["levers"]
              if "accuracy_pct" in r}  # fmt: skip
    assert set(scored) == {"as shipped", "bfloat16", "fp16", "dense <= 16 groups", "dense <= 4 groups", "1x1 as bmm"}
    assert all(list(acc) == ["1", "2", "4", "8", "16"] and all(0 <= v <= 100 for v in acc.values()) for acc in scored.values())
    assert scored["1x1 as bmm"] == scored["dense <= 16 groups"] == scored["as shipped"]  # the same function in fp32
    assert "Held-out top-1 (%) of each lever's fused tree" in out.read_text()
    bad = run_script("bench_kernels.py", "--levers", "--accuracy-data", str(data), "--out", str(tmp_path / "x.md"))
    assert bad.returncode == 2 and "--accuracy-data: expected --levers, the torch backend and --checkpoint" in bad.stderr


def test_bench_kernels_onnxruntime_levers_run_through_the_runner(tmp_path):
    """``--levers --backend onnxruntime``: the bundle's fused file and first-leaf file through AnytimeRunner, each lever
    (on the CPU: as shipped, and without spinning) checked against float64 at every prefix, then timed against the
    shipped runners; the bundle is bench_gpu's, exported into --workdir once."""
    out = tmp_path / "ort_levers.md"
    proc = run_script("bench_kernels.py", "--device", "cpu", "--smoke", "--levers", "--backend", "onnxruntime",
                      "--batch", "2", "--workdir", str(tmp_path / "w"), "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.with_suffix(".json").read_text())
    rows = data["levers"]
    names = [r["lever"].split(" (")[0] for r in rows]
    assert data["backend"] == "onnxruntime" and names == ["as shipped"] * 2 + ["no spinning"] * 2
    assert [len(r["prefix_errors"]) for r in rows] == [5, 1, 5, 1] and not any(r["wrong"] or "error" in r for r in rows)
    assert all(r["relative_error"] < 1e-5 and r["ms"] > 0 for r in rows) and rows[2]["vs_shipped"] > 0
    assert "Levers on hne_tiny (seed 0: the bundle's weights), onnxruntime, one at a time from the backend as shipped " \
           "(batch 2," in out.read_text()
    bad = run_script("bench_kernels.py", "--levers", "--batch", "17", "--out", str(tmp_path / "x.md"))
    assert bad.returncode == 2 and "--batch: received 17; expected 1..16" in bad.stderr


def test_a_lever_that_changes_the_function_is_marked_wrong(monkeypatch):
    """The check before the clock: a block-diagonal weight with its blocks in the wrong place is fast and wrong."""
    import numpy as np
    import torch

    from hne_edge.models import create_model, layers

    def misplaced(module, max_groups):
        for conv in module.modules():
            if isinstance(conv, torch.nn.Conv2d) and 1 < conv.groups <= max_groups and conv.in_channels != conv.groups:
                conv.weight = torch.nn.Parameter(conv.weight.detach().repeat(1, conv.groups, 1, 1))  # every block
                conv.groups = 1
        return module

    monkeypatch.syspath_prepend(str(BENCH))
    import bench_kernels

    dense = [lever for lever in bench_kernels.LEVERS if lever[1] == {"dense_groups": 16}]
    monkeypatch.setattr(bench_kernels, "LEVERS", bench_kernels.LEVERS[:1] + tuple(dense))
    monkeypatch.setattr(layers, "densify_groups", misplaced)
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    rows = bench_kernels.levers_table(create_model("hne_tiny").eval(), "cpu", x, False, 2, torch, lambda rows: None)
    assert [(r["lever"].split(" (")[0], r["wrong"]) for r in rows] == [
        ("as shipped", False), ("as shipped", False), ("dense <= 16 groups", True), ("dense <= 16 groups", False)]
    # the first leaf is one branch: no grouped convolution to misplace


def test_record_steps_smoke_writes_a_trace_the_deadline_tests_read(tmp_path):
    proc = run_script("record_steps.py", "--smoke", "--batches", "1,2", "--out", str(tmp_path), "--workdir",
                      str(tmp_path / "w"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for batch in (1, 2):
        trace = json.loads((tmp_path / f"steps_hne_tiny_onnxruntime_b{batch}.json").read_text())
        assert trace["batch"] == batch and len(trace["frames_ms"]) == len(trace["entry_ms"]) == 5
        assert all(len(frame) == len(trace["steps"]) for frame in trace["frames_ms"])
        assert trace["command"].startswith("python benchmarks/record_steps.py --smoke") and "not figures" in trace["machine"]


def test_bench_train_smoke_times_the_loop_and_the_step(tmp_path):
    """The acceptance run's bench-train stage as its --smoke runs it: the loop against the step alone, each formulation."""
    out = tmp_path / "train.json"
    proc = run_script("bench_train.py", "--device", "cpu", "--model", "hne_tiny", "--batch", "16", "--limit", "32",
                      "--epochs", "1", "--threads", "1", "--pairs", "1", "--step-seconds", "0.3", "--pointwise", "conv,bmm",
                      "--data", "", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["loop_vs_step"] > 0 and set(figures["step"]) == {"conv", "bmm"} and figures["not_measured"] == []
    assert "| the loop (train_one_epoch), 1 pairs | conv |" in proc.stdout


@pytest.mark.parametrize("args, named", [
    # below the CPU default batch (128): the loader drops the last partial batch
    (["--limit", "100"], "--limit: received 100"),
    (["--batch", "64", "--limit", "32"], "--limit: received 32"),
    (["--batch", "0", "--limit", "32"], "--batch"),  # was the default batch, silently
])
def test_bench_train_refuses_a_limit_without_one_full_batch_before_timing(tmp_path, args, named):
    """No full batch was a ZeroDivisionError traceback after the step alone had been timed (0 batches an epoch)."""
    out = tmp_path / "train.json"
    proc = run_script("bench_train.py", "--device", "cpu", "--model", "hne_tiny", "--epochs", "1", "--pairs", "1",
                      "--step-seconds", "0.3", "--threads", "1", "--data", "", "--json", str(out), *args)  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("Error: ") and named in error[0], proc.stderr
    assert "expected" in error[0]
    assert "Traceback" not in proc.stderr and not out.exists()  # refused before any figure


@pytest.mark.parametrize("script, args", [
    ("bench_streams.py", ["--smoke", "--streams", "1", "--seconds", "0.3", "--methods", "fifo"]),
    ("record_steps.py", ["--smoke", "--frames", "2", "--out", "OUT"]),
    ("bench_train.py", ["--device", "cpu", "--model", "hne_tiny", "--batch", "16", "--limit", "16", "--epochs", "1",
                        "--threads", "1", "--pairs", "1", "--step-seconds", "0.1", "--no-loop", "--data", ""]),
])
def test_a_run_without_workdir_removes_the_temporary_folder_it_made(tmp_path, script, args):
    """A bundle export (bench_streams, record_steps via bench_gpu.bundle_for) or synthetic data (bench_train, ~79 MB
    at the default --limit) was left in a fresh folder of the temporary directory by every run."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    proc = run_script(script, *args, TMPDIR=str(tmp))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # torch's kernel cache (torchinductor_USER) and hidden files are other programs', kept on purpose
    assert [p.name for p in tmp.iterdir() if not p.name.startswith(("torchinductor_", "."))] == []


def test_bench_train_refuses_data_that_is_not_there(tmp_path):
    """A mistyped --data trained on synthetic images, silently: figures of other data than the user named."""
    missing = tmp_path / "cifar10_trian.npz"
    proc = run_script("bench_train.py", "--device", "cpu", "--model", "hne_tiny", "--data", str(missing), timeout=60)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("Error: --data: received ") and str(missing) in line and "expected" in line


def test_bench_train_time_budget_runs_pair_the_plan_fixed_once_with_the_shortened_one(tmp_path):
    """--time-budget-runs: for each neighbour time, pairs of runs (the plan fixed once, the product's shortened plan),
    each reporting the seconds it used against the budget, the steps it planned and ran, and its shortenings."""
    out = tmp_path / "budget.json"
    proc = run_script("bench_train.py", "--time-budget-runs", "4", "--neighbour-at", "1", "--repeats", "1",
                      "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["plan"] for r in rows] == ["fixed once", "shortened"] and {r["neighbour_at_s"] for r in rows} == {1.0}
    assert all(r["used_s"] > 0 and r["steps"] <= r["planned_steps"] for r in rows)
    assert not rows[0]["shortened"]  # the plan fixed once never shortens, whatever the neighbour did
    assert "neighbour from 1 s, plan shortened: used / budget median" in proc.stdout


def test_ort_gpu_child_probe_says_what_it_imported(tmp_path):
    out = tmp_path / "probe.json"
    proc = run_script("ort_gpu_child.py", "--probe", str(out))
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(out.read_text())
    assert probe["onnxruntime_found"].endswith("__init__.py") and "CPUExecutionProvider" in probe["providers"]
