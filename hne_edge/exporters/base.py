"""What every exporter shares (torch-free): option parsing, typed errors, tolerances, provenance,
and the atomic output directory.

A bundle is built in a temporary sibling of the output directory and renamed
into place only when it is complete and verified, so a crash or a failed
check never leaves a half bundle where a runtime would find it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..bundle import EXPORT_PLANS, PLAN_GROUPS, PLANS, PRECISIONS, batch_range_ok, why_not_replaceable
from ..errors import ExportError, InputError, short_repr
from ..fileio import (absolute_folder, check_output_dir, new_folders, remove_new_folders, remove_stale, scratch_path,
                      swap_dir_into_place)
from ..limits import MAX_BATCH

__all__ = [
    "ShapeError",
    "ToleranceError",
    "OutputMismatchError",
    "Tolerance",
    "TOLERANCES",
    "DEFAULT_OPSET",
    "PLAN_CHOICES",
    "parse_precisions",
    "parse_batch",
    "parse_plan",
    "check_opset",
    "check_normalization",
    "provenance",
    "package_version",
    "atomic_output_dir",
    "check_replaceable",
]

# TensorRT 10's ONNX parser supports opsets up to 20+; 17 is also what TensorRT 8.6 and ONNX Runtime
# >= 1.14 read, and the TorchScript exporter emits it natively (no version conversion).
DEFAULT_OPSET = 17
MIN_OPSET, MAX_OPSET = 13, 20
# what `export --plan` accepts: each plan that runs the whole tree (in the manifest's order), a comma-separated
# list of them, or a group of hne_edge.bundle.PLAN_GROUPS ("both": nodes and segments, what it meant before there
# were more; "all")
PLAN_CHOICES = EXPORT_PLANS + tuple(PLAN_GROUPS)


class ShapeError(ExportError):
    """An exported file's inputs/outputs do not have the names, dtypes or shapes expected."""


class ToleranceError(ExportError):
    """An exported file's outputs differ from the reference by more than the bound."""


class OutputMismatchError(ExportError):
    """Two plans (or a file and the manifest) disagree on what they compute."""


@dataclass(frozen=True)
class Tolerance:
    """``max |y - ref| <= atol + rtol * max |ref|`` (one number per output tensor); ``per_element``:
    ``|y - ref| <= atol + rtol * |ref|`` for each element, as ``numpy.allclose`` and Polygraphy compare (what
    ``verify --atol/--rtol`` ask for).

    fp32 files must match PyTorch to ``atol = 1e-4``. fp16 files compute in
    half precision end to end (10-bit mantissa: relative step ~1e-3) through
    up to ~20 layers: ``2e-2 + 2e-2 * max |ref|``, compared with the fp32
    PyTorch model. The error of a trained model's fp16 logits is about
    absolute (its features are as large for every image; an uncertain
    image's logits are small), so the bound has a fixed part. Measured
    2026-12-01 on the shipped checkpoints (every file and anytime prefix, real
    CIFAR-10 images one at a time, batches of 16, random images): worst error
    0.025 absolute, 0.29 of the bound (demo) and 0.22 (reference); the former
    bound ``1e-3 + 5e-3 * max |ref|``, measured on randomized models only, was
    exceeded by up to 1.8x (6 of 60 images; the reference's default export
    failed). A wrong export still fails: the stem's weights x1.03, one leaf's
    head x1.03, a BatchNorm bias +0.05 or two branches swapped were caught on
    every image (1.2x to 44x the bound, median); a 1 % weight error is not
    reliably (the fp16 files' own error is that large); ``verify --atol
    --rtol`` set another bound, and fp32 files are held to 1e-4.

    """

    atol: float
    rtol: float = 0.0
    per_element: bool = False

    def bound(self, ref_scale: float) -> float:
        return self.atol + self.rtol * ref_scale

    def describe(self) -> str:
        """The bound as a formula (a report's note)."""
        return f"{self.atol:g} + {self.rtol:g} x " + ("|ref| per element" if self.per_element else "max|ref|")


TOLERANCES = {"fp32": Tolerance(atol=1e-4), "fp16": Tolerance(atol=2e-2, rtol=2e-2)}


def parse_precisions(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``"fp32"``, ``"fp32,fp16"`` or a sequence of those -> ordered unique tuple."""
    items = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    items = [p.strip().lower() for p in items if p.strip()]
    bad = [p for p in items if p not in PRECISIONS]
    if bad or not items:
        raise InputError(f"precision must be one or more of {list(PRECISIONS)}; received {value!r}")
    return tuple(p for p in PRECISIONS if p in items)


def parse_batch(value: str | tuple[int, int, int] | list[int]) -> tuple[int, int, int]:
    """``"MIN:OPT:MAX"`` (or ``"N"`` = ``N:N:N``) or a 3-tuple -> validated (min, opt, max) (:func:`batch_range_ok`)."""
    try:
        parts = [int(v) for v in value.split(":")] if isinstance(value, str) else [int(v) for v in value]
    except (TypeError, ValueError):
        parts = []
    if len(parts) == 1:
        parts = parts * 3
    if not batch_range_ok(parts):
        raise InputError(f"batch must be MIN:OPT:MAX with 1 <= MIN <= OPT <= MAX <= {MAX_BATCH}; received {short_repr(value)}")
    return parts[0], parts[1], parts[2]


def parse_plan(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"segments"``, ``"segments,subtrees,fused"``, ``"both"``, ``"all"`` (or a sequence of those) -> the file
    plans, unique, in the manifest's order."""
    items = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    items = [p.strip() for p in items if p.strip()]
    if not items or any(p not in PLAN_CHOICES for p in items):
        raise InputError(
            f"plan must be one or more of {list(PLAN_CHOICES)} (comma-separated, e.g. segments,subtrees,fused); "
            f"received {value!r}"
        )
    chosen = {q for p in items for q in PLAN_GROUPS.get(p, (p,))}
    return tuple(p for p in PLANS if p in chosen)


def check_opset(opset: int) -> int:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputError(f"opset must be an integer in {MIN_OPSET}..{MAX_OPSET}; received {opset!r}")
    return opset


def check_normalization(normalization: dict, channels: int) -> None:
    """``{"mean": [...], "std": [...]}``: ``channels`` finite numbers each, std > 0 (what the manifest will accept)."""
    import math

    ok = isinstance(normalization, dict) and set(normalization) == {"mean", "std"}
    if ok:
        mean, std = normalization["mean"], normalization["std"]
        ok = all(
            isinstance(v, (list, tuple)) and len(v) == channels
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
            for v in (mean, std)
        ) and all(x > 0 for x in std)  # fmt: skip
    if not ok:
        raise InputError(
            f"normalization must be {{'mean': [...], 'std': [...]}} with {channels} finite values each and std > 0; "
            f"received {short_repr(normalization)}"
        )


def package_version(module: str) -> str | None:
    """The installed version of ``module``'s distribution, or None when it is not installed."""
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed
        return None


def provenance(**extra) -> dict:
    """Who made the bundle, with what, when."""
    from .. import __version__

    data = {
        "hne_edge": __version__,
        "torch": package_version("torch"),
        "onnx": package_version("onnx"),
        "onnxruntime": package_version("onnxruntime"),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    data.update({k: v for k, v in extra.items() if v is not None})
    return data


def check_replaceable(out: Path, keep: Sequence[str | os.PathLike] = ()) -> None:
    """Refuse to ``force``-replace anything but an empty folder or a bundle (:func:`bundle.why_not_replaceable`),
    the current directory or a folder holding it, and a folder holding any path in ``keep`` (the export's source)."""
    real = out.resolve()
    here = Path.cwd().resolve()
    if real == here or real in here.parents:
        reason = "it is or contains the current directory"
    else:
        source = next((p for p in keep if real in (Path(p).resolve(), *Path(p).resolve().parents)), None)
        reason = f"it contains the export's source {source}" if source is not None else why_not_replaceable(out)
    if reason is not None:
        raise ExportError(
            f"refusing to replace {out}: {reason}",
            hint="force=True replaces only an empty folder or an hne-edge bundle; choose another out_dir or remove it yourself",
            cli_hint="--force replaces only an empty folder or an hne-edge bundle; choose another --out or remove it yourself",
        )


def _check_out(out: Path, force: bool, keep: Sequence[str | os.PathLike]) -> None:
    """What :func:`atomic_output_dir` may put its bundle at (see there)."""
    if out.is_symlink():  # first: it may point nowhere, and --force would not help
        raise ExportError(
            f"output path {out} is a symbolic link (to {os.readlink(out)}); expected a folder",
            hint="pass the folder it points to as out_dir", cli_hint="pass the folder it points to as --out",
        )
    if not out.exists():
        return
    if not out.is_dir():  # --force would not help, so do not suggest it
        raise ExportError(f"output path {out} exists and is not a directory; expected a new or bundle folder")
    if os.path.ismount(out):  # the bundle is swapped in whole beside it, which a mount point (a volume) cannot be
        raise ExportError(f"output path {out} is a mount point, which cannot be replaced as a folder; "
                          "expected a new or bundle folder", hint=f"pass a new folder inside it, e.g. {out / 'bundle'}",
                          cli_hint=f"pass a new folder inside it, e.g. --out {out / 'bundle'}")  # fmt: skip
    if not force:
        raise ExportError(f"output directory {out} already exists", hint="pass force=True to replace it",
                          cli_hint="pass --force to replace it")
    check_replaceable(out, keep)


@contextlib.contextmanager
def atomic_output_dir(
    out_dir: str | os.PathLike, force: bool = False, keep: Sequence[str | os.PathLike] = ()
) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces ``out_dir``, on failure it is removed.

    ``out_dir`` is refused up front when it exists and ``force`` is false, so
    nothing is computed for an export that could not be written. ``force``
    replaces only an empty folder or a bundle (see :func:`check_replaceable`;
    ``keep``: paths that must survive, e.g. the source checkpoint), checked
    again just before the swap, so a file a user put there meanwhile is not
    deleted with it. A symbolic link at ``out_dir`` is refused: replacing the
    link would leave its target stale, replacing the target would write
    where the user did not name. The swap is one atomic exchange where the
    OS has one (Linux), so a crash leaves the old bundle or the new one at
    ``out_dir``. Leftovers of killed exports are removed on the next export
    to the same place. The directory gets the usual umask mode (not
    ``mkdtemp``'s 0700).
    """
    if not str(out_dir).strip():  # Path("") is the current directory: never what an empty --out meant
        raise InputError("output folder: received an empty path; expected the name of a folder to create",
                         hint="pass out_dir='bundle' (any new folder)", cli_hint="pass --out DIR, e.g. --out bundle")  # fmt: skip
    out = absolute_folder(out_dir)
    _check_out(out, force, keep)
    check_output_dir(out_dir, "--out")  # a new folder that could not be made fails here, not as its scratch folder
    created = new_folders(out.parent)  # removed again on failure, as staged_output does: no new folder left behind
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = scratch_path(out, "partial")
    tmp.mkdir()
    try:
        yield tmp
        _check_out(out, force, keep)  # again: the export took a while, and the user may have been busy
        swap_dir_into_place(tmp, out)  # inside: a swap that fails leaves no scratch folder either
    except OSError as exc:  # a full disk: name the file as the user knows it, not its scratch folder (removed now)
        shutil.rmtree(tmp, ignore_errors=True)
        remove_new_folders(created)
        name = exc.filename if isinstance(exc.filename, str) else None
        if name and exc.errno is not None and Path(name).is_relative_to(tmp):
            raise type(exc)(exc.errno, exc.strerror, str(out / Path(name).relative_to(tmp))) from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_new_folders(created)
        raise
