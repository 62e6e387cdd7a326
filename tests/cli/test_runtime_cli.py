"""``hne-edge run | bench | profile`` in a subprocess, as users call them."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from conftest import REPO, one_line_error, run_cli


@pytest.fixture(scope="module")
def cli_bundle(tiny_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    shutil.copytree(tiny_bundle.bundle_dir, root / "b")
    rng = np.random.default_rng(0)
    np.savez(root / "data.npz", x=rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 6))
    np.save(root / "x.npy", rng.standard_normal((2, 3, 16, 16)).astype(np.float32))
    return root


def test_run_prints_predictions_and_json(cli_bundle):
    proc = run_cli("run", str(cli_bundle / "b"), str(cli_bundle / "x.npy"), str(cli_bundle / "data.npz"), "--max-leaves", "4", check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("x.npy[0]  c") and "leaves=4/16" in lines[0] and "vote_H=" in lines[0]
    assert any(line.startswith("accuracy ") for line in lines)
    proc = run_cli("run", str(cli_bundle / "b"), str(cli_bundle / "data.npz"), "--json", "--budget-ms", "1000", "--batch-size", "3", check=True)
    document = json.loads(proc.stdout)
    records, summary = document["records"], document["summary"]
    assert len(records) == 6 and {"label", "prob", "leaves", "logit_std", "vote_entropy", "met_budget", "correct"} <= set(records[0])
    # issue 20 item 7: a summary beside the records, computed from them (accuracy a fraction, as in every JSON file)
    assert (summary["frames"], summary["samples"], summary["scored"], summary["budget_ms"]) == (2, 6, 6, 1000)
    assert summary["accuracy"] == sum(r["correct"] for r in records) / 6
    assert summary["mean_leaves"] == np.mean([r["leaves"] for r in records[::3]])
    assert summary["misses"] == sum(not r["met_budget"] for r in records[::3]) and summary["forced_misses"] == 0
    frame_ms = sorted(r["elapsed_ms"] for r in records[::3])
    assert summary["latency_ms"]["max"] == pytest.approx(frame_ms[-1], abs=1e-5)
    assert summary["latency_ms"]["p50"] == pytest.approx(np.mean(frame_ms), abs=1e-5)  # the median of two frames
    assert summary["total_leaves"] == 16 and summary["device"] == "cpu"


def test_people_read_percentages(cli_bundle, tmp_path):
    """Issue 20 item 7: accuracy was a fraction in train, bench and run (0.1220) and a percent elsewhere."""
    import re

    proc = run_cli("run", str(cli_bundle / "b"), str(cli_bundle / "data.npz"), "--max-leaves", "2", check=True)
    assert re.search(r"^accuracy \d+\.\d\d% over 6 samples$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^mean leaves 2\.00 of 16; latency per frame p50 [0-9.]+ ms, p90 ", proc.stdout, re.M)
    proc = run_cli("bench", str(cli_bundle / "b"), "--warmup", "0", "--repeats", "1", "--frames",
                   str(cli_bundle / "data.npz"), "--out", str(tmp_path / "bench"), "--quiet", check=True)  # fmt: skip
    rows = [line for line in proc.stdout.splitlines() if re.match(r"^ +\d+ ", line)]
    assert len(rows) == 16 and all(re.search(r" \d+\.\d\d%$", row) for row in rows), proc.stdout
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert 0 <= bench["levels"][0]["accuracy"] <= 1  # JSON keeps fractions
    # issue 42: bench-streams printed its expected accuracy as a fraction (0.6308)
    record = str(REPO / "hne_edge" / "assets" / "cifar10_demo.json")
    proc = run_cli("bench-streams", str(cli_bundle / "b"), "--streams", "1", "--seconds", "0.3", "--methods", "scheduler",
                   "--threads", "1", "--accuracy", record, "--quiet", check=True)  # fmt: skip
    header, row = proc.stdout.splitlines()
    assert "exp. acc" in header and re.search(r" \d+\.\d\d%( +[0-9.]+){2} +\d+%$", row), proc.stdout


def test_run_reports_input_errors_in_one_line(cli_bundle, tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 8, 8), np.float32))
    proc = run_cli("run", str(cli_bundle / "b"), str(tmp_path / "bad.npy"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("Error: bad.npy, frame 0 (samples 0..0): input image: received spatial size 8x8; "
                                   "expected 16x16 (resize the images to the bundle's input size)")  # fmt: skip


def test_cuda_graph_on_the_cpu_is_refused_naming_the_flag_and_off_is_what_the_cpu_does(cli_bundle):
    """`--cuda-graph off` (ONNX Runtime's default) was refused on the CPU, and `on` named Python options
    (['cuda_graph'], ['threads', 'spinning']) and advised --device cuda on a machine without a GPU."""
    run = ("run", str(cli_bundle / "b"), str(cli_bundle / "x.npy"))
    proc = run_cli(*run, "--cuda-graph", "off", "--device", "cpu")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    err = one_line_error(run_cli(*run, "--cuda-graph", "--device", "cpu"),
                         "--cuda-graph on: received with --device cpu", "--device cuda", "leave --cuda-graph off")
    assert "cuda_graph" not in err and "spinning" not in err, err


def test_profile_and_bench(cli_bundle, tmp_path):
    proc = run_cli("profile", str(cli_bundle / "b"), "--batch-sizes", "1,2", "--repeats", "3", "--warmup", "1",
                   "--threads", "1", "--device", "cpu", check=True)  # auto: ONNX Runtime CUDA with onnxruntime-gpu
    assert "batch=2" in proc.stdout
    # --threads 1 is not the default setup: its profile is named apart (a runner of the default threads, which
    # would take it for its own, never loads it; and neither overwrites the other's)
    assert re.search(r"^saved \S+/profiles/cpu-onnxruntime-segments-fp32-[0-9a-f]{8}\.json$", proc.stdout, re.M)
    proc = run_cli("profile", str(cli_bundle / "b"), "--batch-sizes", "1", "--repeats", "2", "--device", "cpu",
                   check=True)  # fmt: skip
    default = cli_bundle / "b" / "profiles" / "cpu-onnxruntime-segments-fp32.json"
    assert proc.stdout.splitlines()[-1] == f"saved {default}"
    assert len(list((cli_bundle / "b" / "profiles").iterdir())) == 2
    out = tmp_path / "bench"
    proc = run_cli("bench", str(cli_bundle / "b"), "--repeats", "2", "--warmup", "1", "--data", str(cli_bundle / "data.npz"), "--out", str(out), "--threads", "1", check=True)
    data = json.loads((out / "bench.json").read_text())
    assert [lv["n"] for lv in data["levels"]] == list(range(1, 17))
    assert {"median_ms", "p95_ms", "accuracy", "macs"} <= set(data["levels"][0])
    assert (out / "bench.png").is_file() and "accuracy" in proc.stdout


def test_profile_warns_on_stderr_when_it_happens_and_keeps_stdout_for_its_table(cli_bundle, tmp_path):
    """`profile` printed its warnings ("ignoring saved profile ...") on stdout as `note: ...`, after measuring."""
    bundle = tmp_path / "b"
    shutil.copytree(cli_bundle / "b", bundle)
    invalid = bundle / "profiles" / "cpu-onnxruntime-segments-fp32.json"
    invalid.parent.mkdir(exist_ok=True)
    invalid.write_text('{"format": "hne-edge-profile", "version": 1}\n')  # a profile of ours, but not valid
    proc = run_cli("profile", str(bundle), "--warmup", "0", "--repeats", "2", "--device", "cpu", check=True)
    assert "note:" not in proc.stdout and "ignoring" not in proc.stdout, proc.stdout
    assert proc.stdout.startswith("hne_tiny ") and f"saved {invalid}" in proc.stdout, proc.stdout
    err = proc.stderr.splitlines()
    said = [i for i, line in enumerate(err) if line.startswith(f"warning: ignoring saved profile {invalid}: ")]
    measuring = [i for i, line in enumerate(err) if line.startswith("profile: ")]
    assert len(said) == 1 and measuring and said[0] < measuring[0], proc.stderr  # said when read, before measuring


def test_run_output_speaks_one_vocabulary(cli_bundle, tmp_path):
    """Issue 15: --json budget_ms carried float noise, label was a name but label_true an index, the text said
    "ok" for a correct answer (an app says "ok" for a met budget), and the summary had no count of misses."""
    rng = np.random.default_rng(0)
    spec_x = rng.standard_normal((6, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "f.npz", x=spec_x, y=np.array([0, 1, 2, 3, 4, 5]))
    proc = run_cli("run", str(cli_bundle / "b"), str(tmp_path / "f.npz"), "--budget-ms", "0.3", "--json", check=True)
    records = json.loads(proc.stdout)["records"]
    assert all(r["budget_ms"] == 0.3 for r in records), [r["budget_ms"] for r in records]
    for r in records:
        assert isinstance(r["class_true"], int) and isinstance(r["label_true"], str) and isinstance(r["label"], str)
    text = run_cli("run", str(cli_bundle / "b"), str(tmp_path / "f.npz"), "--budget-ms", "0.3", check=True).stdout
    assert "  ok" not in text and ("  correct" in text or "WRONG" in text)
    assert "budget misses " in text.splitlines()[-1] and "/6 frames" in text.splitlines()[-1]


def test_profile_and_bench_print_progress_without_a_terminal(cli_bundle, tmp_path):
    proc = run_cli("profile", str(cli_bundle / "b"), "--warmup", "1", "--repeats", "3", check=True)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("profile: ")]
    assert lines and lines[-1].startswith("profile: 4/4 passes (100%)"), proc.stderr
    proc = run_cli("bench", str(cli_bundle / "b"), "--warmup", "0", "--repeats", "2", "--frames",
                   str(cli_bundle / "data.npz"), "--out", str(tmp_path / "bench"), check=True)  # fmt: skip
    assert any(line.startswith("bench: 2/2 repetitions (100%)") for line in proc.stderr.splitlines()), proc.stderr
    assert any(line.startswith("accuracy: 6/6 frames (100%)") for line in proc.stderr.splitlines()), proc.stderr
    quiet = run_cli("bench", str(cli_bundle / "b"), "--warmup", "0", "--repeats", "1", "--out", str(tmp_path / "q"),
                    "--quiet", check=True)  # fmt: skip
    # --quiet silences progress, not warnings: on a loaded machine the runner may say its profile is slower here
    assert not [line for line in quiet.stderr.splitlines() if line.startswith(("bench: ", "accuracy: ", "profile: "))], quiet.stderr


def test_run_batch_size_past_the_bundles_range_names_what_was_asked(tiny_bundle, tmp_path):
    """Issue 29 (10): `run B frames.npz --batch-size 1000` (20 frames) said "received batch size 20"."""
    np.savez(tmp_path / "frames.npz", x=np.zeros((20, 16, 16, 3), np.uint8), y=np.zeros(20, np.int64))
    line = one_line_error(run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "frames.npz"), "--batch-size", "1000"),
                          "--batch-size", "received 1000", "1..8")  # fmt: skip
    assert "received batch size 20" not in line
    proc = run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "frames.npz"), "--batch-size", "8", "--json")
    assert proc.returncode == 0, proc.stderr  # 8, 8 and the last 4: within the range


def test_run_says_once_when_the_machine_is_too_busy_for_its_budgets(cli_bundle, tmp_path):
    """Issue 28: budgets missed frame after frame on a loaded machine, silently. A profile that is 8 times faster
    than this machine (as if made on a quiet one) and a budget that fits its first leaf: every frame misses, and
    one warning line says why (not a Python warning's two lines, not once per frame)."""
    bundle = tmp_path / "b"
    shutil.copytree(cli_bundle / "b", bundle, ignore=shutil.ignore_patterns("profiles"))  # another test's, or none
    run_cli("profile", str(bundle), "--warmup", "2", "--repeats", "10", "--quiet", "--device", "cpu", check=True)
    (path,) = (bundle / "profiles").glob("*.json")
    profile = json.loads(path.read_text())
    for step in profile["batch_sizes"]["1"]["leaves"]:
        for key in ("median_ms", "p90_ms", "p95_ms", "mean_ms"):
            step[key] /= 8
        step["samples_ms"] = [t / 8 for t in step["samples_ms"]]
    path.write_text(json.dumps(profile))
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "frames.npz", x=rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 40))
    budget = profile["batch_sizes"]["1"]["leaves"][0]["p95_ms"] * 1.01
    proc = run_cli("run", str(bundle), str(tmp_path / "frames.npz"), "--budget-ms", f"{budget:.6f}", "--device", "cpu",
                   check=True)  # fmt: skip
    busy = [line for line in proc.stderr.splitlines() if "too busy" in line]
    assert len(busy) == 1 and busy[0].startswith("warning: this machine is too busy to keep its budgets"), proc.stderr
    assert "UserWarning" not in proc.stderr and "took a median " in busy[0], proc.stderr


def test_bench_reports_what_trtexec_users_read(cli_bundle, tmp_path):
    """Issue 28: users coming from trtexec/Polygraphy look for the mean, p90, p99 and the throughput, not only the
    median and p95; each is a statistic of the same repetitions, so they are ordered."""
    proc = run_cli("bench", str(cli_bundle / "b"), "--warmup", "1", "--repeats", "12", "--batch-size", "2", "--out",
                   str(tmp_path / "bench"), "--quiet", check=True)  # fmt: skip
    header = proc.stdout.splitlines()[1].split()
    assert header == ["n", "MMACs", "mean", "ms", "median", "ms", "p90", "ms", "p95", "ms", "p99", "ms", "samples/s"], header
    levels = json.loads((tmp_path / "bench" / "bench.json").read_text())["levels"]
    for level in levels:
        assert level["median_ms"] <= level["p90_ms"] <= level["p95_ms"] <= level["p99_ms"], level
        assert level["samples_per_s"] == pytest.approx(2 * 1e3 / level["mean_ms"])  # batch 2: samples per second


def test_bench_measures_for_a_duration_and_at_least_a_number_of_samples(cli_bundle, tmp_path):
    """Issue 42: bench's p99 came from 30 repetitions (its largest but one). As trtexec (--duration, --iterations):
    at least --min-samples repetitions per level and at least --duration seconds of them; the report says how many
    samples each statistic is of. --repeats N still times exactly N."""
    out = tmp_path / "bench"
    proc = run_cli("bench", str(cli_bundle / "b"), "--warmup", "0", "--duration", "0.5", "--min-samples", "3", "--out",
                   str(out), "--quiet", check=True)  # fmt: skip
    result = json.loads((out / "bench.json").read_text())
    assert result["repeats"] >= 3 and result["measured_s"] >= 0.5 * (1 - 1e-9), result  # timed runs, warm-up aside
    assert (result["min_samples"], result["duration_s"]) == (3, 0.5)
    assert f"({result['repeats']} samples per level in " in proc.stdout.splitlines()[0], proc.stdout
    proc = run_cli("bench", str(cli_bundle / "b"), "--warmup", "0", "--duration", "0", "--out", str(tmp_path / "b2"),
                   "--quiet", check=True)  # fmt: skip
    assert json.loads((tmp_path / "b2" / "bench.json").read_text())["repeats"] >= 100  # the default: p99 of 100 or more
    proc = run_cli("bench", str(cli_bundle / "b"), "--warmup", "0", "--repeats", "4", "--out", str(tmp_path / "b3"),
                   "--quiet", check=True)  # fmt: skip
    assert json.loads((tmp_path / "b3" / "bench.json").read_text())["repeats"] == 4
    help_ = run_cli("bench", "--help", check=True).stdout
    assert "--duration" in help_ and "--min-samples" in help_


def test_bench_streams_replays_cameras_through_the_scheduler_and_its_baselines(cli_bundle):
    from conftest import REPO, one_line_error
    from hne_edge.runtime.streams import GUARD_MS

    record = str(REPO / "hne_edge" / "assets" / "cifar10_demo.json")
    before = sorted(p.name for p in (cli_bundle / "b").rglob("*"))
    proc = run_cli("bench-streams", str(cli_bundle / "b"), "--streams", "1,3", "--fps", "20", "--seconds", "0.5",
                   "--threads", "1", "--accuracy", record, "--json", check=True)  # fmt: skip
    doc = json.loads(proc.stdout)
    rows = doc["rows"]
    assert doc["guard_ms"] == GUARD_MS  # the scheduler's default
    assert [(r["streams"], r["method"]) for r in rows] == [(k, m) for k in (1, 3) for m in ("scheduler", "runners", "fifo")]
    for r in rows:
        assert r["frames"] == 10 * r["streams"] and 0 <= r["rejected"] <= r["frames"] and 0 <= r["busy"] <= 1
        assert 0 <= r["expected_accuracy"] <= 0.6308 + 1e-9 and r["latency_ms"]["p99"] >= r["latency_ms"]["p50"]
    assert sorted(p.name for p in (cli_bundle / "b").rglob("*")) == before  # its profile is measured, not saved
    # --quiet: the table alone. The cost model's warning that a profile entry met 10x its time is the machine's,
    # not the command's: a 0.03 ms step's first call meeting a 0.3 ms stall on a busy host says it (flaky in CI)
    proc = run_cli("bench-streams", str(cli_bundle / "b"), "--streams", "2", "--seconds", "0.3", "--methods", "scheduler",
                   "--threads", "1", "--guard-ms", "2", "--quiet", check=True,
                   env={"PYTHONWARNINGS": "ignore:saved profile:UserWarning,ignore:in-memory profile:UserWarning"})  # fmt: skip
    assert proc.stdout.splitlines()[0].split()[:2] == ["K", "method"] and "mean leaves in time" in proc.stdout
    assert proc.stderr == ""
    proc = run_cli("bench-streams", str(cli_bundle / "b"), "--methods", "scheduler,lifo")
    one_line_error(proc, "--methods", "received 'scheduler,lifo'; expected some of scheduler,runners,fifo")
    proc = run_cli("bench-streams", str(cli_bundle / "b"), "--guard-ms", "-1")
    one_line_error(proc, "--guard-ms", "-1")


@pytest.mark.parametrize("plan", ["segments", "subtrees", "fused"])
def test_bench_gives_each_level_its_own_accuracy(plan, tmp_path):
    """bench --frames with plan subtrees (levels 1, 2, 4, 8, 16) or fused (16) gave level k the accuracy of the
    first k+1 leaves. Checked against the doctor's tiny model in float64 (torch, independent of the runtime): the
    labels are its 16-leaf answers, so level 16 scores 100% and the others what their own prefix scores."""
    from hne_edge.doctor import tiny

    shipped = tiny.unpack_shipped(tmp_path / "tiny")
    x = np.random.default_rng(3).standard_normal((40, *shipped.x.shape[1:])).astype(np.float32)
    logits = tiny.reference_logits(tiny.tiny_model(), x)  # (frames, leaves, classes) float64
    prefix = np.cumsum(logits, axis=1) / np.arange(1, logits.shape[1] + 1)[None, :, None]
    top2 = np.sort(prefix, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]).min(axis=1) > 1e-3  # no near-tie that float32 could flip
    x, prefix = x[clear], prefix[clear]
    y = prefix[:, -1].argmax(-1)
    expected = (prefix.argmax(-1) == y[:, None]).mean(axis=0)  # per leaf count 1..16
    assert len(x) >= 20 and expected[0] < 1 and len(set(expected.round(6))) > 3  # the check can tell levels apart
    np.savez(tmp_path / "frames.npz", x=x, y=y)
    run_cli("bench", str(shipped.bundle_dir), "--plan", plan, "--frames", str(tmp_path / "frames.npz"), "--device",
            "cpu", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "out"), "--quiet", check=True)  # fmt: skip
    levels = json.loads((tmp_path / "out" / "bench.json").read_text())["levels"]
    stops = {"segments": list(range(1, 17)), "subtrees": [1, 2, 4, 8, 16], "fused": [16]}[plan]
    assert [lv["n"] for lv in levels] == stops
    assert [lv["accuracy"] for lv in levels] == [pytest.approx(expected[n - 1]) for n in stops]


def test_frames_the_runner_refuses_are_refused_before_anything_runs(cli_bundle, tmp_path):
    """bench --frames of float64 or NaN frames ran the whole latency measurement, then failed; run found a NaN in
    frame 200 of 200 after 199 frames ran (their lines never printed) and named neither the file nor the frame."""
    x = np.random.default_rng(0).standard_normal((200, 3, 16, 16))
    np.savez(tmp_path / "f64.npz", x=x, y=np.zeros(200, np.int64))
    x32 = x.astype(np.float32)
    x32[-1, 0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", x=x32, y=np.zeros(200, np.int64))
    for name, fragments in (("f64.npz", ("f64.npz", "received dtype float64; expected float32")),
                            ("nan.npz", ("nan.npz", "samples 192..199", "non-finite"))):  # frames of 8: the max  # fmt: skip
        proc = run_cli("bench", str(cli_bundle / "b"), "--frames", str(tmp_path / name), "--repeats", "3", "--warmup",
                       "0", "--out", str(tmp_path / "out"))  # fmt: skip
        one_line_error(proc, *fragments)  # no progress line before it: nothing was measured
        assert not (tmp_path / "out").exists()
    proc = run_cli("run", str(cli_bundle / "b"), str(cli_bundle / "x.npy"), str(tmp_path / "nan.npz"))
    one_line_error(proc, "nan.npz", "frame 199", "non-finite")
    assert proc.stdout == ""  # nothing ran: no line of the first file's frames


def test_run_refuses_a_last_frame_below_the_bundles_batch_range_before_any_work(cli_bundle, tmp_path):
    """A bundle for batches 2..4: `run --batch-size 2` on 3 samples failed at the last frame of 1 after running the
    first, and on one image, with the hint "split the batch"; bench --frames counts every sample whatever is left."""
    from conftest import edit_manifest

    bundle = tmp_path / "b"
    shutil.copytree(cli_bundle / "b", bundle, ignore=shutil.ignore_patterns("profiles"))
    # a narrower range than the export's 1..8: every file still runs it
    edit_manifest(bundle, lambda m: m["input"].update(batch=[2, 2, 4]))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "three.npz", x=rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8), y=np.array([1, 2, 3]))
    proc = run_cli("run", str(bundle), str(cli_bundle / "x.npy"), str(tmp_path / "three.npz"), "--batch-size", "2")
    err = one_line_error(proc, "three.npz", "received batch size 1; expected 2..4", "--batch-size")
    assert "split the batch" not in err and proc.stdout == "", err  # x.npy's frame of 2 did not run either
    proc = run_cli("run", str(bundle), str(tmp_path / "three.npz"), "--batch-size", "3", "--json", check=True)
    assert json.loads(proc.stdout)["summary"]["samples"] == 3
    np.savez(tmp_path / "five.npz", x=rng.integers(0, 256, (5, 16, 16, 3), dtype=np.uint8), y=np.arange(5))
    proc = run_cli("bench", str(bundle), "--frames", str(tmp_path / "five.npz"), "--batch-size", "2", "--repeats", "1",
                   "--warmup", "0", "--out", str(tmp_path / "out"), "--quiet", "--json", check=True)  # fmt: skip
    assert json.loads(proc.stdout)["samples"] == 5  # frames of 4 and 1: the last one padded, its copies not counted


def test_run_batches_images_given_in_a_row(cli_bundle, tmp_path):
    """`run --batch-size 4` on four images ran four frames of one: each image was its own source."""
    from PIL import Image

    images = np.random.default_rng(0).integers(0, 256, (5, 16, 16, 3), dtype=np.uint8)
    paths = []
    for i, a in enumerate(images):
        Image.fromarray(a).save(tmp_path / f"cam{i}.png")
        paths.append(str(tmp_path / f"cam{i}.png"))
    proc = run_cli("run", str(cli_bundle / "b"), *paths, "--batch-size", "4", "--json", check=True)
    document = json.loads(proc.stdout)
    assert (document["summary"]["frames"], document["summary"]["samples"]) == (2, 5)  # 4, then the 1 left
    assert [(r["input"], r["index"]) for r in document["records"]] == [(f"cam{i}.png", 0) for i in range(5)]
    np.savez(tmp_path / "cams.npz", x=images)
    same = json.loads(run_cli("run", str(cli_bundle / "b"), str(tmp_path / "cams.npz"), "--batch-size", "4", "--json",
                              check=True).stdout)["records"]  # fmt: skip
    assert [r["class"] for r in document["records"]] == [r["class"] for r in same]  # the same pixels, the same answers
