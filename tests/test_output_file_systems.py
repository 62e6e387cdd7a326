"""Output folders that a rename from beside them cannot reach: a link to a folder on another file system (a results
disk), a mount point (a docker volume), a link to nothing. What can be written is staged on the file system it ends
up on; what cannot is refused in one line naming --out, before any work."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import CPU_DEVICE, one_line_error, run_cli, tree_digest

OTHER_FS = Path("/dev/shm")  # a tmpfs on Linux: another file system than the tests' temporary folders
FAST_EXPORT = ("--no-verify", "--plan", "segments", "--quiet")


@pytest.fixture
def elsewhere(tmp_path):
    """An empty folder on another file system than ``tmp_path``."""
    if not OTHER_FS.is_dir() or not os.access(OTHER_FS, os.W_OK) or \
            os.stat(OTHER_FS).st_dev == os.stat(tmp_path).st_dev:  # fmt: skip
        pytest.skip(f"needs {OTHER_FS} on another file system than {tmp_path}")
    folder = Path(tempfile.mkdtemp(dir=OTHER_FS))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def frames(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "frames.npz"
    np.savez(path, x=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 4))
    return path


def _command(name: str, tiny_bundle, frames: Path) -> tuple[str, ...]:
    if name == "bench":
        return "bench", str(tiny_bundle.bundle_dir), "--repeats", "1", "--warmup", "0"
    return "eval", str(tiny_bundle.checkpoint_path), "--test-data", str(frames), "--no-plots", *CPU_DEVICE


@pytest.mark.parametrize("command", ["bench", "eval"])
def test_eval_and_bench_write_through_a_link_to_a_folder_on_another_file_system(tiny_bundle, tmp_path, frames,
                                                                                elsewhere, command):  # fmt: skip
    """Before: the whole run, then "Error: Invalid cross-device link: .../.results.hne-partial-.../bench.json"."""
    link = tmp_path / "results"
    link.symlink_to(elsewhere)
    before = tree_digest(tmp_path)
    proc = run_cli(*_command(command, tiny_bundle, frames), "--out", str(link))
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(p.name for p in elsewhere.iterdir())
    assert {"bench": "bench.json", "eval": "metrics.json"}[command] in names
    assert not [n for n in names if n.startswith(".")], names  # no scratch left in it
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("command", ["bench", "eval"])
def test_eval_and_bench_refuse_a_link_to_nothing_before_any_work(tiny_bundle, tmp_path, frames, command):
    """Before: the whole run, then "Error: Not a directory: .../.out.hne-partial-..." (a hidden scratch folder)."""
    link = tmp_path / "out"
    link.symlink_to("nowhere")
    before = tree_digest(tmp_path)
    proc = run_cli(*_command(command, tiny_bundle, frames), "--out", str(link))
    error = one_line_error(proc, str(link), "symbolic link", "nowhere")
    assert "hne-partial" not in error and not proc.stdout.strip()
    assert tree_digest(tmp_path) == before


def test_export_refuses_to_replace_a_mount_point_before_any_work(tiny_bundle, tmp_path):
    """Before: the whole export, then "Device or resource busy: /dev/shm", the finished scratch bundle left in /dev.
    A bundle is swapped in whole, which a mount point cannot be: a folder inside it can."""
    if not os.path.ismount(OTHER_FS):
        pytest.skip(f"needs {OTHER_FS} to be a mount point")
    beside = sorted(os.listdir(OTHER_FS.parent))
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(OTHER_FS), "--force", *FAST_EXPORT)
    one_line_error(proc, str(OTHER_FS), "mount point", str(OTHER_FS / "bundle"))
    assert sorted(os.listdir(OTHER_FS.parent)) == beside
