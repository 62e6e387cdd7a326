"""The figures the docs quote from a committed record, read from the record (a promise in the docs is a test): the
shipped checkpoints' held-out accuracies and gains, the reference run's time and epochs, and the streams benchmark's
claims. A docs audit found five figures that had drifted from their records (2026-11-30): each is pinned here."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO

ASSETS = REPO / "hne_edge" / "assets"
PAPER_HNE_SMALL = [92.7, 93.1, 93.4, 94.1, 94.3]  # CIFAR-10, L^HD, n = 1 / 2 / 4 / 8 / 16 (Ruiz & Verbeek, Table)


def _text(name: str) -> str:
    return " ".join((REPO / name).read_text().split())  # one line: a figure may be wrapped anywhere


def _record(name: str) -> dict:
    return json.loads((ASSETS / name).read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


@pytest.mark.parametrize("record, docs", [("cifar10_reference.json", ("RESULTS.md", "docs/guide.md")),
                                          ("cifar10_demo.json", ("RESULTS.md", "docs/guide.md"))])  # fmt: skip
def test_the_shipped_checkpoints_accuracies_are_their_records(record, docs):
    held_out = {r["n"]: r for r in _record(record)["held_out"]}
    line = ", ".join(f"n={n}: {_pct(held_out[n]['accuracy'])}% ± {_pct(held_out[n]['se'])}%" for n in (1, 2, 4, 8, 16))
    assert line in _text("RESULTS.md"), f"RESULTS.md does not quote {record}'s held-out line: {line}"
    gain = held_out[16]
    assert f"n=16 vs n=1: +{_pct(gain['gain'])} points ± {_pct(gain['gain_se'])}" in _text("RESULTS.md")
    ends = f"{_pct(held_out[1]['accuracy'])} → {_pct(held_out[16]['accuracy'])} %"
    every = " / ".join(_pct(held_out[n]["accuracy"]) for n in (1, 2, 4, 8, 16))
    guide = _text("docs/guide.md")
    assert ends in guide or every in guide, f"docs/guide.md quotes neither {ends!r} nor {every!r} for {record}"


def test_the_reference_against_the_paper_is_the_records_distance():
    held_out = {r["n"]: r["accuracy"] for r in _record("cifar10_reference.json")["held_out"]}
    gaps = [paper - float(_pct(held_out[n])) for paper, n in zip(PAPER_HNE_SMALL, (1, 2, 4, 8, 16))]
    said = f"{min(gaps):.1f}-{max(gaps):.1f} points below"
    for doc in ("RESULTS.md", "docs/results.md"):
        assert said in _text(doc), f"{doc} does not say {said!r} (the table's gaps: {[round(g, 1) for g in gaps]})"
    row = " | ".join(_pct(held_out[n]) for n in (1, 2, 4, 8, 16))
    assert f"| held-out accuracy, 59 epochs (%) | {row} |" in _text("RESULTS.md")


def test_the_reference_runs_time_and_epochs_are_its_records():
    record = _record("cifar10_reference.json")
    text = _text("RESULTS.md")
    assert f"{record['epochs']:.1f} epochs in" in text and f"of a {record['time_budget_s']:.1f} s budget" in text
    assert f"{record['images_seen']:,} images at {record['throughput']['images_per_s_mean']:,.0f} img/s" in text
    assert f"time budget of what the call leaves ({record['time_budget_s']:.0f} s in the run below)" in text
    cap = re.search(r"--cap-s (\d+)", record["command"]).group(1)
    shown = re.findall(r"--stages reference --cap-s (\d+) --cifar-parts A B", text)
    assert shown == [cap], f"RESULTS.md shows --cap-s {shown}; the record's command ran {cap}"


def _streams(busy: int) -> dict[int, dict[str, dict]]:
    data = json.loads((REPO / "benchmarks" / "results" / f"streams_busy{busy}.json").read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    table: dict[int, dict[str, dict]] = {}
    for r in rows:
        table.setdefault(r["streams"], {})[r["method"]] = r
    return table


def test_the_streams_claims_beside_busy_loops_are_the_records():
    cells = [(busy, k, methods) for busy in (2, 6) for k, methods in _streams(busy).items()]
    acc = lambda methods, m: methods[m]["summary"]["expected_accuracy"]  # noqa: E731
    met = sum(acc(ms, "scheduler") >= max(acc(ms, "runners"), acc(ms, "fifo")) - 1e-9 for _, _, ms in cells)
    short = [max(acc(ms, "runners"), acc(ms, "fifo")) - acc(ms, "scheduler") for _, _, ms in cells]
    short = [s for s in short if s > 1e-9]
    results = _text("docs/results.md")
    assert f"at least both baselines in {met} of {len(cells)} cells" in results
    count = ["none", "one", "two", "three", "four", "five", "six", "seven", "eight"][len(short)]
    assert f"short of the better baseline by {min(short):.4f}-{max(short):.4f} in {count}" in results
    medians = max(ms["scheduler"]["summary"]["miss_rate"] for _, _, ms in cells)
    single = max(max(ms["scheduler"]["each_miss_rate"]) for _, _, ms in cells)
    assert medians <= 0.001 and f"one run of 24 at {100 * single:.2f} %" in results
    baselines = [ms[m]["summary"]["miss_rate"] for _, k, ms in cells if k == 8 for m in ("fifo", "runners")]
    reach = f"{100 * min(b for b in baselines if b > 0.01):.1f}-{100 * max(baselines):.1f} %"
    assert f"the baselines' reach {reach}" in results
