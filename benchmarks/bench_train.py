"""Training throughput of ``hne-edge train``'s loop: images/s, achieved TFLOP/s against the device's peak,
and GPU utilisation, measured through ``hne_edge.train.fit`` itself (augmentation and loss included).

Every run trains --epochs epochs of --limit images and reports the **last** epoch (the first absorbs
cuDNN autotuning and, with --compile, compilation). FLOPs per image = 3 x 2 x the whole tree's MACs
(forward; backward ~ twice the forward). GPU utilisation is the median of ``nvidia-smi`` samples
taken every 0.2 s during the measured epoch.

    # the issue-11 target: hne_resnet_small, batch 128, >= 30,000 img/s on an H100/H200
    python benchmarks/bench_train.py --device cuda --model hne_resnet_small --batch 128 --limit 25600
    # the CPU figure of BENCHMARKS.md (a smaller batch)
    nice .venv/bin/python benchmarks/bench_train.py --device cpu --model hne_tiny --batch 64 --limit 2048 --threads 2

The script uses only config fields that hne-edge 0.1 also had unless a flag asks for a newer one, so
``PYTHONPATH=<old checkout> python benchmarks/bench_train.py ...`` measures an older trainer the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path and "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(REPO))

# dense bf16 tensor-core peak (TFLOP/s), from the vendors' data sheets; --peak-tflops overrides
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0,
                    "RTX 4090": 165.0, "Orin": 42.5}


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or platform.machine()


class GpuSampler:
    """Samples ``nvidia-smi``'s utilisation.gpu every ``period`` s while it is entered."""

    def __init__(self, index: int, period: float = 0.2) -> None:
        self.index, self.period = index, period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def _loop(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", str(self.index)]
        while not self._stop.wait(self.period):
            try:
                self.samples.append(float(subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip()))
            except (ValueError, subprocess.SubprocessError, OSError):
                pass

    def __enter__(self) -> "GpuSampler":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


def _data(args) -> str:
    if args.data and Path(args.data).is_file():
        return args.data
    import numpy as np  # synthetic CIFAR-shaped data where the real set is absent: throughput only

    path = Path(tempfile.mkdtemp()) / "synthetic.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, (args.limit, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, args.limit))
    return str(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hne_resnet_small")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--limit", type=int, default=25600, help="training images per epoch")
    p.add_argument("--epochs", type=int, default=2, help="the last one is measured")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the trainer's default)")
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "cifar10_train.npz"),
                   help="an .npz (x, y); synthetic CIFAR-shaped data when absent")
    p.add_argument("--no-amp", action="store_true")
    p.add_argument("--amp-dtype", default=None, help="bfloat16 | float16 (default: the trainer's)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-channels-last", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for the utilisation of peak")
    p.add_argument("--out", default=None, help="append the markdown result to this file")
    p.add_argument("--json", default=None, help="write the figures to this JSON file (scripts: gpu_acceptance.py)")
    args = p.parse_args()

    import torch

    import hne_edge
    from hne_edge.models import tree_cost
    from hne_edge.train.checkpoint import model_from_checkpoint
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.engine import fit

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    config = {
        "data": {"name": "npz", "data_dir": _data(args), "val_split": 0.0, "limit": args.limit},
        "model": {"name": args.model},
        "loss": {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0},
        "optim": {"epochs": args.epochs, "batch_size": args.batch, "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        "seed": 0, "device": device, "threads": args.threads, "quiet": True,
        "amp": not args.no_amp, "channels_last": not args.no_channels_last,
    }
    if args.amp_dtype:
        config["amp_dtype"] = args.amp_dtype
    if args.compile:
        config["compile"] = True
    name = _device_name(device)
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    with tempfile.TemporaryDirectory() as tmp, GpuSampler(torch.device(device).index or 0) as sampler:
        config["out"] = tmp
        started = time.time()
        result = fit(TrainConfig.from_dict(config))
        wall = time.time() - started
        macs = tree_cost(model_from_checkpoint(result.checkpoint)[0]).total_macs  # at the data's input size
    last = result.history[-1]
    img_s = last["train_images_per_s"]
    tflops = img_s * 6 * macs / 1e12
    n = len(sampler.samples)
    util = statistics.median(sampler.samples[n // args.epochs:]) if n else None  # the warm-up epoch's samples dropped
    flags = [f for f, on in (("bf16/fp16 autocast", device != "cpu" and not args.no_amp), ("torch.compile", args.compile),
                             ("channels_last", device != "cpu" and not args.no_channels_last)) if on]
    lines = [
        f"### Training throughput, {args.model}, batch {args.batch}, {device}",
        "",
        f"Device: {name}; torch {torch.__version__}; hne-edge at {Path(hne_edge.__file__).parent.parent.name}; "
        f"{', '.join(flags) or 'fp32'}; {torch.get_num_threads()} CPU threads; load average "
        f"{os.getloadavg()[0]:.1f}. Epoch {args.epochs} of {args.epochs}, {args.limit} images, wall {wall:.0f} s in all.",
        "",
        "| images/s | TFLOP/s achieved | % of peak | GPU utilisation (median) | 200 CIFAR epochs (50k images) |",
        "|---|---|---|---|---|",
        f"| {img_s:,.0f} | {tflops:.3f} | {f'{100 * tflops / peak:.2f}% of {peak:.0f}' if peak else 'n/a (no peak known)'} "
        f"| {f'{util:.0f}%' if util is not None else 'n/a'} | {200 * 50000 / img_s / 60:,.1f} min |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.json:
        figures = {"model": args.model, "batch": args.batch, "device": device, "device_name": name, "torch": torch.__version__,
                   "compile": args.compile, "amp": device != "cpu" and not args.no_amp, "epochs": args.epochs,
                   "images": args.limit, "images_per_s": img_s, "tflops": tflops, "peak_tflops": peak,
                   "utilisation_pct": util, "wall_s": wall}  # fmt: skip
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + f"Command: `{' '.join(['python', *sys.argv])}`\n\n")


if __name__ == "__main__":
    main()
