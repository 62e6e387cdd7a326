"""The ``hne-edge`` command line: a thin shell over library functions.

Each command lives in its own module and is imported only when it runs,
so ``hne-edge --help`` is instant and ``hne-edge run`` needs no torch.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import warnings
from typing import Iterator

import click

from .. import __version__
from ..errors import HNEError, Terminated, missing_extra, raise_terminated

# command name -> (module, function, one-line help). Help lives here so that
# listing commands imports nothing.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("hne_edge.cli.train", "train", "Train an HNE (independent / structured / distill / hierarchical loss)."),
    "eval": ("hne_edge.cli.train", "eval_", "Evaluate a checkpoint for every ensemble size; write metrics.json and plots."),
    "info": ("hne_edge.cli.info", "info", "Print a zoo model's tree, per-node costs and anytime cost curve."),
    "export": ("hne_edge.cli.export", "export", "Export a checkpoint to a verified bundle (ONNX or TensorRT)."),
    "verify": ("hne_edge.cli.export", "verify", "Check a bundle's files and numerics; print a per-file table."),
    "inspect": ("hne_edge.cli.export", "inspect", "Print a bundle's manifest as a tree with sizes and MACs."),
    "profile": ("hne_edge.cli.runtime", "profile", "Measure each model file of a bundle on this device; save the cost model."),
    "bench": ("hne_edge.cli.runtime", "bench", "Latency of every anytime level; JSON + PNG curve."),
    "run": ("hne_edge.cli.runtime", "run", "Run anytime inference on images or .npy/.npz under a per-frame budget."),
    "bench-streams": ("hne_edge.cli.runtime", "bench_streams", "Replay K cameras in real time through the stream scheduler and its baselines."),
    "demo": ("hne_edge.cli.demo", "demo", "Train, evaluate, export, verify, profile and run a small HNE end to end."),
    "doctor": ("hne_edge.cli.doctor", "doctor", "Check this install on this machine: environment, every backend present, exit 1 if one fails."),
}


EXIT_READER_GONE = 141  # 128 + SIGPIPE: what a shell reports for a command that a closed pipe ended


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        command = getattr(importlib.import_module(module), attr)
        if not any(p.name == "debug" for p in command.params):  # `hne-edge run ... --debug` works too
            from .options import debug_option

            command.params.append(debug_option())
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            with warnings_as_lines(), terminate_as_interrupt():
                return super().invoke(ctx)
        except click.UsageError as exc:  # a bad option: one line too, naming the command's --help
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            click.echo(f"Error: {printable(' '.join(exc.format_message().split()))} (see {where} --help)", err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # click prints these itself
        except KeyboardInterrupt as exc:  # Ctrl-C: the shell convention 128 + SIGINT, not click's "Aborted!" and 1
            if ctx.obj and ctx.obj.get("debug"):
                raise
            terminated = isinstance(exc, Terminated)
            click.echo("Terminated" if terminated else "Interrupted", err=True)
            sys.exit(128 + signal.SIGTERM if terminated else 130)
        except BrokenPipeError:  # the reader went away (`| head`): the shell's quiet exit, as if ended by SIGPIPE
            for stream in (sys.stdout, sys.stderr):  # what is still buffered, or said at exit, goes nowhere
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            sys.exit(EXIT_READER_GONE)
        except (HNEError, OSError, ImportError) as exc:  # the user's input, the file system, the install: one line, exit 2
            if ctx.obj and ctx.obj.get("debug"):
                raise
            if isinstance(exc, ImportError) and not isinstance(exc, HNEError):
                exc = missing_extra(exc, f"hne-edge {ctx.invoked_subcommand or 'this command'}") or exc
                if not isinstance(exc, HNEError):
                    raise  # not an optional dependency: a bug in hne-edge, shown as one
            click.echo(f"Error: {one_line(exc)}", err=True)
            sys.exit(2)
        # anything else is a bug in hne-edge: Python's traceback and exit 1, never dressed up as a user error


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`~hne_edge.errors.Terminated` while the command runs (main thread only: Python's rule
    for handlers), once (:func:`~hne_edge.errors.raise_terminated`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Python warnings (the runtime's: a dropped profile, a machine too busy for its budgets; a library's) as one
    ``warning: ...`` line each on stderr, when they happen, in every command: not Python's ``file:line:
    UserWarning: ...`` and the source line that warned. Which warnings show is Python's filters' call, as ever."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        click.echo(f"warning: {printable(' '.join(str(message).split()))}", err=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def printable(text: object) -> str:
    """``text`` with control characters escaped: names read from files must not drive the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(exc: BaseException) -> str:
    """The CLI's message for a user error ``exc`` (an :class:`HNEError` or an ``OSError``): one printable line."""
    if isinstance(exc, HNEError):
        message = exc.cli_message()
    elif isinstance(exc, KeyError) and exc.args:
        message = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.strerror:  # e.g. ENOSPC: "No space left on device: 'out/...'"
        message = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    else:
        message = str(exc) or type(exc).__name__
    return printable(" ".join(message.split()))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hne-edge")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """hne-edge: train, export and run distilled Hierarchical Neural Ensembles for anytime inference."""
    ctx.obj = {"debug": debug}


if __name__ == "__main__":  # pragma: no cover
    main()
