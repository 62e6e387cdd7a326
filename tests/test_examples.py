"""Every example runs, as a user would run it (a subprocess), on a real exported bundle."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, blocking_env

EXAMPLES = REPO / "examples"

def run_example(name: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    # the checkout under test first: a script's sys.path[0] is examples/, so it would otherwise import the
    # installed hne_edge (in a git worktree, another checkout's) and test that instead
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path) -> Path:
    """A private copy: the examples write cost profiles next to the bundle."""
    return Path(shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle"))


@pytest.fixture
def labelled_frames(tiny_bundle, tmp_path) -> Path:
    """Frames labelled by the tiny model's own fused predictions, every 4th moved to the next class: the accuracy
    of every leaf count lies strictly between 0 and 100%, so a count that is not the real one shows."""
    import torch

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(40, 16, 16, 3), dtype=np.uint8)
    mean = np.array([0.49, 0.48, 0.45], np.float32)
    std = np.array([0.25, 0.24, 0.26], np.float32)
    xn = ((x / 255.0 - mean) / std).transpose(0, 3, 1, 2).astype(np.float32)
    with torch.no_grad():
        y = tiny_bundle.model(torch.from_numpy(xn)).mean(1).argmax(-1).numpy()
    y[::4] = (y[::4] + 1) % 10
    path = tmp_path / "frames.npz"
    np.savez(path, x=x, y=y)
    return path


def test_embedded_app_is_torch_free(bundle_copy, labelled_frames, tmp_path):
    env = blocking_env(tmp_path, "torch")
    proc = run_example("embedded_app.py", str(bundle_copy), "--frames", str(labelled_frames), "--count", "40", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in proc.stdout.splitlines() if l.startswith("frame")]
    assert len(lines) == 40 and all("leaves=16" in line for line in lines)  # no budget: every leaf
    # each answer and the accuracy, against the runner run here on the same frames and the file's own labels (they
    # were the model's predictions, which made any count 100%)
    from hne_edge.runtime import AnytimeRunner

    with np.load(labelled_frames) as data, AnytimeRunner(bundle_copy) as runner:
        answers = [runner.run(runner.preprocess(frame[None])) for frame in data["x"]]
        correct = sum(int(a.predictions[0] == label) for a, label in zip(answers, data["y"]))
    assert [line.split()[2] for line in lines] == [a.labels[0] for a in answers]
    assert 0 < correct < 40 and f"accuracy {correct / 40:.2%} on 40 labelled frames" in proc.stdout, proc.stdout


def test_embedded_app_budget_and_bad_bundle(bundle_copy, tmp_path):
    proc = run_example("embedded_app.py", str(bundle_copy), "--count", "5", "--budget-ms", "1000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("frame") == 5
    proc = run_example("embedded_app.py", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr.startswith("Error: ") and "bundle directory not found" in proc.stderr


def test_autonomous_stack(bundle_copy, labelled_frames, tmp_path):
    out = tmp_path / "stack"
    proc = run_example("autonomous_stack.py", str(bundle_copy), "--frames", str(labelled_frames), "--count", "40",
                       "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with open(out / "timeline.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40
    for r in rows:
        assert 1 <= int(r["first_leaves"]) <= int(r["final_leaves"]) <= 16  # refining only adds leaves
        assert 0.05 <= float(r["load"]) <= 0.9
    assert (out / "timeline.png").stat().st_size > 10_000
    # what it prints, against the CSV and against the runner run here: each row's answers are those of its leaves
    # on the same frame, its accuracy that of its answers against the file's labels (not the CSV's own columns)
    from hne_edge.runtime import AnytimeRunner

    with np.load(labelled_frames) as data, AnytimeRunner(bundle_copy) as runner:
        x, y = runner.preprocess(data["x"][:40]), data["y"][:40]
        for r in rows:
            for leaves, pred in ((r["first_leaves"], r["first_pred"]), (r["final_leaves"], r["final_pred"])):
                t = int(r["frame"])
                assert int(pred) == runner.run(x[t : t + 1], max_leaves=int(leaves)).predictions[0], r
    on_time = np.mean([int(r["first_pred"]) == label for r, label in zip(rows, y)])
    refined = np.mean([int(r["final_pred"]) == label for r, label in zip(rows, y)])
    assert f"accuracy on time {on_time:.2%}; after refining {refined:.2%}" in proc.stdout, proc.stdout
    assert f"leaves on time: mean {np.mean([int(r['first_leaves']) for r in rows]):.2f}; after refining in slack: " \
           f"mean {np.mean([int(r['final_leaves']) for r in rows]):.2f}" in proc.stdout, proc.stdout  # fmt: skip
    # the summary counts what the CSV shows: a late answer is one whose latency (from the frame's start) is past its
    # budget; it counted the runner's met_budget, timed from refine (41 rows over budget, 14 said late, on digits)
    late = sum(float(r["first_latency_ms"]) > float(r["budget_ms"]) for r in rows)
    assert all(int(r["first_met_budget"]) == (float(r["first_latency_ms"]) <= float(r["budget_ms"])) for r in rows)
    assert f"answers late: {late} (" in proc.stdout, proc.stdout


def test_autonomous_stack_without_matplotlib_keeps_its_csv(bundle_copy, tmp_path):
    """Reproduces issue 28: on a runtime-only install the stack wrote its CSV, then crashed importing matplotlib.
    It degrades as `hne-edge bench` does: the CSV and the summary, a note instead of the PNG, exit 0."""
    out = tmp_path / "stack"
    env = blocking_env(tmp_path, "matplotlib", "torch")
    proc = run_example("autonomous_stack.py", str(bundle_copy), "--count", "20", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "answers late:" in proc.stdout
    assert f"wrote {out / 'timeline.csv'} (matplotlib not installed: no PNG)" in proc.stdout, proc.stdout
    assert len((out / "timeline.csv").read_text().splitlines()) == 21 and not (out / "timeline.png").exists()


def test_examples_speak_as_the_cli_does(bundle_copy, tmp_path):
    """Issue 20 item 8: train_cifar took --dataset where the CLI takes --data; the examples printed `error:`
    where the CLI prints `Error:`; autonomous_stack --period-ms -1 ended in a traceback and 0 meant the default."""

    def one_line_error(proc, *fragments):
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in proc.stderr, proc.stderr
        assert all(f in lines[0] for f in fragments), lines[0]

    for period in ("-1", "0", "nan"):
        one_line_error(run_example("autonomous_stack.py", str(bundle_copy), "--period-ms", period, "--out",
                                   str(tmp_path / "s")), f"argument --period-ms: received '{period}'; expected a number "
                       "of milliseconds > 0", "(see autonomous_stack.py --help)")  # fmt: skip
    assert not (tmp_path / "s").exists()
    one_line_error(run_example("embedded_app.py", str(bundle_copy), "--budget-ms", "-2"), "--budget-ms: received '-2'")
    one_line_error(run_example("train_cifar.py", "--data", "npz", "--data-dir", str(tmp_path / "none.npz")),
                   "npz data not found")
    one_line_error(run_example("train_cifar.py", "--dataset", "npz", "--data-dir", str(tmp_path / "none.npz")),
                   "npz data not found")  # the old spelling still works, and is no longer advertised
    helptext = run_example("train_cifar.py", "--help").stdout
    assert "--data {cifar10,cifar100,npz}" in helptext and "--dataset" not in helptext and "--val-limit" in helptext

    # frame files as `hne-edge run` reads them: each was a KeyError / IndexError / numpy traceback (exit 1), an
    # empty one a 0-byte timeline.csv and an IndexError; a negative seed numpy's ValueError
    bad = {"no_x.npz": lambda p: np.savez(p, y=np.zeros(3, np.int64)), "empty.npz": lambda p: p.write_bytes(b""),
           "text.npz": lambda p: p.write_text("hello"),
           "short_y.npz": lambda p: np.savez(p, x=np.zeros((4, 16, 16, 3), np.uint8), y=np.zeros(2, np.int64)),
           "no_frames.npz": lambda p: np.savez(p, x=np.zeros((0, 16, 16, 3), np.uint8))}  # fmt: skip
    for name, make in bad.items():
        make(tmp_path / name)
        for example, out in (("embedded_app.py", ()), ("autonomous_stack.py", ("--out", str(tmp_path / "s")))):
            one_line_error(run_example(example, str(bundle_copy), "--frames", str(tmp_path / name), *out), name)
    assert not (tmp_path / "s").exists()  # nothing written for input it refused
    for example in ("autonomous_stack.py", "multi_camera.py"):
        one_line_error(run_example(example, str(bundle_copy), "--seed", "-1", "--out", str(tmp_path / "s"))
                       if example == "autonomous_stack.py" else run_example(example, str(bundle_copy), "--seed", "-1"),
                       "--seed: received '-1'; expected an integer >= 0")  # fmt: skip
    one_line_error(run_example("multi_camera.py", str(bundle_copy), "--cameras", str(tmp_path / "nope")),
                   "nope does not exist")  # it said "holds no image files"


def test_shipped_training_configs_load():
    from hne_edge.train import TrainConfig

    configs = sorted((EXAMPLES / "configs").glob("*.yaml"))
    assert configs, "examples/configs should ship the paper's recipes"
    for path in configs:
        cfg = TrainConfig.from_file(path)
        assert cfg.optim.epochs == 200 and cfg.optim.batch_size == 128 and cfg.optim.lr == 0.1
        assert cfg.optim.weight_decay == 5e-4 and cfg.optim.momentum == 0.9 and not cfg.optim.nesterov
        assert cfg.loss.kind == "hierarchical" and cfg.loss.alpha == 0.5 and cfg.loss.temperature == 2.0
        assert cfg.loss.weighting == "paper" and cfg.loss.normalize == "none"  # the paper's objective


def test_train_cifar_example_on_real_data(shared_cifar10, tmp_path):
    out = tmp_path / "run"
    with np.load(shared_cifar10) as data:  # a stand-in for the user's own test set: 200 images in the training format
        np.savez(tmp_path / "test.npz", x=data["x"][:200], y=data["y"][:200], classes=data["classes"])
    proc = run_example("train_cifar.py", "--data", "npz", "--data-dir", str(shared_cifar10), "--model", "hne_tiny",
                       "--epochs", "1", "--limit", "512", "--out", str(out), "--test-data", str(tmp_path / "test.npz"),
                       timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "checkpoint.pt").is_file()
    assert "validation accuracy by ensemble size: n=1:" in proc.stdout
    assert f"test accuracy ({tmp_path / 'test.npz'}) by ensemble size: n=1:" in proc.stdout


def test_export_tensorrt_example_without_tensorrt(bundle_copy):
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - only on a TensorRT machine
        pytest.skip("TensorRT is installed: this test checks the message users get without it")
    from hne_edge.runtime.backends.cuda import no_gpu_here

    proc = run_example("export_tensorrt.py", str(bundle_copy))
    assert proc.returncode == 2
    if no_gpu_here():  # installing TensorRT cannot help a machine without an NVIDIA GPU (issue 42)
        assert "TensorRT runs on an NVIDIA GPU, and this machine has no NVIDIA GPU" in proc.stderr, proc.stderr
        assert "pip install" not in proc.stderr
    else:
        assert "TensorRT is not available" in proc.stderr and "pip install 'hne_edge-0.1.0-py3-none-any.whl[tensorrt]'" in proc.stderr


def test_examples_name_only_what_every_demo_writes():
    """Issue 42: export_tensorrt.py said to export runs/demo/train/checkpoint.pt, which the default demo does not
    write: on CIFAR-10 it uses the checkpoint shipped with hne-edge and trains nothing (hne_edge/demo.py)."""
    import re

    from hne_edge.demo import DEMO_LAYOUT

    # train/: only a demo that trains; bench/ and stack/: the commands the demo prints as next steps
    every_demo = set(DEMO_LAYOUT) - {"train", "bench", "stack"}
    named = [(script.name, m.group(1)) for script in sorted(EXAMPLES.glob("*.py"))
             for m in re.finditer(r"runs/demo/([\w.-]+)", script.read_text())]  # fmt: skip
    assert named and all(part in every_demo for _, part in named), named


def test_multi_camera_replays_synthetic_cameras_and_image_folders(bundle_copy, tmp_path):
    proc = run_example("multi_camera.py", str(bundle_copy), "--streams", "3", "--fps", "20", "--seconds", "1",
                       "--refresh", "0.5", "--threads", "1",
                       "--accuracy", str(REPO / "hne_edge" / "assets" / "cifar10_demo.json"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    final = proc.stdout.split("-- done: 60 frames")[1].splitlines()
    rows = [line.split() for line in final if line.startswith("cam") and not line.startswith("camera")]
    assert [r[0] for r in rows] == ["cam0", "cam1", "cam2"] and sum(int(r[1]) for r in rows) == 60
    assert all(1 <= float(r[4]) <= 16 for r in rows) and "expected accuracy" in proc.stdout
    assert proc.stdout.count("camera ") >= 2  # the live table, then the final one
    from PIL import Image

    rng = np.random.default_rng(0)
    for cam in ("front", "left"):
        (tmp_path / cam).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / cam / f"{i}.png")
    proc = run_example("multi_camera.py", str(bundle_copy), "--cameras", f"{tmp_path / 'front'},{tmp_path / 'left'}",
                       "--fps", "10", "--seconds", "1", "--threads", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.split("-- done")[1].splitlines() if line.startswith(("front", "left"))] == ["front", "left"]
    (tmp_path / "empty").mkdir()
    proc = run_example("multi_camera.py", str(bundle_copy), "--cameras", str(tmp_path / "empty"))
    assert proc.returncode == 2 and proc.stderr.startswith("Error: ") and "holds no image files" in proc.stderr


def test_autonomous_stack_replaces_only_its_own_timeline(bundle_copy, tmp_path):
    """A review found the stack wrote timeline.csv / timeline.png over a user's files in --out (exit 0), through a
    link onto the file it points to, and `--out ""` into the current folder. Like `hne-edge bench`, it replaces only
    its own files, refuses anything else in one line before any work (--force: a file or link, never through it)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "timeline.csv").write_text("my own measurements\n")
    (out / "timeline.png").write_bytes(b"my figure")
    for name in ("timeline.csv", "timeline.png"):
        proc = run_example("autonomous_stack.py", str(bundle_copy), "--count", "5", "--out", str(out))
        assert proc.returncode == 2 and proc.stderr.startswith("Error: refusing to replace ") and \
            len(proc.stderr.splitlines()) == 1 and "--force" in proc.stderr, proc.stderr  # fmt: skip
        assert proc.stdout == "" and not (bundle_copy / "profiles").exists()  # before any work (no profile written)
        (out / name).unlink()
    precious = tmp_path / "precious.txt"
    precious.write_text("precious notes\n")
    (out / "timeline.csv").symlink_to(precious)
    proc = run_example("autonomous_stack.py", str(bundle_copy), "--count", "5", "--out", str(out))
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
    proc = run_example("autonomous_stack.py", str(bundle_copy), "--count", "5", "--out", str(out), "--force")
    assert proc.returncode == 0, proc.stderr
    assert precious.read_text() == "precious notes\n" and not (out / "timeline.csv").is_symlink()  # the link replaced
    assert sorted(p.name for p in out.iterdir()) == ["timeline.csv", "timeline.png"]  # no scratch file left
    first = (out / "timeline.csv").read_text()
    proc = run_example("autonomous_stack.py", str(bundle_copy), "--count", "6", "--out", str(out))  # its own: replaced
    assert proc.returncode == 0, proc.stderr
    assert (out / "timeline.csv").read_text() != first and len((out / "timeline.csv").read_text().splitlines()) == 7
    proc = run_example("autonomous_stack.py", str(bundle_copy), "--count", "5", "--out", "")
    assert proc.returncode == 2 and proc.stderr.startswith("Error: --out: received an empty path"), proc.stderr
    assert not (REPO / "timeline.csv").exists()


def load_example(name: str):
    """The example's module, to run its ``main`` in this process (on fakes a subprocess cannot see)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(name).stem, EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("offset", [0.0, 3.0])
def test_export_tensorrt_judges_the_engines_against_onnx_runtime(bundle_copy, monkeypatch, capsys, offset):
    """On the TensorRT fakes (engines = the ONNX files run by ONNX Runtime): engines that compute what ONNX Runtime
    does pass and their levels are timed; engines whose every output is off by ``offset`` (a miscompiled engine) are
    refused in one line naming the bound, exit 2. A review found it printed `max |diff| = 1.96e+01` and exited 0."""
    import tensorrt_fakes
    from runtime_fakes import run_gpu_backends_on_fakes

    import hne_edge.runtime.backends.cuda as cuda

    run_gpu_backends_on_fakes(monkeypatch)
    monkeypatch.setattr(cuda, "no_gpu_here", lambda: False, raising=False)
    real = tensorrt_fakes._OrtContext.execute_async_v3

    def shifted(self, stream):
        real(self, stream)
        engine = self.engine
        for name in engine.outputs:
            engine.trt.device.view(self.address[name], self.out_shapes[name], engine.dtypes[name])[...] += offset
        return True

    monkeypatch.setattr(tensorrt_fakes._OrtContext, "execute_async_v3", shifted)
    example = load_example("export_tensorrt.py")
    rc = example.run_main(lambda: example.main([str(bundle_copy)]))
    out, err = capsys.readouterr()
    levels = [line for line in out.splitlines() if line.startswith("n=")]
    if offset == 0.0:
        assert rc == 0 and "within the fp32 bound 0.0001" in out and len(levels) == 16, (out, err)
    else:
        assert rc == 2 and err.startswith("Error: ") and len(err.splitlines()) == 1, (out, err)
        assert "exceeds the bound 0.0001" in err and not levels, (out, err)


def _final_table(out: str, names: list[str]) -> dict[str, list[str]]:
    """The per-camera rows of the table multi_camera.py prints at the end."""
    rows = [line.split() for line in out.split("-- done:")[1].splitlines()]
    return {r[0]: r[1:] for r in rows if r and r[0] in names}


def test_multi_camera_table_and_expected_accuracy_are_the_scheduler_results(bundle_copy, monkeypatch, capsys):
    """Each figure multi_camera.py prints, recomputed from the results the scheduler handed its table, and the
    expected accuracy from the accuracy file itself (linear between its n). ONNX Runtime calls take >= 4 ms here,
    so no frame has all 16 leaves by its 50 ms deadline and a count of every leaf would show."""
    import json
    import time

    from hne_edge.runtime.backends.onnxruntime import OnnxRuntimeRunner

    def slowed(fast):
        def call(self, inputs):
            time.sleep(0.004)
            return fast(self, inputs)

        return call

    for name in ("run_impl", "run_logits_impl"):
        monkeypatch.setattr(OnnxRuntimeRunner, name, slowed(getattr(OnnxRuntimeRunner, name)))
    example = load_example("multi_camera.py")
    results = []
    add = example.Table.add
    monkeypatch.setattr(example.Table, "add", lambda self, result: (results.append(result), add(self, result))[1])
    accuracy = REPO / "hne_edge" / "assets" / "cifar10_demo.json"
    rc = example.run_main(lambda: example.main([str(bundle_copy), "--streams", "2", "--fps", "20", "--seconds", "1",
                                                "--threads", "1", "--accuracy", str(accuracy)]))  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and len(results) == 40, out
    table = _final_table(out, ["cam0", "cam1"])
    for cam in ("cam0", "cam1"):
        mine = [r for r in results if r.stream == cam]
        answered = [r for r in mine if r.stopped_by != "rejected"]
        frames, rejected, misses, leaves, p50, p99 = table[cam]
        assert (int(frames), int(rejected)) == (len(mine), len(mine) - len(answered)), (cam, table)
        assert int(misses) == sum(not r.met_deadline for r in answered), (cam, table)
        assert float(leaves) == pytest.approx(np.mean([r.leaves for r in answered]) if answered else 0, abs=0.006)
    with open(accuracy) as f:
        points = {row["n"]: row["accuracy"] for row in json.load(f)["held_out"]}
    curve = [0.0] + [float(np.interp(n, sorted(points), [points[k] for k in sorted(points)])) for n in range(1, 17)]
    on_time = [r.leaves_on_time for r in results]
    assert max(on_time) < 16, on_time
    printed = float(out.split("expected accuracy ")[1].split("%")[0])
    assert printed == pytest.approx(100 * np.mean([curve[n] for n in on_time]), abs=0.006), out


def test_multi_camera_table_counts_misses_rejections_and_leaves():
    """The live table's arithmetic on known results: a rejected frame counts as rejected, never as a miss nor in
    the leaves; an answered frame past its deadline is a miss."""
    import types

    table = load_example("multi_camera.py").Table(["a", "b"])

    def result(stream, stopped_by, met, leaves, latency):
        return types.SimpleNamespace(stream=stream, stopped_by=stopped_by, met_deadline=met, leaves=leaves,
                                     latency_ms=latency, leaves_on_time=leaves if met else 0)  # fmt: skip

    for r in (result("a", "deadline", True, 3, 10.0), result("a", "deadline", False, 5, 60.0),
              result("a", "rejected", False, 0, 0.0), result("b", "complete", True, 16, 20.0)):  # fmt: skip
        table.add(r)
    rows = _final_table(table.render("-- done: 4 frames"), ["a", "b"])
    assert rows["a"][:4] == ["3", "1", "1", "4.00"] and rows["b"][:4] == ["1", "0", "0", "16.00"], rows
    assert sorted(table.on_time()) == [0, 0, 3, 16]


def test_multi_camera_names_an_image_of_another_size(bundle_copy, tmp_path):
    """A review found a camera folder with images of two sizes ended in numpy's ValueError traceback (exit 1)."""
    from PIL import Image

    (tmp_path / "front").mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "front" / "a.png")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "front" / "b.png")
    proc = run_example("multi_camera.py", str(bundle_copy), "--cameras", str(tmp_path / "front"), "--seconds", "0.5")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"Error: --cameras: {tmp_path / 'front' / 'b.png'}: ") and "8x8" in proc.stderr


def test_train_cifar_checks_test_data_before_training(tmp_path):
    """A review found a mistyped --test-data was noticed only after the whole training (200 epochs by default)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8), y=np.arange(64) % 10)
    (tmp_path / "text.npz").write_text("not an archive")
    for test_data, why in (("nope.npz", "does not exist"), ("text.npz", "cannot read as a numpy .npz archive")):
        proc = run_example("train_cifar.py", "--data", "npz", "--data-dir", str(tmp_path / "train.npz"), "--model",
                           "hne_tiny", "--epochs", "1", "--out", str(tmp_path / "run"), "--test-data",
                           str(tmp_path / test_data))  # fmt: skip
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"Error: --test-data: {tmp_path / test_data}") and why in proc.stderr, proc.stderr
        assert not (tmp_path / "run").exists()  # nothing trained


def test_examples_warn_and_name_flags_as_the_cli_does(bundle_copy):
    """A review found the examples printed Python's two-line `file:line: UserWarning` where every command prints
    `warning: ...`, and multi_camera.py --jitter-ms -5 named the Python parameter `jitter_ms`."""
    import json

    from hne_edge.runtime import AnytimeRunner

    with AnytimeRunner(bundle_copy) as runner:
        runner.profile(batch_sizes=(1,), warmup=1, repeats=3)  # saved in the bundle; then made another version's
    (profile,) = (bundle_copy / "profiles").glob("*.json")
    record = json.loads(profile.read_text())
    profile.write_text(json.dumps({**record, "manifest_sha256": "0" * 64}))
    proc = run_example("embedded_app.py", str(bundle_copy), "--count", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: ignoring saved profile "), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    proc = run_example("multi_camera.py", str(bundle_copy), "--jitter-ms=-5", "--seconds", "0.5")
    assert proc.returncode == 2 and proc.stderr.startswith("Error: --jitter-ms: received -5"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr  # before any work: the bundle not opened, nothing warned
