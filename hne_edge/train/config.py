"""Training configuration: validated dataclasses, YAML loading and the paper's presets.

A :class:`TrainConfig` nests :class:`DataConfig`, :class:`ModelSpec`,
:class:`LossConfig` and :class:`OptimConfig`. Each validates itself in
``__post_init__`` and errors name the field, what was received and what
was expected. Build one from a preset, a YAML file and CLI overrides::

    config = TrainConfig.from_preset("cifar", overrides={"optim": {"epochs": 10}})
    config = TrainConfig.from_file("my_run.yaml")      # may name a preset: `preset: cifar`

Presets (paper recipes, Ruiz & Verbeek 2021, section 5):

* ``cifar``: SGD lr 0.1, momentum 0.9, no Nesterov, cosine, 200 epochs, batch 128, wd 5e-4, hne_resnet.
* ``imagenet``: same optimiser, 120 epochs, batch 256, wd 1e-5, hne_mobilenetv2 on ImageFolder data.
* ``digits``: hne_tiny (in_chans 1, input 8) on scikit-learn's bundled digits; ~99% validation accuracy in ~20 s on 2 CPU cores.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..limits import check_threads

__all__ = ["DATASETS", "LOSSES", "WEIGHTINGS", "NORMALIZATIONS", "SCHEDULES", "DEFAULT_PRESET", "AMP_DTYPES", "HOLDOUTS",
           "POINTWISE", "AUTO_BATCH", "upgrade_config", "parse_duration", "resolve_for_device", "DataConfig", "ModelSpec",
           "LossConfig", "OptimConfig", "TrainConfig", "PRESETS"]

DATASETS = ("digits", "cifar10", "cifar100", "npz", "imagefolder")
LOSSES = ("independent", "structured", "distill", "hierarchical")  # see hne_edge.train.losses
WEIGHTINGS = ("paper", "mean-t2")
NORMALIZATIONS = ("none", "label")  # loss.normalize: see LossConfig
SCHEDULES = ("cosine", "step", "constant")
AMP_DTYPES = ("auto", "bfloat16", "float16")
HOLDOUTS = ("random", "last")  # data.holdout: which images val_split holds out
POINTWISE = ("conv", "bmm")  # pointwise: how a branch-parallel 1x1 convolution runs in training (same parameters)
# optim.batch_size "auto": the batch a device kind trains at. On CUDA the paper's 128 leaves the GPU idle
# (BENCHMARKS.md 'Training throughput'); elsewhere it is the paper's.
AUTO_BATCH = {"cuda": 512, "cpu": 128}
# optim.ema "auto": the average's window 1 / (1 - decay) is this fraction of the run's steps, whatever its length:
# 59 epochs of 45,000 images at batch 512 (5,200 steps) give decay 0.9962, 2,000 steps 0.99 - where a fixed 0.999
# (a window of half the run) would lean on mid-run weights, still at up to half the peak learning rate.
EMA_AUTO = "auto"
EMA_AUTO_WINDOW = 0.05
# fields earlier releases wrote that no longer mean anything; dropped when read.
# log_every: progress lines are time-based now (every 10 s without a terminal), not every N steps
REMOVED_FIELDS = ("log_every",)


def _expect(cond: bool, field_name: str, value: Any, expected: str) -> None:
    if not cond:
        raise InputError(f"{field_name}: received {value!r}; expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    """A finite real number: every number of a config is (NaN and Inf are refused here, before anything runs)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def ema_auto_decay(run_steps: int) -> float:
    """``optim.ema: auto``'s decay for a run of ``run_steps`` optimizer steps: a window of ``EMA_AUTO_WINDOW`` of
    them (0: each step's weights as they are, for runs of under 20 steps)."""
    return 1.0 - 1.0 / max(1.0, EMA_AUTO_WINDOW * run_steps)


@dataclass
class DataConfig:
    """Where the images come from and how they are split and augmented.

    Attributes:
        name: one of digits, cifar10, cifar100, npz, imagefolder.
        data_dir: a folder (cifar10/100: torchvision's root; imagefolder: class folders, or
            ``train/`` and ``val/`` inside) or an ``.npz`` file with ``x`` (N,H,W,C uint8) and ``y``.
        download: let torchvision download CIFAR into ``data_dir``.
        val_split: fraction of the training images held out for validation; 0 = none.
        holdout: which images ``val_split`` holds out: ``random`` (a permutation seeded by ``seed``) or
            ``last`` (the last ones of the file, in its order: the last 5,000 of CIFAR-10's 50,000 at 0.1,
            whatever the seed; refused for an image folder, whose last images are whole classes).
        limit: use only this many training images (after the split), for quick runs.
        val_limit: validate on at most this many of the held-out images (default: all of them; the cap
            keeps a subset of the same seeded hold-out).
        augment: the paper's augmentation on training batches (pad + random crop (+ flip)).
        num_workers: DataLoader workers (imagefolder only; in-memory data is augmented in batch).
    """

    name: str = "digits"
    data_dir: str | None = None
    download: bool = False
    val_split: float = 0.1
    holdout: str = "random"
    limit: int | None = None
    val_limit: int | None = None
    augment: bool = True
    num_workers: int = 0

    def __post_init__(self) -> None:
        _expect(self.name in DATASETS, "data.name", self.name, f"one of {', '.join(DATASETS)}")
        _expect(_is_num(self.val_split) and 0 <= self.val_split < 1, "data.val_split", self.val_split, "a finite number with 0 <= x < 1")
        _expect(self.holdout in HOLDOUTS, "data.holdout", self.holdout, f"one of {', '.join(HOLDOUTS)}")
        _expect(self.limit is None or (_is_int(self.limit) and self.limit > 0), "data.limit", self.limit, "a positive integer or null")
        _expect(self.val_limit is None or (_is_int(self.val_limit) and self.val_limit > 0), "data.val_limit",
                self.val_limit, "a positive integer or null")  # fmt: skip
        _expect(_is_int(self.num_workers) and self.num_workers >= 0, "data.num_workers", self.num_workers, "an integer >= 0")
        if self.name in ("npz", "imagefolder") and not self.data_dir:
            raise InputError(f"data.name={self.name!r} needs data.data_dir (--data-dir); received none")
        if self.download and self.name not in ("cifar10", "cifar100"):
            raise InputError(f"data.download is only for cifar10/cifar100; received data.name={self.name!r} with --download")
        if self.data_dir is not None:
            self.data_dir = str(self.data_dir)


@dataclass
class ModelSpec:
    """Which zoo model to build.

    Attributes:
        name: a registered model (``hne-edge info`` lists them).
        overrides: config fields to change (``tree``, ``blocks``, ``in_chans``, ``input_size``...).
            ``num_classes``, ``in_chans`` and ``input_size`` default to the data's.
    """

    name: str = "hne_tiny"
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from ..models.zoo import list_models  # noqa: PLC0415 - the registry is torch-free

        _expect(self.name in list_models(), "model.name", self.name, f"one of {', '.join(list_models())}")
        _expect(isinstance(self.overrides, dict), "model.overrides", self.overrides, "a mapping of config fields")
        from ..models.zoo import model_config  # noqa: PLC0415 - torch-free too

        try:  # the overrides build a valid model config (the data's classes/channels/size are checked at fit)
            model_config(self.name, **copy.deepcopy(self.overrides))
        except TypeError as exc:  # a value of the wrong kind inside a config's own checks
            raise InputError(f"model.overrides: received {self.overrides!r}; {exc}") from None


@dataclass
class LossConfig:
    """The training objective (see :mod:`hne_edge.train.losses`).

    Attributes:
        kind: independent (L^I), structured (L^S), distill ((1-a) L^I + a L^D), hierarchical ((1-a) L^I + a L^HD).
        alpha: weight of the distillation term.
        temperature: softmax temperature T of the soft labels.
        weighting: ``paper`` (the paper's sums, divided by the label term's count: L^HD weighs B/N of
            L^I, L^D 1:1) or ``mean-t2`` (hne-edge 0.1: means over members, times T^2).
        temperature_squared: also multiply the distillation term by T^2 under ``paper``
            (``mean-t2`` always does).
        normalize: ``none`` (the paper's objective) or ``label``: divide the objective by (1 - alpha), so
            the label term keeps weight 1 (L^I + alpha / (1 - alpha) L^HD). With SGD that is the
            paper's objective with the learning rate of its loss gradient, not of its weight decay,
            multiplied by 1 / (1 - alpha). For short schedules (RESULTS.md); needs alpha < 1.
            ``independent`` and ``structured`` have no distillation term: there it changes nothing.
    """

    kind: str = "hierarchical"
    alpha: float = 0.5
    temperature: float = 2.0
    weighting: str = "paper"
    temperature_squared: bool = False
    normalize: str = "none"

    def __post_init__(self) -> None:
        _expect(self.kind in LOSSES, "loss.kind", self.kind, f"one of {', '.join(LOSSES)}")
        _expect(self.normalize in NORMALIZATIONS, "loss.normalize", self.normalize, f"one of {', '.join(NORMALIZATIONS)}")
        _expect(self.weighting in WEIGHTINGS, "loss.weighting", self.weighting, f"one of {', '.join(WEIGHTINGS)}")
        _expect(isinstance(self.temperature_squared, bool), "loss.temperature_squared", self.temperature_squared, "true or false")
        _expect(_is_num(self.alpha) and 0 <= self.alpha <= 1, "loss.alpha", self.alpha, "a finite number with 0 <= alpha <= 1")
        _expect(_is_num(self.temperature) and self.temperature > 0, "loss.temperature", self.temperature, "a finite number > 0")
        if self.normalize == "label" and self.alpha >= 1:
            raise InputError(f"loss.normalize=label divides the objective by (1 - alpha); received alpha={self.alpha!r}, "
                             "expected alpha < 1 (alpha = 1 has no label term to normalise by)")


@dataclass
class OptimConfig:
    """SGD and the learning-rate schedule (stepped every iteration).

    Attributes:
        epochs: passes over the training set (under a ``time_budget``: at most this many).
        batch_size: global batch (split evenly across processes under DDP), or ``auto``: the device kind's
            (:data:`AUTO_BATCH`: 512 on CUDA, the paper's 128 on a CPU), at most the training images (one step
            an epoch on a small set, rather than an error for a batch the user never chose), fixed when the
            run starts.
        lr: the learning rate, at ``lr_batch`` images per batch when that is set.
        lr_batch: the batch size ``lr`` is quoted at. Set, the peak learning rate is
            ``lr * batch_size / lr_batch`` (the linear scaling rule, Goyal et al. 2017: the paper's 0.1 at
            128 is 0.4 at 512); null: ``lr`` as given, whatever the batch.
        warmup_epochs: when the rule scales the learning rate up, it rises linearly from ``lr`` to the peak
            over this many epochs (at most a tenth of the run's steps), then the schedule starts. No
            warm-up when the rate is not scaled up: at ``lr_batch`` the recipe is exactly the paper's.
        momentum, nesterov, weight_decay: SGD settings.
        schedule: cosine (to 0 over all iterations after the warm-up), step (x0.1 at 50% and 75%) or constant.
        accum_steps: split each batch into this many micro-batches and accumulate gradients
            (same update as one batch, up to BatchNorm statistics per micro-batch).
        ema: keep an exponential moving average of the weights and BatchNorm statistics, updated after every
            step with this decay (``torch.optim.swa_utils``: ``avg = decay * avg + (1 - decay) * weights``, the
            first step's weights to start from; 0.999 averages over about the last 1,000 steps), and deliver it:
            validations, the checkpoint's weights and so every export and evaluation use the average; the weights
            as trained stay in the checkpoint beside it for ``--resume``. null (default): the paper's recipe, the
            weights as trained. A window ``1 / (1 - decay)`` beyond a tenth of the run's steps mostly averages
            early weights: ``auto`` sets the decay from the run's length instead (``ema_auto_decay``: a window of
            ``EMA_AUTO_WINDOW`` of its steps, read again each step, as a time budget fixes or shortens the run).
    """

    epochs: int = 200
    batch_size: int | str = 128
    lr: float = 0.1
    lr_batch: int | None = None
    warmup_epochs: float = 0.0
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    schedule: str = "cosine"
    accum_steps: int = 1
    ema: float | str | None = None

    def __post_init__(self) -> None:
        _expect(_is_int(self.epochs) and self.epochs > 0, "optim.epochs", self.epochs, "a positive integer")
        _expect(self.ema is None or self.ema == EMA_AUTO or (_is_num(self.ema) and 0 < self.ema < 1), "optim.ema",
                self.ema, f"null, {EMA_AUTO} or a decay with 0 < decay < 1 (such as 0.999)")  # fmt: skip
        _expect(self.batch_size == "auto" or (_is_int(self.batch_size) and self.batch_size > 0), "optim.batch_size",
                self.batch_size, "a positive integer or auto")  # fmt: skip
        _expect(_is_num(self.lr) and self.lr > 0, "optim.lr", self.lr, "a finite number > 0")  # too large: fit stops when the loss diverges
        _expect(self.lr_batch is None or (_is_int(self.lr_batch) and self.lr_batch > 0), "optim.lr_batch", self.lr_batch,
                "a positive integer or null")  # fmt: skip
        _expect(_is_num(self.warmup_epochs) and self.warmup_epochs >= 0, "optim.warmup_epochs", self.warmup_epochs,
                "a finite number >= 0")  # fmt: skip
        _expect(_is_num(self.momentum) and 0 <= self.momentum < 1, "optim.momentum", self.momentum, "a finite number with 0 <= m < 1")
        _expect(_is_num(self.weight_decay) and self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "a finite number >= 0")
        _expect(self.schedule in SCHEDULES, "optim.schedule", self.schedule, f"one of {', '.join(SCHEDULES)}")
        _expect(_is_int(self.accum_steps) and self.accum_steps > 0, "optim.accum_steps", self.accum_steps, "a positive integer")
        if self.nesterov and self.momentum == 0:
            raise InputError("optim.nesterov=True needs optim.momentum > 0; received momentum=0")
        if self.batch_size != "auto" and self.batch_size % self.accum_steps:
            raise InputError(
                f"optim.batch_size={self.batch_size} must be divisible by optim.accum_steps={self.accum_steps}"
            )

    @property
    def peak_lr(self) -> float:
        """The learning rate the schedule starts from (after any warm-up): ``lr``, scaled linearly to the batch
        when ``lr_batch`` is set (a resolved batch: see :func:`resolve_for_device`)."""
        if self.lr_batch is None:
            return self.lr
        if self.batch_size == "auto":
            raise InputError("optim.batch_size is auto until the run's device is known; resolve the config first")
        return self.lr * self.batch_size / self.lr_batch

    @property
    def warmup_start(self) -> float:
        """The warm-up's first learning rate as a fraction of :attr:`peak_lr` (1: no warm-up)."""
        return min(1.0, self.lr / self.peak_lr) if self.warmup_epochs > 0 else 1.0


@dataclass
class TrainConfig:
    """One training run.

    Attributes:
        data, model, loss, optim: see their classes.
        seed: seeds weights, the validation split, shuffling (seed + epoch) and augmentation.
        out: output folder (checkpoint.pt, train_log.json, config.yaml).
        device: auto (CUDA if available), cpu or cuda[:i].
        amp: autocast on CUDA (ignored on CPU).
        amp_dtype: auto (bfloat16 where the GPU supports it, else float16 with loss scaling), bfloat16 or float16.
        channels_last: channels-last memory format; CUDA only.
        threads: torch CPU threads (0: leave torch's default; at most :func:`hne_edge.limits.max_threads`).
        quiet: no progress output (a bar on a terminal, else a line every 10 s; see :mod:`hne_edge.progress`).
        eval_every: validate every this many epochs (and always after the last).
        compile: ``torch.compile`` the model for training (the first steps then compile; no numerical change).
            Off by default: compiling takes tens of seconds, and in the trainer's own loop it has not paid
            (BENCHMARKS.md 'Training throughput').
        time_budget: train for this long (seconds, or ``"7m"``, ``"90s"``, ``"1h30m"``) instead of a number
            of epochs: the first steps are timed, then the number of steps is fixed so that the schedule, the
            validations and the checkpoints end inside it (``optim.epochs`` stays the most it may run). The
            budget counts from the start of training (data loading included); a resumed run keeps the step
            count it fixed. null: ``optim.epochs`` epochs.
        pointwise: how each branch-parallel 1x1 convolution runs in training: ``conv`` (one grouped
            convolution) or ``bmm`` (one batched matrix multiply over the branches). The same parameters
            and, to rounding, the same outputs; which is faster depends on the device
            (``benchmarks/bench_train.py --pointwise``).
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelSpec = field(default_factory=ModelSpec)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    out: str = "runs/train"
    device: str = "auto"
    amp: bool = True
    amp_dtype: str = "auto"
    channels_last: bool = True
    threads: int = 0
    quiet: bool = False
    eval_every: int = 1
    compile: bool = False
    time_budget: float | str | None = None
    pointwise: str = "conv"

    def __post_init__(self) -> None:
        for name, cls in (("data", DataConfig), ("model", ModelSpec), ("loss", LossConfig), ("optim", OptimConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, _build(cls, value, name))
            elif not isinstance(value, cls):
                raise InputError(f"{name}: received {type(value).__name__}; expected a mapping of {cls.__name__} fields")
        _expect(_is_int(self.seed) and self.seed >= 0, "seed", self.seed, "an integer >= 0")
        _expect(self.device == "auto" or self.device == "cpu" or str(self.device).startswith("cuda"), "device", self.device, "auto, cpu or cuda[:i]")
        check_threads(self.threads, "threads", minimum=0)  # the one thread bound (0: torch's default)
        _expect(_is_int(self.eval_every) and self.eval_every > 0, "eval_every", self.eval_every, "a positive integer")
        _expect(self.amp_dtype in AMP_DTYPES, "amp_dtype", self.amp_dtype, f"one of {', '.join(AMP_DTYPES)}")
        _expect(isinstance(self.compile, bool), "compile", self.compile, "true or false")
        _expect(self.pointwise in POINTWISE, "pointwise", self.pointwise, f"one of {', '.join(POINTWISE)}")
        if self.time_budget is not None:
            self.time_budget = parse_duration(self.time_budget, "time_budget")
        self.out = str(self.out)

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build from a nested mapping; ``preset: NAME`` starts from that preset."""
        if not isinstance(data, dict):
            raise InputError(f"a training config is a mapping; received {type(data).__name__}")
        data = copy.deepcopy(data)
        for key in REMOVED_FIELDS:  # runs and configs of earlier releases still load
            data.pop(key, None)
        preset = data.pop("preset", None)
        base = preset_dict(preset) if preset is not None else {}
        return _build(cls, merge(base, data), "config")

    @classmethod
    def for_data(cls, data: str | None, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        """The run ``hne-edge train --data DATA`` starts: the paper preset for that kind of data (see
        :data:`DEFAULT_PRESET`; ``None`` is digits), its dataset replaced by ``data``, then ``overrides``."""
        name = data or "digits"
        if name not in DEFAULT_PRESET:
            raise InputError(f"data.name: received {name!r}; expected one of {', '.join(DATASETS)}")
        base = preset_dict(DEFAULT_PRESET[name])
        if name != base["data"]["name"]:  # e.g. npz on the cifar recipe: keep only the split settings
            base["data"] = {k: v for k, v in base["data"].items() if k in ("val_split", "num_workers")}
            base["data"]["name"] = name
        return cls.from_dict(merge(base, overrides or {}))

    @classmethod
    def from_preset(cls, name: str, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        return cls.from_dict({"preset": name, **(overrides or {})})

    @classmethod
    def from_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        import yaml  # noqa: PLC0415

        path = Path(path)
        if path.is_dir():
            raise InputError(f"config {path}: received a folder; expected a YAML config file")
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: received bytes that are not UTF-8 text (byte {exc.start}); expected a YAML config") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not valid YAML ({exc.__class__.__name__}: {exc})".replace("\n", " ")) from exc
        except RecursionError:
            raise InputError(f"{path}: YAML nested too deeply; expected a training config") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: a training config is a YAML mapping; received {type(data).__name__}")
        return cls.from_dict(merge(data, overrides or {}))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_yaml(self) -> str:
        import yaml  # noqa: PLC0415

        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _build(cls: type, data: dict[str, Any], where: str):
    if not isinstance(data, dict):
        raise InputError(f"{where}: received {type(data).__name__}; expected a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"{where}: unknown option(s) {unknown}; accepted: {sorted(known)}")
    return cls(**data)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``override`` wins; nested mappings merge (except ``model.overrides`` replaces by key)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


PRESETS: dict[str, dict[str, Any]] = {
    "cifar": {
        "data": {"name": "cifar10", "val_split": 0.1},
        "model": {"name": "hne_resnet"},
        "loss": {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0},
        # the paper's lr 0.1 at batch 128; "auto" is 128 on a CPU (exactly the paper's recipe) and 512 on CUDA
        # (lr 0.4 by the linear rule, after a 2-epoch warm-up from 0.1)
        "optim": {"epochs": 200, "batch_size": "auto", "lr": 0.1, "lr_batch": 128, "warmup_epochs": 2.0, "momentum": 0.9,
                  "nesterov": False, "weight_decay": 5e-4, "schedule": "cosine"},
    },
    "imagenet": {
        "data": {"name": "imagefolder", "val_split": 0.0, "num_workers": 8},
        "model": {"name": "hne_mobilenetv2"},
        "loss": {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0},
        "optim": {"epochs": 120, "batch_size": 256, "lr": 0.1, "momentum": 0.9, "nesterov": False,
                  "weight_decay": 1e-5, "schedule": "cosine"},
    },
    "digits": {
        "data": {"name": "digits", "val_split": 0.1},
        "model": {"name": "hne_tiny", "overrides": {"in_chans": 1, "input_size": 8}},
        "loss": {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0},
        "optim": {"epochs": 15, "batch_size": 32, "lr": 0.2, "momentum": 0.9, "nesterov": False,
                  "weight_decay": 5e-4, "schedule": "cosine"},
        "out": "runs/digits",
    },
}


# the preset a bare ``--data X`` starts from: the paper recipe for that kind of data
DEFAULT_PRESET = {"digits": "digits", "cifar10": "cifar", "cifar100": "cifar", "npz": "cifar", "imagefolder": "imagenet"}


def upgrade_config(stored: dict[str, Any]) -> dict[str, Any]:
    """A config dict saved by an earlier release, with the fields it lacked set to what that release did.

    hne-edge 0.1 weighted the losses ``mean-t2`` and autocast in float16, and its ``data.limit`` capped the
    validation images too (``data.val_limit`` now); releases before ``loss.normalize`` trained the paper's
    objective unnormalised. A run they started resumes (and evaluates) as it began.
    """
    stored = copy.deepcopy(stored)
    for key in REMOVED_FIELDS:
        stored.pop(key, None)
    data = stored.get("data")
    if isinstance(data, dict) and "val_limit" not in data:
        data["val_limit"] = data.get("limit")
    if isinstance(data, dict):
        data.setdefault("holdout", "random")  # the only split before data.holdout
    optim = stored.get("optim")
    if isinstance(optim, dict):  # before lr_batch and warm-up: the learning rate as given
        optim.setdefault("lr_batch", None)
        optim.setdefault("warmup_epochs", 0.0)
        optim.setdefault("ema", None)  # before optim.ema: the weights as trained
    loss = stored.setdefault("loss", {})
    if isinstance(loss, dict) and "weighting" not in loss:
        loss["weighting"] = "mean-t2"
        loss.setdefault("temperature_squared", False)
    if isinstance(loss, dict):
        loss.setdefault("normalize", "none")
    stored.setdefault("amp_dtype", "float16")
    return stored


def preset_dict(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise InputError(f"preset: received {name!r}; expected one of {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0}


def parse_duration(value: Any, what: str = "duration") -> float:
    """Seconds from a number of seconds or a string such as ``"7m"``, ``"90s"``, ``"1h30m"``, ``"420"``."""
    import re  # noqa: PLC0415

    expected = "a number of seconds > 0 or a duration such as 7m, 90s, 1h30m"
    if _is_num(value):
        seconds = float(value)
    elif isinstance(value, str) and (text := value.strip().lower().replace(" ", "")):
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            parts = re.findall(r"(\d+(?:\.\d+)?)(h|min|m|s)", text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise InputError(f"{what}: received {value!r}; expected {expected}")
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    else:
        raise InputError(f"{what}: received {value!r}; expected {expected}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise InputError(f"{what}: received {value!r}; expected {expected}")
    return seconds


def resolve_for_device(config: "TrainConfig", device_type: str, train_images: int | None = None,
                       processes: int = 1) -> "TrainConfig":
    """``config`` with what depends on the device fixed (``optim.batch_size: auto``), as the run records it.

    ``auto`` is a multiple of the processes times ``optim.accum_steps`` (each process's micro-batches are
    equal) and, where ``train_images`` is known, at most that many images; a set smaller than one such
    multiple keeps the device's batch, which the run then refuses, naming the images.
    """
    if config.optim.batch_size != "auto":
        return config
    multiple = processes * config.optim.accum_steps
    batch = max(AUTO_BATCH.get(device_type, AUTO_BATCH["cpu"]) // multiple, 1) * multiple
    if train_images is not None and multiple <= train_images < batch:
        batch = train_images // multiple * multiple
    data = config.to_dict()
    data["optim"]["batch_size"] = batch
    return TrainConfig.from_dict(data)
