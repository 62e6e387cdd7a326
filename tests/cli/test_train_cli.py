"""`hne-edge train` / `hne-edge eval` as users run them (subprocesses), DDP on CPU with gloo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import CPU_DEVICE as CPU, one_line_error, run_cli

SMALL = ("--limit", "256", "--epochs", "2", "--batch-size", "32", "--quiet", "--threads", "1", *CPU)


def test_train_then_eval_on_digits(tmp_path):
    out = tmp_path / "run"
    train = run_cli("train", "--out", str(out), "--loss", "distill", "--alpha", "0.4", *SMALL, check=True)
    assert "checkpoint" in train.stdout and "val acc n=1" in train.stdout
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["loss"] == {"kind": "distill", "alpha": 0.4, "temperature": 2.0, "weighting": "paper",
                                     "temperature_squared": False, "normalize": "none"}
    assert len(log["step_losses"]) == 2 * (256 // 32)
    # issue 20 item 6: --limit 256 capped validation at 256 too; it caps training only (digits holds out 180)
    assert log["epochs"][-1]["train_images"] == 256 and log["epochs"][-1]["val_images"] == 180
    ev = run_cli("eval", str(out / "checkpoint.pt"), "--out", str(tmp_path / "ev"), *CPU, check=True)
    assert "per-leaf acc" in ev.stdout and " 16 " in ev.stdout
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["loss"] == "distill" and len(metrics["anytime"]) == 16
    assert (tmp_path / "ev" / "accuracy_vs_macs.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--epochs", "0"), "--epochs: received 0; expected a positive integer"),
        (("--data", "npz"), "needs data.data_dir (--data-dir)"),
        (("--alpha", "2"), "--alpha: received 2.0"),
        (("--normalize", "label", "--alpha", "1"), "--normalize=label divides the objective by (1 - alpha); received alpha=1.0"),
        (("--preset", "cifar", "--config", "x.yaml"), "--config and --preset contradict"),
        (("--data", "npz", "--data-dir", "/nonexistent/d.npz"), "npz data not found"),
        (("--nproc-per-node", "0"), "--nproc-per-node: received 0"),
        (("--ema", "1.5"), "--ema: received 1.5; expected null, auto or a decay with 0 < decay < 1"),
        (("--ema", "0.99x"), "--ema: received '0.99x'; expected auto or a decay with 0 < decay < 1"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "never"
    one_line_error(run_cli("train", "--out", str(out), *args, *CPU), message)
    assert not out.exists()


def test_yaml_config_errors_and_existing_run(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optim: {epochs: 1, learning_rate: 0.1}\n")
    one_line_error(run_cli("train", "--config", str(cfg), "--out", str(tmp_path / "x")), "unknown option(s) ['learning_rate']")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"junk")
    one_line_error(run_cli("train", "--out", str(tmp_path / "run")), "exists; pass --resume")
    one_line_error(run_cli("eval", str(tmp_path / "run" / "checkpoint.pt")), "not a PyTorch archive")


@pytest.mark.parametrize("override, message", [("stem_channels: [8]", "stem_channels: received [8]; expected 2 "),
                                               ("reduction: 0", "reduction: received 0; expected a positive integer")])
def test_yaml_model_override_that_cannot_be_built_is_one_line(tmp_path, override, message):
    """`stem_channels: [8]` passed the config's checks, then ended in an IndexError traceback (exit 1) building the
    model; `reduction: 0` in a ZeroDivisionError inside them."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"preset: digits\nmodel:\n  name: hne_tiny\n  overrides:\n    {override}\n")
    one_line_error(run_cli("train", "--config", str(cfg), "--out", str(tmp_path / "run"), *CPU), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """2 gloo processes x 16 images == 1 process accumulating 2 micro-batches of 16 (global batch 32).

    Both see the same global batches (same seed), and BatchNorm normalises each
    16-image half separately in both, so the loss curves agree up to float
    reduction order. (Against a single 32-image batch they would differ: BN
    statistics are per process under DDP.)
    """
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    run_cli("train", "--out", str(ddp), *SMALL, "--nproc-per-node", "2", check=True, timeout=120)
    run_cli("train", "--out", str(single), *SMALL, "--accum-steps", "2", check=True)
    a = json.loads((ddp / "train_log.json").read_text())
    b = json.loads((single / "train_log.json").read_text())
    assert (a["world_size"], b["world_size"]) == (2, 1)
    la, lb = np.array(a["step_losses"]), np.array(b["step_losses"])
    assert la.shape == lb.shape == (16,)
    np.testing.assert_allclose(la, lb, rtol=1e-5)
    assert la[-4:].mean() < la[:4].mean()  # it is a training curve, not a constant
    wa = torch.load(ddp / "checkpoint.pt", weights_only=True)["model"]
    wb = torch.load(single / "checkpoint.pt", weights_only=True)["model"]
    for key in wa:
        if wa[key].is_floating_point() and "running" not in key:  # running BN stats: rank 0's under DDP
            torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=1e-5)


def test_tree_option_parsing():
    from hne_edge.errors import InputError
    from hne_edge.tree import parse_tree

    assert parse_tree("independent") == "independent" and parse_tree("1,2,2,2,2") == (1, 2, 2, 2, 2)
    with pytest.raises(InputError, match="received '1,x'"):
        parse_tree("1,x")


# -- evaluation on the user's own test set (--test-data) ------------------------------------------------
@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "run"
    run_cli("train", "--out", str(out), "--weighting", "mean-t2", *SMALL, check=True)
    return out


def _digits_npz(path, rows=slice(0, 300), size=8, channels=None):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.round(d.images[rows] * (255.0 / 16.0)).astype(np.uint8)
    if size != 8:
        x = np.zeros((x.shape[0], size, size), np.uint8)
    if channels:
        x = np.repeat(x[..., None], channels, -1)
    np.savez(path, x=x, y=d.target[rows], classes=np.array([str(i) for i in range(10)]))
    return x, d.target[rows]


def test_eval_on_test_data_matches_the_model_on_those_images(tmp_path, digits_run):
    from hne_edge.train.checkpoint import model_from_checkpoint

    x, y = _digits_npz(tmp_path / "mine.npz")
    proc = run_cli("eval", str(digits_run / "checkpoint.pt"), "--test-data", str(tmp_path / "mine.npz"),
                   "--out", str(tmp_path / "ev"), "--no-plots", *CPU, check=True)  # TF32 on a GPU: near-ties
    assert "test-data: 300 images" in proc.stdout
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["split"] == "test-data" and metrics["data"] == str(tmp_path / "mine.npz")
    assert metrics["weighting"] == "mean-t2" and metrics["num_images"] == 300
    # independent reference: the checkpoint's model on the same pixels, normalised by hand with its stored statistics
    model, state = model_from_checkpoint(digits_run / "checkpoint.pt")
    mean, std = state["normalization"]["mean"][0], state["normalization"]["std"][0]
    pixels = torch.from_numpy(x).double()[:, None] / 255
    with torch.no_grad():
        logits = model.double().eval()((pixels - mean) / std)
    for n in (1, 4, 16):
        expected = (logits[:, :n].mean(1).argmax(-1).numpy() == y).mean()
        assert metrics["anytime"][n - 1]["accuracy"] == pytest.approx(expected)


def test_eval_test_data_errors_are_one_line(tmp_path, digits_run):
    ckpt = str(digits_run / "checkpoint.pt")
    _digits_npz(tmp_path / "big.npz", size=16)
    one_line_error(run_cli("eval", ckpt, "--test-data", str(tmp_path / "big.npz")), "images are 16x16 with 1 channel(s)")
    one_line_error(run_cli("eval", ckpt, "--test-data", str(tmp_path / "none.npz")), "npz data not found")
    np.save(tmp_path / "x.npy", np.zeros((2, 8, 8), np.uint8))
    one_line_error(run_cli("eval", ckpt, "--test-data", str(tmp_path / "x.npy")), "received a .npy array; expected a .npz")
    one_line_error(run_cli("eval", ckpt, "--test-data", str(tmp_path)), "is a directory")
    one_line_error(run_cli("eval", ckpt, "--test-data", str(tmp_path / "big.npz"), "--split", "test"),
                    "--test-data and --split test contradict")
    # a run on data without an official test set says what to use instead
    one_line_error(run_cli("eval", ckpt, "--split", "test"), "--test-data PATH.npz")
    assert not (tmp_path / "metrics.json").exists()


def test_train_weighting_flags(tmp_path):
    out = tmp_path / "w"
    run_cli("train", "--out", str(out), "--t-squared", "--epochs", "1", *SMALL[:2], "--batch-size", "64", "--quiet",
            "--threads", "1", *CPU, check=True)
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["loss"]["weighting"] == "paper" and log["config"]["loss"]["temperature_squared"] is True
    proc = run_cli("train", "--out", str(tmp_path / "x"), "--weighting", "sum")
    assert proc.returncode == 2 and "'sum' is not one of 'paper', 'mean-t2'" in proc.stderr


def test_train_normalize_flag(tmp_path):
    """--normalize label is saved with the run and named in its first line; --help says when to use it."""
    out = tmp_path / "n"
    proc = run_cli("train", "--out", str(out), "--normalize", "label", "--alpha", "0.25", "--epochs", "1", *SMALL[:2],
                   "--batch-size", "64", "--threads", "1", *CPU, check=True)
    assert "loss hierarchical (paper, normalize label)" in proc.stderr
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["loss"]["normalize"] == "label" and log["config"]["loss"]["alpha"] == 0.25
    assert "normalize: label" in (out / "config.yaml").read_text()
    proc = run_cli("train", "--out", str(tmp_path / "x"), "--normalize", "full")
    assert proc.returncode == 2 and "'full' is not one of 'none', 'label'" in proc.stderr
    help_text = " ".join(run_cli("train", "--help", check=True).stdout.split())
    assert "Use label for short schedules" in help_text


def test_ctrl_c_exits_130_in_one_line(tmp_path):
    """Reproduces issue 15: Ctrl-C exited 1 (click's "Aborted!") instead of the shell's 128 + SIGINT."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "hne_edge", "train", "--out", str(tmp_path / "run"), "--epochs", "200",
                             "--threads", "1", *CPU], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        first = proc.stderr.readline()  # "training hne_tiny ...": the command is inside its work
        assert first.startswith("training "), first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "Interrupted"


# -- a run that talks (issue 20 item 4) ---------------------------------------------------------------------------
def _first_lines(args, until: str, limit: int = 12, timeout: float = 300) -> list[str]:
    """stderr lines of ``hne-edge train ARGS`` (a pipe: no terminal) up to the one containing ``until``; then kill it."""
    import os
    import subprocess
    import sys
    import threading

    from conftest import REPO

    proc = subprocess.Popen([sys.executable, "-m", "hne_edge", "train", *args, *CPU], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    timer = threading.Timer(timeout, proc.kill)  # a hang fails the test instead of stalling the suite
    timer.start()
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if until in line or len(lines) >= limit:
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    return lines


def test_train_without_a_terminal_prints_progress_lines_and_percentages(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--out", str(out), "--limit", "256", "--epochs", "2", "--batch-size", "32", "--threads", "1",
                   *CPU, check=True)
    err = proc.stderr.splitlines()
    assert err[0].startswith("training hne_tiny (the digits preset's model for --data digits; ")
    assert "256 train / 180 validation images" in err[0]
    capped = run_cli("train", "--out", str(tmp_path / "capped"), "--limit", "64", "--val-limit", "50", "--epochs", "1",
                     "--batch-size", "64", "--threads", "1", *CPU, check=True)
    assert "64 train / 50 validation images" in capped.stderr.splitlines()[0]
    assert "M MACs per image for all 16 leaves" in err[0]
    progress = [line for line in err if line.startswith("train: ")]
    assert progress and all("/16 steps (" in line and "elapsed" in line for line in progress), err
    assert progress[-1].startswith("train: 16/16 steps (100%)") and "loss " in progress[-1], progress
    assert any(line.startswith("estimate: ") and "for the 16 training steps of this run on cpu" in line for line in err), err
    epochs = [line for line in err if line.startswith("epoch ")]
    assert len(epochs) == 2 and "% , " not in epochs[0] and "train acc " in epochs[0] and "%, val acc n=1 " in epochs[0]
    assert "val acc n=1 " in proc.stdout and "%, n=16 " in proc.stdout and "0." not in proc.stdout.split(";")[0]


def test_a_preset_model_is_named_with_its_cost_on_the_first_line(tmp_path):
    """Reproduces issue 20 item 4: `train --data npz` silently picked the paper's hne_resnet (10 min of silence)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", x=rng.integers(0, 256, (200, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 200))
    lines = _first_lines(["--data", "npz", "--data-dir", str(tmp_path / "c.npz"), "--out", str(tmp_path / "run"),
                          "--threads", "1"], until="training ", limit=1)  # fmt: skip
    assert lines and lines[0].startswith("training hne_resnet (the cifar preset's model for --data npz; "), lines
    assert "451.67M MACs per image for all 16 leaves" in lines[0] and "--model hne_tiny: 42x fewer" in lines[0]
    assert "200 epochs of 1 step (batch 128)" in lines[0]


def test_a_run_of_hours_says_so_and_names_a_faster_model(tmp_path):
    lines = _first_lines(["--model", "hne_resnet_small", "--epochs", "100000", "--batch-size", "16", "--threads", "1",
                          "--out", str(tmp_path / "run")], until="that is hours")  # fmt: skip
    estimate = next(line for line in lines if line.startswith("estimate: "))
    assert " h " in estimate and "training steps of this run on cpu" in estimate and "and on Ctrl-C" in estimate
    assert lines[lines.index(estimate) + 1] == (
        "  that is hours on this cpu: --model hne_tiny (11x fewer MACs per image than hne_resnet_small), or fewer "
        "--epochs or a --limit on the images make a shorter run")


def test_a_run_that_ends_at_chance_says_so(tmp_path):
    """Reproduces issue 20 item 4: a run ended at 12% on 10 classes and nothing said so."""
    proc = run_cli("train", "--out", str(tmp_path / "run"), "--lr", "1e-9", *SMALL[:4], "--batch-size", "64", "--quiet",
                   "--threads", "1", *CPU, check=True)
    assert "note: the model is at chance: the full ensemble's validation accuracy" in proc.stdout, proc.stdout
    assert "(±2.2% on 180 images;" in proc.stdout  # the whole hold-out, not --limit's 128
    assert "guessing among 10 classes (10.0%)" in proc.stdout
    ev = run_cli("eval", str(tmp_path / "run" / "checkpoint.pt"), "--no-plots", *CPU, check=True)
    assert "note: the model is at chance" in ev.stdout  # the same rule where its accuracy is read again


def _stopped_in_its_first_epoch(out, signum) -> tuple[int, str]:
    """`hne-edge train --out OUT` (200 epochs) sent ``signum`` once inside its first epoch: (exit code, stderr)."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.Popen([sys.executable, "-m", "hne_edge", "train", "--out", str(out), "--epochs", "200",
                             "--threads", "1", *CPU], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        for line in proc.stderr:
            if line.startswith("train: "):  # inside the first epoch
                break
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


def test_sigterm_saves_a_resumable_checkpoint_as_ctrl_c_does_and_exits_143(tmp_path):
    """``kill`` (a cluster's pre-emption, a supervisor's stop) ended a training run where it stood: the epoch's
    steps since the last checkpoint lost. SIGTERM now stops as Ctrl-C does - the running step finished, a resumable
    checkpoint saved there - and exits 128 + SIGTERM."""
    import signal

    out = tmp_path / "run"
    returncode, err = _stopped_in_its_first_epoch(out, signal.SIGTERM)
    assert returncode == 143, err
    lines = err.strip().splitlines()
    assert lines[-1] == "Terminated" and lines[0].startswith("SIGTERM: finishing this step"), lines
    assert lines[-2].startswith("stopped in epoch 1/200 after step ") and "saved a resumable checkpoint" in lines[-2]
    step = int(lines[-2].split("after step ")[1].split("/")[0])
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (state["epoch"], state["extra"]["step"]) == (0, step)


def test_ctrl_c_saves_a_resumable_checkpoint_and_resume_says_from_where(tmp_path):
    """Reproduces issue 20 item 5: Ctrl-C before the first epoch ended left nothing, and --resume said only
    "checkpoint not found"."""
    import signal

    out = tmp_path / "run"
    missing = run_cli("train", "--out", str(out), "--resume", *CPU)
    one_line_error(missing, f"--resume: no checkpoint at {out / 'checkpoint.pt'}, so there is nothing to resume")
    assert "start the run without --resume" in missing.stderr and "resume=False" not in missing.stderr

    returncode, err = _stopped_in_its_first_epoch(out, signal.SIGINT)
    assert returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[-1] == "Interrupted" and lines[0].startswith("Ctrl-C: finishing this step"), lines
    stopped = lines[-2]
    assert stopped.startswith("stopped in epoch 1/200 after step ") and "saved a resumable checkpoint" in stopped, lines
    step = int(stopped.split("after step ")[1].split("/")[0])
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (state["epoch"], state["extra"]["step"]) == (0, step)

    header = _first_lines(["--out", str(out), "--resume", "--threads", "1"], until="resuming", limit=1)
    assert header[0].startswith("resuming hne_tiny") and header[0].endswith(
        f"; continuing epoch 1/200 after step {step}/50"), header


def test_train_config_that_is_a_folder_says_so(tmp_path):
    """Issue 29 (11): `train --config somedir` said "config file not found" for a folder that exists."""
    (tmp_path / "somedir").mkdir()
    line = one_line_error(run_cli("train", "--config", str(tmp_path / "somedir"), "--out", str(tmp_path / "run")),
                          str(tmp_path / "somedir"), "a folder", "YAML")  # fmt: skip
    assert "not found" not in line and not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["a_file/run", "/proc/hne_run"])
def test_an_out_folder_that_cannot_be_created_is_refused_before_training(tmp_path, where):
    """`train --out /proc/hne_run` (or `--out a_file/run`) trained a whole epoch, then failed to save into it."""
    if where.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here (a folder that refuses new folders, to root too)")
    (tmp_path / "a_file").write_text("x")
    train = run_cli("train", "--out", where, "--limit", "256", "--epochs", "2", "--batch-size", "32", "--threads", "1",
                    *CPU, cwd=tmp_path)  # not --quiet: any progress line before the error fails one_line_error
    one_line_error(train, f"--out {where}", "expected a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and not Path(where).exists()


def test_eval_and_export_refuse_an_out_folder_that_cannot_be_created_before_any_work(tmp_path, digits_run):
    """`eval`/`export --out a_file/x` evaluated (exported) first, then said "File exists: a_file"; `--out /proc/x`
    named its scratch folder /proc/.x.hne-partial-..."""
    (tmp_path / "a_file").write_text("x")
    ckpt = str(digits_run / "checkpoint.pt")
    for where in ("a_file/x", "/proc/x") if Path("/proc/self").is_dir() else ("a_file/x",):
        one_line_error(run_cli("eval", ckpt, "--out", where, *CPU, cwd=tmp_path), f"--out {where}", "expected a folder")
        export = run_cli("export", ckpt, "--out", where, "--no-verify", "--plan", "segments", cwd=tmp_path)
        assert ".hne-" not in one_line_error(export, f"--out {where}", "expected a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_resume_from_another_folder_takes_the_same_images_by_another_path(tmp_path, monkeypatch):
    """An npz run records --data-dir as typed (relative): `--resume` from another folder said "npz data not found:
    ok.npz", and `--data-dir ../ok.npz` (the same file) was refused as a different config (data.data_dir) before
    the images' sha256 could accept it. As `eval --data-dir`: the same images by any path resume, others do not."""
    from conftest import digits_npz
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.engine import fit
    from hne_edge.train.checkpoint import load_checkpoint

    digits_npz(tmp_path / "data.npz")
    digits_npz(tmp_path / "other.npz", order_seed=1)  # the same images in another order: another hold-out
    monkeypatch.chdir(tmp_path)
    config = TrainConfig.from_preset("digits", {"out": "r", "quiet": True, "threads": 1, "device": "cpu",
                                                "data": {"name": "npz", "data_dir": "data.npz", "limit": 192},
                                                "optim": {"epochs": 2, "batch_size": 32}}).to_dict()  # fmt: skip
    fit(TrainConfig.from_dict({**config, "model": {**config["model"], "overrides": {}}}), stop_after=1)
    (tmp_path / "sub").mkdir()
    resume = ("train", "--resume", "--out", "../r", "--quiet", *CPU)
    one_line_error(run_cli(*resume, cwd=tmp_path / "sub"), "data.npz", "relative to the folder the run started in",
                   "--data-dir")  # fmt: skip
    one_line_error(run_cli(*resume, "--data-dir", "../other.npz", cwd=tmp_path / "sub"),
                   "other.npz", "are not those this run started on")  # fmt: skip
    run_cli(*resume, "--data-dir", "../data.npz", cwd=tmp_path / "sub", check=True)
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt")["epoch"] == 2


def test_a_folder_image_that_does_not_decode_stops_training_in_one_line(tmp_path):
    """An image folder with a file that does not decode: training died with a DataLoader worker's flattened
    traceback (the imagenet preset loads with 8 worker processes); now one line naming the file."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "data" / "train" / cls).mkdir(parents=True)
        for i in range(6):
            image = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(image).save(tmp_path / "data" / "train" / cls / f"{i}.png")
    (tmp_path / "data" / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n cut off here")
    proc = run_cli("train", "--data", "imagefolder", "--data-dir", str(tmp_path / "data"), "--model", "hne_tiny",
                   "--epochs", "1", "--batch-size", "13", "--quiet", "--threads", "1", *CPU,
                   "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    *before, error = proc.stderr.strip().splitlines()
    assert all(line.startswith("warning: ") for line in before), before  # torch's, on a machine of few cores
    assert error.startswith("Error: ") and "broken.png: cannot decode the image" in error, error


def test_holdout_last_on_one_image_folder_is_refused_naming_the_flag(tmp_path):
    """A folder of class folders lists its images class by class: `--holdout last` held out whole classes (cat/dog/eel
    at 0.3: train labels {0, 1}, val {2}), a validation set of classes the model never saw."""
    from PIL import Image

    for cls in ("cat", "dog", "eel"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(tmp_path / "data" / cls / f"{i}.png")
    proc = run_cli("train", "--data", "imagefolder", "--data-dir", str(tmp_path / "data"), "--holdout", "last",
                   "--val-split", "0.3", "--model", "hne_tiny", "--epochs", "1", "--batch-size", "4", "--quiet", *CPU,
                   "--out", str(tmp_path / "run"))
    one_line_error(proc, "whole classes", "--holdout")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arrays, fragments", [
    # one string of names (a 0-d array): a TypeError traceback ("iteration over a 0-d array")
    ({"x": np.zeros((16, 8, 8, 3), np.uint8), "y": np.arange(16) % 2, "classes": np.array("cat,dog")},
     ["'classes' received a 0-d array", "expected names as text"]),
    # what torch code saves (N, C, H, W): refused as "images are 3x32; expected square images", which asks to crop
    ({"x": np.zeros((16, 3, 32, 32), np.uint8), "y": np.arange(16) % 2},
     ["x received (16, 3, 32, 32)", "N,C,H,W", "expected N,H,W,C"]),
])
def test_an_npz_of_another_layout_is_one_line_naming_it(tmp_path, arrays, fragments):
    np.savez(tmp_path / "d.npz", **arrays)
    proc = run_cli("train", "--data", "npz", "--data-dir", str(tmp_path / "d.npz"), "--model", "hne_tiny",
                   "--epochs", "1", "--batch-size", "8", "--quiet", *CPU, "--out", str(tmp_path / "run"))
    one_line_error(proc, *fragments)
    assert not (tmp_path / "run").exists()


def test_eval_of_one_image_folder_that_changed_since_training_is_refused(tmp_path):
    """Folder data recorded nothing of its images: one image added to a flat folder after training and `eval`
    (--split val) rebuilt another hold-out, most of it images the run trained on, without a word. A run now records
    a sha256 of the folder's listing (relative paths, sizes), as it does an npz's images."""
    from PIL import Image

    rng = np.random.default_rng(0)

    def add(cls, i):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "data" / cls / f"{i}.png")

    for cls in ("cat", "dog"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(6):
            add(cls, i)
    run_cli("train", "--data", "imagefolder", "--data-dir", str(tmp_path / "data"), "--val-split", "0.3",
            "--model", "hne_tiny", "--epochs", "1", "--batch-size", "4", "--quiet", "--threads", "1", *CPU,
            "--out", str(tmp_path / "run"), check=True)
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    run_cli("eval", checkpoint, "--out", str(tmp_path / "ev"), *CPU, check=True)
    add("dog", 99)
    proc = run_cli("eval", checkpoint, "--out", str(tmp_path / "ev2"), *CPU)
    one_line_error(proc, "the images are not those this checkpoint was trained on")
