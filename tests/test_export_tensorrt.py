"""TensorRT exporter: naming, the compatibility rule the runtime shares, manifest entries, and the
clear failure without TensorRT. Building real engines needs TensorRT and a GPU (marked, skipped here)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from hne_edge.bundle import read_manifest
from hne_edge.errors import BackendUnavailable, BundleError
from hne_edge.exporters.tensorrt import (
    add_files,
    build_engines,
    engine_compatibility,
    engine_entry,
    engine_path,
    normalize_compute_capability,
)

BUILD = {
    "tensorrt_version": "10.3.0",
    "gpu": "Orin",
    "compute_capability": "8.7",
    "flags": ["STRONGLY_TYPED"],
    "batch_profile": [1, 1, 8],
    "hardware_compatibility": "none",
}


def test_engine_path_naming():
    assert engine_path("10.3.0", "8.7", "fp16", "segments", leaf=0) == "tensorrt/trt10.3_sm87/fp16/segments/leaf00.plan"
    assert engine_path("10.3.0.26", (8, 7), "fp32", "nodes", node="b2.1") == "tensorrt/trt10.3_sm87/fp32/nodes/b2.1.plan"
    assert engine_path("11.0.1", "sm_120", "fp16", "segments", leaf=7) == "tensorrt/trt11.0_sm120/fp16/segments/leaf07.plan"
    with pytest.raises(ValueError, match="needs leaf="):
        engine_path("10.3", "8.7", "fp16", "segments")


def test_normalize_compute_capability():
    assert [normalize_compute_capability(v) for v in ("8.7", "sm_87", "sm87", 87, (8, 7), "120")] == [
        "8.7", "8.7", "8.7", "8.7", "8.7", "12.0",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="received 'orin'"):
        normalize_compute_capability("orin")


def test_engine_compatibility():
    assert engine_compatibility(BUILD, "10.3.0", "8.7") is None
    assert engine_compatibility(BUILD, "10.3.0.30", (8, 7)) is None  # build number is not part of the rule
    assert "exact version" in engine_compatibility(BUILD, "10.4.0", "8.7")
    assert "this GPU is 8.6 (sm_86)" in engine_compatibility(BUILD, "10.3.0", "8.6")
    vc = {**BUILD, "flags": ["STRONGLY_TYPED", "VERSION_COMPATIBLE"]}
    assert engine_compatibility(vc, "10.7.0", "8.7") is None
    assert "needs TensorRT 10.x >= 10.3.0" in engine_compatibility(vc, "10.2.0", "8.7")
    assert "needs TensorRT 10.x" in engine_compatibility(vc, "11.0.0", "8.7")
    amp = {**BUILD, "compute_capability": "8.6", "hardware_compatibility": "ampere_plus"}
    assert engine_compatibility(amp, "10.3.0", "8.9") is None
    assert "Ampere and newer" in engine_compatibility(amp, "10.3.0", "7.5")
    assert "malformed" in engine_compatibility({"gpu": "x"}, "10.3.0", "8.7")


def test_build_without_tensorrt_is_a_clear_error(tiny_bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError, whatever is installed
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not available: install it .*pip install 'hne-edge\[tensorrt\]'"):
        build_engines(tiny_bundle.bundle_dir)


def test_engine_entries_make_a_valid_manifest(tiny_bundle, tmp_path):
    """What build_engines writes into the manifest is accepted by the reader (fake plan bytes stand in for engines)."""
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    manifest = read_manifest(bundle)
    entries = []
    for source in manifest.files_for("segments", "fp32"):
        rel = engine_path("10.3.0", "8.7", "fp32", "segments", leaf=source.leaf)
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        (bundle / rel).write_bytes(b"engine for " + source.path.encode())
        entries.append(engine_entry(bundle, source, rel, BUILD))
    updated = add_files(bundle, entries)
    engines = updated.files_for("segments", "fp32", "tensorrt")
    assert len(engines) == 16 and engines[0].source == "onnx/fp32/segments/leaf00.onnx"
    assert engines[0].build["compute_capability"] == "8.7"
    assert engines[0].outputs == manifest.files_for("segments", "fp32")[0].outputs
    assert engine_compatibility(engines[0].build, "10.3.0", "8.7") is None
    # an incomplete engine set is refused by the reader
    data = json.loads((bundle / "manifest.json").read_text())
    data["files"] = [f for f in data["files"] if not f["path"].endswith("leaf03.plan")]
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"tensorrt/segments/fp32 must have exactly one file per leaf"):
        read_manifest(bundle)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_build_real_engines(tiny_bundle, tmp_path):
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed")
    from hne_edge.exporters.tensorrt import device_info

    try:
        device_info()
    except BackendUnavailable as exc:
        pytest.skip(f"no CUDA device: {exc}")
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    entries = build_engines(bundle, plans=("segments",), precisions=("fp32",), batch=(1, 2, 8))
    assert len(entries) == 16 and all(e.format == "tensorrt" for e in entries)
    assert entries[0].build["tensorrt_version"] == trt.__version__
    assert (bundle / entries[0].path).stat().st_size > 0
