"""The README's quickstart, run exactly as written in a fresh clone, after `make demo` (issue 20).

The clone reuses the virtualenv this test runs in (`make demo VENV=... INSTALL=no`), so CI does not install
torch twice; `.venv` in the clone links to it, since the README's commands start from the `.venv` that
`make demo` builds. The README marks each block this test runs with QUICKSTART_MARK; the blocks run in
order in one bash shell with `set -euo pipefail`, so every command must exit 0. The clone and its `make demo`
are conftest's ``digits_demo``, whose output test_demo.py checks too (the demo runs once per session).
"""

from __future__ import annotations

import re

import pytest

from conftest import REPO, run_all

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


def test_quickstart_blocks_are_marked_and_use_the_runtime_api():
    script = quickstart_script((REPO / "README.md").read_text())
    assert script.index("source .venv/bin/activate") < script.index("hne-edge train")
    for command in ("hne-edge train", "hne-edge eval", "hne-edge export", "hne-edge verify", "hne-edge run"):
        assert command in script, f"the quickstart does not run {command}"
    assert "from hne_edge.runtime import AnytimeRunner, Agreement" in script
    assert "--download" not in script  # offline


@pytest.mark.xdist_group("digits_demo")
@pytest.mark.timeout(7200)  # the shared `make demo` (up to 3600 s) runs inside the first of them
@pytest.mark.slow
def test_quickstart_runs_as_written_in_a_fresh_clone(digits_demo):
    if not digits_demo.by_make:
        pytest.skip("the demo ran without make (no virtualenv, make, bash or git checkout here); the quickstart needs "
                    "the .venv that make builds")  # fmt: skip
    demo, clone = digits_demo.proc, digits_demo.root
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "pip install" not in demo.stdout + demo.stderr  # the virtualenv is reused, not reinstalled
    assert "next:" in demo.stdout and (clone / "runs" / "demo" / "bundle" / "manifest.json").is_file()

    script = quickstart_script((clone / "README.md").read_text())
    proc = run_all(["bash", "-c", script], cwd=clone, env=digits_demo.env, timeout=3600)
    ran = [line for line in proc.stderr.splitlines() if line.startswith("+ ")]  # set -x: the commands as run
    assert proc.returncode == 0, f"failed at {ran[-1:]}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (clone / "runs" / "quickstart" / "bundle" / "manifest.json").is_file()
    # run's summary lines, kept by `tail` (180 held-out digits); the Python block prints the leaves it used
    for summary in (r"^accuracy .*\b180\b", r"^mean leaves \d", r"^budget misses \d+/180\b"):
        assert re.search(summary, proc.stdout, re.M), f"no line matching {summary!r}:\n{proc.stdout[-2000:]}"
