"""Training data: datasets, the seeded validation split, augmentation and loaders.

Sources (``DataConfig.name``):

* ``digits``: scikit-learn's bundled 8x8 grayscale digits (1,797 images, no download).
* ``cifar10`` / ``cifar100``: torchvision (``download`` or an existing root folder).
* ``npz``: a numpy archive with ``x`` (N, H, W, C) or (N, H, W) uint8 and ``y`` (N,) int labels,
  optionally ``classes`` (like ``../shared/data/cifar10_train.npz``).
* ``imagefolder``: ImageNet-style class folders (``data_dir/train`` + ``data_dir/val``, or one folder
  split by ``val_split``). The classes are train/'s: val/'s images take train/'s labels (val/ may lack a
  class; a class train/ has not is refused), and ``limit`` draws a seeded subset of every class. Files are
  read as the runtime reads them (``runtime.images.read_image``); hidden files (``._x.png``) are not images.

In-memory sources (all but imagefolder) are held as one uint8 tensor and
augmented **in batch on tensors** (pad + random crop by gather, flip by
``where``): on a CPU this is ~20x faster than per-sample PIL transforms.

Augmentation (the paper's, section 5):

* 32x32 colour images: 4-pixel zero padding, random 32x32 crop, horizontal flip.
* digits: 1-pixel zero padding, random 8x8 crop, **no flip** (digits are not
  mirror-symmetric: a flipped 2 or 7 is not a digit).
* imagefolder: RandomResizedCrop(224) + flip; eval: resize 256 + center crop 224.

Normalisation is per channel: published figures for CIFAR and ImageNet,
computed on the training split for digits and npz.

Determinism: the validation split is a permutation seeded by ``seed`` (or,
``data.holdout: last``, the file's last images); epoch ``e`` shuffles and
augments with a generator seeded by ``(seed, e)`` only, so a resumed run
replays exactly the same batches. Under DDP every process draws the same
global batch and takes its slice.

On a GPU the images live on the device as uint8 and each epoch's random
draws (order, crops, flips) cross the bus once, at its start: a batch is then
gathered, cropped, flipped and normalised on the device with no host
round trip, so the training loop never waits for the host between steps.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..errors import InputError, short_repr
from ..limits import MAX_NUM_CLASSES
from .config import DataConfig

__all__ = ["ArrayDataset", "Augment", "DataBundle", "BatchLoader", "load_data", "load_npz", "npz_fingerprint", "split_indices",
           "epoch_generator"]

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that shuffles and augments epoch ``epoch``: depends on nothing else."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def split_indices(n: int, val_split: float, seed: int, limit: int | None = None,
                  val_limit: int | None = None, holdout: str = "random") -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) index split of ``n`` items; ``limit`` caps the training part, ``val_limit`` the
    validation part (each on its own: a quick run on few images still validates on the whole hold-out).

    ``holdout="random"`` holds out a permutation seeded by ``seed``; ``"last"`` the last ``val_split`` of the
    items in their order (the seed plays no part). The hold-out is drawn before either cap, so a capped
    validation set is a subset of the full one, and a capped training set never takes a held-out image.
    """
    if holdout not in ("random", "last"):
        raise InputError(f"holdout: received {holdout!r}; expected random or last")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if holdout == "random" else None
    n_val = int(round(n * val_split))
    if perm is None:  # the file's own order: the last n_val items, the training part before them
        perm = torch.cat([torch.arange(n - n_val, n), torch.arange(n - n_val)])
    val, train = perm[:n_val], perm[n_val:]
    if limit is not None:
        train = train[:limit]
    if val_limit is not None:
        val = val[:val_limit]
    return train.sort().values, val.sort().values


@dataclass(frozen=True)
class Augment:
    """Zero-pad by ``pad``, random crop back to size, optional horizontal flip (uint8 NCHW batches)."""

    pad: int = 4
    flip: bool = True

    def __call__(self, images: torch.Tensor, generator: torch.Generator, rows: slice | None = None) -> torch.Tensor:
        """Augment ``images[rows]``; random draws cover the whole batch so every DDP slice sees the same draws."""
        # draws come from the CPU generator wherever the images are, so a GPU run sees a CPU run's crops and flips
        offsets, flips = self.draw(images.shape[0], generator)
        offsets, flips = offsets.to(images.device), flips.to(images.device)
        if rows is not None:
            images, offsets, flips = images[rows], offsets[rows], flips[rows]
        return self.apply(images, offsets, flips)

    def apply(self, images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        """Crop ``images`` (uint8 (b, c, h, w)) at ``offsets`` (b, 2) of the padded image and mirror where ``flips``
        (b,): one gather, on the images' device (the draws must be there too)."""
        b, c, h, w = images.shape
        dev = images.device
        cols = torch.arange(w, device=dev)
        if self.flip:  # a mirrored crop reads its columns right to left
            cols = torch.where(flips[:, None], w - 1 - cols, cols)  # (b, w)
        else:
            cols = cols.expand(b, w)
        if not self.pad:
            return images if not self.flip else images.gather(3, cols[:, None, None, :].expand(b, c, h, w))
        padded = torch.nn.functional.pad(images, (self.pad,) * 4)  # (b, c, h + 2p, w + 2p)
        wp = w + 2 * self.pad
        ys = offsets[:, 0, None] + torch.arange(h, device=dev)  # (b, h)
        xs = offsets[:, 1, None] + cols  # (b, w)
        index = (ys[:, :, None] * wp + xs[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
        return padded.flatten(2).gather(2, index).view(b, c, h, w)

    def draw(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The random draws of one batch (crop offsets, flips); a resumed epoch replays those of the skipped batches."""
        offsets = torch.randint(0, 2 * self.pad + 1, (batch, 2), generator=generator)
        return offsets, torch.rand(batch, generator=generator) < 0.5


class ArrayDataset:
    """Images held in memory: ``images`` uint8 (N, C, H, W), ``labels`` int64 (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise InputError(f"images: received {images.dtype} {tuple(images.shape)}; expected uint8 (N, C, H, W)")
        if labels.shape != (images.shape[0],):
            raise InputError(f"labels: received shape {tuple(labels.shape)}; expected ({images.shape[0]},)")
        self.images = images
        self.labels = labels.long()

    def __len__(self) -> int:
        return self.images.shape[0]

    def subset(self, index: torch.Tensor) -> "ArrayDataset":
        return ArrayDataset(self.images[index], self.labels[index])

    def to(self, device: torch.device | str) -> "ArrayDataset":
        return ArrayDataset(self.images.to(device), self.labels.to(device))

    def fingerprint(self) -> str:
        """sha256 of the images then the labels (int64), in their order: what a run records of the images it was
        given, so that a resume or an evaluation can tell other images at the same path (0.1 s for CIFAR-10)."""
        import hashlib  # noqa: PLC0415

        h = hashlib.sha256(self.images.contiguous().cpu().numpy().tobytes())
        h.update(self.labels.cpu().numpy().astype(np.int64).tobytes())
        return h.hexdigest()


class BatchLoader:
    """Batches of normalised float images from an :class:`ArrayDataset`, augmented in batch.

    Args:
        dataset: the images.
        batch_size: global batch size; under DDP each of ``world_size`` ranks yields its
            ``batch_size // world_size`` slice of the same global batch.
        mean, std: per-channel normalisation (0..1 pixel scale).
        shuffle: shuffle each epoch with :func:`epoch_generator`.
        augment: training augmentation, or None.
        drop_last: drop the last incomplete global batch (training).
        seed: run seed.
        rank, world_size: this process's place in a DDP group.
        device: hold the images there (once) and augment and normalise there, e.g. a CUDA
            device: batches then never cross the host bus. None: where the dataset is.
        channels_last: yield batches in the channels-last memory format (what a channels-last model reads).
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        batch_size: int,
        *,
        mean: Sequence[float],
        std: Sequence[float],
        shuffle: bool = False,
        augment: Augment | None = None,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
        channels_last: bool = False,
    ) -> None:
        if batch_size % world_size:
            raise InputError(f"batch_size={batch_size} must be divisible by the number of processes ({world_size})")
        if device is not None and torch.device(device) != dataset.images.device:
            dataset = dataset.to(device)
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle, self.augment, self.drop_last = shuffle, augment, drop_last
        self.seed, self.rank, self.world_size, self.channels_last = seed, rank, world_size, channels_last
        self.epoch = self.start = 0
        where = dataset.images.device
        self._scale = (torch.tensor(std, dtype=torch.float32) * 255).view(1, -1, 1, 1).to(where)
        self._shift = (torch.tensor(mean, dtype=torch.float32) * 255).view(1, -1, 1, 1).to(where)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Iterate epoch ``epoch`` from batch ``start`` on (a run resumed mid-epoch): the same batches, crops and
        flips as an uninterrupted pass, since the skipped batches' random draws are replayed, not their work."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = epoch_generator(self.seed, self.epoch)
        n, size, where = len(self.dataset), self.batch_size, self.dataset.images.device
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        batches = len(self)
        if self.augment is not None:  # the epoch's draws in the order a batch-by-batch pass makes them, then one copy
            draws = [self.augment.draw(min(size, n - i * size), generator) for i in range(batches)]
            offsets = torch.cat([d[0] for d in draws]).to(where) if draws else None
            flips = torch.cat([d[1] for d in draws]).to(where) if draws else None
        order = order.to(where)
        for i in range(self.start, batches):
            index = order[i * size : (i + 1) * size]
            per_rank = math.ceil(index.numel() / self.world_size)
            rows = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
            images = self.dataset.images[index[rows]]
            if self.augment is not None:
                lo = i * size + self.rank * per_rank
                images = self.augment.apply(images, offsets[lo : lo + images.shape[0]], flips[lo : lo + images.shape[0]])
            if self.channels_last:  # uint8 is cheap to reorder; the float image then keeps the layout
                images = images.contiguous(memory_format=torch.channels_last)
            yield (images.float() - self._shift) / self._scale, self.dataset.labels[index[rows]]


@dataclass
class DataBundle:
    """Datasets plus what a checkpoint must remember about them."""

    train: object  # ArrayDataset or a torch Dataset (imagefolder)
    val: object | None
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    in_chans: int
    input_size: int
    augment: Augment | None = None  # in-memory sources
    folder: bool = False
    # the whole training file's (ArrayDataset.fingerprint); a one-folder split's listing; None for train/ + val/
    fingerprint: str | None = None

    def not_the_images_of(self, state: dict) -> tuple[str, str] | None:
        """(these images' sha256, the run's), shortened, when a checkpoint ``state`` records other images than
        these; None when they agree or either side has no record (train/ + val/ folders; runs saved before it)."""
        recorded = (state.get("extra") or {}).get("data")
        if recorded and self.fingerprint and recorded != self.fingerprint:
            return self.fingerprint[:12], recorded[:12]
        return None

    @property
    def normalization(self) -> dict[str, list[float]]:
        return {"mean": [float(m) for m in self.mean], "std": [float(s) for s in self.std]}

    def train_loader(self, batch_size: int, *, seed: int, augment: bool = True, rank: int = 0, world_size: int = 1,
                     num_workers: int = 0, device: torch.device | None = None, channels_last: bool = False):
        """Training batches; ``device``: hold in-memory images there and augment there (folder data ignores it)."""
        if self.folder:
            return _FolderLoader(self.train, batch_size, shuffle=True, seed=seed, rank=rank, world_size=world_size, num_workers=num_workers, drop_last=True)
        return BatchLoader(
            self.train, batch_size, mean=self.mean, std=self.std, shuffle=True, augment=self.augment if augment else None,
            drop_last=True, seed=seed, rank=rank, world_size=world_size, device=device, channels_last=channels_last,
        )

    def frames(self, dataset) -> tuple[np.ndarray, np.ndarray]:
        """``dataset``'s images as the runtime takes them (uint8 N,H,W,C at the model's input size) and labels:
        an in-memory dataset's own, a folder's resized and centre-cropped as its evaluation sees them."""
        if not self.folder:
            return dataset.images.permute(0, 2, 3, 1).cpu().numpy(), dataset.labels.cpu().numpy()
        from torch.utils.data import Subset  # noqa: PLC0415

        subset = isinstance(dataset, Subset)
        folder, index = (dataset.dataset, dataset.indices) if subset else (dataset, range(len(dataset)))
        crop, samples = _frame_transform(), [folder.samples[i] for i in index]
        images = [np.asarray(crop(folder.loader(path))) for path, _ in samples]
        return np.stack(images), np.array([label for _, label in samples], dtype=np.int64)

    def eval_loader(self, dataset, batch_size: int = 256, num_workers: int = 0, device: torch.device | None = None,
                    channels_last: bool = False):
        if self.folder:
            return _FolderLoader(dataset, batch_size, shuffle=False, seed=0, num_workers=num_workers)
        return BatchLoader(dataset, batch_size, mean=self.mean, std=self.std, device=device, channels_last=channels_last)


def _stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std (0..1 scale) of uint8 NCHW images, in float64 chunks (memory-light)."""
    c = images.shape[1]
    total, total_sq, count = torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64), 0
    for chunk in images.split(4096):
        x = chunk.double().div_(255).transpose(0, 1).reshape(c, -1)
        total += x.sum(1)
        total_sq += (x * x).sum(1)
        count += x.shape[1]
    mean = total / count
    std = (total_sq / count - mean**2).clamp_min(1e-12).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


def _from_arrays(x: np.ndarray, y: np.ndarray, where: str) -> ArrayDataset:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.dtype != np.uint8:
        raise InputError(f"{where}: x received {x.dtype} {x.shape}; expected uint8 (N, H, W, C) or (N, H, W)")
    if y.ndim != 1 or y.shape[0] != x.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{where}: y received {y.dtype} {y.shape}; expected integer labels of shape ({x.shape[0]},)")
    if x.shape[1] in (1, 3, 4) and x.shape[2] == x.shape[3] > 4:  # before "not square", which would ask for a crop
        raise InputError(f"{where}: x received {x.shape}, which looks like N,C,H,W (channels first); expected N,H,W,C "
                         "(np.transpose(x, (0, 2, 3, 1)))")  # fmt: skip
    if x.shape[1] != x.shape[2]:
        raise InputError(f"{where}: images are {x.shape[1]}x{x.shape[2]} (x {x.shape} read as N,H,W,C); expected "
                         "square images")  # fmt: skip
    if x.shape[0] == 0:
        raise InputError(f"{where}: holds no samples (x {x.shape}); expected at least one image")
    if x.shape[3] == 0:
        raise InputError(f"{where}: images of 0 channels (x {x.shape}); expected (N, H, W, C) with C >= 1 "
                         "(1 gray, 3 RGB)")
    if y.min() < 0:
        raise InputError(f"{where}: labels must be 0..K-1; received a minimum of {int(y.min())}")
    if y.max() >= MAX_NUM_CLASSES:  # before a name is made for each class up to it
        raise InputError(f"{where}: labels go up to {int(y.max())}; expected 0..K-1 with K at most {MAX_NUM_CLASSES:,}")
    images = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).contiguous()
    return ArrayDataset(images, torch.from_numpy(y.astype(np.int64)))


def _load_digits() -> tuple[ArrayDataset, list[str]]:
    from sklearn.datasets import load_digits  # noqa: PLC0415

    digits = load_digits()
    x = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # pixel values 0..16 -> 0..255
    return _from_arrays(x, digits.target, "digits"), [str(i) for i in range(10)]


# what each array of a data npz holds, for an error that cannot read it
_NPZ_EXPECTED = {"x": "uint8 images (N,H,W,C)", "y": "integer labels (N,)", "classes": "names as text (np.str_)"}


def _npz_array(archive, key: str, path: str | Path) -> np.ndarray:
    """``archive[key]``, or a one-line error: an array of Python objects (``dtype=object``, which numpy loads only
    by unpickling - running code from the file: never done here) or a member that cannot be read (truncated)."""
    try:
        return archive[key]
    except Exception as exc:
        pickled = isinstance(exc, ValueError) and "allow_pickle" in str(exc)
        what = ("an array of Python objects (dtype=object), which is not loaded (unpickling runs code from the file)"
                if pickled else f"an array that cannot be read ({type(exc).__name__})")
        raise InputError(f"{path}: '{key}' received {what}; expected {_NPZ_EXPECTED[key]}") from exc


def _class_name(name: Any, i: int, path: Path) -> str:
    """A class name of an npz's ``classes``: bytes (dtype 'S', from h5py or np.char.encode) are decoded as UTF-8."""
    if not isinstance(name, bytes):
        return str(name)
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: 'classes'[{i}] received {short_repr(bytes(name))}, which is not UTF-8 text; "
                         f"expected {_NPZ_EXPECTED['classes']} or UTF-8 bytes") from exc


def npz_fingerprint(path: str | Path) -> str:
    """sha256 of an npz's ``x`` then ``y`` (as int64) bytes: the same images in the same order give the same
    fingerprint, so a checkpoint's record can tell whether a file is the one its hold-out was drawn from."""
    import hashlib  # noqa: PLC0415

    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise InputError(f"{path}: cannot read as a numpy .npz archive ({type(exc).__name__}); expected x and y") from exc
    if not hasattr(archive, "files") or not {"x", "y"} <= set(archive.files):
        raise InputError(f"{path}: expected a .npz archive with 'x' (N,H,W,C uint8) and 'y' (N,)")
    with archive:
        h = hashlib.sha256(np.ascontiguousarray(_npz_array(archive, "x", path)).tobytes())
        h.update(np.ascontiguousarray(_npz_array(archive, "y", path)).astype(np.int64).tobytes())
    return h.hexdigest()


def load_npz(path: str | Path) -> tuple[ArrayDataset, list[str]]:
    """Images and class names of an ``.npz`` with ``x`` (N,H,W,C or N,H,W uint8), ``y`` (N,) and optional ``classes``."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: received a folder; expected an .npz file with x (N,H,W,C uint8) and y (N,)")
    if not path.is_file():
        raise FileNotFoundError(f"npz data not found: {path}")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise InputError(f"{path}: cannot read as a numpy .npz archive ({type(exc).__name__})") from exc
    if isinstance(archive, np.ndarray):  # a .npy file: one array, no labels
        raise InputError(f"{path}: received a .npy array; expected a .npz archive with 'x' (N,H,W,C uint8) and 'y' (N,)")
    with archive:
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            raise InputError(f"{path}: missing key(s) {missing}; expected 'x' (N,H,W,C uint8) and 'y' (N,) (found {archive.files})")
        dataset = _from_arrays(_npz_array(archive, "x", path), _npz_array(archive, "y", path), str(path))
        num_classes = int(dataset.labels.max()) + 1
        names = _npz_array(archive, "classes", path) if "classes" in archive.files else None
        if names is not None and names.ndim != 1:  # one string of names (a 0-d array) has no names to iterate
            raise InputError(f"{path}: 'classes' received a {names.ndim}-d array {short_repr(names.tolist())}; "
                             f"expected {_NPZ_EXPECTED['classes']}, a 1-d array of one name per class")
        classes = ([_class_name(c, i, path) for i, c in enumerate(names)]
                   if names is not None else [str(i) for i in range(num_classes)])
    if len(classes) < num_classes:
        raise InputError(f"{path}: 'classes' has {len(classes)} names but labels go up to {num_classes - 1}")
    return dataset, classes


def _load_cifar(cfg: DataConfig, train: bool) -> tuple[ArrayDataset, list[str]]:
    from torchvision import datasets  # noqa: PLC0415

    cls = datasets.CIFAR10 if cfg.name == "cifar10" else datasets.CIFAR100
    root = cfg.data_dir or "data"
    existed = Path(root).exists()
    try:
        ds = cls(root, train=train, download=cfg.download)
    except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted. You can use download=True ..."
        raise FileNotFoundError(f"{cfg.name} not found under {root!r}; pass --download or --data-dir with the extracted dataset") from exc
    except OSError as exc:  # urllib's URLError (no network), a refused connection, a full disk
        if not existed:  # leave no empty folder behind
            shutil.rmtree(root, ignore_errors=True)
        raise InputError(
            f"--download of {cfg.name} into {root!r} failed ({type(exc).__name__}: {getattr(exc, 'reason', exc)}); "
            "download it elsewhere and pass --data-dir with the extracted folder, or use --data npz"
        ) from exc
    return _from_arrays(np.asarray(ds.data), np.asarray(ds.targets), cfg.name), list(ds.classes)


def load_data(cfg: DataConfig, *, seed: int, split: str = "train") -> DataBundle:
    """Load ``cfg``'s images: the training part and the seeded validation hold-out.

    Args:
        cfg: the data config.
        seed: seeds the validation split.
        split: ``train`` (train + val held out of the training set) or ``test``
            (the official test set as ``val``; cifar10/100 and imagefolder ``val/`` only).
    """
    if split not in ("train", "test"):
        raise InputError(f"split: received {split!r}; expected train or test")
    if cfg.name == "imagefolder":
        return _load_folder(cfg, seed=seed, split=split)
    if split == "test" and cfg.name not in ("cifar10", "cifar100"):
        raise InputError(
            f"split 'test': data {cfg.name!r} has no official test set (only cifar10, cifar100 and imagefolder val/ do); "
            "evaluate on your own held-out images with --test-data PATH.npz (x: N,H,W,C uint8; y: N)"
        )
    if cfg.name == "digits":
        full, classes = _load_digits()
        augment = Augment(pad=1, flip=False)
    elif cfg.name == "npz":
        full, classes = load_npz(cfg.data_dir)
        augment = Augment(pad=max(1, full.images.shape[-1] // 8), flip=True)
    else:
        full, classes = _load_cifar(cfg, train=True)
        augment = Augment(pad=4, flip=True)
    train_idx, val_idx = split_indices(len(full), cfg.val_split, seed, cfg.limit, cfg.val_limit, cfg.holdout)
    train = full.subset(train_idx)
    val = full.subset(val_idx) if len(val_idx) else None
    if split == "test":
        val = _load_cifar(cfg, train=False)[0]  # whole: val_limit caps the run's hold-out, not the test set
    if cfg.name == "cifar10":
        mean, std = CIFAR10_MEAN, CIFAR10_STD
    elif cfg.name == "cifar100":
        mean, std = CIFAR100_MEAN, CIFAR100_STD
    else:
        mean, std = _stats(train.images)
    return DataBundle(
        train=train, val=val, class_names=classes, mean=mean, std=std,
        in_chans=train.images.shape[1], input_size=train.images.shape[-1], augment=augment,
        fingerprint=full.fingerprint(),
    )


# -- ImageNet-style folders ------------------------------------------------
def _load_folder(cfg: DataConfig, *, seed: int, split: str) -> DataBundle:
    from torch.utils.data import Subset  # noqa: PLC0415
    from torchvision import datasets, transforms as T  # noqa: PLC0415

    root = Path(cfg.data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    eval_tf = T.Compose([_frame_transform(), T.ToTensor(), norm])

    def folder(path: Path, transform) -> datasets.ImageFolder:
        return datasets.ImageFolder(path, transform=transform, loader=_read_rgb, is_valid_file=_is_listed_image)

    if (root / "train").is_dir():
        train = folder(root / "train", train_tf)
        classes = train.classes
        if cfg.limit is not None:  # a seeded subset: train/ is sorted by class (its first images: its first classes)
            train = Subset(train, _seeded_subset(len(train), cfg.limit, seed))
        listed = None  # val/ is its own images, not drawn from train/'s listing
        has_val = (root / "val").is_dir()
        val = folder(root / "val", eval_tf) if has_val else None
        if val is not None:
            _label_as(val, classes, root)
        if val is not None and cfg.val_limit is not None:
            val = Subset(val, _seeded_subset(len(val), cfg.val_limit, seed))
    else:
        if split == "test":
            raise InputError(f"split='test' needs {root}/val; the folder has no train/ and val/ subfolders")
        if cfg.holdout == "last":  # ImageFolder lists class by class: its last images are the last classes
            raise InputError(f"{root}: holdout 'last' holds out a folder's last images, which are whole classes (its "
                             "images are listed class by class), never trained on; expected random for an image folder",
                             hint="pass data.holdout='random'", cli_hint="drop --holdout last (random is the default)")
        train_full, eval_full = folder(root, train_tf), folder(root, eval_tf)
        train_idx, val_idx = split_indices(len(train_full), cfg.val_split, seed, cfg.limit, cfg.val_limit, cfg.holdout)
        train = Subset(train_full, train_idx.tolist())
        val = Subset(eval_full, val_idx.tolist()) if len(val_idx) else None
        classes = train_full.classes
        listed = _listing_fingerprint(root, train_full.samples)  # the hold-out is drawn from this listing
    return DataBundle(
        train=train, val=val, class_names=list(classes), mean=IMAGENET_MEAN, std=IMAGENET_STD,
        in_chans=3, input_size=224, folder=True, fingerprint=listed,
    )


def _listing_fingerprint(root: Path, samples: list[tuple[str, int]]) -> str:
    """sha256 of a folder's listing (relative paths, sizes, labels), what a one-folder run records in place of an
    npz's image bytes: an image added or removed draws another hold-out. Cheap: one stat per file, no decoding."""
    import hashlib  # noqa: PLC0415

    h = hashlib.sha256()
    for path, label in sorted(samples):
        h.update(f"{Path(path).relative_to(root).as_posix()}\t{Path(path).stat().st_size}\t{label}\n".encode())
    return h.hexdigest()


def _read_rgb(path: str):
    """A folder image as the runtime reads a file (:func:`~hne_edge.runtime.images.read_image`: 16-bit keeps its
    high byte, where PIL's convert clips it to white), so a model trains on what it is deployed on."""
    from PIL import Image  # noqa: PLC0415

    from ..runtime.images import read_image  # noqa: PLC0415

    return Image.fromarray(read_image(path, 3))


def _is_listed_image(path: str) -> bool:
    """An image file of a class folder: a format the runtime reads, not hidden (macOS's ``._name.png`` companions
    of an unzipped archive are not images)."""
    from ..runtime.images import is_image_path  # noqa: PLC0415

    return is_image_path(path) and not Path(path).name.startswith(".")


def _frame_transform():
    """A folder image (PIL) -> what evaluation and the demo's frames see: resized to 256, centre 224x224 crop."""
    from torchvision import transforms as T  # noqa: PLC0415

    return T.Compose([T.Resize(256), T.CenterCrop(224)])


def _seeded_subset(n: int, limit: int, seed: int) -> list[int]:
    keep = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:limit]
    return keep.sort().values.tolist()


def _label_as(val, classes: list[str], root: Path) -> None:
    """Give ``val``'s images train/'s labels: ImageFolder numbers each folder's own sorted classes, so a val/ short of
    one class shifted every later class's label (its images scored against another class's output)."""
    extra = sorted(set(val.classes) - set(classes))
    if extra:
        raise InputError(f"{root}: val/ has class folders train/ has not: {extra[:5]}{' ...' if len(extra) > 5 else ''}; "
                         "expected val/'s classes to be among train/'s (the model's outputs are train/'s classes)")  # fmt: skip
    to_train = {val.class_to_idx[c]: i for i, c in enumerate(classes) if c in val.class_to_idx}
    val.samples = [(path, to_train[label]) for path, label in val.samples]
    val.imgs, val.targets = val.samples, [label for _, label in val.samples]
    val.classes, val.class_to_idx = list(classes), {c: i for i, c in enumerate(classes)}


class _FolderLoader:
    """DataLoader over a folder dataset, shuffled per epoch by :func:`epoch_generator`, sliced per DDP rank."""

    def __init__(self, dataset, batch_size: int, *, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1,
                 num_workers: int = 0, drop_last: bool = False) -> None:
        if batch_size % world_size:
            raise InputError(f"batch_size={batch_size} must be divisible by the number of processes ({world_size})")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.rank, self.world_size, self.num_workers, self.drop_last = rank, world_size, num_workers, drop_last
        self.epoch = self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Epoch ``epoch`` from batch ``start`` on: the same batches as an uninterrupted pass (with worker
        processes, the random crops of the rest of the epoch differ: each worker's stream depends on its share)."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _indices(self) -> list[int]:
        n = len(self.dataset)
        order = torch.randperm(n, generator=epoch_generator(self.seed, self.epoch)) if self.shuffle else torch.arange(n)
        per_rank = self.batch_size // self.world_size
        out: list[int] = []
        for i in range(self.start, len(self)):
            batch = order[i * self.batch_size : (i + 1) * self.batch_size]
            out += batch[self.rank * per_rank : (self.rank + 1) * per_rank].tolist()
        return out

    def __iter__(self):
        from torch.utils.data import DataLoader  # noqa: PLC0415

        loader = DataLoader(
            self.dataset, batch_size=self.batch_size // self.world_size, sampler=self._indices(),
            num_workers=self.num_workers, generator=epoch_generator(self.seed + 1, self.epoch),
            persistent_workers=False, pin_memory=torch.cuda.is_available(),
        )
        return _worker_errors_in_one_line(iter(loader))


def _worker_errors_in_one_line(batches):
    """Re-raise a worker's InputError (a file that does not decode) as its own one line: torch re-raises it here
    with the worker's whole traceback in its message, whose last line is the original error's."""
    try:
        yield from batches
    except InputError as exc:
        text = str(exc)
        if "Original Traceback" not in text:
            raise
        raise InputError(text.rstrip().splitlines()[-1].split(": ", 1)[-1]) from None
