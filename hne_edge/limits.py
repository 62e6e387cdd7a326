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
  runner's warm-up, the arrays a frame file's headers declare) against what this machine has available now,
  checked before allocating, so a command fails in one line instead of meeting the kernel's OOM killer.
* **Files a user names** (:func:`open_regular_file`, :func:`read_bounded`): read only from a regular file (a
  FIFO would wait for a writer forever, ``/dev/zero`` never ends), and a JSON record (an accuracy record, a
  saved profile) at most :data:`MAX_JSON_BYTES`, refused unread beyond it.
* **A camera replay** (:func:`check_replay`: ``bench-streams``): at most :data:`MAX_REPLAY_FRAMES` frames per
  configuration (cameras x fps x seconds), at least one a camera; its ``runners`` method starts a runner and a
  thread per camera, so at most :func:`max_threads` cameras.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import IO, Any, Mapping

from .errors import InputError, ResourceExhausted, short_repr

__all__ = [
    "MAX_BATCH",
    "MAX_COUNT",
    "THREADS_PER_CPU",
    "MAX_NUM_CLASSES",
    "MAX_INPUT_SIZE",
    "MAX_IN_CHANS",
    "MAX_JSON_BYTES",
    "MAX_REPLAY_FRAMES",
    "REPLAY_FRAME_BYTES",
    "cpu_count",
    "cgroup_cpu_limit",
    "cgroup_memory_limit",
    "total_memory",
    "suite_workers",
    "load_average",
    "free_cpus_threads",
    "max_threads",
    "check_threads",
    "check_runners",
    "available_memory",
    "check_memory",
    "format_bytes",
    "check_model_size",
    "open_regular_file",
    "read_bounded",
    "check_replay",
]

MAX_BATCH = 4096
MAX_COUNT = 2**50  # the largest integer (in magnitude) a manifest may state
THREADS_PER_CPU = 4
MAX_NUM_CLASSES = 100_000  # ImageNet-21k has 21,843
MAX_INPUT_SIZE = 1024  # 4.6x ImageNet's 224 a side; activations grow with its square
MAX_IN_CHANS = 1024
MAX_JSON_BYTES = 64 << 20  # an eval metrics.json is a few KB, a profile of 4096 batch sizes a few MB
MAX_REPLAY_FRAMES = 1_000_000  # 8 cameras at 30 fps for 70 minutes, replayed in real time
REPLAY_FRAME_BYTES = 600  # a replayed frame's arrival and record (measured: 173 + 352 bytes)


def cpu_count() -> int:
    """The CPUs this process may use: its affinity mask where the OS has one, lowered by a cgroup CPU quota (a
    container given 4 CPUs' time on a 64-core host has the 64 in its mask and the quota in its cgroup)."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    return min(cpus, quota) if quota is not None else cpus


# -- the cgroup this process is in (Linux; v1 and v2) ----------------------------------------------------------
# A container's limits are in its cgroup, not in /proc/meminfo or the affinity mask. The limits that bind are the
# smallest of the process's own cgroup and its ancestors; where that path is not visible (a container's view of
# the host's hierarchy), the mount's root is what the container sees of it.
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def _cgroup_dirs(v1_controller: str, root: str = CGROUP_ROOT, proc: str = PROC_CGROUP) -> list[Path]:
    """The folders whose files bound this process for one controller (``memory``, ``cpu``), its own cgroup first
    then each ancestor up to the mount; the cgroup v2 hierarchy's and, on a v1 (or hybrid) host, the controller's."""
    try:
        lines = Path(proc).read_text().splitlines()
    except OSError:
        lines = []
    mounts: list[tuple[Path, str]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # the v2 hierarchy; a hybrid host mounts it at "unified"
            base = Path(root) if Path(root, "cgroup.controllers").exists() else Path(root, "unified")
            mounts.append((base, path))
        elif v1_controller in controllers.split(","):
            mounts.append((Path(root, v1_controller), path))
    if not mounts:
        mounts = [(Path(root), "/"), (Path(root, v1_controller), "/")]
    dirs: list[Path] = []
    for base, path in mounts:
        parts = [part for part in path.split("/") if part]
        here = base.joinpath(*parts)
        if ".." in parts or not here.is_dir():  # outside the namespace's view, or not mounted here
            here = base
        while True:
            dirs.append(here)
            if here == base:
                break
            here = here.parent
    return dirs


def _cgroup_memory(root: str, proc: str) -> list[tuple[int, int | None]]:
    """(limit, usage) in bytes of each cgroup that bounds this process's memory with a limit (v2 ``memory.max`` /
    ``memory.current``, v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``)."""
    found: list[tuple[int, int | None]] = []
    for d in _cgroup_dirs("memory", root, proc):
        for limit, usage in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
            cap = _read_int(d / limit)
            if cap is not None and cap < 1 << 60:  # "max" (read as None) / the kernel's huge number: no limit
                found.append((cap, _read_int(d / usage)))
    return found


def cgroup_memory_limit(root: str = CGROUP_ROOT, proc: str = PROC_CGROUP) -> int | None:
    """Bytes this process's cgroup (or an ancestor) lets it use at most; None if unlimited."""
    return min((cap for cap, _ in _cgroup_memory(root, proc)), default=None)


def cgroup_cpu_limit(root: str = CGROUP_ROOT, proc: str = PROC_CGROUP) -> int | None:
    """The CPUs' worth of time this process's cgroup may use (``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``), rounded up; None if unlimited."""
    limits: list[int] = []
    for d in _cgroup_dirs("cpu", root, proc):
        try:
            quota, period = Path(d, "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            quota, period = str(_read_int(d / "cpu.cfs_quota_us")), str(_read_int(d / "cpu.cfs_period_us"))
        if quota.isdigit() and period.isdigit() and int(period) > 0:  # "max" / -1 (read as None): no quota
            limits.append(max(1, math.ceil(int(quota) / int(period))))
    return min(limits) if limits else None


def total_memory() -> int | None:
    """Bytes of memory this process's machine has for it: MemTotal, lowered by a cgroup limit; None if unknown."""
    found = [value for value in (_meminfo("MemTotal"), cgroup_memory_limit()) if value is not None]
    return min(found) if found else None


def suite_workers(cpus: int | None = None, memory: int | None = None) -> int:
    """pytest-xdist workers for `make test` (its JOBS): one per usable CPU, at most 16 and one per 2 GiB of memory
    (each imports torch and ONNX Runtime and exports its own small bundles); 0 (one process) where that leaves 2 or
    fewer, where workers only compete for the cores. ``cpus`` / ``memory``: this machine's unless given."""
    n = min(cpu_count() if cpus is None else cpus, 16)
    memory = total_memory() if memory is None else memory
    if memory is not None:
        n = min(n, memory >> 31)
    return n if n > 2 else 0


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


def check_threads(value: Any, where: str = "threads", minimum: int = 1, cpus: int | None = None) -> int | None:
    """``value`` (None: the library's default) as an int in ``minimum..`` :data:`THREADS_PER_CPU` per CPU (``cpus``:
    this process's, :func:`cpu_count`, unless given); else :class:`InputError`."""
    if value is None:
        return None
    cpus = cpu_count() if cpus is None else cpus
    top = THREADS_PER_CPU * cpus
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= top:
        raise InputError(
            f"{where}: received {value!r}; expected an int in {minimum}..{top} "
            f"(at most {THREADS_PER_CPU} per CPU: this machine has {cpus} CPUs)"
        )
    return int(value)


def check_runners(count: int, where: str) -> int:
    """A camera replay's runners, a thread each (method ``runners``): at most :data:`THREADS_PER_CPU` per CPU of the
    machine (``os.cpu_count()``, not this process's affinity: a benchmark pins itself to the device's cores while
    its runners' threads are what it measures; pinned to one core, 8 runners were refused on a 2-CPU machine)."""
    return check_threads(count, where, cpus=max(1, os.cpu_count() or 1))


def _read_int(path: str | Path) -> int | None:
    try:
        text = Path(path).read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def _meminfo(field: str) -> int | None:
    """A /proc/meminfo field in bytes; None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory(root: str = CGROUP_ROOT, proc: str = PROC_CGROUP) -> int | None:
    """Bytes this process can still allocate: the kernel's MemAvailable, lowered by what its cgroup (or an
    ancestor) has left under its limit; None if unknown."""
    found = [value for value in (_meminfo("MemAvailable"),) if value is not None]
    found += [max(0, cap - used) for cap, used in _cgroup_memory(root, proc) if used is not None]
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


def check_model_size(config: Mapping[str, Any], where: str = "") -> None:
    """The model-size fields a config states (``num_classes``, ``in_chans``, ``input_size``; those absent are not
    checked) within their bounds; else :class:`InputError` prefixed with ``where``. The one rule of the torch-free
    model config, of a manifest's ``model.config`` and of a checkpoint's ``model_config``."""
    for name, low, top in (("num_classes", 2, MAX_NUM_CLASSES), ("in_chans", 1, MAX_IN_CHANS), ("input_size", 1, MAX_INPUT_SIZE)):
        if name not in config:
            continue
        value = config[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            raise InputError(f"{where}{name} must be a positive integer of at most {top}; received {short_repr(value)}")
        if value < low:
            raise InputError(f"{where}{name} must be at least {low}; received {value}")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def open_regular_file(path: str | os.PathLike, expected: str) -> IO[bytes]:
    """``path`` opened for reading (binary) if it is a regular file; else :class:`InputError` naming it, what it
    is and ``expected``.

    Opened without waiting (``O_NONBLOCK``), its type read from the open file: opening a FIFO waits for a writer
    (forever, in ``np.load`` or ``json``), and a device such as ``/dev/zero`` never ends.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or type(exc).__name__}); expected {expected}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise InputError(f"{path}: received {kind}; expected {expected} (a regular file)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, expected: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of regular file ``path`` (:func:`open_regular_file`), refused unread when over ``limit`` bytes
    (:class:`InputError` naming the file, its size and the bound)."""
    with open_regular_file(path, expected) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:  # the file may grow while it is read
        raise InputError(f"{path}: received {format_bytes(max(size, len(data)))}; expected {expected} of at most "
                         f"{format_bytes(limit)}")  # fmt: skip
    return data


def check_replay(streams: int, fps: float, seconds: float, runners: bool = False) -> int:
    """The frames a camera replay holds (``streams`` cameras at ``fps`` for ``seconds``: ``int(fps * seconds)``
    each), refused (:class:`InputError` naming the three) when a camera has none or they exceed
    :data:`MAX_REPLAY_FRAMES`; with ``runners`` (a runner and a thread per camera) ``streams`` is a thread count
    (:func:`check_runners`); their records (:data:`REPLAY_FRAME_BYTES` each) must fit the memory available
    (:func:`check_memory`). Checked before anything is allocated: 4 x 1e9 fps x 0.1 s grew to 1.8 GB."""
    asked = f"streams {streams} x fps {fps:g} x seconds {seconds:g}"
    if runners:
        check_runners(streams, "streams (method 'runners': a runner and a thread per camera)")
    each = fps * seconds  # floats: 1e300 x 1e300 is inf, not an OverflowError
    if not math.isfinite(each) or streams * each >= MAX_REPLAY_FRAMES + 1:
        total = f"{streams * each:,.0f}" if math.isfinite(streams * each) else "more than 1e308"
        raise InputError(f"{asked}: {total} frames to replay; expected at most {MAX_REPLAY_FRAMES:,} "
                         "(fewer cameras, a lower rate or a shorter replay)")  # fmt: skip
    if int(each) < 1:
        raise InputError(f"{asked}: no frame per camera (fps x seconds = {each:g}); expected at least one")
    frames = streams * int(each)
    check_memory(frames * REPLAY_FRAME_BYTES, f"{asked}: {frames:,} frames' arrivals and records",
                 hint="fewer cameras, a lower rate or a shorter replay")  # fmt: skip
    return frames
