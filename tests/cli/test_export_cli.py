"""``hne-edge export / verify / inspect`` through a subprocess, as users run them."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from conftest import CPU_DEVICE, REPO, one_line_error, run_cli
from gpu_env import HAS_CUDA, HAS_TRT


def test_export_verify_inspect(tiny_bundle, tmp_path):
    out = tmp_path / "bundle"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--precision", "fp16",
                   "--precision", "fp32", "--plan", "segments", "--batch", "1:2:4", "--no-torch-weights")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "exported 34 file(s)" in proc.stdout  # 16 segments + the export-free first leaf, per precision
    assert "onnx/fp32/segments, onnx/fp16/segments, onnx/fp32/first, onnx/fp16/first" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input"]["batch"] == [1, 2, 4]
    assert manifest["model"]["class_names"][:2] == ["c0", "c1"]
    assert manifest["input"]["mean"] == [0.49, 0.48, 0.45]
    assert manifest["provenance"]["checkpoint_sha256"] and manifest["provenance"]["onnxruntime"]

    proc = run_cli("verify", str(out))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"onnx/fp16/segments +anytime == fp32 segments, n=1..16", proc.stdout) and "OK" in proc.stdout
    assert re.search(r"onnx/fp16/first/leaf00.onnx +== segments plan leaf 0 .* yes", proc.stdout)

    proc = run_cli("inspect", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "onnx/fp16/segments: 16 file(s)" in proc.stdout  # named as the folders on disk (issue 15)
    assert "leaf  0  onnx/fp16/segments/leaf00.onnx" in proc.stdout and "MACs" in proc.stdout
    assert "onnx/fp16/first: 1 file(s)" in proc.stdout
    assert re.search(r"mean \[[-0-9.e]+(, [-0-9.e]+)*\] std \[", proc.stdout)  # 4 significant digits, not 17
    assert not re.search(r"\d\.\d{8,}", proc.stdout.split("provenance")[0])


def test_existing_output_is_refused(tiny_bundle, tmp_path):
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(tiny_bundle.bundle_dir))
    assert proc.returncode == 2
    assert f"output directory {tiny_bundle.bundle_dir} already exists; pass --force" in proc.stderr


def _check_tensorrt_export(proc, out) -> None:
    """What `export --format tensorrt` promises: exit 0, the verified ONNX bundle, and one engine per ONNX file,
    built from it with the bundle's batch range, all listed in the manifest with their sha256."""
    from hne_edge.bundle import read_manifest

    assert proc.returncode == 0, proc.stderr
    manifest = read_manifest(out, verify_files=True)
    onnx = {f.path: f for f in manifest.files if f.format == "onnx"}
    engines = [f for f in manifest.files if f.format == "tensorrt"]
    assert len(onnx) == 17 and sorted(e.source for e in engines) == sorted(onnx)  # 16 segments + the first leaf
    for e in engines:
        src = onnx[e.source]
        assert (e.plan, e.precision, e.nodes, e.leaf) == (src.plan, src.precision, src.nodes, src.leaf)
        assert e.build["batch_profile"] == [1, 1, 4] and (out / e.path).stat().st_size == e.bytes > 0
    assert "tensorrt/fp32/segments" in proc.stdout and "(verified against PyTorch)" in proc.stdout


TENSORRT_EXPORT = ("--format", "tensorrt", "--plan", "segments", "--batch-range", "1:1:4", "--no-torch-weights")


@pytest.mark.tensorrt
@pytest.mark.skipif(not (HAS_TRT and HAS_CUDA), reason="needs TensorRT and a CUDA device")
def test_tensorrt_export_on_a_gpu(tiny_bundle, tmp_path):
    out = tmp_path / "b"
    _check_tensorrt_export(run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), *TENSORRT_EXPORT), out)


def _fake_tensorrt_env(tmp_path) -> dict:
    """The environment of a subprocess in which TensorRT's API is faked (tensorrt_fakes.FakeTensorRT)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from tensorrt_fakes import FakeTensorRT\n"
        "import hne_edge.exporters.tensorrt as trt\n"
        "fake = FakeTensorRT('10.3.0')\n"
        "trt.load_tensorrt = lambda exporting=False: fake\n"
        "trt.device_info = lambda: ('Orin (fake)', '8.7')\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_tensorrt_export_cli_with_a_fake_tensorrt(tiny_bundle, tmp_path):
    """The same command and checks with TensorRT's API faked (tensorrt_fakes.FakeTensorRT), so the CLI's
    success path is checked on every machine, not only where TensorRT and a GPU are (never here)."""
    out = tmp_path / "b"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), *TENSORRT_EXPORT,
                   env=_fake_tensorrt_env(tmp_path))
    _check_tensorrt_export(proc, out)


def test_engines_added_to_a_bundle_follow_its_precisions_and_batch_range(tiny_bundle, tmp_path):
    """docs/gpu.md's flow: export on the workstation, then `export BUNDLE --format tensorrt` on the device. The
    engines are built for every precision the bundle has ONNX for and for its batch range (the runtime accepts what
    the manifest says), not fp32 and 1:1:16 whatever it holds; another --batch-range is refused."""
    from hne_edge.bundle import read_manifest

    env = _fake_tensorrt_env(tmp_path)
    out = tmp_path / "b16"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--precision", "fp16",
                   "--plan", "segments", "--batch-range", "1:2:8", "--no-torch-weights", "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export", str(out), "--format", "tensorrt", "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr
    engines = [f for f in read_manifest(out).files if f.format == "tensorrt"]
    assert len(engines) == 17 and {e.precision for e in engines} == {"fp16"}
    assert all(e.build["batch_profile"] == [1, 2, 8] for e in engines)
    before = (out / "manifest.json").read_bytes()
    proc = run_cli("export", str(out), "--format", "tensorrt", "--batch-range", "1:1:16", env=env)
    one_line_error(proc, "--batch-range 1:1:16", "1:2:8")
    assert (out / "manifest.json").read_bytes() == before


def test_options_of_a_checkpoint_export_are_refused_with_a_bundle_source(tiny_bundle, tmp_path):
    """`export BUNDLE --format tensorrt` adds engines to BUNDLE in place: --out NEW (and --force, --no-verify, ...)
    would not write NEW, so they are refused, named, before anything is built; the bundle is left as it was."""
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    before = (bundle / "manifest.json").read_bytes()
    proc = run_cli("export", str(bundle), "--format", "tensorrt", "--plan", "segments", "--out", str(tmp_path / "new"),
                   "--force", "--no-verify", env=_fake_tensorrt_env(tmp_path))  # fmt: skip
    line = one_line_error(proc, "--out, --force, --no-verify", "bundle")
    assert "--plan" not in line and "--format" not in line
    assert not (tmp_path / "new").exists() and (bundle / "manifest.json").read_bytes() == before
    assert not (bundle / "tensorrt").exists()


@pytest.mark.skipif(HAS_TRT and HAS_CUDA, reason="TensorRT and a CUDA device are here: see test_tensorrt_export_on_a_gpu")
def test_tensorrt_without_tensorrt(tiny_bundle, tmp_path):
    """Without TensorRT (or without a GPU) the command stops before any work: one line, exit 2, nothing written."""
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--format", "tensorrt", "--out", str(tmp_path / "b"))
    assert proc.returncode == 2
    assert "Error: " in proc.stderr and any(why in proc.stderr for why in (
        "pip install 'hne_edge-0.1.0-py3-none-any.whl[tensorrt]'", "no CUDA device", "this machine has no NVIDIA GPU"))
    assert not (tmp_path / "b").exists()


def test_verify_with_checkpoint_prints_per_file_table(tiny_bundle):
    proc = run_cli("verify", str(tiny_bundle.bundle_dir), "--checkpoint", str(tiny_bundle.checkpoint_path),
                   "--batch-sizes", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["file", "check", "max", "abs", "diff", "bound", "ok"]
    assert any(l.startswith("onnx/fp32/nodes/b4.15.onnx") and "vs torch (logits)" in l and l.endswith("yes") for l in lines)
    assert any(l.startswith("onnx/fp32/segments ") and "anytime vs fused, n=1..16" in l for l in lines)
    assert any(l.startswith("torch/model.pt") for l in lines)
    assert lines[-1].endswith("checks passed: OK")


def test_verify_tampered_bundle_fails(tiny_bundle, tmp_path):
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "bundle")
    leaf = bundle / "onnx" / "fp32" / "segments" / "leaf02.onnx"
    data = bytearray(leaf.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the sha256 can tell
    leaf.write_bytes(bytes(data))
    proc = run_cli("verify", str(bundle))
    assert proc.returncode == 2
    assert "onnx/fp32/segments/leaf02.onnx" in proc.stderr and "sha256" in proc.stderr


def _progress_lines(stderr: str, desc: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{desc}: ")]


def test_without_a_terminal_export_eval_and_verify_print_progress_lines(tiny_bundle, tmp_path):
    """Reproduces issue 20 items 4 and 7: export printed nothing for ~80 s without a terminal, and no total or ETA.

    A pipe is not a terminal: each command prints plain lines (count of a total, rate, elapsed, ETA while work
    is left) at its first step, every 10 s and at its end, and a heartbeat while one step runs long."""
    out = tmp_path / "bundle"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--plan", "segments", check=True)
    export = _progress_lines(proc.stderr, "export")
    # the first line once the checkpoint is read and --out is checked (an error there is the only line)
    assert export[0].startswith("export: 0/18 files (0%), elapsed ") and "- slicing the tree" in export[0], export
    assert export[-1].startswith("export: 18/18 files (100%)") and all("/18 files (" in line for line in export)
    assert all(re.search(r"elapsed [0-9.]+ (ms|s|min|h)", line) for line in export)
    assert all("ETA " in line for line in export[1:-1] if not line.startswith("export: 0/")), export  # rate, time left
    verify = _progress_lines(proc.stderr, "verify")  # export verifies before it publishes: the same reporter
    assert verify and verify[-1].startswith("verify: 33/33 steps (100%)"), proc.stderr
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr  # lines, not a bar redrawn in place
    quiet = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(tmp_path / "q"), "--plan", "segments",
                    "--quiet", check=True)
    assert quiet.stderr == ""

    proc = run_cli("verify", str(out), check=True)
    assert _progress_lines(proc.stderr, "verify")[-1].startswith("verify: 16/16 steps (100%)"), proc.stderr
    proc = run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", str(_frames(tmp_path)), "--out",
                   str(tmp_path / "ev"), "--no-plots", *CPU_DEVICE, check=True)  # fmt: skip
    assert _progress_lines(proc.stderr, "eval")[-1].startswith("eval: 40/40 images (100%)"), proc.stderr


def _frames(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "frames.npz"
    np.savez(path, x=rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 40),
             classes=np.array([f"c{i}" for i in range(10)]))
    return path


def test_an_fp16_only_bundle_exports_and_verifies(tiny_bundle, tmp_path):
    """Found while measuring the exporters (issue 20 item 11): the bundle's input is float16 when fp16 is its only
    precision, and the verification fed it float32 images, so `export --precision fp16` always failed."""
    out = tmp_path / "b16"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--precision", "fp16", "--plan",
                   "segments", "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "onnx/fp16/segments" in proc.stdout and "(verified against PyTorch)" in proc.stdout
    assert json.loads((out / "manifest.json").read_text())["input"]["dtype"] == "float16"
    assert run_cli("verify", str(out), "--quiet").returncode == 0


def test_plan_fused_exports_without_the_first_leaf_it_cannot_host(tiny_bundle, tmp_path):
    """Issue 42 item 9: `export --plan fused` wrote every file, then failed ("onnx/fp32/first is an add-on to a full
    plan") unless --no-first-leaf was given. The first-leaf file stands in for a plan's first call, and the fused
    plan's first call is the whole tree: it is written only beside a plan that runs leaf 0 first."""
    out = tmp_path / "fused"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--plan", "fused", "--quiet",
                   "--no-torch-weights", check=True)  # fmt: skip
    assert "exported 1 file(s)" in proc.stdout and "onnx/fp32/fused (verified" in proc.stdout, proc.stdout
    assert not (out / "onnx" / "fp32" / "first").exists()
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(tmp_path / "both"), "--plan",
                   "subtrees,fused", "--no-verify", "--quiet", "--no-torch-weights", check=True)  # fmt: skip
    assert "onnx/fp32/subtrees, onnx/fp32/fused, onnx/fp32/first" in proc.stdout  # beside a host: written as before


def test_dynamo_exporter_refuses_what_it_cannot_write_before_any_work(tiny_bundle, tmp_path):
    """Issue 42 item 11: `--exporter dynamo` at the default opset 17 failed after the whole export (105 s, 16 torch
    warnings under --quiet and a logged traceback), then said to pass --opset 18. Without --opset it exports at
    the dynamo exporter's opset; an opset or precision it cannot write is refused before anything is exported."""
    ckpt = str(tiny_bundle.checkpoint_path)
    for extra, fragments in ((("--opset", "17"), ("--opset: received 17", "--exporter dynamo", "--opset 18")),
                             (("--precision", "fp16"), ("dynamo exporter cannot write fp16", "--exporter torchscript"))):
        out = tmp_path / f"refused{extra[1]}"
        one_line_error(run_cli("export", ckpt, "--out", str(out), "--exporter", "dynamo", *extra), *fragments)
        assert not out.exists()
    out = tmp_path / "dynamo"
    proc = run_cli("export", ckpt, "--out", str(out), "--exporter", "dynamo", "--plan", "fused", "--no-torch-weights",
                   "--quiet", check=True)  # fmt: skip
    assert proc.stderr == "", proc.stderr  # no torch warnings, no logged traceback
    manifest = json.loads((out / "manifest.json").read_text())
    assert {f["opset"] for f in manifest["files"]} == {18}


@pytest.mark.parametrize("edit", ["normalisation", "class names"])
def test_verify_against_a_checkpoint_checks_its_preprocessing_and_class_names(tiny_bundle, tmp_path, edit):
    """The manifest is not hashed: edited to another normalisation (its images scored 6 of 6 wrong against the
    model on rightly normalised ones) or with its class names reversed, it passed `verify --checkpoint` 65 of 65
    (a runtime review). What the checkpoint records of its inputs and outputs is compared too."""
    from conftest import edit_manifest

    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "b")

    def tamper(d):
        if edit == "normalisation":
            d["input"]["mean"] = d["input"]["std"] = [0.5, 0.5, 0.5]
        else:
            d["model"]["class_names"] = d["model"]["class_names"][::-1]

    proc = run_cli("verify", str(tiny_bundle.bundle_dir), "--checkpoint", str(tiny_bundle.checkpoint_path))
    assert proc.returncode == 0, proc.stderr
    edit_manifest(bundle, tamper)
    proc = run_cli("verify", str(bundle), "--checkpoint", str(tiny_bundle.checkpoint_path))
    assert proc.returncode == 2 and "FAILED" in proc.stdout, proc.stdout[-2000:]
    check = "input mean/std == checkpoint's" if edit == "normalisation" else "class names == checkpoint's"
    row = next(line for line in proc.stdout.splitlines() if line.startswith("manifest.json") and check in line)
    assert row.rstrip().endswith("NO"), row
    assert f"Error: bundle verification failed: manifest.json ({check})" in proc.stderr, proc.stderr
