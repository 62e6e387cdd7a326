"""`make`'s setup step: it installs into a virtualenv only when that virtualenv was not built from this
checkout's pyproject.toml, constraints.txt and EXTRAS, so a fresh clone reuses one (issue 20: CI must not
install torch twice), and INSTALL=no never installs.

The virtualenv here is a fake whose `python` logs how it was called: these tests check make's decisions,
not pip (the quickstart test runs the real thing).
"""

from __future__ import annotations

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


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["make", "-C", str(folder), *args], capture_output=True, text=True, timeout=120)
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
    make(fresh_clone(tmp_path), "test", f"VENV={venv}", "PYTEST_ARGS=-q")
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
