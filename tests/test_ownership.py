"""Issue 19, section 1: a command deletes or overwrites only what it made.

``export --force`` replaces an empty folder or an hne-edge bundle (a manifest that parses, and nothing
a bundle does not hold), ``train --out`` writes into a new or empty folder or resumes its own run,
``demo`` replaces only a demo's folder, a symlink at ``export --out`` is refused, and a failed ``eval``
or ``bench`` leaves nothing behind. Every case was reproduced here before it was fixed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CPU_DEVICE, REPO, dead_writers_scratch, one_line_error, run_cli, tree_digest

FAST_EXPORT = ("--no-verify", "--plan", "segments", "--no-first-leaf", "--no-torch-weights")
_HERE = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


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
    from hne_edge.runtime import AnytimeRunner

    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    with AnytimeRunner(out, warmup=0) as runner:
        runner.profile(batch_sizes=(1,), warmup=0, repeats=2)  # profiles/cpu-onnxruntime-segments-fp32.json
    assert [p.name for p in (out / "profiles").iterdir()] == ["cpu-onnxruntime-segments-fp32.json"]
    dead_writers_scratch(out / "manifest.json").write_text("{")  # a killed update_manifest's scratch
    dead_writers_scratch(out / "profiles" / "cpu-onnxruntime-segments-fp32.json").write_text("{")
    old = (out / "manifest.json").read_bytes()
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force", *FAST_EXPORT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "manifest.json").read_bytes() != old and not (out / "profiles").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_out_ending_in_dot_dot_is_the_folder_it_names(tiny_bundle, tmp_path):
    """`export --out bundle/onnx/.. --force` staged its scratch folder inside bundle/onnx/ (the parent of the path
    as written) and refused it: "it holds 'onnx/....hne-partial-...', which is not part of the bundle"."""
    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    old = (out / "manifest.json").read_bytes()
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out / "onnx" / ".."), "--force", *FAST_EXPORT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "manifest.json").read_bytes() != old and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not [p for p in out.rglob("*") if ".hne-" in p.name]


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


# -- train --out -----------------------------------------------------------------------------------------

TRAIN = ("train", "--data", "digits", "--epochs", "1", "--limit", "200", "--quiet", *CPU_DEVICE)


def test_train_refuses_a_folder_holding_a_users_files(tmp_path):
    """Issue 19 (1): config.yaml was overwritten (and train_log.json) with exit 0 before the fix."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.yaml").write_text("my: config\n")
    (proj / "train_log.json").write_text('{"mine": true}\n')
    before = tree_digest(tmp_path)
    proc = run_cli(*TRAIN, "--out", str(proj))
    one_line_error(proc, str(proj), "config.yaml", "--resume")
    assert tree_digest(tmp_path) == before


def test_train_refuses_an_empty_out(tmp_path):
    """Issue 19 (1): `--out ""` trained into the current directory before the fix."""
    proc = run_cli(*TRAIN, "--out", "", cwd=tmp_path, env=_HERE)
    one_line_error(proc, "--out", "''")
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_a_file_and_a_symlinked_users_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    one_line_error(run_cli(*TRAIN, "--out", str(tmp_path / "notes.txt")), "notes.txt", "existing file")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    before = tree_digest(tmp_path)
    one_line_error(run_cli(*TRAIN, "--out", str(tmp_path / "link")), "keep.txt")
    assert tree_digest(tmp_path) == before


# -- eval and bench that fail leave nothing ------------------------------------------------------------------


def _full_disk_env(tmp_path: Path) -> dict[str, str]:
    """A subprocess in which every fsync fails with ENOSPC (what a full disk does to our atomic writes)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import errno, os\n"
        "def _full(fd):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "os.fsync = _full\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def frames(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "frames.npz"
    np.savez(path, x=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 4),
             classes=np.array([f"c{i}" for i in range(10)]))  # fmt: skip
    return path


@pytest.mark.parametrize("plots", [True, False])
def test_eval_on_a_full_disk_leaves_nothing(tiny_bundle, tmp_path, frames, plots):
    """Issue 19 (1): the new --out folder (and its new parents) stayed behind, empty, before the fix."""
    out = tmp_path / "new" / "eval"
    env = _full_disk_env(tmp_path)
    before = tree_digest(tmp_path)
    proc = run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", str(frames), "--out", str(out),
                   *(() if plots else ("--no-plots",)), *CPU_DEVICE, env=env)  # fmt: skip
    one_line_error(proc, "No space left on device", after_progress=True)
    assert tree_digest(tmp_path) == before


def test_eval_on_a_full_disk_leaves_an_existing_folder_as_it_was(tiny_bundle, tmp_path, frames):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, run / "checkpoint.pt")  # the default --out: the checkpoint's folder
    env = _full_disk_env(tmp_path)
    before = tree_digest(tmp_path)
    proc = run_cli("eval", str(run / "checkpoint.pt"), "--test-data", str(frames), *CPU_DEVICE, env=env)
    one_line_error(proc, "No space left on device", after_progress=True)
    assert tree_digest(tmp_path) == before


def test_bench_on_a_full_disk_leaves_nothing(tiny_bundle, tmp_path, frames):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    out = tmp_path / "new" / "bench"
    env = _full_disk_env(tmp_path)
    before = tree_digest(tmp_path)
    proc = run_cli("bench", str(bundle), "--repeats", "1", "--warmup", "0", "--frames", str(frames), "--out", str(out),
                   env=env)  # fmt: skip
    one_line_error(proc, "No space left on device", after_progress=True)
    assert tree_digest(tmp_path) == before


def test_eval_and_bench_write_into_a_new_nested_folder(tiny_bundle, tmp_path, frames):
    """The success path of the same commands: every file lands in --out, nothing beside it."""
    out = tmp_path / "new" / "eval"
    proc = run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", str(frames), "--out", str(out), "--quiet",
                   *CPU_DEVICE)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert "metrics.json" in names and any(n.endswith(".png") for n in names), names
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_images"] == 4
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["eval"]
    out = tmp_path / "new" / "bench"
    proc = run_cli("bench", str(tiny_bundle.bundle_dir), "--repeats", "1", "--warmup", "0", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "bench.json").is_file()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["bench", "eval"]


# -- issue 42: eval, bench, profile and info --plot replace only their own files --------------------------------------

PNG = b"\x89PNG\r\n\x1a\n"


def _eval(ckpt: Path, frames: Path, *args: str):
    return run_cli("eval", str(ckpt), "--test-data", str(frames), "--quiet", *CPU_DEVICE, *args)


def test_eval_replaces_only_its_own_metrics_and_figures(tiny_bundle, tmp_path, frames):
    """Issue 42 (1): a user's metrics.json in --out, and a user's figure of a name eval draws in the checkpoint's
    folder (the default --out), were replaced with exit 0 and nothing said before the fix."""
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "metrics.json").write_text('{"mine": true}\n')
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, run / "checkpoint.pt")
    (run / "accuracy_vs_macs.png").write_bytes(PNG + b"my own figure")
    before = tree_digest(tmp_path)
    one_line_error(_eval(tiny_bundle.checkpoint_path, frames, "--out", str(ev)), "refusing to replace",
                   str(ev / "metrics.json"), "hne-edge-metrics", "--force")  # fmt: skip
    one_line_error(_eval(run / "checkpoint.pt", frames), "refusing to replace", str(run / "accuracy_vs_macs.png"),
                   "--force")  # fmt: skip
    assert tree_digest(tmp_path) == before
    proc = _eval(tiny_bundle.checkpoint_path, frames, "--out", str(ev), "--force")  # the user says: replace it
    assert proc.returncode == 0, proc.stderr
    assert json.loads((ev / "metrics.json").read_text())["format"] == "hne-edge-metrics"
    figures = {p.name: p.read_bytes() for p in ev.glob("*.png")}
    assert sorted(figures) == ["accuracy_vs_macs.png", "diversity_vs_macs.png", "leaf_accuracy.png"]
    proc = _eval(tiny_bundle.checkpoint_path, frames, "--out", str(ev))  # its own files: replaced without --force
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in ev.iterdir()) == ["accuracy_vs_macs.png", "diversity_vs_macs.png", "leaf_accuracy.png",
                                                    "metrics.json"]  # fmt: skip
    (ev / "leaf_accuracy.png").write_bytes(figures["leaf_accuracy.png"] + b"\0")  # edited since: the user's now
    before = tree_digest(tmp_path)
    one_line_error(_eval(tiny_bundle.checkpoint_path, frames, "--out", str(ev)), str(ev / "leaf_accuracy.png"))
    assert tree_digest(tmp_path) == before


def _bench(bundle: Path, out: Path, *args: str):
    return run_cli("bench", str(bundle), "--repeats", "1", "--warmup", "0", "--out", str(out), "--quiet", *args)


def test_bench_replaces_only_its_own_json_and_figure(tiny_bundle, tmp_path):
    """Issue 42 (2): a user's bench.json and bench.png in --out were replaced with exit 0 before the fix."""
    out = tmp_path / "be"
    out.mkdir()
    (out / "bench.json").write_text('{"format": "my-bench"}\n')
    before = tree_digest(tmp_path)
    one_line_error(_bench(tiny_bundle.bundle_dir, out), "refusing to replace", str(out / "bench.json"), "--force")
    assert tree_digest(tmp_path) == before
    (out / "bench.json").unlink()
    (out / "bench.png").symlink_to(tmp_path / "mine.png")
    before = tree_digest(tmp_path)
    one_line_error(_bench(tiny_bundle.bundle_dir, out), "refusing to replace", str(out / "bench.png"), "symbolic link")
    assert tree_digest(tmp_path) == before
    proc = _bench(tiny_bundle.bundle_dir, out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "bench.png").is_symlink() and not (tmp_path / "mine.png").exists()  # the link, not through it
    assert json.loads((out / "bench.json").read_text())["format"] == "hne-edge-bench"
    proc = _bench(tiny_bundle.bundle_dir, out)  # its own files
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.png"]


def test_profile_replaces_only_a_profile_it_wrote(tiny_bundle, tmp_path, monkeypatch):
    """Issue 42 (3): a user's file at the profile's name, without "format": "hne-edge-profile" (by the bundle's rule
    not a profile the runtime wrote), was replaced by `hne-edge profile` with exit 0 before the fix."""
    from hne_edge.runtime import AnytimeRunner

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    mine = bundle / "profiles" / "cpu-onnxruntime-segments-fp32.json"
    mine.parent.mkdir(exist_ok=True)
    mine.write_text('{"my": "timings"}\n')
    before = tree_digest(tmp_path)
    args = ("profile", str(bundle), "--repeats", "2", "--warmup", "0", "--quiet")
    one_line_error(run_cli(*args), "refusing to replace", str(mine), "hne-edge-profile", "--force")
    assert tree_digest(tmp_path) == before
    monkeypatch.setenv("HNE_EDGE_CACHE", str(tmp_path / "cache"))  # the library: the user's file stays, the cache gets it
    with pytest.warns(UserWarning, match="ignoring saved profile"):  # the user's file is not read as a profile
        runner = AnytimeRunner(bundle, warmup=0)
    with runner, pytest.warns(UserWarning, match="refusing to replace .* saved the profile to"):
        runner.profile(batch_sizes=(1,), warmup=0, repeats=2)
    assert str(runner.profile_path).startswith(str(tmp_path / "cache")) and mine.read_text() == '{"my": "timings"}\n'
    proc = run_cli(*args, "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(mine.read_text())["format"] == "hne-edge-profile"
    proc = run_cli(*args)  # its own profile
    assert proc.returncode == 0, proc.stderr
    assert f"saved {mine}" in proc.stdout


def test_profile_force_replaces_a_link_at_the_profiles_name_not_what_it_points_to(tiny_bundle, tmp_path):
    """`profile --force` kept a link at the profile's name (the refusal without it said "pass --force to replace
    it") and saved to the user cache, exit 0."""
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    link = bundle / "profiles" / "cpu-onnxruntime-segments-fp32.json"
    link.parent.mkdir(exist_ok=True)
    link.unlink(missing_ok=True)
    notes = tmp_path / "notes.json"
    notes.write_text('{"user": "notes"}\n')
    link.symlink_to(notes)
    args = ("profile", str(bundle), "--repeats", "2", "--warmup", "0", "--quiet")
    env = {"HNE_EDGE_CACHE": str(tmp_path / "cache")}
    one_line_error(run_cli(*args, env=env), "refusing to replace", str(link), "symbolic link", "--force")
    proc = run_cli(*args, "--force", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not link.is_symlink() and json.loads(link.read_text())["format"] == "hne-edge-profile"
    assert notes.read_text() == '{"user": "notes"}\n' and not (tmp_path / "cache").exists()
    assert f"saved {link}" in proc.stdout


def test_info_plot_refuses_a_missing_folder_and_a_file_it_did_not_draw(tmp_path):
    """Issue 42 (4): `info --plot` overwrote any FILE and made its missing parent folders, exit 0; `--plot
    /proc/version` named an internal scratch file in its error."""
    info = ("info", "hne_tiny", "--json", "--plot")
    nowhere = tmp_path / "nonexistent" / "dir" / "x.png"
    one_line_error(run_cli(*info, str(nowhere)), str(tmp_path / "nonexistent" / "dir"), "does not exist")
    assert not (tmp_path / "nonexistent").exists()
    plot = tmp_path / "tree.png"
    plot.write_bytes(PNG + b"my own figure")
    one_line_error(run_cli(*info, str(plot)), "refusing to replace", str(plot), "--force")
    assert plot.read_bytes() == PNG + b"my own figure"
    assert run_cli(*info, str(plot), "--force").returncode == 0
    drawn = plot.read_bytes()
    assert drawn.startswith(PNG) and drawn != PNG + b"my own figure"
    assert run_cli(*info, str(plot)).returncode == 0  # its own figure: replaced without --force
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree.png"]
    for extra in ((), ("--force",)):
        err = one_line_error(run_cli(*info, "/proc/version", *extra), "/proc/version")
        assert ".hne-" not in err and ".version" not in err, err


def test_info_plot_to_a_folder_that_does_not_exist_is_refused(tmp_path):
    """`info --plot out/` (no such folder) drew a PNG named `out` in the current folder, exit 0."""
    one_line_error(run_cli("info", "hne_tiny", "--plot", "out/", cwd=tmp_path), "--plot out/", "does not exist",
                   "create the folder first")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_info_plot_checks_again_just_before_the_figure_is_moved_in(tmp_path):
    """`info --plot FILE` checked FILE only before drawing: a file the user saved there while the figure rendered
    was replaced, exit 0. Here the user's file appears as the figure is drawn (after the first check)."""
    plot = tmp_path / "tree.png"
    user_saves_while_drawing = (
        "import sys, hne_edge.plots as plots\n"
        "draw = plots.tree_figure\n"
        "def drawing(*args, **kwargs):\n"
        f"    open({str(plot)!r}, 'w').write('my notes, not a figure')\n"
        "    return draw(*args, **kwargs)\n"
        "plots.tree_figure = drawing\n"
        "from hne_edge.cli import main\n"
        "sys.argv = ['hne-edge', *sys.argv[1:]]\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", user_saves_while_drawing, "info", "hne_tiny", "--json", "--plot",
                           str(plot)], capture_output=True, text=True, cwd=REPO, env={**os.environ, **_HERE})  # fmt: skip
    one_line_error(proc, "refusing to replace", str(plot), "--force")
    assert plot.read_text() == "my notes, not a figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree.png"]


def test_train_on_a_full_disk_leaves_nothing(tmp_path):
    """Issue 42 (minor): the new --out folder stayed behind, empty, when the first checkpoint could not be written."""
    env = _full_disk_env(tmp_path)
    before = tree_digest(tmp_path)
    proc = run_cli(*TRAIN, "--out", str(tmp_path / "new" / "run"), env=env)
    one_line_error(proc, "No space left on device", after_progress=True)
    assert tree_digest(tmp_path) == before


# -- demo --------------------------------------------------------------------------------------------------

DEMO = ("demo", "--data", "digits", "--epochs", "1", "--limit", "100", "--quiet")


@pytest.mark.parametrize("force", [False, True])
def test_demo_refuses_a_folder_it_did_not_write(tmp_path, force):
    """Issue 19 (1): `demo --force` deleted any --out before the fix."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious\n")
    before = tree_digest(tmp_path)
    proc = run_cli(*DEMO, "--out", str(mine), *(("--force",) if force else ()))
    one_line_error(proc, str(mine), "thesis.txt")
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("force", [False, True])
def test_demo_refuses_its_own_folder_once_a_user_file_is_in_it(tmp_path, force):
    from hne_edge.demo import MARKER

    out = tmp_path / "demo"
    (out / "eval").mkdir(parents=True)
    (out / MARKER).write_text("written by hne-edge demo\n")
    (out / "demo.json").write_text("{}")
    (out / "my_results.csv").write_text("1,2\n")
    before = tree_digest(tmp_path)
    proc = run_cli(*DEMO, "--out", str(out), *(("--force",) if force else ()))
    one_line_error(proc, "my_results.csv")
    assert tree_digest(tmp_path) == before


def test_demo_force_adds_only_a_folder_of_demo_entries_without_its_marker(tmp_path):
    from hne_edge.demo import MARKER, _demo_folder

    out = tmp_path / "demo"
    (out / "bundle").mkdir(parents=True)
    (out / "demo.json").write_text("{}")
    before = tree_digest(tmp_path)
    one_line_error(run_cli(*DEMO, "--out", str(out)), MARKER, "--force")  # no marker: not known to be a demo's
    assert tree_digest(tmp_path) == before
    with _demo_folder(out, force=True):  # what `demo --force` does before it trains
        assert sorted(p.name for p in out.iterdir()) == [MARKER]
        (out / "eval").mkdir()
    with _demo_folder(out, force=False):  # a demo's folder (its marker, demo entries): the next demo replaces it
        assert sorted(p.name for p in out.iterdir()) == [MARKER]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def _previous_demo(out):
    from hne_edge.demo import MARKER

    (out / "eval").mkdir(parents=True)
    (out / MARKER).write_text("written by hne-edge demo\n")
    (out / "demo.json").write_text('{"budgets": []}')
    (out / "eval" / "metrics.json").write_text("{}")
    np.savez(out / "frames.npz", x=np.zeros((4, 8, 8, 1), np.uint8), y=np.arange(4) % 2)


def test_a_demo_that_fails_or_is_stopped_leaves_the_previous_demo_as_it_was(tmp_path):
    """The demo deleted the previous demo before it loaded its data: `demo --data npz --data-dir junk.npz` failed
    (exit 2) leaving only its marker where 72 files had been; Ctrl-C a few seconds in left a half-built folder. The
    previous demo is set aside until the new one is done, and put back if it is not."""
    from hne_edge.demo import _demo_folder

    out = tmp_path / "demo"
    _previous_demo(out)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    before = tree_digest(tmp_path)
    one_line_error(run_cli("demo", "--data", "npz", "--data-dir", str(tmp_path / "junk.npz"), "--out", str(out),
                           "--quiet"), "junk.npz")  # fmt: skip
    assert tree_digest(tmp_path) == before
    for stop in (KeyboardInterrupt, OSError):  # Ctrl-C / SIGTERM, a full disk
        with pytest.raises(stop), _demo_folder(out, force=False):
            (out / "demo.json").write_text("half")
            raise stop()
        assert tree_digest(tmp_path) == before
    fresh = tmp_path / "new" / "deeper" / "demo"
    with pytest.raises(KeyboardInterrupt), _demo_folder(fresh, force=False):
        raise KeyboardInterrupt
    assert tree_digest(tmp_path) == before  # no folder of its own left, its new parents neither


@pytest.mark.parametrize("where", ["frames.npz", "."])
def test_demo_refuses_an_input_inside_its_out(tmp_path, where):
    """`demo --out D --data-dir D/frames.npz` (the frames a previous demo wrote there) deleted the folder, its input
    with it, then failed: "npz data not found"."""
    out = tmp_path / "demo"
    _previous_demo(out)
    before = tree_digest(tmp_path)
    data = out / where if where != "." else out
    proc = run_cli("demo", "--data", "npz", "--data-dir", str(data), "--epochs", "1", "--out", str(out), "--quiet")
    one_line_error(proc, f"--out {out} holds {data}, an input of this demo")
    assert tree_digest(tmp_path) == before


def test_demo_refuses_an_empty_out(tmp_path):
    """`demo --out ''` was taken as the current directory ("'.' was not written by hne-edge demo")."""
    one_line_error(run_cli("demo", "--out", "", "--quiet", cwd=tmp_path), "--out: received an empty path")
    assert not any(tmp_path.iterdir())


# -- issue 29: inside a bundle, and beside any output ------------------------------------------------------


def test_force_refuses_a_bundle_with_user_files_nested_inside(tiny_bundle, tmp_path):
    """Issue 29 (1): both files were deleted by `export --force` (exit 0): only top-level entries were looked at."""
    bn = tmp_path / "bn"
    shutil.copytree(tiny_bundle.bundle_dir, bn)
    (bn / "onnx" / "NOTES.txt").write_text("notes\n")
    (bn / "torch" / "mywork").mkdir()
    (bn / "torch" / "mywork" / "data.txt").write_text("x\n")
    before = tree_digest(tmp_path)
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(bn), "--force", *FAST_EXPORT)
    one_line_error(proc, "refusing to replace", str(bn), "onnx/NOTES.txt", "--force replaces only")
    assert tree_digest(tmp_path) == before
    (bn / "onnx" / "NOTES.txt").unlink()
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(bn), "--force", *FAST_EXPORT)
    one_line_error(proc, "refusing to replace", "torch/mywork")
    assert (bn / "torch" / "mywork" / "data.txt").read_text() == "x\n"


def _look_alikes(folder: Path, name: str) -> None:
    """A user's folders and files whose names look like a killed writer's scratch siblings of ``name``."""
    for kind in ("old", "partial", "tmp"):
        for tail in ("2024-06", "31337-mine", "999999999-dead", "1-abcd1234"):
            entry = folder / f".{name}.{kind}-{tail}"
            if tail[0] == "2":
                entry.write_text(f"{kind} {tail}\n")
            else:
                entry.mkdir()
                (entry / "keep.txt").write_text(f"{kind} {tail}\n")


def test_export_eval_and_bench_leave_a_users_look_alike_folders_beside_out_alone(tiny_bundle, tmp_path, frames):
    """Issue 29 (2): `.bk.old-2024-06` and `.bk.partial-31337-mine` were removed by `export --out bk --force`:
    fileio.remove_stale read '2024' and '31337' as the process ids of dead writers."""
    bk = tmp_path / "bk"
    shutil.copytree(tiny_bundle.bundle_dir, bk)
    for name in ("bk", "ev", "be"):
        _look_alikes(tmp_path, name)
    before = {k: v for k, v in tree_digest(tmp_path).items() if not k.startswith(("bk", "ev", "be"))}
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(bk), "--force", *FAST_EXPORT)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", str(frames), "--out", str(tmp_path / "ev"),
                   "--no-plots", "--quiet", *CPU_DEVICE)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("bench", str(bk), "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "be"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    after = tree_digest(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith(("bk", "ev", "be"))} == before


def test_train_leaves_a_users_look_alike_files_in_its_folder_alone(tmp_path):
    """Issue 29 (2): a user's `.checkpoint.pt.tmp-2024-06` in the run folder passed for a dead writer's scratch:
    train took the folder for an empty one and atomic_file deleted the file."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".checkpoint.pt.tmp-2024-06").write_text("mine\n")
    before = tree_digest(tmp_path)
    one_line_error(run_cli(*TRAIN, "--out", str(run)), str(run), ".checkpoint.pt.tmp-2024-06")
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("inner, named", [("bundle/onnx/NOTES.txt", "'bundle' (it holds 'onnx/NOTES.txt'"),
                                          ("eval/mine/plot.png", "'eval/mine'"), ("train/notes.md", "'train/notes.md'"),
                                          ("bench/x.csv", "'bench/x.csv'")])  # fmt: skip
def test_demo_refuses_its_own_folder_with_a_user_file_nested_inside(tiny_bundle, tmp_path, inner, named):
    """Issue 29 (1), at the demo: its folders were checked by name only, so `demo` deleted a user's file inside its
    bundle/ or eval/ with the rest of the previous demo."""
    from hne_edge.demo import DEMO_LAYOUT, MARKER
    from hne_edge.train.engine import RUN_LAYOUT

    assert DEMO_LAYOUT["train"] == RUN_LAYOUT  # a demo's train/ is a run folder
    out = tmp_path / "demo"
    out.mkdir()
    (out / MARKER).write_text("written by hne-edge demo\n")
    shutil.copytree(tiny_bundle.bundle_dir, out / "bundle")
    (out / "eval").mkdir()
    (out / "eval" / "metrics.json").write_text("{}")
    (out / inner).parent.mkdir(parents=True, exist_ok=True)
    (out / inner).write_text("mine\n")
    before = tree_digest(tmp_path)
    proc = run_cli(*DEMO, "--out", str(out), "--force")
    one_line_error(proc, "was not written by hne-edge demo", f"it holds {named}")
    assert tree_digest(tmp_path) == before


# -- every command that writes, among a user's files inside, beside and above its output (issue 29) ---------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROFILE_NAME = "profiles/cpu-onnxruntime-segments-fp32.json"
METRICS_FILES = ("metrics.json", "accuracy_vs_macs.png", "diversity_vs_macs.png", "leaf_accuracy.png")
_user_name = st.one_of(
    st.sampled_from(["notes.txt", ".git", "manifest.json", "onnx", "profiles", "mine", "Documents", "a.png", "x.json",
                     *METRICS_FILES, "bench.json", "bench.png", "tree.png"]),  # and the names the commands write
    st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=8).filter(
        lambda n: n not in (".", "..")),
)
_user_tree = st.recursive(
    st.tuples(st.just("file"), st.binary(max_size=8)) | st.tuples(st.just("link"), st.sampled_from(["..", "nowhere"])),
    lambda kids: st.tuples(st.just("dir"), st.dictionaries(_user_name, kids, min_size=1, max_size=3)),
    max_leaves=4,
)
_user_trees = st.dictionaries(_user_name, _user_tree, min_size=2, max_size=4)


def _place(folder: Path, tree: dict) -> int:
    """Make ``tree`` in ``folder`` ({name: ("file", bytes) | ("link", target) | ("dir", {...})}), leaving alone what
    is there already; returns how many entries it made."""
    made = 0
    for name, (kind, value) in tree.items():
        path = folder / name
        if os.path.lexists(path):
            continue
        made += 1
        if kind == "file":
            path.write_bytes(value)
        elif kind == "link":
            path.symlink_to(value)
        else:
            path.mkdir()
            made += _place(path, value)
    return made


# commands that must write nothing at all, wherever they run
WRITES_NOTHING = ("run", "bench-streams", "verify", "inspect")


def _writer(command: str, tiny_bundle, frames: Path, work: Path) -> tuple[list[str], Path, bool, set[str]]:
    """(arguments, --out, whether the user's files go inside it, the files it writes there: "*" for anything under
    it, else paths relative to it); --out's folder is prepared here as a user would have it."""
    ckpt, out = str(tiny_bundle.checkpoint_path), work / "out"
    if command in ("export --force", "export --force (the user's files inside)", "profile", *WRITES_NOTHING):
        shutil.copytree(tiny_bundle.bundle_dir, out)
    elif command in ("eval", "bench", "info --plot", "train (the user's files inside)"):
        out.mkdir()
    elif command == "eval (into the checkpoint's folder)":
        out.mkdir()
        ckpt = shutil.copy(tiny_bundle.checkpoint_path, out / "checkpoint.pt")
    elif command.startswith("demo (the user's"):
        out.mkdir()
        (out / ".hne-edge-demo").write_text("written by hne-edge demo\n")
        shutil.copytree(tiny_bundle.bundle_dir, out / "bundle")
    everything = {"*"}
    streams = ("--streams", "1", "--seconds", "0.2", "--methods", "scheduler,fifo", "--json", "--quiet")
    return {
        "export": (["export", ckpt, "--out", str(out), *FAST_EXPORT], out, False, everything),
        "export --force": (["export", ckpt, "--out", str(out), "--force", *FAST_EXPORT], out, False, everything),
        "export --force (the user's files inside)": (["export", ckpt, "--out", str(out), "--force", *FAST_EXPORT], out,
                                                     True, set()),
        "train": ([*TRAIN, "--out", str(out)], out, False, everything),
        "train (the user's files inside)": ([*TRAIN, "--out", str(out)], out, True, set()),
        "eval": (["eval", ckpt, "--test-data", str(frames), "--out", str(out), "--quiet", *CPU_DEVICE], out, True,
                 set(METRICS_FILES)),
        "eval (into the checkpoint's folder)": (["eval", str(ckpt), "--test-data", str(frames), "--quiet", *CPU_DEVICE],
                                                out, True, set(METRICS_FILES)),
        "bench": (["bench", str(tiny_bundle.bundle_dir), "--repeats", "1", "--warmup", "0", "--out", str(out), "--quiet"],
                  out, True, {"bench.json", "bench.png"}),
        "profile": (["profile", str(out), "--repeats", "2", "--warmup", "0", "--quiet"], out, True, {PROFILE_NAME}),
        "info --plot": (["info", "hne_tiny", "--json", "--plot", str(out / "tree.png")], out, True, {"tree.png"}),
        "run": (["run", str(out), str(frames), "--json"], out, True, set()),
        "bench-streams": (["bench-streams", str(out), *streams], out, True, set()),
        "verify": (["verify", str(out), "--quiet"], out, True, set()),
        "inspect": (["inspect", str(out)], out, True, set()),
        "demo": ([*DEMO, "--out", str(out)], out, False, everything),
        "demo (the user's files inside its bundle)": ([*DEMO, "--out", str(out)], out / "bundle" / "onnx", True, set()),
    }[command]


def _in_the_way(out: Path, files: set[str]) -> bool:
    """Whether an entry of the user's stands where the command writes one of ``files`` (relative to ``out``): at the
    file's path, or something other than a folder on the way to it."""
    for rel in files - {"*"}:
        parts = rel.split("/")
        for k in range(1, len(parts) + 1):
            path = out.joinpath(*parts[:k])
            if os.path.lexists(path) and (k == len(parts) or path.is_symlink() or not path.is_dir()):
                return True
    return False


def _every_writer(tiny_bundle, frames: Path, tmp_path: Path, command: str, examples: int) -> None:
    runs = iter(range(10**6))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(inside=_user_trees, beside=_user_trees, above=_user_trees,
           clash=st.none() | st.tuples(st.integers(0, 7), _user_tree))  # fmt: skip
    def check(inside, beside, above, clash):
        top = tmp_path / f"example{next(runs)}"
        work = top / "work"
        work.mkdir(parents=True)
        args, out, into, writes = _writer(command, tiny_bundle, frames, work)
        _place(top, above)
        _place(work, beside)
        for name in _LOOK_ALIKES(out.name):
            if not os.path.lexists(work / name):
                (work / name).mkdir()
                (work / name / "keep.txt").write_text("mine\n")
        files = sorted(w for w in writes if w != "*")
        if into and clash is not None and files:  # a user's entry at a path the command writes, or on the way to it
            rel = files[clash[0] % len(files)].split("/")
            rel = rel[: 1 + clash[0] // len(files) % len(rel)]
            out.joinpath(*rel[:-1]).mkdir(parents=True, exist_ok=True)
            _place(out.joinpath(*rel[:-1]), {rel[-1]: clash[1]})
        if into and not _place(out, inside) and not _in_the_way(out, writes):
            writes = {"*"}  # every name was already there (the bundle's own): nothing of the user's inside to keep
        if _in_the_way(out, writes):
            writes = set()  # a user's file, link or folder where it writes: it refuses and changes nothing
        before = tree_digest(top)
        proc = run_cli(*args)
        after = tree_digest(top)
        if not writes and command not in WRITES_NOTHING:
            one_line_error(proc)
        else:
            assert proc.returncode == 0, (command, proc.stderr[-3000:])
        rel = str(out.relative_to(top))
        mine = lambda k: "*" in writes and (k == rel or k.startswith(rel + "/")) or any(  # noqa: E731
            k == f"{rel}/{w}" or f"{rel}/{w}".startswith(k + "/") for w in writes)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and not mine(k))
        assert not changed, (command, changed[:10])

    check()


_LOOK_ALIKES = lambda name: [f".{name}.{kind}-{tail}" for kind in ("tmp", "partial", "old")  # noqa: E731
                             for tail in ("2024-06", "31337-mine")]  # issue 29: taken for dead writers' scratch

# every command that writes (and those that must write nothing); `--out` is new where the command makes it, an
# existing folder of the user's where it may write into one
WRITERS = ["export", "export --force", "export --force (the user's files inside)", "train (the user's files inside)",
           "eval", "eval (into the checkpoint's folder)", "bench", "profile", "info --plot", *WRITES_NOTHING,
           "demo (the user's files inside its bundle)", pytest.param("train", marks=pytest.mark.slow),
           pytest.param("demo", marks=pytest.mark.slow)]  # fmt: skip


@pytest.mark.parametrize("command", WRITERS)
def test_every_writing_command_leaves_a_users_files_inside_beside_and_above_alone(tiny_bundle, frames, tmp_path,
                                                                                 command):  # fmt: skip
    """Issues 29 and 42: random trees of a user's files, folders and links (and names that look like our scratch)
    inside, beside and above each command's output, some at the very paths it writes; the command writes only its
    own files (or refuses, in one line, and changes nothing)."""
    _every_writer(tiny_bundle, frames, tmp_path, command, examples=1)


@pytest.mark.slow
@pytest.mark.parametrize("command", [w for w in WRITERS if isinstance(w, str)])
def test_every_writing_command_leaves_a_users_files_alone_many_trees(tiny_bundle, frames, tmp_path, command):
    _every_writer(tiny_bundle, frames, tmp_path, command, examples=6)
