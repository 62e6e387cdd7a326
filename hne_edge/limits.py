"""Resource bounds: the most a user-controlled number may ask of the machine (stdlib only).

One home for every bound, so that each is one constant and one check
(the runtime imports this module; it needs nothing but the standard library):

* **Batch range** (:data:`MAX_BATCH`): what ``export --batch-range`` accepts and what a manifest may declare
  (:func:`hne_edge.bundle.batch_range_ok` is the one rule both apply). 4096 samples is far beyond an anytime
  frame and matches the largest batch the dynamo exporter is asked to support.
* **Counts a file states** (:data:`MAX_COUNT`): every integer a manifest holds (MACs, bytes, shapes, opsets, ...)
  is at most 2**50 in magnitude (a petabyte; 10**15 multiply-adds per sample). A sum of a tree's thousands
  of them stays exact in a float64 and within an int64, and printing one never overflows a float.
* **Threads** (:func:`check_threads`): at most :data:`THREADS_PER_CPU` per CPU of this machine, wherever a
  thread count is taken (``--threads``, ``AnytimeRunner(threads=)``, the backends, ``TrainConfig.threads``).
  More threads than that only add contention; 100,000 of them hang the host.
* **Model size** (:data:`MAX_NUM_CLASSES`, :data:`MAX_INPUT_SIZE`, :data:`MAX_IN_CHANS`): checked by the
  torch-free model config, so a training config is refused on any machine, before torch starts.
* **Memory** (:func:`check_memory`): an estimate of what an allocation will need (a model's weights, a
  runner's warm-up) against what this machine has available now, checked before allocating, so a command
  fails in one line instead of meeting the kernel's OOM killer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import InputError, ResourceExhausted

__all__ = [
    "MAX_BATCH",
    "MAX_COUNT",
    "THREADS_PER_CPU",
    "MAX_NUM_CLASSES",
    "MAX_INPUT_SIZE",
    "MAX_IN_CHANS",
    "cpu_count",
    "load_average",
    "free_cpus_threads",
    "max_threads",
    "check_threads",
    "available_memory",
    "check_memory",
    "format_bytes",
]

MAX_BATCH = 4096
MAX_COUNT = 2**50  # the largest integer (in magnitude) a manifest may state
THREADS_PER_CPU = 4
MAX_NUM_CLASSES = 100_000  # ImageNet-21k has 21,843
MAX_INPUT_SIZE = 1024  # 4.6x ImageNet's 224 a side; activations grow with its square
MAX_IN_CHANS = 1024


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, this one included); None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def free_cpus_threads(default: int, cpus: int | None = None, load: float | None = None) -> tuple[int, str | None]:
    """Threads for a CPU-bound library whose user named none: its ``default``, lowered to the CPUs that other
    processes leave free (this process's CPUs minus the load average, rounded; at least 1), and why when lowered.

    More threads than free CPUs do not add speed, they collapse it: torch's two threads on two busy cores
    trained at 13-18 img/s where one thread kept 150-450 (issue 28; BENCHMARKS.md, "Training threads under
    load"). ``cpus`` / ``load``: this machine's unless given (tests).
    """
    cpus = cpu_count() if cpus is None else cpus
    load = load_average() if load is None else load
    if load is None:
        return default, None
    free = max(1, int(cpus - load + 0.5))
    if free >= default:
        return default, None
    return free, f"load average {load:.1f} on {cpus} CPU{'s' if cpus > 1 else ''}"


def max_threads() -> int:
    """The most threads any option may ask for here: :data:`THREADS_PER_CPU` per CPU."""
    return THREADS_PER_CPU * cpu_count()


def check_threads(value: Any, where: str = "threads", minimum: int = 1) -> int | None:
    """``value`` (None: the library's default) as an int in ``minimum..max_threads()``; else :class:`InputError`."""
    if value is None:
        return None
    top = max_threads()
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= top:
        raise InputError(
            f"{where}: received {value!r}; expected an int in {minimum}..{top} "
            f"(at most {THREADS_PER_CPU} per CPU: this machine has {cpu_count()} CPUs)"
        )
    return int(value)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process can still allocate: the kernel's MemAvailable, lowered by a cgroup limit; None if unknown."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2, v1
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:  # "max" / a huge number: no limit
            found.append(max(0, cap - used))
    if not found and hasattr(os, "sysconf"):  # pragma: no cover - not Linux
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    return min(found) if found else None


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KB"`` (binary units)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def check_memory(need: int, what: str, *, hint: str | None = None, cli_hint: str | None = None) -> None:
    """Refuse (:class:`ResourceExhausted`) an allocation of about ``need`` bytes that this machine cannot hold now.

    ``what`` names the allocation ("hne_tiny's weights"); ``hint`` / ``cli_hint``
    say how to ask for less. Nothing is refused when the available memory cannot be read.
    """
    have = available_memory()
    if have is not None and need > have:
        raise ResourceExhausted(
            f"{what} would need about {format_bytes(need)} of memory; this machine has {format_bytes(have)} available",
            hint=hint, cli_hint=cli_hint,
        )  # fmt: skip
