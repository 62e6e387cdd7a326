"""The README's quickstart, run exactly as written in a fresh clone, after `make demo` (issue 20).

The clone reuses the virtualenv this test runs in (`make demo VENV=... INSTALL=no`), so CI does not install
torch twice; `.venv` in the clone links to it, since the README's commands start from the `.venv` that
`make demo` builds. The README marks each block this test runs with QUICKSTART_MARK; the blocks run in
order in one bash shell with `set -euo pipefail`, so every command must exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, clone_working_tree

QUICKSTART_MARK = "<!-- quickstart: tests/test_quickstart.py runs each block marked like this, in order, exactly as written -->"
BLOCK = re.compile(re.escape(QUICKSTART_MARK) + r"\n```(bash|python)\n(.*?)\n```\n", re.S)


def quickstart_script(readme: str) -> str:
    """The README's marked blocks as one bash script: bash blocks as they are, python blocks fed to `python`."""
    blocks = BLOCK.findall(readme)
    assert readme.count(QUICKSTART_MARK) == len(blocks) >= 1, "a quickstart mark is not followed by a bash/python block"
    parts = ["set -euo pipefail", "set -x"]
    for language, body in blocks:
        parts.append(body if language == "bash" else f"python - <<'QUICKSTART_PYTHON'\n{body}\nQUICKSTART_PYTHON")
    return "\n".join(parts) + "\n"


def without_scripts_on_path() -> str:
    """PATH without this interpreter's scripts folder: `hne-edge` is found only if the README activates .venv."""
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != scripts)


def run_all(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run, but a timeout stops every process the command started, not only the first (make's and
    bash's children would run on, on a shared machine)."""
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"{' '.join(args)} ran past {timeout:.0f} s:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def test_quickstart_blocks_are_marked_and_use_the_runtime_api():
    script = quickstart_script((REPO / "README.md").read_text())
    assert script.index("source .venv/bin/activate") < script.index("hne-edge train")
    for command in ("hne-edge train", "hne-edge eval", "hne-edge export", "hne-edge verify", "hne-edge run"):
        assert command in script, f"the quickstart does not run {command}"
    assert "from hne_edge.runtime import AnytimeRunner, Agreement" in script
    assert "--download" not in script  # offline


@pytest.mark.slow
def test_quickstart_runs_as_written_in_a_fresh_clone(tmp_path):
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix) or not (venv / "bin" / "activate").is_file():
        pytest.skip(f"the tests run outside a virtualenv ({sys.executable}); the quickstart needs the one make builds")
    for tool in ("make", "bash"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed here")
    clone = tmp_path / "hne-edge"
    clone_working_tree(REPO, clone)
    (clone / ".venv").symlink_to(venv, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "MAKEFLAGS", "MFLAGS")}
    # `hne-edge` (a script of that virtualenv) must import the clone's package, not the checkout the virtualenv
    # was installed from; `make` and `python -` in the clone's root do so anyway.
    # One torch thread: on a shared, loaded machine two threads wait for each other (this does not change the
    # commands, only how hard they compete for the cores).
    env.update(PATH=without_scripts_on_path(), PYTHONPATH=str(clone), MPLBACKEND="Agg", OMP_NUM_THREADS="1")

    demo = run_all(["make", "demo", f"VENV={venv}", "INSTALL=no"], cwd=clone, env=env, timeout=3600)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "pip install" not in demo.stdout + demo.stderr  # the virtualenv is reused, not reinstalled
    assert "next:" in demo.stdout and (clone / "runs" / "demo" / "bundle" / "manifest.json").is_file()

    script = quickstart_script((clone / "README.md").read_text())
    proc = run_all(["bash", "-c", script], cwd=clone, env=env, timeout=3600)
    ran = [line for line in proc.stderr.splitlines() if line.startswith("+ ")]  # set -x: the commands as run
    assert proc.returncode == 0, f"failed at {ran[-1:]}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (clone / "runs" / "quickstart" / "bundle" / "manifest.json").is_file()
    # run's summary lines, kept by `tail` (180 held-out digits); the Python block prints the leaves it used
    for summary in (r"^accuracy .*\b180\b", r"^mean leaves \d", r"^budget misses \d+/180\b"):
        assert re.search(summary, proc.stdout, re.M), f"no line matching {summary!r}:\n{proc.stdout[-2000:]}"
