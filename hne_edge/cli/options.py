"""The options several commands share, defined once so that one concept has one flag and one meaning.

Conventions (docs/cli.md, "Conventions"):

* ``--batch-size N``: one batch size; ``--batch-sizes N[,N...]``: a list of them; ``export --batch-range
  MIN:OPT:MAX``: the range a bundle is built for (trtexec's min/opt/max shapes).
* ``--device``: ``auto`` everywhere (a GPU when the command's backend can use one here, else the CPU).
* ``--threads N``: CPU threads; ``0`` (the default) leaves the library's default; at most 4 per CPU
  (:func:`hne_edge.limits.check_threads`, applied by the library each option reaches).
* ``--quiet``: no progress output, on every command that prints progress.
* ``--force``: replace what is in the way: ``export`` an existing bundle (never a folder of yours), ``demo`` a
  demo's folder without its marker, ``eval``/``bench``/``profile``/``info --plot`` a file of a name they write that
  hne-edge did not write, never a folder (:func:`force_option`). Without it they replace only their own files.
* ``--debug``: tracebacks instead of one-line errors, before or after the command name.
* Input files: a bundle and frames (``.npz``/``.npy``/images) are arguments of ``run``; elsewhere frames are
  ``--frames PATH.npz`` and a dataset is ``--data NAME`` (with ``--data-dir``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import re
from pathlib import Path
from typing import Callable, Iterator

import click

from ..errors import HNEError
from ..limits import THREADS_PER_CPU

DEVICE_HELP = "auto (a GPU when one can be used here, else the CPU) | cpu | cuda[:N]."


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``, which it lets through (a NaN compares false with
    every bound): ``--jitter-ms inf`` was a traceback after the runner had opened, ``--guard-ms nan`` an error naming
    a Python argument. Every float option of the CLI is one."""

    name = "float range"  # the help as before: finite is what any reader of a range expects

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"received {value!r}; expected a finite number {self._describe_range()}", param, ctx)
        return number


class BundlePath(click.Path):
    """A bundle argument: an existing folder. A file is named as what it likely is, with the command that turns it
    into a bundle (:func:`hne_edge.bundle.not_a_bundle`; a checkpoint said "Directory '...' is a file", issue 28)."""

    name = "bundle"

    def __init__(self, **kwargs) -> None:
        super().__init__(exists=True, file_okay=False, **kwargs)

    def convert(self, value, param, ctx):
        from ..bundle import not_a_bundle

        error = not_a_bundle(value) if isinstance(value, (str, os.PathLike)) else None
        if error is not None:
            raise error
        return super().convert(value, param, ctx)


class CheckpointPath(click.Path):
    """A checkpoint argument: a file. A folder is named as what it is, with what to run instead: a bundle
    (``eval BUNDLE`` said only "File '...' is a directory", issue 42) or a training run's folder (its checkpoint)."""

    name = "checkpoint"

    def __init__(self, **kwargs) -> None:
        super().__init__(dir_okay=False, **kwargs)

    def convert(self, value, param, ctx):
        from ..bundle import MANIFEST_NAME
        from ..errors import InputError

        if isinstance(value, (str, os.PathLike)) and os.path.isdir(value):
            command = f"hne-edge {ctx.info_name}" if ctx is not None else "this command"
            if os.path.isfile(os.path.join(value, MANIFEST_NAME)):
                raise InputError(f"{value}: received a bundle folder; expected a checkpoint file ({command} takes the "
                                 "checkpoint the bundle was exported from)", cli_hint=f"for the bundle itself run "
                                 f"hne-edge bench {value} --frames FRAMES.npz (accuracy and latency of every level) or "
                                 f"hne-edge verify {value} (its files and numerics)")  # fmt: skip
            found = sorted(Path(value).glob("*.pt"))
            raise InputError(f"{value}: received a folder; expected a checkpoint file (what hne-edge train writes into "
                             "its --out folder)", cli_hint=f"pass {found[0]}" if len(found) == 1 else None)  # fmt: skip
        return super().convert(value, param, ctx)


def device_option(f: Callable) -> Callable:
    return click.option("--device", default="auto", show_default=True, help=DEVICE_HELP)(f)


def config_device_option(f: Callable) -> Callable:
    """``--device`` for a command whose config file may set the device: unset keeps the config's (auto by default)."""
    return click.option("--device", default=None, help=DEVICE_HELP[:-1] + " [default: auto, or the config's]")(f)


def threads_option(what: str) -> Callable[[Callable], Callable]:
    return click.option("--threads", type=click.IntRange(min=0), default=None,
                        help=f"{what} CPU threads (0 or unset: the default; at most {THREADS_PER_CPU} per CPU).")  # fmt: skip


def quiet_option(f: Callable, help: str = "No progress output.") -> Callable:
    return click.option("--quiet", is_flag=True, default=None, help=help)(f)


def force_option(what: str) -> Callable[[Callable], Callable]:
    """``--force`` of a command that writes files of fixed names where the user says: without it, it replaces only
    files it wrote (:func:`hne_edge.fileio.foreign_file`: a record saying its format, a figure carrying its seal)."""
    return click.option("--force", is_flag=True,
                        help=f"Also replace {what} that hne-edge did not write (yours, or an older version's); "
                             "never a folder.")  # fmt: skip


def parse_sizes(value: str | None, param: str) -> tuple[int, ...] | None:
    """``"1,8"`` -> ``(1, 8)`` (sorted, unique); every size >= 1."""
    if value is None:
        return None
    try:
        sizes = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise click.BadParameter(f"received {value!r}; expected comma-separated integers >= 1 like 1,8",
                                 param_hint=param)  # fmt: skip
    return sizes


def batch_sizes_option(default: str | None, help: str) -> Callable[[Callable], Callable]:
    return click.option("--batch-sizes", default=default, show_default=default is not None, metavar="N[,N...]",
                        callback=lambda ctx, param, value: parse_sizes(value, "--batch-sizes"), help=help)  # fmt: skip


def within_batch_range(batch: tuple[int, int, int], sizes, flag: str) -> None:
    """Batch sizes the user typed against a bundle's batch range ``(min, opt, max)``, refused naming ``flag`` (the
    runtime's own error names its argument: "batch_sizes[]", "input image"). One check for run, bench, profile and
    verify."""
    lo, _, hi = batch
    outside = [b for b in sizes if not lo <= b <= hi]
    if outside:
        raise click.BadParameter(f"received {','.join(map(str, outside))}; expected {lo}..{hi} (the batch range the "
                                 "bundle was exported and verified for)", param_hint=flag)  # fmt: skip


@contextlib.contextmanager
def flag_names(names: dict[str, str]) -> Iterator[None]:
    """Errors raised inside name the flags the user typed, not the Python parameters or config keys they set:
    ``names`` maps each (``budget_ms``, ``data.limit``) to its flag (``--budget-ms``, ``--limit``). The library
    keeps its own voice (a Python caller passed ``budget_ms``); the command that took the flag renames it."""
    try:
        yield
    except HNEError as exc:
        if not names or not exc.args or not isinstance(exc.args[0], str):
            raise
        pattern = re.compile(r"(?<![\w.\-])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w])")
        renamed = pattern.sub(lambda m: names[m.group(1)], exc.args[0])
        if renamed == exc.args[0]:
            raise
        new = copy.copy(exc)
        new.args = (renamed, *exc.args[1:])
        raise new from None


def typed_flags() -> dict[str, str]:
    """The running command's {config key: flag} of the flags the user typed (filled by the command as it reads
    them; :func:`names_typed_flags` renames its errors with it)."""
    return click.get_current_context().meta.setdefault("hne_edge.typed_flags", {})


def names_typed_flags(command: Callable) -> Callable:
    """Run ``command`` so that its errors name the flags the user typed (:func:`typed_flags`), not config keys."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        with flag_names(typed_flags()):
            return command(*args, **kwargs)

    return run


def debug_option() -> click.Option:
    """``--debug`` after the command name: the same switch as ``hne-edge --debug COMMAND``."""

    def turn_on(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value and isinstance(ctx.obj, dict):
            ctx.obj["debug"] = True  # the group's dict, shared with every sub-context

    return click.Option(["--debug"], is_flag=True, expose_value=False, callback=turn_on,
                        help="Show full tracebacks instead of one-line errors.")  # fmt: skip
