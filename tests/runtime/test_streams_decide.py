"""The stream scheduler's policy (:func:`~hne_edge.runtime.stream_policy.decide`, ``admit``) on hand-made states:
which step runs, for which frames, which frames are delivered - each rule of the policy's module docstring on
the smallest state that shows it. (On a virtual clock from recorded timings: test_streams_policy.py; the
scheduler's threads: test_streams.py.)"""

from __future__ import annotations

import pytest

from hne_edge.bundle import read_manifest
from hne_edge.errors import InputError
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.stream_policy import ARRIVAL_S, ArrivalRate, one_call, saturated
from hne_edge.runtime.streams import Pending, accuracy_by_n, admit, decide, expected_accuracy, gain_curve, read_accuracy
from conftest import REPO
from runtime_fakes import FakeBackend, make_fake_bundle

CLASSES = 4


class Costs:
    """A cost model stand-in: ``secs[j]`` per step at one row, ``scale(rows)`` times that at more."""

    def __init__(self, secs, scale=lambda rows: rows):
        self.secs, self.scale, self.cache = list(secs), scale, {}

    def __call__(self, rows):
        if rows not in self.cache:
            m = type("M", (), {})()
            m.pred = m.base = [s * self.scale(rows) for s in self.secs]
            m.known = [True] * len(self.secs)
            self.cache[rows] = m
        return self.cache[rows]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """hne_resnet_small's tree (16 leaves), plan segments, compiled from a fake bundle: only the schedule matters."""
    root = make_fake_bundle(tmp_path_factory.mktemp("decide") / "b", branching=(1, 2, 2, 2, 2), classes=CLASSES,
                            batch=(1, 1, 8), plans=("segments", "subtrees", "fused"))  # fmt: skip
    with AnytimeRunner(root, backend=FakeBackend(read_manifest(root).tree, CLASSES), load_profile=False, warmup=0) as runner:
        return runner._program


LEAVES = gain_curve(None, 16)


def test_admit_is_edf_over_first_leaves(program):
    costs = Costs([1.0] * 16)
    waiting = [Pending(0, 2.0, 0, 1, False), Pending(1, 2.5, 0, 1, False)]
    assert admit(0.0, waiting, Pending(9, 3.0, 0, 1, False), program, costs, batching=False)  # ends 1, 2, 3
    assert not admit(0.0, waiting, Pending(9, 2.2, 0, 1, False), program, costs, batching=False)  # 2.5's would end at 3
    assert not admit(2.0, [], Pending(9, 2.5, 0, 1, False), program, costs)  # its own first leaf ends at 3.0
    # a waiting frame already past saving does not block the new one
    assert admit(0.0, [Pending(0, 0.5, 0, 1, False)], Pending(9, 1.0, 0, 1, False), program, costs, batching=False)
    # stacked first leaves: three in one call of 1.2 s fit deadlines at 1.5
    stacking = Costs([1.0] * 16, scale=lambda rows: 1 + 0.1 * (rows - 1))
    waiting = [Pending(0, 1.5, 0, 1, False), Pending(1, 1.5, 0, 1, False)]
    assert admit(0.0, waiting, Pending(9, 1.5, 0, 1, False), program, stacking)
    assert not admit(0.0, waiting, Pending(9, 1.5, 0, 1, False), program, stacking, batching=False)


def test_first_leaves_run_earliest_deadline_first_and_before_refinements_that_can_wait(program):
    costs = Costs([1.0] * 16)
    frames = [Pending(0, 9.0, 0, 1, False), Pending(1, 4.0, 0, 1, False), Pending(2, 20.0, 3, 1, False)]
    d = decide(0.0, frames, program, costs, LEAVES, batching=False)
    assert (d.step, d.frames, d.finish, d.doomed) == (0, (1,), (), ())
    # first leaves as soon as the plan allows: before a refinement that can still make its deadline after them ...
    frames = [Pending(0, 9.0, 0, 1, False), Pending(2, 2.0, 3, 1, False)]
    assert decide(0.0, frames, program, costs, LEAVES).frames == (0,)
    # ... after one that could not (EDF among the plan's steps) ...
    frames = [Pending(0, 9.0, 0, 1, False), Pending(2, 1.5, 3, 1, False)]
    assert decide(0.0, frames, program, costs, LEAVES).frames == (2,)
    # ... and a refinement that would make a first leaf late waits
    frames = [Pending(0, 1.5, 0, 1, False), Pending(2, 2.0, 3, 1, False)]
    d = decide(0.0, frames, program, costs, LEAVES)
    assert d.frames == (0,) and d.finish == ()


def test_at_saturation_a_waiting_first_leaf_runs_before_any_refinement(program):
    """Where arrivals alone keep the device busy, a refinement's milliseconds are a new frame's first leaf refused:
    at saturation no refinement runs while a first leaf waits, even one EDF would run first (rule 1)."""
    costs = Costs([1.0] * 16)
    frames = [Pending(0, 9.0, 0, 1, False), Pending(2, 1.5, 3, 1, False)]
    assert decide(0.0, frames, program, costs, LEAVES).frames == (2,)  # EDF: the refinement first (it cannot wait)
    d = decide(0.0, frames, program, costs, LEAVES, overload=True)
    assert (d.step, d.frames) == (program.at[0], (0,))
    only_refinements = [Pending(2, 9.0, 3, 1, False)]  # nothing waits for a first leaf: the slack is the refinement's
    assert decide(0.0, only_refinements, program, costs, LEAVES, overload=True).frames == (2,)


def test_the_arrival_rate_reads_a_burst_as_a_count_and_an_overload_as_a_rate():
    rate = ArrivalRate(0.0)
    assert rate.add(0.0, 40) == pytest.approx(40 / ARRIVAL_S)  # 40 rows at one instant: 400 rows a second
    assert rate.rate(10.0) < 1e-3  # and gone 10 s later
    rate = ArrivalRate(0.0)
    for k in range(1, 2401):  # 2,400 rows a second for one second
        got = rate.add(k / 2400, 1)
    assert got == pytest.approx(2400, rel=0.01)


def test_saturation_is_arrivals_at_the_cheapest_seconds_a_row_filling_the_device(program):
    stacking = Costs([1e-3] * 16, scale=lambda rows: 1 + 0.1 * (rows - 1))  # 8 rows: 1.7 ms, 0.21 ms a row
    at = 8 / 1.7e-3  # rows a second that fill the device at 8 rows a call
    assert saturated(at * 1.01, program, stacking, max_rows=8)
    assert not saturated(at * 0.99, program, stacking, max_rows=8)
    assert saturated(1.01e3, program, stacking, max_rows=8, batching=False)  # one row a call: 1 ms a row
    assert not saturated(0.99e3, program, stacking, max_rows=8, batching=False)
    assert saturated(0.99e3, program, stacking, max_rows=8, batching=False, overhead=2e-5)  # the worker's time counts
    dear = Costs([1e-3] * 16, scale=lambda rows: 1 if rows == 1 else 2.5 * rows)  # a stack dearer a row than one
    assert saturated(1.01e3, program, dear, max_rows=8) and not saturated(0.5e3, program, dear, max_rows=8)
    cold = Costs([float("inf")] * 16)
    assert not saturated(1e9, program, cold, max_rows=8)  # nothing measured says


def test_one_call_is_the_first_leaves_waiting_and_the_new_one_stacked_as_decide_stacks_them(program):
    stacking = Costs([1.0] * 16, scale=lambda rows: 1 + 0.1 * (rows - 1))
    me = Pending(9, 5.0, 0, 1, False)
    assert one_call(0.0, [], me, program, stacking)  # nothing waits
    waiting = [Pending(0, 1.5, 0, 1, False), Pending(1, 2.0, 0, 1, False)]
    assert one_call(0.0, waiting, me, program, stacking)  # three rows in 1.2 s: by 1.5
    assert not one_call(0.4, waiting, me, program, stacking)  # from 0.4 the stack ends at 1.6: the first misses
    assert not one_call(0.0, waiting, me, program, stacking, max_rows=2)  # more rows than one call holds
    assert not one_call(0.0, waiting, me, program, stacking, batching=False)  # a backend that cannot stack
    assert not one_call(0.0, waiting, me, program, Costs([1.0] * 16))  # stacking saves nothing: not one call
    late = [Pending(5, 0.1, 0, 1, True)]
    assert not one_call(0.0, [], me, program, stacking, ahead=late)  # a late first leaf queued: the device is behind


def test_slack_goes_to_the_step_with_the_highest_value_per_ms(program):
    secs = [1.0] * 16
    secs[3], secs[8] = 0.5, 2.0  # leaf 3 is cheap, leaf 8 dear
    costs = Costs(secs)
    a, b = Pending(0, 2.0, 3, 1, False), Pending(1, 2.1, 8, 1, False)  # room for one of them only
    assert decide(0.0, [a, b], program, costs, LEAVES).frames == (0,)  # 1 leaf / 0.5 s beats 1 leaf / 2 s
    # the expected accuracy gain: the shipped checkpoint's record rises more from 1 to 2 leaves than from 8 to 9
    record = read_accuracy(REPO / "hne_edge" / "assets" / "cifar10_demo.json")
    late, early = Pending(0, 1.5, 8, 1, False), Pending(1, 1.6, 1, 1, False)  # same cost, room for one
    flat = Costs([1.0] * 16)
    assert decide(0.0, [late, early], program, flat, LEAVES).frames == (0,)  # a leaf is a leaf: the first listed
    assert decide(0.0, [late, early], program, flat, gain_curve(record, 16)).frames == (1,)
    # times its rows: a frame of 8 images gains 8 times (a GPU-like cost: rows cost nothing)
    wide = Costs([1.0] * 16, scale=lambda rows: 1.0)
    assert decide(0.0, [Pending(0, 1.5, 3, 1, False), Pending(1, 1.6, 8, 8, False)], program, wide, LEAVES).frames == (1,)


def test_frames_at_the_same_step_are_stacked_when_it_pays_and_fits(program):
    stacking = Costs([1.0] * 16, scale=lambda rows: 1 + 0.2 * (rows - 1))
    frames = [Pending(k, 10.0, 5, 1, False) for k in range(3)] + [Pending(3, 10.0, 6, 1, False)]
    d = decide(0.0, frames, program, stacking, LEAVES)
    assert d.step == 5 and d.frames == (0, 1, 2) and d.seconds == pytest.approx(1.4)
    assert decide(0.0, frames, program, Costs([1.0] * 16), LEAVES).frames in ((0,), (1,), (2,), (3,))  # no gain: alone
    assert len(decide(0.0, frames, program, stacking, LEAVES, max_rows=2).frames) == 2
    # the stacked call of three (1.4) would end after frame 0's deadline: a stack of two ends by it (1.2) ...
    frames[0] = Pending(0, 1.2, 5, 1, False)
    assert decide(0.0, frames, program, stacking, LEAVES).frames == (0, 1)
    # ... and where no stack does, frame 0 runs alone and the others stacked
    frames[0] = Pending(0, 1.1, 5, 1, False)
    assert decide(0.0, frames, program, stacking, LEAVES).frames == (0,)
    assert decide(1.0, [f for f in frames if f.key], program, stacking, LEAVES).frames == (1, 2)


def test_a_stack_counts_the_workers_time_per_call_and_shrinks_to_the_rows_that_pay(program):
    """Each separate call costs the worker's own time too (deciding, handing over; ``overhead``): with no saving
    per row, three frames are one call as soon as that time is not zero (ONNX Runtime CPU on the bench's
    machine: 0.43 ms per row at 1 to 16 rows, the worker's 0.1-0.3 ms a call). And a stack that does not pay at
    its full size is tried one row smaller, not given up: here three rows cost more than three calls, two rows
    less than two."""
    frames = [Pending(k, 10.0, 5, 1, False) for k in range(3)]
    per_row = Costs([1.0] * 16)
    assert len(decide(0.0, frames, program, per_row, LEAVES).frames) == 1  # no time per call: nothing to save
    d = decide(0.0, frames, program, per_row, LEAVES, overhead=0.2)
    assert d.frames == (0, 1, 2) and d.median == pytest.approx(3.2)
    two_pay = Costs([1.0] * 16, scale=lambda rows: {1: 1.0, 2: 1.5}.get(rows, 3.5))
    assert decide(0.0, frames, program, two_pay, LEAVES).frames == (0, 1)


def test_frames_are_delivered_when_no_step_fits_or_adds_value_and_first_leaves_past_saving_run_late(program):
    costs = Costs([1.0] * 16)
    frames = [Pending(0, 0.5, 4, 1, False), Pending(1, 9.0, 0, 1, False), Pending(2, 0.5, 0, 1, False)]
    d = decide(0.0, frames, program, costs, LEAVES)
    assert d.finish == (0,) and d.doomed == (2,) and d.frames == (2,)  # a late first leaf goes first if the others fit
    flat = gain_curve({1: 0.6, 4: 0.7, 16: 0.7}, 16)
    assert decide(0.0, [Pending(0, 9.0, 4, 1, False)], program, costs, flat).finish == (0,)


def test_a_first_leaf_past_saving_is_dropped_while_others_wait_and_run_late_alone(program):
    """``drop_late`` (the scheduler's default, late="reject"): a frame without a leaf that cannot make its deadline
    even at its median, while other frames are pending, is dropped (delivered as rejected) - its answer is worth
    nothing by then, and running it delays every frame that still can (8 cameras beside busy neighbours: late
    frames answered 200 ms after their deadlines, the queue behind them missed). Alone it still runs late: it takes
    nothing from anyone. Without drop_late (late="run") it runs late, flagged, as before."""
    costs = Costs([1.0] * 16)
    past, fine = Pending(0, 0.5, 0, 1, True), Pending(1, 3.0, 0, 1, False)
    d = decide(0.0, [past, fine], program, costs, LEAVES, batching=False, drop_late=True)
    assert d.drop == (0,) and d.frames == (1,)
    d = decide(0.0, [past], program, costs, LEAVES, batching=False, drop_late=True)
    assert d.drop == () and d.frames == (0,)  # alone: runs late
    d = decide(0.0, [past, fine], program, costs, LEAVES, batching=False)
    assert d.drop == () and d.frames == (0,)  # late="run": the late first leaf goes first, the other still fits


def test_a_hand_out_stall_is_one_more_margin_of_the_sequence(program):
    """``margin`` (a stall the answer's hand-out may meet) is charged as one call's margin: a refinement runs when
    its median plus the larger of its own margin and this one ends by the deadline; first leaves are planned
    with it too. Not the sum: one stall strikes the sequence."""
    costs = Costs([1.0] * 16)
    go_on = Pending(0, 3.0, 1, 1, False)  # a refinement of 1 s, 3 s before its deadline
    assert decide(0.0, [go_on], program, costs, LEAVES, margin=2.0).frames == (0,)
    assert decide(0.0, [go_on], program, costs, LEAVES, margin=2.5).finish == (0,)
    wider = Costs([1.0] * 16)
    wider(1).pred = [2.5] * 16  # its own margin 1.5 s: the larger of the two counts, not their sum
    assert decide(0.0, [go_on], program, wider, LEAVES, margin=1.5).frames == (0,)
    assert decide(0.0, [go_on], program, wider, LEAVES, margin=2.5).finish == (0,)
    firsts = [Pending(0, 3.0, 0, 1, False), Pending(1, 3.5, 0, 1, False)]  # at the medians: ends 1, 2
    d = decide(0.0, firsts, program, costs, LEAVES, batching=False, margin=1.5)
    assert d.frames == (0,) and d.doomed == ()
    assert admit(0.0, firsts[:1], firsts[1], program, costs, batching=False, margin=1.5)
    assert not admit(0.0, firsts[:1], firsts[1], program, costs, batching=False, margin=1.6)


def test_gain_curve_is_the_least_concave_majorant_and_records_are_read(tmp_path):
    g = gain_curve({1: 0.5, 2: 0.49, 4: 0.53, 16: 0.53}, 16)
    assert g[0] == 0.0 and g[1] == 0.5 and g[2] == pytest.approx(0.51) and g[4] == pytest.approx(0.53)
    assert all(b >= a for a, b in zip(g[1:], g[2:]))
    record = read_accuracy(REPO / "hne_edge" / "assets" / "cifar10_demo.json")
    assert sorted(record) == [1, 2, 4, 8, 16] and record[16] == 0.6308
    acc = accuracy_by_n(record, 16)
    assert acc[3] == pytest.approx((0.62 + 0.6218) / 2)
    assert expected_accuracy([0, 16, 1], acc) == pytest.approx((0.6308 + 0.6178) / 3)
    (tmp_path / "bad.json").write_text('{"held_out": [{"n": 1, "accuracy": 1.5}]}')
    with pytest.raises(InputError, match=r"accuracy at n = 1: received 1.5; expected a fraction in \[0, 1\]"):
        read_accuracy(tmp_path / "bad.json")
    with pytest.raises(InputError, match="expected n = 1 among them"):
        gain_curve({2: 0.5}, 16)
