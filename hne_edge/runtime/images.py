"""Image files -> uint8 arrays for :meth:`AnytimeRunner.preprocess` (numpy + Pillow; no torch).

Pillow is imported when the first image is read, so the runtime imports
without it; a machine that only feeds arrays never needs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailable, InputError, install_hint

__all__ = ["IMAGE_SUFFIXES", "is_image_path", "read_image"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def is_image_path(path: str | os.PathLike) -> bool:
    """Whether ``path``'s suffix names an image format :func:`read_image` reads."""
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


_SIXTEEN_BITS = ("I;16", "I;16L", "I;16B", "I;16N")  # 16-bit grayscale (PNG, TIFF): 0..65535
_WIDE = {"I": "32-bit integer pixels", "F": "floating-point pixels"}


def _as_channels(im, channels: int) -> np.ndarray:
    return np.asarray(im.convert("L" if channels == 1 else "RGB"))


def read_image(path: str | os.PathLike, channels: int) -> np.ndarray:
    """The image at ``path`` as uint8 ``(H, W)`` (``channels == 1``, grayscale) or ``(H, W, 3)`` (RGB).

    16-bit grayscale keeps its high byte; 32-bit integer (mode I) and float (F) pixels are refused."""
    if channels not in (1, 3):
        raise InputError(f"read_image: received channels={channels!r}; expected 1 (grayscale) or 3 (RGB)")
    try:
        from PIL import Image
    except ImportError:
        raise BackendUnavailable(f"{path}: reading images needs Pillow, which hne-edge's 'runtime' extra installs: "
                                 f"{install_hint('runtime')}; or pass .npy/.npz") from None
    try:
        with Image.open(path) as im:
            if im.mode in _SIXTEEN_BITS:  # convert() clips at 255: an all-white image. Keep the high byte
                return _as_channels(Image.fromarray((np.asarray(im) >> 8).astype(np.uint8)), channels)
            if im.mode in _WIDE:  # no range to scale by
                raise InputError(f"{path}: received a mode {im.mode} image ({_WIDE[im.mode]}); expected 8-bit or "
                                 "16-bit pixels (convert the image to 8 bits first)")  # fmt: skip
            return _as_channels(im, channels)
    except InputError:  # a ValueError, but not a decoding failure
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # UnidentifiedImageError is an OSError
        raise InputError(f"{path}: cannot decode the image ({type(exc).__name__}); expected a readable image file") from None
