"""The online cost model under pre-emption stalls (virtual clock: deterministic), and saved profiles."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.runtime import AnytimeRunner, profile_file
from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle

NODE_S = 0.000025  # 31 nodes: the full tree of 16 leaves takes 0.775 ms


@pytest.fixture(scope="module")
def bundle16(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("stall") / "b", branching=(1, 2, 2, 2, 2), classes=4)


class Stalls:
    """Per-frame node costs: NODE_S, plus a pre-drawn 16-44 ms stall on some nodes (a pre-empted process)."""

    def __init__(self, tree, seed=0):
        self.tree, self.rng = tree, np.random.default_rng(seed)
        self.nodes = [n.id for n in tree.nodes]
        self.extra: dict[str, float] = {}

    def draw(self, p: float) -> None:
        hit = self.rng.random(len(self.nodes)) < p
        stall = self.rng.uniform(0.016, 0.044, len(self.nodes))
        self.extra = {n: s for n, s, h in zip(self.nodes, stall, hit) if h}

    def __call__(self, node: str, batch: int) -> float:
        return NODE_S + self.extra.get(node, 0.0)

    def oracle(self, budget_ms: float) -> int:
        """Leaves whose true cumulative time fits the budget (at least the forced first one)."""
        leaf_s = [sum(self(n, 1) for n in seg.nodes) for seg in self.tree.segments]
        return max(1, int((np.cumsum(leaf_s) * 1e3 <= budget_ms).sum()))


def stalled_runner(bundle):
    m = read_manifest(bundle)
    stalls = Stalls(m.tree)
    backend = FakeBackend(m.tree, m.num_classes, stalls)
    return AnytimeRunner(bundle, backend=backend, load_profile=False, warmup=0), stalls


def frame():
    return np.zeros((1, C, H, W), np.float32)


PERIOD_S = 1 / 30  # a camera's frame period: the virtual clock moves on to the next frame's arrival


def camera_frame(runner, budget_ms):
    """One frame of a 30 fps camera: run under ``budget_ms``, then the clock moves on to the next arrival."""
    clock = runner.backend.clock
    start = clock.t
    r = runner.run(frame(), budget_ms=budget_ms)
    clock.t = max(clock.t, start + PERIOD_S)
    return r


BURST_ONSET = 12  # frames of a burst in which its stalls are not yet a pattern (measured: the last such miss, 8)


@pytest.mark.parametrize("budget_ms", [5.0, 2 * 31 * NODE_S * 1e3])
def test_leaves_recover_within_a_stated_time_after_a_burst_of_stalls(bundle16, budget_ms):
    """A burst of stalls (16-44 ms on about one node call in 20, 40 frames of a 30 fps camera) keeps optional steps
    from starting while it lasts (any of them would likely miss: none misses after its first 12 frames); once it
    is over the stalls' decayed count falls below MIN_STALLS within HORIZON_S * ln(count / MIN_STALLS), or a quiet
    run of work makes its rate improbable (measured: 40 frames, 1.3 s) and every leaf runs again: within 50 frames
    (1.7 s)."""
    runner, stalls = stalled_runner(bundle16)
    for _ in range(30):  # quiet: learn the costs
        stalls.draw(0.0)
        assert camera_frame(runner, budget_ms).leaves == 16
    burst = []
    for _ in range(40):  # a burst: about one stall in every frame
        stalls.draw(0.05)
        burst.append(camera_frame(runner, budget_ms))
    # past its onset no optional leaf meets a stall (an issue-39 audit: this test passed with a stall learned as a
    # cost - frames 34 and 35 missed with optional leaves - and without the allowance: 14 such frames)
    late = [i for i, r in enumerate(burst) if not r.met_budget and r.leaves > 1]
    assert [i for i in late if i >= BURST_ONSET] == [], late
    k = 50
    leaves = []
    for _ in range(60):  # quiet again
        stalls.draw(0.0)
        leaves.append(camera_frame(runner, budget_ms).leaves)
    assert leaves[k:] == [16] * (60 - k), leaves


@pytest.mark.parametrize("budget_ms", [5.0, 2 * 31 * NODE_S * 1e3])
def test_sustained_stalls_longer_than_the_budget_cost_only_the_forced_leaves_misses(bundle16, budget_ms):
    """Stalls keep coming (16-44 ms on 1 node call in 50) against budgets of 2x-6x the full tree: any step started
    meets one ~2-10 % of the time, and then misses whatever its slack. The runner starts an optional step only
    while the chance that a stall longer than its slack strikes it is under 1 % (the stall allowance), so its
    misses are those of the forced first leaf (its 5 nodes stall ~10 % of the time) plus at most 2 points
    (measured: 1.75, from the frames in which the stalls' decayed count dipped below MIN_STALLS). The
    cost model before the stall model ran 90 % of the clairvoyant oracle's leaves here and missed ~40 % of the
    frames: the expected accuracy of those answers was lower than one leaf on time."""
    runner, stalls = stalled_runner(bundle16)
    for _ in range(20):
        stalls.draw(0.0)
        camera_frame(runner, budget_ms)
    forced = [seg.nodes for seg in runner.tree.segments][0]
    misses = forced_misses = 0
    frames = 400
    for _ in range(frames):
        stalls.draw(0.02)
        r = camera_frame(runner, budget_ms)
        misses += not r.met_budget
        forced_misses += any(n in stalls.extra for n in forced)
    assert misses <= forced_misses + 0.02 * frames, (misses, forced_misses)
    # a stall is not a cost: every step's steady cost stays what it was (bases drift up a little at most)
    model = runner.cost.for_batch(1)
    leaf_s = np.array([len(seg.nodes) for seg in runner.tree.segments]) * NODE_S
    assert (np.array(model.base) <= 1.25 * leaf_s).all(), np.array(model.base) / leaf_s


def test_a_leaf_kept_out_by_a_slow_spell_is_re_probed(tmp_path):
    """Leaf 1 is slow for a while, then fast again; a budget that fits it only when fast runs it again."""
    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2), classes=4)
    m = read_manifest(b)
    slow = {"on": False}
    backend = FakeBackend(m.tree, m.num_classes, lambda node, batch: 0.004 if slow["on"] and node == "b2.1" else 0.001)
    runner = AnytimeRunner(b, backend=backend, load_profile=False, warmup=0)
    for _ in range(20):
        runner.run(frame())
    slow["on"] = True
    for _ in range(60):  # leaf 1 (one node) takes 4 ms: learned
        runner.run(frame())
    slow["on"] = False
    probe_after = runner.cost.probe_after
    leaves = [runner.run(frame(), budget_ms=5.5).leaves for _ in range(probe_after + 30)]
    assert leaves[0] == 1  # leaf 0 takes 3 ms; leaf 1 is still predicted at about 4 ms
    assert 2 in leaves, "leaf 1 was never tried again"
    first = leaves.index(2)
    assert first <= probe_after + 16 + 2, first  # stale leaves are looked for every 16 frames
    assert leaves[first:] == [2] * (len(leaves) - first)  # re-learned: it keeps running


# -- saved profiles are validated like the manifest (issue 13, D8) -------------------------------------------


@pytest.fixture
def profiled(tmp_path):
    """A 4-leaf fake bundle with a saved profile (1 ms per node), and a function that opens a runner on it."""
    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2), classes=4)
    m = read_manifest(b)

    def open_runner():
        return AnytimeRunner(b, backend=FakeBackend(m.tree, m.num_classes), warmup=0)

    open_runner().profile(warmup=0, repeats=5)
    return b, b / "profiles" / "cpu-fake-segments-fp32.json", open_runner


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set_leaf0(key, value):
    def change(d):
        d["batch_sizes"]["1"]["leaves"][0][key] = value

    return change


@pytest.mark.parametrize(
    "change, match",
    [
        (_set_leaf0("median_ms", 0), r"batch_sizes\['1'\].leaves\[0\].median_ms must be a positive finite number; received 0"),
        (_set_leaf0("median_ms", float("nan")), r"NaN is not a JSON number; expected finite numbers only"),  # strict JSON, as the manifest
        (_set_leaf0("median_ms", "3"), r"leaves\[0\].median_ms must be a positive finite number; received '3'"),
        (_set_leaf0("samples_ms", [1.0, -2.0]), r"leaves\[0\].samples_ms\[1\] must be a finite number >= 0; received -2.0"),
        (lambda d: d["batch_sizes"].update({"0": d["batch_sizes"]["1"]}), r"batch_sizes key '0' must be a positive int"),
        (lambda d: d["batch_sizes"].update({"x": 1}), r"batch_sizes key 'x' must be a positive int"),
        (lambda d: d["batch_sizes"]["1"].update({"leaves": "x"}), r"batch_sizes\['1'\].leaves must be a non-empty list; received 'x'"),
        (lambda d: d["batch_sizes"]["1"].update({"leaves": []}), r"batch_sizes\['1'\].leaves must be a non-empty list; received \[\]"),
        (lambda d: d.update({"batch_sizes": []}), r"batch_sizes must be a non-empty object; received \[\]"),
        (lambda d: d.update({"batch_sizes": {}}), r"batch_sizes must be a non-empty object; received \{\}"),
        (lambda d: d.update({"version": 99}), r"version must be 1; received 99"),
        (lambda d: d.pop("backend"), r"is missing key\(s\) \['backend'\]"),
        (lambda d: d.update({"device": 5}), r"device must be str; received 5"),
        (lambda d: d["batch_sizes"]["1"]["leaves"].append(d["batch_sizes"]["1"]["leaves"][0]), r"has 5 leaves; expected 4"),
    ],
)
def test_an_invalid_profile_is_ignored_with_a_warning(profiled, change, match):
    b, path, open_runner = profiled
    _edit(path, change)
    with pytest.warns(UserWarning, match=match) as caught:
        runner = open_runner()
    assert str(path) in str(caught[0].message)
    assert runner.profile_data is None and "ignored" in runner.profile_status
    r = runner.run(frame()[:, :, :4, :4], budget_ms=100)  # works as without a profile (budgets are honoured)
    assert r.leaves == 4 and r.met_budget


def test_a_profile_that_is_not_json_is_ignored_with_a_warning(profiled):
    b, path, open_runner = profiled
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="not valid JSON"):
        assert open_runner().profile_data is None


def test_a_profile_with_a_key_twice_or_a_batch_size_the_bundle_does_not_run_is_ignored_with_a_warning(profiled):
    """Both were accepted: JSON's last duplicate won unseen, and a batch-4096 entry was read for a bundle whose
    batch range ends at 8 (a size no frame of it can have)."""
    b, path, open_runner = profiled
    good = path.read_text()
    path.write_text(good.replace('"backend": "fake"', '"backend": "fake", "backend": "fake"', 1))
    with pytest.warns(UserWarning, match=r"ignoring saved profile .*: duplicate key 'backend'"):
        assert open_runner().profile_data is None
    path.write_text(good)
    _edit(path, lambda d: d["batch_sizes"].update({"4096": d["batch_sizes"]["1"]}))
    with pytest.warns(UserWarning, match=r"batch_sizes key '4096' must be a batch size in the bundle's range 1\.\.8"):
        assert open_runner().profile_data is None


def test_a_profile_of_another_version_of_the_bundle_is_dropped_with_one_warning(profiled):
    """It was dropped without a word (the runner then predicted from MACs, its status alone saying why)."""
    b, path, open_runner = profiled
    _edit(path, lambda d: d.update({"manifest_sha256": "0" * 64}))
    with pytest.warns(UserWarning) as caught:
        runner = open_runner()
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and str(path) in said[0] and "another version of this bundle" in said[0], said
    assert "manifest sha256 000000000000" in said[0] and runner.manifest_sha256[:12] in said[0], said
    assert runner.profile_data is None and "another version" in runner.profile_status
    with warnings.catch_warnings():  # said once: the next runner on the same bundle (bench-streams opens many) is quiet
        warnings.simplefilter("error")
        assert open_runner().profile_data is None


class Tuned(FakeBackend):
    """The fake backend with an option that changes what a step costs (as bfloat16 or threads do on real ones)."""

    def __init__(self, tree, classes, fast: bool = False):
        super().__init__(tree, classes)
        self.fast = fast

    def timing_options(self):
        return {"fast": self.fast}

    def describe(self):
        return {**super().describe(), "fast": self.fast}


def test_a_profile_measured_with_other_backend_options_is_neither_loaded_nor_overwritten(tmp_path):
    """A profile measured with torch's bfloat16=True was loaded without a word by a runner computing fp32 (the
    name and the match ignored the backend's options), and either setup's profile overwrote the other's."""
    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2), classes=4)
    m = read_manifest(b)

    def open_runner(**options):
        return AnytimeRunner(b, backend=Tuned(m.tree, m.num_classes, **options), warmup=0)

    open_runner().profile(warmup=0, repeats=3)
    open_runner(fast=True).profile(warmup=0, repeats=3)
    default = b / "profiles" / "cpu-fake-segments-fp32.json"  # the default setup's name, as the docs give it
    (other,) = [p for p in (b / "profiles").iterdir() if p != default]
    assert default.is_file() and other.name.startswith("cpu-fake-segments-fp32-")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_runner(fast=True).profile_data.backend_info["fast"] is True
        assert open_runner().profile_data.backend_info["fast"] is False
    shutil.copyfile(other, default)  # as an older version named it: the same name for both
    with pytest.warns(UserWarning, match=rf"ignoring saved profile {default}: it was measured with fast=True, not False"
                      ):  # fmt: skip
        runner = open_runner()
    assert runner.profile_data is None and "fast=True" in runner.profile_status


def test_a_valid_profile_loads_without_warning(profiled):
    b, path, open_runner = profiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = open_runner()
    assert runner.profile_status.startswith("loaded")
    np.testing.assert_allclose(runner.predicted_ms(1), [3, 1, 2, 1])


def test_profiles_symlinked_out_of_the_bundle_are_neither_read_nor_written(profiled, tmp_path, monkeypatch):
    b, path, open_runner = profiled
    monkeypatch.setenv("HNE_EDGE_CACHE", str(tmp_path / "cache"))
    outside = tmp_path / "outside"
    (b / "profiles").rename(outside)
    (b / "profiles").symlink_to(outside, target_is_directory=True)
    with pytest.warns(UserWarning, match="outside the bundle"):
        runner = open_runner()
    assert runner.profile_data is None  # not read through the link
    before = sorted(p.name for p in outside.iterdir())
    with pytest.warns(UserWarning, match="outside the bundle"):
        runner.profile(warmup=0, repeats=2)
    assert sorted(p.name for p in outside.iterdir()) == before  # nothing written through the link
    assert str(runner.profile_path).startswith(str(tmp_path / "cache"))
    # a link to one file outside is refused the same way
    (b / "profiles").unlink()
    (b / "profiles").mkdir()
    (b / "profiles" / path.name).symlink_to(outside / path.name)
    with pytest.warns(UserWarning, match="outside the bundle"):
        assert open_runner().profile_path != b / "profiles" / path.name


def test_a_profile_measured_after_its_bundle_was_removed_or_replaced_goes_to_the_cache_not_to_that_path(
    profiled, tmp_path, monkeypatch
):
    """The runner's bundle removed (its folder is not re-created) or another bundle put at its path (the new one
    is not given the old one's profile): the profile goes to the user cache, with a warning saying why."""
    b, path, open_runner = profiled
    monkeypatch.setenv("HNE_EDGE_CACHE", str(tmp_path / "cache"))
    runner = open_runner()
    shutil.rmtree(b)
    with pytest.warns(UserWarning, match="manifest.json is gone.*saved the profile to"):
        runner.profile(warmup=0, repeats=2)
    assert not b.exists() and str(runner.profile_path).startswith(str(tmp_path / "cache"))
    m = read_manifest(make_fake_bundle(b, branching=(1, 2, 2), classes=4))
    runner = AnytimeRunner(b, backend=FakeBackend(m.tree, m.num_classes), warmup=0)
    _edit(b / "manifest.json", lambda d: d.update(model_name="another"))  # another bundle now at the path
    with pytest.warns(UserWarning, match="manifest.json is another bundle's.*saved the profile to"):
        runner.profile(warmup=0, repeats=2)
    assert not (b / "profiles").exists()


def test_of_the_bundles_profile_and_the_caches_the_one_measured_last_is_used(profiled, tmp_path, monkeypatch):
    """A read-only bundle's stale profile (5x too fast) hid the fresh one ``hne-edge profile`` saved to the user
    cache: every runner read the bundle's first, so profiling again, as the runtime advises, changed nothing."""
    b, path, open_runner = profiled
    monkeypatch.setenv("HNE_EDGE_CACHE", str(tmp_path / "cache"))

    def stale(d):
        d["created"] = "2020-01-01T00:00:00+0000"
        for leaf in (leaf for entry in d["batch_sizes"].values() for leaf in entry["leaves"]):
            leaf.update({k: v * 0.2 for k, v in leaf.items() if k.endswith("_ms") and k != "samples_ms"})
            leaf["samples_ms"] = [v * 0.2 for v in leaf["samples_ms"]]

    _edit(path, stale)
    np.testing.assert_allclose(open_runner().predicted_ms(1), [0.6, 0.2, 0.4, 0.2])
    real = profile_file.atomic_write_json
    monkeypatch.setattr(profile_file, "atomic_write_json",  # the bundle cannot be written: the cache gets it
                        lambda p, data: _refuse(p) if str(p).startswith(str(b)) else real(p, data))
    with pytest.warns(UserWarning, match="not writable"):
        open_runner().profile(warmup=0, repeats=5)
    runner = open_runner()
    assert str(runner.profile_path).startswith(str(tmp_path / "cache")), runner.profile_status
    np.testing.assert_allclose(runner.predicted_ms(1), [3, 1, 2, 1])
    _edit(runner.profile_path, lambda d: d.update(created="2019-06-01T00:00:00+0000"))  # the bundle's is newer
    assert open_runner().profile_path == path


def _refuse(path):
    raise PermissionError(13, "Permission denied", str(path))


def test_a_leaf_timed_at_zero_seconds_does_not_break_the_model():
    """A coarse or virtual clock can time a fast leaf at 0 s; later observations divide by that base."""
    import math

    from hne_edge.runtime.cost_model import CostModel

    cm = CostModel([100, 200, 200, 400])
    model = cm.for_batch(1)
    for _ in range(3):  # first sight, then the hot path (observed / base)
        for leaf in range(4):
            model.observe(leaf, 0.0)
    model.observe(2, 1e-4)
    assert all(math.isfinite(p) and p >= 0 for p in cm.predict(1))


def test_cost_model_options_out_of_range_are_input_errors():
    from hne_edge.errors import InputError
    from hne_edge.runtime.cost_model import CostModel

    with pytest.raises(InputError, match=r"quantile: received 1.5; expected a number in \[0.5, 1\)"):
        CostModel([1, 2], quantile=1.5)


def test_a_warning_names_an_in_memory_profile_as_one_not_as_a_file(tmp_path):
    """Issue 42: `bench-streams` measures its profile without saving it (``profile(save=False)``), and the cost
    model's warnings named it "saved profile cpu-onnxruntime-segments-fp32.json", a file that does not exist."""
    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2, 2), classes=4)  # leaves 1, 3, 5, 7: one node each
    m = read_manifest(b)

    def open_runner():
        return AnytimeRunner(b, backend=FakeBackend(m.tree, m.num_classes), load_profile=False, warmup=0)

    def doubtful_warning(profile) -> str:
        leaf = profile.batches[1]["leaves"][3]  # 1000x its peers: the cost model says so when it loads the profile
        leaf["median_ms"] *= 1000
        leaf["samples_ms"] = [t * 1000 for t in leaf["samples_ms"]]
        runner = open_runner()
        runner.use_profile(profile)
        with pytest.warns(UserWarning, match="more than 10 times off") as caught:
            runner.predicted_ms(1)
        return str(caught[0].message)

    message = doubtful_warning(open_runner().profile(warmup=0, repeats=3, save=False))
    assert not (b / "profiles").exists()
    assert message.startswith("in-memory profile (measured here, in no file) (batch 1)") and ".json" not in message, message
    saved = open_runner()
    message = doubtful_warning(saved.profile(warmup=0, repeats=3))
    assert message.startswith(f"saved profile {saved.profile_path} (batch 1)"), message


@pytest.mark.parametrize("own, said", [(3.0, "3 times slower"), (0.5, "2 times faster")])
def test_a_relearned_entry_is_said_in_one_unit(tmp_path, own, said):
    """A step's cost re-learned from calls in a row is said as the measurement and the entry at the machine's pace
    now. On a machine running 2x slow the message gave the measurement at that pace and the ratio at full speed
    ("0.104 ms ... 0.717 times slower than its entry (0.0779 ms)"), and "slower" for a step faster than its entry."""
    import re

    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2, 2), classes=4)
    m = read_manifest(b)
    runner = AnytimeRunner(b, backend=FakeBackend(m.tree, m.num_classes), load_profile=False, warmup=0)
    runner.use_profile(runner.profile(warmup=0, repeats=3, save=False))
    model = runner.cost.for_batch(1)
    model.speed.slow = 2.0
    entry = model.loaded[2]
    model._relearn(2, own * entry, [], 3)
    message = model.unconfirmed[2]
    here, ratio, shown = (float(x) for x in re.search(r"measured (\S+) ms here 3 times in a row, (\S+) times \w+ than "
                                                      r"its entry \((\S+) ms\)", message).groups())  # fmt: skip
    assert said in message, message
    assert here == pytest.approx(own * entry * 2e3, rel=1e-2) and shown == pytest.approx(entry * 2e3, rel=1e-2)
    assert ratio == pytest.approx(max(here / shown, shown / here), rel=1e-2), message


def test_a_step_relearned_at_a_batch_its_profile_does_not_hold_is_learned_without_a_message(tmp_path):
    """A profile measured at batch 1 only (what `hne-edge demo` writes) and a runner at batch 16 (`bench --frames`'
    accuracy pass): that batch has no entries (0.0 each), and a step slow several calls in a row divided by its entry
    in the re-learn message - a ZeroDivisionError out of the cost model, on a busy machine."""
    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2, 2), classes=4)
    m = read_manifest(b)
    runner = AnytimeRunner(b, backend=FakeBackend(m.tree, m.num_classes), load_profile=False, warmup=0)
    runner.use_profile(runner.profile(batch_sizes=(1,), warmup=0, repeats=3, save=False))
    model = runner.cost.for_batch(2)
    assert model.loaded == [0.0] * len(model.loaded)  # no entry at this batch
    for _ in range(40):  # steady costs first
        for leaf in range(len(model.steady)):
            model.observe(leaf, 1e-3)
    for _ in range(30):  # then one step 50x as slow, call after call: its cost now
        model.observe(5, 50e-3)
        model.observe(0, 1e-3)
    assert model.steady[5] > 10e-3 and 5 not in model.unconfirmed


def test_a_steps_median_under_a_slowdown_is_what_its_calls_take_now():
    """``median_step`` is a step's steady cost at the machine's current speed: eight 1 ms steps, then the machine 4x
    slower (every call 4 ms), then at full speed again. It said 16 ms while the calls took 4 ms (the slowdown
    counted twice)."""
    from hne_edge.runtime.cost_model import CostModel

    t = [0.0]
    steps = range(8)
    cm = CostModel([100 for _ in steps], clock=lambda: t[0])

    def calls(seconds, frames):
        for _ in range(frames):
            model = cm.for_batch(1)
            for s in steps:
                model.observe(s, seconds)
            t[0] += 0.01

    calls(1e-3, 40)
    assert cm.median_step(0, 1) == pytest.approx(1e-3, rel=0.05)
    calls(4e-3, 200)
    assert cm.speed.slow == pytest.approx(4.0, rel=0.05)
    assert [cm.median_step(s, 1) for s in steps] == pytest.approx([4e-3] * 8, rel=0.05)
    calls(1e-3, 200)
    assert [cm.median_step(s, 1) for s in steps] == pytest.approx([1e-3] * 8, rel=0.05)
