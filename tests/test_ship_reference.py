"""benchmarks/ship_reference.py: a reference run (train_reference.py's OUT) becomes the package's pretrained model, after
its record, its data fingerprint and its held-out figures are checked; tested with a CPU-trained stand-in (hne_tiny on a
synthetic CIFAR-shaped file). ``--demo``: a finished `hne-edge train` run becomes the CPU-trained demo checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import CPU_DEVICE, REPO, run_cli

TRAIN = REPO / "benchmarks" / "train_reference.py"
SHIP = REPO / "benchmarks" / "ship_reference.py"


def _cifar_like(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, n),
             classes=np.array([f"c{i}" for i in range(10)]))  # fmt: skip
    return path


# one worker trains the module's stand-in run (12 s) for all its tests under pytest-xdist
pytestmark = pytest.mark.xdist_group("stand_in")


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A reference run's folder, made on the CPU: checkpoint.pt, config.yaml, record.json (and its data file)."""
    tmp = tmp_path_factory.mktemp("reference")
    data = _cifar_like(tmp / "cifar10_train.npz")
    proc = subprocess.run([sys.executable, str(TRAIN), "--data", str(data), "--out", str(tmp / "out"), "--time-budget", "12",
                           "--model", "hne_tiny", "--device", "cpu", "--threads", "1", "--batch-size", "32",
                           "--reserve-s", "3"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "out", data


def _ship(*args):
    return subprocess.run([sys.executable, str(SHIP), *map(str, args)], capture_output=True, text=True, timeout=600)


def test_a_reference_run_ships_with_float16_weights_and_its_record(stand_in, tmp_path):
    from hne_edge.train import load_checkpoint, model_from_checkpoint

    folder, data = stand_in
    record = json.loads((folder / "record.json").read_text())
    assert record["status"] == "ok" and (folder / "config.yaml").is_file()
    proc = _ship(folder, "--data", data, "--assets", tmp_path, "--note", "a CPU stand-in")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar10_reference.json", "cifar10_reference.pt", "cifar10_reference.yaml"]
    state = load_checkpoint(tmp_path / "cifar10_reference.pt")
    floats = [v for v in state["model"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float16 for v in floats) and not state.get("optimizer")
    model, _ = model_from_checkpoint(tmp_path / "cifar10_reference.pt")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # loaded back into the float32 model
    shipped = json.loads((tmp_path / "cifar10_reference.json").read_text())
    assert shipped["data"]["sha256"] == record["data"]["sha256"] and shipped["note"] == "a CPU stand-in"
    assert [r["n"] for r in shipped["held_out"]] == list(range(1, 17)) and shipped["data"]["validation_images"] == 30
    assert shipped["weights_dtype_cost_points"] >= 0 and shipped["record_vs_this_cpu_points"] <= 0.5
    assert shipped["plan"]["total_steps"] > 0 and "train_reference.py" in shipped["train_command"]
    for key in ("summary", "command", "train_seconds", "machine", "epochs"):  # what the demo reads
        assert key in shipped
    # the held-out rows are what the stored weights score: an independent pass over the file's last 30 images
    with np.load(data) as arrays:
        x, y = torch.from_numpy(arrays["x"][-30:]).permute(0, 3, 1, 2).float() / 255, torch.from_numpy(arrays["y"][-30:])
    norm = state["normalization"]
    x = (x - torch.tensor(norm["mean"]).view(1, 3, 1, 1)) / torch.tensor(norm["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        logits = model(x)
    for row in shipped["held_out"]:
        assert (logits[:, : row["n"]].mean(1).argmax(-1) == y).double().mean().item() == pytest.approx(row["accuracy"])


def test_what_is_not_the_run_is_refused_and_nothing_is_written(stand_in, tmp_path):
    folder, data = stand_in
    other = _cifar_like(tmp_path / "other.npz", seed=1)
    proc = _ship(folder, "--data", other, "--assets", tmp_path / "assets")
    assert proc.returncode != 0 and "another file or another order" in proc.stderr
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    record = json.loads((copy / "record.json").read_text())
    (copy / "record.json").write_text(json.dumps({**record, "status": "failed", "error": "CUDA error"}))
    proc = _ship(copy, "--data", data, "--assets", tmp_path / "assets")
    assert proc.returncode != 0 and "status 'failed' (CUDA error); expected 'ok'" in proc.stderr
    (copy / "record.json").write_text(json.dumps(record))
    with open(copy / "checkpoint.pt", "ab") as f:
        f.write(b"\0")
    proc = _ship(copy, "--data", data, "--assets", tmp_path / "assets")
    assert proc.returncode != 0 and "the record describes" in proc.stderr
    assert not (tmp_path / "assets").exists()


def test_a_finished_training_run_ships_as_the_cpu_trained_demo(tmp_path):
    """``--demo`` (was benchmarks/demo_checkpoint.py): the final epoch of an `hne-edge train` run, lean, with a record
    of how it was made that the demo reads (the data file's fingerprint, the held-out accuracy by ensemble size)."""
    from hne_edge.train import load_checkpoint
    from hne_edge.train.data import npz_fingerprint

    data = _cifar_like(tmp_path / "cifar10_train.npz")
    run = tmp_path / "run"
    command = ("train", "--config", "hne_edge/assets/cifar10_demo.yaml", "--data-dir", str(data), "--out", str(run),
               "--epochs", "1", "--threads", "1", *CPU_DEVICE)  # fmt: skip
    run_cli(*command, check=True)
    out = tmp_path / "assets" / "cifar10_demo.pt"
    proc = _ship("--demo", run, "--out", out)
    assert proc.returncode == 2 and "--demo needs --command" in proc.stderr and not out.parent.exists()
    proc = _ship("--demo", run, "--command", "hne-edge " + " ".join(command), "--out", out, "--note", "a test")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["cifar10_demo.json", "cifar10_demo.pt"]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["command"].startswith("hne-edge train --config") and record["note"] == "a test"
    assert record["data"]["sha256"] == npz_fingerprint(data) and record["epochs"] == 1
    assert [r["n"] for r in record["held_out"]] == [1, 2, 4, 8, 16] and record["held_out"][0]["images"] == 30
    assert not load_checkpoint(out).get("optimizer")


@pytest.mark.slow
def test_the_demo_runs_from_a_shipped_reference(stand_in, tmp_path):
    """`hne-edge demo --pretrained PATH`: the demo's CIFAR path (fingerprint check, the held-out split the record names,
    evaluation, export, verification, profile, budgets) from a shipped reference, here the CPU stand-in."""
    folder, data = stand_in
    assets = tmp_path / "assets"
    assert _ship(folder, "--data", data, "--assets", assets).returncode == 0
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    shutil.copy(data, tmp_path / "shared" / "data" / "cifar10_train.npz")  # the data convention path, from the project
    proc = run_cli("demo", "--pretrained", str(assets / "cifar10_reference.pt"), "--num-frames", "20", "--quiet",
                   cwd=project, env={"PYTHONPATH": str(REPO)}, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "using the checkpoint shipped with hne-edge (cifar10_reference.pt)" in proc.stdout
    summary = json.loads((project / "runs" / "demo" / "demo.json").read_text())
    assert [r["images"] for r in summary["by_ensemble_size"]] == [30] * 5  # the file's last 30 images, as shipped
    assert not (project / "runs" / "demo" / "train").exists()
