"""The one atomic-write helper: a failed write leaves the old file and no scratch; a killed writer's leftovers go."""

import json
import os

import pytest

from conftest import dead_writers_scratch

from hne_edge.fileio import atomic_file, atomic_write_json, atomic_write_text, remove_stale, scratch_path


def test_failed_write_keeps_the_old_file_and_leaves_no_scratch(tmp_path):
    target = tmp_path / "record.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_file(target, "w") as f:
            f.write('{"v": 2')  # half a record
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_json_is_strict_unless_asked(tmp_path):
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "a.json", {"loss": float("nan")})
    assert not any(tmp_path.iterdir())  # nothing half-written
    atomic_write_json(tmp_path / "b.json", {"loss": float("nan")}, allow_nan=True)
    assert (tmp_path / "b.json").read_text().endswith("\n")


def test_written_file_gets_the_umask_mode(tmp_path):
    path = atomic_write_text(tmp_path / "t.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_remove_stale_takes_a_dead_writers_scratch_but_not_a_live_ones(tmp_path):
    target = tmp_path / "ckpt.pt"
    dead_scratch = dead_writers_scratch(target, "tmp")
    dead_scratch.write_bytes(b"half")
    live_scratch = scratch_path(target, "tmp")  # this process: alive
    live_scratch.write_bytes(b"in progress")
    remove_stale(target, ("tmp",))
    assert not dead_scratch.exists()
    assert live_scratch.exists()


def test_staged_output_moves_files_in_on_success_and_leaves_nothing_on_failure(tmp_path):
    from hne_edge.fileio import staged_output

    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(OSError):
        with staged_output(out) as stage:
            atomic_write_text(stage / "one.json", "{}")
            raise OSError(28, "No space left on device")
    assert list(tmp_path.iterdir()) == []  # not the folder, not its new parents, no scratch
    with staged_output(out) as stage:
        atomic_write_text(stage / "one.json", "1")
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"] and (out / "one.json").read_text() == "1"
    (out / "mine.txt").write_text("keep")
    with pytest.raises(RuntimeError):
        with staged_output(out) as stage:
            atomic_write_text(stage / "one.json", "2")
            raise RuntimeError("plot failed")
    assert (out / "one.json").read_text() == "1"  # the old file, untouched
    with staged_output(out) as stage:
        atomic_write_text(stage / "one.json", "3")
        atomic_write_text(stage / "two.json", "4")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"one.json": "3", "two.json": "4", "mine.txt": "keep"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_foreign_entry_names_the_first_entry_a_layout_does_not_hold(tmp_path):
    from hne_edge.fileio import foreign_entry

    layout = {"manifest.json": "file", "onnx": "dir"}
    assert foreign_entry(tmp_path, layout) is None
    (tmp_path / "onnx").mkdir()
    dead_writers_scratch(tmp_path / "manifest.json").write_text("{")  # a killed writer's scratch: ours
    assert foreign_entry(tmp_path, layout) is None
    (tmp_path / "manifest.json").symlink_to(tmp_path / "onnx")
    assert foreign_entry(tmp_path, layout) == "'manifest.json' (a symbolic link)"
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "manifest.json").mkdir()
    assert foreign_entry(tmp_path, layout) == "'manifest.json' (a folder, where a file belongs)"
    (tmp_path / "b.txt").write_text("x")
    (tmp_path / "a.txt").write_text("x")
    assert foreign_entry(tmp_path, layout) == "'a.txt'"
