"""The one progress reporter: bars on a terminal, periodic plain lines with rate and ETA in a log."""

from __future__ import annotations

import io
import time

from hne_edge.progress import Progress, format_duration, progress_for


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_format_duration_reads_like_a_person_would_say_it():
    assert format_duration(3.25) == "3.2 s"
    assert format_duration(42) == "42 s"
    assert format_duration(185) == "3 min 05 s"
    assert format_duration(2 * 3600 + 10 * 60) == "2 h 10 min"
    assert format_duration(float("nan")) == "?"


def test_log_lines_come_at_the_first_step_then_at_most_every_period_and_at_the_end():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(100, "epoch 1/3", "step", stream=out, every_s=10, clock=clock, heartbeat=False)
    for _ in range(100):
        clock.t += 0.5  # 2 steps/s: 50 s in all
        p.update(loss=0.5)
    p.close()
    lines = out.getvalue().splitlines()
    # the first step, then one line per 10 s of work (5), the last step's line; close adds nothing new
    assert len(lines) == 6, lines
    assert lines[0].startswith("epoch 1/3: 1/100 steps (1%), 2 steps/s, elapsed 0.5 s, ETA 50 s, loss 0.5")
    assert lines[-1].startswith("epoch 1/3: 100/100 steps (100%), 2 steps/s, elapsed 50 s, loss 0.5")
    assert "ETA" not in lines[-1]


def test_a_slow_step_shows_its_time_per_step_and_the_note():
    clock, out = FakeClock(), io.StringIO()
    with Progress(4, "export", "file", stream=out, clock=clock, heartbeat=False) as p:
        clock.t += 30
        p.update(note="onnx/fp32/segments/leaf00.onnx")
    assert out.getvalue().splitlines()[0] == (
        "export: 1/4 files (25%), 30 s/file, elapsed 30 s, ETA 1 min 30 s - onnx/fp32/segments/leaf00.onnx")


def test_the_heartbeat_speaks_while_one_step_runs_long():
    out = io.StringIO()
    p = Progress(3, "verify", "file", stream=out, every_s=0.05)
    p.set(note="onnx/fp32/nodes/b0.0.onnx")  # the first line, before any step is done
    deadline = time.monotonic() + 10
    while out.getvalue().count("\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("verify: 0/3 files") for line in lines[:3]), lines


def test_quiet_prints_nothing_and_a_terminal_gets_a_bar_not_lines():
    out = io.StringIO()
    with progress_for(10, "eval", quiet=True, stream=out) as p:
        p.update(5)
        p.write("summary")
    assert out.getvalue() == ""

    out = io.StringIO()
    with Progress(10, "eval", stream=out, tty=True) as p:
        p.update(5, acc=0.5)
        p.write("epoch 1 done")
    text = out.getvalue()
    assert "\r" in text and "epoch 1 done\n" in text  # redrawn in place; messages keep their own line


def test_errors_speak_to_python_callers_and_to_shell_users_in_their_own_terms():
    from hne_edge.cli import one_line
    from hne_edge.errors import InputError

    exc = InputError("output directory out exists", hint="pass force=True to replace it",
                     cli_hint="pass --force to replace it")
    assert str(exc) == "output directory out exists; pass force=True to replace it"
    assert one_line(exc) == "output directory out exists; pass --force to replace it"
    assert one_line(InputError("x", hint="use runner.preprocess", cli_hint="")) == "x"
    assert one_line(InputError("plain")) == str(InputError("plain")) == "plain"
    assert isinstance(exc, ValueError)  # the builtin base stays


def test_missing_extras_name_an_extra_that_pyproject_defines():
    import tomllib

    from conftest import REPO
    from hne_edge.errors import EXTRA_OF_MODULE, missing_extra

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    exc = missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"), "hne-edge train")
    assert "hne-edge train needs torch" in str(exc) and "pip install 'hne-edge[train]'" in str(exc)
    assert missing_extra(ModuleNotFoundError("No module named 'foo'", name="foo"), "x") is None  # a bug, not the install
