"""Anytime evaluation: accuracy, NLL, calibration and diversity for every ensemble size.

The anytime model after ``n`` leaves predicts with the mean of the first
``n`` leaves' logits (depth-first order, :func:`~hne_edge.train.losses.ensemble_logits`).
For each ``n = 1..N`` we report

* ``accuracy``: top-1 of the sub-ensemble;
* ``nll``: mean negative log-likelihood of the true class under softmax(sub-ensemble logits);
* ``ece``: expected calibration error, 15 equal-width confidence bins (Guo et al., 2017);
* ``diversity``: the paper's measure, the standard deviation of the ``n`` members'
  logits (population std over members), averaged over classes and samples (0 for n = 1);
* ``macs``: multiply-accumulates of the first ``n`` leaves, shared nodes once (``tree_cost``);

and the accuracy of each individual leaf. :func:`evaluate_checkpoint`
writes ``metrics.json`` and three PNGs in the style of the paper's figures.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, InputError
from ..fileio import atomic_write_json, check_outputs, json_record, sealed_png, staged_output
from ..plots import METRICS_FIGURES, plot_metrics  # its home is hne_edge.plots; importable from here as before
from ..progress import NULL_PROGRESS, Progress
from .losses import ensemble_logits

__all__ = [
    "accuracy",
    "negative_log_likelihood",
    "expected_calibration_error",
    "logit_diversity",
    "anytime_metrics",
    "chance_note",
    "predict",
    "evaluate",
    "evaluate_checkpoint",
    "write_metrics",
    "plot_metrics",
    "METRICS_FORMAT",
]

METRICS_FORMAT = "hne-edge-metrics"  # metrics.json's "format": a file that says it is ours to replace (fileio)


CHANCE_SE = 3  # accuracy "at chance": within this many standard errors of guessing


def chance_note(accuracy: float, images: int, num_classes: int, split: str = "validation") -> str | None:
    """What to say when ``accuracy`` on ``images`` images is at chance (None when it is not).

    The rule: the accuracy is below chance (1 / classes) plus three standard errors of a classifier that
    guesses, on that many images, i.e. not distinguishable from guessing.
    """
    if not images or num_classes < 2:
        return None
    chance = 1.0 / num_classes
    se = math.sqrt(chance * (1 - chance) / images)
    if accuracy >= chance + CHANCE_SE * se:
        return None
    # "within" only where it is: an accuracy far below chance (7.2 % of 10 classes on 5,000 images) is no better
    where = "within" if accuracy > chance - CHANCE_SE * se else "below"
    return (f"the model is at chance: the full ensemble's {split} accuracy {accuracy:.1%} is not above guessing among "
            f"{num_classes} classes ({chance:.1%}) by {CHANCE_SE} standard errors (±{se:.1%} on {images} images; "
            f"{where} them); it has not learned yet: train longer (--epochs) or on more images (--limit), try another "
            "--lr, or check the labels")


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of ``(M, classes)`` logits."""
    return (logits.argmax(-1) == labels).double().mean().item()


def negative_log_likelihood(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean ``-log softmax(logits)[label]``."""
    return F.cross_entropy(logits.double(), labels).item()


def expected_calibration_error(logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """ECE: sum over confidence bins ``(k/n_bins, (k+1)/n_bins]`` of ``|bin| / M * |accuracy - mean confidence|``."""
    probs = F.softmax(logits.double(), dim=-1)
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).double()
    # bin k holds confidences in (k/n, (k+1)/n]; ceil(c*n)-1 puts c exactly on an edge in the lower bin
    bins = (torch.ceil(confidence * n_bins).long() - 1).clamp(0, n_bins - 1)
    ece = torch.zeros((), dtype=torch.float64)
    for k in range(n_bins):
        mask = bins == k
        if mask.any():
            ece += mask.double().mean() * (correct[mask].mean() - confidence[mask].mean()).abs()
    return ece.item()


def logit_diversity(member_logits: torch.Tensor) -> float:
    """Std of the members' logits ``(M, n, classes)`` across members, averaged over classes and samples."""
    return member_logits.double().std(dim=1, correction=0).mean().item()


def anytime_metrics(logits: torch.Tensor, labels: torch.Tensor, macs: list[int] | tuple[int, ...] | None = None,
                    n_bins: int = 15) -> dict[str, Any]:
    """Per-n and per-leaf metrics of leaf logits ``(M, N, classes)``; ``macs[n-1]`` is the cost of n leaves."""
    if logits.dim() != 3 or labels.shape != (logits.shape[0],):
        raise InputError(f"logits must be (M, N, classes) and labels (M,); received {tuple(logits.shape)} and {tuple(labels.shape)}")
    n_leaves = logits.shape[1]
    anytime = []
    for n in range(1, n_leaves + 1):
        ens = ensemble_logits(logits, n)
        row = {
            "n": n,
            "accuracy": accuracy(ens, labels),
            "nll": negative_log_likelihood(ens, labels),
            "ece": expected_calibration_error(ens, labels, n_bins),
            "diversity": logit_diversity(logits[:, :n]),
        }
        if macs is not None:
            row["macs"] = int(macs[n - 1])
        anytime.append(row)
    leaves = [{"leaf": i, "accuracy": accuracy(logits[:, i], labels)} for i in range(n_leaves)]
    return {"num_images": int(logits.shape[0]), "num_leaves": n_leaves, "ece_bins": n_bins, "anytime": anytime, "leaves": leaves}


def evaluate_checkpoint(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    split: str = "val",
    test_data: str | os.PathLike | None = None,
    data: dict[str, Any] | None = None,
    batch_size: int = 256,
    device: str = "auto",
    plots: bool = True,
    progress: "Progress | None" = None,
    predictions: dict[str, Any] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Evaluate a training checkpoint on its validation split (or the test set) for every n.

    Args:
        path: a checkpoint written by ``hne-edge train``.
        out_dir: where ``metrics.json`` and the PNGs go (default: the checkpoint's folder).
        split: ``val`` (the run's seeded hold-out, rebuilt from its config) or ``test``
            (cifar10/100 official test set, imagefolder ``val/``). Ignored with ``test_data``.
        test_data: an ``.npz`` of held-out images in the training format (``x`` N,H,W,C uint8,
            ``y`` N, optional ``classes``) to evaluate on instead; normalised as the run was.
        data: overrides of the run's data config (e.g. ``{"data_dir": ...}`` when the data moved).
        batch_size: evaluation batch size.
        device: auto, cpu or cuda.
        plots: write the PNGs.
        progress: counts the images as they are evaluated (:func:`hne_edge.progress.progress_for`); None: silent.
        predictions: a dict that receives the evaluated ``logits`` (M, N, classes) and ``labels`` (M,), for a caller
            that computes more from them (the demo's paired standard errors) without a second pass.
        force: replace a ``metrics.json`` or a figure in ``out_dir`` that hne-edge did not write. Without it, only
            a ``metrics.json`` that says ``"format": "hne-edge-metrics"`` and figures that carry hne-edge's seal
            (:func:`~hne_edge.fileio.sealed_png`) are replaced, and anything else is refused before the evaluation.

    Returns the metrics dict that is written to ``metrics.json``.
    """
    from .checkpoint import model_from_checkpoint  # noqa: PLC0415
    from .config import DataConfig, TrainConfig, merge  # noqa: PLC0415
    from .data import BatchLoader, load_data  # noqa: PLC0415

    if split not in ("val", "test"):
        raise InputError(f"split: received {split!r}; expected val or test")
    path = Path(path)
    out = _check_out(Path(out_dir) if out_dir is not None else path.parent, plots, force)
    model, state = model_from_checkpoint(path)
    if test_data is not None:
        return _evaluate_on(model, state, path, test_data, out, batch_size, device, plots, progress, predictions, force)
    stored = state.get("config")
    if not stored and not data:
        raise CheckpointError(f"{path} records no training config, so its validation split cannot be rebuilt",
                              hint="pass data={'name': ..., 'data_dir': ...}, or evaluate on test_data=PATH.npz",
                              cli_hint="evaluate on your own images with --test-data PATH.npz")  # fmt: skip
    seed = int(stored.get("seed", 0)) if stored else 0
    data_cfg = DataConfig(**merge((stored or {}).get("data", {}), data or {}))
    if stored:
        TrainConfig.from_dict({**stored, "data": data_cfg.__dict__})  # validate the stored config as a whole
    bundle = load_data(data_cfg, seed=seed, split="test" if split == "test" else "train")
    if bundle.val is None:
        raise InputError(f"the run held out no validation images (data.val_split={data_cfg.val_split})",
                         hint="use split='test', evaluate on your own images with test_data=PATH.npz, or set val_split",
                         cli_hint="use --split test, or evaluate on your own images with --test-data PATH.npz")
    cfg = model.config
    size = bundle.input_size if not bundle.folder else cfg.input_size  # folders are resized to the model's
    if (len(bundle.class_names), bundle.in_chans, size) != (cfg.num_classes, cfg.in_chans, cfg.input_size):
        raise InputError(
            f"data ({data_cfg.name}: {len(bundle.class_names)} classes, {bundle.in_chans} channels, {size}x{size} "
            f"images) does not match the checkpoint's model ({cfg.num_classes} classes, {cfg.in_chans} channels, "
            f"{cfg.input_size}x{cfg.input_size})"
        )
    differ = bundle.not_the_images_of(state) if split == "val" else None  # the test set is not drawn from them
    if differ:
        raise InputError(f"data ({dataset_name(data_cfg)}): the images are not those this checkpoint was trained on "
                         f"(sha256 {differ[0]}, the run's {differ[1]}), so its validation split "
                         "would be another draw, partly of training images; expected the run's data",
                         hint="score other images with test_data=PATH.npz",
                         cli_hint="score other images with --test-data PATH.npz")  # fmt: skip
    trained = state.get("class_names")
    if trained and list(bundle.class_names) != list(trained):  # as many, named otherwise: scored against other classes
        raise InputError(f"data ({data_cfg.name}): class names {_names(bundle.class_names)} differ from the checkpoint's "
                         f"{_names(trained)}; expected the data the checkpoint was trained on")  # fmt: skip
    if bundle.folder:
        loader = bundle.eval_loader(bundle.val, batch_size, data_cfg.num_workers)
    else:  # the checkpoint's normalisation is the one the weights were trained with
        norm = state["normalization"]
        loader = BatchLoader(bundle.val, batch_size, mean=norm["mean"], std=norm["std"])
    return _measure(model, state, path, loader, {"data": data_cfg.name, "dataset": dataset_name(data_cfg), "split": split},
                    out, device, plots, progress, predictions, force)  # fmt: skip


def dataset_name(data_cfg: Any) -> str:
    """What the data is called in metrics.json and the plots' titles: "npz" says how the images were stored, not what
    they are, so a file or folder is named by itself (cifar10_train.npz)."""
    if data_cfg.name in ("npz", "imagefolder") and data_cfg.data_dir:
        return Path(data_cfg.data_dir).name
    return data_cfg.name


def _outputs(plots: bool) -> dict[str, Any]:
    """What an evaluation writes into its folder, each with the rule that says a file of that name is its own."""
    return {"metrics.json": json_record(METRICS_FORMAT), **(dict.fromkeys(METRICS_FIGURES, sealed_png) if plots else {})}


def _check_out(out: Path, plots: bool, force: bool) -> Path:
    """``out``, once nothing there of the names an evaluation writes is the user's (checked again at the move, in
    :func:`write_metrics`)."""
    return check_outputs(out, _outputs(plots), force=force)


def _evaluate_on(model, state, path: Path, test_data, out_dir, batch_size: int, device: str, plots: bool,
                 progress: "Progress | None", predictions: dict[str, Any] | None = None, force: bool = False
                 ) -> dict[str, Any]:  # fmt: skip
    """Metrics of the checkpoint's model on the images of ``test_data`` (an .npz), checked against the model first."""
    from .data import BatchLoader, load_npz  # noqa: PLC0415

    dataset, classes = load_npz(test_data)
    cfg = model.config
    shape = tuple(dataset.images.shape[1:])
    if shape != (cfg.in_chans, cfg.input_size, cfg.input_size):
        raise InputError(
            f"--test-data {test_data}: images are {shape[1]}x{shape[2]} with {shape[0]} channel(s); "
            f"the checkpoint's model expects {cfg.input_size}x{cfg.input_size} with {cfg.in_chans}"
        )
    top = int(dataset.labels.max())
    if top >= cfg.num_classes:
        raise InputError(f"--test-data {test_data}: labels go up to {top}; the checkpoint's model has {cfg.num_classes} classes (0..{cfg.num_classes - 1})")
    dataset = _labelled_as_the_checkpoint(dataset, classes, state.get("class_names"), test_data)
    norm = state["normalization"]
    loader = BatchLoader(dataset, batch_size, mean=norm["mean"], std=norm["std"])
    return _measure(model, state, path, loader, {"data": str(test_data), "dataset": Path(test_data).name,
                                                 "split": "test-data"}, out_dir, device, plots, progress,
                    predictions, force)  # fmt: skip


def _labelled_as_the_checkpoint(dataset, classes: list[str], trained, test_data):
    """``dataset`` with its labels numbering the checkpoint's classes: a file that names its classes (``classes``)
    labels by those names, each of which must be the checkpoint's - a file of fives and sevens labelled 0 / 1 is
    scored against the "five" and "seven" outputs; a file without names numbers the model's outputs."""
    import numpy as np  # noqa: PLC0415

    with np.load(test_data, allow_pickle=False) as archive:  # read once already (load_npz): not a new failure
        named = "classes" in archive.files
    if not trained or not named:
        return dataset
    index = {name: i for i, name in enumerate(trained)}
    unknown = [name for name in classes if name not in index]
    if unknown:
        raise InputError(f"--test-data {test_data}: class names {_names(unknown)} are not among the checkpoint's "
                         f"{_names(trained)}; expected each class the file names to be one the model was trained on")  # fmt: skip
    to_model = torch.tensor([index[name] for name in classes])
    return type(dataset)(dataset.images, to_model[dataset.labels])


def _names(names) -> str:
    """A list of class names for a message: the first 12 and how many."""
    names = list(names)
    more = f", ... ({len(names)} classes)" if len(names) > 12 else ""
    return "[" + ", ".join(repr(n) for n in names[:12]) + more + "]"


def _measure(model, state, path: Path, loader, source: dict[str, str], out_dir, device: str, plots: bool,
             progress: "Progress | None", predictions: dict[str, Any] | None = None, force: bool = False
             ) -> dict[str, Any]:  # fmt: skip
    """Predict ``loader`` with PyTorch and write ``metrics.json`` (+ plots, :func:`write_metrics`)."""
    from .device import torch_device  # noqa: PLC0415

    dev = torch_device(device)
    # channels-last: 1.4x the CPU throughput of NCHW for hne_resnet_small's depthwise-separable blocks (CPU time
    # per 128 images, 1 thread: 5.3-5.8 s against 7.3-8.6 s; the logits within 4e-6), and what training uses on CUDA
    model = model.to(dev, memory_format=torch.channels_last)
    if progress is not None:  # the rate counts from here; a first line at once (loading took a while already)
        progress.restart(len(loader.dataset), "eval", "image")
        progress.set(note=f"{source['data']} {source['split']} on {dev}")
    logits, labels = predict(model, loader, dev, channels_last=True, progress=progress)
    if predictions is not None:
        predictions.update(logits=logits, labels=labels)
    return write_metrics(model.cpu(), state, path, logits, labels, {**source, "evaluated_with": f"torch on {dev}"},
                         out_dir, plots, force=force)  # fmt: skip


def write_metrics(model: nn.Module, state: dict[str, Any], path: str | os.PathLike, logits: torch.Tensor,
                  labels: torch.Tensor, source: dict[str, str], out_dir: str | os.PathLike | None,
                  plots: bool = True, cost: Any = None, force: bool = False) -> dict[str, Any]:
    """The metrics of leaf logits ``(M, N, classes)`` of checkpoint ``path``'s model (CPU) on ``labels``, written to
    ``out_dir/metrics.json`` (+ the PNGs; default folder: the checkpoint's): what every evaluation writes, whatever
    ran the model.

    ``source`` says what was evaluated and how (``data``, ``dataset``, ``split``, ``evaluated_with``: the demo's
    evaluation runs the exported bundle on ONNX Runtime, 10x less CPU time than PyTorch's for hne_resnet_small).
    ``cost``: the model's :func:`~hne_edge.models.tree_cost` when the caller has it (9 s for hne_resnet_small at load 11).
    The record says ``"format": "hne-edge-metrics"`` and the figures carry hne-edge's seal, so the next evaluation
    may replace them; a file of these names in ``out_dir`` that hne-edge did not write (or that was changed since)
    stays, and the evaluation is refused in one line naming it (:func:`~hne_edge.fileio.refuse_foreign`), unless
    ``force`` (a file or a link; never a folder).
    """
    from ..models import tree_cost  # noqa: PLC0415

    from .config import upgrade_config  # noqa: PLC0415

    path = Path(path)
    stored = upgrade_config(state["config"]) if state.get("config") else None  # a 0.1 run: its weighting
    cost = tree_cost(model) if cost is None else cost
    metrics = anytime_metrics(logits, labels, cost.prefix_macs)
    for row, leaf_id, path_macs in zip(metrics["leaves"], model.tree.leaf_order, cost.path_macs):
        row["id"], row["path_macs"] = leaf_id, int(path_macs)
    metrics = {
        "format": METRICS_FORMAT,
        "checkpoint": str(path),
        "model": model.config.name,
        "num_classes": model.config.num_classes,
        "branching": list(model.tree.branching),
        "loss": (stored or {}).get("loss", {}).get("kind"),
        "weighting": (stored or {}).get("loss", {}).get("weighting"),
        "normalize": (stored or {}).get("loss", {}).get("normalize"),
        **source,
        "epoch": state.get("epoch"),
        "mac_convention": "1 multiply-add = 1 MAC (FLOPs in the anytime-inference literature)",
        "diversity_definition": "std of the n members' logits across members (population), mean over classes and samples",
        **metrics,
    }
    out = Path(out_dir) if out_dir is not None else path.parent
    with staged_output(out, "--out", ours=_outputs(plots), force=force) as stage:  # a failure (a full disk)
        # leaves nothing, not even a new empty folder; a user's file that appeared meanwhile stays
        atomic_write_json(stage / "metrics.json", metrics, allow_nan=True)
        written = plot_metrics(metrics, stage) if plots else None
    if written is not None:
        metrics["plots"] = [str(out / p.relative_to(stage)) for p in written]
    return metrics


# -- the training loop's validation, and the predictions every evaluation reads ------------------------


@torch.no_grad()
def predict(model: nn.Module, loader, device: torch.device = torch.device("cpu"), channels_last: bool = False,
            progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All leaf logits ``(M, N, classes)`` (float32, CPU) and labels ``(M,)`` of ``loader``.

    ``progress`` counts images (its total is set here when it has none).
    """
    from ..runtime.backends.torch_cuda import Fp32Policy  # noqa: PLC0415

    progress = progress or NULL_PROGRESS
    if progress.total is None:
        progress.total = _num_images(loader)
    model.eval()
    outs, labels = [], []
    # fp32 means fp32: torch's default runs CUDA convolutions in TF32 (10-bit mantissas), which moves a near-tie
    # image's answer between a GPU's evaluation and a CPU's; the runtime's torch backend turns it off the same way
    with Fp32Policy(torch, allow_tf32=False, cudnn_benchmark=None, matmul=True):
        for x, y in loader:
            x = x.to(device)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            outs.append(model(x).float().cpu())
            labels.append(y.cpu())  # a device-resident loader yields CUDA labels; the logits are on the CPU
            progress.update(len(y))
    return torch.cat(outs), torch.cat(labels)


def _num_images(loader) -> int | None:
    dataset = getattr(loader, "dataset", None)
    return len(dataset) if dataset is not None else None


def evaluate(model: nn.Module, loader, device: torch.device = torch.device("cpu"), channels_last: bool = False,
             progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy of every anytime ensemble n = 1..N, and the full ensemble's NLL."""
    logits, labels = predict(model, loader, device, channels_last, progress)
    n_leaves = logits.shape[1]
    acc_n = [(ensemble_logits(logits, n).argmax(-1) == labels).float().mean().item() for n in range(1, n_leaves + 1)]
    nll = torch.nn.functional.cross_entropy(ensemble_logits(logits, n_leaves), labels).item()
    return {"acc": acc_n[-1], "acc_first": acc_n[0], "acc_n": acc_n, "nll": nll, "images": int(labels.shape[0])}
