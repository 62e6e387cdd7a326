"""The runtime's one input check, at the boundary, and image preprocessing (numpy only).

Everything past :func:`check_input` trusts its input: the scheduler's loop
never validates again.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator, Sequence

import numpy as np

from ..bundle import InputSpec
from ..errors import InputError

__all__ = ["as_samples", "check_frames", "check_input", "check_labels", "frames", "preprocess"]


_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: str) -> np.dtype:
    dt = _DTYPES.get(name)
    if dt is None:
        dt = _DTYPES[name] = np.dtype(name)
    return dt


def _expected_shape(spec: InputSpec) -> str:
    c, (h, w) = spec.channels, spec.spatial
    return f"(batch, {c}, {h}, {w}) with batch in {spec.batch[0]}..{spec.batch[2]}"


def check_input(x: Any, spec: InputSpec) -> np.ndarray:
    """Validate a normalised NCHW batch against the bundle's input spec; return it C-contiguous.

    Checks, in order: type (a plain array: not a masked one), dtype, rank, channels, spatial size, batch range,
    finite values.
    Raises :class:`~hne_edge.errors.InputError` ("received X; expected Y").
    """
    if not isinstance(x, np.ndarray):
        kind = f"{type(x).__module__}.{type(x).__qualname__}"
        hint = "use .cpu().numpy()" if kind.startswith("torch.") else None
        raise InputError(f"input {spec.name}: received {kind}; expected a numpy.ndarray", hint=hint)
    # a masked array's isfinite().all() skips what the mask hides, and the model runs it. One exists only once
    # numpy.ma was imported: reading np.ma imports it, 50 ms on an application's first frame (bench_streams)
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise InputError(f"input {spec.name}: received a numpy masked array; expected a plain numpy.ndarray (the model "
                         "would run the values behind the mask)", hint="use x.filled(value) to choose them")  # fmt: skip
    if x.dtype != _dtype(spec.dtype):
        hint = "uint8 images: use runner.preprocess(images)" if x.dtype == np.uint8 else f"use x.astype(np.{spec.dtype})"
        raise InputError(f"input {spec.name}: received dtype {x.dtype}; expected {spec.dtype}", hint=hint,
                         cli_hint=f"save the frames as uint8 images (N,H,W,C), which the command normalises, or as "
                                  f"normalised {spec.dtype} (N,C,H,W)")  # fmt: skip
    if x.ndim != 4:
        hint = "; add a batch axis with x[None]" if x.ndim == 3 else ""
        raise InputError(
            f"input {spec.name}: received shape {tuple(x.shape)} (rank {x.ndim}); expected rank 4, "
            f"{_expected_shape(spec)}{hint}"
        )
    if x.shape[1] != spec.channels:
        nhwc = x.shape[3] == spec.channels
        raise InputError(
            f"input {spec.name}: received {x.shape[1]} channels (shape {tuple(x.shape)}); expected {spec.channels}, "
            f"{_expected_shape(spec)}",
            hint="NHWC? use runner.preprocess for images" if nhwc else None,
            cli_hint="NHWC? save the frames as uint8 images (N,H,W,C), which the command normalises" if nhwc else None,
        )
    if tuple(x.shape[2:]) != spec.spatial:
        raise InputError(
            f"input {spec.name}: received spatial size {x.shape[2]}x{x.shape[3]}; expected "
            f"{spec.spatial[0]}x{spec.spatial[1]} (resize the images to the bundle's input size)"
        )
    lo, _, hi = spec.batch
    if not lo <= x.shape[0] <= hi:
        raise InputError(
            f"input {spec.name}: received batch size {x.shape[0]}; expected {lo}..{hi} "
            "(the batch range the bundle was exported and verified for)",
            hint="split the batch" if x.shape[0] > hi else f"join samples (or repeat one) into a batch of {lo} or more",
        )
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise InputError(f"input {spec.name}: received {bad} non-finite value(s) (NaN/Inf); expected finite values")
    return np.ascontiguousarray(x)


def check_labels(y: Any, num_samples: int, num_classes: int, where: str = "labels") -> np.ndarray:
    """Class labels for ``num_samples`` samples: one integer in ``0..num_classes-1`` each (``run``, ``bench``,
    :func:`~hne_edge.runtime.bench.level_accuracy`); returns them as an int64 array."""
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != num_samples or not np.issubdtype(y.dtype, np.integer):
        raise InputError(
            f"{where}: received y of shape {tuple(y.shape)} and dtype {y.dtype} for {num_samples} samples of x; "
            f"expected {num_samples} integer labels"
        )
    outside = y[(y < 0) | (y >= num_classes)]
    if outside.size:
        shown = ", ".join(str(int(v)) for v in outside[:5]) + (", ..." if outside.size > 5 else "")
        raise InputError(
            f"{where}: received {outside.size} outside 0..{num_classes - 1} ({shown}); expected the index of one "
            f"of the bundle's {num_classes} classes"
        )
    return y.astype(np.int64, copy=False)


def preprocess(images: np.ndarray | Sequence[np.ndarray], spec: InputSpec) -> np.ndarray:
    """uint8 images -> the bundle's normalised NCHW float input.

    Accepts one image ``(H, W, C)`` or ``(H, W)`` (grayscale bundles), a batch
    ``(N, H, W, C)`` or ``(N, H, W)`` (grayscale bundles), or a list of images. A 3-d array is one image when its
    last axis is the bundle's channels; for a grayscale bundle, an RGB(A) image ``(H, W, 3 or 4)`` of the bundle's
    size is refused rather than read as H frames of W x 3 (issue 42), and so is an array that reads both ways.
    Pixels are scaled to [0, 1] and normalised with the manifest's mean/std. No resizing: the spatial size must match.
    """
    if isinstance(images, (list, tuple)):
        if not images:
            raise InputError("preprocess: received an empty list; expected at least one image")
        arrays = [np.asarray(im) for im in images]
        odd = next((i for i, a in enumerate(arrays) if a.shape != arrays[0].shape), None)
        if odd is not None:
            raise InputError(
                f"preprocess: received images of different sizes: image {odd} is {arrays[odd].shape}; image 0 is "
                f"{arrays[0].shape}; expected images of one size (resize them first)"
            )
        images = np.stack(arrays)
    elif not isinstance(images, np.ndarray):
        raise InputError(f"preprocess: received {type(images).__name__}; expected a uint8 numpy array or a list of them")
    return _normalise(_as_nhwc(images, spec), spec)


def _as_nhwc(images: np.ndarray, spec: InputSpec) -> np.ndarray:
    """uint8 images as :func:`preprocess` accepts them -> a uint8 (N, H, W, C) view, checked against the spec."""
    c, (h, w) = spec.channels, spec.spatial
    if images.dtype != np.uint8:
        raise InputError(
            f"preprocess: received dtype {images.dtype}; expected uint8 pixels (HWC or NHWC). "
            "Already-normalised float NCHW arrays go to run() directly"
        )
    if images.ndim == 2 and c == 1:
        images = images[None, :, :, None]
    elif images.ndim == 3 and images.shape[-1] == c:
        images = images[None]
    elif images.ndim == 3 and c == 1:
        _refuse_color_for_gray(images.shape, (h, w))
        images = images[..., None]  # (N, H, W) grayscale batch
    if images.ndim != 4 or images.shape[-1] != c:
        raise InputError(
            f"preprocess: received shape {tuple(images.shape)}; expected (H, W, {c}) or (N, H, W, {c}) uint8 images"
        )
    if tuple(images.shape[1:3]) != (h, w):
        raise InputError(
            f"preprocess: received images of {images.shape[1]}x{images.shape[2]}; expected {h}x{w} (resize first)"
        )
    return images


def _normalise(images: np.ndarray, spec: InputSpec) -> np.ndarray:
    c = spec.channels
    dtype = np.dtype(spec.dtype)
    mean = np.asarray(spec.mean, dtype=np.float32).reshape(1, c, 1, 1)
    inv_std = (1.0 / np.asarray(spec.std, dtype=np.float32)).reshape(1, c, 1, 1)
    x = images.transpose(0, 3, 1, 2).astype(np.float32) * np.float32(1 / 255)
    return np.ascontiguousarray(((x - mean) * inv_std).astype(dtype, copy=False))


def as_samples(x: np.ndarray, spec: InputSpec) -> np.ndarray:
    """A frame file's x as samples, batch first, not yet normalised: uint8 images as (N, H, W, C) (one image gets
    its N), float as given (one (C, H, W) sample gets its N). No copy: :func:`frames` normalises frame by frame."""
    if x.dtype == np.uint8:
        return _as_nhwc(x, spec)
    return x[None] if x.ndim == 3 else x


def frames(x: np.ndarray, spec: InputSpec, batch_size: int, *, pad: bool = False
           ) -> Iterator[tuple[int, np.ndarray, int]]:  # fmt: skip
    """(first sample, frame, samples in it) for ``x`` (:func:`as_samples`) cut into frames of ``batch_size``
    samples, the last holding what is left. uint8 images are normalised as their frame comes, so memory holds one
    frame's float copy, not the file's. ``pad``: a last frame below the batch range's min is filled up with copies
    of its last sample, whose answers the caller drops (a frame's samples are answered independently)."""
    for start in range(0, len(x), batch_size):
        yield start, *_frame(x, spec, start, batch_size, pad)


def _frame(x: np.ndarray, spec: InputSpec, start: int, batch_size: int, pad: bool) -> tuple[np.ndarray, int]:
    xb = x[start : start + batch_size]
    count = len(xb)
    if x.dtype == np.uint8:
        xb = _normalise(xb, spec)
    if pad and count < spec.batch[0]:
        xb = np.concatenate([xb, np.repeat(xb[-1:], spec.batch[0] - count, axis=0)])
    return xb, count


def check_frames(x: np.ndarray, spec: InputSpec, batch_size: int, where: str, *, pad: bool = False) -> None:
    """Check every frame :func:`frames` makes of ``x`` as ``run()`` will (:func:`check_input`), before any runs:
    an error names ``where`` and the frame. The frames of uint8 images differ only in their number of samples
    (normalised pixels are finite: the manifest's mean and std are checked), so their first and last stand for all."""
    last = (len(x) - 1) // batch_size
    for k in sorted({0, last}) if x.dtype == np.uint8 else range(last + 1):
        start = k * batch_size
        xb, count = _frame(x, spec, start, batch_size, pad)
        try:
            check_input(xb, spec)
        except InputError as exc:
            hint, cli_hint = exc.hint, exc.cli_hint
            if count < spec.batch[0] and start:  # the rest that batch_size leaves
                hint = (f"this last frame holds the {count} sample(s) that batch_size={batch_size} leaves of "
                        f"{len(x)}: choose a batch_size that leaves {spec.batch[0]} or more")  # fmt: skip
                cli_hint = hint.replace("batch_size=", "--batch-size ").replace("a batch_size", "a --batch-size")
            elif count < spec.batch[0]:
                hint = cli_hint = f"it holds {len(x)} sample(s) in all: give {spec.batch[0]} or more"
            raise InputError(f"{where}, frame {k} (samples {start}..{start + count - 1}): "
                             f"{exc.args[0]}", hint=hint, cli_hint=cli_hint) from None  # fmt: skip


def _refuse_color_for_gray(shape: tuple[int, ...], spatial: tuple[int, int]) -> None:
    """A 3-d uint8 array for a grayscale bundle is frames ``(N, H, W)``, unless it is an RGB(A) image of the bundle's
    size ``(H, W, 3 or 4)``: refused, naming the shape, as is an array that reads both ways (a 3x3 bundle's
    ``(3, 3, 3)``)."""
    (h, w), (a, b, d) = spatial, shape
    if (a, b) != (h, w) or d not in (3, 4):
        return
    if (b, d) == (h, w):
        raise InputError(f"preprocess: received shape {tuple(shape)}, which reads as one {h}x{w} image with {d} channels "
                         f"or as {a} grayscale {h}x{w} frames; this bundle takes 1 channel: pass grayscale frames as "
                         f"(N, {h}, {w}, 1)")  # fmt: skip
    raise InputError(f"preprocess: received shape {tuple(shape)}: one {h}x{w} image with {d} channels; this bundle takes 1 "
                     f"channel (grayscale, (H, W) or (N, H, W)); convert it to grayscale first (e.g. the mean of its "
                     "channels, or PIL's convert('L'))")  # fmt: skip
