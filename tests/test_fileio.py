"""The one atomic-write helper: a failed write leaves the old file and no scratch; a killed writer's leftovers go."""

import json
import os
from pathlib import Path

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
    ours = dict.fromkeys(("one.json", "two.json"), lambda path: None)  # every file of these names is ours, here
    with pytest.raises(RuntimeError):
        with staged_output(out, ours=ours) as stage:
            atomic_write_text(stage / "one.json", "2")
            raise RuntimeError("plot failed")
    assert (out / "one.json").read_text() == "1"  # the old file, untouched
    with staged_output(out, ours=ours) as stage:
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


def test_a_figure_is_ours_only_while_it_carries_the_seal_of_its_own_bytes(tmp_path):
    """Issue 42: what eval, bench and info --plot may replace of a PNG: one they drew, unchanged since."""
    import io

    from matplotlib.figure import Figure

    from hne_edge.fileio import seal_png, sealed_png

    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    sealed = seal_png(buffer.getvalue())
    (tmp_path / "ours.png").write_bytes(sealed)
    assert sealed_png(tmp_path / "ours.png") is None
    from PIL import Image

    with Image.open(tmp_path / "ours.png") as image:  # still a PNG any reader takes, its seal a text chunk
        assert image.size == (100, 100) and image.text["hne-edge"].startswith("sha256:")
    (tmp_path / "plain.png").write_bytes(buffer.getvalue())  # drawn, not sealed (a user's, or an older version's)
    edited = bytearray(sealed)
    edited[len(edited) // 2] ^= 1  # one bit of the image changed since
    (tmp_path / "edited.png").write_bytes(bytes(edited))
    (tmp_path / "text.png").write_text("not a png")
    for name in ("plain.png", "edited.png", "text.png"):
        assert "no hne-edge seal" in sealed_png(tmp_path / name), name


def test_a_record_is_ours_when_it_says_our_format_and_nothing_else_is(tmp_path):
    from hne_edge.errors import InputError
    from hne_edge.fileio import foreign_file, json_record, refuse_foreign

    ours = json_record("hne-edge-metrics")
    (tmp_path / "m.json").write_text('{"format": "hne-edge-metrics", "nll": NaN}')  # a diverged run's record is ours too
    assert foreign_file(tmp_path / "m.json", ours) is None and foreign_file(tmp_path / "new.json", ours) is None
    for text in ('{"format": "other"}', "[1]", "[" * 100_000, "\xff"):
        (tmp_path / "m.json").write_text(text, errors="surrogateescape")
        assert "hne-edge did not write it" in foreign_file(tmp_path / "m.json", ours), text
    assert foreign_file(tmp_path / "m.json", ours, force=True) is None
    (tmp_path / "link.json").symlink_to(tmp_path / "m.json")
    assert "symbolic link" in foreign_file(tmp_path / "link.json", ours)
    (tmp_path / "dir.json").mkdir()
    assert foreign_file(tmp_path / "dir.json", ours, force=True) == "it is a folder"  # never replaced
    with pytest.raises(InputError, match="refusing to replace .*m.json.*pass force=True"):
        refuse_foreign(tmp_path / "m.json", ours, flag="--out")
    with pytest.raises(InputError) as info:
        refuse_foreign(tmp_path / "dir.json", ours, force=True, flag="--out")
    assert info.value.cli_message().endswith("move it away, or choose another --out")
    (tmp_path / "profiles").symlink_to(tmp_path / "dir.json")  # a link on the way sends the file elsewhere
    assert "is a symbolic link" in foreign_file(tmp_path / "profiles" / "p.json", ours, force=True, under=tmp_path)


def test_staged_output_leaves_a_users_file_that_appeared_meanwhile(tmp_path):
    from hne_edge.errors import InputError
    from hne_edge.fileio import json_record, staged_output

    out = tmp_path / "out"
    out.mkdir()
    ours = {"one.json": json_record("mine-format")}
    with staged_output(out, ours=ours) as stage:
        atomic_write_json(stage / "one.json", {"format": "mine-format", "v": 1})
    with pytest.raises(InputError, match="refusing to replace .*one.json"):
        with staged_output(out, ours=ours) as stage:
            atomic_write_json(stage / "one.json", {"format": "mine-format", "v": 2})
            (out / "one.json").write_text("the user's, written while the command ran\n")
    assert (out / "one.json").read_text() == "the user's, written while the command ran\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and sorted(p.name for p in out.iterdir()) == ["one.json"]


def test_a_write_that_cannot_make_its_scratch_file_names_the_target():
    """Issue 42: `info --plot /proc/version --force` named `/proc/.version.hne-tmp-...` in its error."""
    target = Path("/proc/version")
    if not target.is_file():
        pytest.skip("no /proc here (a folder that refuses new files, to root too)")
    with pytest.raises(OSError) as info:
        atomic_write_json(target, {"v": 1})
    assert info.value.filename == str(target)
