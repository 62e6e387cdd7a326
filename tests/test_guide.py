"""The guide's command blocks, run as written (a promise in the docs is a test): each block docs/guide.md marks
with GUIDE_MARK runs in order in one folder, with the paths of a run the reader would have - the CIFAR checkpoint
and their own test file - pointed at the digits demo's (conftest's ``digits_demo``, run once per session), and the
names a Python fragment takes from the reader's code (``frame``, ``budget``, ``publish``) given first."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_all

GUIDE_MARK = "<!-- tests/test_guide.py runs this block -->"
BLOCK = re.compile(re.escape(GUIDE_MARK) + r"\n```(bash|python)\n(.*?)\n```\n", re.S)

# the reader's paths -> the demo's (copied into the folder the blocks run in)
PATHS = {"runs/cifar10_hne_resnet_small/checkpoint.pt": "runs/demo/train/checkpoint.pt",
         "my_test.npz": "runs/demo/frames.npz", '"metrics.json"': '"runs/demo/eval/metrics.json"'}  # fmt: skip
# what a Python fragment takes from the reader's own code around it; a runner where it uses one it did not open
GIVEN = """import numpy as np
frame = image = np.load("runs/demo/frames.npz")["x"][0]
budget, slack_ms = 2.0, 1.0
publish = lambda handle: None
"""
GIVEN_RUNNER = """from hne_edge.runtime import AnytimeRunner
runner = AnytimeRunner("bundle")
x = runner.preprocess(frame[None])
"""


def guide_script(guide: str) -> str:
    """The marked blocks as one bash script: bash blocks as they are, Python blocks fed to `python` after what they
    take as given."""
    blocks = BLOCK.findall(guide)
    assert guide.count(GUIDE_MARK) == len(blocks) >= 1, "a guide mark is not followed by a bash/python block"
    parts = ["set -euo pipefail", "set -x"]
    for language, body in blocks:
        for theirs, ours in PATHS.items():
            body = body.replace(theirs, ours)
        given = GIVEN + (GIVEN_RUNNER if "runner." in body and "as runner" not in body else "")
        parts.append(body if language == "bash" else f"python - <<'GUIDE_PYTHON'\n{given}{body}\nGUIDE_PYTHON")
    return "\n".join(parts) + "\n"


def test_the_guide_marks_its_evaluate_export_and_runtime_blocks():
    script = guide_script((REPO / "docs" / "guide.md").read_text())
    for command in ("hne-edge eval", "--test-data", "hne-edge export", "hne-edge verify", "hne-edge bench",
                    "fit(TrainConfig", "runner.run(", "session.refine(", "StreamScheduler(runner"):  # fmt: skip
        assert command in script, f"the guide's marked blocks do not run {command}"
    assert "runs/cifar10_hne_resnet_small" not in script and "my_test.npz" not in script  # every reader's path mapped


@pytest.mark.xdist_group("digits_demo")
@pytest.mark.timeout(7200)  # the shared `make demo` (up to 3600 s) runs inside the first of them
@pytest.mark.slow
def test_the_guides_blocks_run_as_written(digits_demo, tmp_path):
    demo = digits_demo.root / "runs" / "demo"
    assert digits_demo.proc.returncode == 0, digits_demo.proc.stdout[-3000:] + digits_demo.proc.stderr[-3000:]
    ours = tmp_path / "runs" / "demo"
    for name in ("train/checkpoint.pt", "frames.npz", "eval/metrics.json"):
        (ours / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(demo / name, ours / name)
    env = dict(digits_demo.env, MPLBACKEND="Agg", OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    proc = run_all(["bash", "-c", guide_script((REPO / "docs" / "guide.md").read_text())], cwd=tmp_path, env=env,
                   timeout=3600)  # fmt: skip
    ran = [line for line in proc.stderr.splitlines() if line.startswith("+ ")]  # set -x: the commands as run
    assert proc.returncode == 0, f"failed at {ran[-1:]}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for made in ("runs/digits/checkpoint.pt", "runs/demo/train/metrics.json", "bundle/manifest.json", "bench"):
        assert (tmp_path / made).exists(), f"the guide's blocks did not make {made}"
