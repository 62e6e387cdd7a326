"""Issue 19, section 1: a command deletes or overwrites only what it made.

``export --force`` replaces an empty folder or an hne-edge bundle (a manifest that parses, and nothing
a bundle does not hold), and a symlink at ``export --out`` is refused. Every case was reproduced here
before it was fixed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_cli, tree_digest

FAST_EXPORT = ("--no-verify", "--plan", "segments", "--no-first-leaf", "--no-torch-weights")
_HERE = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def one_line_error(proc, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("Error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


# -- export --force ------------------------------------------------------------------------------------


def _web_app(home: Path, bundle: Path) -> str:
    (home / "Documents").mkdir()
    (home / "Documents" / "thesis.txt").write_text("precious\n")
    (home / "manifest.json").write_text('{"name": "my web app"}\n')
    return "Documents"


def _empty_manifest(home: Path, bundle: Path) -> str:
    (home / "manifest.json").write_text("")
    return "manifest.json"


def _linked_manifest(home: Path, bundle: Path) -> str:
    (home / "manifest.json").symlink_to(bundle / "manifest.json")  # another bundle's manifest
    (home / "thesis.txt").write_text("precious\n")
    return "manifest.json"


def _git_repo(home: Path, bundle: Path) -> str:
    (home / ".git").mkdir()
    (home / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (home / "manifest.json").write_text("{}")
    (home / "src.py").write_text("print('hi')\n")
    return ".git"


def _bundle_plus_notes(home: Path, bundle: Path) -> str:
    shutil.copytree(bundle, home, dirs_exist_ok=True)  # a real bundle the user keeps notes in
    (home / "notes.txt").write_text("measured on the robot: 12 ms\n")
    return "notes.txt"


def _bundle_manifest_only(home: Path, bundle: Path) -> str:
    shutil.copy(bundle / "manifest.json", home / "manifest.json")  # a valid manifest beside a user's folder
    (home / "photos").mkdir()
    (home / "photos" / "a.jpg").write_bytes(b"\xff\xd8\xff")
    return "photos"


@pytest.mark.parametrize("make", [_web_app, _empty_manifest, _linked_manifest, _git_repo, _bundle_plus_notes,
                                  _bundle_manifest_only])  # fmt: skip
def test_force_refuses_a_folder_that_is_not_a_bundle(tiny_bundle, tmp_path, make):
    """Issue 19 (1): each of these was deleted by `export --force` (exit 0) before the fix."""
    home = tmp_path / "home"
    home.mkdir()
    first = make(home, tiny_bundle.bundle_dir)
    before = tree_digest(tmp_path)
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(home), "--force", *FAST_EXPORT)
    err = one_line_error(proc, "refusing to replace", str(home), first, "--force replaces only")
    assert "force=True" not in err  # the shell user's hint, not the library's
    assert tree_digest(tmp_path) == before  # not a byte changed, no leftovers beside it


def test_force_replaces_a_bundle_with_profiles_and_a_dead_writers_scratch(tiny_bundle, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    (out / "profiles").mkdir()
    (out / "profiles" / "cpu-onnxruntime-segments-fp32.json").write_text("{}")  # written by a runner
    (out / ".manifest.json.tmp-999999999-dead").write_text("{")  # a killed update_manifest's scratch
    old = (out / "manifest.json").read_bytes()
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force", *FAST_EXPORT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "manifest.json").read_bytes() != old and not (out / "profiles").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_symlink_at_out_is_refused_and_nothing_changes(tiny_bundle, tmp_path):
    """Issue 19 (1): the link was replaced by a real folder, its target left stale and a .NAME.partial-* link
    left behind. We refuse a link at --out (with or without --force): pass the folder it points to."""
    target = tmp_path / "bundles" / "v1"
    shutil.copytree(tiny_bundle.bundle_dir, target)
    link = tmp_path / "current"
    link.symlink_to(target)
    before = tree_digest(tmp_path)
    for extra in (("--force",), ()):
        proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(link), *extra, *FAST_EXPORT)
        one_line_error(proc, str(link), "symbolic link", str(target))
        assert tree_digest(tmp_path) == before
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(dangling), *FAST_EXPORT)
    one_line_error(proc, "symbolic link")
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()


def test_force_checks_again_just_before_the_swap(tiny_bundle, tmp_path):
    """A file the user drops into the bundle while the export runs is not deleted with it."""
    from hne_edge.errors import ExportError
    from hne_edge.exporters import export_onnx

    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)

    def user_writes(tmp):
        (out / "notes.txt").write_text("written during the export\n")

    with pytest.raises(ExportError, match="notes.txt"):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, force=True,
                    post_export=user_writes)  # fmt: skip
    assert (out / "notes.txt").read_text() == "written during the export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
