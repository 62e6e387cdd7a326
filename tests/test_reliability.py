"""Issue 13: data loss, verified bytes, bounded inputs, one-line errors (each defect reproduced first)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

FAST_EXPORT = ("--no-verify", "--plan", "segments", "--no-first-leaf", "--no-torch-weights")


def one_line_error(proc) -> str:
    """The CLI's failure contract: exit 2, one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# -- D1: export --force replaces only a bundle -----------------------------------------------------


def test_force_refuses_the_current_directory_holding_the_checkpoint(tiny_bundle, tmp_path):
    p = tmp_path / "p"
    p.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, p / "checkpoint.pt")
    (p / "notes.txt").write_text("keep me")
    proc = run_cli("export", "checkpoint.pt", "--out", ".", "--force", *FAST_EXPORT, cwd=p,
                   env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    assert "refuses to replace" in one_line_error(proc)
    assert sorted(x.name for x in p.iterdir()) == ["checkpoint.pt", "notes.txt"]


def test_force_refuses_a_run_folder(tiny_bundle, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, run / "checkpoint.pt")
    (run / "train_log.json").write_text("{}")
    (run / "config.yaml").write_text("epochs: 1\n")
    proc = run_cli("export", str(run / "checkpoint.pt"), "--out", str(run), "--force", *FAST_EXPORT)
    assert "not a bundle" in one_line_error(proc) or "source" in proc.stderr
    assert sorted(x.name for x in run.iterdir()) == ["checkpoint.pt", "config.yaml", "train_log.json"]


def test_force_refuses_a_bundle_holding_the_source(tiny_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    shutil.copy(tiny_bundle.checkpoint_path, bundle / "ckpt.pt")
    proc = run_cli("export", str(bundle / "ckpt.pt"), "--out", str(bundle), "--force", *FAST_EXPORT)
    assert "source" in one_line_error(proc)
    assert (bundle / "ckpt.pt").is_file() and (bundle / "manifest.json").is_file()


def test_force_replaces_a_bundle_cleans_leftovers_and_uses_umask_modes(tiny_bundle, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    (out / "old-marker").write_text("x")
    stale = tmp_path / ".out.partial-999999999-dead"  # a killed export's leftover (no such pid)
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force", *FAST_EXPORT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "manifest.json").is_file() and not (out / "old-marker").exists()
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
