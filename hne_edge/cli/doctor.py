"""``hne-edge doctor``: check this install on this machine (a shell over :func:`hne_edge.doctor.run_doctor`)."""

from __future__ import annotations

import json
import sys

import click

from ..limits import THREADS_PER_CPU
from .options import quiet_option


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (for scripts) instead of the table.")
@click.option("--no-export", is_flag=True,
              help="Do not export a fresh tiny bundle even where torch is installed: check the shipped one only.")  # fmt: skip
@click.option("--repeats", type=click.IntRange(min=1), default=20, show_default=True,
              help="Runs per timing (the first leaf's and the full tree's medians).")  # fmt: skip
@click.option("--threads", type=click.IntRange(min=0), default=1, show_default=True,
              help=f"CPU threads of the CPU backends (0: the library's default; at most {THREADS_PER_CPU} per CPU).")  # fmt: skip
@quiet_option
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, no_export: bool, repeats: int, threads: int, quiet: bool | None) -> None:
    """Check that this install works on this machine: the environment (Python, numpy, onnxruntime, torch,
    cuda-python, TensorRT, GPUs, CPU features), then every backend x device x precision x plan that is present,
    run on a tiny HNE bundle against a float64 reference (every anytime prefix, a budgeted session, cancel),
    with first-leaf and full-tree times. Absent backends are listed with how to get them.

    Exit status 0 when everything present works, 1 when something present fails (named on stderr).
    """
    from ..doctor import run_doctor
    from ..limits import check_threads
    from ..progress import progress_for

    threads = check_threads(threads or None, "--threads")  # before anything is shown
    with progress_for(None, "doctor", "check", quiet=bool(quiet)) as progress:
        report = run_doctor(export=False if no_export else None, repeats=repeats, threads=threads, progress=progress)
    click.echo(json.dumps(report.to_dict(), indent=1) if as_json else report.format_table())
    if report.ok:
        return
    debug = isinstance(ctx.obj, dict) and ctx.obj.get("debug")
    for check in report.failures:
        if debug and check.traceback:
            click.echo(check.traceback, err=True)
    names = "; ".join([f"{name}: {why}" for name, why in report.broken.items()]
                      + [f"{c.label}: {c.error}" for c in report.failures]) or "no backend is present"  # fmt: skip
    click.echo(f"doctor: FAILED: {names}", err=True)
    sys.exit(1)
