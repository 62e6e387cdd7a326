"""How fast is anytime against one network on a CPU, how well do budgets hold, how big and how long is an export:
the runtime's targets on ONNX Runtime CPU (issues 4, 5, 15 and 21).

    .venv/bin/python benchmarks/bench_runtime.py --out benchmarks/results/runtime.md        # the targets (make bench)
    .venv/bin/python benchmarks/bench_runtime.py --plans --out benchmarks/results/plans.md  # plans subtrees, mixed
    .venv/bin/python benchmarks/bench_runtime.py --load-seconds 240 --batches 1             # deadlines under load
    .venv/bin/python benchmarks/bench_runtime.py --export --out benchmarks/results/export.md  # export time and size
    .venv/bin/python benchmarks/bench_runtime.py --smoke [--plans | --export]               # proves it runs (hne_tiny)

hne_resnet_small (``--models``; randomized weights: latency does not depend on their values), ONNX Runtime
CPU, batch 1 and 16. Every ratio is measured side by side in one process with the calls interleaved
(``harness.paired``, ``harness.rotation``), and reported as a ratio of medians. Baselines:

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

``--load-seconds S`` adds deadline frames under artificial CPU load (``harness.cpu_load``: one busy-loop process
per core, each ending by itself after S seconds, killed when the loaded frames are done), at normal priority
(``--realtime`` is dropped for them), budget 2x the full tree measured under that load, with a cost model fresh
from the quiet profile (it learns the load from the loaded frames alone).

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

**Export (issue 4)** - ``--export``: per model, every plan of ``--export-plans`` in fp32 and fp16, exported
``--export-repeats`` times (the median), each export verified against PyTorch as ``hne-edge export`` does
(every file and every anytime prefix, batch sizes ``--verify-batch``): seconds, files and bytes (the first-leaf
file included where the plan hosts it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import (ArgumentParser, LoadRecord, command_line, count, counts, cpu_load, machine, median_ms,
                     normal_priority, paired, parse_args, randomized_model, realtime, rotation, timed,
                     write_report)  # fmt: skip  (first: it puts this checkout on sys.path)

from hne_edge.bundle import EXPORT_PLANS  # noqa: E402

SMOKE = {"models": "hne_tiny", "batches": "1,2", "repeats": 3, "frames": 5, "profile_repeats": 3, "load_frames": 5,
         "export_repeats": "1", "export_plans": "segments", "verify_batch": "1"}  # fmt: skip  (--smoke: runs, measures nothing)


def export(workdir: Path, batch_max: int, name: str = "hne_resnet_small", plan: str = "segments"):
    from hne_edge.exporters import export_onnx, export_standalone_network

    model = randomized_model(name)
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


def bench_batch(runner, standalone, batch, args, rng, runner_no_first=None):
    spec = runner.input_spec
    x = rng.standard_normal((batch, spec.channels, *spec.spatial)).astype(np.float32)
    N = runner.num_leaves
    bare = bare_loop_fn(runner)
    single = lambda: standalone.run(["logits"], {"image": x})  # noqa: E731
    sixteen = lambda: [standalone.run(["logits"], {"image": x}) for _ in range(N)]  # noqa: E731
    for _ in range(3):
        runner.run(x), bare(x), single(), sixteen()
    m = {}
    m["run_all"], m["bare_all"] = paired(lambda: runner.run(x).logits, lambda: bare(x), args.repeats)
    m["run_first"], m["single"] = paired(lambda: runner.run(x, max_leaves=1).logits, single, args.repeats)
    m["run_all_2"], m["sixteen"] = paired(lambda: runner.run(x).logits, sixteen, args.repeats)
    if runner_no_first is not None:  # what the export-free first-leaf file buys: leaf 0 via its exporting segment
        runner_no_first.run(x, max_leaves=1)
        m["run_first_segment"], m["single_2"] = paired(lambda: runner_no_first.run(x, max_leaves=1).logits, single,
                                                       args.repeats)  # fmt: skip
    macs = runner.manifest.prefix_macs()
    path_macs = sum(runner.manifest.node_macs[n] for n in runner.tree.path(0))
    mac_ratio = N * path_macs / macs[-1]

    # deadlines: profile, then frames with budgets uniform in [first leaf, full tree]
    runner.profile(batch_sizes=(batch,), warmup=5, repeats=args.profile_repeats, save=False)
    lo, hi = m["run_first"], m["run_all"]
    gap = args.frame_gap * hi / 1e3  # frames arrive periodically, not back to back
    quiet = deadline_frames(runner, x, rng.uniform(lo, hi, args.frames), gap)
    loaded = None
    if args.load_seconds:
        with normal_priority(), cpu_load(os.cpu_count(), args.load_seconds) as still_loaded:  # loops must not inherit SCHED_FIFO
            runner.use_profile(runner.profile_data)  # a fresh cost model: not the one the quiet frames taught
            full = median_ms([timed(lambda: runner.run(x)) for _ in range(30)])  # the full tree under this load
            loaded = {"full_ms": full, "budget_ms": 2 * full, "processes": os.cpu_count()}
            loaded.update(deadline_frames(runner, x, [2 * full] * args.load_frames, gap))
            loaded["load_ended_early"] = not still_loaded()  # then raise --load-seconds
    return {
        "batch": batch,
        "ms": m,
        "overhead_ratio": m["run_all"] / m["bare_all"],
        "first_ratio": m["run_first"] / m["single"],
        "first_segment_ratio": m["run_first_segment"] / m["single_2"] if "single_2" in m else None,
        "speedup": m["sixteen"] / m["run_all_2"],
        "mac_ratio": mac_ratio,
        "frames": args.frames,
        "budget_range_ms": (lo, hi),
        "deadlines": quiet,
        "loaded": loaded,
    }


def deadline_frames(runner, x, budgets, gap):
    """Each frame under the runner's cost model, then the plan-achievable oracle of that frame.

    The oracle knows each step's true time (``hne_edge.runtime.bench.frame_oracles``): the budgeted run's own
    steps, the others timed right after by ``runner.time_steps`` (unseen by the cost model, so it learns only from
    the leaves its own budget let it run, as in deployment), and pays the run's upload.
    """
    from hne_edge.runtime.bench import frame_oracles

    st = {"misses": 0, "forced": 0, "leaves": 0, "oracle": 0}
    for budget in budgets:
        time.sleep(gap)
        r = runner.run(x, budget_ms=float(budget))
        st["oracle"] += frame_oracles(runner, x, r, float(budget))["oracle"]  # time_steps: unseen by the model
        st["leaves"] += r.leaves
        st["forced"] += r.overran_min_leaves
        st["misses"] += (not r.met_budget) and not r.overran_min_leaves
    st["miss_rate"] = st["misses"] / len(budgets)
    st["leaves_vs_oracle"] = st["leaves"] / st["oracle"]
    st["mean_leaves"] = st["leaves"] / len(budgets)
    return st


def bench_plans(runners, standalone, batch, args, rng):
    """Issue 21's rows for one model and batch size (see the module docstring). ``runners``: plan -> AnytimeRunner."""
    repeats, frames, frame_gap = args.repeats, args.frames, args.frame_gap
    from hne_edge.runtime.bench import frame_oracles

    mixed, segments = runners["mixed"], runners["segments"]
    spec = mixed.input_spec
    x = rng.standard_normal((batch, spec.channels, *spec.spatial)).astype(np.float32)
    N = mixed.num_leaves
    single = lambda: standalone.run(["logits"], {"image": x})  # noqa: E731
    for r in runners.values():
        r.run(x)
    # the mixed runner's own measurements: every step (what its choice reads)
    prof = mixed.profile(batch_sizes=(batch,), warmup=3, repeats=max(min(10, args.profile_repeats), repeats // 2), save=False)
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
        segments.profile(batch_sizes=(batch,), warmup=3, repeats=max(min(10, args.profile_repeats), repeats // 2), save=False)
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


def targets_table(rows, args) -> list[str]:
    ok = lambda c: "ok" if c else "MISSED"  # noqa: E731
    lines = ["| batch | target | measured | |", "|---|---|---|---|"]
    for r in rows:
        m, b = r["ms"], r["batch"]
        lo, hi = r["budget_range_ms"]
        d = r["deadlines"]
        lines += [
            f"| {b} | scheduler overhead run(all)/bare loop <= 1.05 | {r['overhead_ratio']:.3f} ({m['run_all']:.2f} vs {m['bare_all']:.2f} ms) | {ok(r['overhead_ratio'] <= 1.05)} |",
            f"| {b} | first leaf / standalone network <= 1.10 | {r['first_ratio']:.3f} ({m['run_first']:.3f} vs {m['single']:.3f} ms) | {ok(r['first_ratio'] <= 1.10)} |",
            f"| {b} | (same, first_leaf=False: leaf 0 via its exporting segment) | {r['first_segment_ratio']:.3f} ({m['run_first_segment']:.3f} vs {m['single_2']:.3f} ms) | |",
            f"| {b} | 16 independent / HNE >= 0.9 x MAC ratio ({r['mac_ratio']:.2f}) | {r['speedup']:.2f} = {r['speedup'] / r['mac_ratio']:.2f} x MAC ratio ({m['sixteen']:.2f} vs {m['run_all_2']:.2f} ms) | {ok(r['speedup'] >= 0.9 * r['mac_ratio'])} |",
            f"| {b} | budget misses <= 1% (budgets U[{lo:.2f}, {hi:.2f}] ms, {r['frames']} frames) | {100 * d['miss_rate']:.2f}% (+{d['forced']} forced first-leaf overruns) | {ok(d['miss_rate'] <= 0.01)} |",
            f"| {b} | leaves >= 90% of oracle | {100 * d['leaves_vs_oracle']:.1f}% (mean {d['mean_leaves']:.2f} leaves) | {ok(d['leaves_vs_oracle'] >= 0.9)} |",
        ]  # fmt: skip
        if r["loaded"]:
            ld = r["loaded"]
            lines.append(f"| {b} | under load ({ld['processes']} busy loops), budget 2x full tree ({ld['budget_ms']:.2f} ms): leaves >= 90% "
                         f"of oracle | {100 * ld['leaves_vs_oracle']:.1f}% (mean {ld['mean_leaves']:.2f} leaves; misses {100 * ld['miss_rate']:.1f}%)"
                         f"{' (LOAD ENDED EARLY)' if ld['load_ended_early'] else ''} | {ok(ld['leaves_vs_oracle'] >= 0.9)} |")  # fmt: skip
    return lines


# -- export (issue 4) ---------------------------------------------------------------------------------------------


def bench_export(name: str, work: Path, args) -> dict:
    """Every plan of ``--export-plans`` x precision of model ``name``, exported and verified ``repeats`` times."""
    from hne_edge.bundle import read_manifest
    from hne_edge.exporters import export_onnx

    model = randomized_model(name)
    repeats = args.export_repeats[name]
    res: dict = {"model": name, "params": sum(p.numel() for p in model.parameters()), "exports": []}
    for plan in args.export_plans:
        for precision in ("fp32", "fp16"):
            out, times = work / f"{name}_{plan}_{precision}", []
            for _ in range(repeats):
                t = time.perf_counter()
                export_onnx(model, out, precisions=(precision,), plan=plan, batch=(1, 1, 8), force=True,
                            torch_weights=False, verify=True, verify_batch_sizes=args.verify_batch)  # fmt: skip
                times.append(time.perf_counter() - t)
            files = read_manifest(out).files
            row = {"plan": plan, "precision": precision, "files": len(files), "bytes": sum(f.bytes for f in files),
                   "seconds": statistics.median(times), "runs": len(times)}  # fmt: skip
            res["exports"].append(row)
            print(f"{name} {plan}/{precision}: {row['files']} files {row['bytes'] / 1e6:.1f} MB {row['seconds']:.1f} s "
                  f"(median of {len(times)})", flush=True)  # fmt: skip
    return res


def export_table(results: list[dict]) -> list[str]:
    lines = ["| model | plan | precision | files | size (MB) | export + verification (s) | runs |",
             "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        for e in r["exports"]:
            lines.append(f"| {r['model']} | {e['plan']} | {e['precision']} | {e['files']} | {e['bytes'] / 1e6:.1f} | "
                         f"{e['seconds']:.1f} | {e['runs']} |")  # fmt: skip
    return lines


# -- main ---------------------------------------------------------------------------------------------------------


def arguments(argv: list[str] | None):
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=counts, default="1,16")
    ap.add_argument("--threads", type=count(), default=1,
                    help="ONNX Runtime intra-op threads (and torch's, for --export)")
    ap.add_argument("--repeats", type=count(), default=100, help="interleaved calls per measurement (medians)")
    ap.add_argument("--frames", type=count(), default=1000, help="deadline frames per batch size")
    ap.add_argument("--profile-repeats", type=count(), default=30, help="runs of each step in the runner's profile")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "hne_bench_runtime"))
    ap.add_argument("--out", default=None, help="markdown report (its rows as JSON beside it)")
    ap.add_argument("--nice", type=int, default=0, help="os.nice() increment for this process (e.g. -10: priority over background jobs, as a deployed real-time process would have)")
    ap.add_argument("--realtime", action="store_true", help="run under SCHED_FIFO priority 1 (Linux, root), as a deployed real-time process would; single-threaded, so other jobs keep the other cores")
    ap.add_argument("--frame-gap", type=float, default=0.2, help="idle time between deadline frames, as a fraction of the full-tree latency (frames arrive periodically)")
    ap.add_argument("--quantile", type=float, default=0.99, help="cost model prediction quantile")
    ap.add_argument("--load-seconds", type=float, default=0, help="also run deadline frames under artificial CPU load: one busy-loop process per core, each ending after this many seconds (0: no loaded rows)")
    ap.add_argument("--load-frames", type=count(), default=300,
                    help="deadline frames under load (budget 2x the full tree measured under that load)")
    ap.add_argument("--plans", action="store_true", help="issue 21's rows instead: plans subtrees, fused and mixed per model")
    ap.add_argument("--export", action="store_true", help="issue 4's rows instead: export time and bundle size per plan and precision")
    ap.add_argument("--models", default="hne_resnet_small", help="comma list (e.g. hne_resnet_small,hne_mobilenetv2)")
    ap.add_argument("--export-plans", default=",".join(EXPORT_PLANS), help="--export: comma list of plans, each exported alone")
    ap.add_argument("--export-repeats", default="3", help="--export: exports per model (comma list aligned with --models; the last repeats)")
    ap.add_argument("--verify-batch", default="1,2", help="--export: batch sizes the verification runs")
    ap.add_argument("--smoke", action="store_true",
                    help="hne_tiny, a few calls and frames, for the options not given (the command recorded is the "
                         "one that ran): proves the script runs, measures nothing")
    args = parse_args(ap, argv, SMOKE)
    args.models = args.models.split(",")
    repeats = [int(v) for v in args.export_repeats.split(",")]
    args.export_repeats = {m: repeats[min(k, len(repeats) - 1)] for k, m in enumerate(args.models)}
    args.export_plans = args.export_plans.split(",")
    args.verify_batch = [int(v) for v in args.verify_batch.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.nice:
        os.nice(args.nice)
    if args.realtime:
        realtime()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loads = LoadRecord()
    loads.note()
    import onnxruntime  # noqa: F401  (machine() names its version)
    import torch

    torch.set_num_threads(args.threads)
    setup = (f"fp32, intra-op threads {args.threads}, cost-model quantile {args.quantile}, nice {os.nice(0)}"
             f"{', SCHED_FIFO' if args.realtime else ''}{'; smoke run: not figures' if args.smoke else ''}")  # fmt: skip
    if args.export:
        title, data = "Export time and bundle size (issue 4)", []
        with tempfile.TemporaryDirectory(prefix="bench_export_", dir=workdir) as tmp:
            for name in args.models:
                data.append(bench_export(name, Path(tmp), args))
        lines = export_table(data)
        setup = (f"torch threads {args.threads}; verified against PyTorch at batch sizes {args.verify_batch} (every file, "
                 f"every anytime prefix), as `hne-edge export` does; randomized weights{'; smoke run: not figures' if args.smoke else ''}")  # fmt: skip
    elif args.plans:
        title, data, lines = "Plans (issue 21): the tree in B + 1 calls, on ONNX Runtime CPU", [], []
        from hne_edge.runtime import AnytimeRunner

        for name in args.models:
            bundle, standalone_path = export(workdir, max(args.batches), name, "segments,subtrees,fused")
            standalone = ort_session(standalone_path, args.threads)
            rng = np.random.default_rng(0)
            runners = {p: AnytimeRunner(bundle, plan=p, threads=args.threads, load_profile=False, quantile=args.quantile)
                       for p in ("fused", "subtrees", "mixed", "segments")}  # fmt: skip
            rows = []
            try:
                for b in args.batches:
                    rows.append(bench_plans(runners, standalone, b, args, rng))
                    print(rows[-1], flush=True)
            finally:
                for r in runners.values():
                    r.close()
            loads.note()
            data += [{"model": name, **r} for r in rows]
            lines += plans_table(name, rows, args) + [""]
    else:
        title, name = "Runtime targets (issue 5): the anytime scheduler on ONNX Runtime CPU", args.models[0]
        bundle, standalone_path = export(workdir, max(args.batches), name)
        from hne_edge.runtime import AnytimeRunner

        rng = np.random.default_rng(0)
        standalone = ort_session(standalone_path, args.threads)
        data = []
        with AnytimeRunner(bundle, threads=args.threads, load_profile=False, quantile=args.quantile) as runner, \
                AnytimeRunner(bundle, threads=args.threads, load_profile=False, first_leaf=False) as runner_no_first:  # fmt: skip
            assert runner.first_leaf_file is not None and runner_no_first.first_leaf_file is None
            for b in args.batches:
                data.append(bench_batch(runner, standalone, b, args, rng, runner_no_first))
                print(data[-1], flush=True)
        setup = (f"{name} (16 leaves), plan segments, {setup}; {args.repeats} interleaved repeats (medians), {args.frames} "
                 f"deadline frames per batch size (idle gap {args.frame_gap} x full-tree latency between frames)")  # fmt: skip
        lines = targets_table(data, args)
    loads.note()
    text = "\n".join([f"## {title}", "", f"`{command_line()}`", "",
                      f"Machine: {machine()}; {loads}. {setup}.", "", *lines]) + "\n"  # fmt: skip
    print(text)
    write_report(args.out, text, {"command": command_line(), "machine": machine(), "load": str(loads), "rows": data})
    return 0


if __name__ == "__main__":
    sys.exit(main())
