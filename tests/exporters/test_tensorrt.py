"""TensorRT exporter: naming, the compatibility rule the runtime shares, manifest entries, and the
clear failure without TensorRT. Building real engines needs TensorRT and a GPU (marked, skipped here)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from hne_edge.bundle import engine_dir, file_path, read_manifest, update_manifest
from hne_edge.errors import BackendUnavailable, BundleError, ExportError
from hne_edge.exporters.tensorrt import build_engines, engine_entry
from hne_edge.tensorrt_compat import device_support, engine_compatibility, normalize_compute_capability
from tensorrt_fakes import FakeTensorRT as _FakeTRT

BUILD = {
    "tensorrt_version": "10.3.0",
    "gpu": "Orin",
    "compute_capability": "8.7",
    "flags": ["STRONGLY_TYPED"],
    "batch_profile": [1, 1, 8],
    "hardware_compatibility": "none",
}


def engine_path(version, cc, precision, plan, **kw):
    return file_path("tensorrt", precision, plan, engine_dir=engine_dir(version, cc), **kw)


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
    assert engine_compatibility(BUILD, "10.3.0.30", (8, 7)) is None  # a build number only one version states
    assert "exact version" in engine_compatibility(BUILD, "10.4.0", "8.7")
    # NVIDIA's support policies: "version numbers must match across major, minor, patch, and build"
    built = {**BUILD, "tensorrt_version": "10.3.0.26"}
    assert engine_compatibility(built, "10.3.0.26", "8.7") is None
    assert "built with TensorRT 10.3.0.26; this device has TensorRT 10.3.0.30 (engines need the exact version)" in \
        engine_compatibility(built, "10.3.0.30", "8.7")  # fmt: skip
    assert "this GPU is 8.6 (sm_86)" in engine_compatibility(BUILD, "10.3.0", "8.6")
    vc = {**BUILD, "flags": ["STRONGLY_TYPED", "VERSION_COMPATIBLE"]}
    assert engine_compatibility(vc, "10.7.0", "8.7") is None
    assert engine_compatibility(vc, "11.0.0", "8.7") is None  # the support matrix: 10's run on an 11 runtime
    assert "needs TensorRT 10.x >= 10.3.0 or 11.x; this device has 10.2.0" in engine_compatibility(vc, "10.2.0", "8.7")
    assert "needs TensorRT 10.x >= 10.3.0 or 11.x; this device has 12.0.0" in engine_compatibility(vc, "12.0.0", "8.7")
    vc11 = {**vc, "tensorrt_version": "11.1.0"}  # no later major named for 11: 11.x only, and never older
    assert "needs TensorRT 11.x >= 11.1.0; this device has 11.0.0" in engine_compatibility(vc11, "11.0.0", "8.7")
    assert engine_compatibility({**vc, "tensorrt_version": "10.3.0.26"}, "10.3.0.30", "8.7") is None
    amp = {**BUILD, "compute_capability": "8.6", "hardware_compatibility": "ampere_plus"}
    assert engine_compatibility(amp, "10.3.0", "8.9") is None
    assert "Ampere and newer" in engine_compatibility(amp, "10.3.0", "7.5")
    assert "malformed" in engine_compatibility({"gpu": "x"}, "10.3.0", "8.7")


def test_device_support_follows_nvidias_support_matrix():
    """Orin (8.7), Hopper (9.0) on 10.x/11.x; Volta (7.0) until 10.4; Blackwell (10.0, 12.0) from 10.8; TensorRT 8 refused."""
    for version, cc in [("10.3.0", "8.7"), ("10.4.0", "7.0"), ("10.5.0", "7.5"), ("11.1.0", "9.0"), ("10.8.0", "12.0"),
                        ("11.0.0.1", (10, 0)), ("10.8.0", "13.0")]:  # an architecture no rule names: assumed supported
        assert device_support(version, cc) is None, (version, cc)
    assert "supports compute capability 7.5 and newer; this GPU is 7.0 (sm_70)" in device_support("10.5.0", "7.0")
    assert "supports compute capability 7.0 and newer; this GPU is 6.1 (sm_61)" in device_support("10.0.1", "6.1")
    assert "this GPU (12.0, sm_120) needs TensorRT 10.8 or newer; TensorRT 10.7.0 does not" in device_support("10.7.0", "12.0")
    assert "older than hne-edge supports (>= 10.0)" in device_support("8.6.1", "8.7")


def test_build_without_tensorrt_is_a_clear_error(tiny_bundle, monkeypatch, tmp_path):
    import hne_edge.runtime.backends.cuda as cuda

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError, whatever is installed
    monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path),))  # a machine with an NVIDIA driver
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not available: install it .*pip install 'hne_edge-0\.1\.0-py3-none-any\.whl\[tensorrt\]'"):
        build_engines(tiny_bundle.bundle_dir)
    if sys.platform.startswith("linux"):  # issue 42: without a driver, installing TensorRT cannot help
        monkeypatch.setattr(cuda, "_NVIDIA_DEVICE_NODES", (str(tmp_path / "nvidia0"),))
        with pytest.raises(BackendUnavailable, match=r"^TensorRT runs on an NVIDIA GPU, and this machine has no NVIDIA GPU"
                                                     r" .*export the ONNX bundle here \(format='onnx'\)") as caught:  # fmt: skip
            build_engines(tiny_bundle.bundle_dir)
        assert "install" not in str(caught.value)


def test_engine_entries_make_a_valid_manifest(tiny_bundle, tmp_path):
    """What build_engines writes into the manifest is accepted by the reader (fake plan bytes stand in for engines)."""
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    manifest = read_manifest(bundle)
    entries = []
    for source in manifest.files_for("segments", "fp32"):
        rel = engine_path("10.3.0", "8.7", "fp32", "segments", leaf=source.leaf)
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        data = b"engine for " + source.path.encode()
        (bundle / rel).write_bytes(data)
        entries.append(engine_entry(source, rel, BUILD, data))
    updated = update_manifest(bundle, entries)
    assert read_manifest(bundle, verify_files=True) == updated  # the hashes of the bytes written are the files' 
    engines = updated.files_for("segments", "fp32", "tensorrt")
    assert len(engines) == 16 and engines[0].source == "onnx/fp32/segments/leaf00.onnx"
    assert engines[0].build["compute_capability"] == "8.7"
    assert engines[0].outputs == manifest.files_for("segments", "fp32")[0].outputs
    assert engine_compatibility(engines[0].build, "10.3.0", "8.7") is None
    # an incomplete engine set is refused by the reader
    data = json.loads((bundle / "manifest.json").read_text())
    data["files"] = [f for f in data["files"] if not f["path"].endswith("leaf03.plan")]
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"tensorrt/fp32/segments must have exactly one file per leaf"):
        read_manifest(bundle)


def test_nvidia_smi_names_a_gpu_only_where_its_numbering_is_cudas(monkeypatch):
    """nvidia-smi numbers GPUs in PCI bus order and ignores CUDA_VISIBLE_DEVICES, CUDA fastest first: on a machine
    with two GPUs, device 1 read from nvidia-smi's second row could be another GPU, whose compute capability would
    then be written into the engines' build info. Without cuda-python or torch seeing the device, its row is taken
    only where the numberings agree."""
    import types

    import hne_edge.tensorrt_compat as compat

    def no_cudart():
        raise ImportError("no cuda-python")

    rows = ["NVIDIA A100-SXM4-40GB, 8.0", "NVIDIA H100 80GB HBM3, 9.0"]
    monkeypatch.setattr(compat, "import_cudart", no_cudart)
    monkeypatch.setitem(sys.modules, "torch", None)  # torch not installed
    monkeypatch.setattr(compat.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout="\n".join(rows) + "\n"))
    for name in ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(BackendUnavailable, match="no CUDA device 1 was found"):
        compat.device_info(1)  # fastest first: CUDA's device 1 may be the A100
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert compat.device_info(1) == ("NVIDIA H100 80GB HBM3", "9.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA's device 0 is nvidia-smi's 1
    with pytest.raises(BackendUnavailable):
        compat.device_info(0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    rows[1:] = []  # one GPU: both number it 0
    assert compat.device_info(0) == ("NVIDIA A100-SXM4-40GB", "8.0")


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


@pytest.mark.parametrize("version, net_flags", [("10.3.0", 2), ("11.1.0", 0)])
def test_build_engines_against_the_documented_api(tiny_bundle, tmp_path, monkeypatch, version, net_flags):
    from hne_edge.exporters import tensorrt as trt_mod

    fake = _FakeTRT(version)
    monkeypatch.setattr(trt_mod, "load_tensorrt", lambda exporting=False: fake)
    monkeypatch.setattr(trt_mod, "device_info", lambda: ("Orin (fake)", "8.7"))
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    entries = build_engines(bundle, plans=("segments",), precisions=("fp32",), batch=(1, 2, 8))
    assert len(entries) == 16 + 1  # and the export-free first leaf, which goes with any plan
    assert fake.calls["networks"] == [net_flags] * 17  # strongly typed: flag on 10, implicit (flag gone) on 11
    assert fake.calls["caches_created"] == 1 and fake.calls["set_cache"] == 17  # one cache for the whole bundle
    assert fake.calls["cleared"] == [fake.BuilderFlag.TF32] * 17
    assert fake.calls["profiles"][0] == {"image": ((1, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16))}
    assert fake.calls["profiles"][1] == {"act_b3.0": ((1, 32, 8, 8), (2, 32, 8, 8), (8, 32, 8, 8))}
    major_minor = ".".join(version.split(".")[:2])
    cache = bundle / f"tensorrt/trt{major_minor}_sm87/timing.cache"
    assert cache.read_bytes() == b"timing-cache"
    manifest = read_manifest(bundle)
    engines = manifest.files_for("segments", "fp32", "tensorrt")
    assert engines[0].path == f"tensorrt/trt{major_minor}_sm87/fp32/segments/leaf00.plan"
    assert engines[0].source == "onnx/fp32/segments/leaf00.onnx"
    assert engines[0].build == {
        "tensorrt_version": version, "gpu": "Orin (fake)", "compute_capability": "8.7",
        "flags": ["STRONGLY_TYPED", "NO_TF32"], "batch_profile": [1, 2, 8], "hardware_compatibility": "none",
        "builder_optimization_level": None, "workspace_mb": None,
    }  # fmt: skip
    assert engine_compatibility(engines[0].build, version, "8.7") is None
    (first,) = manifest.files_for("first", "fp32", "tensorrt")
    assert first.path == f"tensorrt/trt{major_minor}_sm87/fp32/first/leaf00.plan" and first.outputs[-1].name == "logits"
    # asking for a precision the bundle has no ONNX for is a clear error
    with pytest.raises(ExportError, match=r"no ONNX source for TensorRT engine\(s\) \['segments/fp16'\]"):
        build_engines(bundle, plans=("segments",), precisions=("fp16",))


def test_a_timing_cache_tensorrt_refuses_is_replaced_not_ignored(tiny_bundle, tmp_path, monkeypatch, caplog):
    """A folder's timing cache serves one exact TensorRT version and device; TensorRT reports another's as
    set_timing_cache returning False (its header). The build then starts a new cache (and says so), whose timings
    replace the old file, rather than building with no cache while the stale one stays."""
    from hne_edge.exporters import tensorrt as trt_mod

    fake = _FakeTRT("10.3.0")
    monkeypatch.setattr(trt_mod, "load_tensorrt", lambda exporting=False: fake)
    monkeypatch.setattr(trt_mod, "device_info", lambda: ("Orin (fake)", "8.7"))
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    cache = bundle / "tensorrt/trt10.3_sm87/timing.cache"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(b"a cache of TensorRT 10.3.1 on another Orin")
    fake.cache_accepted = False
    with caplog.at_level("WARNING", logger="hne_edge.export"):
        build_engines(bundle, plans=("segments",), precisions=("fp32",), batch=(1, 2, 8))
    assert "TensorRT did not take" in caplog.text and "timing.cache" in caplog.text
    assert fake.calls["caches_created"] == 2 and fake.calls["set_cache"] == 18  # refused once, then the new one
    assert cache.read_bytes() == b"timing-cache"  # the new cache's timings


def test_export_with_engines_hashes_each_file_once_per_step_that_needs_it(tiny_bundle, tmp_path, monkeypatch):
    """`hne-edge export --format tensorrt`'s flow: ONNX export, its verification, engines, manifest update.

    Each ONNX file is hashed 3 times (written, the verification gate, read as an engine source) and each
    engine once (from the bytes written); the manifest updates hash nothing (was 5 and 2 per file).
    """
    import hashlib

    import hne_edge.bundle.reading as bundle_mod
    from hne_edge.exporters import export_onnx
    from hne_edge.exporters import tensorrt as trt_mod

    fake = _FakeTRT("10.3.0")
    monkeypatch.setattr(trt_mod, "load_tensorrt", lambda exporting=False: fake)
    monkeypatch.setattr(trt_mod, "device_info", lambda: ("Orin (fake)", "8.7"))
    counted = []

    class CountingHashlib:
        @staticmethod
        def sha256(data=b""):
            counted.append(1)
            return hashlib.sha256(data)

    monkeypatch.setattr(bundle_mod, "hashlib", CountingHashlib)  # every bundle file is hashed through hne_edge.bundle.reading
    out = export_onnx(tiny_bundle.model, tmp_path / "out", class_names=[f"c{i}" for i in range(10)],
                      normalization={"mean": [0.5] * 3, "std": [0.25] * 3}, plan="segments", batch=(1, 1, 4),
                      torch_weights=False, post_export=lambda tmp: trt_mod.build_engines(tmp))  # fmt: skip
    monkeypatch.undo()
    manifest = read_manifest(out)  # every sha256 in the manifest is the file's
    onnx = [f for f in manifest.files if f.format == "onnx"]
    engines = [f for f in manifest.files if f.format == "tensorrt"]
    assert len(onnx) == len(engines) == 17  # 16 segments and the first leaf
    # + 1: manifest.json itself, hashed by the AnytimeRunner the verification drives (profiles are keyed by it)
    assert len(counted) == 3 * len(onnx) + len(engines) + 1


@pytest.mark.parametrize("interrupt", [False, True])
def test_an_engine_build_failing_part_way_leaves_the_bundle_as_it_was(tiny_bundle, tmp_path, monkeypatch, interrupt):
    """A build that fails (or is interrupted) part-way leaves no engine, folder or listing behind: the bundle still
    verifies and export --force still accepts it as a bundle; engines an earlier build listed stay as they were."""
    from hne_edge.bundle import why_not_replaceable
    from hne_edge.exporters import tensorrt as trt_mod

    fake = _FakeTRT("10.3.0")
    monkeypatch.setattr(trt_mod, "load_tensorrt", lambda exporting=False: fake)
    monkeypatch.setattr(trt_mod, "device_info", lambda: ("Orin (fake)", "8.7"))
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    build_engines(bundle, plans=("nodes",), precisions=("fp32",), batch=(1, 2, 8))  # an earlier build, listed
    fail_at = len(read_manifest(bundle).files_for("nodes", "fp32", "onnx")) + 3  # rebuilt nodes, then 3 segments
    before = sorted((p.relative_to(bundle), p.read_bytes() if p.is_file() else None) for p in bundle.rglob("*"))
    real_build = fake.Builder.build_serialized_network
    built = []

    def build(network, config):
        built.append(1)
        if len(built) == fail_at:
            if interrupt:
                raise KeyboardInterrupt
            return None  # TensorRT's answer to a failed build
        return real_build(None, network, config) + b" rebuilt"  # a rebuild's engines differ from the listed ones

    monkeypatch.setattr(fake.Builder, "build_serialized_network", lambda self, n, c: build(n, c))
    with pytest.raises(KeyboardInterrupt if interrupt else ExportError):
        build_engines(bundle, plans=("nodes", "segments"), precisions=("fp32",), batch=(1, 2, 8))
    assert len(built) == fail_at
    after = sorted((p.relative_to(bundle), p.read_bytes() if p.is_file() else None) for p in bundle.rglob("*"))
    assert after == before
    read_manifest(bundle, verify_files=True)
    assert why_not_replaceable(bundle) is None


@pytest.mark.parametrize("rebuild", [False, True])
def test_an_engine_build_whose_manifest_cannot_be_written_leaves_the_bundle_as_it_was(tiny_bundle, tmp_path,
                                                                                       monkeypatch, rebuild):  # fmt: skip
    """The last step fails (a full disk when the manifest is written): the engines written over the listed ones
    (a rebuild) or beside them (a first build) are taken back, so the bundle verifies and export --force accepts it.
    Before: "files[49].bytes is 35257 bytes on disk; the manifest says 35244", or 17 unlisted engines."""
    import errno
    import os

    from hne_edge.bundle import why_not_replaceable
    from hne_edge.exporters import tensorrt as trt_mod

    fake = _FakeTRT("10.3.0")
    monkeypatch.setattr(trt_mod, "load_tensorrt", lambda exporting=False: fake)
    monkeypatch.setattr(trt_mod, "device_info", lambda: ("Orin (fake)", "8.7"))
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    if rebuild:
        build_engines(bundle, plans=("segments",), precisions=("fp32",), batch=(1, 2, 8))
        real_build = fake.Builder.build_serialized_network
        monkeypatch.setattr(fake.Builder, "build_serialized_network", lambda self, n, c: real_build(self, n, c) + b"!")
    before = sorted((p.relative_to(bundle), p.read_bytes() if p.is_file() else None) for p in bundle.rglob("*"))
    real_fsync = os.fsync

    def fsync(fd):  # the disk fills up as the manifest is written
        if ".manifest.json." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="No space left on device"):
        build_engines(bundle, plans=("segments",), precisions=("fp32",), batch=(1, 2, 8))
    monkeypatch.setattr(os, "fsync", real_fsync)
    after = sorted((p.relative_to(bundle), p.read_bytes() if p.is_file() else None) for p in bundle.rglob("*"))
    assert after == before
    read_manifest(bundle, verify_files=True)
    assert why_not_replaceable(bundle) is None
