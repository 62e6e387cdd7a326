"""The stream scheduler's share of a shared CPU: its threads weighted as the cameras they serve.

Beside busy neighbours a CPU is time-sliced by the kernel's fair scheduler (CFS, EEVDF), in proportion to each
runnable thread's weight. K cameras served by K runners are K threads, K shares against the neighbours; served by
one :class:`~.streams.StreamScheduler` they were one worker thread, one share: beside six busy loops on 2 cores its
worker held 1 of the core's 11 runnable tasks where 8 runners held 8, and it rejected 688 of 1,200 frames the
runners served (BENCHMARKS.md, "Beside busy neighbours"). Its worker and deadline watcher therefore run at the
nice value whose weight is that of one ordinary thread per stream it serves: the share the runners it replaces
would have had, no more. The kernel's weights rise about 1.25x a nice level (nice 0: 1024, -3: 1991, -6: 3906,
-9: 7620): K streams get the nice, below the one the scheduler was created at, whose weight is nearest K times it.

The kernel's fair scheduler (EEVDF, Linux 6.6+) lets a woken thread wait for the running one's time slice (1.4 ms
by default) however high its weight: beside six busy loops the watcher woke 0-15 ms late and 2-4 % of the answers
missed. So the threads also ask for the shortest slice, ``SLICE_NS`` (0.1 ms; ``sched_setattr``'s
``sched_runtime``, honoured since Linux 6.12, ignored before): a latency request, not a larger share - a woken
thread with a short slice pre-empts at once, and runs in short turns. Measured beside six busy loops at 8 cameras
(2026-11-28, a one-off replay of the scheduler alone, 5 s, 2 runs each way): 33 and 93 frames of 1,200 rejected
with it, 79 and 152 without.

Threads running under a real-time policy (a process started with ``chrt``) are left as they are: they are above
every nice. A lower nice needs ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows it (``ulimit -e``; root has
both); refused, the threads keep their nice and the scheduler says so once. Linux only: elsewhere a nice is per
process, not per thread, and nothing is changed. ONNX Runtime's own intra-op threads (``threads`` > 1) are not the
scheduler's and keep theirs.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import math
import os
import platform
import sys

__all__ = ["MIN_NICE", "MAX_NICE", "ACTIVE_S", "SLICE_NS", "WEIGHTS", "nice_for_streams", "thread_nice",
           "set_thread_nice", "supported"]

MIN_NICE, MAX_NICE = -20, 19
ACTIVE_S = 1.0  # a stream counts while it submitted a frame this recently (a camera at 1 fps or more)
SLICE_NS = 100_000  # the time slice the threads ask for: the kernel's shortest
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}.get(platform.machine())  # the syscall's number (no libc wrapper)
# the kernel's weight of each nice from -20 to 19 (kernel/sched/core.c, sched_prio_to_weight): about 1.25x a level,
# not exactly (a formula of 1.25x picked -17 for 40 streams, whose weight is nearer -16's)
WEIGHTS = (88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904, 3906, 3121,
           2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23,
           18, 15)  # fmt: skip


def supported() -> bool:
    """Per-thread nice values: Linux, where ``setpriority(PRIO_PROCESS, tid)`` sets one thread's."""
    return sys.platform.startswith("linux") and hasattr(os, "setpriority")


def nice_for_streams(streams: int, base: int = 0) -> int:
    """The nice (at most ``base``) whose kernel weight is nearest, by ratio, ``streams`` threads' at ``base``."""
    base = max(MIN_NICE, min(MAX_NICE, base))
    want = math.log(max(1, streams) * WEIGHTS[base - MIN_NICE])
    return min(range(MIN_NICE, base + 1), key=lambda n: (abs(math.log(WEIGHTS[n - MIN_NICE]) - want), -n))


def thread_nice(tid: int | None = None) -> int:
    """The nice of thread ``tid`` (the calling thread's when None)."""
    return os.getpriority(os.PRIO_PROCESS, 0 if tid is None else tid)


def set_thread_nice(tids, nice: int) -> str | None:
    """Give the threads ``tids`` the nice ``nice`` and the time slice ``SLICE_NS`` (threads under a real-time policy
    are left alone); None when done, else why not (the first refusal, in words)."""
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) not in (os.SCHED_OTHER, getattr(os, "SCHED_BATCH", -1)):
                continue  # SCHED_FIFO / RR (chrt): already above every nice; a nice would demote it
            _set(tid, nice)
        except ProcessLookupError:  # the thread ended (a scheduler closing): nothing left to weigh
            continue
        except OSError as exc:
            return (f"setting its threads' nice to {nice} was refused ({exc.strerror or exc}); a lower nice needs "
                    "CAP_SYS_NICE or an RLIMIT_NICE that allows it (ulimit -e)")  # fmt: skip
    return None


class _SchedAttr(ctypes.Structure):  # struct sched_attr (include/uapi/linux/sched/types.h), its first version
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64)]  # fmt: skip


def _set(tid: int, nice: int) -> None:
    """``sched_setattr(tid, SCHED_OTHER, nice, slice)`` where the syscall's number is known; else, or where the
    kernel has no such call, ``setpriority`` (the nice alone)."""
    if _SCHED_SETATTR is not None:
        attr = _SchedAttr(ctypes.sizeof(_SchedAttr), os.SCHED_OTHER, 0, nice, 0, SLICE_NS, 0, 0)
        if _libc().syscall(_SCHED_SETATTR, tid, ctypes.byref(attr), 0) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL, errno.E2BIG):
            raise OSError(code, os.strerror(code))
    os.setpriority(os.PRIO_PROCESS, tid, nice)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
