"""User-facing error types, shared by the library and the CLI (torch-free).

Every error raised for bad input names what was received and what was
expected. The CLI prints these as one line and exits with status 2.
"""

from __future__ import annotations

__all__ = ["HNEError", "InputError", "BundleError", "CheckpointError", "ExportError", "BackendUnavailable"]


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
