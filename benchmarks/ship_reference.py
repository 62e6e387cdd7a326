"""Make a reference run (``benchmarks/train_reference.py``, the GPU acceptance run's ``reference`` stage) the package's
pretrained CIFAR-10 model: ``hne_edge/assets/cifar10_reference.{pt,json,yaml}``, which ``hne-edge demo`` then uses.

    python benchmarks/ship_reference.py ../shared/gpu/<date>/            # the folder holding checkpoint.pt, record.json
    python benchmarks/ship_reference.py FOLDER --data ../shared/data/cifar10_train.npz --note "..."

What it checks before it writes anything:

1. ``record.json`` says the run ended (``"status": "ok"``; ``--allow-partial`` ships a run stopped after an epoch,
   and says so) and ``checkpoint.pt`` is the file it describes (its sha256);
2. the data file here is the one the run held its images out of (the record's fingerprint: sha256 of x then y),
   so that the held-out split the demo evaluates on holds no training image;
3. on this CPU, the checkpoint scores on the held-out split what the record says it scored on the GPU (to
   ``--tolerance`` points: float arithmetic differs between devices).

What it writes: the weights stored in float16 (``--weights-dtype``; readers load them into the float32 model: the
fp32 state dict of hne_resnet_small is 5.45 MiB, above the 5 MiB the repository's hook accepts), the held-out
accuracy by ensemble size n = 1..16 of the stored weights (with standard errors) beside that of the float32 ones,
the record of how it was made (command, commit, machine, the time budget's plan, throughput) and the training
config as YAML.

``--demo`` ships the other model the demo offers, the CPU-trained ``cifar10_demo.pt`` (``hne-edge demo --pretrained
tiny``): a finished ``hne-edge train`` run, its final epoch whatever its figures (no selection on the hold-out)::

    nice .venv/bin/python -m hne_edge train --config hne_edge/assets/cifar10_demo.yaml \
        --data-dir ../shared/data/cifar10_train.npz --out runs/cifar10_demo              # ~10 min on 2 cores, 1 thread
    python benchmarks/ship_reference.py --demo runs/cifar10_demo --command "<the command above>"

Its record holds the command, the commit, the data file's fingerprint (the demo refuses another file: its seeded
validation split could then hold training images), the machine, the training time and the held-out accuracy of
the first n leaves with one standard error, and the gain over n = 1 with a paired standard error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from harness import REPO, machine  # first: it puts this checkout on sys.path

NAME = "cifar10_reference"  # hne_edge.demo.REFERENCE is ASSETS / f"{NAME}.pt"


def _rows(model, data, norm, dtype=None):
    import torch

    from hne_edge.demo import ensemble_rows
    from hne_edge.train.data import BatchLoader
    from hne_edge.train.evaluation import predict

    if dtype is not None:  # the weights as the shipped file stores them, loaded back into float32
        state = {k: v.to(dtype).float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
        model = type(model)(model.config)
        model.load_state_dict(state)
    logits, labels = predict(model.eval(), BatchLoader(data.val, 500, mean=norm["mean"], std=norm["std"]))
    with torch.no_grad():
        return ensemble_rows(logits, labels, sizes=tuple(range(1, logits.shape[1] + 1)))


def commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def ship_demo(run: Path, command: str, note: str, out: Path) -> int:
    """A finished ``hne-edge train`` run as the CPU-trained demo checkpoint: a lean copy of its final epoch (weights,
    config, history; no optimizer state) at ``out`` and its record beside it (``out`` with suffix .json)."""
    from hne_edge.demo import ensemble_rows
    from hne_edge.fileio import atomic_write_json
    from hne_edge.train import load_checkpoint, model_from_checkpoint
    from hne_edge.train.checkpoint import save_release
    from hne_edge.train.config import TrainConfig, upgrade_config
    from hne_edge.train.data import BatchLoader, load_data, npz_fingerprint
    from hne_edge.train.evaluation import predict

    state = load_checkpoint(run / "checkpoint.pt")
    config = TrainConfig.from_dict(upgrade_config(state["config"]))
    history = state["extra"]["history"]
    if state["epoch"] != config.optim.epochs:
        raise SystemExit(f"{run}: epoch {state['epoch']} of {config.optim.epochs}; package a finished run")
    model, _ = model_from_checkpoint(state)
    save_release(out, state)
    data = load_data(config.data, seed=config.seed)
    norm = state["normalization"]
    logits, labels = predict(model, BatchLoader(data.val, 256, mean=norm["mean"], std=norm["std"]))
    rows = ensemble_rows(logits, labels)
    loss = {"independent": "L^I", "hierarchical": "L^I + L^HD", "distill": "L^I + L^D"}.get(config.loss.kind, config.loss.kind)
    first, last = rows[0], rows[-1]
    record = {
        "summary": (f"{config.model.name} (slim, {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters), "
                    f"{loss}, {config.optim.epochs} epochs on {len(data.train):,} CIFAR-10 images; held out: "
                    f"n=1 {first['accuracy']:.1%}, n={last['n']} {last['accuracy']:.1%} on {last['images']:,} images"),
        "command": command,
        "commit": commit(),
        "config": state["config"],
        "data": {
            "file": config.data.data_dir,
            "sha256": npz_fingerprint(config.data.data_dir),
            "fingerprint": "sha256 of x's bytes then y's as int64",
            "train_images": len(data.train),
            "validation_images": len(data.val),
            "split": f"seeded permutation (seed {config.seed}): the first {config.data.val_split:g} of it held out, "
                     f"then the first --limit {config.data.limit} of each part",
        },
        "epochs": config.optim.epochs,
        "seed": config.seed,
        "train_seconds": round(sum(h["train_seconds"] for h in history), 1),
        "machine": machine(),
        "torch": __import__("torch").__version__,
        "note": note,
        "held_out": rows,
        "history": [{k: v for k, v in h.items() if k != "val_acc_n"} for h in history],
    }  # fmt: skip
    atomic_write_json(out.with_suffix(".json"), record, indent=1)
    print(record["summary"])
    for r in rows:
        print(f"n={r['n']:>2}: {r['accuracy']:.2%} ± {r['se']:.2%}   vs n=1 {100 * r['gain']:+.2f} ± {100 * r['gain_se']:.2f}")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB) and {out.with_suffix('.json')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the reference run's folder (checkpoint.pt, record.json); with --demo, "
                                             "the training run's --out folder")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "cifar10_train.npz",
                   help="the CIFAR-10 training file here (its fingerprint must be the record's)")
    p.add_argument("--assets", type=Path, default=REPO / "hne_edge" / "assets", help="where the shipped files go")
    p.add_argument("--weights-dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--tolerance", type=float, default=0.5, help="points of held-out accuracy the CPU may differ by")
    p.add_argument("--allow-partial", action="store_true", help="ship a run that was stopped after an epoch")
    p.add_argument("--note", default="", help="anything a reader of the record needs to know")
    p.add_argument("--demo", action="store_true", help="ship a finished `hne-edge train` run as the CPU-trained demo "
                                                       "checkpoint (cifar10_demo.pt) instead")  # fmt: skip
    p.add_argument("--command", default=None, help="--demo: the exact training command, for the record")
    p.add_argument("--out", type=Path, default=None, help="--demo: where the checkpoint goes (default: ASSETS/cifar10_demo.pt)")
    args = p.parse_args(argv)
    if args.demo:
        if not args.command:
            p.error("--demo needs --command: the exact training command, for the record")
        return ship_demo(args.folder, args.command, args.note, args.out or args.assets / "cifar10_demo.pt")

    import torch

    from hne_edge.fileio import atomic_write_json, atomic_write_text
    from hne_edge.train.checkpoint import load_checkpoint, model_from_checkpoint, save_release
    from hne_edge.train.config import TrainConfig, upgrade_config
    from hne_edge.train.data import load_data, npz_fingerprint

    folder = args.folder
    record_path, ckpt_path = folder / "record.json", folder / "checkpoint.pt"
    for path in (record_path, ckpt_path):
        if not path.is_file():
            raise SystemExit(f"{folder}: no {path.name}; expected the output of the reference stage (checkpoint.pt, record.json)")
    record = json.loads(record_path.read_text())
    status = record.get("status")
    if status != "ok" and not (status == "partial" and args.allow_partial):
        raise SystemExit(f"{record_path}: status {status!r} ({record.get('error')}); expected 'ok' (--allow-partial ships "
                         "a run stopped after an epoch)")  # fmt: skip
    digest = hashlib.sha256(ckpt_path.read_bytes()).hexdigest()
    if digest != record["checkpoint"]["sha256"]:
        raise SystemExit(f"{ckpt_path}: sha256 {digest[:12]}...; the record describes {record['checkpoint']['sha256'][:12]}... "
                         "(a checkpoint from another run?)")  # fmt: skip
    found = npz_fingerprint(args.data)
    if found != record["data"]["sha256"]:
        raise SystemExit(f"{args.data}: sha256 of x and y {found[:12]}...; the run held its images out of "
                         f"{record['data']['sha256'][:12]}... (another file or another order: its held-out split could "
                         "hold training images)")  # fmt: skip
    state = load_checkpoint(ckpt_path)
    stored = upgrade_config(state["config"])
    config = TrainConfig.from_dict({**stored, "data": {**stored["data"], "data_dir": str(args.data)}})
    data = load_data(config.data, seed=config.seed)
    model, _ = model_from_checkpoint(state)
    norm = state["normalization"]
    fp32 = _rows(model, data, norm)
    dtype = getattr(torch, args.weights_dtype)
    shipped = _rows(model, data, norm, dtype) if dtype != torch.float32 else fp32
    gpu = {r["n"]: r["accuracy"] for r in record.get("held_out", [])}
    worst = max((abs(r["accuracy"] - gpu[r["n"]]) * 100 for r in fp32 if r["n"] in gpu), default=0.0)
    if gpu and worst > args.tolerance:
        raise SystemExit(f"{ckpt_path}: on this CPU it scores up to {worst:.2f} points away from its record (tolerance "
                         f"{args.tolerance}); expected the same figures: is the data or the checkpoint another?")  # fmt: skip
    fp16_cost = max(abs(a["accuracy"] - b["accuracy"]) * 100 for a, b in zip(fp32, shipped))

    out = args.assets / f"{NAME}.pt"
    save_release(out, state, weights_dtype=dtype, extra={"budget": record.get("plan")})
    machine = record.get("machine", {})
    loss = {"independent": "L^I", "hierarchical": "(1 - a) L^I + a L^HD, a 0.5, T 2"}.get(config.loss.kind, config.loss.kind)
    first, last = shipped[0], shipped[-1]
    shipped_record = {
        "summary": (f"{config.model.name} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), {loss}, "
                    f"{record.get('epochs', 0):.1f} epochs in a {record.get('time_budget_s', 0) / 60:.1f}-minute budget on "
                    f"{machine.get('gpu', 'a CPU')}; held out (the file's last {len(data.val):,} images): n=1 "
                    f"{first['accuracy']:.1%}, n={last['n']} {last['accuracy']:.1%}"),
        "command": record.get("parent_command") or record.get("command"),
        "train_command": record.get("command"),
        "commit": record.get("commit"),
        "shipped_by": {"command": " ".join(["python", "benchmarks/ship_reference.py", *(argv or sys.argv[1:])]),
                       "commit": commit(), "weights_dtype": args.weights_dtype},
        "config": state["config"],
        "data": {**record["data"], "file": "../shared/data/cifar10_train.npz", "train_images": len(data.train),
                 "validation_images": len(data.val)},
        "epochs": record.get("epochs"),
        "seed": config.seed,
        "train_seconds": record.get("seconds", {}).get("train", 0.0),
        "machine": (f"{machine.get('gpu')} ({machine.get('gpu_memory_mib')} MiB), torch {machine.get('torch')}, CUDA "
                    f"{machine.get('cuda')}" if machine.get("gpu") else f"CPU, torch {machine.get('torch')}"),
        "torch": machine.get("torch"),
        "note": args.note,
        "held_out": shipped,
        "held_out_float32": fp32,
        "weights_dtype_cost_points": round(fp16_cost, 3),
        "record_vs_this_cpu_points": round(worst, 3),
        "plan": record.get("plan"),
        "throughput": record.get("throughput"),
        "images_seen": record.get("images_seen"),
        "time_budget_s": record.get("time_budget_s"),
        "status": status,
        "history": record.get("history", []),
    }
    atomic_write_json(args.assets / f"{NAME}.json", shipped_record, indent=1)
    header = (f"# The run behind hne_edge/assets/{NAME}.pt ({NAME}.json says how it went).\n"
              f"# {shipped_record['command']}\n")  # fmt: skip
    atomic_write_text(args.assets / f"{NAME}.yaml", header + TrainConfig.from_dict(stored).to_yaml())
    print(shipped_record["summary"])
    for a, b in zip(fp32, shipped):
        print(f"n={a['n']:>2}: float32 {a['accuracy']:.2%}, stored as {args.weights_dtype} {b['accuracy']:.2%} "
              f"± {b['se']:.2%}; GPU record {100 * gpu.get(a['n'], float('nan')):.2f}%")
    print(f"wrote {out} ({out.stat().st_size / 2**20:.2f} MiB), {NAME}.json and {NAME}.yaml in {args.assets}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
