"""User-facing error types, shared by the library and the CLI (torch-free).

Every error raised for bad input names what was received and what was
expected. The CLI prints these as one line and exits with status 2.
:class:`HNEError` is the one base class a caller needs to catch; the
subclasses also derive from the builtin they replace (``InputError`` is a
``ValueError``, ``ResourceExhausted`` a ``RuntimeError``) so older
``except`` clauses keep working.

How to fix an error depends on who reads it: a Python caller passes
``force=True``, a shell user ``--force``. An error carries both:
``hint`` is appended to ``str(exc)`` (the library's voice) and
``cli_hint`` replaces it in the CLI's one line (:meth:`HNEError.cli_message`;
``cli_hint=""`` says nothing at the CLI).
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
    "MissingExtra",
    "Terminated",
    "raise_terminated",
    "EXTRA_OF_MODULE",
    "missing_extra",
    "install_hint",
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
    """Base class of hne-edge's user-facing errors.

    Args:
        *args: the message (what was received, what was expected), as for any exception.
        hint: how a Python caller fixes it (``"pass force=True to replace it"``); part of ``str(exc)``.
        cli_hint: how a command-line user fixes it (``"pass --force to replace it"``); the CLI prints it
            instead of ``hint``. ``None``: the CLI prints ``hint``; ``""``: the CLI prints no hint.
    """

    def __init__(self, *args: Any, hint: str | None = None, cli_hint: str | None = None) -> None:
        super().__init__(*args)
        self.hint = hint
        self.cli_hint = cli_hint

    def _message(self) -> str:
        return super().__str__()

    def __str__(self) -> str:
        return _join(self._message(), self.hint)

    def cli_message(self) -> str:
        """The message with the hint a shell user can act on (see the class docstring)."""
        return _join(self._message(), self.hint if self.cli_hint is None else self.cli_hint)


def _join(message: str, hint: str | None) -> str:
    return f"{message}; {hint}" if hint else message


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
    """Memory ran out or would (a model, a warm-up or a batch this machine cannot hold; an allocation ONNX
    Runtime could not make), or a bounded pool (paused sessions' device buffers) is full."""


# The extra of pyproject.toml that installs each optional top-level module (tests check it against pyproject).
EXTRA_OF_MODULE = {
    "torch": "train", "torchvision": "train", "yaml": "train", "matplotlib": "train", "sklearn": "train",
    "tqdm": "train", "PIL": "runtime", "onnx": "onnx", "onnxscript": "onnx", "onnxruntime": "runtime",
    "tensorrt": "tensorrt", "cuda": "gpu",
}


def install_hint(extra: str) -> str:
    """The command that adds hne-edge's optional ``extra`` (one home for it). hne-edge is on no package index, so
    installing it by name finds nothing; the wheel built from a checkout does."""
    from . import __version__

    return f"pip install 'hne_edge-{__version__}-py3-none-any.whl[{extra}]' (the wheel of a checkout: docs/guide.md#installing-on-a-device)"


class MissingExtra(BackendUnavailable):
    """A command or feature needs an optional dependency that this installation lacks (e.g. a runtime-only
    device install running a training command)."""


def missing_extra(exc: ImportError, what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` to raise for ``exc`` (a failed import while running ``what``), or None when
    the missing module is not one of hne-edge's optional dependencies (then it is a bug, not the install)."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if not isinstance(exc, ModuleNotFoundError) or extra is None:
        return None
    return MissingExtra(
        f"{what} needs {name}, which is not installed here: it comes with hne-edge's '{extra}' extra",
        hint=install_hint(extra),
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a supervisor, a container stopping) while a command runs: raised in the main thread as
    Ctrl-C's ``KeyboardInterrupt`` is, so the same clean-up runs - scratch folders removed, nothing half-written where
    the user asked for an output, training's resumable checkpoint saved - and the CLI exits 143 (128 + SIGTERM)."""


def raise_terminated(signum: int, frame: Any) -> None:
    """hne-edge's SIGTERM handler (the CLI installs it for a command's run): :class:`Terminated`, once - a second
    SIGTERM during the clean-up is ignored rather than cutting it short (SIGKILL still ends it). Training replaces
    it, or the default action, with its own (finish the step, save, stop), never a handler the host installed."""
    import signal  # noqa: PLC0415

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()
