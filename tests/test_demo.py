"""`hne-edge demo` end to end, through the CLI as `make demo` runs it."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", str(out), "--frames", "60", "--quiet", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for step in range(1, 7):
        assert f"[{step}/6" in text
    assert "checks passed" in text
    # the table: one row per budget, the unbudgeted row evaluates every leaf
    unbudgeted = [line for line in text.splitlines() if line.strip().startswith("none ")]
    assert len(unbudgeted) == 1 and " 16.00 " in unbudgeted[0], text
    summary = json.loads((out / "demo.json").read_text())
    rows = summary["budgets"]
    assert rows[-1]["budget_ms"] is None and rows[-1]["mean_leaves"] == 16 and rows[-1]["misses"] == 0
    leaves = [r["mean_leaves"] for r in rows[1:-1]]
    assert leaves[0] <= leaves[-1]  # a larger budget never buys fewer leaves on average (same frames)
    assert rows[-1]["accuracy"] > 0.8  # digits is easy: a trained HNE is well above chance (10%)
    for name in ("metrics.json", "tree.png", "anytime_budget.png"):
        assert (out / "eval" / name).is_file()
    assert (out / "bundle" / "manifest.json").is_file() and (out / "train" / "checkpoint.pt").is_file()
    assert "next:" in text and "hne-edge inspect" in text
    # a second run replaces its own folder; a foreign folder is refused with exit 2 and left alone
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    proc = run_cli("demo", "--out", str(foreign))
    assert proc.returncode == 2 and "was not written by hne-edge demo" in proc.stderr
    assert (foreign / "keep.txt").read_text() == "x"
