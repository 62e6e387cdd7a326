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
    assert [format_duration(s) for s in (0.0996, 0.02, 0.0005, 0.0)] == ["100 ms", "20 ms", "0.5 ms", "0 ms"]  # never 0.0 s
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


def test_a_failing_command_ends_with_its_error_not_a_progress_line():
    # before its first update, set or restart, a reporter is silent: the command is still checking its inputs,
    # and an error there is the only line (the heartbeat had printed `export: 0 files, elapsed 10 s` first)
    out = io.StringIO()
    p = Progress(None, "export", "file", stream=out, every_s=0.02)
    time.sleep(0.2)
    assert out.getvalue() == ""
    p.set(note="slicing")
    p.close()
    assert out.getvalue().startswith("export: 0 files")

    out = io.StringIO()
    try:
        with Progress(None, "eval", "image", stream=out, heartbeat=False):
            raise ValueError("bad checkpoint")
    except ValueError:
        pass
    assert out.getvalue() == ""


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
    assert "hne-edge train needs torch" in str(exc) and "pip install 'hne_edge-0.1.0-py3-none-any.whl[train]'" in str(exc)
    assert missing_extra(ModuleNotFoundError("No module named 'foo'", name="foo"), "x") is None  # a bug, not the install
    # issue 28: `run` takes images, so the runtime extra brings Pillow (PIL); and no message sends a user to a
    # package index that does not have hne-edge (`pip install 'hne-edge[...]'`): the wheel route, one home for it
    assert EXTRA_OF_MODULE["PIL"] == "runtime" and any(p.startswith("pillow") for p in extras["runtime"])
    assert "docs/guide.md#installing-on-a-device" in str(exc)
    index_route = [f"{path.relative_to(REPO)}:{n}" for folder in ("hne_edge", "examples")
                   for path in (REPO / folder).rglob("*.py")
                   for n, line in enumerate(path.read_text().splitlines(), 1)
                   if "install 'hne-edge[" in line or "install hne-edge[" in line]  # fmt: skip
    assert index_route == [], index_route


def test_due_asks_for_costly_figures_only_when_a_line_will_show_them():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(100, "train", stream=out, every_s=10, clock=clock, heartbeat=False)
    asked = []
    for step in range(100):
        clock.t += 1.0
        if p.due():
            asked.append(step)
            p.update(loss=float(step))
        else:
            p.update()
    lines = out.getvalue().splitlines()
    # the first step, every 10 s after it, and the last step: each line carries figures read for it
    assert asked == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99], asked
    assert len(lines) == len(asked) and lines[-1].endswith("loss 99")
    # the answer holds for the update it announces, even if the period ends in between (no line with stale figures)
    p = Progress(100, "train", stream=out, every_s=10, clock=clock, heartbeat=False)
    p.update(loss=1.0)
    clock.t += 9.99
    assert not p.due()
    clock.t += 0.02
    before = out.getvalue()
    p.update()
    assert out.getvalue() == before and p.due()
    bar = Progress(10, "eval", stream=io.StringIO(), tty=True, clock=clock)
    assert bar.due() and not bar.due()  # a terminal refreshes its figures once a second
    clock.t += 1.0
    assert bar.due()
    assert not Progress(10, "x", enabled=False).due()


def test_steps_as_long_as_the_period_still_show_fresh_figures():
    """Seen in a loaded run: 10 s steps, and every line was the heartbeat's, repeating figures never read."""
    clock, out = FakeClock(), io.StringIO()
    p = Progress(100, "train", stream=out, every_s=10, clock=clock, heartbeat=False)
    p.set(note="epoch 1")
    for step in range(3):
        clock.t += 10.2
        p._beat()  # the period ends while the step runs: the heartbeat repeats the line
        clock.t += 0.3
        if p.due():
            p.update(loss=float(step))
        else:
            p.update()
    lines = out.getvalue().splitlines()
    assert [line.endswith(f"loss {k:g} - epoch 1") for line, k in zip(lines[2::2], range(3))] == [True] * 3, lines
    assert len(lines) == 7  # the first line, then per step: the heartbeat's and the step's with its figures


def test_restart_closes_a_phase_and_counts_the_next_one_afresh():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(2, "export", "file", stream=out, clock=clock, heartbeat=False)
    clock.t += 2
    p.update()
    clock.t += 2
    p.update(note="last file")  # within 10 s of the first line: not shown yet
    p.restart(3, "verify", "check")  # so the phase ends with its final line
    clock.t += 1
    p.update()
    clock.t += 1
    p.update()
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("export: 1/2 files (50%)")
    assert lines[1].startswith("export: 2/2 files (100%)") and lines[1].endswith("- last file")
    assert lines[2].startswith("verify: 1/3 checks (33%), 1 checks/s, elapsed 1.0 s, ETA 2.0 s")
    assert lines[3].startswith("verify: 2/3 checks (67%)")  # closed: its final line
    assert len(lines) == 4


def test_a_resumed_run_counts_earlier_steps_in_the_total_but_not_in_the_rate():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(100, "train", stream=out, clock=clock, heartbeat=False, initial=60)
    clock.t += 4
    p.update(2)
    assert out.getvalue().startswith("train: 62/100 steps (62%), 2.0 s/step, elapsed 4.0 s, ETA 1 min 16 s")


def test_units_read_as_english():
    clock, out = FakeClock(), io.StringIO()
    with Progress(2, "profile", "pass", stream=out, clock=clock, heartbeat=False) as p:
        clock.t += 1
        p.update()
    assert out.getvalue().startswith("profile: 1/2 passes (50%), 1 passes/s")


def test_a_finished_count_is_not_repeated_by_the_heartbeat():
    """Reproduces issue 28: eval's and the trainer's finished '360/360 images (100%)' kept printing every 10 s while
    the plots were drawn and the last validation ran (its rate falling, as if the work went on)."""
    out = io.StringIO()
    p = Progress(3, "eval", "image", stream=out, every_s=0.05)
    for _ in range(3):
        p.update()
    time.sleep(0.4)  # eight periods of silence after the last step
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("eval: 3/3 images (100%)") and sum("3/3" in line for line in lines) == 1, lines


def test_the_rate_and_eta_follow_the_latest_steps_not_the_start_up():
    """Issue 28: the ETA came from the rate since the start, start-up included; it covers the latest half of the
    elapsed time now, and leaves the first step out once there are others."""
    clock, out = FakeClock(), io.StringIO()
    p = Progress(1000, "train", "step", stream=out, every_s=10, clock=clock, heartbeat=False)
    clock.t += 60  # the first step: start-up, compilation
    p.update()
    for _ in range(199):
        clock.t += 0.5
        p.update()
    assert p.rate == 2.0 and p.eta == 400.0  # 800 steps left at 2 steps/s (the rate since the start: 1.25)


def test_a_heartbeat_shows_no_figures_read_at_an_earlier_step():
    """Issue 42: a heartbeat line during training showed the loss, accuracy and img/s read 164 steps before
    (`train: 383/477 steps ..., loss 0.583, train acc 75.6%, img/s 685` - the figures of step 220), and while one
    step ran long it repeated the last step's figures as if read again. A heartbeat line says what is current: the
    count, the rate, the time, and how long ago the last step ended."""
    clock, out = FakeClock(), io.StringIO()
    p = Progress(477, "train", stream=out, every_s=10, clock=clock, heartbeat=False)
    clock.t += 0.5
    assert p.due()
    p.update(loss="0.583", note="epoch 5/10")  # step 1: a line with its figures
    for _ in range(150):  # steps whose figures nobody read (no line was due)
        clock.t += 0.05
        p.update()
    clock.t += 2.5  # the period ends while the next step runs
    p._beat()
    beat = out.getvalue().splitlines()[-1]
    assert beat.startswith("train: 151/477 steps (32%)") and "loss" not in beat, beat
    assert beat.endswith(", last step 2.5 s ago - epoch 5/10"), beat
    clock.t += 0.1
    assert p.due()  # the first step after a heartbeat shows fresh figures
    p.update(loss="0.450")
    assert out.getvalue().splitlines()[-1].endswith("loss 0.450 - epoch 5/10")
    clock.t += 12  # one step runs long: the heartbeat does not repeat step 152's loss
    p._beat()
    beat = out.getvalue().splitlines()[-1]
    assert beat.startswith("train: 152/477 steps") and "loss" not in beat and "last step 12 s ago" in beat, beat
    q = Progress(3, "verify", "file", stream=io.StringIO(), every_s=10, clock=clock, heartbeat=False)
    q.set(note="b0.0.onnx")
    clock.t += 10
    q._beat()
    assert q._stream.getvalue().splitlines()[-1].endswith(", no file done yet - b0.0.onnx")


def test_work_after_the_last_step_still_gets_a_heartbeat_naming_it():
    """The last epoch's validation printed nothing for its whole length (127 s in a log, 3,000 images): the trainer's
    count was finished, and the heartbeat stayed silent to keep a finished count from repeating. Work named after
    the last step (a note) is news: it beats every period, naming that work, and the count is not shown as progress
    (no percentage, rate or ETA)."""
    clock, out = FakeClock(), io.StringIO()
    p = Progress(3, "train", stream=out, every_s=10, clock=clock, heartbeat=False)
    for _ in range(3):
        clock.t += 1
        p.update(note="epoch 1/1")
    clock.t += 10
    p._beat()  # nothing new after the last step: silent, as before
    assert out.getvalue().splitlines()[-1].startswith("train: 3/3 steps (100%)") and out.getvalue().count("\n") == 2
    p.set(note="epoch 1/1: validating 3000 images")
    beats = []
    for _ in range(3):
        clock.t += 10
        p._beat()
        beats.append(out.getvalue().splitlines()[-1])
    assert len(out.getvalue().splitlines()) == 5, out.getvalue()
    assert beats[0] == "train: all 3 steps done, elapsed 23 s, last step 20 s ago - epoch 1/1: validating 3000 images"
    assert beats[2].startswith("train: all 3 steps done, elapsed 43 s, last step 40 s ago")
    assert not any("3/3" in beat or "%" in beat or "/s" in beat or "ETA" in beat for beat in beats), beats
    p.close()
    assert len(out.getvalue().splitlines()) == 5  # closing says nothing the count's last line did not


def test_a_log_is_never_silent_for_more_than_a_period():
    """The heartbeat woke on a fixed 10 s grid from its start: a line written just after a wake-up left the next 19 s
    silent (the last epoch's validation, in a log). It wakes when a period since the last line ends. Simulated: the
    heartbeat's waits advance a fake clock, and the trainer's steps and notes happen at their times in between."""
    clock, stamps = FakeClock(), []

    class Stamped(io.StringIO):
        def write(self, text):
            stamps.extend([clock.t] * text.count("\n"))
            return super().write(text)

    p = Progress(2, "train", stream=Stamped(), every_s=10, clock=clock, heartbeat=False)
    events = [(100.0, lambda: p.set(note="epoch 1/1")), (100.5, p.update), (111.0, p.update),  # lines at 100, 111
              (111.1, lambda: p.set(note="epoch 1/1: validating 3000 images")), (160.0, p.close)]

    class SimulatedWait:
        def set(self):
            pass

        def wait(self, timeout):  # run what happens until the timeout ends (or the close)
            end = clock.t + timeout
            while events and events[0][0] <= end:
                clock.t, action = events.pop(0)
                action()
                if p._closed:
                    return True
            clock.t = end
            return False

    p._stop = SimulatedWait()
    events.pop(0)[1]()  # the first line; the heartbeat starts with it
    p._heartbeat()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert stamps[0] == 100.0 and len(stamps) >= 6 and max(gaps) <= 10, (stamps, p._stream.getvalue())
