"""One voice across ``hne-edge`` subcommands (issue 15 item 4) and a thin CLI (issue 14 item 4).

Every check runs the real command in a subprocess, as a user would, except
the exit-code contract for unexpected exceptions, which needs a command that
raises one on purpose (click's in-process runner).
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from conftest import REPO, blocking_env, one_line_error, run_cli


@pytest.fixture(scope="module")
def work(tiny_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("conventions")
    shutil.copytree(tiny_bundle.bundle_dir, root / "b")
    rng = np.random.default_rng(0)
    np.savez(root / "frames.npz", x=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 4))
    np.savez(root / "test.npz", x=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 4),
             classes=np.array([f"c{i}" for i in range(10)]))
    (root / "notes.txt").write_text("not a folder\n")
    return root


# -- conventions: one flag per concept -------------------------------------------------------------------
def _help(command: str) -> str:
    return run_cli(command, "--help", check=True).stdout


def test_batch_flags_follow_one_scheme():
    """--batch-size N where one size is meant, --batch-sizes N,N for lists, --batch-range MIN:OPT:MAX for export."""
    for command in ("run", "bench", "eval", "train"):
        assert "--batch-size " in _help(command), command
    for command in ("profile", "verify"):
        assert "--batch-sizes N[,N...]" in _help(command), command
    export = _help("export")
    assert "--batch-range MIN:OPT:MAX" in export and "--batch " not in export  # the old spelling is a hidden alias


def test_every_progress_printing_command_has_quiet_and_every_device_defaults_to_auto():
    for command in ("train", "eval", "demo", "export", "verify", "profile", "bench"):  # every long command
        assert "--quiet" in _help(command), command
    for command in ("train", "eval", "run", "bench", "profile"):  # demo runs on the CPU (no --device)
        text = " ".join(_help(command).split())
        assert "--device" in text and "default: auto" in text.split("--device", 1)[1].split("--", 1)[0], command


def test_backend_choices_are_the_public_names_and_gpu_names_point_to_device(work):
    assert "[onnxruntime|torch|tensorrt]" in " ".join(_help("run").split())
    proc = run_cli("run", str(work / "b"), str(work / "frames.npz"), "--backend", "onnxruntime-cuda")
    one_line_error(proc, "'onnxruntime-cuda'", "--backend onnxruntime --device cuda")


def test_threads_zero_means_the_backends_default_everywhere(work):
    proc = run_cli("run", str(work / "b"), str(work / "frames.npz"), "--threads", "0", "--max-leaves", "1", check=True)
    assert "accuracy" in proc.stdout
    one_line_error(run_cli("run", str(work / "b"), str(work / "frames.npz"), "--threads", "-1"), "--threads", "-1")
    one_line_error(run_cli("train", "--threads", "-1", "--epochs", "1"), "--threads", "-1")


def test_bench_reads_frames_not_data(work, tmp_path):
    assert "--frames PATH.npz" in _help("bench") and "--data " not in _help("bench")
    proc = run_cli("bench", str(work / "b"), "--frames", str(work / "frames.npz"), "--repeats", "1", "--warmup", "0",
                   "--out", str(tmp_path / "bench"), "--json", check=True)
    assert json.loads(proc.stdout)["samples"] == 4


def test_debug_works_after_the_subcommand(work, tmp_path):
    (tmp_path / "empty").mkdir()
    quiet = run_cli("inspect", str(tmp_path / "empty"))
    one_line_error(quiet)
    for args in (("--debug", "inspect", str(tmp_path / "empty")), ("inspect", str(tmp_path / "empty"), "--debug")):
        proc = run_cli(*args)
        assert proc.returncode != 0 and "Traceback (most recent call last)" in proc.stderr, args


# -- errors: one line, what was received and what was expected, exit 2, nothing written ------------------
def test_export_onto_a_file_names_the_real_reason_with_or_without_force(tiny_bundle, work):
    for extra in ((), ("--force",)):
        proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(work / "notes.txt"), *extra)
        err = one_line_error(proc, "notes.txt", "not a directory")
        assert "pass --force" not in err
    assert (work / "notes.txt").read_text() == "not a folder\n"


def test_eval_onto_a_file_is_one_line(tiny_bundle, work):
    proc = run_cli("eval", str(tiny_bundle.checkpoint_path), "--test-data", str(work / "test.npz"), "--out",
                   str(work / "notes.txt"), "--no-plots")
    err = one_line_error(proc, "notes.txt", "expected a folder")
    assert "Errno" not in err
    assert (work / "notes.txt").read_text() == "not a folder\n"


def test_verify_batch_sizes_outside_the_bundles_range(work):
    proc = run_cli("verify", str(work / "b"), "--batch-sizes", "99")
    one_line_error(proc, "--batch-sizes", "99", "1..8")


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("run", "{b}", "{frames}", "--batch-size", "0"), ("--batch-size", "0")),
        (("run", "{b}", "{frames}", "--batch-size", "-1"), ("--batch-size", "-1")),
        (("bench", "{b}", "--repeats", "0"), ("--repeats", "0")),
        (("bench", "{b}", "--warmup", "-1"), ("--warmup", "-1")),
        (("bench", "{b}", "--limit", "0"), ("--limit", "0")),
        (("bench", "{b}", "--limit", "-5"), ("--limit", "-5")),
        (("run", "{b}", "{notes_png}"), ("notes.png", "expected a readable image file")),
        (("run", "{b}", "{notes_npz}"), ("notes.npz", "cannot read")),
        (("bench", "{b}", "--frames", "{notes_npz}"), ("notes.npz", "cannot read")),
        (("info", "hne_tiny", "--tree", "1,x"), ("--tree", "'1,x'", "branching factors")),
        (("info", "hne_tiny", "--tree", "3,0"), ("--tree", "positive integers")),
        (("info", "no_such_model"), ("no_such_model", "hne_tiny")),
        (("export", "{ckpt}", "--out", "{tmp}/o", "--batch-range", "4:2:1"), ("4:2:1", "MIN:OPT:MAX")),
        (("export", "{ckpt}", "--out", "{tmp}/o", "--precision", "fp8"), ("fp8", "fp32")),
        (("export", "{tmp}/missing.pt", "--out", "{tmp}/o"), ("missing.pt",)),
        (("train", "--data", "npz", "--epochs", "1"), ("data_dir",)),
        (("train", "--epochs", "0"), ("--epochs", "positive")),
        (("train", "--model", "nope", "--epochs", "1"), ("--model", "nope")),
    ],
)
def test_user_errors_are_one_line_hne_errors(work, tiny_bundle, tmp_path, args, fragments):
    for suffix in (".png", ".npz"):
        shutil.copy(work / "notes.txt", tmp_path / f"notes{suffix}")
    values = {"notes_npz": str(tmp_path / "notes.npz"), "b": str(work / "b"), "frames": str(work / "frames.npz"), "notes_png": str(tmp_path / "notes.png"),
              "ckpt": str(tiny_bundle.checkpoint_path), "tmp": str(tmp_path)}
    proc = run_cli(*(a.format(**values) for a in args), cwd=tmp_path)
    one_line_error(proc, *fragments)
    assert not (tmp_path / "o").exists() and not (tmp_path / "runs").exists()


PYTHON_NAMES = ("TreeSpec", "num_classes", "input_size", "optim.", "data.", "model.name", "batch_sizes[]", "device='",
                "input image")  # what a Python caller or a config file calls these, never a shell user


@pytest.mark.parametrize(
    "args, said",
    [
        (("info", "hne_tiny", "--tree", "1,0"), "--tree must hold positive integers"),
        (("train", "--tree", "1,0", "--out", "{tmp}/o"), "--tree must hold positive integers"),
        (("info", "hne_tiny", "--num-classes", "0"), "--num-classes must be a positive integer"),
        (("info", "hne_tiny", "--input-size", "0"), "--input-size must be a positive integer"),
        (("info", "hne_tiny", "--plot", ""), "--plot: received an empty path"),
        (("demo", "--epochs", "0", "--out", "{tmp}/o"), "--epochs: received 0"),
        (("demo", "--limit", "0", "--out", "{tmp}/o"), "--limit: received 0"),
        (("demo", "--seed", "-1", "--out", "{tmp}/o"), "--seed: received -1"),
        (("demo", "--model", "nope", "--out", "{tmp}/o"), "--model: received 'nope'"),
        (("bench", "{b}", "--batch-size", "100", "--out", "{tmp}/o"), "Invalid value for --batch-size: received 100"),
        (("profile", "{b}", "--batch-sizes", "9"), "Invalid value for --batch-sizes: received 9; expected 1..8"),
        (("run", "{b}", "{frames}", "--device", "gpu"), "e.g. --device cuda"),
        (("run", "{b}", "{frames}", "--agreement", "nan"), "Invalid value for '--agreement'"),
        (("bench", "{b}", "--duration", "nan", "--out", "{tmp}/o"), "Invalid value for '--duration'"),
    ],
)
def test_errors_name_the_flag_typed_not_a_python_argument(work, tmp_path, args, said):
    """docs/cli.md: an error names the flag the user typed, never a Python argument or a config key. These named
    TreeSpec.branching, num_classes, optim.epochs, batch_sizes[], "input image", device='cuda' or Agreement.vote."""
    values = {"b": str(work / "b"), "frames": str(work / "frames.npz"), "tmp": str(tmp_path)}
    line = one_line_error(run_cli(*(a.format(**values) for a in args), cwd=tmp_path), said)
    assert not any(name in line for name in PYTHON_NAMES), line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_hne_errors_are_one_line_other_exceptions_are_bugs(monkeypatch):
    """An InputError is the user's: one line, exit 2. A plain ValueError is ours: the traceback, exit 1."""
    import click
    from click.testing import CliRunner

    from hne_edge import cli
    from hne_edge.errors import InputError

    @click.command("boom")
    @click.option("--kind")
    def boom(kind):
        raise (InputError if kind == "input" else ValueError)(f"received {kind}")

    module = type(sys)("hne_edge_test_boom")
    module.boom = boom
    monkeypatch.setitem(sys.modules, "hne_edge_test_boom", module)
    monkeypatch.setitem(cli.COMMANDS, "boom", ("hne_edge_test_boom", "boom", "test"))
    result = CliRunner().invoke(cli.main, ["boom", "--kind", "input"])
    assert result.exit_code == 2 and result.output.strip() == "Error: received input"
    result = CliRunner().invoke(cli.main, ["boom", "--kind", "value"])
    assert result.exit_code == 1 and isinstance(result.exception, ValueError)


# -- one home per rule ------------------------------------------------------------------------------------
def test_one_tree_option_parser():
    from hne_edge.errors import InputError
    from hne_edge.tree import TREE_PRESETS, parse_tree

    assert TREE_PRESETS == ("hne", "independent", "multi_branch")
    assert parse_tree("independent") == "independent" and parse_tree("1, 2,2,2,2") == (1, 2, 2, 2, 2)
    assert parse_tree((1, 4)) == (1, 4) and parse_tree(None) is None
    for bad in ("1,x", "", "hne2", "1,,2"):
        with pytest.raises(InputError, match="expected hne, independent, multi_branch or branching factors"):
            parse_tree(bad)


def test_train_config_validates_without_torch(tmp_path):
    import subprocess

    code = (
        "import sys\n"
        "from hne_edge.train.config import TrainConfig\n"
        "c = TrainConfig.from_preset('cifar', {'optim': {'epochs': 3}})\n"
        "assert c.model.name == 'hne_resnet' and c.optim.epochs == 3, c\n"
        "try:\n"
        "    TrainConfig.from_preset('digits', {'model': {'name': 'nope'}})\n"
        "except ValueError as exc:\n"
        "    assert 'hne_tiny' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('a bad model name validated')\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**__import__("os").environ, **blocking_env(tmp_path, "torch")})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_train_config_resolves_the_default_preset_for_a_dataset():
    from hne_edge.train.config import TrainConfig

    assert TrainConfig.for_data(None).model.name == "hne_tiny"  # digits
    config = TrainConfig.for_data("npz", {"data": {"data_dir": "x.npz"}, "optim": {"epochs": 1}})
    assert (config.data.name, config.model.name, config.optim.epochs) == ("npz", "hne_resnet", 1)
    assert TrainConfig.for_data("cifar100").data.name == "cifar100"


def test_image_decoding_is_a_torch_free_library_function(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    from hne_edge.errors import InputError
    from hne_edge.runtime.images import IMAGE_SUFFIXES, read_image

    assert ".png" in IMAGE_SUFFIXES
    Image.fromarray(np.full((5, 4, 3), 200, np.uint8)).save(tmp_path / "a.png")
    gray = read_image(tmp_path / "a.png", channels=1)
    assert gray.shape == (5, 4) and gray.dtype == np.uint8 and gray[0, 0] == 200
    assert read_image(tmp_path / "a.png", channels=3).shape == (5, 4, 3)
    (tmp_path / "b.png").write_text("no")
    with pytest.raises(InputError, match="b.png: cannot decode"):
        read_image(tmp_path / "b.png", channels=3)


def test_export_checkpoint_is_a_library_function(tiny_bundle, tmp_path):
    from hne_edge.bundle import read_manifest
    from hne_edge.exporters import export_checkpoint

    path = export_checkpoint(tiny_bundle.checkpoint_path, tmp_path / "b", plan="segments", batch=(1, 1, 2),
                             torch_weights=False, first_leaf=False)
    manifest = read_manifest(path)
    assert manifest.provenance["checkpoint"] == str(tiny_bundle.checkpoint_path)
    assert {v[1] for v in manifest.variants()} == {"segments"}


def test_device_auto_resolves_per_backend(monkeypatch):
    import onnxruntime

    from hne_edge.runtime.backends import cuda
    from hne_edge.runtime.devices import resolve_device

    gpus = {"n": 0}
    monkeypatch.setattr(cuda, "probe_cuda", lambda: cuda.CudaProbe(device_count=gpus["n"]))
    assert resolve_device("onnxruntime", "cuda:1") == "cuda:1" and resolve_device("torch", "cpu") == "cpu"
    assert resolve_device("tensorrt", "auto") == "cuda"  # it has no CPU path
    assert resolve_device("torch", "auto") == "cpu"
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    gpus["n"] = 1
    assert resolve_device("onnxruntime", "auto") == "cpu"  # the CPU package cannot use the GPU
    assert resolve_device("torch", "auto") == "cuda"
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert resolve_device("onnxruntime", "auto") == "cuda"


TRAIN_EXTRA_MODULES = ("torch", "torchvision", "yaml", "matplotlib", "sklearn", "tqdm", "PIL", "onnx", "onnxscript")


@pytest.mark.parametrize("args", [
    ["train", "--epochs", "1", "--limit", "64"],
    ["info", "hne_tiny"],
    ["demo", "--data", "digits"],
])
def test_runtime_only_install_names_the_missing_extra_in_one_line(tmp_path, args):
    """A device with the wheel's `runtime` extra (no torch): torch commands say which extra, not a traceback."""
    proc = run_cli(*args, env=blocking_env(tmp_path, *TRAIN_EXTRA_MODULES), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"hne-edge {args[0]} needs torch" in lines[0] and "pip install 'hne_edge-0.1.0-py3-none-any.whl[train]'" in lines[0], lines[0]
    assert not list(tmp_path.glob("runs*")), "nothing may be written by a command that cannot run"


def test_cli_errors_name_flags_not_python_arguments(tiny_bundle, work, tmp_path):
    """Issue 20 item 7: CLI errors said `pass fallback_to_cpu=True`, `force=True`, `device='cpu'`,
    `use runner.preprocess`: arguments a shell user cannot pass."""
    python_words = ("=True", "device='", "runner.", "fallback_to_cpu", "astype")
    np.save(work / "nhwc.npy", np.zeros((1, 16, 16, 3), np.float32))
    np.save(work / "f64.npy", np.zeros((1, 3, 16, 16), np.float64))
    cases = [
        (("export", str(tiny_bundle.checkpoint_path), "--out", str(work / "b")), "pass --force to replace it"),
        (("run", str(work / "b"), str(work / "nhwc.npy")), "NHWC? save the frames as uint8 images (N,H,W,C)"),
        (("run", str(work / "b"), str(work / "f64.npy")), "save the frames as uint8 images (N,H,W,C), which the command"),
        (("run", str(work / "b"), str(work / "frames.npz"), "--device", "cpu", "--cuda-graph", "on"), "--device cuda"),
        (("train", "--out", str(tmp_path / "none"), "--resume"), "start the run without --resume"),
    ]
    for args, fragment in cases:
        err = one_line_error(run_cli(*args), fragment)
        assert not any(word in err for word in python_words), err


def test_errors_name_the_flags_typed_and_the_config_keys_written(work, tmp_path):
    """Issue 28: errors named Python parameters and config keys (budget_ms, data.limit) where the user had typed
    flags, and --min-leaves stated two ranges (0..16 at 17, >= 1 at 0)."""
    b, frames = str(work / "b"), str(work / "frames.npz")
    one_line_error(run_cli("run", b, frames, "--budget-ms", "-1"), "--budget-ms: received -1.0; expected a positive finite")
    for value in ("0", "17"):
        one_line_error(run_cli("run", b, frames, "--min-leaves", value), f"--min-leaves: received {value}; expected an int in 1..16")
    one_line_error(run_cli("run", b, frames, "--min-leaves", "5", "--max-leaves", "3"),
                   "--min-leaves: received 5 with --max-leaves=3; expected --min-leaves <= --max-leaves")
    one_line_error(run_cli("train", "--limit", "0", "--out", str(tmp_path / "r")), "--limit: received 0; expected a positive")
    one_line_error(run_cli("train", "--lr", "-1", "--out", str(tmp_path / "r")), "--lr: received -1.0")
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  limit: 0\n")  # written in a file: the error names the file's key
    one_line_error(run_cli("train", "--config", str(config), "--out", str(tmp_path / "r")), "data.limit: received 0")
    assert not (tmp_path / "r").exists()


def test_a_file_for_a_bundle_and_a_missing_variant_say_which_export_makes_them(tiny_bundle, work):
    """Issue 28: a checkpoint passed as a bundle said "Directory '...' is a file"; a missing plan or precision named
    what the bundle has, not the `export --plan/--precision` that adds it (and keeps what it has)."""
    ckpt, b, frames = str(tiny_bundle.checkpoint_path), str(work / "b"), str(work / "frames.npz")
    for args in (("run", ckpt, frames), ("verify", ckpt), ("inspect", ckpt), ("bench", ckpt), ("profile", ckpt)):
        one_line_error(run_cli(*args), f"{ckpt}: received a file (a checkpoint?); expected a bundle folder; export the "
                       f"checkpoint to one first: hne-edge export {ckpt} --out BUNDLE")  # fmt: skip
    one_line_error(run_cli("run", str(work / "b" / "manifest.json"), frames), "received one file of a bundle",
                   "pass the folder that holds manifest.json")  # fmt: skip
    one_line_error(run_cli("run", b, frames, "--precision", "fp16"),
                   "bundle has no onnx/fp16/segments model files; it has onnx/fp32/nodes, onnx/fp32/segments",
                   "export it again with it: hne-edge export CHECKPOINT --out BUNDLE --plan nodes,segments "
                   "--precision fp32,fp16 --force")  # fmt: skip
    one_line_error(run_cli("run", b, frames, "--plan", "mixed"), "bundle has no onnx/fp32/subtrees model files",
                   "--plan nodes,segments,subtrees --precision fp32 --force")  # fmt: skip


def test_verify_takes_tolerances_and_inputs_as_polygraphy_users_expect(tiny_bundle, work):
    """Issue 28: users from trtexec/Polygraphy pass --atol/--rtol and their own input file or a seed."""
    b, ckpt, frames = str(work / "b"), str(tiny_bundle.checkpoint_path), str(work / "frames.npz")
    proc = run_cli("verify", b, "--checkpoint", ckpt, "--frames", frames, "--atol", "1", "--quiet", check=True)
    assert "note: inputs: 4 given images (one batch)" in proc.stdout and "bounds: fp32 1 + 0 x |ref| per element" in proc.stdout
    proc = run_cli("verify", b, "--checkpoint", ckpt, "--frames", frames, "--quiet", check=True)  # no --atol/--rtol
    assert "note: inputs: 4 given images (one batch)" in proc.stdout and "bounds:" not in proc.stdout, proc.stdout
    err = one_line_error(run_cli("verify", b, "--checkpoint", ckpt, "--seed", "5", "--atol", "1e-12", "--quiet"),
                         "bundle verification failed: ", "exceeds the bound 1e-12", after_progress=True)  # fmt: skip
    assert "max abs difference" in err
    proc = run_cli("verify", b, "--seed", "5", "--rtol", "0.5", "--quiet", check=True)
    # issue 42: per element, as numpy.allclose and Polygraphy (was times the output's largest |reference|)
    assert "standard-normal images (seed 5)" in proc.stdout and "fp32 0.0001 + 0.5 x |ref| per element" in proc.stdout
    one_line_error(run_cli("verify", b, "--frames", frames, "--batch-sizes", "1"), "pass --batch-sizes or --frames, not both")
    one_line_error(run_cli("verify", b, "--atol", "nan"), "--atol")


def test_a_machine_without_a_gpu_is_not_told_to_install_gpu_packages(work):
    from hne_edge.runtime.backends.cuda import no_gpu_here

    if no_gpu_here() is None:
        pytest.skip("this machine may have an NVIDIA GPU (a driver device node exists)")
    for backend in ("onnxruntime", "torch"):
        err = one_line_error(run_cli("run", str(work / "b"), str(work / "frames.npz"), "--backend", backend,
                                      "--device", "cuda"), "this machine has no NVIDIA GPU", "--device cpu")  # fmt: skip
        assert "install" not in err and "onnxruntime-gpu" not in err and "fallback_to_cpu" not in err, err


def test_python_warnings_are_one_warning_line_in_every_command(tiny_bundle, tmp_path):
    """Issue 42: outside `run`, a runtime warning printed Python's two lines ("path.py:315: UserWarning: ..." and the
    source line that warned) in the middle of the command's output. Every command prints it in the CLI's voice."""
    bundle = shutil.copytree(tiny_bundle.bundle_dir, tmp_path / "b")
    (bundle / "profiles").mkdir()
    (bundle / "profiles" / "cpu-onnxruntime-segments-fp32.json").write_text("{not json")
    proc = run_cli("bench", str(bundle), "--warmup", "0", "--repeats", "1", "--out", str(tmp_path / "bench"), "--quiet",
                   "--device", "cpu", check=True)  # fmt: skip  (the cpu- profile is the one read)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("warning: ignoring saved profile ") and "fp32.json: not valid JSON (" in line, proc.stderr
    assert "UserWarning" not in proc.stderr and "warnings.warn" not in proc.stderr


def test_errors_name_the_flag_typed_for_threads_precision_batch_and_plan(tiny_bundle, work, tmp_path):
    """Issue 42: `run --threads 99` said "threads: received 99", `export --precision fp8` "precision must be ...",
    `export --batch-range 4:2:1` "batch must be ...": the library's names, not the flags the user typed."""
    b, frames, ckpt = str(work / "b"), str(work / "frames.npz"), str(tiny_bundle.checkpoint_path)
    for command in (("run", b, frames), ("bench", b, "--out", str(tmp_path / "bench")), ("profile", b),
                    ("bench-streams", b)):  # fmt: skip
        one_line_error(run_cli(*command, "--threads", "99"), "Error: --threads: received 99; expected an int in 1..")
    out = str(tmp_path / "never")
    for args, fragment in ((("--precision", "fp8"), "Error: --precision must be one or more of ['fp32', 'fp16']; "
                                                    "received 'fp8'"),
                           (("--batch-range", "4:2:1"), "Error: --batch-range must be MIN:OPT:MAX"),
                           (("--batch", "4:2:1"), "Error: --batch must be MIN:OPT:MAX"),  # the old spelling, typed
                           (("--plan", "trees"), "Error: --plan must be one or more of")):  # fmt: skip
        one_line_error(run_cli("export", ckpt, "--out", out, *args), fragment)
    assert not (tmp_path / "never").exists()


def test_eval_given_a_bundle_says_it_takes_a_checkpoint_and_what_runs_a_bundle(tiny_bundle, work, tmp_path):
    """Issue 42: `eval BUNDLE` said only "File '...' is a directory"."""
    b = str(work / "b")
    one_line_error(run_cli("eval", b), f"{b}: received a bundle folder; expected a checkpoint file",
                   "hne-edge eval takes the checkpoint the bundle was exported from", f"hne-edge bench {b} --frames",
                   f"hne-edge verify {b}")  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_bundle.checkpoint_path, run / "checkpoint.pt")  # a training run's folder: its checkpoint named
    one_line_error(run_cli("eval", str(run)), f"{run}: received a folder; expected a checkpoint file",
                   f"pass {run / 'checkpoint.pt'}")  # fmt: skip


def test_tensorrt_on_a_machine_without_a_gpu_is_not_told_to_install_tensorrt(tiny_bundle, work, tmp_path):
    """Issue 42: `--backend tensorrt` (and `export --format tensorrt`) on a machine without an NVIDIA driver said to
    pip install TensorRT and run on a machine with a GPU; installing cannot help there."""
    from hne_edge.runtime.backends.cuda import no_gpu_here

    if no_gpu_here() is None:
        pytest.skip("this machine may have an NVIDIA GPU (a driver device node exists)")
    for args in (("run", str(work / "b"), str(work / "frames.npz"), "--backend", "tensorrt"),
                 ("bench", str(work / "b"), "--backend", "tensorrt", "--out", str(tmp_path / "bench")),
                 ("export", str(tiny_bundle.checkpoint_path), "--format", "tensorrt", "--out", str(tmp_path / "t"))):  # fmt: skip
        # export has no --backend: it was told to pass one; it exports the ONNX bundle here instead
        instead = "--format onnx" if args[0] == "export" else "--backend onnxruntime"
        err = one_line_error(run_cli(*args), "TensorRT runs on an NVIDIA GPU, and this machine has no NVIDIA GPU",
                             instead)  # fmt: skip
        assert "install" not in err and "whl" not in err and (args[0] != "export" or "--backend" not in err), err
    assert not (tmp_path / "t").exists() and not (tmp_path / "bench").exists()


def test_verify_frames_past_the_batch_range_say_once_which_were_used(work, tmp_path):
    """Issue 42: `verify --frames` with more images than the bundle's largest batch printed "inputs: the first 8 of
    the 20 given images" and then "inputs: 8 given images (one batch)"."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "f20.npz", x=rng.integers(0, 256, (20, 16, 16, 3), dtype=np.uint8), y=rng.integers(0, 10, 20))
    proc = run_cli("verify", str(work / "b"), "--frames", str(tmp_path / "f20.npz"), "--quiet", check=True)
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: inputs")]
    assert notes == ["note: inputs: the first 8 of the 20 given images (one batch: the bundle's largest)"], proc.stdout


def _closed_after_one_line(args, stderr) -> tuple[int, str]:
    """`hne-edge ARGS | head -1`: the reader takes one line of stdout and goes away; (exit status, stderr)."""
    import os
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "hne_edge", *args], stdout=subprocess.PIPE, stderr=stderr,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(timeout=300)
    finally:
        proc.kill()
    assert first, err
    return proc.returncode, err


def test_a_reader_that_goes_away_ends_the_command_quietly(work, tmp_path):
    """`hne-edge run B FRAMES | head -1` printed `Error: Broken pipe` and exited 2 (a user error), and
    `hne-edge train 2>&1 | head -1` exited 1 (a bug's status) with no run folder. The shell's convention: a quiet
    exit, 141 (128 + SIGPIPE); and training stops as on Ctrl-C, its resumable checkpoint saved where it stood."""
    import subprocess

    import torch

    rng = np.random.default_rng(0)  # more lines than a pipe holds: run is still printing when the reader goes
    np.savez(tmp_path / "many.npz", x=rng.integers(0, 256, (2000, 16, 16, 3), dtype=np.uint8), y=np.zeros(2000, int))
    status, err = _closed_after_one_line(["run", str(work / "b"), str(tmp_path / "many.npz"), "--max-leaves", "1",
                                          "--device", "cpu"], subprocess.PIPE)  # fmt: skip
    assert (status, err) == (141, ""), (status, err)

    out = tmp_path / "run"
    status, _ = _closed_after_one_line(["train", "--out", str(out), "--epochs", "200", "--threads", "1", "--device",
                                        "cpu"], subprocess.STDOUT)  # fmt: skip
    assert status == 141
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 0 and state["extra"]["step"] >= 1  # resumable, in its first epoch
