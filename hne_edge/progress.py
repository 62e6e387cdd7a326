"""One progress reporter for every long command (stdlib; tqdm when installed and on a terminal).

People watch a terminal; CI, ``nohup`` and ``> log`` read a file. So:

* on a terminal, a tqdm bar redrawn in place (plain ``\\r`` redraws when tqdm is absent);
* elsewhere, plain lines: one at the first update, then at most every ``every_s`` seconds (and, through a
  heartbeat thread, at least that often even while one step runs long), and one at the end::

      export: 12/40 files (30%), 0.8 files/s, elapsed 15 s, ETA 35 s - onnx/fp32/segments/leaf07.onnx

Library functions take a ``progress`` argument (a :class:`Progress`, or None for silence) rather than
deciding how to draw; the CLI builds one with :func:`progress_for` from its ``--quiet`` flag. A function
with several phases (export, then verify) starts each with :meth:`Progress.restart`. A loop whose figures
cost something to read (a training step's loss, which waits for the GPU) asks :meth:`Progress.due` first.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import IO, Any, Callable

__all__ = ["Progress", "progress_for", "format_duration", "NULL_PROGRESS"]

EVERY_S = 10.0  # plain-line cadence: well under the 30 s a log reader waits before suspecting a hang
BAR_FIELDS_S = 1.0  # on a terminal, how often due() asks for fresh figures for the bar
RATE_WINDOW_S = 300.0  # the rate (and so the ETA) is measured over the latest half of the elapsed time, at most this
RATE_MARKS = 128  # (time, steps) marks kept for it, spread over the elapsed time


def format_duration(seconds: float) -> str:
    """``40 ms``, ``8.0 s``, ``3 min 05 s``, ``2 h 10 min``: how long something took or will take, for people.

    Under 0.1 s in milliseconds: a GPU's steps, a digits checkpoint and an estimate's last steps read "0.0 s", as
    if nothing were left or measured (issue 42)."""
    if seconds != seconds or seconds < 0:  # NaN or negative: unknown
        return "?"
    if seconds < 0.1:
        ms = seconds * 1e3
        return f"{ms:.2g} ms" if ms < 10 else f"{ms:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Progress of one long loop of ``total`` steps (None: unknown).

    Args:
        total: steps expected (None when unknown: no percentage or ETA).
        desc: what is running (``"epoch 3/10"``, ``"export"``).
        unit: what a step is (``"step"``, ``"file"``, ``"img"``).
        enabled: False makes every method a no-op (``--quiet``).
        stream: where to write (default: ``sys.stderr`` at construction).
        tty: draw a bar (True) or write lines (False); default: ``stream.isatty()``.
        every_s: plain-line cadence in seconds.
        clock: the time source (tests pass a fake one).
        heartbeat: in line mode, a daemon thread writes the current line every ``every_s`` while no
            other line comes (a single step that takes minutes must not look like a hang). Its line says what
            is current - the count, rate, times and how long ago the last step ended - and leaves out the
            ``fields``, which were read at an earlier step (issue 42: it showed a loss 164 steps old as if
            new). It starts with the first :meth:`update`, :meth:`set` or :meth:`restart`: a command that
            checks its inputs before it counts anything fails with its one-line error, not after a line of
            progress.
        initial: steps already done before this call (a resumed run): counted in ``n`` and the percentage,
            not in the rate.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "step",
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: bool = True,
        initial: int = 0,
    ) -> None:
        self._bar = None
        self._total, self.desc, self.unit = total, desc, unit
        self.enabled = enabled
        self.n = self.initial = initial
        self.note = ""  # what is happening now (a file name, a phase)
        self.fields: dict[str, Any] = {}
        self._stream = stream if stream is not None else sys.stderr
        self._clock, self._every = clock, every_s
        self._start = clock()
        self._last_line: float | None = None  # when the last plain line was written (None: never)
        self._last_fields: float | None = None  # when due() last answered True on a terminal
        self._promised: bool | None = None  # due()'s answer, which the next update() keeps
        self._last_n = initial
        self._last_step: float | None = None  # when the last step ended (None: none yet in this phase)
        self._marks: deque[tuple[float, int]] = deque([(self._start, initial)], maxlen=RATE_MARKS)
        self._last_by_heartbeat = False
        self._work_after_steps = False  # a note set after the last step (the last validation): news for a heartbeat
        self._lock = threading.Lock()
        self._closed = False
        self.reader_gone = False  # a line met a closed pipe (`2>&1 | head`): silent since; the command decides the rest
        self._tty = bool(enabled and (tty if tty is not None else _isatty(self._stream)))
        self._stop = threading.Event()
        self._beating = not (enabled and heartbeat and every_s > 0)  # True: started, or never to start
        if self._tty:
            self._bar = _tqdm_bar(total, desc, unit, self._stream, initial)
            self._beating = True

    # -- what callers use ----------------------------------------------------------------------------
    def update(self, n: int = 1, note: str | None = None, **fields: Any) -> None:
        """``n`` more steps done; ``note``: what runs now; ``fields``: figures to show (``loss=0.53``)."""
        if not self.enabled:
            return
        with self._lock:
            self._start_heartbeat()
            self.n += n
            if n:
                self._last_step, self._work_after_steps = self._clock(), False
            self._mark()
            self._set(note, fields)
            promised, self._promised = self._promised, None
            if self._bar is not None:
                self._draw_bar(n)
            elif promised if promised is not None else self._line_due(0):
                self._write_line()

    def set(self, note: str | None = None, **fields: Any) -> None:
        """Change what is shown without counting a step (a phase starts, a file begins)."""
        if not self.enabled:
            return
        with self._lock:
            self._start_heartbeat()
            self._work_after_steps |= note is not None and note != self.note
            self._set(note, fields)
            if self._bar is not None:
                self._draw_bar(0)
            elif self._last_line is None:
                self._write_line()

    def due(self) -> bool:
        """Whether the next :meth:`update` shows its figures: a line is due in a log (the first, one after
        ``every_s``, or the last step's), or a second has passed on a terminal. A caller whose figures cost
        a device synchronisation computes them only then."""
        if not self.enabled:
            return False
        now = self._clock()
        if self._bar is not None:
            if self._last_fields is None or now - self._last_fields >= BAR_FIELDS_S:
                self._last_fields = now
                return True
            return False
        self._promised = self._line_due(1)  # the next update() writes its line exactly when this says so
        return self._promised

    def restart(self, total: int | None, desc: str, unit: str | None = None, initial: int = 0) -> None:
        """End this phase (its final line) and start the next one on the same reporter (export, then verify)."""
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            elif self.n != self.initial and self._last_n != self.n:  # the phase's last word, unless just said
                self._write_line()
            self._total, self.desc, self.unit = total, desc, unit or self.unit
            self.n = self.initial = self._last_n = initial
            self.note, self.fields = "", {}
            self._start, self._last_line, self._last_fields = self._clock(), None, None
            self._last_step, self._work_after_steps = None, False
            self._marks.clear()
            self._marks.append((self._start, initial))
            self._start_heartbeat()
            if self._bar is not None:
                self._bar = _tqdm_bar(total, desc, self.unit, self._stream, initial)

    def write(self, message: str) -> None:
        """A line of its own (an epoch's summary) that does not break the bar."""
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.write(message, file=self._stream)
            else:
                self._print(message)

    def close(self, final: bool = True) -> None:
        """Stop the heartbeat; in line mode write the final line (unless one just said the same, or ``final`` is
        False: the command failed, and its error is the one line to read)."""
        if not self.enabled or self._closed:
            return
        self._stop.set()
        with self._lock:
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            elif final and (self._last_line is None or self._last_n != self.n):
                self._write_line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(final=exc_type is None)

    # -- figures -------------------------------------------------------------------------------------
    @property
    def total(self) -> int | None:
        return self._total

    @total.setter
    def total(self, value: int | None) -> None:
        """Known once the work is counted (a verification counts its files after reading the manifest)."""
        self._total = value
        if self._bar is not None:
            self._bar.total = value
            self._bar.refresh()

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    @property
    def finished(self) -> bool:
        """Every step of a known total is done (a heartbeat then has nothing new to say)."""
        return self._total is not None and self.n >= self._total

    @property
    def rate(self) -> float | None:
        """Steps per second over the latest half of the elapsed time (at most :data:`RATE_WINDOW_S`), after the first
        step once there are others (None before the first step): the first steps' one-off costs (start-up,
        compilation, cold caches) leave it as the run goes, and a machine that got busier or quieter shows within
        minutes. The ETA follows it: a training estimate 8x too high came from the first seconds (issue 28)."""
        now, done = self._clock(), self.n - self.initial
        if done <= 0 or now <= self._start:
            return None
        since = now - min((now - self._start) / 2, RATE_WINDOW_S)
        t, n = self._marks[0]
        for mark in self._marks:  # the latest mark at or before the window's start (the start itself at first)
            if mark[0] > since:
                break
            t, n = mark
        if n == self.initial and len(self._marks) > 1 and self.n > self._marks[1][1]:
            t, n = self._marks[1]  # never the first step's one-off costs (start-up, compilation) once others are done
        if self.n > n and now > t:
            return (self.n - n) / (now - t)
        return done / (now - self._start)

    @property
    def eta(self) -> float | None:
        """Seconds left at :attr:`rate` (None when the total or the rate is unknown)."""
        rate = self.rate
        if self.total is None or rate is None:
            return None
        return max(self.total - self.n, 0) / rate

    def line(self, heartbeat: bool = False) -> str:
        """The plain progress line (what a log shows); ``heartbeat``: the heartbeat's, which says how long ago the
        last step ended instead of the fields (read at that step or earlier, not now). A finished count's heartbeat
        (work after its steps) says the steps are all done, without the percentage, rate or ETA of a count going on."""
        units = _plural(self.unit)
        done = heartbeat and self.finished
        parts = [f"all {self.n} {units} done" if done and self.n > 1 else f"{self.n} {self.unit} done" if done else
                 f"{self.n}/{self.total} {units} ({100 * self.n / self.total:.0f}%)" if self.total
                 else f"{self.n} {units}"]  # fmt: skip
        rate = None if done else self.rate
        if rate is not None:
            parts.append(f"{rate:.3g} {units}/s" if rate >= 1 else f"{format_duration(1 / rate)}/{self.unit}")
        parts.append(f"elapsed {format_duration(self.elapsed)}")
        if self.eta is not None and self.n < (self.total or 0):
            parts.append(f"ETA {format_duration(self.eta)}")
        if heartbeat:
            parts.append(f"no {self.unit} done yet" if self._last_step is None else
                         f"last {self.unit} {format_duration(self._clock() - self._last_step)} ago")  # fmt: skip
        else:
            parts += [f"{k} {_fmt(v)}" for k, v in self.fields.items()]
        return f"{self.desc}: {', '.join(parts)}" + (f" - {self.note}" if self.note else "")

    # -- internals -----------------------------------------------------------------------------------
    def _line_due(self, ahead: int) -> bool:
        """A plain line is due: the first, ``every_s`` after the last, the last step's (``ahead`` steps on), or the
        first step after a heartbeat line (which repeats old figures: steps as long as the period would
        otherwise never show fresh ones)."""
        last = self._last_line
        return (last is None or self._clock() - last >= self._every
                or (self._last_by_heartbeat and self.n + ahead > self._last_n)
                or (self.total is not None and self.n + ahead >= self.total))  # fmt: skip

    def _mark(self) -> None:
        """Keep a (time, steps) mark for :attr:`rate`, spaced so that the marks span the elapsed time."""
        now = self._clock()
        if now - self._marks[-1][0] >= (now - self._start) / (RATE_MARKS // 2):
            self._marks.append((now, self.n))

    def _set(self, note: str | None, fields: dict[str, Any]) -> None:
        if note is not None:
            self.note = note
        self.fields.update(fields)

    def _write_line(self, heartbeat: bool = False) -> None:
        self._print(self.line(heartbeat))
        self._last_line, self._last_n, self._last_by_heartbeat = self._clock(), self.n, heartbeat

    def _print(self, text: str) -> None:
        try:
            print(text, file=self._stream, flush=True)
        except BrokenPipeError:  # nobody reads these lines now: the work goes on (train saves, then stops) in silence
            self.reader_gone, self.enabled = True, False
            self._stop.set()

    def _draw_bar(self, n: int) -> None:
        bar = self._bar
        if self.fields or self.note:
            bar.set_postfix_str(", ".join([f"{k} {_fmt(v)}" for k, v in self.fields.items()] + [self.note][: bool(self.note)]),
                                refresh=False)  # fmt: skip
        bar.update(n) if n else bar.refresh()

    def _start_heartbeat(self) -> None:
        if not self._beating:
            self._beating = True
            threading.Thread(target=self._heartbeat, name=f"progress:{self.desc}", daemon=True).start()

    def _heartbeat(self) -> None:
        wait: float | None = self._every
        while not self._stop.wait(wait) and (wait := self._beat()) is not None:
            pass

    def _beat(self) -> float | None:
        """One heartbeat: the current line again if none came for a whole period. Returns the seconds until a period
        since the last line ends (the next wake-up: on a fixed grid, a line just after one left 19 s of silence);
        None once closed. A finished count beats only for work named after its last step (the last epoch's
        validation), and names that work."""
        with self._lock:
            if self._closed:
                return None
            if self.finished and not self._work_after_steps:  # a finished count again says nothing of what runs now
                return self._every
            now = self._clock()
            last = self._start if self._last_line is None else self._last_line
            if now - last >= self._every * 0.99:  # silent for a whole period: say we are alive
                self._write_line(heartbeat=True)
                last = now
            return max(last + self._every - now, self._every * 0.01)


class _NullProgress(Progress):
    def __init__(self) -> None:
        super().__init__(None, "", enabled=False)


#: A progress that shows nothing (a default argument that needs no None checks).
NULL_PROGRESS = _NullProgress()


def progress_for(total: int | None, desc: str, unit: str = "step", *, quiet: bool = False, **kwargs: Any) -> Progress:
    """The CLI's progress: silent with ``--quiet``, a bar on a terminal, lines in a log."""
    return Progress(total, desc, unit, enabled=not quiet, **kwargs)


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "sh", "ch", "x")) else "s")


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False


def _tqdm_bar(total: int | None, desc: str, unit: str, stream: IO[str], initial: int = 0):
    try:
        from tqdm import tqdm
    except ImportError:  # runtime-only installs: redraw one line by hand
        bar = _PlainBar(total, desc, unit, stream)
        bar.n = initial
        return bar
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=stream, dynamic_ncols=True, initial=initial)


class _PlainBar:
    """The bit of tqdm's interface :class:`Progress` uses, drawn as one ``\\r``-rewritten line."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: IO[str]) -> None:
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.n, self.postfix = 0, ""

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self) -> None:
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        self.stream.write(f"\r\033[K{self.desc}: {count} {_plural(self.unit)} {self.postfix}")
        self.stream.flush()

    def write(self, message: str, file: IO[str] | None = None) -> None:
        self.stream.write(f"\r\033[K{message}\n")
        self.refresh()

    def close(self) -> None:
        self.stream.write("\r\033[K")
        self.stream.flush()
