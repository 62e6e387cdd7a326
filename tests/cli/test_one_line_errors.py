"""Issue 19 section 4: every failure the README promises as one line (exit 2) is one, and says what went wrong.

Each case printed a traceback (or exited 0 in silence, or named the wrong cause) before its fix. The
runtime-only install (torch commands on a device) is in test_cli_conventions.py.
"""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, edit_manifest, one_line_error, run_cli

FAST_EXPORT = ("--no-verify", "--plan", "segments", "--no-first-leaf", "--quiet")  # errors mid-export follow no progress line


def _rehash(bundle: Path, rel: str) -> None:
    """Make the manifest agree with the file now at ``rel`` (what a careful attacker, or a bad tool, does)."""
    from hne_edge.bundle import sha256_file

    def edit(d):
        for f in d["files"]:
            if f["path"] == rel:
                f["sha256"], f["bytes"] = sha256_file(bundle / rel), (bundle / rel).stat().st_size

    edit_manifest(bundle, edit)


# -- tracebacks at the command line ---------------------------------------------------------------------


def test_run_refuses_a_scalar_and_an_empty_file_in_one_line(tiny_bundle, tmp_path):
    np.save(tmp_path / "scalar.npy", np.float32(1.0))
    np.save(tmp_path / "empty.npy", np.zeros((0, 3, 16, 16), np.float32))
    one_line_error(run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "scalar.npy")), "scalar.npy", "0-d")
    # was exit 0 with no output at all
    one_line_error(run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "empty.npy")), "empty.npy", "no samples")
    one_line_error(run_cli("bench", str(tiny_bundle.bundle_dir), "--frames", str(tmp_path / "empty.npy"),
                           "--out", str(tmp_path / "bench")), "empty.npy", "no samples")  # fmt: skip


def test_npz_data_with_no_samples_or_labels_past_the_class_bound_is_one_line(tiny_bundle, tmp_path):
    """Labels up to 10**9 made a name for each class up to it before any bound was checked (the process killed for
    memory, or a MemoryError traceback); zero samples were a traceback from ``y.min()``. Both commands that read an
    npz of labelled images: train and eval --test-data."""
    np.savez(tmp_path / "huge.npz", x=np.zeros((20, 16, 16, 3), np.uint8), y=np.full(20, 10**9))
    np.savez(tmp_path / "none.npz", x=np.zeros((0, 16, 16, 3), np.uint8), y=np.zeros(0, np.int64))
    for name, said in (("huge.npz", "labels go up to 1000000000; expected 0..K-1 with K at most 100,000"),
                       ("none.npz", "holds no samples")):  # fmt: skip
        data = str(tmp_path / name)
        one_line_error(run_cli("train", "--data", "npz", "--data-dir", data, "--model", "hne_tiny", "--epochs", "1",
                               "--out", str(tmp_path / f"run-{name}"), "--quiet"), name, said)  # fmt: skip
        one_line_error(run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", data,
                               "--out", str(tmp_path / f"eval-{name}"), "--quiet"), name, said)  # fmt: skip
        assert not (tmp_path / f"run-{name}").exists() and not (tmp_path / f"eval-{name}").exists()


@pytest.mark.parametrize("flag, value", [("--jitter-ms", "inf"), ("--jitter-ms", "nan"), ("--jitter-ms", "1e308"),
                                         ("--deadline-ms", "nan"), ("--guard-ms", "nan"), ("--fps", "inf"),
                                         ("--seconds", "nan")])  # fmt: skip
def test_bench_streams_refuses_a_timing_that_is_not_a_finite_number_naming_its_flag(tiny_bundle, flag, value):
    """click's FloatRange lets nan and inf through: --jitter-ms inf / nan / 1e308 were an OverflowError traceback
    from the arrivals' random jitter, --deadline-ms nan and --guard-ms nan errors naming a Python argument ("an
    absolute time.perf_counter() value"), each after the runner had opened and profiled. Every float option is a
    finite range now: refused as it is parsed, naming the flag."""
    line = one_line_error(run_cli("bench-streams", str(tiny_bundle.bundle_dir), "--streams", "1", "--seconds", "0.3",
                                  "--methods", "scheduler", "--quiet", flag, value), f"Invalid value for '{flag}'")  # fmt: skip
    assert f"received '{value}'; expected a finite number" in line or "is not in the range 0<=x<=60000" in line, line


def test_bench_streams_names_a_checkpoint_given_as_its_bundle(tiny_bundle):
    one_line_error(run_cli("bench-streams", str(tiny_bundle.checkpoint_path), "--streams", "1"), "a checkpoint?",
                   "hne-edge export")  # fmt: skip


def test_agreement_nan_is_one_line_and_the_rule_refuses_nan_everywhere(tiny_bundle, tmp_path):
    from hne_edge.errors import InputError
    from hne_edge.runtime import Agreement

    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    one_line_error(run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "x.npy"), "--agreement", "nan"),
                   "--agreement", "received 'nan'; expected a finite number 0<x<=1")  # fmt: skip
    for kwargs in ({"vote": float("nan")}, {"margin": float("nan")}, {"max_std": float("nan")}, {"min_leaves": True}):
        with pytest.raises(InputError, match="Agreement"):
            Agreement(**kwargs)


def test_a_config_file_of_random_bytes_is_one_line(tmp_path):
    (tmp_path / "junk.bin").write_bytes(bytes(range(256)) * 4)
    one_line_error(run_cli("train", "--config", str(tmp_path / "junk.bin")), "junk.bin", "UTF-8")


def test_verify_refuses_external_data_that_leaves_the_bundle_in_one_line(bundle_copy, tiny_bundle, tmp_path):
    """The runtime refused this file cleanly; verify handed its path to ONNX Runtime and printed 36 lines."""
    import onnx

    rel = "onnx/fp32/segments/leaf00.onnx"
    proto = onnx.load(str(bundle_copy / rel))
    onnx.save_model(proto, str(bundle_copy / rel), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)  # fmt: skip
    proto = onnx.load(str(bundle_copy / rel), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../../../../outside.bin"
    onnx.save_model(proto, str(bundle_copy / rel))
    shutil.move(bundle_copy / "onnx/fp32/segments/w.bin", tmp_path / "outside.bin")
    _rehash(bundle_copy, rel)
    for extra in ((), ("--checkpoint", str(tiny_bundle.checkpoint_path))):
        one_line_error(run_cli("verify", str(bundle_copy), *extra), "leaf00.onnx", "external files")


def _fsize_limit(limit: int):
    def apply() -> None:  # a disk that fills up: writes past `limit` bytes fail with EFBIG, and no signal kills us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_export_force_onto_a_nearly_full_disk_is_one_line_naming_the_file(tiny_bundle, tmp_path):
    out = tmp_path / "bundle"
    run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), *FAST_EXPORT, check=True)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    weights = (out / "torch" / "model.pt").stat().st_size
    proc = subprocess.run(
        [sys.executable, "-m", "hne_edge", "export", str(tiny_bundle.checkpoint_path), "--out", str(out), "--force",
         *FAST_EXPORT], capture_output=True, text=True, cwd=REPO, timeout=600,
        preexec_fn=_fsize_limit(weights - 1000),
    )  # fmt: skip
    one_line_error(proc, "File too large", str(out / "torch" / "model.pt"))  # was RuntimeError: [enforce fail ...
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # the old bundle, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no partial folder left beside it


def test_a_write_error_without_a_file_name_gets_the_path(tmp_path):
    """ENOSPC / EFBIG arrive from write() and fsync(), which name no file: the one writer adds it."""
    proc = subprocess.run(
        [sys.executable, "-c", "from hne_edge.fileio import atomic_write_bytes as w; "
         f"w({str(tmp_path / 'big.bin')!r}, bytes(100_000))"], capture_output=True, text=True, cwd=REPO,
        preexec_fn=_fsize_limit(50_000),
    )  # fmt: skip
    assert f"OSError: [Errno 27] File too large: '{tmp_path / 'big.bin'}'" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the scratch file is gone


# -- library errors that were not HNEError ---------------------------------------------------------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda b: {"bundle_dir": None}, r"bundle_dir: received NoneType; expected the path of a bundle folder"),
        (lambda b: {"warmup": 2.5}, r"warmup: received 2.5; expected an int in 0..1000"),
        (lambda b: {"warmup": -1}, r"warmup: received -1; expected an int in 0..1000"),
        (lambda b: {"precision": "int8"}, r"precision: received 'int8'; expected one of \['fp32', 'fp16'\]"),
    ],
)
def test_runner_arguments_are_input_errors(tiny_bundle, make, match):
    from hne_edge.errors import InputError
    from hne_edge.runtime import AnytimeRunner

    kwargs = {"bundle_dir": tiny_bundle.bundle_dir, "load_profile": False, **make(tiny_bundle)}
    with pytest.raises(InputError, match=match):
        AnytimeRunner(**kwargs)


def test_preprocess_and_predicted_ms_refuse_what_the_bundle_cannot_run(tiny_bundle):
    from hne_edge.errors import InputError
    from hne_edge.runtime import AnytimeRunner

    with AnytimeRunner(tiny_bundle.bundle_dir, load_profile=False, warmup=0) as runner:
        with pytest.raises(InputError, match=r"preprocess: received images of different sizes: image 1 is \(16, 17, 3\); image 0 is \(16, 16, 3\)"):
            runner.preprocess([np.zeros((16, 16, 3), np.uint8), np.zeros((16, 17, 3), np.uint8)])
        for batch in (0, -1, 1000, 2.0):
            with pytest.raises(InputError, match=rf"batch: received {batch!r}; expected an int in 1..8"):
                runner.predicted_ms(batch)
        assert len(runner.predicted_ms(8)) == 16


# -- messages that named the wrong thing -------------------------------------------------------------------


def test_a_manifest_path_naming_the_bundle_itself_says_so(bundle_copy):
    from hne_edge.bundle import read_manifest
    from hne_edge.errors import BundleError

    edit_manifest(bundle_copy, lambda d: d["files"][0].__setitem__("path", "."))
    with pytest.raises(BundleError) as info:
        read_manifest(bundle_copy, verify_files=False)
    assert "names the bundle folder itself; expected a file inside it" in str(info.value)
    assert "outside the bundle" not in str(info.value)


def test_a_model_file_replaced_by_a_folder_is_not_missing(bundle_copy):
    from hne_edge.bundle import read_manifest
    from hne_edge.errors import BundleError

    rel = "onnx/fp32/segments/leaf03.onnx"
    (bundle_copy / rel).unlink()
    (bundle_copy / rel).mkdir()
    with pytest.raises(BundleError, match=r"bundle file onnx/fp32/segments/leaf03.onnx \(files\[\d+\]\) is a folder; expected a file") as info:
        read_manifest(bundle_copy, verify_files=False)
    assert "missing" not in str(info.value)


def test_export_with_an_empty_out_does_not_offer_force_on_the_current_directory(tiny_bundle, tmp_path):
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", "", *FAST_EXPORT, cwd=tmp_path,
                   env={"PYTHONPATH": str(REPO)})  # this checkout, run from another folder  # fmt: skip
    line = one_line_error(proc, "--out", "empty")
    assert "--force" not in line
    assert list(tmp_path.iterdir()) == []


def test_a_refused_pickle_never_repeats_torchs_advice_to_turn_the_check_off(bundle_copy, tiny_bundle, tmp_path):
    import torch

    from hne_edge.errors import BundleError
    from hne_edge.runtime import AnytimeRunner

    torch.save({"x": print}, bundle_copy / "torch" / "model.pt")  # a global: the safe unpickler refuses it
    _rehash(bundle_copy, "torch/model.pt")
    with pytest.raises(BundleError) as info:
        AnytimeRunner(bundle_copy, backend="torch", load_profile=False, warmup=0)
    for message in (str(info.value), one_line_error(run_cli("verify", str(bundle_copy), "--checkpoint",
                                                            str(tiny_bundle.checkpoint_path)))):  # fmt: skip
        assert "torch/model.pt" in message and "global 'print'" in message and "refuses" in message, message
        assert "weights_only=False" not in message and "add_safe_globals" not in message and "\x1b" not in message, message
    state = torch.load(tiny_bundle.checkpoint_path, weights_only=True)
    state["extra"] = {"x": print}
    torch.save(state, tmp_path / "evil.pt")
    line = one_line_error(run_cli("eval", str(tmp_path / "evil.pt"), "--no-plots", "--quiet"), "evil.pt", "global 'print'")
    assert "weights_only=False" not in line


class _RunsCode:
    """A pickle payload: unpickling it calls os.system (what the safe loader exists to refuse)."""

    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


class _Plain:
    """An instance of a class no allowlist holds."""


def test_every_refused_pickle_payload_is_named_not_called_a_corrupt_file(tiny_bundle, tmp_path):
    """torch's refusal of a blocked module's global ("posix.system") and of a reduce call was reported as
    "UnpicklingError while loading ... (a corrupt file, ...)": neither the object nor the refusal was named."""
    import os

    import torch

    from hne_edge.errors import CheckpointError
    from hne_edge.train.checkpoint import load_checkpoint

    state = torch.load(tiny_bundle.checkpoint_path, weights_only=True)
    system = f"{os.system.__module__}.system"  # posix.system on Linux
    for name, payload, refused in [("system.pt", _RunsCode(), system), ("plain.pt", _Plain(), "_Plain")]:
        torch.save({**state, "extra": {"x": payload}}, tmp_path / name)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(tmp_path / name)
        line = one_line_error(run_cli("eval", str(tmp_path / name), "--no-plots", "--quiet"), name, refused)
        for message in (str(info.value), line):
            assert refused in message and "refuses" in message and "corrupt" not in message, message
            assert "weights_only=False" not in message and "add_safe_globals" not in message, message


def test_exporting_a_model_with_negative_variance_names_the_statistic_not_nan(tiny_bundle, tmp_path):
    import copy

    import torch

    from hne_edge.errors import ExportError
    from hne_edge.exporters import export_onnx

    model = copy.deepcopy(tiny_bundle.model)
    name, buffer = next((n, b) for n, b in model.named_buffers() if n.endswith("running_var"))
    with torch.no_grad():
        buffer[0] = -1.0
    with pytest.raises(ExportError) as info:
        export_onnx(model, tmp_path / "b", plan="segments", first_leaf=False, torch_weights=False)
    assert name in str(info.value) and "negative" in str(info.value) and "nan" not in str(info.value)
    assert not (tmp_path / "b").exists()


def test_exports_success_line_escapes_control_characters(tiny_bundle, tmp_path):
    out = tmp_path / "b\x1b[2Jx"
    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(out), *FAST_EXPORT, check=True)
    assert "\x1b" not in proc.stdout and "b\\x1b[2Jx" in proc.stdout


# -- a manifest's numbers and paths, bounded and checked (issue 29, items 5-7) ----------------------------------------


def _set_first_file(key, value):
    return lambda d: d["files"][0].__setitem__(key, value)


def _literal(key: str, literal: str):
    """Set the first number of ``key`` to ``literal`` in the manifest's text (json.dumps writes neither a 100,000-digit
    integer nor 1e400)."""
    import re

    def spoil(bundle: Path) -> None:
        text = (bundle / "manifest.json").read_text()
        (bundle / "manifest.json").write_text(re.sub(rf'("{key}": ?)[-0-9.e]+', lambda m: m.group(1) + literal, text, count=1))

    return spoil


@pytest.mark.parametrize("spoil, fragments", [
    (_set_first_file("macs", 10**400), ("files[0].macs", "2**50")),  # was: OverflowError (inspect formats macs/1e6)
    (_set_first_file("bytes", 10**18), ("files[0].bytes", "2**50")),  # was: "931322574.6 GB", verify OK
    (lambda d: d["tree"]["nodes"][0].__setitem__("macs", -(10**30)), ("tree.nodes[0].macs",)),
    (lambda d: d["input"]["batch"].__setitem__(2, 10**40), ("input.batch", "2**50")),
    (_set_first_file("opset", 10**25), ("files[0].opset", "2**50")),
    (_literal("macs", "1e400"), ("not a finite JSON number", "1e400")),  # json reads it as inf
    (_literal("macs", "9" * 100_000), ("an integer of 100000 digits",)),  # was: ValueError from json.loads
    (_set_first_file("path", "onnx/fp32/nodes/b0\x00.onnx"), ("files[0].path", "NUL")),  # was: "embedded null byte"
    (_set_first_file("path", "onnx/fp32/nodes/b0\ud800.onnx"), ("files[0].path", "UTF-8")),  # a lone surrogate
    (lambda d: d["model"].__setitem__("class_names", ["a\x00", *d["model"]["class_names"][1:]]), ("model.class_names[]", "NUL")),
])  # fmt: skip
@pytest.mark.parametrize("command", ["inspect", "verify", "run"])
def test_a_manifest_number_out_of_bounds_or_a_nul_in_a_path_is_one_line(bundle_copy, tmp_path, spoil, fragments, command):
    """Issue 29 (5, 6): each of these printed a traceback in inspect, verify and run."""
    if spoil.__name__ == "spoil":
        spoil(bundle_copy)
    else:
        edit_manifest(bundle_copy, spoil)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    args = {"inspect": ["inspect", str(bundle_copy)], "verify": ["verify", str(bundle_copy), "--quiet"],
            "run": ["run", str(bundle_copy), str(tmp_path / "x.npy")]}[command]  # fmt: skip
    line = one_line_error(run_cli(*args), *fragments)
    assert len(line) < 600, line


@pytest.mark.parametrize("command", ["inspect", "verify", "run"])
def test_a_file_whose_size_is_not_the_manifests_is_refused(bundle_copy, tmp_path, command):
    """Issue 29 (7): `bytes` was never compared with the file: `inspect` showed the manifest's size, `verify` said OK.
    Wherever a file's sha256 is checked (reading the manifest, loading the file), its size is checked first."""
    rel = "onnx/fp32/segments/leaf00.onnx"
    size = (bundle_copy / rel).stat().st_size
    edit_manifest(bundle_copy, lambda d: next(f for f in d["files"] if f["path"] == rel).__setitem__("bytes", size + 1))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    args = {"run": ["run", str(bundle_copy), str(tmp_path / "x.npy")], "verify": ["verify", str(bundle_copy), "--quiet"]
            }.get(command, command.split() + [str(bundle_copy)])  # fmt: skip
    one_line_error(run_cli(*args), rel, f"{size} bytes", f"manifest says {size + 1}")


def _files(plan: str, edit):
    """Apply ``edit`` to every file of ``plan`` (fp32 ONNX) in the manifest."""
    return lambda d: [edit(f) for f in d["files"] if (f["plan"], f["format"]) == (plan, "onnx")]


def _logits_shape(shape):
    return lambda f: [t.__setitem__("shape", shape) for t in f["outputs"] if t["name"] == "logits"]


@pytest.mark.parametrize("spoil, fragments", [
    # was: TypeError "'<' not supported between instances of 'NoneType' and 'int'" (a segments file's leaf null)
    (lambda d: [f for f in d["files"] if f["plan"] == "segments"][3].__setitem__("leaf", None),
     ("segments/leaf03.onnx", "leaf None", "0..15")),
    # one leaf's logits were checked on their last dim only: inspect's TypeError "int + str", or wrong leaf ranges
    (_files("segments", _logits_shape(["batch", "k", 10])), ("segments/leaf00.onnx", "['batch', 'k', 10]")),
    (_files("segments", _logits_shape(["batch", 5, 10])), ("segments/leaf00.onnx", "['batch', 5, 10]")),
    (_files("nodes", _logits_shape(["batch", 2, 10])), ("nodes/b4.0.onnx", "['batch', 2, 10]", "['batch', 10]")),
    (_files("first", _logits_shape([10])), ("first/leaf00.onnx", "[10]", "['batch', 10]")),
])  # fmt: skip
@pytest.mark.parametrize("command", ["inspect", "verify", "run"])
def test_a_files_leaf_or_one_leafs_logits_the_runtime_cannot_place_is_one_line(bundle_copy, tmp_path, spoil,
                                                                               fragments, command):  # fmt: skip
    """A one-leaf file (nodes, segments, first) fills the runtime's (batch, classes) slot of its leaf."""
    edit_manifest(bundle_copy, spoil)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    args = {"inspect": ["inspect", str(bundle_copy)], "verify": ["verify", str(bundle_copy), "--quiet"],
            "run": ["run", str(bundle_copy), str(tmp_path / "x.npy")]}[command]  # fmt: skip
    one_line_error(run_cli(*args), *fragments)


def test_npz_data_of_python_objects_or_without_channels_is_one_line(tiny_bundle, tmp_path):
    """An npz whose x, y or classes is an array of Python objects (np.array(names, dtype=object), pandas' .values)
    was a 44-line ValueError traceback (numpy loads those only by unpickling: running code from the file, never
    allowed); images of 0 channels a RuntimeError traceback from the normalisation statistics."""
    x, y = np.zeros((40, 8, 8, 3), np.uint8), np.arange(40) % 4
    np.savez(tmp_path / "obj_classes.npz", x=x, y=y, classes=np.array(["a", "b", "c", "d"], dtype=object))
    np.savez(tmp_path / "obj_y.npz", x=x, y=y.astype(object))
    np.savez(tmp_path / "obj_x.npz", x=x.astype(object), y=y)
    np.savez(tmp_path / "c0.npz", x=np.zeros((40, 8, 8, 0), np.uint8), y=y)
    for name, said in (("obj_classes.npz", "'classes' received an array of Python objects"),
                       ("obj_y.npz", "'y' received an array of Python objects"),
                       ("obj_x.npz", "'x' received an array of Python objects"),
                       ("c0.npz", "images of 0 channels (x (40, 8, 8, 0))")):  # fmt: skip
        data = str(tmp_path / name)
        one_line_error(run_cli("train", "--data", "npz", "--data-dir", data, "--model", "hne_tiny", "--epochs", "1",
                               "--out", str(tmp_path / f"run-{name}"), "--quiet"), name, said, "expected")  # fmt: skip
        one_line_error(run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", data,
                               "--out", str(tmp_path / f"eval-{name}"), "--quiet"), name, said)  # fmt: skip
        assert not (tmp_path / f"run-{name}").exists() and not (tmp_path / f"eval-{name}").exists()


def test_a_checkpoint_whose_weights_do_not_fit_its_config_is_named_and_summarised(tiny_bundle, tmp_path):
    """Weights from another block layout: torch's message (KBs, every key) was passed on whole, naming no file."""
    import torch

    state = torch.load(tiny_bundle.checkpoint_path, weights_only=True)
    state["model_config"]["blocks"][0][0] *= 2  # the first stage's width: every weight of it has another shape
    torch.save(state, tmp_path / "wrongcfg.pt")
    line = one_line_error(run_cli("export", str(tmp_path / "wrongcfg.pt"), "--out", str(tmp_path / "b"),
                                  *FAST_EXPORT), "wrongcfg.pt", "of another shape", "e.g.")  # fmt: skip
    assert len(line) < 600 and not (tmp_path / "b").exists()
