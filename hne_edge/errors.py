"""User-facing error types, shared by the library and the CLI (torch-free).

Every error raised for bad input names what was received and what was
expected. The CLI prints these as one line and exits with status 2.
:class:`HNEError` is the one base class a caller needs to catch; the
subclasses also derive from the builtin they replace (``InputError`` is a
``ValueError``, ``ResourceExhausted`` a ``RuntimeError``) so older
``except`` clauses keep working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HNEError",
    "InputError",
    "BundleError",
    "CheckpointError",
    "ExportError",
    "BackendUnavailable",
    "DeviceError",
    "ResourceExhausted",
    "short_repr",
]

REPR_LIMIT = 200


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a hostile file cannot turn one error line into megabytes."""
    text = repr(value) if not isinstance(value, (list, tuple, dict, set)) or len(value) <= limit else (
        f"<{type(value).__name__} of {len(value)} items>"
    )  # never build the repr of a huge container
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}... ({len(text)} chars)"


class HNEError(Exception):
    """Base class of hne-edge's user-facing errors."""


class InputError(HNEError, ValueError):
    """An input tensor or argument does not match what was expected."""


class BundleError(HNEError):
    """A bundle (manifest or model file) is missing, malformed or tampered with."""


class CheckpointError(HNEError):
    """A checkpoint is missing, corrupt, or not an hne-edge checkpoint."""


class ExportError(HNEError):
    """An export produced something that does not match the reference model."""


class BackendUnavailable(HNEError, ImportError):
    """An optional backend (TensorRT, CUDA, torch) is not installed or has no device."""


class DeviceError(HNEError, RuntimeError):
    """A device runtime call (CUDA, TensorRT) failed."""


class ResourceExhausted(HNEError, RuntimeError):
    """A bounded pool (paused sessions' device buffers) is full."""
