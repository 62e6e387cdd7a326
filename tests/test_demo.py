"""`hne-edge demo` end to end, through the CLI as `make demo` runs it."""

from __future__ import annotations

import json
import os
import re
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_cli
from hne_edge.demo import REFERENCE, pretrained_checkpoint

# a demo run from a folder elsewhere must still import this checkout's package
_HERE = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.xdist_group("digits_demo")
@pytest.mark.timeout(7200)  # the shared `make demo` (up to 3600 s) runs inside the first of them
@pytest.mark.slow
def test_demo_end_to_end(digits_demo, tmp_path):
    # the default demo (--data auto) where ../shared/data/cifar10_train.npz does not exist: digits, hne-edge off the
    # PATH (conftest's digits_demo: `make demo` in a fresh clone, also what test_quickstart.py goes on from)
    proc, out = digits_demo.proc, digits_demo.root / "runs" / "demo"  # the default --out, relative to where it ran
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "data: scikit-learn digits, because ../shared/data/cifar10_train.npz is not here" in text
    for step in range(1, 7):
        assert f"[{step}/6" in text
    assert "checks passed" in text
    # the table: one row per budget, the unbudgeted row evaluates every leaf
    unbudgeted = [line for line in text.splitlines() if line.strip().startswith("none ")]
    assert len(unbudgeted) == 1 and " 16.00 " in unbudgeted[0], text
    summary = json.loads((out / "demo.json").read_text())
    rows = summary["budgets"]
    assert rows[-1]["budget_ms"] is None and rows[-1]["mean_leaves"] == 16 and rows[-1]["misses"] == 0
    leaves = [r["mean_leaves"] for r in rows[1:-1]]
    assert leaves[0] <= leaves[-1]  # a larger budget never buys fewer leaves on average (same frames)
    assert rows[-1]["accuracy"] > 0.8  # digits is easy: a trained HNE is well above chance (10%)
    # the ensemble-size line (n, accuracy ± SE, paired gain) agrees with the evaluation's metrics.json
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    by_n = {m["n"]: m["accuracy"] for m in metrics["anytime"]}
    sizes = summary["by_ensemble_size"]
    assert [r["n"] for r in sizes] == [1, 2, 4, 8, 16] and all(r["images"] == 180 for r in sizes)
    for r in sizes:
        assert r["accuracy"] == pytest.approx(by_n[r["n"]], abs=1e-6)
        assert r["gain"] == pytest.approx(by_n[r["n"]] - by_n[1], abs=1e-6)
    line = re.search(r"validation accuracy by ensemble size \(180 images, ± one standard error\): (.*)", text)
    assert line and "n=1: " in line.group(1) and "n=16: " in line.group(1), text
    assert re.search(r"n=16 vs n=1: [+-]\d+\.\d points ± \d+\.\d \(paired, same images\)", text), text
    for name in ("metrics.json", "tree.png", "anytime_budget.png"):
        assert (out / "eval" / name).is_file()
    assert (out / "bundle" / "manifest.json").is_file() and (out / "train" / "checkpoint.pt").is_file()
    assert "next:" in text and "hne-edge inspect" in text
    # hne-edge is not on this PATH (make demo does not activate .venv): the demo says how to reach it (issue 20)
    scripts = Path(sysconfig.get_path("scripts"))
    if (scripts / "hne-edge").exists():
        reach = f"hne-edge is in {scripts}/, not on your PATH"
        assert reach in text.split("next:")[1], text[-2000:]
    _the_next_commands_run_as_printed(text, digits_demo)
    # a second run replaces its own folder; a foreign folder is refused with exit 2 and left alone
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    proc = run_cli("demo", "--data", "digits", "--out", str(foreign))
    assert proc.returncode == 2 and "was not written by hne-edge demo" in proc.stderr
    assert (foreign / "keep.txt").read_text() == "x"


def test_auto_data_follows_the_convention_path(tmp_path):
    from hne_edge.demo import CIFAR10_NPZ, choose_data

    project = tmp_path / "project"
    project.mkdir()
    data, data_dir, note = choose_data("auto", None, cwd=project)
    assert (data, data_dir) == ("digits", None) and "is not here" in note
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "cifar10_train.npz").write_bytes(b"")
    data, data_dir, note = choose_data("auto", None, cwd=project)
    assert (data, data_dir) == ("npz", CIFAR10_NPZ) and "CIFAR-10" in note
    assert choose_data("digits", None, cwd=project) == ("digits", None, None)  # explicit: no guessing, no note


def test_data_dir_without_an_explicit_dataset_is_a_usage_error(tmp_path):
    proc = run_cli("demo", "--data-dir", "x.npz", "--out", str(tmp_path / "d"))
    assert proc.returncode == 2 and "--data-dir needs --data npz" in proc.stderr
    assert not (tmp_path / "d").exists()


def test_another_cifar_file_is_refused_before_anything_is_written(tmp_path):
    # the shipped checkpoint's hold-out is a seeded split of ITS file; on other images it could hold training images
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "shared" / "data" / "cifar10_train.npz",
             x=rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8), y=np.arange(40) % 10)
    proc = run_cli("demo", "--quiet", cwd=project, env=_HERE)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    shipped = pretrained_checkpoint("auto").name  # the reference where it is shipped, else the tiny one
    assert f"not the file {shipped} was trained on" in proc.stderr and "--data npz" in proc.stderr
    assert not (project / "runs").exists()


def test_ensemble_rows_against_hand_counts():
    import torch

    from hne_edge.demo import ensemble_rows

    # 4 images, 2 leaves, 2 classes; label 0 everywhere. Leaf 0 is right on images 0, 1; the mean of both
    # leaves is right on images 0, 1, 2 (leaf 1 outvotes leaf 0 on image 2) and wrong on image 3.
    leaf0 = torch.tensor([[2.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    leaf1 = torch.tensor([[2.0, 0.0], [2.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    logits, labels = torch.stack([leaf0, leaf1], 1), torch.zeros(4, dtype=torch.long)
    one, two = ensemble_rows(logits, labels, sizes=(1, 2, 4))  # 4 > N leaves: left out
    assert one["accuracy"] == 0.5 and one["se"] == pytest.approx((0.5 * 0.5 / 4) ** 0.5)
    assert two["accuracy"] == 0.75 and two["se"] == pytest.approx((0.75 * 0.25 / 4) ** 0.5)
    # per-image differences 0, 0, 1, 0: mean 0.25, sample std 0.5, standard error 0.5 / 2
    assert two["gain"] == 0.25 and two["gain_se"] == pytest.approx(0.25)
    assert one["gain"] == 0 and one["gain_se"] == 0


def test_the_shipped_checkpoint_matches_its_record_and_config():
    import yaml

    from hne_edge.demo import PRETRAINED, pretrained_record
    from hne_edge.train import load_checkpoint
    from hne_edge.train.config import TrainConfig

    state = load_checkpoint(PRETRAINED)
    record = pretrained_record()
    assert PRETRAINED.stat().st_size < 2_000_000  # "a few MB" at most
    assert state["config"] == record["config"] and state["epoch"] == record["epochs"] == state["config"]["optim"]["epochs"]
    assert not state.get("optimizer")  # weights only: nothing to resume, nothing to select
    # the YAML beside it is the config it was trained with (apart from where the run and the data were)
    shipped = TrainConfig.from_file(PRETRAINED.with_suffix(".yaml"), {"data": {"data_dir": state["config"]["data"]["data_dir"]}})
    moved = {"out", "quiet"}
    trained = TrainConfig.from_dict(state["config"]).to_dict()  # as today's code reads it: fields added since at
    assert {k: v for k, v in shipped.to_dict().items() if k not in moved} == {  # their defaults, removed ones dropped
        k: v for k, v in trained.items() if k not in moved}
    assert "hne-edge train --config hne_edge/assets/cifar10_demo.yaml" in record["command"]
    assert yaml.safe_load(PRETRAINED.with_suffix(".yaml").read_text())["preset"] == "cifar"


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["tiny", "reference"])
def test_the_shipped_checkpoint_scores_what_its_record_says(shared_cifar10, choice):
    """On the real file: the held-out figures in the record are what the checkpoint scores (an independent pass)."""
    import torch

    from hne_edge.demo import pretrained_checkpoint, pretrained_record
    from hne_edge.train import model_from_checkpoint
    from hne_edge.train.data import load_npz, split_indices

    if choice == "reference" and not REFERENCE.is_file():
        pytest.skip(f"this checkout ships no {REFERENCE.name}")
    checkpoint = pretrained_checkpoint(choice)
    record = pretrained_record(checkpoint)
    model, state = model_from_checkpoint(checkpoint)
    full, _ = load_npz(shared_cifar10)
    cfg = state["config"]["data"]
    _, val = split_indices(len(full), cfg["val_split"], state["config"]["seed"], cfg["limit"],
                           holdout=cfg.get("holdout", "random"))  # the reference holds out the file's last 10 %
    x = full.images[val].float().div(255)
    mean, std = (torch.tensor(state["normalization"][k]).view(1, -1, 1, 1) for k in ("mean", "std"))
    with torch.no_grad():
        logits = torch.cat([model.eval()((b - mean) / std) for b in x.split(500)])  # (M, N, classes)
    labels = full.labels[val]
    for row in record["held_out"]:
        mean_logits = logits[:, : row["n"]].mean(1)  # the anytime prediction: mean of the first n leaves' logits
        # within 3 of 5,000 images: a near-tie may fall the other way on another CPU's float rounding
        assert (mean_logits.argmax(-1) == labels).double().mean().item() == pytest.approx(row["accuracy"], abs=3 / len(val))


@pytest.mark.slow
def test_default_demo_on_cifar_uses_the_shipped_checkpoint(tmp_path, shared_cifar10):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", str(out), "--num-frames", "40", "--quiet", timeout=900)  # cwd: the repo, beside ../shared
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "data: CIFAR-10 from ../shared/data/cifar10_train.npz" in text
    first_step = next(line for line in text.splitlines() if line.startswith("[1/6"))
    assert f"using the checkpoint shipped with hne-edge ({pretrained_checkpoint('auto').name})" in first_step
    summary = json.loads((out / "demo.json").read_text())
    assert [r["images"] for r in summary["by_ensemble_size"]] == [5000] * 5
    assert "validation accuracy by ensemble size (5000 images" in text
    assert not (out / "train").exists()  # nothing was trained


def test_demo_says_how_to_reach_hne_edge_when_it_is_not_on_path(tmp_path, monkeypatch):
    # issue 20: after `make demo`, `hne-edge` was "command not found": it lives in .venv/bin, off the PATH
    from hne_edge.demo import how_to_run_hne_edge

    scripts = Path(sysconfig.get_path("scripts"))
    if not (scripts / "hne-edge").exists():
        pytest.skip(f"hne-edge is not installed as a script in {scripts} (package not pip-installed here)")
    monkeypatch.setenv("PATH", str(tmp_path))  # the scripts folder is not on it
    project = scripts.parent.parent  # e.g. the checkout that holds .venv/bin
    rel = os.path.relpath(scripts, project)
    hint = how_to_run_hne_edge(cwd=project)
    if (scripts / "activate").is_file():
        assert f"source {rel}/activate" in hint and f"{rel}/hne-edge" in hint, hint
    else:
        assert f"{rel}/hne-edge" in hint, hint
    assert str(scripts) in how_to_run_hne_edge(cwd=tmp_path)  # from elsewhere: the absolute path
    monkeypatch.setenv("PATH", os.pathsep.join([str(scripts), str(tmp_path)]))  # activated: nothing to say
    assert how_to_run_hne_edge(cwd=project) is None


def test_the_forced_column_counts_budgets_shorter_than_the_first_leaf_not_preemptions(tmp_path):
    """Reproduces issue 20 item 9: 2 "forced" misses at a 2.663 ms budget when the first leaf takes 0.103 ms.

    A virtual clock: leaf 0 costs 3 ms (3 nodes of 1 ms); one frame is pre-empted for 7 ms inside it."""
    from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle

    from hne_edge.bundle import read_manifest
    from hne_edge.demo import budget_sweep, format_budget_table
    from hne_edge.runtime import AnytimeRunner

    bundle = make_fake_bundle(tmp_path / "b")
    frame = {"i": 0}

    def cost(node, batch):
        return 0.001 + (0.007 if node == "b0.0" and frame["i"] == 25 else 0.0)

    manifest = read_manifest(bundle)
    runner = AnytimeRunner(bundle, backend=FakeBackend(manifest.tree, manifest.num_classes, cost), load_profile=False,
                           warmup=0)  # fmt: skip
    x = np.random.default_rng(0).standard_normal((40, C, H, W)).astype(np.float32)
    for _ in range(10):  # the runner learns the leaves' costs
        runner.run(x[:1])

    class Counting:  # the sweep's frames, counted so that frame 25 of the first budget is the stalled one
        def __getattr__(self, name):
            return getattr(runner, name)

        def run(self, *args, **kwargs):
            frame["i"] += 1
            return runner.run(*args, **kwargs)

    rows = budget_sweep(Counting(), x, np.zeros(40, np.int64), [5.0, 2.0])
    fits, short = rows
    assert (fits["misses"], fits["forced_misses"]) == (1, 0)  # the stall: a miss, not a forced one
    assert (short["misses"], short["forced_misses"]) == (40, 40)  # shorter than the first leaf: every frame forced
    assert ("budget was shorter than the first leaf (which always runs) takes 9 times in 10 as the runner measured it"
            in format_budget_table(rows))


def test_pretrained_choices_name_what_is_shipped(tmp_path):
    from hne_edge.demo import PRETRAINED, REFERENCE, pretrained_checkpoint

    assert pretrained_checkpoint("tiny") == PRETRAINED
    assert pretrained_checkpoint("auto") == (REFERENCE if REFERENCE.is_file() else PRETRAINED)
    if not REFERENCE.is_file():
        with pytest.raises(ValueError, match="ships no cifar10_reference.pt"):
            pretrained_checkpoint("reference")
    with pytest.raises(ValueError, match=r"--pretrained: received '.*nope.pt'; expected auto, reference, tiny or a "):
        pretrained_checkpoint(str(tmp_path / "nope.pt"))
    proc = run_cli("demo", "--pretrained", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "d"))
    assert proc.returncode == 2 and "--pretrained: received" in proc.stderr and not (tmp_path / "d").exists()


def test_an_install_without_the_demo_checkpoints_says_where_they_are(tmp_path, monkeypatch):
    """Issue 42: the wheel carried the 2.96 MB reference checkpoint (and the 0.24 MB tiny one) to runtime-only devices,
    which never load torch weights; it leaves them out now. A demo where they are absent (an install from the wheel,
    with the train extra) says so in one line before it writes anything, and the digits demo still runs there."""
    import hne_edge.demo as demo
    from hne_edge.errors import InputError

    assets = tmp_path / "site-packages" / "hne_edge" / "assets"  # what the wheel installs: the records, no weights
    assets.mkdir(parents=True)
    for name in ("cifar10_reference", "cifar10_demo"):
        (assets / f"{name}.json").write_text((demo.ASSETS / f"{name}.json").read_text())
    monkeypatch.setattr(demo, "REFERENCE", assets / "cifar10_reference.pt")
    monkeypatch.setattr(demo, "PRETRAINED", assets / "cifar10_demo.pt")
    (tmp_path / "shared" / "data").mkdir(parents=True)  # ../shared/data/cifar10_train.npz beside where the demo runs
    (tmp_path / "shared" / "data" / "cifar10_train.npz").write_bytes(b"")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    for choice in ("auto", "reference", "tiny"):
        with pytest.raises(InputError) as caught:
            demo.run_demo(tmp_path / "work" / "demo", pretrained=choice, echo=lambda line: None)
        message = str(caught.value)
        assert "is not in this install: the wheel leaves the demo's checkpoints out" in message, message
        assert "make demo" in message and "--epochs N" in message, message
        assert not (tmp_path / "work" / "demo").exists()
    assert demo.choose_data("auto", None, tmp_path / "nowhere")[0] == "digits"  # which trains: no checkpoint needed
    assert demo.pretrained_checkpoint("auto") == demo.PRETRAINED  # and --pretrained auto is no error there


@pytest.mark.slow
def test_the_demo_evaluates_the_validation_images_once_through_the_bundle(tmp_path, monkeypatch):
    """Reproduces issue 28: the demo's step 5 ("profiling") spent 55 of its 57 s evaluating the whole validation
    set a second time, for the ensemble table that step 2's evaluation had measured already. Issue 42: that one
    PyTorch pass was most of `make demo` with the reference (61 of 88 s idle, 7.5 of 9.5 minutes at load 12-20); the
    demo evaluates through the verified bundle on ONNX Runtime (a tenth of the CPU time), and says so."""
    import hne_edge.train.evaluation as evaluation
    from hne_edge.demo import run_demo
    from hne_edge.train import model_from_checkpoint
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.data import BatchLoader, load_data

    passes = []
    predict = evaluation.predict

    def counting(model, loader, *args, **kwargs):
        passes.append(len(loader.dataset))
        return predict(model, loader, *args, **kwargs)

    monkeypatch.setattr(evaluation, "predict", counting)
    lines: list[str] = []
    result = run_demo(tmp_path / "demo", data="digits", epochs=1, limit=64, frames=10, quiet=True, echo=lines.append)
    assert passes == [180], passes  # fit's validation of its last epoch; the demo's evaluation is not PyTorch's
    assert result.metrics["num_images"] == 180
    assert result.metrics["evaluated_with"].startswith("ONNX Runtime on the CPU, fp32")
    assert json.loads((tmp_path / "demo" / "eval" / "metrics.json").read_text())["evaluated_with"].endswith(
        str(tmp_path / "demo" / "bundle"))
    step = next(line for line in lines if line.startswith("[4/6"))
    assert "on the 180 validation images through the verified bundle (ONNX Runtime on the CPU" in step, lines
    table = next(line for line in lines if line.startswith("validation accuracy by ensemble size"))
    assert "(180 images" in table
    # the bundle's accuracy is PyTorch's: the verified files give the same answers on every image, every n
    model, state = model_from_checkpoint(result.checkpoint)
    val = load_data(TrainConfig.from_dict(state["config"]).data, seed=state["config"]["seed"]).val
    norm = state["normalization"]
    logits, labels = predict(model, BatchLoader(val, 64, mean=norm["mean"], std=norm["std"]))
    for row in result.metrics["anytime"]:
        correct = (logits[:, : row["n"]].mean(1).argmax(-1) == labels).double().mean().item()
        assert row["accuracy"] == pytest.approx(correct, abs=1 / 180), row["n"]


def _the_next_commands_run_as_printed(text: str, demo) -> None:
    """Each command under "next:" runs as printed, where the demo ran (with the hne-edge and python it says to use
    while they are off the PATH). Nothing ran them: `bench --frames` died of a ZeroDivisionError in the cost model
    on a busy machine, and `python examples/...` worked only from the repository's root."""
    import shlex
    import subprocess

    lines = [line.strip() for line in text.split("next:")[1].splitlines()[1:] if line.startswith("  ")]
    hint = next((line for line in lines if line.startswith("(hne-edge is in ")), None)
    where = hint.split("hne-edge is in ")[1].split("/,")[0] if hint else None
    commands = [shlex.split(line) for line in lines if not line.startswith("(")]
    assert [c[0] for c in commands] == ["hne-edge"] * 3 + ["python"] * 2, lines
    for argv in commands:
        argv = [f"{where}/{argv[0]}" if where else argv[0], *argv[1:]]
        if "autonomous_stack.py" in argv[1]:
            argv += ["--count", "40"]  # its 300 frames at 1.5x the tree's time: the same run, shorter
        proc = subprocess.run(argv, cwd=demo.root, env=demo.env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (argv, proc.stdout[-2000:], proc.stderr[-3000:])



def test_the_examples_are_named_so_that_they_run_from_where_the_demo_ran(tmp_path):
    """The demo printed `python examples/embedded_app.py ...`, which exists only from the repository's root."""
    from hne_edge.demo import examples_folder

    assert examples_folder(REPO) == Path("examples")
    elsewhere = examples_folder(tmp_path)
    assert elsewhere.is_absolute() and (elsewhere / "embedded_app.py").is_file()


def _class_folders(root, splits: dict[str, int], size: int = 16) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in splits.items():
        for cls in ("ant", "bee"):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                image = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                Image.fromarray(image).save(root / split / cls / f"{i}.png")


def _small_batches(monkeypatch) -> None:
    """The imagenet preset's batch (256) needs 256 images: 8 here, in this process."""
    import hne_edge.demo as demo

    preset = demo._train_config

    def small(*args, **kwargs):
        config = preset(*args, **kwargs)
        config.optim.batch_size, config.data.num_workers = 8, 0
        return config

    monkeypatch.setattr(demo, "_train_config", small)


@pytest.mark.timeout(900)
def test_the_demo_on_image_folders_evaluates_val_through_the_bundle(tmp_path, monkeypatch):
    """`hne-edge demo --data imagefolder` trained, exported and verified, then died at step 4: `'ImageFolder' object
    has no attribute 'images'` (it read the validation images as an in-memory dataset's). Its frames are val/'s
    images as the evaluation sees them: resized and centre-cropped to the model's input, uint8 NHWC."""
    from hne_edge.demo import run_demo

    _class_folders(tmp_path / "data", {"train": 8, "val": 2})
    _small_batches(monkeypatch)
    result = run_demo(tmp_path / "demo", data="imagefolder", data_dir=str(tmp_path / "data"), epochs=1, quiet=True,
                      echo=lambda line: None)
    assert result.metrics["num_images"] == 4
    with np.load(tmp_path / "demo" / "frames.npz") as frames:
        assert frames["x"].shape == (4, 224, 224, 3) and frames["x"].dtype == np.uint8
        assert sorted(frames["y"].tolist()) == [0, 0, 1, 1]


def test_the_demo_on_one_image_folder_without_val_is_refused_before_training(tmp_path, monkeypatch):
    """A folder of class folders without val/: the imagenet preset holds nothing out, so the demo had nothing to
    evaluate; said before training, and nothing written."""
    from hne_edge.demo import run_demo
    from hne_edge.errors import InputError

    _class_folders(tmp_path / "data", {".": 4})
    _small_batches(monkeypatch)
    with pytest.raises(InputError, match=r"data: has no val/ folder.*expected train/ and val/"):
        run_demo(tmp_path / "demo", data="imagefolder", data_dir=str(tmp_path / "data"), epochs=1, quiet=True)
    assert not (tmp_path / "demo").exists()
