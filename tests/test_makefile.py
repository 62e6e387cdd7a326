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
    from hne_edge.limits import suite_workers

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
    make(REPO, "test", f"VENV={venv}", env={"OMP_NUM_THREADS": "1"})  # nproc would obey it; the rule does not
    assert calls(venv) == _workers(suite_workers())
    # the count is hne_edge.limits.suite_workers's (tested with containers' numbers in test_resource_bounds.py), run
    # by PYTHON before anything is installed; a PYTHON that cannot run it means one process
    rule = tmp_path / "rule"
    rule.mkdir()
    (rule / "says_7").write_text('#!/bin/sh\ncase "$*" in *suite_workers*) echo 7;; *) exit 3;; esac\n')
    (rule / "fails").write_text("#!/bin/sh\nexit 1\n")
    for name in ("says_7", "fails"):
        (rule / name).chmod(0o755)
    make(REPO, "test", f"VENV={venv}", f"PYTHON={rule / 'says_7'}")
    assert calls(venv) == _workers(7)
    make(REPO, "test", f"VENV={venv}", f"PYTHON={rule / 'fails'}")
    assert calls(venv) == ["-m pytest"]


def _workers(n: int) -> list[str]:
    return [f"-m pytest -n {n} --dist loadgroup"] if n else ["-m pytest"]
