"""Property-based tests (hypothesis): the boundary checks accept what is valid and refuse the rest with
HNEError, never another exception (issue 13)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from hne_edge.bundle import InputSpec, read_manifest  # noqa: E402
from hne_edge.errors import BundleError, HNEError, InputError  # noqa: E402
from hne_edge.runtime.inputs import check_input  # noqa: E402

SPEC = InputSpec(name="image", shape=("batch", 3, 8, 8), dtype="float32", layout="NCHW",
                 mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), batch=(1, 2, 4))  # fmt: skip
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# -- check_input -----------------------------------------------------------------------------------

dims = st.integers(0, 9)
shapes = st.one_of(
    hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=9),
    st.tuples(st.integers(0, 6), st.sampled_from([1, 3, 4]), dims, dims),
    st.tuples(st.integers(0, 6), st.just(3), st.just(8), st.just(8)),  # often the right shape
)
dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.uint8, np.int32, np.bool_, np.complex64])


@SETTINGS
@given(data=st.data(), shape=shapes, dtype=dtypes, fortran=st.booleans())
def test_check_input_returns_a_valid_array_or_raises_input_error(data, shape, dtype, fortran):
    x = data.draw(hnp.arrays(dtype, shape))
    if fortran:
        x = np.asfortranarray(x)
    try:
        out = check_input(x, SPEC)
    except InputError as exc:
        assert str(exc).startswith("input image: received"), exc
        return
    # accepted: exactly what the spec allows, unchanged
    assert out.dtype == np.float32 and out.flags.c_contiguous
    assert out.ndim == 4 and out.shape[1:] == (3, 8, 8) and 1 <= out.shape[0] <= 4
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, x)


@SETTINGS
@given(data=st.data(), shape=shapes, dtype=dtypes)
def test_check_input_refuses_every_masked_array(data, shape, dtype):
    """Issue 29 (4): a mask hid NaN from the finite check; whatever it hides, a masked array is refused."""
    x = np.ma.masked_array(data.draw(hnp.arrays(dtype, shape)), mask=data.draw(hnp.arrays(np.bool_, shape)))
    with pytest.raises(InputError, match="received a numpy masked array"):
        check_input(x, SPEC)


@SETTINGS
@given(value=st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=5), st.lists(st.floats(), max_size=4)))
def test_check_input_refuses_non_arrays(value):
    with pytest.raises(InputError, match="expected a numpy.ndarray"):
        check_input(value, SPEC)


# -- read_manifest ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)  # fmt: skip


@pytest.fixture(scope="module")
def manifest_bundle(tiny_bundle, tmp_path_factory):
    bundle = tmp_path_factory.mktemp("props") / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    original = json.loads((bundle / "manifest.json").read_text())
    return bundle, original


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_read_manifest_returns_a_manifest_or_raises_bundle_error(manifest_bundle, data):
    bundle, original = manifest_bundle
    doc = json.loads(json.dumps(original))
    # walk down from the root, stopping at each level with probability 1/2: shallow keys (tree.leaf_order,
    # input.mean, files) are hit as often as the hundreds of deep ones
    parent, key = doc, data.draw(st.sampled_from(sorted(doc)))
    while isinstance(parent[key], (dict, list)) and parent[key] and data.draw(st.booleans()):
        parent = parent[key]
        key = data.draw(st.sampled_from(sorted(parent) if isinstance(parent, dict) else range(len(parent))))
    path = (key,)
    action = data.draw(st.sampled_from(["replace", "delete", "add_key"]))
    if action == "replace":
        parent[path[-1]] = data.draw(json_values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(max_size=8))] = data.draw(json_values)
    (bundle / "manifest.json").write_text(json.dumps(doc))
    try:
        manifest = read_manifest(bundle, verify_files=False)
    except BundleError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) < 2000, text
        return
    assert manifest.tree.num_leaves == 16  # accepted: still the bundle's tree
    for f in manifest.files:
        assert f.macs >= 0 and f.bytes >= 0
    assert all(math.isfinite(v) for v in (*manifest.input.mean, *manifest.input.std))


@settings(max_examples=80, deadline=None)
@given(text=st.binary(max_size=200))
def test_read_manifest_of_arbitrary_bytes(manifest_bundle, text):
    bundle, _ = manifest_bundle
    (bundle / "manifest.json").write_bytes(text)
    with pytest.raises(BundleError):
        read_manifest(bundle, verify_files=False)


# -- CLI argument parsing --------------------------------------------------------------------------


def _invoke(args):
    from click.testing import CliRunner

    from hne_edge.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output, result.exception)
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, result.stderr)
    return result


@settings(max_examples=40, deadline=None)
@given(factors=st.lists(st.integers(-2, 40), max_size=40), junk=st.sampled_from(["", ",", " ", "x", ",,", "1e3"]))
def test_info_tree_option(factors, junk):
    value = ",".join(map(str, factors)) + junk
    valid = bool(factors) and not junk.strip(" ") and all(f >= 1 for f in factors)
    assume(not valid or math.prod(factors) <= 64)  # big valid trees are valid, just slow to build here
    result = _invoke(["info", "hne_tiny", "--tree", value, "--json"])
    if result.exit_code == 0:
        assert json.loads(result.stdout)["tree"]["branching"] == factors


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.one_of(st.integers(-3, 12), st.sampled_from(["x", "1.5", ""])),
    max_leaves=st.one_of(st.none(), st.integers(-2, 20)),
    min_leaves=st.integers(-2, 20),
    budget=st.one_of(st.none(), st.sampled_from(["0", "-1", "nan", "inf", "1e-9", "50", "abc"])),
)
def test_run_options(tiny_bundle, tmp_path_factory, batch, max_leaves, min_leaves, budget):
    x = tmp_path_factory.getbasetemp() / "props_x.npy"
    if not x.exists():
        np.save(x, np.zeros((3, 3, 16, 16), np.float32))
    args = ["run", tiny_bundle.bundle_dir, x, "--batch-size", batch, "--min-leaves", min_leaves, "--json"]
    args += [] if max_leaves is None else ["--max-leaves", max_leaves]
    args += [] if budget is None else ["--budget-ms", budget]
    result = _invoke(args)
    if result.exit_code == 0:
        records = json.loads(result.stdout)["records"]
        assert len(records) == 3 and all(1 <= r["leaves"] <= 16 for r in records)


@settings(max_examples=100, deadline=None)
@given(value=st.text(alphabet="0123456789:,- fp3216abx", max_size=12))
def test_export_option_parsers(value):
    from hne_edge.exporters.base import parse_batch, parse_precisions

    for parse in (parse_batch, parse_precisions):
        try:
            out = parse(value)
        except ValueError as exc:
            assert "received" in str(exc)
            continue
        if parse is parse_batch:
            assert 1 <= out[0] <= out[1] <= out[2]
        else:
            assert out and set(out) <= {"fp32", "fp16"}


# -- export --force and train --out touch only what is theirs (issue 19) ------------------------------------

from conftest import tree_digest  # noqa: E402

_BUNDLE_NAMES = ("onnx", "tensorrt", "torch", "profiles")  # the bundle layout's folders (bundle.BUNDLE_LAYOUT)
_OTHER_NAMES = ("notes.txt", ".git", "config.yaml", "train_log.json", "index.html", "a", "Documents")
_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                     max_leaves=6)  # fmt: skip
_link_targets = st.sampled_from(["../outside/secret.txt", "../outside", "nowhere", "../outside/bundle/manifest.json"])
_leaf = st.one_of(
    st.tuples(st.just("file"), st.binary(max_size=16)),
    st.tuples(st.just("link"), _link_targets),
)


@st.composite
def _entries(draw, names, depth=0):
    """{name: ("file", bytes) | ("link", target) | ("dir", {...})}, a few entries, nested a little."""
    out = {}
    for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        if depth < 2 and draw(st.booleans()):
            out[name] = ("dir", draw(_entries(("x.onnx", "y", "z.json"), depth + 1)))
        else:
            out[name] = draw(_leaf)
    return out


@st.composite
def _folders(draw):
    """A folder to hand to --out: empty, a user's, a bundle, a bundle plus things, a manifest of random JSON."""
    base = draw(st.sampled_from(["empty", "bundle", "random-manifest", "no-manifest"]))
    extras = draw(_entries(_BUNDLE_NAMES + _OTHER_NAMES if draw(st.booleans()) else _BUNDLE_NAMES))
    manifest = draw(_json) if base == "random-manifest" else None
    return base, extras, manifest


def _materialize(folder, spec) -> None:
    for name, (kind, value) in spec.items():
        path = folder / name
        if path.is_symlink() or path.exists():  # a bundle copy already has it: replace it with the drawn entry
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        if kind == "file":
            path.write_bytes(value)
        elif kind == "link":
            path.symlink_to(value)
        else:
            path.mkdir()
            _materialize(path, value)


def _build(root, tiny_bundle, case):
    """root/outside (what links point to) and root/out (the drawn folder); returns (out, ours) where ours says
    whether out is, by construction, an empty folder or an unaltered bundle plus only bundle-layout folders."""
    base, extras, manifest = case
    shutil.rmtree(root, ignore_errors=True)
    (root / "outside").mkdir(parents=True)
    (root / "outside" / "secret.txt").write_text("not yours\n")
    shutil.copytree(tiny_bundle.bundle_dir, root / "outside" / "bundle")
    out = root / "out"
    if base == "bundle":
        shutil.copytree(tiny_bundle.bundle_dir, out)
    else:
        out.mkdir()
    if base == "random-manifest":
        (out / "manifest.json").write_text(json.dumps(manifest))
    _materialize(out, extras)
    # a bundle's own folders, emptied (a damaged bundle is still ours); any file, link or folder inside them is not
    bundle_shaped = all(name in _BUNDLE_NAMES and kind == "dir" and not value for name, (kind, value) in extras.items())
    ours = (base in ("empty", "no-manifest") and not extras) or (base == "bundle" and bundle_shaped)
    return out, ours


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=_folders())
def test_export_force_replaces_only_an_empty_folder_or_a_bundle(tiny_bundle, tmp_path, case):
    from hne_edge.errors import ExportError
    from hne_edge.exporters import export_checkpoint

    out, ours = _build(tmp_path / "t", tiny_bundle, case)
    before = tree_digest(tmp_path / "t")
    try:
        export_checkpoint(tiny_bundle.checkpoint_path, out, force=True, verify=False, plan="segments", first_leaf=False,
                          torch_weights=False)  # fmt: skip
        replaced = True
    except ExportError as exc:
        assert "refusing to replace" in str(exc)
        replaced = False
    after = tree_digest(tmp_path / "t")
    assert replaced == ours, (case, sorted(before))
    if replaced:
        read_manifest(out, verify_files=True)  # the new bundle, whole
        mine = lambda k: k == "out" or k.startswith("out/")  # noqa: E731
        assert {k: v for k, v in after.items() if not mine(k)} == {k: v for k, v in before.items() if not mine(k)}
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "onnx"]
    else:
        assert after == before  # not a byte changed, nothing left beside it


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=_folders(), new=st.booleans())
def test_train_out_writes_only_into_a_new_or_empty_folder(tiny_bundle, tmp_path, case, new):
    from hne_edge.train import TrainConfig, fit

    out, ours = _build(tmp_path / "t", tiny_bundle, case)
    ours = ours and case[0] != "bundle"  # a bundle is not a run folder
    if new:
        out = out / "new-run"  # a new folder, wherever it is
    before = tree_digest(tmp_path / "t")
    config = TrainConfig.for_data("digits", {"out": str(out), "quiet": True, "threads": 1, "eval_every": 1,
                                             "device": "cpu",
                                             "data": {"limit": 64}, "optim": {"epochs": 1, "batch_size": 32}})  # fmt: skip
    try:
        fit(config)
        trained = True
    except HNEError as exc:
        assert "neither empty nor a run" in str(exc) or "exists and is not" in str(exc), exc
        trained = False
    after = tree_digest(tmp_path / "t")
    assert trained == (ours or new), (case, new, sorted(before))
    if trained:
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "config.yaml", "train_log.json"]
        rel = str(out.relative_to(tmp_path / "t"))
        mine = lambda k: k == rel or k.startswith(rel + "/")  # noqa: E731
        assert {k: v for k, v in after.items() if not mine(k)} == {k: v for k, v in before.items() if not mine(k)}
    else:
        assert after == before


# -- nothing we did not make is deleted: beside any output, inside a bundle (issue 29) ---------------------------

from conftest import dead_writers_scratch  # noqa: E402

_TARGETS = ("out", "bk", "out.json")  # a staged output folder, an export's folder, a file written atomically


def _look_alikes(target: str) -> list[str]:
    """Names a user may give that look like our scratch siblings of ``target`` (issue 29: `.bk.old-2024-06`)."""
    names = [f".{target}.{kind}-{tail}" for kind in ("tmp", "partial", "old")
             for tail in ("2024-06", "31337-mine", "1-abcd1234", "999999999-dead")]  # fmt: skip
    names += [f".{target}.hne-{kind}-999999999-0123456789abcdef" for kind in ("tmp", "partial", "old")]  # no seal
    names += [f".{target}.partial", f".{target}.tmp", f"{target}.old", f".{target}"]
    return names


@pytest.fixture(scope="module")
def dead_scratch_names():
    """{target: {kind: name}}: the scratch names a writer gave its siblings of each target, then exited (so the
    names are exactly ours, sealed, with a dead pid; each test places them where it likes)."""
    return {t: {k: dead_writers_scratch(Path("/") / t, k).name for k in ("tmp", "partial", "old")} for t in _TARGETS}


_name = st.one_of(
    st.sampled_from([n for t in _TARGETS for n in _look_alikes(t)] + ["notes.txt", ".git", "out.bak", "bk~", "manifest.json"]),
    st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=10).filter(
        lambda n: n not in (".", "..") and n not in _TARGETS),
)
_user_entry = st.recursive(
    st.tuples(st.just("file"), st.binary(max_size=8)) | st.tuples(st.just("link"), st.sampled_from(["out", "..", "nowhere"])),
    lambda kids: st.tuples(st.just("dir"), st.dictionaries(_name, kids, min_size=1, max_size=3)),
    max_leaves=5,
)


def _place(folder: Path, tree: dict) -> None:
    for name, (kind, value) in tree.items():
        path = folder / name
        if os.path.lexists(path):
            continue
        if kind == "file":
            path.write_bytes(value)
        elif kind == "link":
            path.symlink_to(value)
        else:
            path.mkdir()
            _place(path, value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(beside=st.dictionaries(_name, _user_entry, min_size=1, max_size=6), above=st.dictionaries(_name, _user_entry, max_size=3),
       ours=st.sets(st.sampled_from([(t, k) for t in _TARGETS for k in ("tmp", "partial", "old")])))  # fmt: skip
def test_writers_remove_only_a_dead_writers_own_scratch(tmp_path_factory, dead_scratch_names, beside, above, ours):
    """Every writer (atomic_file, staged_output, atomic_output_dir) among a user's files and look-alike names beside
    and above its target: what it removes is exactly the sealed scratch of dead writers of that target, nothing of the
    user's (before issue 29, `.bk.old-2024-06` and `.bk.partial-31337-mine` were deleted)."""
    from hne_edge.exporters.base import atomic_output_dir
    from hne_edge.fileio import atomic_write_json, atomic_write_text, staged_output

    top = tmp_path_factory.mktemp("beside")
    root = top / "work"
    root.mkdir()
    _place(top, above)
    _place(root, beside)
    for dead in ("out", "bk"):  # another target's sealed leftovers, copied here under this target's... and its own
        name = dead_scratch_names["bk" if dead == "out" else "out"]["partial"].replace(f".{'bk' if dead == 'out' else 'out'}.", f".{dead}.", 1)
        if not os.path.lexists(root / name):
            (root / name).mkdir()
            (root / name / "keep.txt").write_text("a copy of a leftover, renamed: the user's now\n")
    user = tree_digest(top)
    placed = {}
    for target, kind in sorted(ours):
        path = root / dead_scratch_names[target][kind]
        (path.mkdir() if kind != "tmp" else path.write_bytes(b"half"))
        placed[(target, kind)] = path
    atomic_write_json(root / "out.json", {"v": 1})
    with staged_output(root / "out") as stage:
        atomic_write_text(stage / "metrics.json", "{}")
    with atomic_output_dir(root / "bk") as tmp:
        atomic_write_text(tmp / "manifest.json", "{}")
    after = tree_digest(top)
    mine = lambda k: k in ("work/out", "work/bk", "work/out.json") or k.startswith(("work/out/", "work/bk/"))  # noqa: E731
    scratch = {str(p.relative_to(top)) for p in placed.values()}
    ours_left = {k for k in after if any(k == s or k.startswith(s + "/") for s in scratch)}
    assert {k: v for k, v in after.items() if not mine(k) and k not in ours_left} == user
    cleaned = {("out.json", "tmp"), ("out", "partial"), ("out", "old"), ("bk", "partial"), ("bk", "old")}
    for key, path in placed.items():  # a dead writer's sealed scratch goes where that writer's successor runs
        assert os.path.lexists(path) == (key not in cleaned), key


_BUNDLE_FOLDERS = ("", "onnx", "onnx/fp32", "onnx/fp32/segments", "onnx/fp32/nodes", "torch", "profiles", "tensorrt",
                   "tensorrt/trt10.3_sm87", "onnx/fp32/segments/more")  # existing ones, and folders a user adds
_inside_name = st.one_of(
    st.sampled_from(["NOTES.txt", "leaf00.onnx", "model.pt", "manifest.json", "timing.cache", "profiles", "trt10.3_sm87",
                     "cpu-onnxruntime-segments-fp32.json", ".leaf00.onnx.tmp-1-abcd1234", ".manifest.json.tmp-2024-06",
                     ".manifest.json.hne-tmp-999999999-0123456789abcdef", "b0.onnx", ".hne-edge-demo"]),
    st.text(st.characters(codec="utf-8", exclude_characters="/\x00'\""), min_size=1, max_size=10).filter(
        lambda n: n not in (".", "..")),
)
_addition = st.tuples(st.sampled_from(_BUNDLE_FOLDERS), _inside_name,
                      st.sampled_from(["file", "link", "dir"]), st.binary(max_size=8))  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(additions=st.lists(_addition, min_size=1, max_size=4))
def test_force_refuses_a_bundle_holding_anything_its_manifest_does_not_list(tiny_bundle, tmp_path_factory, additions):
    """A bundle is the files its manifest lists, the folders that hold them, and what our tools write beside them
    (profiles, an engine folder's timing cache, a dead writer's sealed scratch). A user's file, link or folder at
    any depth makes `force` refuse, naming it, and nothing changes (before issue 29 only the top level was looked at)."""
    from hne_edge.bundle import why_not_replaceable
    from hne_edge.errors import ExportError
    from hne_edge.exporters.base import atomic_output_dir

    root = tmp_path_factory.mktemp("inside")
    out = root / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    added = []  # every entry added is the user's: a file, a link, or a folder holding a file
    for folder, name, kind, data in additions:
        parent = out / folder
        if not parent.is_dir() or parent.is_symlink() or os.path.lexists(parent / name):
            continue  # a folder no earlier addition made, or a name the bundle (or an addition) has
        path = parent / name
        if kind == "file":
            path.write_bytes(data)
        elif kind == "link":
            path.symlink_to("../manifest.json")
        else:
            path.mkdir()
            (path / "mine.txt").write_bytes(data)
        added.append(str(path.relative_to(out)))
    assume(added)
    before = tree_digest(root)
    reason = why_not_replaceable(out)
    assert reason is not None and any(repr(a)[1:-1] in reason for a in added), (reason, added)  # named
    with pytest.raises(ExportError, match="refusing to replace"):
        with atomic_output_dir(out, force=True):
            pass
    assert tree_digest(root) == before
