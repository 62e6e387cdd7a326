"""Crash safety (issues 13, 19): SIGKILL ``export`` inside its swap and ``train`` at random moments; what is on
disk must be the old state or a complete new one, and the next run must clean up after the dead one."""

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


# Kill the export at the k-th change it makes to the file system once it touches --out itself (the swap):
# an audit hook in the child (sitecustomize) counts os.rename/remove/rmdir/mkdir, shutil.rmtree, file opens
# for writing and fileio's own "hne_edge.fileio.exchange" event, and SIGKILLs the process just before the
# k-th. Deterministic (no timing luck), and blind to how the swap is written: a delete-then-rename swap is
# killed between its deletions and fails the test.
_KILL_AT_NTH_CHANGE = """
import os, signal, sys
_OUT, _NTH = os.environ["HNE_TEST_OUT"], int(os.environ["HNE_TEST_KILL_AT"])
_CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.truncate", "shutil.rmtree",
            "hne_edge.fileio.exchange"}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_seen = [0, False]

def _hook(event, args):
    if event == "open":
        mode, flags = args[1], args[2]
        if not ((isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE)):
            return
    elif event not in _CHANGES:
        return
    if not _seen[1]:  # armed by the first change that names --out itself
        names = [os.fsdecode(a) for a in args if isinstance(a, (str, bytes, os.PathLike))]
        if _OUT not in names:
            return
        _seen[1] = True
    _seen[0] += 1
    if _seen[0] == _NTH:
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(_hook)
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the one-step swap needs Linux's renameat2(RENAME_EXCHANGE)")
def test_export_killed_inside_the_swap_leaves_the_old_bundle_or_the_new_one_whole(tiny_bundle, tmp_path):
    from hne_edge.bundle import read_manifest

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_KILL_AT_NTH_CHANGE)
    root = tmp_path / "work"
    out = root / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    old = (out / "manifest.json").read_bytes()
    args = [sys.executable, "-m", "hne_edge", "export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force",
            "--no-verify", "--plan", "segments", "--no-first-leaf", "--no-torch-weights"]  # fmt: skip
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(site), ENV["PYTHONPATH"]]), "HNE_TEST_OUT": str(out)}
    outcomes = []
    for nth in range(1, 5):
        before = (out / "manifest.json").read_bytes()
        proc = subprocess.run(args, env={**env, "HNE_TEST_KILL_AT": str(nth)}, cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, (nth, proc.returncode, proc.stderr[-2000:])  # killed in the swap
        manifest = read_manifest(out, verify_files=True)  # whole: every file present with its recorded sha256
        assert manifest.tree.num_leaves == 16
        outcomes.append("old" if (out / "manifest.json").read_bytes() == before else "new")
        leftovers = {p.name for p in root.iterdir()} - {"out"}
        assert all(name.startswith(".out.hne-partial-") for name in leftovers), leftovers  # the next export's to remove
    assert outcomes[0] == "old" and "new" in outcomes, outcomes  # the kills landed before and after the switch
    proc = subprocess.run(args, env={**env, "HNE_TEST_KILL_AT": "0"}, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    read_manifest(out, verify_files=True)
    assert (out / "manifest.json").read_bytes() != old
    assert sorted(p.name for p in root.iterdir()) == ["out"]  # the dead exports' leftovers are gone


@pytest.mark.slow
def test_train_killed_at_random_points_leaves_a_loadable_checkpoint(tmp_path):
    from hne_edge.train.checkpoint import load_checkpoint

    run = tmp_path / "run"
    ckpt = run / "checkpoint.pt"
    args = ["train", "--epochs", "6", "--limit", "96", "--batch-size", "32", "--out", str(run), "--quiet",
            "--device", "cpu"]
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


@pytest.mark.parametrize("command", ["export", "eval", "bench"])
def test_sigterm_while_an_output_is_staged_leaves_nothing_and_exits_143(tiny_bundle, tmp_path, command):
    """``kill`` (SIGTERM, what a supervisor or a container's stop sends) ended export, eval and bench where they
    stood, leaving their ``.NAME.hne-partial-*`` scratch folder (a 57-file partial bundle) in the user's folder;
    Ctrl-C ran their clean-up. SIGTERM now runs the same clean-up: exit 143, the folder as it was."""
    out = tmp_path / "out"
    if command == "export":
        args = ["export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--no-verify", "--quiet"]
    elif command == "eval":
        frames = _labelled_frames(tmp_path)
        args = ["eval", str(tiny_bundle.checkpoint_path), "--test-data", str(frames), "--out", str(out), "--quiet"]
    else:
        args = ["bench", str(tiny_bundle.bundle_dir), "--repeats", "200", "--warmup", "0", "--out", str(out), "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "hne_edge", *args], env=ENV, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        staged = None
        give_up = time.monotonic() + 300
        while staged is None and proc.poll() is None and time.monotonic() < give_up:
            staged = next((p for p in tmp_path.iterdir() if ".hne-partial" in p.name), None)
            time.sleep(0.002)
        assert staged is not None, f"no staging folder seen (exit {proc.returncode})"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "Terminated" and "Traceback" not in err, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == (["frames.npz"] if command == "eval" else [])


def _labelled_frames(folder: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    path = folder / "frames.npz"
    np.savez(path, x=rng.integers(0, 256, (64, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 64),
             classes=np.array([f"c{k}" for k in range(10)]))  # the tiny checkpoint's class names
    return path
