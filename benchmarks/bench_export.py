"""Export cost and ONNX Runtime CPU latency of the bundle plans; writes benchmarks/results/export.md.

    .venv/bin/python benchmarks/bench_export.py --models hne_resnet_small,hne_mobilenetv2

Per model (randomized weights with non-trivial BatchNorm statistics, so
verification means something):
  * export time (median of --repeats; includes the verification against
    PyTorch, which is part of every export) and bundle size for plans
    nodes / segments x precisions fp32 / fp16;
  * ONNX Runtime CPU, batch 1, all in one run: leaf 1 through the per-node
    chain vs its segment vs a standalone single-network ONNX of the same
    path; all N leaves through nodes vs segments vs N independent networks.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def _sessions(paths, threads):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # many sessions share 2 busy cores
    return {str(p): ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for p in paths}


def _interleaved_median_ms(fns: dict, repeats: int, warmup: int = 2) -> dict:
    """Median ms per function, calling them round-robin so load changes on a shared machine hit all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_model(name: str, work: Path, repeats: int, lat_repeats: int, threads: int, verify_batch: list[int]) -> dict:
    import torch

    from conftest import randomize_
    from hne_edge.bundle import read_manifest
    from hne_edge.exporters import export_onnx, export_standalone_network
    from hne_edge.models import create_model

    torch.manual_seed(0)
    model = randomize_(create_model(name))
    tree = model.tree
    res: dict = {"model": name, "params": sum(p.numel() for p in model.parameters()), "exports": []}
    bundles = {}
    for plan in ("nodes", "segments"):
        for precision in ("fp32", "fp16"):
            times = []
            for r in range(max(1, repeats)):
                out = work / f"{name}_{plan}_{precision}"
                t = time.perf_counter()
                export_onnx(model, out, precisions=(precision,), plan=plan, batch=(1, 1, 8), force=True,
                            torch_weights=False, verify=repeats > 0, verify_batch_sizes=verify_batch)  # fmt: skip
                times.append(time.perf_counter() - t)
            if repeats == 0:  # --repeats 0: latency only, export untimed and unverified
                bundles[(plan, precision)] = out
                continue
            m = read_manifest(out)
            size = sum(f.bytes for f in m.files)
            res["exports"].append({"plan": plan, "precision": precision, "files": len(m.files), "bytes": size,
                                   "seconds": statistics.median(times), "runs": len(times)})  # fmt: skip
            print(f"{name} {plan}/{precision}: {len(m.files)} files {size / 1e6:.1f} MB "
                  f"{statistics.median(times):.1f} s (median of {len(times)})", flush=True)  # fmt: skip
            bundles[(plan, precision)] = out

    # standalone single networks (one per leaf), checked against the fused model's leaf outputs
    t = time.perf_counter()
    nets = [export_standalone_network(model, leaf, work / f"{name}_net{leaf:02d}.onnx", verify=False)
            for leaf in range(tree.num_leaves)]  # fmt: skip
    res["standalone_export_s"] = time.perf_counter() - t
    x = np.random.default_rng(0).standard_normal((1, *model.config.input_shape)).astype(np.float32)
    with torch.no_grad():
        fused = model(torch.from_numpy(x)).numpy()

    mn = read_manifest(bundles[("nodes", "fp32")])
    ms = read_manifest(bundles[("segments", "fp32")])
    node_files = {f.nodes[0]: f for f in mn.files}
    seg_files = {f.leaf: f for f in ms.files}
    s_nodes = _sessions([bundles[("nodes", "fp32")] / f.path for f in mn.files], threads)
    s_segs = _sessions([bundles[("segments", "fp32")] / f.path for f in ms.files], threads)
    s_nets = _sessions(nets, threads)

    def run_nodes(n_leaves: int):
        cache = {None: x}
        out = []
        for seg in tree.segments[:n_leaves]:
            y = cache[seg.input]
            for nid in seg.nodes:
                f = node_files[nid]
                (y,) = s_nodes[str(bundles[("nodes", "fp32")] / f.path)].run(None, {f.inputs[0].name: y})
                cache[nid] = y
            out.append(y)
        return out

    def run_segments(n_leaves: int):
        cache = {None: x}
        out = []
        for seg in tree.segments[:n_leaves]:
            f = seg_files[seg.leaf]
            ys = s_segs[str(bundles[("segments", "fp32")] / f.path)].run(None, {f.inputs[0].name: cache[seg.input]})
            cache.update({o.node: y for o, y in zip(f.outputs[:-1], ys[:-1])})
            out.append(ys[-1])
        return out

    def run_nets(n_leaves: int):
        return [s_nets[str(nets[i])].run(None, {"image": x})[0] for i in range(n_leaves)]

    for fn in (run_nodes, run_segments, run_nets):  # all three compute the fused model's leaves
        got = np.stack(fn(tree.num_leaves), axis=1)
        assert np.abs(got - fused).max() <= 1e-3, (fn.__name__, float(np.abs(got - fused).max()))
    N = tree.num_leaves
    res["latency_ms"] = {
        **_interleaved_median_ms({"leaf1_nodes": lambda: run_nodes(1), "leaf1_segment": lambda: run_segments(1),
                                  "leaf1_standalone": lambda: run_nets(1)}, lat_repeats),
        **_interleaved_median_ms({"all_nodes": lambda: run_nodes(N), "all_segments": lambda: run_segments(N),
                                  "all_independent": lambda: run_nets(N)}, max(3, lat_repeats // 4)),
    }  # fmt: skip
    res["macs"] = {"leaf1": mn.prefix_macs()[0], "all": mn.prefix_macs()[-1],
                   "independent": sum(sum(mn.node_macs[n] for n in tree.path(i)) for i in range(N))}  # fmt: skip
    res["lat_repeats"] = lat_repeats
    print(name, res["latency_ms"], flush=True)
    return res


def to_markdown(results: list[dict], command: str, threads: int, verify_batch: list[int]) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    lines = [
        "# Export benchmarks (hne-edge exporters)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}), no GPU, shared with other "
        f"jobs (load average at the end {', '.join(f'{v:.1f}' for v in load)}); ONNX Runtime CPU, "
        f"intra_op_num_threads={threads}. Medians. Weights are random with non-trivial BatchNorm statistics "
        "(timings do not depend on training).",
        "",
        "## Export time and bundle size",
        "",
        f"Export time includes BatchNorm folding, the per-file checks and the verification against PyTorch "
        f"(every file + every anytime prefix, batch sizes {verify_batch}); no torch weights file.",
        "",
        "| model | plan | precision | files | size (MB) | export (s) | runs |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        for e in r["exports"]:
            lines.append(f"| {r['model']} | {e['plan']} | {e['precision']} | {e['files']} | {e['bytes'] / 1e6:.1f} "
                         f"| {e['seconds']:.1f} | {e['runs']} |")  # fmt: skip
    lines += [
        "",
        "## ONNX Runtime CPU latency, batch 1 (fp32)",
        "",
        "| model | leaf 1: node chain | leaf 1: segment | leaf 1: standalone net | all leaves: nodes | "
        "all leaves: segments | independent nets | MACs leaf 1 / all / independent |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lm, m = r["latency_ms"], r["macs"]
        lines.append(
            f"| {r['model']} | {lm['leaf1_nodes']:.2f} ms | {lm['leaf1_segment']:.2f} ms | {lm['leaf1_standalone']:.2f} ms "
            f"| {lm['all_nodes']:.2f} ms | {lm['all_segments']:.2f} ms | {lm['all_independent']:.2f} ms "
            f"| {m['leaf1'] / 1e6:.1f}M / {m['all'] / 1e6:.1f}M / {m['independent'] / 1e6:.1f}M |"
        )
    lines += [
        "",
        "The three variants of each group are timed round-robin (A, B, C, A, B, C, ...) so that load changes on "
        "the shared machine hit them alike. Leaf-1 latencies are medians of "
        f"{results[0]['lat_repeats'] if results else '?'} calls, all-leaves latencies of a quarter as many (at least 3). "
        "The three ways of computing the leaves were checked to agree with the fused PyTorch model (<= 1e-3) in the "
        "same run. 'independent nets' runs the N root-to-leaf networks as separate standalone ONNX files: the "
        "cost of an ensemble without the tree's sharing.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="hne_resnet_small,hne_mobilenetv2")
    ap.add_argument("--repeats", default="3,1",
                    help="export repeats per model (comma list aligned with --models); 0: latency only")
    ap.add_argument("--latency-repeats", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verify-batch", default="1,2")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "export.md"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    models = args.models.split(",")
    repeats = [int(v) for v in args.repeats.split(",")]
    repeats += [repeats[-1]] * (len(models) - len(repeats))
    verify_batch = [int(v) for v in args.verify_batch.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp:
        for name, rep in zip(models, repeats):
            results.append(bench_model(name, Path(tmp), rep, args.latency_repeats, args.threads, verify_batch))
    command = "python benchmarks/bench_export.py " + " ".join(sys.argv[1:])
    text = to_markdown(results, command.strip(), args.threads, verify_batch)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
