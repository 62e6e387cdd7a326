"""Runtime performance targets (issue 5): scheduler overhead, first leaf, all leaves, deadlines.

    .venv/bin/python benchmarks/bench_runtime.py --out benchmarks/results/runtime.md

hne_resnet_small (randomized weights: latency does not depend on their
values), ONNX Runtime CPU, batch 1 and 16. Every ratio is measured side by
side in one process with the calls interleaved, and reported as a ratio of
medians. Baselines:

* bare loop: the same 16 segment sessions called directly (``sess.run`` with
  a dict of cached activations), no scheduler;
* standalone network: ``export_standalone_network(model, leaf=0)`` - one
  ONNX file root -> leaf 0, image -> logits;
* first leaf: ``run(x, max_leaves=1)``, which runs the bundle's export-free
  first-leaf file; also measured with ``first_leaf=False`` (leaf 0 via its
  exporting segment) to show what that file buys;
* 16 independent networks: that standalone network run 16 times (every path
  has the same architecture, so 16 independently trained networks cost the
  same per call);
* deadline oracle (plan segments: one leaf per step, so the plan-achievable
  oracle and the even-split bound agree): per frame, knows each step's true
  time (the budgeted run's own, and for the steps it did not run, their times
  from ``runner.time_steps`` right after, which does not feed the cost model
  under test) and fits as many leaves as their cumulative time allows
  (``program.best_leaves``).

``--load-seconds S`` adds deadline frames under artificial CPU load: one
busy-loop process per core (each ends by itself after S seconds, and is
killed when the loaded frames are done), at normal priority (``--realtime``
is dropped for them), budget 2x the full tree measured under that load.

Every deadline row compares this package's cost model with the one before
issue 15 (``benchmarks/cost_model_v1.py``), frame by frame on the same
budgets, each model learning only from the leaves its own budget let run.

``--realtime`` runs the process under SCHED_FIFO (what a deployed real-time
inference process gets); Linux throttles real-time tasks that use more than
95% of a second, so deadline frames are separated by an idle gap
(``--frame-gap``), as periodic camera frames would be.

**Plans (issue 21)** - ``--plans`` (per model of ``--models``: hne_resnet_small,
hne_mobilenetv2; a bundle with plans segments, subtrees and fused): the full
tree through each plan against the fused one-call model (a runner of plan
"fused"), all four interleaved in rotation, medians; 16 independent networks
(the standalone network 16 times) / the full tree via subtrees and via mixed
against the MAC ratio; the mixed runner's first leaf against the standalone
network; each subtree unit against its leaves one by one (the mixed runner's
own profile: what its choice reads); and deadlines with the mixed runner
after its profile, budgets uniform between the first leaf and the full tree
leaf by leaf, against plan segments on the same frames and budgets. Oracles
(``program.best_leaves``, through ``hne_edge.runtime.bench.frame_oracles``)
know every step's time in the frame (the run's own, the others from
``runner.time_steps`` right after) and pay the run's upload: leaf by leaf
(the deadline rows above), the plan-achievable one over every schedule of
the mixed program (whole subtrees and the whole tree included), and the
even-split upper bound (a step's time spread over its leaves; issue 26).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def med(a):
    return float(np.median(a))


def export(workdir: Path, batch_max: int, name: str = "hne_resnet_small", plan: str = "segments"):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import randomize_

    from hne_edge.exporters import export_onnx, export_standalone_network
    from hne_edge.models import create_model

    torch.manual_seed(0)
    model = randomize_(create_model(name))
    bundle = workdir / f"{name}_{plan.replace(',', '+')}_b{batch_max}"
    if not (bundle / "manifest.json").exists():
        export_onnx(model, bundle, plan=plan, batch=(1, 1, batch_max), torch_weights=False, verify=False, force=True)
    standalone = workdir / f"{name}_standalone_leaf0.onnx"
    if not standalone.exists():
        export_standalone_network(model, 0, standalone, verify=False)
    return bundle, standalone


def ort_session(path, threads):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.inter_op_num_threads = 1
    o.intra_op_num_threads = threads
    o.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=o, providers=["CPUExecutionProvider"])


def bare_loop_fn(runner):
    """The same sessions the runner holds, called directly: the minimal depth-first loop."""
    tree = runner.tree
    runs = []
    for r, seg in zip(runner._runners, tree.segments):
        names = [o.name for o in r.unit.outputs]
        runs.append((r.session.run, names, r.unit.inputs[0].name, seg.input, seg.exports))

    def loop(x):
        cache = {None: x}
        logits = []
        for run, names, in_name, src, exports in runs:
            outs = run(names, {in_name: cache[src]})
            for node, o in zip(exports, outs):
                cache[node] = o
            logits.append(outs[-1])
        return np.mean(logits, axis=0)

    return loop


def timed(fn, *args):
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def bench_batch(runner, standalone, batch, repeats, frames, rng, frame_gap=0.2, runner_no_first=None, load_seconds=0,
                load_frames=300, max_ratios=()):
    spec = runner.input_spec
    x = rng.standard_normal((batch, spec.channels, *spec.spatial)).astype(np.float32)
    N = runner.num_leaves
    bare = bare_loop_fn(runner)
    single = lambda: standalone.run(["logits"], {"image": x})  # noqa: E731
    sixteen = lambda: [standalone.run(["logits"], {"image": x}) for _ in range(N)]  # noqa: E731
    for _ in range(3):
        runner.run(x), bare(x), single(), sixteen()
    t = {k: [] for k in ("run_all", "bare_all", "run_first", "single", "sixteen", "run_all_2", "run_first_segment", "single_2")}

    def paired(a, fa, b, fb):
        """Alternate the two calls (ABBA) so each follows the same work: fair caches and load."""
        for k in range(repeats):
            for name, fn in ((a, fa), (b, fb)) if k % 2 == 0 else ((b, fb), (a, fa)):
                t[name].append(timed(fn))

    paired("run_all", lambda: runner.run(x).logits, "bare_all", lambda: bare(x))
    paired("run_first", lambda: runner.run(x, max_leaves=1).logits, "single", single)
    paired("run_all_2", lambda: runner.run(x).logits, "sixteen", sixteen)
    if runner_no_first is not None:  # what the export-free first-leaf file buys: leaf 0 via its exporting segment
        runner_no_first.run(x, max_leaves=1)
        paired("run_first_segment", lambda: runner_no_first.run(x, max_leaves=1).logits, "single_2", single)
    m = {k: med(v) * 1e3 for k, v in t.items() if v}
    macs = runner.manifest.prefix_macs()
    path_macs = sum(runner.manifest.node_macs[n] for n in runner.tree.path(0))
    mac_ratio = N * path_macs / macs[-1]

    # deadlines: profile, then frames with budgets uniform in [first leaf, full tree], this cost model vs the
    # pre-issue-15 one (cost_model_v1.py) frame by frame on the same budgets
    runner.profile(batch_sizes=(batch,), warmup=5, repeats=30, save=False)
    lo, hi = m["run_first"], m["run_all"]
    gap = frame_gap * hi / 1e3  # frames arrive periodically, not back to back
    budgets = rng.uniform(lo, hi, frames)
    quiet = deadline_frames(runner, x, fresh_models(runner, max_ratios), budgets, gap)
    loaded = None
    if load_seconds:
        with normal_priority(), cpu_load(os.cpu_count(), load_seconds) as still_loaded:  # the loops must not inherit SCHED_FIFO
            models = fresh_models(runner, max_ratios)
            full = med([timed(runner.run, x) for _ in range(30)]) * 1e3  # the full tree under this load
            loaded = {"full_ms": full, "budget_ms": 2 * full, "processes": os.cpu_count()}
            loaded.update(deadline_frames(runner, x, models, [2 * full] * load_frames, gap))
            loaded["load_ended_early"] = not still_loaded()  # then raise --load-seconds
    return {
        "batch": batch,
        "ms": m,
        "overhead_ratio": m["run_all"] / m["bare_all"],
        "first_ratio": m["run_first"] / m["single"],
        "first_segment_ratio": m["run_first_segment"] / m["single_2"] if "single_2" in m else None,
        "speedup": m["sixteen"] / m["run_all_2"],
        "mac_ratio": mac_ratio,
        "frames": frames,
        "budget_range_ms": (lo, hi),
        "deadlines": quiet,
        "loaded": loaded,
    }


def fresh_models(runner, max_ratios=()):
    """This package's cost model (also with other ``max_ratio`` caps) and the pre-issue-15 one, from the runner's profile."""
    from cost_model_v1 import LegacyCostModel

    from hne_edge.runtime import CostModel

    q, macs, prof = runner.quantile, runner.step_macs, runner.profile_data
    models = {"new": CostModel(macs, prof, quantile=q)}
    models.update({f"max_ratio={r:g}": CostModel(macs, prof, quantile=q, max_ratio=r) for r in max_ratios})
    models["v1"] = LegacyCostModel(macs, prof, quantile=q)
    return models


def model_label(name):
    return {"new": "this cost model", "v1": "pre-issue-15 cost model (cost_model_v1.py)"}.get(name, f"this cost model, {name}")


def deadline_frames(runner, x, models, budgets, gap):
    """Each frame under each cost model (order alternating), then the plan-achievable oracle of that frame.

    The oracle knows each step's true time (``hne_edge.runtime.bench.frame_oracles``): the budgeted run's own
    steps, the others timed right after by ``runner.time_steps`` (unseen by any cost model, so the model under
    test learns only from the leaves its own budget let it run, as in deployment), and pays the run's upload.
    """
    from hne_edge.runtime.bench import frame_oracles

    stats = {k: {"misses": 0, "forced": 0, "leaves": 0, "oracle": 0} for k in models}
    names = list(models)
    for k, budget in enumerate(budgets):
        for name in names if k % 2 == 0 else names[::-1]:
            st = stats[name]
            time.sleep(gap)
            runner.cost = models[name]
            r = runner.run(x, budget_ms=float(budget))
            st["oracle"] += frame_oracles(runner, x, r, float(budget))["oracle"]  # time_steps: unseen by the model
            st["leaves"] += r.leaves
            st["forced"] += r.overran_min_leaves
            st["misses"] += (not r.met_budget) and not r.overran_min_leaves
    runner.cost = models[names[0]]
    for st in stats.values():
        st["miss_rate"] = st["misses"] / len(budgets)
        st["leaves_vs_oracle"] = st["leaves"] / st["oracle"]
        st["mean_leaves"] = st["leaves"] / len(budgets)
    return stats


def rotation(fns: dict, repeats: int) -> dict[str, float]:
    """Medians (ms) of several calls run in rotation, the order shifted each repeat (each follows every other alike)."""
    names, t = list(fns), {k: [] for k in fns}
    for k in range(repeats):
        for name in names[k % len(names):] + names[: k % len(names)]:
            t[name].append(timed(fns[name]))
    return {k: med(v) * 1e3 for k, v in t.items()}


def bench_plans(runners, standalone, batch, repeats, frames, rng, frame_gap=0.2):
    """Issue 21's rows for one model and batch size (see the module docstring). ``runners``: plan -> AnytimeRunner."""
    from hne_edge.runtime.bench import frame_oracles

    mixed, segments = runners["mixed"], runners["segments"]
    spec = mixed.input_spec
    x = rng.standard_normal((batch, spec.channels, *spec.spatial)).astype(np.float32)
    N = mixed.num_leaves
    single = lambda: standalone.run(["logits"], {"image": x})  # noqa: E731
    for r in runners.values():
        r.run(x)
    # the mixed runner's own measurements: every step (what its choice reads)
    prof = mixed.profile(batch_sizes=(batch,), warmup=3, repeats=max(10, repeats // 2), save=False)
    step_ms = [leaf["median_ms"] for leaf in prof.batches[batch]["leaves"]]
    units = [{"leaves": s["leaves"], "ms": step_ms[j], "leaf_by_leaf_ms": sum(step_ms[s["leaves"][0]: s["leaves"][1]])}
             for j, s in enumerate(mixed.steps) if s["kind"] != "leaf"]  # fmt: skip
    m = rotation({p: (lambda r=r: r.run(x).logits) for p, r in runners.items()}, repeats)
    first, single_ms = (v for v in rotation({"first": lambda: mixed.run(x, max_leaves=1).logits, "single": single},
                                            repeats).values())  # fmt: skip
    sixteen = lambda: [single() for _ in range(N)]  # noqa: E731
    r16 = max(3, repeats // 4)
    indep = rotation({"sixteen": sixteen, "subtrees": lambda: runners["subtrees"].run(x).logits,
                      "mixed": lambda: mixed.run(x).logits}, r16)  # fmt: skip
    macs = mixed.manifest.prefix_macs()
    mac_ratio = N * sum(mixed.manifest.node_macs[n] for n in mixed.tree.path(0)) / macs[-1]
    row = {
        "batch": batch, "ms": m, "units": units, "first_ms": first, "single_ms": single_ms, "indep_ms": indep,
        "mac_ratio": mac_ratio, "mixed_full_steps": [(lo, hi) for lo, hi, _ in mixed.run(x).step_ms],
    }  # fmt: skip
    # deadlines: the mixed runner (profiled above) and plan segments (profiled too) on the same frames and budgets
    if frames:
        segments.profile(batch_sizes=(batch,), warmup=3, repeats=max(10, repeats // 2), save=False)
        lo, hi = first, m["segments"]
        gap = frame_gap * hi / 1e3
        st = {k: {"misses": 0, "leaves": 0} for k in ("mixed", "segments")}
        oracle_leaf = oracle_all = split_bound = big = 0
        for k, budget in enumerate(rng.uniform(lo, hi, frames)):
            for name in ("mixed", "segments") if k % 2 == 0 else ("segments", "mixed"):
                time.sleep(gap)
                r = runners[name].run(x, budget_ms=float(budget))
                st[name]["leaves"] += r.leaves
                st[name]["misses"] += (not r.met_budget) and not r.overran_min_leaves
                if name == "mixed":
                    big += any(b - a > 1 for a, b, _ in r.step_ms)
                    o = frame_oracles(mixed, x, r, float(budget))  # the frame's step times: the run's own, time_steps'
                    oracle_leaf += o["leaf_by_leaf"]
                    oracle_all += o["oracle"]
                    split_bound += o["split_bound"]
        row["deadlines"] = {
            "budget_range_ms": (lo, hi), "frames": frames, "mixed_frames_with_big_steps": big / frames,
            **{f"{k}_{f}": v[f] / frames for k, v in st.items() for f in ("misses", "leaves")},
            "mixed_vs_leaf_oracle": st["mixed"]["leaves"] / oracle_leaf, "mixed_vs_all_oracle": st["mixed"]["leaves"] / oracle_all,
            "segments_vs_leaf_oracle": st["segments"]["leaves"] / oracle_leaf, "mixed_vs_split_bound": st["mixed"]["leaves"] / split_bound,
        }  # fmt: skip
    return row


def plans_table(model, rows, args) -> list[str]:
    lines = [
        f"### {model}: plans (issue 21)",
        "",
        "| batch | target | measured | |",
        "|---|---|---|---|",
    ]
    for r in rows:
        m, b = r["ms"], r["batch"]
        ok = lambda c: "ok" if c else "MISSED"  # noqa: E731
        for plan in ("subtrees", "mixed", "segments"):
            ratio = m[plan] / m["fused"]
            target = "<= 1.05" if plan != "segments" else "(reference)"
            lines.append(f"| {b} | full tree via {plan} / fused one call {target} | {ratio:.3f} ({m[plan]:.3f} vs {m['fused']:.3f} ms) | "
                         f"{ok(ratio <= 1.05) if plan != 'segments' else ''} |")  # fmt: skip
        lines.append(f"| {b} | (mixed, unbudgeted full run takes) | {' + '.join(f'{lo}-{hi - 1}' if hi - lo > 1 else str(lo) for lo, hi in r['mixed_full_steps'])} | |")
        for plan in ("subtrees", "mixed"):
            sp = r["indep_ms"]["sixteen"] / r["indep_ms"][plan]
            lines.append(f"| {b} | 16 independent / HNE via {plan} >= 0.9 x MAC ratio ({r['mac_ratio']:.2f}) | {sp:.2f} = "
                         f"{sp / r['mac_ratio']:.2f} x MAC ratio ({r['indep_ms']['sixteen']:.2f} vs {r['indep_ms'][plan]:.2f} ms) | "
                         f"{ok(sp >= 0.9 * r['mac_ratio'])} |")  # fmt: skip
        fr = r["first_ms"] / r["single_ms"]
        lines.append(f"| {b} | first leaf (mixed) / standalone network <= 1.05 | {fr:.3f} ({r['first_ms']:.3f} vs {r['single_ms']:.3f} ms) | {ok(fr <= 1.05)} |")
        for u in r["units"]:
            lo, hi = u["leaves"]
            q = u["ms"] / u["leaf_by_leaf_ms"]
            lines.append(f"| {b} | {'whole tree' if hi - lo == r['mixed_full_steps'][-1][1] and lo == 0 else f'subtree of leaves {lo}-{hi - 1}'} "
                         f"in one call / its leaves one by one (profile) | {q:.3f} ({u['ms']:.3f} vs {u['leaf_by_leaf_ms']:.3f} ms) | "
                         f"{'faster' if q < 1 else 'SLOWER (taken only if the running medians say otherwise)'} |")  # fmt: skip
        d = r.get("deadlines")
        if d:
            lo, hi = d["budget_range_ms"]
            lines += [
                f"| {b} | mixed: budget misses <= 1% (budgets U[{lo:.2f}, {hi:.2f}] ms, {d['frames']} frames) | {100 * d['mixed_misses']:.2f}% "
                f"(segments on the same budgets: {100 * d['segments_misses']:.2f}%) | {ok(d['mixed_misses'] <= 0.01)} |",
                f"| {b} | mixed: leaves >= 95% of the leaf-by-leaf oracle | {100 * d['mixed_vs_leaf_oracle']:.1f}% (mean {d['mixed_leaves']:.2f} leaves; "
                f"segments {d['segments_leaves']:.2f} = {100 * d['segments_vs_leaf_oracle']:.1f}%) | {ok(d['mixed_vs_leaf_oracle'] >= 0.95)} |",
                f"| {b} | mixed: leaves vs the plan-achievable oracle (any sequence of its steps: whole subtrees, whole tree) | {100 * d['mixed_vs_all_oracle']:.1f}% "
                f"({100 * d['mixed_frames_with_big_steps']:.0f}% of frames took a whole subtree or the tree) | |",
                f"| {b} | (mixed: leaves vs the even-split upper bound, which stops inside a step) | {100 * d['mixed_vs_split_bound']:.1f}% | |",
            ]  # fmt: skip
    return lines


@contextlib.contextmanager
def normal_priority():
    """Drop SCHED_FIFO (--realtime) for the loaded frames: the busy loops compete with us as equals."""
    policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    if policy is None or policy == os.SCHED_OTHER:
        yield
        return
    param = os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


@contextlib.contextmanager
def cpu_load(processes, seconds):
    """``processes`` busy loops (one per core), each ending by itself after ``seconds``; killed on exit."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(processes)]
    try:
        time.sleep(0.5)  # let them start
        yield lambda: all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "hne_bench_runtime"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--nice", type=int, default=0, help="os.nice() increment for this process (e.g. -10: priority over background jobs, as a deployed real-time process would have)")
    ap.add_argument("--realtime", action="store_true", help="run under SCHED_FIFO priority 1 (Linux, root), as a deployed real-time process would; single-threaded, so other jobs keep the other cores")
    ap.add_argument("--frame-gap", type=float, default=0.2, help="idle time between deadline frames, as a fraction of the full-tree latency (frames arrive periodically)")
    ap.add_argument("--quantile", type=float, default=0.99, help="cost model prediction quantile")
    ap.add_argument("--load-seconds", type=float, default=0, help="also run deadline frames under artificial CPU load: one busy-loop process per core, each ending after this many seconds (0: no loaded rows)")
    ap.add_argument("--load-frames", type=int, default=300, help="deadline frames per cost model under load (budget 2x the full tree measured under that load)")
    ap.add_argument("--max-ratios", type=lambda v: tuple(float(r) for r in v.split(",") if r), default=(),
                    help="also run the deadline frames with the cost model capped at these max_ratio values (e.g. 4,8)")
    ap.add_argument("--plans", action="store_true", help="issue 21's rows instead: plans subtrees, fused and mixed per model")
    ap.add_argument("--models", default="hne_resnet_small", help="--plans: comma list (e.g. hne_resnet_small,hne_mobilenetv2)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.nice:
        os.nice(args.nice)
    if args.realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.plans:
        return main_plans(args, batches, workdir)
    bundle, standalone_path = export(workdir, max(batches))

    from hne_edge.runtime import AnytimeRunner

    rng = np.random.default_rng(0)
    standalone = ort_session(standalone_path, args.threads)
    rows = []
    with AnytimeRunner(bundle, threads=args.threads, load_profile=False, quantile=args.quantile) as runner, \
            AnytimeRunner(bundle, threads=args.threads, load_profile=False, first_leaf=False) as runner_no_first:  # fmt: skip
        assert runner.first_leaf_file is not None and runner_no_first.first_leaf_file is None
        for b in batches:
            rows.append(bench_batch(runner, standalone, b, args.repeats, args.frames, rng, args.frame_gap, runner_no_first,
                                    args.load_seconds, args.load_frames, args.max_ratios))
            print(rows[-1], flush=True)
    load = os.getloadavg()
    import onnxruntime

    lines = [
        "## Runtime (issue 5): anytime scheduler on ONNX Runtime CPU",
        "",
        f"`{' '.join(['python', 'benchmarks/bench_runtime.py'] + sys.argv[1:])}` - hne_resnet_small (16 leaves), plan segments, "
        f"fp32, onnxruntime {onnxruntime.__version__}, intra-op threads {args.threads}, cost-model quantile {args.quantile}, nice {os.nice(0)}{', SCHED_FIFO' if args.realtime else ''}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs shared with other jobs (load average {load[0]:.1f} at the end), "
        f"{args.repeats} interleaved repeats (medians), {args.frames} deadline frames per batch size (idle gap {args.frame_gap} x full-tree latency between frames).",
        "",
        "| batch | target | measured | |",
        "|---|---|---|---|",
    ]
    for r in rows:
        m = r["ms"]
        lines += [
            f"| {r['batch']} | scheduler overhead run(all)/bare loop <= 1.05 | {r['overhead_ratio']:.3f} ({m['run_all']:.2f} vs {m['bare_all']:.2f} ms) | {'ok' if r['overhead_ratio'] <= 1.05 else 'MISSED'} |",
            f"| {r['batch']} | first leaf / standalone network <= 1.10 | {r['first_ratio']:.3f} ({m['run_first']:.3f} vs {m['single']:.3f} ms) | {'ok' if r['first_ratio'] <= 1.10 else 'MISSED'} |",
            f"| {r['batch']} | (same, first_leaf=False: leaf 0 via its exporting segment) | {r['first_segment_ratio']:.3f} ({m['run_first_segment']:.3f} vs {m['single_2']:.3f} ms) | |",
            f"| {r['batch']} | 16 independent / HNE >= 0.9 x MAC ratio ({r['mac_ratio']:.2f}) | {r['speedup']:.2f} = {r['speedup'] / r['mac_ratio']:.2f} x MAC ratio ({m['sixteen']:.2f} vs {m['run_all_2']:.2f} ms) | {'ok' if r['speedup'] >= 0.9 * r['mac_ratio'] else 'MISSED'} |",
        ]
        for name, d in r["deadlines"].items():
            label = model_label(name)
            lo, hi = r["budget_range_ms"]
            lines += [
                f"| {r['batch']} | {label}: budget misses <= 1% (budgets U[{lo:.2f}, {hi:.2f}] ms) | {100 * d['miss_rate']:.2f}% (+{d['forced']} forced first-leaf overruns) | {'ok' if d['miss_rate'] <= 0.01 else 'MISSED'} |",
                f"| {r['batch']} | {label}: leaves >= 90% of oracle | {100 * d['leaves_vs_oracle']:.1f}% (mean {d['mean_leaves']:.2f} leaves) | {'ok' if d['leaves_vs_oracle'] >= 0.9 else 'MISSED'} |",
            ]
        if r["loaded"]:
            ld = r["loaded"]
            for name in r["deadlines"]:
                d, label = ld[name], model_label(name)
                lines.append(
                    f"| {r['batch']} | under load ({ld['processes']} busy loops), budget 2x full tree ({ld['budget_ms']:.2f} ms), {label}: "
                    f"leaves >= 90% of oracle | {100 * d['leaves_vs_oracle']:.1f}% (mean {d['mean_leaves']:.2f} leaves; misses "
                    f"{100 * d['miss_rate']:.1f}%){' (LOAD ENDED EARLY)' if ld['load_ended_early'] else ''} | "
                    f"{'ok' if d['leaves_vs_oracle'] >= 0.9 else 'MISSED'} |"
                )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


def main_plans(args, batches, workdir) -> None:
    import onnxruntime

    from hne_edge.runtime import AnytimeRunner

    lines = [
        "## Plans (issue 21): the tree in B + 1 calls, on ONNX Runtime CPU",
        "",
        f"`{' '.join(['python', 'benchmarks/bench_runtime.py'] + sys.argv[1:])}` - fp32, onnxruntime {onnxruntime.__version__}, "
        f"intra-op threads {args.threads}, cost-model quantile {args.quantile}{', SCHED_FIFO' if args.realtime else ''}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs shared with other jobs; {args.repeats} repeats in "
        f"rotation (medians), {args.frames} deadline frames per batch size.",
        "",
    ]
    for name in args.models.split(","):
        bundle, standalone_path = export(workdir, max(batches), name, "segments,subtrees,fused")
        standalone = ort_session(standalone_path, args.threads)
        rng = np.random.default_rng(0)
        runners = {p: AnytimeRunner(bundle, plan=p, threads=args.threads, load_profile=False, quantile=args.quantile)
                   for p in ("fused", "subtrees", "mixed", "segments")}  # fmt: skip
        rows = []
        try:
            for b in batches:
                rows.append(bench_plans(runners, standalone, b, args.repeats, args.frames, rng, args.frame_gap))
                print(rows[-1], flush=True)
        finally:
            for r in runners.values():
                r.close()
        lines += plans_table(name, rows, args) + ["", f"(load average {os.getloadavg()[0]:.1f} at the end of {name})", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
