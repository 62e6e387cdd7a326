"""The runtime's one input check, at the boundary, and image preprocessing (numpy only).

Everything past :func:`check_input` trusts its input: the scheduler's loop
never validates again.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from ..bundle import InputSpec
from ..errors import InputError

__all__ = ["check_input", "check_labels", "preprocess"]


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
            "(the batch range the bundle was exported and verified for; split the batch)"
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
    dtype = np.dtype(spec.dtype)
    mean = np.asarray(spec.mean, dtype=np.float32).reshape(1, c, 1, 1)
    inv_std = (1.0 / np.asarray(spec.std, dtype=np.float32)).reshape(1, c, 1, 1)
    x = images.transpose(0, 3, 1, 2).astype(np.float32) * np.float32(1 / 255)
    return np.ascontiguousarray(((x - mean) * inv_std).astype(dtype, copy=False))


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
