"""The benchmarks' one harness: how every script of benchmarks/ times, records the machine and writes its report.

A script imports it by name (``from harness import paired, write_report``: a script's own folder is first on
``sys.path``), which also puts this checkout first, so a script measures the code beside it from anywhere.

* **timing** - :func:`timed`, :func:`paired` (two calls alternated ABBA), :func:`rotation` (several, each
  following every other alike): medians of calls measured side by side in one process, whose ratios are the
  figures that transfer from a shared machine (its load hits both sides of a ratio alike);
* **the machine and its load** - :func:`machine` (the line a report names its machine by), :func:`load_average`,
  :class:`LoadRecord` (the load at each moment a script notes it, as the range a report gives);
* **scheduling** - :func:`pin` (threads to cores, as a device of that many cores), :func:`realtime` and
  :func:`normal_priority` (SCHED_FIFO on and off), :func:`cpu_load` (busy loops beside the measurement);
* **options** - :class:`ArgumentParser` (a refused option is one line, ``Error: ...``, exit 2), the types of
  counts and times (:func:`count`, :func:`counts`, :func:`positive_float`: refused when parsed, not as a traceback
  after minutes of work) and :func:`parse_args` (``--smoke`` fills only the options the user did not type);
* **reports** - :func:`command_line` (the command a report says made it), :func:`write_report` (markdown and the
  raw figures as JSON beside it) and :func:`write_json`, each file written whole: a run cut off keeps its last
  complete report;
* **folders** - :func:`work_folder` (``--workdir`` when given, else a temporary folder removed at exit);
* **models** - :func:`randomized_model`: latency does not depend on the weights, but a check of an export does
  on non-trivial BatchNorm statistics (the suite's ``randomize_``, one home for that rule).

Standard library only at import: the GPU acceptance run starts scripts with a bare machine's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))  # after the script's own folder, before an installed hne_edge


# -- timing ------------------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes (``time.perf_counter``)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_ms(seconds: Sequence[float]) -> float:
    return statistics.median(seconds) * 1e3


def paired_times(fa: Callable[[], Any], fb: Callable[[], Any], repeats: int) -> tuple[list[float], list[float]]:
    """Each call's seconds, the two alternated ABBA (A B, B A, A B, ...): each follows the other as often as itself,
    so caches, clocks and the machine's load treat them alike."""
    ta: list[float] = []
    tb: list[float] = []
    for k in range(repeats):
        for first in ((True, False) if k % 2 == 0 else (False, True)):
            (ta if first else tb).append(timed(fa if first else fb))
    return ta, tb


def paired(fa: Callable[[], Any], fb: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Medians (ms) of two calls alternated ABBA (:func:`paired_times`)."""
    ta, tb = paired_times(fa, fb, repeats)
    return median_ms(ta), median_ms(tb)


def rotation(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 0) -> dict[str, float]:
    """Medians (ms) of several calls run in turn, the order shifted by one each repeat (A B C, B C A, C A B, ...):
    each follows every other alike. ``warmup`` untimed calls of each first."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    for k in range(repeats):
        for name in names[k % len(names):] + names[: k % len(names)]:
            times[name].append(timed(fns[name]))
    return {k: median_ms(v) for k, v in times.items()}


# -- the machine and its load ------------------------------------------------------------------------------------


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(gpu: str | None = None) -> str:
    """The line a report names its machine by: ``gpu`` (a device name, when the figures are a GPU's), the CPU, its
    cores, Python, and the versions of torch and onnxruntime where this process imported them."""
    parts = [gpu] if gpu else []
    parts += [f"{cpu_name()}, {os.cpu_count()} CPUs", f"Python {platform.python_version()}"]
    for name in ("torch", "onnxruntime"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__version__", None):
            parts.append(f"{name} {module.__version__}")
    return "; ".join(parts)


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class LoadRecord:
    """The 1-minute load average at each moment a script notes it (before each run, at the end): on a shared
    machine the load moves every absolute time, so a report gives the range beside its figures."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    def note(self) -> float | None:
        value = load_average()
        if value is not None:
            self.samples.append(value)
        return value

    def __str__(self) -> str:
        if not self.samples:
            return "load average unknown"
        lo, hi = min(self.samples), max(self.samples)
        return f"load average {lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"load average {lo:.1f}-{hi:.1f}"


# -- scheduling --------------------------------------------------------------------------------------------------


def pin(cores: Sequence[int] | None, thread_id: int = 0) -> bool:
    """Pin a thread (0: the calling one; a native id otherwise) to ``cores`` where the platform can (Linux), as a
    device of that many cores. None or empty: leave it. True when pinned."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return False
    os.sched_setaffinity(thread_id, list(cores))
    return True


def realtime(priority: int = 1) -> None:
    """SCHED_FIFO for this process (Linux; root), what a deployed real-time inference process gets. Linux throttles
    real-time tasks past 95% of each second: leave idle gaps between frames."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))


@contextlib.contextmanager
def normal_priority() -> Iterator[None]:
    """SCHED_OTHER inside (a real-time process's busy loops beside it must compete as equals), the policy back after."""
    policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    if policy is None or policy == os.SCHED_OTHER:
        yield
        return
    param = os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


@contextlib.contextmanager
def cpu_load(processes: int, seconds: float, cores: Sequence[int] | None = None) -> Iterator[Callable[[], bool]]:
    """``processes`` busy loops (one per core: artificial load), each ending by itself after ``seconds`` and killed on
    exit, free to run on ``cores`` (default: the calling process's; a script pinned to a device's cores passes the
    machine's, or every loop lands on the device: six loops pinned with it ran its calls 31x slower, where busy
    neighbours spread over a 2-core machine take a share of each core). Yields a function that says whether they
    all still run (False: the measurement outlasted the load)."""
    setaffinity = f"import os\nos.sched_setaffinity(0, {sorted(cores)!r})\n" if cores else ""
    code = setaffinity + f"import time\nend = time.monotonic() + {float(seconds)!r}\nwhile time.monotonic() < end:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(processes)]
    try:
        time.sleep(0.5)  # let them start
        yield lambda: all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()


# -- options -----------------------------------------------------------------------------------------------------


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's user errors: one line ``Error: what was received; what was expected`` on stderr,
    exit 2 (argparse's usage block buried the line that said what was wrong)."""

    def error(self, message: str):
        self.exit(2, f"Error: {message}\n")


def count(minimum: int = 1) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"received {text!r}; expected an integer >= {minimum}")
        return value

    return parse


def counts(text: str) -> list[int]:
    """An argparse ``type``: a comma list of integers >= 1 (``"1,16"`` -> ``[1, 16]``), in the order given."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"received {text!r}; expected comma-separated integers >= 1 like 1,2")
    return values


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"received {text!r}; expected a number > 0")
    return value


def parse_args(ap: argparse.ArgumentParser, argv: Sequence[str] | None, smoke: dict[str, Any]) -> argparse.Namespace:
    """``ap``'s arguments; with ``--smoke``, ``smoke``'s values for the options the user did not type (their
    defaults), so the command a report records is the one that made its figures (it replaced typed ones)."""
    args = ap.parse_args(argv)
    if getattr(args, "smoke", False):
        ap.set_defaults(**smoke)
        args = ap.parse_args(argv)
    return args


# -- reports -----------------------------------------------------------------------------------------------------


def command_line(argv: Sequence[str] | None = None) -> str:
    """``python benchmarks/SCRIPT ARGS``: the command a report says made it (the script relative to the checkout)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    shown = script.relative_to(REPO).as_posix() if script.is_relative_to(REPO) else argv[0]
    return " ".join(["python", shown, *argv[1:]])


def write_json(path: str | os.PathLike, data: Any, indent: int | None = 1) -> Path:
    """``data`` as JSON at ``path`` (NaN allowed: a figure not measured; ``indent`` None: one line, for long
    traces), written whole; its folder made."""
    from hne_edge.fileio import atomic_write_json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, data, indent=indent, allow_nan=True)


def write_report(out: str | os.PathLike | None, markdown: str, data: Any = None) -> Path | None:
    """``out`` (markdown) and, with ``data``, ``out`` with suffix .json (the raw figures; NaN allowed), each written
    whole (a reader never sees half a file, and a run cut off keeps the last complete one). None: nothing written."""
    if out is None:
        return None
    from hne_edge.fileio import atomic_write_text

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, markdown)
    if data is not None:
        write_json(path.with_suffix(".json"), data)
    return path


# -- folders -----------------------------------------------------------------------------------------------------

_TEMPORARY: list[tempfile.TemporaryDirectory] = []  # held until the interpreter exits, which removes them


def work_folder(path: str | os.PathLike | None, prefix: str) -> Path:
    """``path`` (a ``--workdir``: made, and its contents kept), or, when None, a fresh temporary folder removed with
    everything in it when the script exits (a run left one in /tmp each time: a bundle, or ~79 MB of data)."""
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
    _TEMPORARY.append(tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True))
    return Path(_TEMPORARY[-1].name)


# -- models ------------------------------------------------------------------------------------------------------


def randomized_model(name: str, seed: int = 0):
    """Model ``name`` from ``seed`` with non-trivial BatchNorm statistics and O(1) logits (the suite's ``randomize_``,
    tests/conftest.py), in eval mode: latency does not depend on the weights, a check against PyTorch does."""
    import torch

    if str(REPO / "tests") not in sys.path:
        sys.path.insert(2, str(REPO / "tests"))
    from conftest import randomize_

    from hne_edge.models import create_model

    torch.manual_seed(seed)
    return randomize_(create_model(name), seed)
