"""Training to a time budget (TrainConfig.time_budget, ``hne-edge train --time-budget``): the plan's arithmetic by
hand, a run that ends inside its budget, a resumed run that keeps its plan and ends bit for bit as an
uninterrupted one, and the budget's spellings. Runs are timed on a fake clock: how close a real run comes to its
budget on this machine is in BENCHMARKS.md ("Training to a time budget")."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from hne_edge.errors import InputError
from hne_edge.train.checkpoint import load_checkpoint
from hne_edge.train.config import TrainConfig, parse_duration
from hne_edge.train import budget as budget_module
from hne_edge.train import engine, evaluation
from hne_edge.train.budget import plan_steps
from hne_edge.train.engine import fit


def _budget_run(out, budget, **over) -> TrainConfig:
    """hne_tiny on digits (6 steps of 32 images per epoch at --limit 192), one thread, to a time budget, on the CPU
    (a GPU machine's `auto` would train there: another pace and precision than these tests read)."""
    return TrainConfig.from_preset("digits", {"out": str(out), "quiet": True, "threads": 1, "time_budget": budget,
                                              "device": "cpu",
                                              "data": {"limit": 192}, "optim": {"epochs": 1000, "batch_size": 32}, **over})


def test_the_plan_is_the_most_steps_whose_work_fits():
    # 10 steps an epoch, 5 done, 1 s a step, a checkpoint 2 s and a validation 3 s per epoch end, 90 s left:
    # T = 60 costs 55 + 6 ends x 5 = 85 s; T = 61 starts epoch 7: 56 + 7 x 5 = 91 s > 90
    kw = dict(budget_s=100.0, elapsed_s=10.0, done_steps=5, step_s=1.0, steps_per_epoch=10, max_steps=10_000,
              epoch_end_s=2.0, val_s=3.0)
    assert plan_steps(**kw, eval_every=1) == 60
    # validating after epochs 2, 4, 6 and the last: T = 69 costs 64 + 7 x 2 + 4 x 3 = 90 s; T = 70 one more step
    assert plan_steps(**kw, eval_every=2) == 69
    assert plan_steps(**{**kw, "max_steps": 40}, eval_every=1) == 40  # optim.epochs caps it
    assert plan_steps(**{**kw, "elapsed_s": 99.0}, eval_every=1) == 5  # the budget is spent: stop where it is


def test_durations_and_their_errors():
    assert [parse_duration(v) for v in ("7m", "90s", "1h30m", "420", 12, "2.5min", " 1m 5s ")] == [
        420, 90, 5400, 420, 12, 150, 65]
    for bad in ("7x", "", "-3", 0, "m", "1h 30", True, float("nan")):
        with pytest.raises(InputError, match="expected a number of seconds > 0 or a duration such as 7m"):
            parse_duration(bad, "time_budget")
    assert TrainConfig.from_dict({"time_budget": "2m"}).time_budget == 120.0


class _FakeTime:
    """The training modules' ``time`` with a clock that moves only when the run works: each training step, each image
    predicted and each checkpoint costs a fixed number of seconds, whatever this machine's speed or load."""

    STEP_S, IMAGE_S, CHECKPOINT_S = 0.25, 0.002, 0.05

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def __getattr__(self, name):  # sleep, time, ...: the real ones
        return getattr(time, name)


@pytest.fixture
def fake_time(monkeypatch):
    """fit() on a fake clock (issue 28: a budget run timed on the real clock failed when the machine's load fell
    after the plan was fixed; how long a run takes on a given machine is a benchmark's, not a test's)."""
    clock = _FakeTime()
    monkeypatch.setattr(engine, "time", clock)
    monkeypatch.setattr(budget_module, "time", clock)

    class Budget(budget_module._TimeBudget):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "clock": clock.perf_counter})

    def costs(fn, seconds):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            clock.now += seconds(args, out)
            return out
        return wrapped

    monkeypatch.setattr(engine, "_TimeBudget", Budget)
    monkeypatch.setattr(engine, "train_step", costs(engine.train_step, lambda a, out: clock.STEP_S))
    predict = costs(evaluation.predict, lambda a, out: clock.IMAGE_S * len(out[1]))
    monkeypatch.setattr(evaluation, "predict", predict)  # what fit's validations call
    monkeypatch.setattr(budget_module, "predict", predict)  # what the plan times a validation with
    monkeypatch.setattr(engine, "save_checkpoint", costs(engine.save_checkpoint, lambda a, out: clock.CHECKPOINT_S))
    return clock


def test_a_run_ends_within_5_percent_of_its_budget_and_completes_its_schedule(tmp_path, fake_time):
    budget = 20.0
    started = fake_time.now
    result = fit(_budget_run(tmp_path / "run", budget))
    used = fake_time.now - started
    assert abs(used - budget) <= 0.05 * budget, f"{used:.2f} s for a budget of {budget} s ({result.budget})"
    plan = result.budget
    assert plan["step_s"] == pytest.approx(fake_time.STEP_S)  # the plan timed the steps, not the start-up
    assert plan["total_steps"] > plan["fixed_at_step"] and not plan["capped_by_epochs"]
    assert len(result.history) == math.ceil(plan["total_steps"] / 6)  # the epochs it said fit
    assert sum(h["train_images"] for h in result.history) == 32 * plan["total_steps"]
    assert result.history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # the cosine ran to its end
    assert "val_acc_n" in result.history[-1]
    assert any("time budget 20 s: the schedule ended after" in n for n in result.notes)
    state = load_checkpoint(result.checkpoint)
    assert state["extra"]["budget"]["total_steps"] == plan["total_steps"] and state["epoch"] == len(result.history)
    assert json.loads((tmp_path / "run" / "train_log.json").read_text())["budget"]["total_steps"] == plan["total_steps"]


@pytest.mark.parametrize("late", [False, True], ids=["from the plan on", "from 60 % of the planned steps on"])
def test_steps_that_slow_after_the_plan_shorten_it_and_the_run_still_ends_inside_its_budget(tmp_path, fake_time,
                                                                                            monkeypatch, late):  # fmt: skip
    """2026-11-29: a smoke run's plan was fixed from its first seconds, its epochs then slowed (0.80 s planned, 0.75-
    0.95 s run), and it used 1.03 of its budget alone and ran on past its stage's cap under the test suite. Here the
    steps take 1.6x the timed ones from the moment the plan is fixed, or from 60 % of its steps: the run shortens its
    schedule, ends inside its budget (and uses most of it: the rest is priced at the pace of the recent work, so the
    validations, which did not slow here, are priced 1.6x too), and its cosine still runs to zero. (The plan fixed
    once, as before: 1.55x the budget.)"""
    check = budget_module._TimeBudget._check

    def slowed(self, done_steps):
        if done_steps >= (0.6 * self.plan["planned_steps"] if late else 0):
            fake_time.STEP_S = 1.6 * _FakeTime.STEP_S  # a neighbour starts, or the clock throttles
        return check(self, done_steps)

    monkeypatch.setattr(budget_module._TimeBudget, "_check", slowed)
    budget, started = 20.0, fake_time.now
    result = fit(_budget_run(tmp_path / "run", budget))
    used = fake_time.now - started
    plan = result.budget
    assert 0.85 * budget <= used <= budget, f"{used:.2f} s for a budget of {budget} s ({plan})"
    assert plan["shortened"] and plan["total_steps"] < plan["planned_steps"]
    assert 1.3 < max(c["pace"] for c in plan["shortened"]) < 1.7  # the steps' 1.6, the validations' 1 in it
    assert sum(h["train_images"] for h in result.history) == 32 * plan["total_steps"]
    assert result.history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # the shortened cosine ran to its end
    assert any(f"from {plan['planned_steps']}, the work running up to" in n for n in result.notes), result.notes
    # stopped after it was shortened and resumed: the shortened schedule is in the checkpoint, the run ends as it did
    fake_time.STEP_S = _FakeTime.STEP_S
    again = _budget_run(tmp_path / "again", budget)
    fit(again, stop_after_steps=plan["shortened"][-1]["at_step"] + 2)
    resumed = fit(again, resume=True)
    assert resumed.budget["total_steps"] == plan["total_steps"]
    assert resumed.history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)
    lrs = [[h["lr"] for h in load_checkpoint(r.checkpoint)["extra"]["history"]] for r in (result, resumed)]
    assert lrs[1] == pytest.approx(lrs[0], abs=1e-12)  # every epoch's rate, the shortened stretch included


def test_a_one_off_stall_is_made_up_for_not_taken_for_the_pace_of_the_rest(tmp_path, fake_time, monkeypatch):
    """Issue 39's rule in the trainer: one checkpoint that stalls for 3 s (a disk, a neighbour's burst) is an event,
    not a new speed. The run makes up the time it lost - it shortens by about that much - and ends close to its
    budget; pricing the rest at the pace of a window that holds the stall (the work between the last four checks
    took 2.06x its plan) shortened it to 0.76 of the budget."""
    save, stalls = engine.save_checkpoint, []

    def stalled(*args, **kwargs):
        out = save(*args, **kwargs)
        if kwargs.get("epoch") == 4 and not stalls:
            stalls.append(fake_time.now)
            fake_time.now += 3.0
        return out

    monkeypatch.setattr(engine, "save_checkpoint", stalled)
    budget, started = 20.0, fake_time.now
    result = fit(_budget_run(tmp_path / "run", budget))
    used, plan = fake_time.now - started, result.budget
    assert stalls and plan["shortened"], plan  # the stall came after the plan, and its time was made up
    assert 0.95 * budget <= used <= budget, f"{used:.2f} s for a budget of {budget} s ({plan})"
    assert max(c["pace"] for c in plan["shortened"]) < 1.2, plan["shortened"]


def test_a_shortened_schedule_keeps_its_rate_and_still_reaches_its_end():
    """_Schedule.shorten: the rate at the step it is shortened at is unchanged (no jump in the middle of a run), it
    falls monotonically from there and reaches the schedule's end at the new last step; shortened twice, the same."""
    from hne_edge.train.schedule import _Schedule

    for kind in ("cosine", "step"):
        s = _Schedule(kind, 0, warmup_start=0.1).fit_to(1000, 100, 1.0)  # 100 warm-up steps
        assert s.warmup_steps == 100
        before = [s(k) for k in range(401)]
        s.shorten(400, 700)
        assert s(400) == pytest.approx(before[400])
        middle = [s(k) for k in range(400, 551)]
        s.shorten(550, 600)
        assert [s(k) for k in range(400, 551)] == pytest.approx(middle)
        after = [s(k) for k in range(400, 601)]
        assert all(a >= b for a, b in zip(after, after[1:]))
        assert s(600) == pytest.approx(0.0 if kind == "cosine" else 0.01)
        assert [s(k) for k in range(401)] == pytest.approx(before)  # the steps before it as they were run
    with pytest.raises(ValueError, match="inside the warm-up"):
        _Schedule("cosine", 0, warmup_start=0.1).fit_to(1000, 100, 1.0).shorten(50, 500)


def _ddp_budget(rank: int, store_path: str, out_path: str) -> None:
    """One of two gloo processes driving a _TimeBudget on its own fake clock: 0.25 s a step, 0.4 s on rank 0 once
    the plan is fixed; 10 steps an epoch, each epoch end 0.1 s. Writes what it ran."""
    from hne_edge.train.schedule import _Schedule

    store = torch.distributed.FileStore(store_path, 2)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=2)
    t = [0.0]
    schedule = _Schedule("cosine", 0).fit_to(1000, 10, 0.0)
    budget = budget_module._TimeBudget(60.0, 0.0, schedule, 10, 100, 0.0, 1, torch.device("cpu"), 2,
                                       measure_eval=lambda: 0.05, measure_checkpoint=lambda: 0.05, clock=lambda: t[0])
    done = 0
    while done < schedule.total_steps:  # fit's loop: an epoch ends at its last step of the schedule as it is now
        budget.epoch_started(validated=done > 0)
        first = done
        while True:
            t[0] += 0.4 if rank == 0 and budget.plan is not None else 0.25
            done += 1
            budget.after_step(done - first, min(10, schedule.total_steps - first), done)
            if done - first >= min(10, schedule.total_steps - first):
                break
        t[0] += 0.1
    Path(out_path).write_text(json.dumps({"done": done, "t": t[0], "plan": budget.record()}))
    torch.distributed.destroy_process_group()


def test_under_ddp_every_process_shortens_the_plan_at_the_same_step_to_the_same_length(tmp_path):
    """DDP: the checks fall on the same steps in every process and the shortest plan wins (an all-reduce), so a
    process that keeps its pace still shortens with the one that slowed, and none waits for the other forever."""
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_ddp_budget, args=(r, str(tmp_path / "store"), str(tmp_path / f"rank{r}.json")))
             for r in range(2)]  # fmt: skip
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0, f"a DDP process ended with exit code {proc.exitcode}"
    a, b = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    where = [[(c["at_step"], c["total_steps"]) for c in x["plan"]["shortened"]] for x in (a, b)]
    assert where[0] and where[0] == where[1], where
    assert a["plan"]["shortened"][0]["pace"] > 1.4 and b["plan"]["shortened"][0]["pace"] == pytest.approx(1.0)
    assert a["done"] == b["done"] == a["plan"]["total_steps"] < a["plan"]["planned_steps"]
    assert a["t"] <= 60.0, a  # the slow process ended inside its budget


@pytest.fixture
def fixed_plan(monkeypatch):
    """The plan fixed at a known step (the timed window closes after 4 steps) to ``fixed_plan.total`` steps, so that
    two runs can be compared bit for bit whatever this machine's speed."""

    class Plan:
        total = 20

    monkeypatch.setattr(budget_module._TimeBudget, "MIN_STEPS", 10**9)
    monkeypatch.setattr(budget_module._TimeBudget, "MAX_STEPS", 4)
    monkeypatch.setattr(budget_module, "plan_steps", lambda **kw: Plan.total)
    return Plan


def test_a_resumed_run_keeps_its_plan_and_ends_as_an_uninterrupted_one(tmp_path, fixed_plan):
    straight = fit(_budget_run(tmp_path / "a", 3600))
    assert straight.budget["total_steps"] == 20 and straight.budget["fixed_at_step"] == 8  # steps 4-6 and 8 timed
    interrupted = _budget_run(tmp_path / "b", 3600)
    fit(interrupted, stop_after_steps=9)  # in epoch 2, after the plan
    saved = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert (saved["epoch"], saved["extra"]["step"], saved["extra"]["budget"]["total_steps"]) == (1, 3, 20)
    fixed_plan.total = 30  # a resumed run does not plan again: it keeps the 20 steps its first call fixed
    torch.manual_seed(999)
    resumed = fit(interrupted, resume=True)
    assert resumed.budget["total_steps"] == 20 and len(resumed.history) == 4  # 6 + 6 + 6 + 2 steps
    a, b = load_checkpoint(straight.checkpoint), load_checkpoint(resumed.checkpoint)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["extra"]["step_losses"] == b["extra"]["step_losses"] and len(a["extra"]["step_losses"]) == 20
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 20
    assert [h["train_images"] for h in a["extra"]["history"]] == [192, 192, 192, 64]


def test_stopped_before_the_plan_the_checkpoint_still_holds_one(tmp_path):
    fit(_budget_run(tmp_path / "r", 3600), stop_after_steps=1)  # the timed window had not opened
    plan = load_checkpoint(tmp_path / "r" / "checkpoint.pt")["extra"]["budget"]
    assert plan["fixed_at_step"] == 1 and plan["timed_steps"] == 0 and plan["total_steps"] > 1
    resumed = fit(_budget_run(tmp_path / "r", 3600), resume=True, stop_after=1)
    assert resumed.budget["total_steps"] == plan["total_steps"]


def test_the_plan_line_says_what_was_timed_and_why_it_was_less_than_the_window(tmp_path, fake_time, capsys):
    """Issue 42: a 30 s budget's plan line said "477 steps of 48.3 ms over 1 timed steps" while the guide said 3 % of
    the budget is timed: start-up had taken a tenth of the budget, after which the first timed step sets the plan.
    The line names the steps and seconds timed, and why they are fewer than the window."""
    from hne_edge.train.schedule import _Schedule

    fit(_budget_run(tmp_path / "rushed", 5.0, quiet=False))  # two 0.25 s steps are a tenth of 5 s
    [rushed] = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("time budget") and "fit (" in ln]
    assert ("steps of 250.0 ms timed over 1 step: a tenth of the budget, start-up included, was spent before the "
            "window of 5 steps and 1.0 s filled; validation") in rushed, rushed
    t = [0.0]  # a 60 s budget's window: 5 steps and 1.8 s (3 %), after the 2 skipped
    budget = budget_module._TimeBudget(60.0, 0.0, _Schedule("cosine", 0), 100, 10, 0.0, 1, torch.device("cpu"), 1,
                                       measure_eval=lambda: 1.0, measure_checkpoint=lambda: 0.1, clock=lambda: t[0])
    step = 0
    while budget.plan is None:
        step += 1
        t[0] += 0.25
        budget.after_step(step, 100, step)
    full = budget.describe()
    assert "steps of 250.0 ms timed over 8 steps, 2.0 s; validation ~1.0 s and checkpoint ~0.1 s per epoch" in full, full
