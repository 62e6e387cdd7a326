"""The training loop: plain functions ``train_step``, ``train_one_epoch`` and ``fit``.

Its pieces live beside it, one home each: the learning-rate schedule (:mod:`.schedule`), the device, threads
and autocast (:mod:`.device`), the run's estimate (:mod:`.estimate`), a time budget's plan (:mod:`.budget`)
and the validation (``evaluate`` and ``predict``, :mod:`.evaluation`).

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

import errno
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Container

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError, HNEError, InputError, Terminated, raise_terminated
from ..fileio import atomic_write_json, atomic_write_text, check_output_dir, is_scratch, new_folders, remove_new_folders
from ..models import HNE, create_model, tree_cost
from ..models.layers import set_pointwise
from ..progress import NULL_PROGRESS, Progress, format_duration, progress_for
from .budget import _checkpoint_seconds, _TimeBudget, _validation_seconds
from .checkpoint import load_resumable, save_checkpoint, unusable_reason
from .config import (EMA_AUTO, EMA_AUTO_WINDOW, LossConfig, ModelSpec, OptimConfig, TrainConfig, ema_auto_decay,
                     resolve_for_device, upgrade_config)
from .data import DataBundle, load_data
from .device import amp_dtype_for, torch_device, use_free_cpus
from .estimate import _RunEstimate
from .evaluation import chance_note, evaluate
from .losses import ensemble_logits, hne_loss
from .schedule import _Schedule

__all__ = ["FitResult", "TrainingDiverged", "train_step", "train_one_epoch", "fit", "build_model_for_data",
           "make_optimizer", "capture_rng_state", "restore_rng_state", "check_run_folder", "RUN_LAYOUT"]

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



def _config_diff(a: dict, b: dict, prefix: str = "", free: Container[str] = ()) -> list[str]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        name = f"{prefix}{key}"
        if name in _RESUME_FREE or name in free:
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict) and key != "overrides":
            diffs += _config_diff(va, vb, f"{name}.", free)
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


class _WeightAverage(torch.optim.swa_utils.AveragedModel):
    """torch's ``AveragedModel`` (its ``module`` the average, ``n_averaged`` the updates so far, on the host) with an
    update that never waits for the device: torch's copies its host counter to the device at every update, once per
    dtype, and a blocking copy waits for the step just queued - the loop's host could no longer run ahead of the
    GPU. Floating tensors ``avg += (1 - decay) * (w - avg)``; integer buffers (BatchNorm's step counts) copied, not
    averaged (torch's truncated them); the first update copies everything."""

    def __init__(self, model: nn.Module, decay: Callable[[], float]) -> None:
        super().__init__(model, use_buffers=True)
        self._decay = decay
        # the average's tensors, floating first, split once (every update runs on the training step's path)
        averages = [*self.module.parameters(), *self.module.buffers()]
        self._floating = [i for i, a in enumerate(averages) if a.is_floating_point()]
        self._rest = [i for i, a in enumerate(averages) if not a.is_floating_point()]
        self._averages = [averages[i] for i in self._floating], [averages[i] for i in self._rest]

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        weights = [*model.parameters(), *model.buffers()]
        floating, rest = [weights[i] for i in self._floating], [weights[i] for i in self._rest]
        if int(self.n_averaged) == 0:  # a host tensor: no synchronisation
            torch._foreach_copy_(self._averages[0], floating)
        else:
            torch._foreach_lerp_(self._averages[0], floating, 1.0 - self._decay())
        if rest:  # integer buffers: copied, at the first update as at every other
            torch._foreach_copy_(self._averages[1], rest)
        self.n_averaged += 1


def _weight_average(model: nn.Module, ema: float | str | None, run_steps: Callable[[], int]) -> _WeightAverage | None:
    """``optim.ema``: an exponential moving average of ``model``'s weights and BatchNorm statistics (the first
    update copies the weights, each later one ``avg += (1 - decay) * (w - avg)``); None without it. ``auto``: the
    decay for ``run_steps()`` at each update (a time budget fixes, or shortens, the run while it trains), on the
    host."""
    if ema is None:
        return None
    return _WeightAverage(model, (lambda: ema) if ema != EMA_AUTO else (lambda: ema_auto_decay(run_steps())))


def _ema_text(ema: float | str | None) -> str:
    if ema is None:
        return ""
    decay = f"decay {ema:g}" if ema != EMA_AUTO else f"decay auto: a window of {EMA_AUTO_WINDOW:.0%} of the run's steps"
    return f", an EMA of the weights ({decay}) delivered"


def _same_images(state: dict, bundle, data) -> None:
    """A resume over the images the run started on: an npz replaced at the same path (another order is another
    hold-out and other batches; another size, another model) is refused. Runs saved before the record pass."""
    differ = bundle.not_the_images_of(state)
    if differ:
        where = data.data_dir if data.name == "npz" else f"{data.name} under {data.data_dir or 'data'}"
        raise InputError(f"--resume: the training images at {where} are not those this run started on (their sha256 "
                         f"{differ[0]}, the run's {differ[1]}); expected the same file, or a new run in another --out")  # fmt: skip


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
    made = new_folders(out)  # removed again if the run fails before it saved anything there (a full disk)
    ckpt_path = out / CHECKPOINT_NAME
    device = torch_device(config.device)
    state = load_resumable(ckpt_path) if resume else None
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
    # 2. data, the resumed config compared, model (errors here also leave nothing behind)
    try:
        bundle = load_data(config.data, seed=config.seed)
    except FileNotFoundError as exc:  # a resumed run's relative data_dir read from another folder: say so
        recorded = (((state or {}).get("config") or {}).get("data") or {}).get("data_dir", ...)
        if config.data.data_dir != recorded or Path(recorded or "data").is_absolute():
            raise
        raise InputError(f"--resume: {exc}; the run recorded data.data_dir {recorded or 'data'!r}, relative to the "
                         "folder the run started in; expected the run's data from this folder",
                         hint="pass data.data_dir with its path from here",
                         cli_hint="pass --data-dir with its path from here") from exc
    # what depends on the device (and, for an auto batch, on the images) is fixed, and recorded so
    config = resolve_for_device(config, device.type, len(bundle.train), world_size)
    if state is not None:
        # the same images by another path (a run resumed from another folder, a file moved) are the run's: where
        # both sides have a sha256 of them (not folders), _same_images decides, as eval's --data-dir does
        free = ("data.data_dir",) if bundle.fingerprint and (state.get("extra") or {}).get("data") else ()
        diffs = _config_diff(upgrade_config(state["config"]), config.to_dict(), free=free)
        if diffs:
            raise InputError(f"--resume with a different config: {'; '.join(diffs)}")
        _same_images(state, bundle, config.data)
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
    # a copy of the module itself, before any wrapper; auto's decay reads the schedule's length when it updates
    ema = _weight_average(model, config.optim.ema, lambda: schedule.total_steps)
    delivered = ema.module if ema is not None else model  # what is validated and saved as the run's weights
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
        if ema is not None:  # the average is the checkpoint's weights; the weights as trained are beside it
            model.load_state_dict(state["extra"]["trained_weights"])
            ema.module.load_state_dict(state["model"])
            ema.n_averaged.fill_(int(state["extra"]["ema_averaged"]))
        else:
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
            measure_eval=lambda: _validation_seconds(delivered, val_loader, device, channels_last),
            measure_checkpoint=lambda: _checkpoint_seconds(model, optimizer, ema.module if ema is not None else None),
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
            f"(batch {opt.batch_size}{_lr_text(opt)}"
            f"{_ema_text(opt.ema)}"
            f"); loss {config.loss.kind} ({config.loss.weighting}, normalize {config.loss.normalize}); "
            f"{device}{', ' + str(amp_dtype).replace('torch.', '') + ' autocast' if amp_dtype else ''}"
            f"{', ' + busy if busy else ''}"
            + (where if state is not None else "")
        )
        log_path = out / LOG_NAME
        interrupt = _Interrupt(enabled=world_size == 1)
        # its progress stream's reader gone (`2>&1 | head`): stop as on Ctrl-C, the run saved (one process only,
        # as Ctrl-C: under DDP the other ranks would wait for this one)
        reader_gone = lambda: interrupt.enabled and progress.reader_gone  # noqa: E731
        estimate = (_RunEstimate(progress, opt.epochs * steps_per_epoch - done_steps, steps_per_epoch - start_step, device,
                                 _shorter_run_advice(config.model.name, fast_ratio), on_ctrl_c=interrupt.enabled,
                                 threads=0 if device.type == "cuda" else torch.get_num_threads(), images=opt.batch_size)
                    if budget is None else None)  # fmt: skip  (a time budget says how long instead)
        steps_run = 0
        epoch = start_epoch

        def after_step(step: int) -> bool:  # True: end the epoch here
            nonlocal steps_run
            steps_run += 1
            if ema is not None:
                ema.update_parameters(model)
            if estimate is not None:
                estimate.after_step(step)
            if budget is not None and (line := budget.after_step(step, epoch_steps(epoch), done_steps + steps_run)):
                progress.total = schedule.total_steps  # the plan fixed, or shortened
                progress.write(line)
            return (interrupt.requested or reader_gone()
                    or (stop_after_steps is not None and steps_run >= stop_after_steps)
                    or step >= epoch_steps(epoch))  # fmt: skip

        def save(epoch_done: int, step: int, stopping: bool = True) -> None:
            if budget is not None and budget.plan is None and stopping:  # stopped before the plan: fix it from what was measured
                budget.fix(done_steps + steps_run, collective=False)
                progress.total = schedule.total_steps
                progress.write(budget.describe())
            extra = {"history": history, "step_losses": step_losses, "rng": capture_rng_state(),
                     "data": bundle.fingerprint,  # the sha256 of the images: a resume or an evaluation checks it
                     "scaler": scaler.state_dict() if scaler is not None else None, "world_size": world_size,
                     "step": step, "partial": partial if step else None,
                     "budget": budget.record() if budget is not None else None}  # fmt: skip
            if ema is not None:  # what --resume continues from
                extra.update(trained_weights=model.state_dict(), ema_averaged=int(ema.n_averaged))
            save_checkpoint(
                ckpt_path, model=delivered, class_names=bundle.class_names, normalization=bundle.normalization,
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
                    metrics = evaluate(delivered, val_loader, device, channels_last)
                    record.update({f"val_{k}": v for k, v in metrics.items()})
                history.append(record)
                epochs_run += 1
                epoch += 1
                if main_process:
                    save(epoch, 0, stopping=interrupt.requested or reader_gone()
                         or (stop_after is not None and epochs_run >= stop_after)
                         or (stop_after_steps is not None and steps_run >= stop_after_steps))  # fmt: skip
                    progress.write(format_epoch(record, run_epochs(), tree.num_leaves))
                if interrupt.requested:  # Ctrl-C during the epoch's last step or its validation: the epoch's checkpoint
                    print(f"stopped after epoch {epoch}/{run_epochs()}: its checkpoint {ckpt_path} is saved; continue "
                          "with --resume (same --out)", file=sys.stderr, flush=True)  # fmt: skip
                    break
                if reader_gone():
                    break
    except BaseException:  # nothing more from this run: no heartbeat left printing after its error
        progress.close(final=False)
        remove_new_folders(made)  # only the empty ones: a run that saved a checkpoint keeps it
        raise
    progress.close(final=not interrupt.requested)  # stopped: the last words are where it stopped and how to go on
    if reader_gone():  # the CLI's quiet exit for a closed pipe; the checkpoint is saved where training stopped
        raise BrokenPipeError(errno.EPIPE, f"the progress stream's reader went away; {ckpt_path} resumes the run")
    if interrupt.requested:
        raise Terminated() if interrupt.signum == signal.SIGTERM else KeyboardInterrupt
    notes = [note] if main_process and (note := _final_chance_note(history, len(bundle.class_names))) else []
    if budget is not None and main_process and epoch == run_epochs():
        notes.append(budget.ending_note(time.perf_counter() - started))
    if world_size > 1:
        torch.distributed.barrier()
    return FitResult(out_dir=out, checkpoint=ckpt_path, log=log_path, history=history, notes=notes,
                     budget=budget.record() if budget is not None else None)  # fmt: skip


class _Interrupt:
    """Ctrl-C or SIGTERM while training: finish the running step, save a resumable checkpoint there, then stop
    (``KeyboardInterrupt``; :class:`~hne_edge.errors.Terminated` for SIGTERM: the CLI exits 130 / 143).

    A second one stops at once (the last checkpoint stays as it was). Only in
    the main thread of a single process: under DDP every rank would have to stop at the same step.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGTERM: a supervisor's or a cluster's pre-emption, the same way

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt
        self.requested, self.signum = True, signum
        said = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        # no Progress here: the handler may run while the main thread holds its lock
        print(f"\n{said}: finishing this step to save a resumable checkpoint ({said} again: stop now, without it)",
              file=sys.stderr, flush=True)  # fmt: skip

    def __enter__(self) -> "_Interrupt":
        if self.enabled:
            for sig in self.SIGNALS:  # SIGTERM: not where the host installed its own (a script's deadline)
                if sig != signal.SIGTERM or signal.getsignal(sig) in (signal.SIG_DFL, raise_terminated):
                    self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)


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


def _lr_text(opt: OptimConfig) -> str:
    """The header's learning rate, when the linear rule or a warm-up makes it other than ``optim.lr``."""
    if opt.peak_lr == opt.lr:
        return ""
    warm = f", warm-up from {opt.lr:g} over {opt.warmup_epochs:g} epochs" if opt.warmup_start < 1 else ""
    return f", lr {opt.peak_lr:g} = {opt.lr:g} x {opt.batch_size}/{opt.lr_batch}{warm}"
