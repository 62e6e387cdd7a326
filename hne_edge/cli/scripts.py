"""The CLI's voice for scripts built on hne-edge (``examples/``): the same one-line errors and exit codes.

``hne-edge`` prints a user error as one line, ``Error: what was received; what was expected``, and exits 2;
a bad option says which command's ``--help`` to read; a warning is one line, ``warning: ...``; Ctrl-C exits 130.
A script that parses its options with :class:`ArgumentParser` and runs its ``main`` through :func:`run_main` says
things the same way::

    parser = ArgumentParser(description="...")
    parser.add_argument("--period-ms", type=positive(float, "a number of milliseconds"), default=None)
    ...
    if __name__ == "__main__":
        sys.exit(run_main(main))
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..errors import HNEError

__all__ = ["ArgumentParser", "positive", "seed", "run_main"]


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` with the CLI's one-line usage errors (``Error: ... (see PROG --help)``, exit 2)."""

    def error(self, message: str) -> None:  # argparse prints the usage and "PROG: error: ..."
        from . import printable

        print(f"Error: {printable(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def positive(kind: Callable[[str], float] = float, what: str = "a number") -> Callable[[str], float]:
    """An argparse ``type`` accepting values > 0 only (0 is not "the default", a negative period is not a period)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"received {text!r}; expected {what} > 0")
        return value

    return parse


def seed(text: str) -> int:
    """An argparse ``type`` for a random seed: an int >= 0 (numpy's generators refuse a negative one with a
    traceback)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"received {text!r}; expected an integer >= 0")
    return value


def run_main(main: Callable[[], int | None]) -> int:
    """Run ``main``; a user error (:class:`~hne_edge.errors.HNEError`, the file system) is one line and exit 2,
    Ctrl-C exit 130; a warning one ``warning: ...`` line; anything else is a bug and keeps its traceback."""
    from . import one_line, warnings_as_lines

    try:
        with warnings_as_lines():
            return main() or 0
    except (HNEError, OSError) as exc:
        print(f"Error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("Interrupted", file=sys.stderr)
        return 130
