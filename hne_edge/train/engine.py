"""The training loop: plain functions ``train_one_epoch``, ``evaluate`` and ``fit``.

``fit(config)`` trains the fused model (one grouped network for the whole
tree: the fastest path, see ``benchmarks/results/train_step.md``) and
writes into ``config.out``:

* ``checkpoint.pt``: the last epoch (model, optimizer, scheduler, epoch, config, tree,
  class names, normalisation, RNG states, history); written atomically after every epoch.
  There is no separate "best" checkpoint: the paper reports the final model, and
  selecting on the validation split would bias the numbers reported on it.
* ``train_log.json``: per-epoch metrics and every step's loss.
* ``config.yaml``: the resolved config (written with the first checkpoint).

and nothing else (:data:`RUN_LAYOUT`). A run starts only in a new or empty
folder, and resumes only a folder holding its checkpoint
(:func:`check_run_folder`): a user's files are never overwritten.

Resuming (``fit(config, resume=True)``) restores everything the next epoch
depends on (weights, optimizer momentum, scheduler, RNG states; shuffling and
augmentation are seeded by (seed, epoch) alone), so on CPU an interrupted and
resumed run ends with the same weights, bit for bit, as an uninterrupted one.

Distributed: under ``torchrun`` (``WORLD_SIZE`` > 1) the model is wrapped in
DistributedDataParallel (gloo on CPU, NCCL on CUDA). Every process draws the
same global batch of ``optim.batch_size`` and trains on its slice, so the
update equals one process with ``accum_steps = world_size`` micro-batches.
BatchNorm statistics stay per process (as in the paper's recipes).
"""

from __future__ import annotations

import bisect
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError, HNEError, InputError
from ..fileio import atomic_write_json, atomic_write_text, check_output_dir, is_scratch
from ..limits import cpu_count, free_cpus_threads, load_average
from ..models import HNE, create_model, tree_cost
from ..models.layers import set_pointwise
from ..progress import NULL_PROGRESS, Progress, format_duration, progress_for
from .checkpoint import load_resumable, save_checkpoint, torch_bytes, unusable_reason
from .config import LossConfig, ModelSpec, OptimConfig, TrainConfig, resolve_for_device, upgrade_config
from .data import DataBundle, load_data
from .evaluation import chance_note
from .losses import ensemble_logits, hne_loss

__all__ = ["FitResult", "TrainingDiverged", "train_step", "train_one_epoch", "evaluate", "fit", "build_model_for_data",
           "make_optimizer", "amp_dtype_for", "plan_steps", "capture_rng_state", "restore_rng_state", "check_run_folder",
           "RUN_LAYOUT"]

CHECKPOINT_NAME = "checkpoint.pt"
LOG_NAME = "train_log.json"
CONFIG_NAME = "config.yaml"
RUN_LAYOUT = {CHECKPOINT_NAME: "file", LOG_NAME: "file", CONFIG_NAME: "file"}  # what a run writes into its folder
# Fields that may differ between an interrupted run and its resumption without changing the result.
_RESUME_FREE = {"quiet", "threads", "out", "device", "eval_every", "compile"}
FAST_MODEL = "hne_tiny"  # the zoo's cheapest model: what a run that would take hours is pointed to


class TrainingDiverged(HNEError, ArithmeticError):
    """The loss or the weights became NaN/Inf: training stopped, the last finite checkpoint was kept."""


@dataclass
class FitResult:
    """What :func:`fit` produced."""

    out_dir: Path
    checkpoint: Path
    log: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the run's end says about it (e.g. it ended at chance)
    budget: dict[str, Any] | None = None  # a time budget's plan (:class:`_TimeBudget`), as the checkpoint records it

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}


# -- pieces ---------------------------------------------------------------
def build_model_for_data(spec: ModelSpec, bundle: DataBundle) -> HNE:
    """The zoo model with ``num_classes``, ``in_chans`` and ``input_size`` taken from the data.

    An explicit override that contradicts the data is an error naming both.
    """
    overrides = dict(spec.overrides)
    from_data = {"num_classes": len(bundle.class_names), "in_chans": bundle.in_chans, "input_size": bundle.input_size}
    for key, value in from_data.items():
        if key in overrides and overrides[key] != value:
            raise InputError(
                f"model.overrides.{key}={overrides[key]!r} contradicts the data ({key}={value}); "
                f"remove the override or use matching data"
            )
        overrides[key] = value
    return create_model(spec.name, **overrides)


def capture_rng_state() -> dict[str, Any]:
    """torch, python and numpy RNG states as tensors / plain lists (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _Schedule:
    """LR multiplier per iteration: an optional linear warm-up, then 1. cosine from 1 to 0; 2. step x0.1 at
    50%/75%; 3. constant.

    The warm-up rises from ``warmup_start`` (the unscaled learning rate over the scaled peak: see
    :attr:`~.config.OptimConfig.warmup_start`) to 1 over ``warmup_steps``; the schedule then runs over the steps
    after it. Without a warm-up it is the paper's schedule over all ``total_steps``. A class (not a lambda) so
    the scheduler's state_dict records it as plain data, a time budget's fixed step count included.
    """

    def __init__(self, kind: str, total_steps: int, warmup_steps: int = 0, warmup_start: float = 1.0) -> None:
        self.kind, self.total_steps = kind, max(1, total_steps)
        self.warmup_steps, self.warmup_start = warmup_steps, warmup_start

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:  # 1. from the unscaled rate up to the peak
            return self.warmup_start + (1.0 - self.warmup_start) * step / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(step - self.warmup_steps, span) / span  # 2. progress through the schedule proper, 0..1
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * t))
        if self.kind == "step":
            return 0.1 ** ((t >= 0.5) + (t >= 0.75))
        return 1.0

    def fit_to(self, total_steps: int, steps_per_epoch: int, warmup_epochs: float) -> "_Schedule":
        """Set the run's length (and with it the warm-up: ``warmup_epochs``, at most a tenth of the steps)."""
        self.total_steps = max(1, total_steps)
        scaled = self.warmup_start < 1.0
        self.warmup_steps = min(round(warmup_epochs * steps_per_epoch), self.total_steps // 10) if scaled else 0
        return self


def torch_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu`` or ``cuda[:i]`` as a torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device: received {name!r}; no CUDA device is available (use cpu or auto)")
    return torch.device(name)


_TORCH_THREADS = torch.get_num_threads()  # torch's own default (one per physical core), before anyone changes it


def use_free_cpus() -> str | None:
    """Give torch its default threads, or fewer when other processes keep the CPUs busy
    (:func:`hne_edge.limits.free_cpus_threads`); when fewer, say so (``"1 torch thread (load average 16.8 on 2
    CPUs; --threads N to choose)"``), else None."""
    threads, why = free_cpus_threads(_TORCH_THREADS)
    torch.set_num_threads(threads)
    return f"{threads} torch thread{'s' if threads > 1 else ''} ({why}; --threads N to choose)" if why else None


def _amp_dtype(config: TrainConfig) -> torch.dtype | None:
    """The CUDA autocast dtype: ``auto`` is bfloat16 where the GPU supports it (no loss scaling), else float16."""
    if not config.amp:
        return None
    if config.amp_dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return getattr(torch, config.amp_dtype)


def make_optimizer(model: nn.Module, opt: OptimConfig, device: torch.device) -> torch.optim.SGD:
    """The run's SGD at :attr:`~.config.OptimConfig.peak_lr` (the schedule multiplies it); fused on CUDA (one
    kernel for every parameter's update) where this torch offers it."""
    settings = dict(lr=opt.peak_lr, momentum=opt.momentum, nesterov=opt.nesterov, weight_decay=opt.weight_decay)
    if device.type == "cuda":
        try:
            return torch.optim.SGD(model.parameters(), fused=True, **settings)
        except (RuntimeError, ValueError, TypeError):  # a torch without fused SGD for these parameters: the default
            pass
    return torch.optim.SGD(model.parameters(), **settings)


def amp_dtype_for(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype the run trains in on ``device`` (None: float32; autocast is for CUDA only)."""
    return _amp_dtype(config) if device.type == "cuda" else None


def _distributed() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def _all_mean(values: list[float], world_size: int) -> list[float]:
    if world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return (t / world_size).tolist()


# -- the loop ----------------------------------------------------------------
def train_step(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    tree,
    loss: LossConfig,
    accum_steps: int = 1,
    scaler: torch.amp.GradScaler | None = None,
    amp_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step on a batch already where ``model`` is: zero the gradients, then per micro-batch the
    forward (autocast in ``amp_dtype`` when given), the HNE loss and the backward, then the update.

    Returns the step's loss and the number of correct full-ensemble answers, both left on the device (reading
    them would wait for it). The trainer's loop and ``benchmarks/bench_train.py``'s step alone both run this.
    """
    options = {"weighting": loss.weighting, "temperature_squared": loss.temperature_squared, "normalize": loss.normalize}
    device_type = images.device.type
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=images.device)
    correct = torch.zeros((), dtype=torch.long, device=images.device)
    for k, (x, y) in enumerate(zip(images.chunk(accum_steps), labels.chunk(accum_steps))):
        # DDP: all-reduce gradients only on the last micro-batch
        sync = k == accum_steps - 1 or not hasattr(model, "no_sync")
        ctx = model.no_sync() if not sync else _null()
        with ctx:
            with torch.autocast(device_type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None):
                logits = model(x)  # (b, N, classes)
            value = hne_loss(loss.kind, logits.float(), y, tree, loss.alpha, loss.temperature, **options) / accum_steps
            (scaler.scale(value) if scaler is not None else value).backward()
        loss_sum += value.detach()
        correct += (ensemble_logits(logits.detach(), logits.shape[1]).argmax(-1) == y).sum()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return loss_sum, correct


def train_one_epoch(
    model: nn.Module,
    loader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    tree,
    loss: LossConfig,
    device: torch.device = torch.device("cpu"),
    accum_steps: int = 1,
    scaler: torch.amp.GradScaler | None = None,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    world_size: int = 1,
    progress: Progress | None = None,
    after_step: Callable[[int], bool] | None = None,
    start_step: int = 0,
) -> dict[str, Any]:
    """One pass over ``loader``; the scheduler steps every iteration.

    The step never waits for the device: losses and correct counts stay on it
    and are read back only when ``progress`` is about to show them
    (:meth:`Progress.due`: a log line every 10 s, or once a second on a
    terminal) and once for the whole epoch. ``amp_dtype`` turns on autocast
    (bfloat16 needs no ``scaler``; float16 does). ``progress`` counts one
    step per optimizer step. ``after_step(step)`` is called after each step
    (numbered within the epoch from ``start_step + 1``: the loader of a resumed
    epoch starts there); returning True ends the epoch there (an interrupted run).

    Returns mean loss, full-ensemble accuracy on the (augmented) training
    batches, throughput, every step's loss (averaged across processes), and
    the steps, images and correct answers they are over.
    """
    progress = progress or NULL_PROGRESS
    model.train()
    step_losses: list[torch.Tensor] = []
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    start = time.perf_counter()
    steps = 0
    for step, (images, labels) in enumerate(loader, start_step + 1):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if channels_last:  # a no-op for the batches of a channels-last loader
            images = images.contiguous(memory_format=torch.channels_last)
        loss_sum, right = train_step(model, images, labels, optimizer, tree=tree, loss=loss, accum_steps=accum_steps,
                                     scaler=scaler, amp_dtype=amp_dtype)  # fmt: skip
        correct += right
        seen += images.shape[0]
        if scheduler is not None:
            scheduler.step()
        step_losses.append(loss_sum)
        steps += 1
        if progress.due():  # the only host syncs in the loop: when a line (or the bar) will show them
            rate = seen * world_size / (time.perf_counter() - start)
            progress.update(**{"loss": f"{loss_sum.item():.3f}", "train acc": f"{correct.item() / seen:.1%}",
                               "img/s": f"{rate:.0f}"})  # fmt: skip
        else:
            progress.update()
        if after_step is not None and after_step(step):
            break
    losses = torch.stack(step_losses).tolist() if step_losses else []  # one sync for the epoch
    seconds = time.perf_counter() - start
    losses = _all_mean(losses, world_size) if losses else losses
    correct_n = int(correct.item())
    correct_all, seen_all = _all_mean([float(correct_n), float(seen)], world_size) if world_size > 1 else (correct_n, seen)
    return {
        "loss": float(np.mean(losses)) if losses else float("nan"),
        "acc": correct_all / max(seen_all, 1),
        "images_per_s": seen * world_size / seconds if seconds > 0 else float("nan"),
        "seconds": seconds,
        "step_losses": losses,
        "steps": steps,
        "images": int(seen_all),
        "correct": int(correct_all),
    }


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@torch.no_grad()
def predict(model: nn.Module, loader, device: torch.device = torch.device("cpu"), channels_last: bool = False,
            progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All leaf logits ``(M, N, classes)`` (float32, CPU) and labels ``(M,)`` of ``loader``.

    ``progress`` counts images (its total is set here when it has none).
    """
    progress = progress or NULL_PROGRESS
    if progress.total is None:
        progress.total = _num_images(loader)
    model.eval()
    outs, labels = [], []
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


def _config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        name = f"{prefix}{key}"
        if name in _RESUME_FREE:
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict) and key != "overrides":
            diffs += _config_diff(va, vb, f"{name}.")
        elif va != vb:
            diffs.append(f"{name} (checkpoint {va!r}, now {vb!r})")
    return diffs


def check_run_folder(out: str | os.PathLike, resume: bool = False) -> Path:
    """The folder a run may write into, or an error before anything is written.

    A new run needs a new or empty folder (a killed writer's scratch files aside): its files
    (:data:`RUN_LAYOUT`) would replace any namesakes, and a ``config.yaml`` of the user's is not
    ours to overwrite. ``resume`` needs the folder of a run (its ``checkpoint.pt``; :func:`fit`
    checks it holds the training state).
    """
    if str(out) == "":
        raise InputError("--out: received ''; expected a folder for the run (checkpoint.pt, train_log.json, config.yaml)")
    path = check_output_dir(out, "--out")
    if resume or not path.is_dir():
        return path
    if (path / CHECKPOINT_NAME).exists():
        raise FileExistsError(f"{path / CHECKPOINT_NAME} exists; pass --resume to continue it or choose another --out")
    found = next((name for name in sorted(os.listdir(path)) if not is_scratch(name, RUN_LAYOUT)), None)
    if found is not None:
        raise InputError(
            f"run folder {path} holds {found!r} and no {CHECKPOINT_NAME}: it is neither empty nor a run to resume; "
            "training would overwrite files that are not its own",
            hint="choose a new or empty folder", cli_hint="choose a new or empty --out folder (or --resume a run's)",
        )
    return path


def _check_converging(epoch: int, losses: list[float], model: nn.Module, ckpt_path: Path, lr: float) -> None:
    """Stop a diverged run before it saves: a non-finite loss in this epoch, or weights the checkpoint rule
    (:func:`~.checkpoint.unusable_reason`) refuses. The checkpoint of the last finite epoch stays."""
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    why = (f"a non-finite loss (NaN/Inf) at step {bad + 1} of {len(losses)}" if bad is not None
           else None if (reason := unusable_reason(model.state_dict())) is None else f"weights that are not usable: {reason}")  # fmt: skip
    if why is None:
        return
    kept = f"{ckpt_path} keeps epoch {epoch} (the last finite one)" if epoch > 0 and ckpt_path.exists() else "no checkpoint was written"
    raise TrainingDiverged(f"training diverged: epoch {epoch + 1} produced {why}; {kept}",
                           hint=f"lower optim.lr (received {lr:g})", cli_hint=f"lower --lr (received {lr:g})")  # fmt: skip


def fit(config: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
        stop_after_steps: int | None = None, model_source: str | None = None) -> FitResult:
    """Train ``config``; return where the checkpoint and log are.

    Progress goes to stderr (:mod:`hne_edge.progress`; ``config.quiet`` silences it): a header naming the
    model and its cost, a line every 10 s without a terminal, an estimate of the whole run's time after its
    first steps, and one line per epoch.

    Args:
        config: the run.
        resume: continue from ``config.out/checkpoint.pt`` (its config must match, apart from
            quiet/threads/device/eval_every).
        stop_after: stop after this many epochs of *this call* (a deliberate interruption:
            time-sliced jobs, and the resume test).
        stop_after_steps: stop after this many steps of this call, with a checkpoint mid-epoch (what Ctrl-C
            does; resuming from it continues the epoch exactly where it stopped).
        model_source: how the model was chosen when the user did not name it (``"the cifar preset's model
            for --data npz"``): the header says so and names a cheaper model.
    """
    started = time.perf_counter()  # a time budget counts from here
    rank, world_size, local_rank = _distributed()
    # 1. refuse before anything is written
    out = check_run_folder(config.out, resume)
    ckpt_path = out / CHECKPOINT_NAME
    device = torch_device(config.device)
    config = resolve_for_device(config, device.type)  # what depends on the device is fixed, and recorded so
    state = None
    if resume:
        state = load_resumable(ckpt_path)
        diffs = _config_diff(upgrade_config(state["config"]), config.to_dict())
        if diffs:
            raise InputError(f"--resume with a different config: {'; '.join(diffs)}")
    threads = config.threads or (min(4, os.cpu_count() or 1) if device.type == "cuda" else 0)
    if threads:  # on CUDA the CPU only feeds the GPU: a few threads, so that several runs can share one machine
        torch.set_num_threads(threads)
    busy = None if threads else use_free_cpus()  # torch's default, or fewer threads when the CPUs are busy
    if world_size > 1:
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cuda = device.type == "cuda"
    channels_last = config.channels_last and cuda
    # 2. data and model (errors here also leave nothing behind)
    bundle = load_data(config.data, seed=config.seed)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)
    model = build_model_for_data(config.model, bundle)
    cost = tree_cost(model)  # on the CPU, before the move: it runs each node on one zero image
    fast_ratio = _fast_model_ratio(config, bundle, cost.total_macs)
    model = set_pointwise(model.to(device), config.pointwise)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if cuda:  # fixed shapes (drop_last): cuDNN's measured choice of kernels pays after the first steps
        torch.backends.cudnn.benchmark = True
    tree = model.tree
    # in-memory data moves to the GPU once and is augmented there: no per-batch host work or copies
    data_device = device if cuda else None
    train_loader = bundle.train_loader(
        config.optim.batch_size, seed=config.seed, augment=config.data.augment, rank=rank, world_size=world_size,
        num_workers=config.data.num_workers, device=data_device, channels_last=channels_last,
    )
    if len(train_loader) == 0:
        raise InputError(
            f"optim.batch_size={config.optim.batch_size} is larger than the {len(bundle.train)} training images; "
            "lower --batch-size or raise --limit"
        )
    val_loader = (bundle.eval_loader(bundle.val, 256, config.data.num_workers, device=data_device, channels_last=channels_last)
                  if bundle.val is not None else None)  # fmt: skip
    ddp_model: nn.Module = model
    if world_size > 1:
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = config.optim
    optimizer = make_optimizer(model, opt, device)
    steps_per_epoch = len(train_loader)
    schedule = _Schedule(opt.schedule, 0, warmup_start=opt.warmup_start).fit_to(opt.epochs * steps_per_epoch,
                                                                               steps_per_epoch, opt.warmup_epochs)  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    amp_dtype = amp_dtype_for(config, device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None  # bfloat16 needs no loss scaling
    step_model = torch.compile(ddp_model) if config.compile else ddp_model
    history: list[dict[str, Any]] = []
    step_losses: list[float] = []
    start_epoch = start_step = 0
    partial: dict[str, float] = {}  # an epoch interrupted part-way: its correct answers, images and seconds so far
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = int(state["epoch"])
        extra = state["extra"]
        history, step_losses = list(extra.get("history", [])), list(extra.get("step_losses", []))
        start_step, partial = int(extra.get("step", 0)), dict(extra.get("partial") or {})
        if scaler is not None and extra.get("scaler"):
            scaler.load_state_dict(extra["scaler"])
        if "rng" in extra:
            restore_rng_state(extra["rng"])
    main_process = rank == 0
    done_steps = start_epoch * steps_per_epoch + start_step
    if start_step >= steps_per_epoch:
        raise CheckpointError(f"{ckpt_path}: saved at step {start_step} of an epoch of {steps_per_epoch} steps; "
                              "expected fewer (was the data or the batch size changed?)")  # fmt: skip
    budget = None
    if config.time_budget is not None:
        budget = _TimeBudget(
            config.time_budget, started, schedule, steps_per_epoch, opt.epochs, opt.warmup_epochs, config.eval_every, device,
            world_size,
            measure_eval=lambda: _validation_seconds(model, val_loader, device, channels_last),
            measure_checkpoint=lambda: _checkpoint_seconds(model, optimizer),
            fixed=state["extra"].get("budget") if state is not None else None,
        )  # fmt: skip
    total = schedule.total_steps if budget is None or budget.plan is not None else None  # a budget's: once it is fixed
    progress = progress_for(total, "train", "step", quiet=config.quiet or not main_process, initial=done_steps)

    def run_epochs() -> int:  # the epochs the schedule spans (a time budget fixes them after its first steps)
        return -(-schedule.total_steps // steps_per_epoch)

    def epoch_steps(epoch: int) -> int:  # the last epoch of a time budget's run may end part-way
        return min(steps_per_epoch, schedule.total_steps - epoch * steps_per_epoch)

    try:
        where = (f"; continuing after epoch {start_epoch}/{run_epochs()}" if not start_step else
                 f"; continuing epoch {start_epoch + 1}/{run_epochs()} after step {start_step}/{steps_per_epoch}")  # fmt: skip
        length = (f"{opt.epochs} epoch{'s' if opt.epochs > 1 else ''} of" if budget is None else
                  f"{run_epochs()} epochs (the time budget's) of" if budget.plan is not None else
                  f"as many epochs as fit in {format_duration(budget.budget_s)} (at most {opt.epochs}) of")  # fmt: skip
        progress.write(
            f"{'resuming' if state is not None else 'training'} {config.model.name} "
            f"({f'{model_source}; ' if model_source else ''}{cost.total_macs / 1e6:,.2f}M MACs per image for all "
            f"{tree.num_leaves} leaves, tree {tree.branching}"
            f"{f'; --model {FAST_MODEL}: {fast_ratio:.0f}x fewer' if model_source and fast_ratio >= 2 else ''}) "
            f"on {config.data.name}: {len(bundle.train)} train / {len(bundle.val) if bundle.val is not None else 0} "
            f"validation images, {length} {steps_per_epoch} step{'s' if steps_per_epoch > 1 else ''} "
            f"(batch {opt.batch_size}{_lr_text(opt)}); loss {config.loss.kind} ({config.loss.weighting}, normalize {config.loss.normalize}); "
            f"{device}{', ' + str(amp_dtype).replace('torch.', '') + ' autocast' if amp_dtype else ''}"
            f"{', ' + busy if busy else ''}"
            + (where if state is not None else "")
        )
        log_path = out / LOG_NAME
        interrupt = _Interrupt(enabled=world_size == 1)
        estimate = (_RunEstimate(progress, opt.epochs * steps_per_epoch - done_steps, steps_per_epoch - start_step, device,
                                 _shorter_run_advice(config.model.name, fast_ratio), on_ctrl_c=interrupt.enabled,
                                 threads=0 if device.type == "cuda" else torch.get_num_threads(), images=opt.batch_size)
                    if budget is None else None)  # fmt: skip  (a time budget says how long instead)
        steps_run = 0
        epoch = start_epoch

        def after_step(step: int) -> bool:  # True: end the epoch here
            nonlocal steps_run
            steps_run += 1
            if estimate is not None:
                estimate.after_step(step)
            if budget is not None and budget.after_step(step, epoch_steps(epoch), done_steps + steps_run):
                progress.total = schedule.total_steps
                progress.write(budget.describe())
            return (interrupt.requested or (stop_after_steps is not None and steps_run >= stop_after_steps)
                    or step >= epoch_steps(epoch))  # fmt: skip

        def save(epoch_done: int, step: int, stopping: bool = True) -> None:
            if budget is not None and budget.plan is None and stopping:  # stopped before the plan: fix it from what was measured
                budget.fix(done_steps + steps_run, collective=False)
                progress.total = schedule.total_steps
                progress.write(budget.describe())
            extra = {"history": history, "step_losses": step_losses, "rng": capture_rng_state(),
                     "scaler": scaler.state_dict() if scaler is not None else None, "world_size": world_size,
                     "step": step, "partial": partial if step else None,
                     "budget": budget.record() if budget is not None else None}  # fmt: skip
            save_checkpoint(
                ckpt_path, model=model, class_names=bundle.class_names, normalization=bundle.normalization,
                optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), epoch=epoch_done,
                config=config.to_dict(), extra=extra,
            )
            atomic_write_json(log_path, {"config": config.to_dict(), "world_size": world_size, "epochs": history,
                                         "step_losses": step_losses, "budget": extra["budget"]}, allow_nan=True)  # fmt: skip
            if not (out / CONFIG_NAME).exists():  # after the checkpoint: a run killed before leaves its folder empty
                atomic_write_text(out / CONFIG_NAME, config.to_yaml())

        epochs_run = 0
        with interrupt:
            while epoch < run_epochs():  # a time budget's plan may shorten the run while epoch 1 runs
                if stop_after is not None and epochs_run >= stop_after:
                    break
                first = start_step if epoch == start_epoch else 0
                train_loader.set_epoch(epoch, first)
                if budget is not None:
                    budget.epoch_started(validated=bool(history) and "val_acc" in history[-1])
                progress.set(note=f"epoch {epoch + 1}/{run_epochs()}")
                stats = train_one_epoch(
                    step_model, train_loader, optimizer, scheduler, tree=tree, loss=config.loss, device=device,
                    accum_steps=opt.accum_steps, scaler=scaler, amp_dtype=amp_dtype, channels_last=channels_last,
                    world_size=world_size, progress=progress, after_step=after_step, start_step=first,
                )
                _check_converging(epoch, stats["step_losses"], model, ckpt_path, opt.lr)  # before anything is saved
                step_losses += stats.pop("step_losses")
                partial = {k: partial.get(k, 0) + stats[k] for k in ("correct", "images", "seconds")} if first else {
                    k: stats[k] for k in ("correct", "images", "seconds")}  # fmt: skip
                step = first + stats["steps"]
                if step < epoch_steps(epoch):  # stopped part-way (Ctrl-C, stop_after_steps): save exactly here, then stop
                    if main_process:
                        save(epoch, step)
                        if interrupt.requested:
                            print(f"stopped in epoch {epoch + 1}/{run_epochs()} after step {step}/{steps_per_epoch}: saved "
                                  f"a resumable checkpoint {ckpt_path}; continue with --resume (same --out)",
                                  file=sys.stderr, flush=True)  # fmt: skip
                    break
                record = {"epoch": epoch + 1, "lr": optimizer.param_groups[0]["lr"],
                          "train_loss": float(np.mean(step_losses[-step:])),
                          "train_acc": partial["correct"] / max(partial["images"], 1),
                          "train_images_per_s": partial["images"] * world_size / partial["seconds"] if partial["seconds"] > 0 else float("nan"),
                          "train_seconds": partial["seconds"], "train_images": int(partial["images"])}  # fmt: skip
                partial = {}
                last = epoch + 1 == run_epochs()
                if val_loader is not None and ((epoch + 1) % config.eval_every == 0 or last):
                    progress.set(note=f"epoch {epoch + 1}/{run_epochs()}: validating {len(bundle.val)} images")
                    metrics = evaluate(model, val_loader, device, channels_last)
                    record.update({f"val_{k}": v for k, v in metrics.items()})
                history.append(record)
                epochs_run += 1
                epoch += 1
                if main_process:
                    save(epoch, 0, stopping=interrupt.requested or (stop_after is not None and epochs_run >= stop_after)
                         or (stop_after_steps is not None and steps_run >= stop_after_steps))  # fmt: skip
                    progress.write(format_epoch(record, run_epochs(), tree.num_leaves))
                if interrupt.requested:  # Ctrl-C during the epoch's last step or its validation: the epoch's checkpoint
                    print(f"stopped after epoch {epoch}/{run_epochs()}: its checkpoint {ckpt_path} is saved; continue "
                          "with --resume (same --out)", file=sys.stderr, flush=True)  # fmt: skip
                    break
    except BaseException:  # nothing more from this run: no heartbeat left printing after its error
        progress.close(final=False)
        raise
    progress.close(final=not interrupt.requested)  # stopped: the last words are where it stopped and how to go on
    if interrupt.requested:
        raise KeyboardInterrupt
    notes = [note] if main_process and (note := _final_chance_note(history, len(bundle.class_names))) else []
    if budget is not None and main_process and epoch == run_epochs():
        notes.append(budget.ending_note(time.perf_counter() - started))
    if world_size > 1:
        torch.distributed.barrier()
    return FitResult(out_dir=out, checkpoint=ckpt_path, log=log_path, history=history, notes=notes,
                     budget=budget.record() if budget is not None else None)  # fmt: skip


class _Interrupt:
    """Ctrl-C while training: finish the running step, save a resumable checkpoint there, then stop.

    A second Ctrl-C stops at once (Python's KeyboardInterrupt; the last checkpoint stays as it was). Only in
    the main thread of a single process: under DDP every rank would have to stop at the same step.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        # no Progress here: the handler may run while the main thread holds its lock
        print("\nCtrl-C: finishing this step to save a resumable checkpoint (Ctrl-C again: stop now, without it)",
              file=sys.stderr, flush=True)  # fmt: skip

    def __enter__(self) -> "_Interrupt":
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, self._previous)


def format_epoch(record: dict[str, Any], epochs: int, num_leaves: int) -> str:
    """One epoch's summary line (accuracies in percent, as everything a person reads)."""
    val = (f", val acc n=1 {record['val_acc_first']:.1%}, n={num_leaves} {record['val_acc']:.1%}"
           if "val_acc" in record else "")  # fmt: skip
    return (f"epoch {record['epoch']}/{epochs}: loss {record['train_loss']:.4f}, train acc {record['train_acc']:.1%}"
            f"{val}, {record['train_images_per_s']:.0f} img/s, {format_duration(record['train_seconds'])}")


def _final_chance_note(history: list[dict[str, Any]], num_classes: int) -> str | None:
    """:func:`chance_note` of the run's last validation (or, without one, its last epoch's training batches)."""
    if not history:
        return None
    last = history[-1]
    if "val_acc" in last:
        return chance_note(last["val_acc"], last.get("val_images", 0), num_classes, "validation")
    return chance_note(last["train_acc"], last.get("train_images", 0), num_classes, "training")


def _fast_model_ratio(config: TrainConfig, bundle: DataBundle, macs: int) -> float:
    """How many times fewer MACs per image :data:`FAST_MODEL` needs on this data than the run's model."""
    if config.model.name == FAST_MODEL:
        return 1.0
    with torch.random.fork_rng(devices=[]):  # its random weights must not move the run's RNG streams
        small = build_model_for_data(ModelSpec(FAST_MODEL), bundle)
    return macs / tree_cost(small).total_macs


def _shorter_run_advice(model: str, ratio: float) -> str:
    shorter = "fewer --epochs or a --limit on the images make a shorter run"
    if ratio >= 2:
        return f"--model {FAST_MODEL} ({ratio:.0f}x fewer MACs per image than {model}), or {shorter}"
    return shorter


class _RunEstimate:
    """Says once, when the step time is steady, how long the run takes on this device (and when that is hours,
    what makes it shorter); warns once when the machine got too busy for torch's threads.

    The first steps carry one-off costs (allocation, kernel selection, compilation, cold caches) and, on a shared
    CPU, bursts of contention: an estimate from the first 5 s said 32 min for a run of 238 s (issue 28). So the
    first step is left out, and the step time is the mean over the latest half of the steps after it, said once
    that mean is steady: the window holds :attr:`MIN_STEPS` steps or more, and the means of its :attr:`BATCHES`
    consecutive parts give it a relative standard error of at most :attr:`STEADY` (batch means: a burst of slow
    steps falls in one part and shows). A run that never settles says it after :attr:`SETTLE_S`, an epoch too
    short to tell at its end. The progress lines keep the estimate current: their rate and ETA cover the latest
    half of the elapsed time (:attr:`hne_edge.progress.Progress.rate`). A first step that alone takes 30 s is its
    own estimate (the run is long either way). Tested on a recorded trace of this machine under load
    (tests/train/test_engine.py): within 25 % of the run's time.

    Oversubscription: when the step time later grows :attr:`COLLAPSE` times over the estimate's while the load
    average is above the CPUs and torch runs several threads, it says so once with the fix (``--threads 1``).

    Args:
        steps_left: training steps left in the run; epoch_left: of them, those before the next checkpoint (the
        end of the current epoch); advice: what makes a run shorter; on_ctrl_c: Ctrl-C saves a checkpoint too;
        threads: torch's CPU threads (0: a GPU run, nothing to watch); images: per step (the global batch);
        clock, load, cpus: for tests.
    """

    MIN_STEPS = 12
    BATCHES = 4
    STEADY = 0.07
    SETTLE_S = 300.0
    COLLAPSE = 3.0

    def __init__(self, progress: Progress, steps_left: int, epoch_left: int, device: torch.device, advice: str,
                 clock: Callable[[], float] = time.perf_counter, on_ctrl_c: bool = True, threads: int = 0,
                 load: Callable[[], float | None] = load_average, cpus: int | None = None, images: int = 0) -> None:  # fmt: skip
        self.progress, self.steps_left, self.epoch_left = progress, steps_left, epoch_left
        self.device, self.advice, self.clock, self.on_ctrl_c = device, advice, clock, on_ctrl_c
        self.threads, self.load, self.cpus = threads, load, cpu_count() if cpus is None else cpus
        self.images = images  # per step (the global batch), for the warning's img/s
        self.start = clock()
        self.ends: list[float] = []  # when each step ended (the latest ones, once the estimate is said)
        self.steps = 0
        self.per_step: float | None = None  # what the estimate said
        self.said = False
        self.warned = not threads or threads < 2

    def after_step(self, step: int) -> None:
        now = self.clock()
        self.ends.append(now)
        self.steps += 1
        if not self.said:
            self._estimate(now)
        elif not self.warned:
            self._watch(now)

    def _estimate(self, now: float) -> None:
        ends, k = self.ends, self.BATCHES
        window = (self.steps - 1) // 2  # the latest half of the steps after the first (whose end is ends[0])
        if window == 0:
            if now - self.start >= 30 or self.steps == self.epoch_left:
                self.say(now - self.start, now, "the first step, start-up included")
            return
        per_step = (now - ends[-window - 1]) / window
        if window >= self.MIN_STEPS:
            size = window // k
            parts = [(ends[-1 - size * i] - ends[-1 - size * (i + 1)]) / size for i in range(k)]
            mean = sum(parts) / k
            error = (sum((p - mean) ** 2 for p in parts) / (k - 1)) ** 0.5 / mean / k**0.5 if mean > 0 else 0.0
            if error <= self.STEADY:
                return self.say(per_step, now, f"the last {window} steps")
            if now - ends[0] >= self.SETTLE_S:
                return self.say(per_step, now, f"the last {window} steps, which still vary: ±{error:.0%}")
        elif self.steps == self.epoch_left:  # a short epoch: what it has, before its checkpoint
            self.say(per_step, now, f"the last {window} step{'s' if window > 1 else ''}")

    def _watch(self, now: float) -> None:
        """Once the estimate is said: the latest :attr:`MIN_STEPS` steps and 5 s at least vs the estimate's step time."""
        ends = self.ends
        if len(ends) > 8192:  # a long run: the latest steps are enough
            del ends[:4096]
        first = min(bisect.bisect_right(ends, now - 5.0) - 1, len(ends) - 1 - self.MIN_STEPS)
        if first < 0:
            return
        per_step = (now - ends[first]) / (len(ends) - 1 - first)
        if per_step < self.COLLAPSE * self.per_step:
            return
        load = self.load()
        if load is None or load <= self.cpus:
            return
        self.warned = True
        ms = f"{self.per_step * 1e3:.3g} to {per_step * 1e3:.3g} ms a step"
        rate = f"{self.images / self.per_step:,.0f} to {self.images / per_step:,.0f} img/s ({ms})" if self.images else ms
        self.progress.write(
            f"warning: training slowed from {rate} while the load average is {load:.1f} on {self.cpus} CPU{'s' if self.cpus > 1 else ''}: torch's "
            f"{self.threads} threads wait for each other on busy cores; --threads 1 is usually several times faster "
            "on a busy machine (stop with Ctrl-C and --resume with it: BENCHMARKS.md, 'Training threads under load')")

    def say(self, per_step: float, now: float, measured: str) -> None:
        self.said, self.per_step = True, per_step
        left = per_step * max(self.steps_left - self.steps, 0)
        total = now - self.start + left
        to_checkpoint = per_step * max(self.epoch_left - self.steps, 0)
        line = (f"estimate: {format_duration(total)} for the {self.steps_left} training steps of this run on {self.device} "
                f"({format_duration(per_step)}/step over {measured}; "
                f"validation adds to it); a checkpoint is written at the end of every epoch (the next in about "
                f"{format_duration(to_checkpoint)}){' and on Ctrl-C' if self.on_ctrl_c else ''}")
        if total >= 3600:
            line += f"\n  that is hours on this {self.device.type}: {self.advice}"
        self.progress.write(line)

# -- training to a time budget (TrainConfig.time_budget) ----------------------------------------------
def _lr_text(opt: OptimConfig) -> str:
    """The header's learning rate, when the linear rule or a warm-up makes it other than ``optim.lr``."""
    if opt.peak_lr == opt.lr:
        return ""
    warm = f", warm-up from {opt.lr:g} over {opt.warmup_epochs:g} epochs" if opt.warmup_start < 1 else ""
    return f", lr {opt.peak_lr:g} = {opt.lr:g} x {opt.batch_size}/{opt.lr_batch}{warm}"


def plan_steps(*, budget_s: float, elapsed_s: float, done_steps: int, step_s: float, steps_per_epoch: int,
               max_steps: int, epoch_end_s: float, val_s: float, eval_every: int) -> int:  # fmt: skip
    """The most training steps ``T`` (``done_steps <= T <= max_steps``) whose remaining work ends inside the budget.

    The work after ``done_steps``: ``T - done_steps`` steps of ``step_s`` each, and at the end of each epoch still
    to come (the last, a partial one, included) a checkpoint of ``epoch_end_s``, plus a validation of ``val_s``
    after every ``eval_every``-th epoch and after the last. It must fit in ``budget_s - elapsed_s``. The cost
    grows with ``T``, so the answer is a binary search. A budget already spent gives ``done_steps``.
    """
    left = budget_s - elapsed_s
    done_epochs = done_steps // steps_per_epoch  # epochs whose end (checkpoint) has been written already

    def cost(total: int) -> float:
        epochs = -(-total // steps_per_epoch)
        ends = range(done_epochs + 1, epochs + 1)
        vals = sum(1 for e in ends if e % eval_every == 0 or e == epochs)
        return (total - done_steps) * step_s + len(ends) * epoch_end_s + vals * val_s

    lo, hi = done_steps, max(done_steps, max_steps)
    if cost(lo) > left:
        return lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= left:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _validation_seconds(model: nn.Module, loader, device: torch.device, channels_last: bool) -> float:
    """How long one validation of ``loader`` takes: its first batch timed (twice when that is quick or on CUDA, the
    second run warm: a first CUDA run autotunes every new shape, 50 s on an H200 for a validation that takes 1 s),
    scaled to the whole set."""
    if loader is None:
        return 0.0
    head = [next(iter(loader))]
    seconds = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        predict(model, head, device, channels_last)
        seconds = min(seconds, time.perf_counter() - t0)
        if seconds > 1.0 and device.type != "cuda":  # a slow CPU: once is measurement enough
            break
    model.train()
    return seconds * len(loader.dataset) / max(len(head[0][1]), 1)


def _checkpoint_seconds(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """How long an epoch's checkpoint takes: its serialisation timed, doubled for the write and the log."""
    t0 = time.perf_counter()
    torch_bytes({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    return 2 * (time.perf_counter() - t0) + 0.02


class _TimeBudget:
    """Fixes a run's number of steps so that it ends inside ``budget_s`` (``TrainConfig.time_budget``).

    Until the plan is fixed the schedule spans ``max_epochs``. The first steps carry one-off costs (cuDNN's
    kernel choice, allocation, compilation), so after :data:`SKIP` steps a window of training steps is timed,
    epoch ends excluded (on CUDA each stretch between two synchronisations): at least :data:`MIN_STEPS` steps and
    ``window_s`` seconds (3 % of the budget, 1 to 10 s), at most :data:`MAX_STEPS`; once :data:`RUSHED` of the
    budget is spent (steps that are slow for it), no step is skipped and one timed step is enough. An epoch end (validation,
    checkpoint, the next epoch's draws) that passed meanwhile is timed as it happened; otherwise one validation
    and one checkpoint are timed on their own. Then :func:`plan_steps` fixes the steps (a :data:`MARGIN` of
    the budget kept for the unforeseen) and the schedule is fitted to them (``_Schedule.fit_to``). The plan
    is part of the checkpoint: a resumed run keeps it. Under DDP the window is a fixed number of steps on every
    process and the smallest plan wins.
    """

    SKIP, MIN_STEPS, MAX_STEPS, MARGIN = 2, 5, 200, 0.015
    RUSHED = 0.1  # past this fraction of the budget, one timed step is enough (and no step is skipped)

    def __init__(self, budget_s: float, started: float, schedule: _Schedule, steps_per_epoch: int, max_epochs: int,
                 warmup_epochs: float, eval_every: int, device: torch.device, world_size: int, *,
                 measure_eval: Callable[[], float], measure_checkpoint: Callable[[], float],
                 fixed: dict[str, Any] | None = None, clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.budget_s, self.started, self.schedule = budget_s, started, schedule
        self.steps_per_epoch, self.max_epochs, self.eval_every = steps_per_epoch, max_epochs, eval_every
        self.warmup_epochs, self.resumed = warmup_epochs, bool(fixed)
        self.device, self.world_size, self.clock = device, world_size, clock
        self.measure_eval, self.measure_checkpoint = measure_eval, measure_checkpoint
        self.window_s = min(max(0.03 * budget_s, 1.0), 10.0)
        self.plan: dict[str, Any] | None = dict(fixed) if fixed else None
        self.seen = self.window_n = 0
        self.window_t = 0.0
        self.last: float | None = None  # the end of the last timed step of the open stretch
        self.epoch_end: float | None = None  # when the last epoch's last step ended
        self.gaps: list[tuple[float, bool]] = []  # epoch ends as they happened: (seconds, validated)

    def _now(self, sync: bool) -> float:
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.clock()

    def epoch_started(self, validated: bool = False) -> None:
        """A new epoch: the stretch of timed steps closed at the last one's end; the end itself is timed."""
        if self.plan is None and self.epoch_end is not None:
            self.gaps.append((self.clock() - self.epoch_end, validated))
        self.last = self.epoch_end = None

    def after_step(self, step: int, epoch_steps: int, done_steps: int) -> bool:
        """Time the step that just ended; True when this step fixed the plan."""
        if self.plan is not None:
            return False
        self.seen += 1
        ends_epoch = step >= epoch_steps
        rushed = self.world_size == 1 and self.clock() - self.started >= self.RUSHED * self.budget_s  # slow steps: time what there is
        skip = self.seen <= self.SKIP and not rushed
        if skip or self.last is None:  # one-off costs, or a stretch opens (synchronised)
            self.last = None if skip else self._now(sync=True)
            if ends_epoch:
                self.epoch_end = self.last = self._now(sync=True) if self.last is None else self.last
                self.last = None
            return self._fallback(done_steps)
        now = self._now(sync=ends_epoch)  # a stretch closes synchronised at the epoch's end
        self.window_t += now - self.last
        self.window_n += 1
        self.last = None if ends_epoch else now
        if ends_epoch:
            self.epoch_end = now
        if self.world_size > 1:  # every process must fix its plan at the same step
            done = self.window_n >= 20
        else:
            done = (self.window_n >= self.MIN_STEPS and self.window_t >= self.window_s) or self.window_n >= self.MAX_STEPS \
                or rushed
        if not done:
            return False
        if not ends_epoch:
            synced = self._now(sync=True)
            self.window_t += synced - now
        self.fix(done_steps)
        return True

    def _fallback(self, done_steps: int) -> bool:
        """Epochs too short to time a step in (one step each): plan from the whole run's rate after a while."""
        if self.window_n == 0 and self.seen >= self.SKIP + 20:
            self.fix(done_steps)
            return True
        return False

    def fix(self, done_steps: int, collective: bool = True) -> None:
        """Fix the plan now, from the steps timed so far (or, with none, from the whole run's rate).

        ``collective``: every DDP process calls this at the same step (False: only this one, which is stopping)."""
        elapsed = self._now(sync=True) - self.started
        step_s = self.window_t / self.window_n if self.window_n else elapsed / max(done_steps, 1)
        val_s, end_s = self.measure_eval(), self.measure_checkpoint()
        plain = [g for g, validated in self.gaps if not validated]
        with_val = [g for g, validated in self.gaps if validated]
        end_s = min(plain) if plain else end_s  # an epoch end that happened is better than an estimate
        val_s = max(min(with_val) - end_s, 0.0) if with_val else val_s
        elapsed = self.clock() - self.started
        total = plan_steps(budget_s=self.budget_s * (1 - self.MARGIN), elapsed_s=elapsed, done_steps=done_steps,
                           step_s=step_s, steps_per_epoch=self.steps_per_epoch,
                           max_steps=self.max_epochs * self.steps_per_epoch, epoch_end_s=end_s, val_s=val_s,
                           eval_every=self.eval_every)  # fmt: skip
        if self.world_size > 1 and collective:
            t = torch.tensor([total], dtype=torch.long, device=self.device if self.device.type == "cuda" else "cpu")
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
            total = int(t.item())
        self.schedule.fit_to(total, self.steps_per_epoch, self.warmup_epochs)
        self.plan = {"budget_s": self.budget_s, "total_steps": total, "epochs": total / self.steps_per_epoch,
                     "steps_per_epoch": self.steps_per_epoch, "fixed_at_step": done_steps, "fixed_at_s": round(elapsed, 3),
                     "step_s": step_s, "timed_steps": self.window_n, "validation_s": val_s, "checkpoint_s": end_s,
                     "timed_epoch_ends": len(self.gaps), "capped_by_epochs": total == self.max_epochs * self.steps_per_epoch}  # fmt: skip

    def record(self) -> dict[str, Any] | None:
        """The plan as the checkpoint and the log keep it (with the seconds used so far), or None before it is fixed."""
        if self.plan is None:
            return None
        return {**self.plan, "used_s": round(self.clock() - self.started, 3)}

    def describe(self) -> str:
        p = self.plan
        capped = f"; capped by optim.epochs={self.max_epochs}" if p["capped_by_epochs"] else ""
        return (f"time budget {format_duration(p['budget_s'])}: {p['epochs']:.1f} epochs fit ({p['total_steps']} steps of "
                f"{p['step_s'] * 1e3:.1f} ms over {p['timed_steps']} timed steps; validation ~{format_duration(p['validation_s'])}"
                f" and checkpoint ~{format_duration(p['checkpoint_s'])} per epoch{capped}); the schedule ends at step "
                f"{p['total_steps']}")  # fmt: skip

    def ending_note(self, used_s: float) -> str:
        p = self.plan or {}
        if self.resumed:
            return (f"time budget {format_duration(self.budget_s)}: the resumed run ended the schedule its first call fixed "
                    f"({p.get('epochs', 0):.2f} epochs, {p.get('total_steps')} steps)")
        return (f"time budget {format_duration(self.budget_s)}: the schedule ended after {p.get('epochs', 0):.2f} epochs "
                f"({p.get('total_steps')} steps) in {format_duration(used_s)} ({100 * used_s / self.budget_s:.1f}% of it)")
