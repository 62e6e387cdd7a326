"""`hne-edge train` / `hne-edge eval` as users run them (subprocesses), DDP on CPU with gloo."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import run_cli

SMALL = ("--limit", "256", "--epochs", "2", "--batch-size", "32", "--quiet", "--threads", "1")


def _one_line_error(proc, pattern: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert pattern in lines[0], lines[0]


def test_train_then_eval_on_digits(tmp_path):
    out = tmp_path / "run"
    train = run_cli("train", "--out", str(out), "--loss", "distill", "--alpha", "0.4", *SMALL, check=True)
    assert "checkpoint" in train.stdout and "val acc n=1" in train.stdout
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["loss"] == {"kind": "distill", "alpha": 0.4, "temperature": 2.0}
    assert len(log["step_losses"]) == 2 * (256 // 32)
    ev = run_cli("eval", str(out / "checkpoint.pt"), "--out", str(tmp_path / "ev"), check=True)
    assert "per-leaf acc" in ev.stdout and " 16 " in ev.stdout
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["loss"] == "distill" and len(metrics["anytime"]) == 16
    assert (tmp_path / "ev" / "accuracy_vs_macs.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--epochs", "0"), "optim.epochs: received 0; expected a positive integer"),
        (("--data", "npz"), "needs data.data_dir (--data-dir)"),
        (("--alpha", "2"), "loss.alpha: received 2.0"),
        (("--preset", "cifar", "--config", "x.yaml"), "--config and --preset contradict"),
        (("--data", "npz", "--data-dir", "/nonexistent/d.npz"), "npz data not found"),
        (("--nproc-per-node", "0"), "--nproc-per-node: received 0"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "never"
    _one_line_error(run_cli("train", "--out", str(out), *args), message)
    assert not out.exists()


def test_yaml_config_errors_and_existing_run(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optim: {epochs: 1, learning_rate: 0.1}\n")
    _one_line_error(run_cli("train", "--config", str(cfg), "--out", str(tmp_path / "x")), "unknown option(s) ['learning_rate']")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"junk")
    _one_line_error(run_cli("train", "--out", str(tmp_path / "run")), "exists; pass --resume")
    _one_line_error(run_cli("eval", str(tmp_path / "run" / "checkpoint.pt")), "not a PyTorch archive")


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
    import click

    from hne_edge.cli.train import _tree

    assert _tree("independent") == "independent" and _tree("1,2,2,2,2") == [1, 2, 2, 2, 2]
    with pytest.raises(click.BadParameter, match="received '1,x'"):
        _tree("1,x")
