"""Crash safety (issue 13): SIGKILL ``export`` and ``train`` at random moments; what is on disk must be the
old state or a complete new one, and the next run must clean up after the dead one."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _kill_after(args: list[str], delay: float, ready=lambda: True) -> int | None:
    """Start ``hne-edge ARGS``; once ``ready()``, wait ``delay`` s and SIGKILL it. Returns its exit code if it ended first."""
    proc = subprocess.Popen([sys.executable, "-m", "hne_edge", *args], env=ENV, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while not ready() and proc.poll() is None:
            time.sleep(0.05)
        t_end = time.monotonic() + delay
        while time.monotonic() < t_end and proc.poll() is None:
            time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        return proc.wait(30) if proc.returncode not in (None, -signal.SIGKILL) else None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_export_killed_at_random_points_leaves_the_old_bundle_or_the_new_one(tiny_bundle, tmp_path):
    from hne_edge.bundle import read_manifest

    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    old = (out / "manifest.json").read_bytes()
    args = ["export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force", "--no-verify",
            "--plan", "segments", "--no-first-leaf", "--no-torch-weights"]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "hne_edge", *args], env=ENV, cwd=REPO, check=True, capture_output=True)
    duration = time.monotonic() - t0
    rng = random.Random(13)
    outcomes = []
    # kill late in the export (files written, verification, the swap): the window the atomic rename guards
    for fraction in sorted(rng.uniform(0.6, 1.1) for _ in range(3)):
        before = (out / "manifest.json").read_bytes()
        code = _kill_after(args, fraction * duration)
        manifest = read_manifest(out, verify_files=True)  # complete: every file present with its sha256
        outcomes.append("old" if (out / "manifest.json").read_bytes() == before else "new")
        assert code in (None, 0)
        assert manifest.tree.num_leaves == 16
        assert {p.name for p in tmp_path.iterdir()} - {"out"} <= {p.name for p in tmp_path.glob(".out.partial-*")}
    subprocess.run([sys.executable, "-m", "hne_edge", *args], env=ENV, cwd=REPO, check=True, capture_output=True)
    read_manifest(out, verify_files=True)
    assert (out / "manifest.json").read_bytes() != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the dead exports' leftovers are gone
    print("export outcomes after SIGKILL:", outcomes)


@pytest.mark.slow
def test_train_killed_at_random_points_leaves_a_loadable_checkpoint(tmp_path):
    from hne_edge.train.checkpoint import load_checkpoint

    run = tmp_path / "run"
    ckpt = run / "checkpoint.pt"
    args = ["train", "--epochs", "6", "--limit", "96", "--batch-size", "32", "--out", str(run), "--quiet"]
    rng = random.Random(13)
    epochs = []
    for attempt in range(3):  # kill at a random moment after this process wrote a checkpoint (mid-epoch or mid-write)
        seen = ckpt.stat().st_mtime_ns if ckpt.exists() else None
        code = _kill_after(args if attempt == 0 else [*args, "--resume"], rng.uniform(0.0, 2.0),
                           ready=lambda: ckpt.exists() and ckpt.stat().st_mtime_ns != seen)  # fmt: skip
        state = load_checkpoint(ckpt)  # CRC-checked: never a torn file
        epochs.append(state["epoch"])
        if code == 0:
            break
    leftovers = [p.name for p in run.iterdir() if p.name.startswith(".checkpoint.pt.")]
    assert len(leftovers) <= 1  # at most the last killed writer's temp; the next save removes it
    assert epochs == sorted(epochs)  # each resume continued from the last complete checkpoint
    print("train epochs at SIGKILL:", epochs)
