"""ONNX export: per-node and per-segment files, dynamic batch, folded BatchNorm, numerics vs PyTorch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hne_edge.bundle import PROFILE_FORMAT, profile_filename, read_manifest


def test_tiny_bundle_is_a_valid_bundle(tiny_bundle):
    manifest = read_manifest(tiny_bundle.bundle_dir)
    assert manifest.variants() == [
        ("onnx", "nodes", "fp32"), ("onnx", "segments", "fp32"), ("onnx", "first", "fp32"), ("torch", "weights", "fp32")
    ]  # fmt: skip
    assert len(manifest.files_for("nodes")) == len(manifest.tree.nodes) == 31
    assert len(manifest.files_for("segments")) == manifest.tree.num_leaves == 16
    (first,) = manifest.files_for("first")
    assert first.path == "onnx/fp32/first/leaf00.onnx" and first.nodes == manifest.tree.segments[0].nodes
    assert [o.name for o in first.outputs] == ["logits"] and first.macs == manifest.prefix_macs()[0]
    assert manifest.input.batch == (1, 1, 8)
    assert manifest.class_names[0] == "c0"
    assert manifest.input.mean == (0.49, 0.48, 0.45)
    assert manifest.input.shape == ("batch", 3, 16, 16)


import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from hne_edge.errors import ExportError  # noqa: E402
from hne_edge.exporters import ShapeError, ToleranceError, export_onnx, export_standalone_network  # noqa: E402
from hne_edge.exporters.onnx import export_module, fold_batchnorm  # noqa: E402
from hne_edge.exporters.verify import compare_outputs, verify_bundle  # noqa: E402
from hne_edge.models import create_model, tree_cost  # noqa: E402
from conftest import randomize_  # noqa: E402


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _chain(manifest, bundle_dir, plan, precision, image):
    """Independent of hne_edge.exporters.verify: chain the bundle's files with plain onnxruntime."""
    files = manifest.files_for(plan, precision)
    cache = {None: image}
    leaves = []
    for seg in manifest.tree.segments:
        if plan == "nodes":
            x = cache[seg.input]
            for nid in seg.nodes:
                (f,) = [f for f in files if f.nodes == (nid,)]
                (x,) = _session(bundle_dir / f.path).run(None, {f.inputs[0].name: x})
                cache[nid] = x
            leaves.append(x)
        else:
            f = files[seg.leaf]
            outs = _session(bundle_dir / f.path).run(None, {f.inputs[0].name: cache[seg.input]})
            cache.update({spec.node: out for spec, out in zip(f.outputs, outs)})
            leaves.append(outs[-1])
    return np.stack(leaves, axis=1).astype(np.float32)  # (B, N, classes)


def test_every_file_has_symbolic_batch_no_batchnorm_and_is_self_contained(tiny_bundle):
    manifest = read_manifest(tiny_bundle.bundle_dir)
    on_disk = {p.relative_to(tiny_bundle.bundle_dir).as_posix() for p in tiny_bundle.bundle_dir.rglob("*") if p.is_file()}
    assert on_disk == {f.path for f in manifest.files} | {"manifest.json"}  # no external-data side files
    for f in manifest.files:
        if f.format != "onnx":
            continue
        proto = onnx.load(str(tiny_bundle.bundle_dir / f.path))
        assert proto.opset_import[0].version == f.opset == 17
        assert "BatchNormalization" not in {n.op_type for n in proto.graph.node}, f.path
        for value in [*proto.graph.input, *proto.graph.output]:
            assert value.type.tensor_type.shape.dim[0].dim_param == "batch", (f.path, value.name)
        assert [i.name for i in proto.graph.input] == [t.name for t in f.inputs]
        assert [o.name for o in proto.graph.output] == [t.name for t in f.outputs]


@pytest.mark.parametrize("plan", ["nodes", "segments"])
def test_anytime_from_bundle_equals_fused_mean(tiny_bundle, plan):
    """Chaining the files depth-first gives the fused model's mean of the first n leaves, every n (fp32, 1e-4)."""
    manifest = read_manifest(tiny_bundle.bundle_dir)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(5))  # batch 3: not the export's 2
    with torch.no_grad():
        fused = tiny_bundle.model(x).numpy()
    assert np.abs(fused).max() > 0.5
    leaves = _chain(manifest, tiny_bundle.bundle_dir, plan, "fp32", x.numpy())
    for n in range(1, manifest.tree.num_leaves + 1):
        diff = np.abs(leaves[:, :n].mean(1) - fused[:, :n].mean(1)).max()
        assert diff <= 1e-4, f"{plan}: n={n} differs by {diff:.2e}"


def test_first_segment_costs_one_network(tiny_bundle):
    manifest = read_manifest(tiny_bundle.bundle_dir)
    first = manifest.files_for("segments")[0]
    cost = tree_cost(tiny_bundle.model)
    assert first.nodes == manifest.tree.path(0)
    assert first.macs == cost.path_macs[0] == manifest.prefix_macs()[0]
    assert [o.name for o in first.outputs] == ["act_b0.0", "act_b1.0", "act_b2.0", "act_b3.0", "logits"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_first_leaf_file_is_leaf_0_without_exports(tiny_bundle, fp16_bundle, precision):
    bundle = tiny_bundle.bundle_dir if precision == "fp32" else fp16_bundle
    (f,) = read_manifest(bundle).files_for("first", precision)
    proto = onnx.load(str(bundle / f.path))
    assert [o.name for o in proto.graph.output] == ["logits"]
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        fused = tiny_bundle.model(x).numpy()
    dtype = np.float16 if precision == "fp16" else np.float32
    (got,) = _session(bundle / f.path).run(None, {"image": x.numpy().astype(dtype)})
    assert np.abs(got.astype(np.float32) - fused[:, 0]).max() <= (5e-3 if precision == "fp16" else 1e-4)


def test_torch_weights_file_is_the_fused_state_dict(tiny_bundle):
    state = torch.load(tiny_bundle.bundle_dir / "torch" / "model.pt", weights_only=True)
    ref = tiny_bundle.model.state_dict()
    assert set(state) == set(ref) and all(torch.equal(state[k], ref[k]) for k in ref)


def test_fold_batchnorm_removes_bn_and_keeps_numerics():
    model = randomize_(create_model("hne_tiny"))
    node = model.node_module("b2.1")
    folded = fold_batchnorm(node)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in node.modules())  # the original is untouched
    x = torch.randn(2, 16, 16, 16)
    with torch.no_grad():
        assert (folded(x) - node(x)).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory, tiny_bundle):
    out = tmp_path_factory.mktemp("fp16") / "bundle"
    return export_onnx(tiny_bundle.model, out, precisions="fp32,fp16", plan="segments", batch=(1, 2, 4), torch_weights=False)


def test_fp16_files_are_half_end_to_end(fp16_bundle, tiny_bundle):
    manifest = read_manifest(fp16_bundle)
    assert manifest.input.dtype == "float32"  # fp32 exported too; each file states its own dtype
    f16 = manifest.files_for("segments", "fp16")
    for f in f16:
        proto = onnx.load(str(fp16_bundle / f.path))
        elem = {v.type.tensor_type.elem_type for v in [*proto.graph.input, *proto.graph.output]}
        assert elem == {onnx.TensorProto.FLOAT16}
        assert {t.data_type for t in proto.graph.initializer} <= {onnx.TensorProto.FLOAT16, onnx.TensorProto.INT64}
        assert all(t.dtype == "float16" for t in (*f.inputs, *f.outputs))
    # numerics vs the fp32 PyTorch model, with the documented fp16 bound
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        fused = tiny_bundle.model(x).numpy()
    leaves = _chain(manifest, fp16_bundle, "segments", "fp16", x.numpy().astype(np.float16))
    for n in (1, 4, 16):
        check = compare_outputs("fp16", f"n={n}", leaves[:, :n].mean(1), fused[:, :n].mean(1), "fp16")
        assert check.ok, check.message()
        assert check.max_abs_diff < 5e-3  # measured ~2e-4; the stated bound is 1e-3 + 5e-3 * max|ref|
    assert (np.abs(leaves[:, 0] - fused[:, 0])).max() > 0  # really computed in fp16, not silently fp32


def test_export_refuses_existing_dir_and_force_replaces(tmp_path, tiny_bundle):
    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match=rf"output directory {out} already exists; pass force=True to replace it"):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False)
    # --force replaces a bundle, never a folder of other files (issue 13, D1)
    with pytest.raises(ExportError, match="'keep.txt', which is not part of a bundle; force=True replaces only"):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, force=True)
    assert (out / "keep.txt").read_text() == "x"
    (out / "keep.txt").unlink()
    export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, force=True)  # empty
    (out / "profiles").mkdir()  # what a runner adds to a bundle (a profile, by its name and format) is the bundle's
    (out / "profiles" / profile_filename("cpu", "onnxruntime", "segments", "fp32")).write_text(
        json.dumps({"format": PROFILE_FORMAT}))
    export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, force=True)
    assert not (out / "profiles").exists() and read_manifest(out)
    (out / "stale.txt").write_text("x")  # a bundle with a file of someone else's is no longer ours (issue 19)
    with pytest.raises(ExportError, match="'stale.txt'"):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, force=True)
    assert (out / "stale.txt").read_text() == "x" and read_manifest(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]  # no temporary leftovers


def test_failed_verification_or_crash_leaves_nothing(tmp_path, tiny_bundle, monkeypatch):
    from hne_edge.exporters import base

    out = tmp_path / "bundle"
    monkeypatch.setitem(base.TOLERANCES, "fp32", base.Tolerance(atol=0.0))  # nothing can pass: verification fails
    with pytest.raises(ToleranceError, match=r"bundle verification failed: .*max abs difference .* exceeds the bound 0"):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False)
    monkeypatch.undo()

    def crash(tmp):
        assert (tmp / "manifest.json").exists()  # the bundle was complete when the crash came
        raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, post_export=crash)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["runs/b/c/bundle", "x/../y/bundle"])
@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_failed_or_interrupted_export_leaves_no_folder_it_created(tmp_path, tiny_bundle, monkeypatch, out, failure):
    """The parent folders made for out_dir go with a failed export too (eval, bench and train leave no new folder)."""
    monkeypatch.chdir(tmp_path)

    def fail(tmp):
        raise failure("stop")

    with pytest.raises(failure):
        export_onnx(tiny_bundle.model, out, plan="segments", torch_weights=False, verify=False, post_export=fail)
    assert list(tmp_path.iterdir()) == []


def test_verify_detects_a_different_model(tiny_bundle):
    other = randomize_(create_model("hne_tiny"), seed=1)
    report = verify_bundle(tiny_bundle.bundle_dir, model=other, batch_sizes=[2])
    assert not report.ok
    with pytest.raises(ToleranceError, match=r"max abs difference .* exceeds the bound 0.0001; at index"):
        report.raise_for_failures()
    wrong_arch = create_model("hne_tiny", num_classes=5)
    with pytest.raises(ExportError, match="is not the architecture of the bundle"):
        verify_bundle(tiny_bundle.bundle_dir, model=wrong_arch)


def test_shape_errors():
    with pytest.raises(ShapeError, match=r"received output shape \[2, 10\]; expected \[2, 5\]"):
        compare_outputs("leaf00.onnx", "logits", np.zeros((2, 10)), np.zeros((2, 5)), "fp32")


def test_fixed_batch_is_caught(tmp_path):
    """A file whose batch dim is baked in must be refused (here: exported without dynamic axes)."""
    from hne_edge.exporters.onnx import check_onnx_model

    node = fold_batchnorm(randomize_(create_model("hne_tiny")).node_module("b0.0"))
    path = tmp_path / "fixed.onnx"
    with torch.no_grad():
        torch.onnx.export(node, (torch.randn(2, 3, 16, 16),), str(path), input_names=["image"],
                          output_names=["act_b0.0"], opset_version=17, dynamo=False)  # fmt: skip
    with pytest.raises(ShapeError, match=r"tensor image has a fixed batch dimension 2; expected a symbolic one"):
        check_onnx_model(onnx.load(str(path)), path, ["image"], ["act_b0.0"])


def test_dynamo_exporter_path(tmp_path, tiny_bundle):
    node = fold_batchnorm(tiny_bundle.model.node_module("b4.0"))
    x = torch.randn(2, 32, 8, 8)
    # issue 20 item 11: asked for opset 17 (the default), dynamo wrote opset 18 (its down-conversion of ReduceMean
    # fails) and the bundle would have recorded 17; now refused, naming the opset it can write
    with pytest.raises(ExportError, match=r"leaf.onnx: the dynamo exporter wrote an opset-18 graph; the bundle "
                                          r"records opset 17 .*; pass opset=18"):
        export_module(node, tmp_path / "leaf.onnx", x, ["act_b3.0"], ["logits"], exporter="dynamo")
    path = export_module(node, tmp_path / "leaf.onnx", x, ["act_b3.0"], ["logits"], exporter="dynamo", opset=18)
    assert [o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx")] == [18]
    proto = onnx.load(str(path))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # symbolic batch
    x5 = torch.randn(5, 32, 8, 8)
    (got,) = _session(path).run(None, {"act_b3.0": x5.numpy()})
    with torch.no_grad():
        assert np.abs(got - tiny_bundle.model.node_module("b4.0")(x5).numpy()).max() <= 1e-4


@pytest.mark.parametrize("leaf", [0, 11])
def test_standalone_network(tmp_path, tiny_bundle, leaf):
    path = export_standalone_network(tiny_bundle.model, leaf, tmp_path / f"net{leaf}.onnx")
    x = torch.randn(3, 3, 16, 16)
    (got,) = _session(path).run(None, {"image": x.numpy()})
    with torch.no_grad():
        ref = tiny_bundle.model(x)[:, leaf].numpy()
    assert np.abs(got - ref).max() <= 1e-4
    assert [p.name for p in tmp_path.iterdir()] == [f"net{leaf}.onnx"]


# -- plans "subtrees" and "fused" -------------------------------------------------------------------------


def test_subtrees_and_fused_files_are_the_trees_units(steps_bundle, tiny_bundle):
    from hne_edge.bundle import file_path

    manifest = read_manifest(steps_bundle)
    tree = manifest.tree
    assert [v[1:] for v in manifest.variants() if v[0] == "onnx"] == [
        (p, q) for p in ("segments", "subtrees", "fused", "first") for q in ("fp32", "fp16")
    ]
    for precision in ("fp32", "fp16"):
        units = manifest.files_for("subtrees", precision)
        assert [f.path for f in units] == [file_path("onnx", precision, "subtrees", unit=i) for i in range(5)]
        assert [(f.leaf, f.nodes, f.inputs[0].node) for f in units] == [
            (u.first_leaf, u.nodes, u.input) for u in tree.subtree_units
        ]
        assert [o.name for o in units[0].outputs] == ["act_b0.0", "act_b1.0", "act_b2.0", "act_b3.0", "logits"]
        assert [f.outputs[-1].shape for f in units[1:]] == [("batch", k, 10) for k in (1, 2, 4, 8)]
        assert sum(f.macs for f in units) == manifest.prefix_macs()[-1]  # every node once
        (fused,) = manifest.files_for("fused", precision)
        assert fused.path == f"onnx/{precision}/fused/tree.onnx" and fused.outputs[-1].shape == ("batch", 16, 10)
        assert fused.macs == manifest.prefix_macs()[-1]
    # independent of the runtime and of verify: chain the subtree files with plain onnxruntime
    x = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        ref = tiny_bundle.model.eval()(torch.from_numpy(x)).numpy()  # (B, N, classes)
    cache, got = {None: x}, []
    for f in manifest.files_for("subtrees"):
        outs = _session(steps_bundle / f.path).run(None, {f.inputs[0].name: cache[f.inputs[0].node]})
        cache.update({spec.node: out for spec, out in zip(f.outputs[:-1], outs)})
        got.append(outs[-1][:, None] if f.leaf == 0 else outs[-1])
    np.testing.assert_allclose(np.concatenate(got, axis=1), ref, rtol=1e-4, atol=1e-4)
    (fused,) = manifest.files_for("fused")
    (out,) = _session(steps_bundle / fused.path).run(None, {"image": x})
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_subtree_files_have_no_shape_arithmetic_on_the_batch(steps_bundle):
    """The branch replication exports as one Gather with constant indices (fp16 conversion and TensorRT
    need no dynamic shape ops), and every file keeps a symbolic batch dimension."""
    manifest = read_manifest(steps_bundle)
    for f in manifest.files_for("subtrees") + manifest.files_for("fused"):
        proto = onnx.load(str(steps_bundle / f.path))
        ops = {n.op_type for n in proto.graph.node}
        assert not ops & {"Range", "Where", "Equal", "ConstantOfShape", "Div", "Cast", "Expand"}, (f.path, ops)
        if len(f.nodes) > 1 and f.leaf:
            assert "Gather" in ops
        assert all(v.type.tensor_type.shape.dim[0].dim_param for v in [*proto.graph.input, *proto.graph.output])


def test_verify_checks_every_stop_of_the_plans_of_several_leaves(steps_bundle, tiny_bundle):
    report = verify_bundle(steps_bundle, model=tiny_bundle.model, batch_sizes=[1, 3])
    report.raise_for_failures()
    checks = {(c.file, c.check.split(" (")[0]) for c in report.checks}
    for precision in ("fp32", "fp16"):
        assert (f"onnx/{precision}/subtrees", "each stop vs fused, n=1,2,4,8,16") in checks
        assert (f"onnx/{precision}/fused", "each stop vs fused, n=16") in checks
        assert (f"onnx/{precision}/subtrees", "anytime == segments plan, n=1..16") in checks
        assert (f"onnx/{precision}/fused/tree.onnx", "vs torch") in checks
    # a subtree file computing the wrong thing is caught: swap two of its output leaves' weights
    import copy

    other = copy.deepcopy(tiny_bundle.model)
    with torch.no_grad():
        head = other.head.fc[-1]
        rows = head.weight.shape[0] // 16
        head.weight[8 * rows : 9 * rows], head.weight[9 * rows : 10 * rows] = (
            head.weight[9 * rows : 10 * rows].clone(), head.weight[8 * rows : 9 * rows].clone())  # fmt: skip
    bad = verify_bundle(steps_bundle, model=other, batch_sizes=[1])
    assert any(c.file == "onnx/fp32/subtrees/unit04.onnx" for c in bad.failures)
    assert any(c.file == "onnx/fp32/subtrees" and "each stop" in c.check for c in bad.failures)


def test_a_given_rtol_bounds_each_element_as_numpy_and_polygraphy_do():
    """Issue 42: `verify --rtol` was relative to the output's largest |reference|, so a logit near 0 could be off by
    rtol times the largest logit; as numpy.allclose and Polygraphy: |got - ref| <= atol + rtol * |ref| per element."""
    from hne_edge.exporters import Tolerance

    ref = np.array([[100.0, 0.01]], np.float32)
    got = ref + np.array([[0.0, 0.005]], np.float32)  # 50% off on the small element
    per_element = Tolerance(atol=0.0, rtol=0.1, per_element=True)
    check = compare_outputs("f.onnx", "logits", got, ref, "fp32", per_element)
    assert not check.ok and check.bound == pytest.approx(0.001) and check.max_abs_diff == pytest.approx(0.005)
    assert "at index [0, 1]" in check.detail
    assert compare_outputs("f.onnx", "logits", got, ref, "fp32", Tolerance(atol=0.0, rtol=0.1)).ok  # by the maximum
    assert compare_outputs("f.onnx", "logits", ref * 1.05, ref, "fp32", per_element).ok  # 5% everywhere: within
    assert np.allclose(ref * 1.05, ref, rtol=0.1, atol=0) and not np.allclose(got, ref, rtol=0.1, atol=0)
