"""Train the reference HNE_small to a time budget and write what it takes to ship it (issue 25).

    PYTHONPATH=. python benchmarks/train_reference.py --data cifar10_train.npz --out OUT --time-budget 5m
    PYTHONPATH=. python benchmarks/train_reference.py --data cifar10_train.npz --out OUT --deadline UNIX_TIME

The recipe: ``hne_resnet_small`` on CIFAR-10 with the paper's objective (``--objective hierarchical``:
(1 - alpha) L^I + alpha L^HD, alpha 0.5, T 2, the paper's weighting; ``independent``: L^I), SGD with momentum
0.9 and weight decay 5e-4, the cifar preset's batch (``auto``: 512 on CUDA, lr 0.1 at 128 scaled linearly to
0.4 after a 2-epoch warm-up; ``--batch-size``, ``--lr`` at 128 and ``--warmup-epochs`` change them: issue 41's
options), a cosine schedule that ends inside the time budget (``TrainConfig.time_budget``:
at most the paper's 200 epochs), bf16 autocast and channels-last on CUDA, no ``torch.compile`` (its tens of
seconds of compilation have not paid in the trainer's loop: BENCHMARKS.md). The last 5,000 images of the file
(``data.holdout: last``, ``val_split`` 0.1 of 50,000) are held out for validation, never trained on; there is no
test set here.

OUT receives three files: ``checkpoint.pt`` (the final weights, float32, no optimizer state: ``hne-edge eval``
and ``hne-edge export`` read it), ``config.yaml`` (the resolved training config) and ``record.json``: the data
file's fingerprint, the plan of the time budget, images seen, epochs, throughput, validation accuracy by
ensemble size n = 1..16 on the held-out images (with standard errors), the machine (GPU, torch, CUDA), the
command and the seconds each phase took. ``record.json`` is written first and rewritten at every phase, so a
run that fails or is stopped (SIGTERM: the acceptance run's cap) still says what happened, and a run stopped
after an epoch still leaves that epoch's weights (``"status": "partial"``). ``benchmarks/ship_reference.py``
turns OUT into the package's pretrained model. The training run itself goes to ``--run-dir`` (scratch).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hne_edge.train.config import EMA_AUTO  # noqa: E402  (torch-free)

RECORD, CHECKPOINT, CONFIG = "record.json", "checkpoint.pt", "config.yaml"
HOLDOUT = "the last val_split (0.1) of the file's images in its order (data.holdout: last): 5,000 of CIFAR-10's 50,000"


# a reference variant (gpu_acceptance.py --reference-objectives): --objective, and the recipe options of issue 41
# measured beside the paper's recipe in the same call, each a "-" and a token after it (a folder name of OUT:
# letters, digits, "-" and "." come back from a GPU machine): "ema", an average of the weights delivered (--ema,
# gpu_acceptance.py --reference-ema's decay, auto by default: a run's length is not known before the call); "bN",
# batch N (the learning rate scaled linearly from 0.1 at 128); "wE", E epochs of warm-up; "lrX", X at batch 128
REFERENCE_OBJECTIVES = ("hierarchical", "independent")
REFERENCE_KNOBS = {"b": ("--batch-size", int), "w": ("--warmup-epochs", float), "lr": ("--lr", float)}


def ema_setting(text: str) -> float | str:
    """--ema and --reference-ema: ``auto`` or a decay (train --ema; ``optim.ema``); ArgumentTypeError otherwise."""
    if text == EMA_AUTO:
        return text
    try:
        decay = float(text)
    except ValueError:
        decay = math.nan
    if not 0 < decay < 1:
        raise argparse.ArgumentTypeError(f"received {text!r}; expected {EMA_AUTO} or a decay with 0 < decay < 1")
    return decay


def reference_variant(text: str, ema_decay: float | str) -> tuple[str, list[str]]:
    """The objective and train_reference.py's arguments a reference variant names, e.g. ``hierarchical`` (the
    paper's recipe), ``hierarchical-ema``, ``hierarchical-b1024-w5``, ``independent-ema-lr0.2``; ValueError names
    what is wrong."""
    objective, *tokens = text.split("-")
    expected = (f"OBJECTIVE[-ema][-bBATCH][-wWARMUP_EPOCHS][-lrLR_AT_128] with OBJECTIVE one of "
                f"{', '.join(REFERENCE_OBJECTIVES)}, e.g. hierarchical-ema-b1024-w5")  # fmt: skip
    if objective not in REFERENCE_OBJECTIVES:
        raise ValueError(f"reference variant {text!r}: objective {objective!r}; expected {expected}")
    args, seen = [], set()
    for token in tokens:
        knob = "ema" if token == "ema" else next((k for k in ("lr", "b", "w") if token.startswith(k)), None)
        value = token[len(knob):] if knob not in (None, "ema") else ""
        if knob is None or knob in seen:
            why = "twice" if knob else "unknown"
            raise ValueError(f"reference variant {text!r}: {token!r} {why}; expected {expected}")
        seen.add(knob)
        if knob == "ema":
            args += ["--ema", str(ema_decay)]
            continue
        flag, kind = REFERENCE_KNOBS[knob]
        try:
            number = kind(value)
        except ValueError:
            number = None
        if number is None or not number > 0 and not (knob == "w" and number == 0):
            wanted = ("a whole number" if kind is int else "a number") + (" >= 0" if knob == "w" else " > 0")
            raise ValueError(f"reference variant {text!r}: {token!r} needs {wanted} after {knob!r}; "
                             f"expected {expected}")
        args += [flag, value]
    return objective, args


class Stopped(Exception):
    """SIGTERM: the caller's time is up."""


def stop_on_sigterm(t0: float) -> None:
    """SIGTERM raises :class:`Stopped` in the main thread - but never inside an import.

    An exception raised while a module's body runs leaves it half-made (a submodule in ``sys.modules``, the package
    gone): the stopped run then cannot keep its last epoch (``partially initialized module 'yaml'``, seen when the
    signal met the first epoch's imports). So a stop that lands in an import is taken again 50 ms later, by SIGALRM.
    """

    def on_stop(signum: int, frame) -> None:
        if _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise Stopped(f"stopped by signal {signal.SIGTERM.value} (the caller's time was up) "
                      f"{time.monotonic() - t0:.0f} s in")  # fmt: skip

    signal.signal(signal.SIGALRM, on_stop)
    signal.signal(signal.SIGTERM, on_stop)


def ignore_stops() -> None:
    """No more :class:`Stopped`: neither a new SIGTERM nor a deferred one."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)


def _importing(frame) -> bool:
    """Whether ``frame`` runs under the import machinery (a module's body, or importlib itself)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def machine() -> dict[str, Any]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "platform": platform.platform(), "cpu_count": os.cpu_count()}  # fmt: skip
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_mib=p.total_memory // 2**20, compute_capability=f"{p.major}.{p.minor}")
    return info


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def reference_config(args: argparse.Namespace, budget_s: float):
    """The recipe (see the module docstring) as a TrainConfig."""
    from hne_edge.train.config import TrainConfig

    overrides: dict[str, Any] = {
        "data": {"name": "npz", "data_dir": str(args.data), "val_split": 0.1, "holdout": "last", "limit": args.limit},
        "model": {"name": args.model},
        "loss": {"kind": args.objective, "alpha": 0.5, "temperature": 2.0, "weighting": "paper", "normalize": "none"},
        "out": str(args.run_dir), "device": args.device, "threads": args.threads, "quiet": False,
        "eval_every": args.eval_every, "time_budget": round(budget_s, 1), "compile": False,
    }  # fmt: skip
    for key, value in (("batch_size", args.batch_size), ("lr", args.lr), ("warmup_epochs", args.warmup_epochs)):
        if value is not None:  # issue 41's recipe options, each measured beside the preset's
            overrides.setdefault("optim", {})[key] = value
    if args.ema is not None:  # an option to measure beside the paper's recipe (issue 41); off by default
        overrides.setdefault("optim", {})["ema"] = args.ema
    return TrainConfig.from_preset("cifar", overrides)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="the CIFAR-10 training .npz (x: N,32,32,3 uint8; y: N)")
    p.add_argument("--out", type=Path, required=True, help="where checkpoint.pt, config.yaml and record.json go")
    p.add_argument("--run-dir", type=Path, default=None, help="the training run's folder (default: OUT/../<OUT name>.run)")
    p.add_argument("--objective", default="hierarchical", choices=REFERENCE_OBJECTIVES)
    p.add_argument("--time-budget", default=None, help="training time (7m, 300s, ...); or --deadline")
    p.add_argument("--deadline", type=float, default=None, help="unix time by which OUT must be complete")
    p.add_argument("--reserve-s", type=float, default=12.0, help="seconds kept after training: evaluation and writing")
    p.add_argument("--model", default="hne_resnet_small")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: the cifar preset's (auto: 512 on CUDA); the learning rate scales linearly with it")
    p.add_argument("--lr", type=float, default=None, help="the learning rate at batch 128 (default: the preset's 0.1)")
    p.add_argument("--warmup-epochs", type=float, default=None, help="epochs of warm-up (default: the preset's 2)")
    p.add_argument("--limit", type=int, default=None, help="train on this many images (smoke runs)")
    p.add_argument("--ema", type=ema_setting, default=None,
                   help="deliver an exponential moving average of the weights with this decay per step, or auto (a "
                        "window of a twentieth of the run's steps; optim.ema)")
    p.add_argument("--eval-every", type=int, default=5, help="validate every this many epochs (and after the last)")
    p.add_argument("--no-config-file", action="store_true", help="keep the config only inside record.json")
    p.add_argument("--parent-command", default=None, help="the command that ran this one (for the record)")
    args = p.parse_args(argv)
    started, t0 = time.time(), time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.run_dir = args.run_dir or args.out.parent / f"{args.out.name}.run"

    from hne_edge.fileio import atomic_write_json

    record: dict[str, Any] = {
        "status": "starting", "error": None, "objective": args.objective, "model": args.model,
        "started": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv] if argv is None else ["train_reference.py", *argv]),
        "parent_command": args.parent_command, "commit": commit(), "seconds": {},
    }  # fmt: skip

    def write(status: str | None = None) -> None:
        if status:
            record["status"] = status
        record["seconds"]["total"] = round(time.monotonic() - t0, 1)
        atomic_write_json(args.out / RECORD, record, indent=1, allow_nan=True)

    stop_on_sigterm(t0)
    write()
    try:
        from hne_edge.train.data import npz_fingerprint
        from hne_edge.train.engine import fit

        record["machine"] = machine()
        record["data"] = {"file": str(args.data), "sha256": npz_fingerprint(args.data),
                          "fingerprint": "sha256 of x's bytes then y's as int64", "holdout": HOLDOUT}  # fmt: skip
        now = time.time()
        if args.deadline is not None:
            budget_s = args.deadline - now - args.reserve_s
        elif args.time_budget is not None:
            from hne_edge.train.config import parse_duration

            budget_s = parse_duration(args.time_budget, "--time-budget")
        else:
            raise SystemExit("give --time-budget or --deadline")
        if budget_s <= 0:
            raise SystemExit(f"no time to train: the deadline is {args.deadline - now:.0f} s away, {args.reserve_s:.0f} s are kept")
        config = reference_config(args, budget_s)
        record["time_budget_s"] = round(budget_s, 1)
        record["seconds"]["startup"] = round(time.monotonic() - t0, 1)
        write("training")
        t_train = time.monotonic()
        result = fit(config)
        record["seconds"]["train"] = round(time.monotonic() - t_train, 1)
        finish(args, record, result.checkpoint, partial=False)
        write("ok")
        return 0
    except BaseException as exc:  # noqa: BLE001 - whatever happened, the record says it and keeps what is usable
        stopped = isinstance(exc, (Stopped, KeyboardInterrupt))
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-4000:]
        ignore_stops()  # the last words are the record's
        status = "stopped" if stopped else "failed"
        run_checkpoint = args.run_dir / "checkpoint.pt"
        if run_checkpoint.is_file() and not (args.out / CHECKPOINT).is_file():
            try:
                finish(args, record, run_checkpoint, partial=True, evaluate=not stopped)
                status = "partial"
            except Exception as again:  # noqa: BLE001
                record["error"] += f"; and keeping the last epoch's weights failed: {type(again).__name__}: {again}"
        write(status)
        return 1


def finish(args: argparse.Namespace, record: dict[str, Any], run_checkpoint: Path, *, partial: bool,
           evaluate: bool = True) -> None:  # fmt: skip
    """The release checkpoint, its config, and the record's figures from the run's ``run_checkpoint``."""
    from hne_edge.demo import ensemble_rows
    from hne_edge.train.checkpoint import load_checkpoint, model_from_checkpoint, save_release
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.data import BatchLoader, load_data
    from hne_edge.train.device import torch_device
    from hne_edge.train.evaluation import predict

    state = load_checkpoint(run_checkpoint)
    history, plan = state["extra"].get("history", []), state["extra"].get("budget")
    config = TrainConfig.from_dict(state["config"])
    out = args.out / CHECKPOINT
    save_release(out, state, extra={"budget": plan, "partial": partial})
    if not args.no_config_file:
        from hne_edge.fileio import atomic_write_text

        atomic_write_text(args.out / CONFIG, config.to_yaml())
    seen = sum(h["train_images"] for h in history)
    record.update({
        "config": state["config"], "plan": plan, "partial": partial, "epochs_completed": state["epoch"],
        "epochs": (plan or {}).get("epochs", state["epoch"]), "images_seen": seen,
        "steps": seen // config.optim.batch_size,
        "throughput": {"images_per_s_mean": seen / max(sum(h["train_seconds"] for h in history), 1e-9),
                       "images_per_s_last_epoch": history[-1]["train_images_per_s"] if history else None,
                       "per_epoch": [round(h["train_images_per_s"], 1) for h in history]},
        "history": [{k: v for k, v in h.items() if k != "val_acc_n"} for h in history],
        "checkpoint": {"file": CHECKPOINT, "bytes": out.stat().st_size, "weights_dtype": "float32",
                       "sha256": hashlib.sha256(out.read_bytes()).hexdigest()},
    })  # fmt: skip
    if not evaluate:
        return
    t0 = time.monotonic()
    device = torch_device(config.device)
    model, saved = model_from_checkpoint(out)
    data = load_data(config.data, seed=config.seed)
    norm = saved["normalization"]
    loader = BatchLoader(data.val, 500, mean=norm["mean"], std=norm["std"], device=device if device.type == "cuda" else None)
    logits, labels = predict(model.to(device), loader, device)
    rows = ensemble_rows(logits, labels, sizes=tuple(range(1, logits.shape[1] + 1)))
    record["data"].update(images=len(data.train) + len(data.val), train_images=len(data.train), validation_images=len(data.val))
    record["held_out"] = rows
    record["accuracy_pct"] = {str(r["n"]): round(100 * r["accuracy"], 2) for r in rows}
    record["seconds"]["evaluate"] = round(time.monotonic() - t0, 1)


if __name__ == "__main__":
    sys.exit(main())
