"""`make`'s setup step: it installs into a virtualenv only when that virtualenv was not built from this
checkout's pyproject.toml, constraints.txt and EXTRAS, so a fresh clone reuses one (issue 20: CI must not
install torch twice), and INSTALL=no never installs.

The virtualenv here is a fake whose `python` logs how it was called: these tests check make's decisions,
not pip (the quickstart test runs the real thing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed here")

FAKE_PYTHON = '#!/bin/sh\necho "$*" >> "$(dirname "$0")/../calls.log"\n'


def fake_venv(root: Path) -> Path:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return venv


# What an outer make passes down: CI runs this suite as `make test PYTEST_ARGS="-q -ra"`, and a sub-make takes
# command-line variables from MAKEFLAGS (over its own defaults), the Makefile's variables from the environment.
_OUTER_MAKE = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PYTEST_ARGS", "JOBS", "VENV", "EXTRAS", "INSTALL",
               "DEMO_ARGS", "PYTHON"}


def make(folder: Path, *args: str, cpus: set[int] | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """``make -C folder args`` as a user types it (nothing inherited from a make running this suite); ``cpus``: the
    CPUs it may run on (as under ``taskset``)."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus is not None else None
    clean = {k: v for k, v in os.environ.items() if k not in _OUTER_MAKE}
    proc = subprocess.run(["make", "-C", str(folder), *args], capture_output=True, text=True, timeout=120, preexec_fn=pin,
                          env={**clean, **(env or {})})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def calls(venv: Path) -> list[str]:
    log = venv / "calls.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def fresh_clone(root: Path) -> Path:
    """The files make reads, copied now: every one is newer than any stamp, as in a fresh clone."""
    clone = root / "clone"
    clone.mkdir()
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, clone / name)
    return clone


def test_installs_once_then_reuses_the_virtualenv_even_from_a_fresh_clone(tmp_path):
    venv = fake_venv(tmp_path)
    make(REPO, "demo", f"VENV={venv}")
    first = calls(venv)
    assert len(first) == 2 and first[0].startswith("-m pip install") and "-e .[train,onnx,dev]" in first[0], first
    assert first[1] == "-m hne_edge demo", first  # this checkout's code, run from its root
    make(REPO, "demo", f"VENV={venv}")
    assert calls(venv) == ["-m hne_edge demo"]  # built from the same files: nothing to install
    make(fresh_clone(tmp_path), "test", f"VENV={venv}", "PYTEST_ARGS=-q", "JOBS=0")
    assert calls(venv) == ["-m pytest -q"]  # newer files with the same content: still nothing to install
    make(REPO, "demo", f"VENV={venv}", "EXTRAS=train")
    assert calls(venv)[0].startswith("-m pip install")  # another install asked for: it installs


def test_install_no_never_installs(tmp_path):
    venv = fake_venv(tmp_path)
    make(REPO, "demo", f"VENV={venv}", "INSTALL=no", "DEMO_ARGS=--quiet")
    log = calls(venv)
    assert not any("pip" in call for call in log), log
    assert log[-1] == "-m hne_edge demo --quiet" and not (venv / ".installed").exists()


def test_install_no_names_what_the_virtualenv_lacks():
    venv = Path(sys.prefix)
    proc = subprocess.run(["make", "-C", str(REPO), "setup", f"VENV={venv}", "INSTALL=no",
                           "NEEDED=numpy no_such_module_for_make"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"INSTALL=no, but {venv} lacks no_such_module_for_make" in proc.stderr, proc.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_test_workers_one_per_cpu_only_beyond_two_cpus(tmp_path):
    """`make test` runs pytest-xdist workers, one per usable CPU, only where there are more than 2 CPUs; on 1 or 2
    (a small CI machine, taskset) one process; JOBS says how many (0: none)."""
    venv = fake_venv(tmp_path)
    make(REPO, "setup", f"VENV={venv}")
    calls(venv)
    first = min(os.sched_getaffinity(0))
    make(REPO, "test", f"VENV={venv}", "PYTEST_ARGS=-q", cpus={first})  # as under taskset -c <first>
    assert calls(venv) == ["-m pytest -q"]
    make(REPO, "test", f"VENV={venv}", "JOBS=3")
    assert calls(venv) == ["-m pytest -n 3 --dist loadgroup"]
    make(REPO, "test", f"VENV={venv}", "JOBS=0")
    assert calls(venv) == ["-m pytest"]
    make(REPO, "test", f"VENV={venv}")
    assert calls(venv) == _workers(len(os.sched_getaffinity(0)))
    eight = tmp_path / "eight_cpus"  # a machine with 8 usable CPUs: nproc says so (whatever OMP_NUM_THREADS says)
    eight.mkdir()
    (eight / "nproc").write_text('#!/bin/sh\n[ -n "$OMP_NUM_THREADS" ] && echo 1 || echo 8\n')
    (eight / "nproc").chmod(0o755)
    make(REPO, "test", f"VENV={venv}", env={"PATH": f"{eight}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"})
    assert calls(venv) == _workers(8)
    many = tmp_path / "many_cpus"  # 96 CPUs: at most 16 workers, and one per 2 GiB of memory
    many.mkdir()
    (many / "nproc").write_text("#!/bin/sh\necho 96\n")
    (many / "nproc").chmod(0o755)
    make(REPO, "test", f"VENV={venv}", env={"PATH": f"{many}{os.pathsep}{os.environ['PATH']}"})
    assert calls(venv) == _workers(96)


def _workers(cpus: int) -> list[str]:
    """The pytest call on ``cpus`` usable CPUs: a worker per CPU, at most 16 and one per 2 GiB of the machine's
    memory (where /proc/meminfo says it); one process where that leaves 2 or fewer."""
    n = min(cpus, 16)
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))  # fmt: skip
        n = min(n, kib // 2**21)
    except (OSError, StopIteration):
        pass
    return [f"-m pytest -n {n} --dist loadgroup"] if n > 2 else ["-m pytest"]
