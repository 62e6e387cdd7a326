"""benchmarks/cifar_losses.py as it is run: run names, --seeds with a mean ± std summary, --jobs (subprocesses).

Tiny random 32x32 images stand in for CIFAR so that this runs everywhere in well under a minute; the figures in
RESULTS.md come from the real file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cifar_losses.py"


def _npz(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    classes = np.array([f"c{i}" for i in range(10)])
    np.savez(path, x=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), y=np.arange(n) % 10, classes=classes)
    return path


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_seeds_summary_and_normalised_runs(tmp_path):
    train, test = _npz(tmp_path / "train.npz", 160, 0), _npz(tmp_path / "test.npz", 40, 1)
    out = tmp_path / "out"
    proc = _script("--data", str(train), "--test-data", str(test), "--val-split", "0", "--limit", "128", "--epochs", "1",
                   "--seeds", "0", "1", "--parallel", "--jobs", "2", "--out", str(out),
                   "--runs", "hierarchical", "hierarchical+label")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for seed in (0, 1):
        for name, normalize in (("hierarchical", "none"), ("hierarchical+label", "label")):
            config = yaml.safe_load((out / f"seed{seed}" / name / "config.yaml").read_text())
            assert config["seed"] == seed and config["loss"]["normalize"] == normalize
            assert (out / f"seed{seed}" / name / "test_metrics.json").is_file()
    summary = (out / "summary.md").read_text()
    assert "mean ± std across seeds" in summary
    for name in ("hierarchical", "hierarchical+label"):
        assert re.search(rf"^\| {re.escape(name)} \| 2 \|( \d+\.\d\d ± \d+\.\d\d \|){{5}}$", summary, re.M), summary
        for seed in (0, 1):
            assert re.search(rf"^\| {re.escape(name)} \| {seed} \| ", summary, re.M), summary


@pytest.mark.parametrize("runs, message", [
    (["hierarchical+full"], "NORMALIZE in ('none', 'label')"),
    (["hierarchical@sum"], "WEIGHTING in ('paper', 'mean-t2')"),
])
def test_bad_run_names_are_refused_before_anything_runs(tmp_path, runs, message):
    proc = _script("--out", str(tmp_path / "out"), "--runs", *runs)
    assert proc.returncode != 0 and message in proc.stderr
    assert not (tmp_path / "out").exists()
