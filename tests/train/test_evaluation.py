"""Evaluation metrics against hand computations, and evaluate_checkpoint's outputs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hne_edge.train.evaluation import (
    accuracy,
    anytime_metrics,
    evaluate_checkpoint,
    expected_calibration_error,
    logit_diversity,
    negative_log_likelihood,
)

# probabilities as logits: softmax(log p) = p
PROBS = torch.tensor([[0.9, 0.05, 0.05], [0.9, 0.05, 0.05], [0.62, 0.28, 0.10], [0.52, 0.24, 0.24]], dtype=torch.float64)
LABELS = torch.tensor([0, 1, 0, 2])


def test_ece_toy_example():
    # confidences 0.9 (right), 0.9 (wrong), 0.62 (right), 0.52 (wrong); 15 bins of width 1/15:
    # 0.9 -> bin 13 (acc 0.5, conf 0.9), 0.62 -> bin 9 (acc 1), 0.52 -> bin 7 (acc 0)
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(1 - 0.62) + 1 / 4 * abs(0 - 0.52)
    assert expected_calibration_error(PROBS.log(), LABELS) == pytest.approx(expected, abs=1e-12)
    # one bin (n_bins=1): |overall accuracy - mean confidence|
    assert expected_calibration_error(PROBS.log(), LABELS, n_bins=1) == pytest.approx(abs(0.5 - (0.9 + 0.9 + 0.62 + 0.52) / 4))


def test_ece_is_zero_when_calibrated():
    probs = torch.tensor([[0.5, 0.5 - 1e-9, 1e-9]] * 4, dtype=torch.float64)  # conf 0.5, half right
    assert expected_calibration_error(probs.log(), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.0, abs=1e-8)


def test_nll_and_accuracy_by_hand():
    expected = -(math.log(0.9) + math.log(0.05) + math.log(0.62) + math.log(0.24)) / 4
    assert negative_log_likelihood(PROBS.log(), LABELS) == pytest.approx(expected, rel=1e-12)
    assert accuracy(PROBS.log(), LABELS) == 0.5


def test_diversity_by_hand():
    z = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    total = 0.0
    for m in range(3):
        for c in range(5):
            vals = [z[m, i, c].item() for i in range(4)]
            mu = sum(vals) / 4
            total += math.sqrt(sum((v - mu) ** 2 for v in vals) / 4)
    assert logit_diversity(z) == pytest.approx(total / 15, rel=1e-12)
    assert logit_diversity(z[:, :1]) == 0.0


def test_anytime_metrics_per_n_and_per_leaf():
    z = torch.randn(50, 4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.randint(0, 3, (50,), generator=torch.Generator().manual_seed(2))
    m = anytime_metrics(z, y, macs=[10, 15, 22, 27])
    assert [r["n"] for r in m["anytime"]] == [1, 2, 3, 4] and [r["macs"] for r in m["anytime"]] == [10, 15, 22, 27]
    hand_acc2 = sum(int(((z[i, 0] + z[i, 1]) / 2).argmax() == y[i]) for i in range(50)) / 50
    assert m["anytime"][1]["accuracy"] == pytest.approx(hand_acc2)
    assert m["anytime"][0]["accuracy"] == m["leaves"][0]["accuracy"]
    assert m["leaves"][3]["accuracy"] == pytest.approx(sum(int(z[i, 3].argmax() == y[i]) for i in range(50)) / 50)
    assert m["anytime"][0]["diversity"] == 0.0 and m["anytime"][3]["diversity"] > 0


def test_evaluate_checkpoint_writes_metrics_and_plots(tmp_path):
    from hne_edge.models import create_model, tree_cost
    from hne_edge.train.checkpoint import save_checkpoint
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.data import load_data

    config = TrainConfig.from_preset("digits", {"out": str(tmp_path)})
    bundle = load_data(config.data, seed=0)
    torch.manual_seed(0)
    model = create_model("hne_tiny", in_chans=1, input_size=8)
    path = save_checkpoint(tmp_path / "checkpoint.pt", model=model, class_names=bundle.class_names,
                           normalization=bundle.normalization, epoch=0, config=config.to_dict())
    metrics = evaluate_checkpoint(path, tmp_path / "eval", device="cpu")  # a GPU's kernels could flip a near-tie
    on_disk = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert on_disk["num_images"] == 180 and on_disk["num_leaves"] == 16
    assert [r["macs"] for r in on_disk["anytime"]] == list(tree_cost(model).prefix_macs)
    assert [r["id"] for r in on_disk["leaves"]] == list(model.tree.leaf_order)
    for name in ("accuracy_vs_macs.png", "diversity_vs_macs.png", "leaf_accuracy.png"):
        assert (tmp_path / "eval" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the full-ensemble accuracy, recomputed independently from the model on the validation images
    x = (bundle.val.images.float() / 255 - bundle.mean[0]) / bundle.std[0]
    with torch.no_grad():
        expected = (model.eval()(x).mean(1).argmax(-1) == bundle.val.labels).double().mean().item()
    assert metrics["anytime"][-1]["accuracy"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="expected val or test"):
        evaluate_checkpoint(path, split="train")
    with pytest.raises(ValueError, match="has no official test set.*--test-data"):
        evaluate_checkpoint(path, split="test")


def test_write_metrics_replaces_only_its_own_files_whoever_evaluated(tmp_path):
    """write_metrics is what `hne-edge eval` and the demo (its ONNX Runtime evaluation) both write with: a user's
    metrics.json or figure in its folder is refused, naming it, and left as it was; the record it writes says its
    format, so the next evaluation replaces it; force replaces the user's file."""
    from hne_edge.errors import InputError
    from hne_edge.models import create_model
    from hne_edge.train.evaluation import write_metrics

    torch.manual_seed(0)
    model = create_model("hne_tiny", in_chans=1, input_size=8)
    logits, labels = torch.randn(12, model.tree.num_leaves, 10), torch.arange(12) % 10
    source = {"data": "digits", "dataset": "digits", "split": "val", "evaluated_with": "ONNX Runtime on the CPU"}
    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text('{"mine": true}\n')
    (out / "leaf_accuracy.png").write_bytes(b"\x89PNG\r\n\x1a\nmy own figure")
    with pytest.raises(InputError, match="refusing to replace .*metrics.json.*hne-edge-metrics"):
        write_metrics(model, {}, tmp_path / "checkpoint.pt", logits, labels, source, out, plots=False)
    assert sorted(p.name for p in out.iterdir()) == ["leaf_accuracy.png", "metrics.json"]
    assert (out / "metrics.json").read_text() == '{"mine": true}\n'
    write_metrics(model, {}, tmp_path / "checkpoint.pt", logits, labels, source, out, plots=False, force=True)
    assert json.loads((out / "metrics.json").read_text())["format"] == "hne-edge-metrics"
    with pytest.raises(InputError, match="refusing to replace .*leaf_accuracy.png"):  # the figures' names too
        write_metrics(model, {}, tmp_path / "checkpoint.pt", logits, labels, source, out)
    assert (out / "leaf_accuracy.png").read_bytes().endswith(b"my own figure")
    write_metrics(model, {}, tmp_path / "checkpoint.pt", logits, labels, source, out, plots=False)  # its own record
    assert json.loads((out / "metrics.json").read_text())["evaluated_with"] == "ONNX Runtime on the CPU"


def test_predictions_run_fp32_in_fp32_and_leave_the_users_flags_as_they_were():
    """torch's default runs CUDA convolutions in TF32, so a GPU's evaluation could answer a near-tie image otherwise
    than a CPU's; inside predict fp32 is IEEE fp32 (the flags a CUDA call reads, set on any machine), and after it
    the user's settings are back."""
    from torch import nn

    from hne_edge.train.evaluation import predict

    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((conv.fp32_precision, matmul.fp32_precision))
            return x.flatten(1)[:, None, :3]

    before = (conv.fp32_precision, matmul.fp32_precision)
    try:
        conv.fp32_precision = matmul.fp32_precision = "tf32"
        loader = [(torch.zeros(2, 3, 4, 4), torch.tensor([0, 1]))]
        logits, labels = predict(Probe(), loader)
        assert seen == [("ieee", "ieee")] and logits.shape == (2, 1, 3) and labels.tolist() == [0, 1]
        assert (conv.fp32_precision, matmul.fp32_precision) == ("tf32", "tf32")
    finally:
        conv.fp32_precision, matmul.fp32_precision = before


def test_data_whose_class_names_are_not_the_checkpoints_is_refused(tmp_path):
    """The rebuilt validation split was checked for its number of classes only (``--test-data`` for their names):
    other data with as many classes - a ``--data-dir`` whose class folders differ - was scored silently."""
    from hne_edge.errors import InputError
    from hne_edge.models import create_model
    from hne_edge.train.checkpoint import save_checkpoint
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.data import load_data

    config = TrainConfig.from_preset("digits", {"out": str(tmp_path)})
    bundle = load_data(config.data, seed=0)
    names = [f"class {k}" for k in range(len(bundle.class_names))]
    assert names != bundle.class_names
    path = save_checkpoint(tmp_path / "checkpoint.pt", model=create_model("hne_tiny", in_chans=1, input_size=8),
                           class_names=names, normalization=bundle.normalization, epoch=0, config=config.to_dict())
    with pytest.raises(InputError, match=r"data \(digits\): class names \['0', .*\] differ from the checkpoint's "
                                         r"\['class 0', "):
        evaluate_checkpoint(path, tmp_path / "eval", device="cpu")
    assert not (tmp_path / "eval").exists()


# -- the images an evaluation scores (a training review) ------------------------------------------------------


def _digits(path, keep=None, labels=None, classes="names", upsample: int = 1, order_seed=None):
    """The digits as an npz (conftest's digits_npz); ``classes``: "names" (zero..nine), a list, or None (no key)."""
    from conftest import digits_npz

    return digits_npz(path, keep=keep, labels=labels, classes=NAMES if classes == "names" else classes,
                      upsample=upsample, order_seed=order_seed)  # fmt: skip


NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture
def named_checkpoint(tmp_path):
    """A randomized hne_tiny for the 8x8 digits, its classes named zero..nine, with its training config (npz)."""
    from conftest import randomize_

    from hne_edge.models import create_model
    from hne_edge.train.checkpoint import save_checkpoint
    from hne_edge.train.config import TrainConfig

    torch.manual_seed(0)
    data = _digits(tmp_path / "digits.npz")
    config = TrainConfig.from_preset("digits", {"out": str(tmp_path / "run"), "data": {"name": "npz",
                                                                                       "data_dir": str(data)}})  # fmt: skip
    model = randomize_(create_model("hne_tiny", in_chans=1, input_size=8))
    return save_checkpoint(tmp_path / "checkpoint.pt", model=model, class_names=NAMES, epoch=0,
                           normalization={"mean": [0.5], "std": [0.25]}, config=config.to_dict())  # fmt: skip


def test_test_data_naming_some_of_the_classes_is_scored_by_name(tmp_path, named_checkpoint):
    """`--test-data` with fewer classes than the model skipped the names check: a file of fives and sevens labelled
    0 / 1 (classes ["five", "seven"]) was scored against the model's "zero" and "one" outputs. Labels now mean the
    file's names, scored against the model's outputs of those names; a file without names numbers the model's."""
    from hne_edge.errors import InputError

    def nll(data, out):
        metrics = evaluate_checkpoint(named_checkpoint, tmp_path / out, test_data=data, device="cpu", plots=False)
        return [m["nll"] for m in metrics["anytime"]]

    by_digit = nll(_digits(tmp_path / "full.npz", keep=[5, 7]), "full")
    assert nll(_digits(tmp_path / "sub.npz", keep=[5, 7], labels=[0, 1], classes=["five", "seven"]), "sub") == \
        pytest.approx(by_digit, rel=1e-6)  # fmt: skip
    assert nll(_digits(tmp_path / "bare.npz", keep=[5, 7], classes=None), "bare") == pytest.approx(by_digit, rel=1e-6)
    nll(_digits(tmp_path / "all_bare.npz", classes=None), "all_bare")  # ten unnamed classes: the model's, not "0".."9"
    with pytest.raises(InputError, match=r"class names \['eleven'\] .* not among the checkpoint's"):
        nll(_digits(tmp_path / "odd.npz", keep=[5, 7], labels=[0, 1], classes=["five", "eleven"]), "odd")


@pytest.mark.parametrize("other", ["the same images in another order", "the images at twice the size"])
def test_the_validation_split_of_other_images_is_refused(tmp_path, named_checkpoint, other):
    """`eval --data-dir` rebuilt the hold-out from any file: the same images in another order drew another
    hold-out, partly of training images (23 of 180); 16x16 images ran through a model built for 8x8 (a training
    review). A checkpoint records its images' sha256 (an older one: at least their size is checked)."""
    from hne_edge.errors import InputError
    from hne_edge.train.checkpoint import model_from_checkpoint, save_checkpoint
    from hne_edge.train.data import load_npz

    model, state = model_from_checkpoint(named_checkpoint)
    recorded = save_checkpoint(tmp_path / "recorded.pt", model=model, class_names=NAMES, epoch=0,
                               normalization=state["normalization"], config=state["config"],
                               extra={"data": load_npz(tmp_path / "digits.npz")[0].fingerprint()})  # fmt: skip
    moved = _digits(tmp_path / "moved.npz", order_seed=1) if other.startswith("the same") else \
        _digits(tmp_path / "moved.npz", upsample=2)  # fmt: skip
    evaluate_checkpoint(recorded, tmp_path / "right", device="cpu", plots=False)  # the run's own file: scored
    refused = r"not those this checkpoint was trained on.*test_data=PATH.npz" if other.startswith("the same") else \
        r"16x16 images\) does not match the checkpoint's model \(10 classes, 1 channels, 8x8\)"  # fmt: skip
    with pytest.raises(InputError, match=refused):
        evaluate_checkpoint(recorded, tmp_path / "e1", data={"data_dir": str(moved)}, device="cpu", plots=False)
    if not other.startswith("the same"):  # without the record (an older checkpoint): the size still tells
        with pytest.raises(InputError, match=refused):
            evaluate_checkpoint(named_checkpoint, tmp_path / "e2", data={"data_dir": str(moved)}, device="cpu",
                                plots=False)  # fmt: skip
    assert not (tmp_path / "e1").exists() and not (tmp_path / "e2").exists()


def test_the_official_test_set_is_scored_whole_whatever_the_runs_val_limit(monkeypatch):
    """`--val-limit` caps the validation hold-out a run scores each epoch; `eval --split test` took the first
    val_limit images of the official test set too (50 of 2,000 in the review's stand-in), silently."""
    from hne_edge.train import data as data_module
    from hne_edge.train.config import DataConfig

    def fake_cifar(cfg, train):
        n = 300 if train else 200
        return data_module.ArrayDataset(torch.zeros(n, 3, 32, 32, dtype=torch.uint8), torch.arange(n) % 10), \
            [str(k) for k in range(10)]  # fmt: skip

    monkeypatch.setattr(data_module, "_load_cifar", fake_cifar)
    cfg = DataConfig(name="cifar10", val_split=0.1, val_limit=20)
    assert len(data_module.load_data(cfg, seed=0).val) == 20  # the run's hold-out: capped
    assert len(data_module.load_data(cfg, seed=0, split="test").val) == 200  # the official test set: whole
