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


# -- D2: the bytes that were hashed are the bytes that run ------------------------------------------


def _flip_a_weight(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # the middle of the file is initializer data: still a loadable model
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backend, rel", [("onnxruntime", "onnx/fp32/first/leaf00.onnx"),
                                          ("onnxruntime", "onnx/fp32/segments/leaf00.onnx"),
                                          ("torch", "torch/model.pt")])  # fmt: skip
def test_a_file_swapped_after_the_manifest_check_is_refused(tiny_bundle, tmp_path, monkeypatch, backend, rel):
    from hne_edge.errors import BundleError
    from hne_edge.runtime import AnytimeRunner, scheduler

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    real = scheduler.read_manifest

    def read_then_swap(*args, **kwargs):
        manifest = real(bundle, verify_files=True)  # the check passes on the original file ...
        _flip_a_weight(bundle / rel)  # ... which an attacker swaps right after
        return manifest

    monkeypatch.setattr(scheduler, "read_manifest", read_then_swap)
    with pytest.raises(BundleError, match=rf"bundle file {rel} \(sha256 at load\) does not match the manifest"):
        AnytimeRunner(bundle, backend=backend, load_profile=False, warmup=0)


def test_verify_false_loads_without_hashing(tiny_bundle, tmp_path):
    from hne_edge.runtime import AnytimeRunner

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    _flip_a_weight(bundle / "onnx/fp32/segments/leaf01.onnx")
    with AnytimeRunner(bundle, verify=False, load_profile=False, warmup=0) as runner:  # explicitly unchecked
        assert runner.run(np.zeros((1, 3, 16, 16), np.float32)).leaves == 16


# -- D9: ONNX external data -------------------------------------------------------------------------


def test_external_data_is_refused(tiny_bundle, tmp_path):
    import onnx

    from hne_edge.bundle import read_manifest, sha256_file, write_manifest
    from hne_edge.errors import BundleError
    from hne_edge.runtime import AnytimeRunner

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    rel = "onnx/fp32/segments/leaf00.onnx"
    proto = onnx.load(str(bundle / rel))
    onnx.save_model(proto, str(bundle / rel), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)  # fmt: skip
    manifest = read_manifest(bundle, verify_files=False)
    files = tuple(
        f if f.path != rel else type(f)(**{**f.__dict__, "sha256": sha256_file(bundle / rel), "bytes": (bundle / rel).stat().st_size})
        for f in manifest.files
    )
    write_manifest(bundle, type(manifest)(**{**manifest.__dict__, "files": files}))
    with pytest.raises(BundleError, match=r"leaf00.onnx: \d+ tensor\(s\) .* keep their values in external files"):
        AnytimeRunner(bundle, load_profile=False, warmup=0)
