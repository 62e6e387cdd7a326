"""Issue 13: data loss, verified bytes, bounded inputs, one-line errors (each defect reproduced first)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import dead_writers_scratch, edit_manifest, one_line_error, run_cli

FAST_EXPORT = ("--no-verify", "--plan", "segments", "--no-first-leaf", "--no-torch-weights")


# -- D1: export --force replaces only a bundle -----------------------------------------------------


def test_force_refuses_the_current_directory_holding_the_checkpoint(tiny_bundle, tmp_path):
    p = tmp_path / "p"
    p.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, p / "checkpoint.pt")
    (p / "notes.txt").write_text("keep me")
    proc = run_cli("export", "checkpoint.pt", "--out", ".", "--force", *FAST_EXPORT, cwd=p,
                   env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    assert "refusing to replace" in one_line_error(proc)
    assert sorted(x.name for x in p.iterdir()) == ["checkpoint.pt", "notes.txt"]


def test_force_refuses_a_run_folder(tiny_bundle, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, run / "checkpoint.pt")
    (run / "train_log.json").write_text("{}")
    (run / "config.yaml").write_text("epochs: 1\n")
    proc = run_cli("export", str(run / "checkpoint.pt"), "--out", str(run), "--force", *FAST_EXPORT)
    assert "source" in one_line_error(proc)
    assert sorted(x.name for x in run.iterdir()) == ["checkpoint.pt", "config.yaml", "train_log.json"]


def test_force_refuses_a_bundle_holding_the_source(tiny_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    shutil.copy(tiny_bundle.checkpoint_path, bundle / "ckpt.pt")
    proc = run_cli("export", str(bundle / "ckpt.pt"), "--out", str(bundle), "--force", *FAST_EXPORT)
    assert "source" in one_line_error(proc)
    assert (bundle / "ckpt.pt").is_file() and (bundle / "manifest.json").is_file()


def test_force_replaces_a_bundle_cleans_leftovers_and_uses_umask_modes(tiny_bundle, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_bundle.bundle_dir, out)
    (out / "profiles").mkdir()
    (out / "profiles" / "cpu-onnxruntime-nodes-fp32.json").write_text('{"format": "hne-edge-profile"}')  # a runner's
    stale = dead_writers_scratch(out, "partial")  # a killed export's leftover
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force", *FAST_EXPORT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "manifest.json").is_file() and not (out / "profiles").exists()
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask


# -- D2: the bytes that were hashed are the bytes that run ------------------------------------------


def _flip_a_weight(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # the middle of the file is initializer data: still a loadable model
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backend, rel", [("onnxruntime", "onnx/fp32/first/leaf00.onnx"),
                                          ("onnxruntime", "onnx/fp32/segments/leaf00.onnx"),
                                          ("torch", "torch/model.pt")])  # fmt: skip
def test_a_file_swapped_after_the_manifest_check_is_refused(tiny_bundle, tmp_path, monkeypatch, backend, rel):
    from hne_edge.errors import BundleError
    from hne_edge.runtime import AnytimeRunner, runner as runner_module

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    real = runner_module.read_manifest_and_digest

    def read_then_swap(*args, **kwargs):
        read = real(bundle, verify_files=True)  # the check passes on the original file ...
        _flip_a_weight(bundle / rel)  # ... which an attacker swaps right after
        return read

    monkeypatch.setattr(runner_module, "read_manifest_and_digest", read_then_swap)
    with pytest.raises(BundleError, match=rf"bundle file {rel} \(sha256 at load\) does not match the manifest"):
        AnytimeRunner(bundle, backend=backend, load_profile=False, warmup=0)


def test_verify_false_loads_without_hashing(tiny_bundle, tmp_path):
    from hne_edge.runtime import AnytimeRunner

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    _flip_a_weight(bundle / "onnx/fp32/segments/leaf01.onnx")
    with AnytimeRunner(bundle, verify=False, load_profile=False, warmup=0) as runner:  # explicitly unchecked
        assert runner.run(np.zeros((1, 3, 16, 16), np.float32)).leaves == 16


# -- D9: ONNX external data -------------------------------------------------------------------------


def test_external_data_is_refused(tiny_bundle, tmp_path):
    import onnx

    from hne_edge.bundle import read_manifest, sha256_file, write_manifest
    from hne_edge.errors import BundleError
    from hne_edge.runtime import AnytimeRunner

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    rel = "onnx/fp32/segments/leaf00.onnx"
    proto = onnx.load(str(bundle / rel))
    onnx.save_model(proto, str(bundle / rel), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)  # fmt: skip
    manifest = read_manifest(bundle, verify_files=False)
    files = tuple(
        f if f.path != rel else type(f)(**{**f.__dict__, "sha256": sha256_file(bundle / rel), "bytes": (bundle / rel).stat().st_size})
        for f in manifest.files
    )
    write_manifest(bundle, type(manifest)(**{**manifest.__dict__, "files": files}))
    with pytest.raises(BundleError, match=r"leaf00.onnx: \d+ tensor\(s\) .* keep their values in external files"):
        AnytimeRunner(bundle, load_profile=False, warmup=0)


# -- D3 and D11-D12: bounded, strict manifests -------------------------------------------------------


def test_tree_size_is_bounded():
    from hne_edge.tree import MAX_LEAVES, TreeSpec

    with pytest.raises(ValueError, match=rf"more than {MAX_LEAVES} leaves"):
        TreeSpec((1,) + (2,) * 30)  # 2^30 leaves: must fail before building anything
    with pytest.raises(ValueError, match="blocks; expected at most 32"):
        TreeSpec((1,) * 10_000)
    with pytest.raises(ValueError) as info:
        TreeSpec(tuple(range(-5000, 0)))
    assert len(str(info.value)) < 600
    assert TreeSpec((1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2)).num_leaves == MAX_LEAVES  # the bound itself is accepted


def test_a_17_level_manifest_fails_in_one_short_line(bundle_copy):
    def edit(d):
        d["tree"]["branching"] = [1] + [2] * 16
        d["tree"]["leaf_order"] = [f"b16.{i}" for i in range(2**16)]

    edit_manifest(bundle_copy, edit)
    line = one_line_error(run_cli("inspect", str(bundle_copy)))
    assert "at most 1024" in line and len(line) < 600


def test_info_with_31_factors_is_refused():
    line = one_line_error(run_cli("info", "hne_tiny", "--tree", ",".join(["2"] * 31)))
    assert "at most 1024" in line


def test_eval_refuses_a_checkpoint_naming_a_huge_tree(tiny_bundle, tmp_path):
    import torch

    state = torch.load(tiny_bundle.checkpoint_path, weights_only=True)
    state["model_config"]["tree"] = {"branching": [1] + [2] * 30}
    state["tree"] = {"branching": [1] + [2] * 30}
    torch.save(state, tmp_path / "huge.pt")
    line = one_line_error(run_cli("eval", str(tmp_path / "huge.pt"), "--no-plots", "--quiet", timeout=120))
    assert "at most 1024" in line


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["tree"].__setitem__("leaf_order", 5), r"tree.leaf_order must be list; received 5"),
        (lambda d: d["tree"]["nodes"][0].__setitem__("children", None), r"parent/children/depth disagree"),
        (lambda d: d["input"].__setitem__("mean", [float("nan")] * 3), r"NaN is not a JSON number"),
        (lambda d: d["files"][0].__setitem__("macs", -1), r"files\[0\].macs must be an int in 0..2\*\*50; received -1"),
        (lambda d: d["files"][0].__setitem__("bytes", -5), r"files\[0\].bytes must be an int in 0..2\*\*50; received -5"),
        (lambda d: d["tree"]["nodes"][0].__setitem__("macs", -1), r"tree.nodes\[0\].macs must be an int in 0..2\*\*50; received -1"),
        (lambda d: d["model"].__setitem__("class_names", ["a", "b", "c", "d", "e"]),
         r"model.config.num_classes is 10; model.class_names has 5 classes; expected them to agree"),
        (lambda d: (d["model"].__setitem__("class_names", ["a", "b", "c", "d", "e"]),
                    d["model"]["config"].__setitem__("num_classes", 5)),  # agrees with itself, not with its files
         r"outputs logits of shape \['batch', 10\]; model.class_names has 5 classes"),
        (lambda d: d.__setitem__("schema_version", True), r"schema_version True is not supported"),
    ],
)
def test_malformed_manifests_fail_in_one_line(bundle_copy, edit, message):
    from hne_edge.bundle import read_manifest
    from hne_edge.errors import BundleError

    edit_manifest(bundle_copy, edit)
    with pytest.raises(BundleError, match=message):
        read_manifest(bundle_copy)


def test_duplicate_keys_and_deep_nesting_are_refused(bundle_copy):
    from hne_edge.bundle import read_manifest
    from hne_edge.errors import BundleError

    text = (bundle_copy / "manifest.json").read_text()
    (bundle_copy / "manifest.json").write_text(text.replace('"schema_version": 1', '"schema_version": 1, "schema_version": 1', 1))
    with pytest.raises(BundleError, match="duplicate key 'schema_version'"):
        read_manifest(bundle_copy)
    (bundle_copy / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    line = one_line_error(run_cli("inspect", str(bundle_copy)))
    assert "nested too deeply" in line


def test_graph_disagreeing_with_the_manifest_fails_at_load_not_mid_frame(bundle_copy):
    from hne_edge.errors import BundleError
    from hne_edge.runtime import AnytimeRunner

    def edit(d):  # a consistent manifest that lies about the files: 32x32 images
        d["input"]["shape"] = ["batch", 3, 32, 32]
        d["model"]["config"]["input_size"] = 32
        for f in d["files"]:
            for t in f["inputs"]:
                if t["node"] is None:
                    t["shape"] = ["batch", 3, 32, 32]

    edit_manifest(bundle_copy, edit)
    with pytest.raises(BundleError, match=r"tensor image is float32 \['batch', 3, 16, 16\] in the ONNX graph; the manifest says float32 \['batch', 3, 32, 32\]"):
        AnytimeRunner(bundle_copy, verify=False, load_profile=False, warmup=0)


# -- D4-D6: sessions and threads ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner(tiny_bundle):
    from hne_edge.runtime import AnytimeRunner

    with AnytimeRunner(tiny_bundle.bundle_dir, load_profile=False, warmup=0) as r:
        yield r


def test_start_owns_its_input(runner, tiny_bundle):
    import torch

    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():  # the reference: the PyTorch model on the original values
        ref = tiny_bundle.model(torch.from_numpy(x.copy())).numpy().mean(axis=1)
    session = runner.start(x)
    x[:] = np.nan  # the application reuses its buffer for the next frame
    result = session.refine()
    assert result.leaves == 16
    np.testing.assert_allclose(result.logits, ref, atol=1e-4)


def test_cancel_before_the_first_leaf_raises_a_typed_error(runner):
    from hne_edge.errors import HNEError
    from hne_edge.runtime import NoResultError, SessionCancelled

    session = runner.start(np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(NoResultError, match="no leaf evaluated yet"):
        session.result()
    session.cancel()
    for call in (session.refine, session.result):
        with pytest.raises(SessionCancelled, match="cancelled before its first leaf") as info:
            call()
        assert isinstance(info.value, HNEError)
    assert session.step() is False and session.done
    session = runner.start(np.zeros((1, 3, 16, 16), np.float32))  # cancelled after a leaf: keeps it
    session.step()
    session.cancel()
    assert session.refine().leaves == 1 and session.result().stopped_by == "cancelled"


class _ImpatientLock:
    """The runner's lock, but close()'s wait gives up after 0.3 s: a call longer than close()'s patience."""

    def __init__(self, lock):
        self._lock = lock

    def acquire(self, blocking=True, timeout=-1):
        return self._lock.acquire(blocking, 0.3 if blocking and timeout > 0 else timeout)

    def release(self):
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def test_close_from_another_thread_waits_for_the_running_call(tiny_bundle):
    import threading
    import time

    from hne_edge.runtime import AnytimeRunner, RunnerClosedError

    runner = AnytimeRunner(tiny_bundle.bundle_dir, load_profile=False, warmup=0)
    runner._lock = _ImpatientLock(runner._lock)
    closer = threading.Thread(target=runner.close, daemon=True)
    seen = []

    def slow_rule(leaf_logits):  # between leaves: close from another thread, then keep computing
        if len(leaf_logits) == 1:
            closer.start()
            time.sleep(0.8)
            seen.append(runner.closed)
        return False

    result = runner.run(np.zeros((1, 3, 16, 16), np.float32), stop_when=slow_rule)
    closer.join(10)
    assert result.leaves == 16 and np.isfinite(result.logits).all()
    assert seen == [True] and runner.closed
    with pytest.raises(RunnerClosedError):
        runner.run(np.zeros((1, 3, 16, 16), np.float32))


# -- D7 and D13: checkpoints ------------------------------------------------------------------------


@pytest.fixture
def corrupt_checkpoint(tiny_bundle, tmp_path) -> Path:
    import zipfile

    run = tmp_path / "run"
    run.mkdir()
    path = run / "checkpoint.pt"
    data = bytearray(tiny_bundle.checkpoint_path.read_bytes())
    data[len(data) // 2] ^= 0x5A  # one byte in the middle: inside a weight tensor
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is not None  # the premise: the zip's CRC sees it
    return path


@pytest.mark.parametrize("command", ["eval", "export", "verify", "resume"])
def test_a_flipped_byte_in_a_checkpoint_is_refused(corrupt_checkpoint, tiny_bundle, command):
    path = corrupt_checkpoint
    args = {
        "eval": ("eval", str(path), "--no-plots", "--quiet"),
        "export": ("export", str(path), "--out", str(path.parent / "bundle"), *FAST_EXPORT),
        "verify": ("verify", str(tiny_bundle.bundle_dir), "--checkpoint", str(path)),
        "resume": ("train", "--resume", "--out", str(path.parent)),
    }[command]
    line = one_line_error(run_cli(*args, timeout=300))
    assert "fails its CRC-32 check" in line
    assert not (path.parent / "bundle").exists()


def test_eval_refuses_nan_weights(tiny_bundle, tmp_path):
    import torch

    state = torch.load(tiny_bundle.checkpoint_path, weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name].view(-1)[0] = float("nan")
    torch.save(state, tmp_path / "nan.pt")
    line = one_line_error(run_cli("eval", str(tmp_path / "nan.pt"), "--no-plots", "--quiet"))
    assert f"non-finite value(s) (NaN/Inf) in weight {name!r}" in line


def test_checkpoint_gets_umask_mode_and_stale_temps_go(tiny_bundle, tmp_path):
    from hne_edge.train.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint

    stale = dead_writers_scratch(tmp_path / "ck.pt", "tmp")
    stale.write_bytes(b"half a checkpoint")
    model, state = model_from_checkpoint(tiny_bundle.checkpoint_path)
    path = save_checkpoint(tmp_path / "ck.pt", model=model, class_names=state["class_names"])
    assert load_checkpoint(path)["class_names"] == state["class_names"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


# -- D10-D13: names from files, one-line CLI errors ------------------------------------------------


def test_bench_does_not_write_outside_the_working_directory(bundle_copy, tmp_path):
    edit_manifest(bundle_copy, lambda d: d["model"].__setitem__("name", "../../x"))
    work = tmp_path / "deep" / "work"
    work.mkdir(parents=True)
    proc = run_cli("bench", str(bundle_copy), "--repeats", "1", "--warmup", "0", cwd=work,
                   env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in work.iterdir()] == ["bench-_.._x"] and (work / "bench-_.._x" / "bench.json").is_file()
    assert not (tmp_path / "x").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b", "deep"]


def test_class_names_with_terminal_sequences_are_escaped(bundle_copy, tmp_path):
    names = [f"c{i}" for i in range(10)]
    names = ["\x1b]0;owned\x07\x1b[2J" + n for n in names]
    edit_manifest(bundle_copy, lambda d: d["model"].__setitem__("class_names", names))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    proc = run_cli("run", str(bundle_copy), str(tmp_path / "x.npy"), "--max-leaves", "1")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\\x1b]0;owned\\x07" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "{bundle}", "{x}", "--batch-size", "-1"), "Invalid value for '--batch-size'"),
        (("run", "{bundle}", "{x}", "--batch-size", "0"), "Invalid value for '--batch-size'"),
        (("bench", "{bundle}", "--repeats", "0"), "Invalid value for '--repeats'"),
        (("verify", "{bundle}", "--batch-sizes", "0"), "expected comma-separated integers >= 1"),
        (("run", "{bundle}", "{png}"), "cannot decode the image"),
        (("run", "{bundle}", "{short_y}"), "received y of shape (1,) and dtype int64 for 3 samples of x"),
        (("train", "--data", "npz", "--data-dir", "{x}", "--out", "{tmp}/t"), "received a .npy array; expected a .npz"),
    ],
)
def test_cli_failures_are_one_line_exit_2(tiny_bundle, tmp_path, args, message):
    np.save(tmp_path / "x.npy", np.zeros((3, 3, 16, 16), np.float32))
    np.savez(tmp_path / "short_y.npz", x=np.zeros((3, 3, 16, 16), np.float32), y=np.zeros(1, np.int64))
    (tmp_path / "bad.png").write_bytes(b"not a png at all")
    paths = {"bundle": tiny_bundle.bundle_dir, "x": tmp_path / "x.npy", "png": tmp_path / "bad.png",
             "short_y": tmp_path / "short_y.npz", "tmp": tmp_path}  # fmt: skip
    proc = run_cli(*(a.format(**paths) for a in args))
    assert message in one_line_error(proc)


def test_enospc_is_one_line(tiny_bundle, tmp_path):
    """A full disk during export: the partial bundle is removed and the message is one line."""
    sitecustomize = tmp_path / "sitecustomize.py"
    sitecustomize.write_text(  # ENOSPC when an ONNX file is opened for writing, by open() or by os.open (fileio)
        "import errno, os, builtins\n"
        "_open, _os_open = builtins.open, os.open\n"
        "def enospc(path):\n"
        "    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
        "def full(path, mode='r', *a, **k):\n"
        "    if 'w' in str(mode) and '.onnx' in str(path):\n"
        "        raise enospc(path)\n"
        "    return _open(path, mode, *a, **k)\n"
        "def full_os(path, flags, *a, **k):\n"
        "    if flags & (os.O_WRONLY | os.O_RDWR) and '.onnx' in str(path):\n"
        "        raise enospc(path)\n"
        "    return _os_open(path, flags, *a, **k)\n"
        "builtins.open, os.open = full, full_os\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(tmp_path / "out"), *FAST_EXPORT,
                   env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])})  # fmt: skip
    one_line_error(proc, "No space left on device", after_progress=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["__pycache__", "sitecustomize.py"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["sitecustomize.py"]


def test_numpy_scalars_are_accepted_as_budgets(runner):
    result = runner.run(np.zeros((1, 3, 16, 16), np.float32), budget_ms=np.float32(1000.0), deadline=np.float64(1e12))
    assert result.leaves >= 1 and result.budget_ms == pytest.approx(1000.0, rel=1e-6)


def test_library_errors_share_one_base_class(tiny_bundle):
    from hne_edge.errors import HNEError
    from hne_edge.runtime.backends.base import Unit
    from hne_edge.runtime.backends.cuda import Slot, SlotPool, open_device
    from hne_edge.runtime.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeRunner

    class H:
        pass

    pool = SlotPool(max_slots=1)
    _, slot = pool.acquire(1, lambda: Slot((H(),)))
    held = slot.handles[0]  # a paused session holds the only slot
    with pytest.raises(HNEError, match="paused sessions hold"):
        pool.acquire(1, lambda: Slot((H(),)))
    del held
    with pytest.raises(HNEError, match="memory: received 'x'"):
        open_device(0, prefer="x")
    unit = Unit(name="u", nodes=("b0.0",), leaf=None, inputs=(), outputs=(), macs=0, kind="node", key="b0.0")
    with pytest.raises(HNEError, match="not active"):
        OnnxRuntimeRunner(unit, OnnxRuntimeBackend()).run(())


def test_inspect_escapes_terminal_sequences(bundle_copy):
    edit_manifest(bundle_copy, lambda d: d["model"].__setitem__("name", "tiny\x1b[2J\x1b]0;owned\x07"))
    proc = run_cli("inspect", str(bundle_copy))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "tiny\\x1b[2J" in proc.stdout
