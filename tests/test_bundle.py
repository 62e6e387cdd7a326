"""Hostile and tampered bundles: read_manifest must refuse each with an error naming the file and the field."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hne_edge.bundle import MANIFEST_NAME, read_manifest
from hne_edge.errors import BundleError, InputError


@pytest.fixture
def bundle(tiny_bundle, tmp_path):
    """A private copy of the session's tiny bundle (tests may damage it)."""
    return shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")


def edit(bundle, fn):
    path = bundle / MANIFEST_NAME
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def test_copy_reads_back(bundle):
    assert read_manifest(bundle).model_name == "hne_tiny"


def test_unknown_schema_version(bundle):
    edit(bundle, lambda d: d.update(schema_version=99))
    with pytest.raises(BundleError, match=r"schema_version 99 is not supported .*reads 1"):
        read_manifest(bundle)


def test_missing_key(bundle):
    edit(bundle, lambda d: d["files"][3].pop("sha256"))
    with pytest.raises(BundleError, match=r"files\[3\] is missing key\(s\) \['sha256'\]"):
        read_manifest(bundle)
    edit(bundle, lambda d: d.pop("provenance"))
    with pytest.raises(BundleError, match=r"manifest is missing key\(s\) \['provenance'\]"):
        read_manifest(bundle)


def test_extra_key(bundle):
    edit(bundle, lambda d: d["files"][0].update(run_this="rm -rf /"))
    with pytest.raises(BundleError, match=r"files\[0\] has unknown key\(s\) \['run_this'\]"):
        read_manifest(bundle)


def test_extra_top_level_key(bundle):
    edit(bundle, lambda d: d.update(plugins=["evil.so"]))
    with pytest.raises(BundleError, match=r"manifest has unknown key\(s\) \['plugins'\]"):
        read_manifest(bundle)


def test_sha256_mismatch_names_file_and_field(bundle):
    data = json.loads((bundle / MANIFEST_NAME).read_text())
    victim = data["files"][5]["path"]
    data = bytearray((bundle / victim).read_bytes())
    data[-1] ^= 0xFF  # same size: the sha256 is what differs
    (bundle / victim).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"{victim} \(files\[5\]\.sha256\) does not match the manifest"):
        read_manifest(bundle)
    # the structure alone still reads without hashing
    assert read_manifest(bundle, verify_files=False)


def test_dotdot_path(bundle):
    edit(bundle, lambda d: d["files"][0].update(path="onnx/../../outside.onnx"))
    with pytest.raises(BundleError, match=r"files\[0\] path 'onnx/../../outside.onnx' contains '\.\.'"):
        read_manifest(bundle)


def test_absolute_path(bundle):
    edit(bundle, lambda d: d["files"][0].update(path="/etc/passwd"))
    with pytest.raises(BundleError, match=r"files\[0\] path '/etc/passwd' must be relative"):
        read_manifest(bundle)


def test_symlink_pointing_out(bundle, tmp_path):
    outside = tmp_path / "outside.onnx"
    data = json.loads((bundle / MANIFEST_NAME).read_text())
    victim = bundle / data["files"][0]["path"]
    shutil.copy(victim, outside)  # same bytes, so only the location can give it away
    victim.unlink()
    os.symlink(outside, victim)
    with pytest.raises(BundleError, match=r"files\[0\] path 'onnx/fp32/nodes/b0.0.onnx' resolves to .* outside the bundle"):
        read_manifest(bundle)


def test_symlinked_directory_pointing_out(bundle, tmp_path):
    shutil.move(bundle / "onnx" / "fp32" / "segments", tmp_path / "segments")
    os.symlink(tmp_path / "segments", bundle / "onnx" / "fp32" / "segments")
    with pytest.raises(BundleError, match=r"path 'onnx/fp32/segments/leaf00.onnx' resolves to .* outside the bundle"):
        read_manifest(bundle)


def test_missing_file(bundle):
    (bundle / "onnx" / "fp32" / "nodes" / "b4.3.onnx").unlink()
    with pytest.raises(BundleError, match=r"bundle file missing: onnx/fp32/nodes/b4.3.onnx \(files\[\d+\]\)"):
        read_manifest(bundle)


def test_engine_source_escaping(bundle):
    edit(bundle, lambda d: d["files"][0].update(source="../model.onnx"))
    with pytest.raises(BundleError, match=r"files\[0\]\.source path '../model.onnx' contains '\.\.'"):
        read_manifest(bundle)


def test_plan_coverage(bundle):
    edit(bundle, lambda d: d["files"].pop(0))  # the root node's file
    with pytest.raises(BundleError, match=r"onnx/fp32/nodes must have exactly one file per tree node"):
        read_manifest(bundle)


def _first(d):
    return next(f for f in d["files"] if f["plan"] == "first")


def test_first_leaf_file_must_be_leaf_0_chain_with_logits_only(bundle):
    edit(bundle, lambda d: _first(d).update(nodes=["b0.0", "b1.0", "b2.0", "b3.0", "b4.1"], leaf=1))
    with pytest.raises(BundleError, match=r"onnx/fp32/first must be one file computing leaf 0's chain"):
        read_manifest(bundle, verify_files=False)


def test_first_leaf_file_with_exports_is_refused(bundle):
    def add_export(d):
        f = _first(d)
        f["outputs"].insert(0, {**f["outputs"][0], "name": "act_b0.0", "node": "b0.0"})

    edit(bundle, add_export)
    with pytest.raises(BundleError, match=r"onnx/fp32/first/leaf00.onnx outputs \['act_b0.0', 'logits'\]; expected \['logits'\]"):
        read_manifest(bundle, verify_files=False)


def test_first_leaf_file_alone_is_not_a_plan(bundle):
    edit(bundle, lambda d: d.update(files=[f for f in d["files"] if f["plan"] in ("first", "weights")]))
    with pytest.raises(BundleError, match=r"onnx/fp32/first is an add-on to a full plan; expected onnx/fp32/segments"):
        read_manifest(bundle, verify_files=False)


def test_not_json_and_no_manifest(bundle, tmp_path):
    (bundle / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(BundleError, match=r"manifest.json: not valid JSON"):
        read_manifest(bundle)
    with pytest.raises(BundleError, match=r"is not a bundle: manifest.json is missing"):
        read_manifest(tmp_path)


def test_file_path_is_the_one_layout():
    from hne_edge.bundle import engine_dir, file_path

    assert file_path("onnx", "fp32", "nodes", node="b1.0") == "onnx/fp32/nodes/b1.0.onnx"
    assert file_path("onnx", "fp16", "segments", leaf=3, num_leaves=16) == "onnx/fp16/segments/leaf03.onnx"
    assert file_path("onnx", "fp32", "segments", leaf=3, num_leaves=128) == "onnx/fp32/segments/leaf003.onnx"
    assert file_path("onnx", "fp32", "first", leaf=0) == "onnx/fp32/first/leaf00.onnx"
    assert file_path("torch", "fp32", "weights") == "torch/model.pt"
    assert file_path("onnx", "fp32", "subtrees", unit=2) == "onnx/fp32/subtrees/unit02.onnx"
    assert file_path("onnx", "fp16", "fused") == "onnx/fp16/fused/tree.onnx"
    with pytest.raises(ValueError, match=r"needs unit="):
        file_path("onnx", "fp32", "subtrees", leaf=2)
    trt = engine_dir("10.3.0.26", "sm_87")
    assert file_path("tensorrt", "fp16", "nodes", node="b2.1", engine_dir=trt) == "tensorrt/trt10.3_sm87/fp16/nodes/b2.1.plan"
    with pytest.raises(ValueError, match="needs engine_dir="):
        file_path("tensorrt", "fp16", "segments", leaf=0)
    with pytest.raises(ValueError, match=r"received format 'onnx', plan 'weights'"):
        file_path("onnx", "fp32", "weights")


@pytest.mark.parametrize("which", ["tiny_bundle", "steps_bundle"])
def test_every_file_of_an_export_is_where_file_path_puts_it(which, request):
    from hne_edge.bundle import file_key, file_path

    bundle = request.getfixturevalue(which)
    manifest = read_manifest(getattr(bundle, "bundle_dir", bundle), verify_files=False)
    for f in manifest.files:
        node = f.nodes[0] if f.plan == "nodes" else None
        unit = next((u.index for u in manifest.tree.subtree_units if u.first_leaf == f.leaf), None)
        assert f.path == file_path(f.format, f.precision, f.plan, node=node, leaf=f.leaf, unit=unit,
                                   num_leaves=manifest.tree.num_leaves)  # fmt: skip
        if f.format == "onnx":  # what the TensorRT builder names an engine after its source
            assert file_path(f.format, f.precision, f.plan, **file_key(f, manifest.tree)) == f.path


@pytest.fixture
def steps_copy(steps_bundle, tmp_path):
    """A private copy of the session's bundle with plans subtrees and fused."""
    return shutil.copytree(steps_bundle, tmp_path / "bundle")


def _plan_files(d, plan, precision="fp32"):
    return [f for f in d["files"] if (f["plan"], f["precision"], f["format"]) == (plan, precision, "onnx")]


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d["files"].remove(_plan_files(d, "subtrees")[2]),
         r"onnx/fp32/subtrees must have exactly one file per unit, starting at leaves \[0, 1, 2, 4, 8\]; received \[0, 1, 4, 8\]"),
        (lambda d: _plan_files(d, "subtrees")[3].update(nodes=["b2.1", "b3.2"]),
         r"onnx/fp32/subtrees/unit03.onnx computes \['b2.1', 'b3.2'\]; the tree's subtrees unit starting at leaf 4 is"),
        (lambda d: _plan_files(d, "subtrees")[2]["outputs"][0].update(shape=["batch", 3, 10]),
         r"unit02.onnx outputs logits \['batch', 3, 10\] of node b3.1; expected \['batch', 2, 10\] of node b3.1"),
        (lambda d: _plan_files(d, "subtrees")[0]["outputs"].pop(1),
         r"unit00.onnx outputs \['act_b0.0', 'act_b2.0', 'act_b3.0', 'logits'\]; expected \['act_b0.0', 'act_b1.0'"),
        (lambda d: _plan_files(d, "subtrees")[4]["inputs"][0].update(node="b1.0", name="act_b1.0"),
         r"unit04.onnx must read exactly one input, act_b0.0; received \['act_b1.0'\]"),
        (lambda d: _plan_files(d, "fused")[0].update(nodes=_plan_files(d, "fused")[0]["nodes"][:-1]),
         r"onnx/fp32/fused/tree.onnx computes .*; the tree's fused unit starting at leaf 0 is"),
        (lambda d: _plan_files(d, "fused")[0]["outputs"][0].update(node="b0.0"),
         r"tree.onnx outputs logits \['batch', 16, 10\] of node b0.0; expected \['batch', 16, 10\] of node None"),
        (lambda d: d["files"].append(dict(_plan_files(d, "fused")[0], path="onnx/fp32/fused/tree2.onnx")),
         r"onnx/fp32/fused must have exactly one file per unit"),
    ],
)
def test_subtrees_and_fused_coverage(steps_copy, change, match):
    edit(steps_copy, change)
    with pytest.raises(BundleError, match=match):
        read_manifest(steps_copy, verify_files=False)


def test_first_leaf_file_beside_subtrees_alone_is_a_plan(steps_copy):
    edit(steps_copy, lambda d: d.update(files=[f for f in d["files"] if f["plan"] in ("subtrees", "first")]))
    assert {v[1] for v in read_manifest(steps_copy, verify_files=False).variants()} == {"subtrees", "first"}
    edit(steps_copy, lambda d: d.update(files=[f for f in d["files"] if f["plan"] == "first"] + [
        dict(f) for f in d["files"] if f["plan"] == "subtrees" and f["precision"] == "fp16"]))  # fmt: skip
    with pytest.raises(BundleError, match=r"onnx/fp32/first is an add-on to a full plan; expected onnx/fp32/segments or "
                                          r"onnx/fp32/nodes or onnx/fp32/subtrees beside it"):  # fmt: skip
        read_manifest(steps_copy, verify_files=False)


def test_update_manifest_replaces_by_path_and_refuses_a_missing_file(bundle):
    import dataclasses

    from hne_edge.bundle import sha256_file, update_manifest

    manifest = read_manifest(bundle)
    old = manifest.files[0]
    (bundle / old.path).write_bytes(b"changed")
    new = dataclasses.replace(old, sha256=sha256_file(bundle / old.path), bytes=7)
    updated = update_manifest(bundle, [new])
    assert read_manifest(bundle, verify_files=True) == updated and len(updated.files) == len(manifest.files)
    before = (bundle / MANIFEST_NAME).read_bytes()
    ghost = dataclasses.replace(old, path=old.path.replace(".onnx", "_ghost.onnx"))
    with pytest.raises(BundleError, match=r"bundle file missing: .*ghost.* would be listed in the manifest but is not on disk"):
        update_manifest(bundle, [ghost])
    assert (bundle / MANIFEST_NAME).read_bytes() == before  # refused before anything was written


def test_manifest_digest_is_of_the_bytes_that_were_parsed(bundle):
    """A profile is keyed to the manifest's sha256: it must be the digest of the bytes read, read once."""
    import hashlib

    from hne_edge.bundle import read_manifest_and_digest
    from hne_edge.runtime import AnytimeRunner

    manifest, digest = read_manifest_and_digest(bundle)
    assert digest == hashlib.sha256((bundle / MANIFEST_NAME).read_bytes()).hexdigest()
    assert manifest == read_manifest(bundle)
    with AnytimeRunner(bundle, load_profile=False) as runner:
        assert runner.manifest_sha256 == digest


@pytest.mark.parametrize("std, mean", [(1e-300, 0.5), (1e-39, 0.5), (1e-38, 0.5), (1e-30, 1e10)])
def test_an_input_normalisation_that_overflows_float32_is_refused(bundle, std, mean):
    """`input.std = 1e-300` was accepted, and then the user's finite input was blamed as non-finite (preprocess's
    1 / std is inf in float32): every std must be a positive normal float32 and every pixel in [0, 1] must
    normalise to a finite float32."""
    def change(d):
        d["input"]["std"][1] = std
        d["input"]["mean"][1] = mean

    edit(bundle, change)
    with pytest.raises(BundleError, match=r"input\.std\[1\]|input\.mean\[1\]") as info:
        read_manifest(bundle, verify_files=False)
    assert repr(std) in str(info.value) and "float32" in str(info.value)


def test_a_normalisation_that_overflows_float16_is_refused_where_fp16_files_read_the_image(steps_bundle, tiny_bundle,
                                                                                           tmp_path):
    """docs/guarantees.md: a finite image is never made inf by the manifest. The check was float32's only: with
    ``std = 1e-5`` a pixel of 1 normalises to 1e5, finite in float32, inf once cast to float16 for the fp16 files -
    and the user's image was blamed ("received 768 non-finite value(s)"). Refused at read where fp16 files are, and
    at export before any file is written; an fp32-only bundle keeps the float32 bound."""
    from hne_edge.exporters import export_onnx

    copy = shutil.copytree(steps_bundle, tmp_path / "fp16")
    edit(copy, lambda d: d["input"].__setitem__("std", [1e-5] * 3))
    with pytest.raises(BundleError, match=r"input\.mean\[0\] = 0\.0 with input\.std\[0\] = 1e-05 normalises a pixel "
                                          r"in \[0, 1\] beyond float16 \(its fp16 files read the image so\)'s largest"):
        read_manifest(copy, verify_files=False)
    fp32 = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "fp32")
    edit(fp32, lambda d: d["input"].__setitem__("std", [1e-5] * 3))
    assert read_manifest(fp32, verify_files=False).input.std == (1e-5,) * 3  # 1e5 is a finite float32
    with pytest.raises(InputError, match=r"normalization\.mean\[0\] = 0\.5 .* beyond float16"):
        export_onnx(tiny_bundle.model, tmp_path / "never", normalization={"mean": [0.5] * 3, "std": [1e-6] * 3},
                    precisions=("fp32", "fp16"), plan="segments", batch=(1, 1, 2))
    assert not (tmp_path / "never").exists() and not [p for p in tmp_path.iterdir() if ".hne-" in p.name]


@pytest.mark.parametrize("key, value, match", [
    ("num_classes", 0, r"model\.config\.num_classes must be a positive integer of at most 100000; received 0"),
    ("num_classes", 2**49, r"model\.config\.num_classes must be a positive integer of at most 100000; received 562949953421312"),
    ("input_size", 2**40, r"model\.config\.input_size must be a positive integer of at most 1024; received 1099511627776"),
    ("in_chans", "3", r"model\.config\.in_chans must be a positive integer"),
    ("num_classes", 7, r"model\.config\.num_classes is 7; model\.class_names has 10 classes"),
])  # fmt: skip
def test_a_manifests_model_config_is_bounded_at_read(bundle, key, value, match):
    """`model.config` was read unchecked (a torch runner then built from it, or failed naming no manifest)."""
    edit(bundle, lambda d: d["model"]["config"].__setitem__(key, value))
    with pytest.raises(BundleError, match=match):
        read_manifest(bundle, verify_files=False)
