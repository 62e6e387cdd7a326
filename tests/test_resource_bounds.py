"""Issue 19 section 2: every resource a user controls is bounded (batch range, threads, model size, memory).

Each case was reproduced here before its fix: an export that ran the host out of memory, a thread count
that hung it, a model size that ended in a 200 GB allocation's traceback. The bounds live in one module,
:mod:`hne_edge.limits`.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, edit_manifest, one_line_error, run_cli

FAST_EXPORT = ("--no-verify", "--plan", "segments", "--no-first-leaf", "--no-torch-weights")


# -- the batch range: bounded at export and at read --------------------------------------------------


def test_export_refuses_a_batch_range_past_the_bound_before_writing(tiny_bundle, tmp_path):
    from hne_edge.limits import MAX_BATCH

    proc = run_cli("export", str(tiny_bundle.checkpoint_path), "--out", str(tmp_path / "big"),
                   "--batch-range", "1:200000:200000", *FAST_EXPORT)  # fmt: skip
    one_line_error(proc, "1:200000:200000", f"MAX <= {MAX_BATCH}")
    assert not (tmp_path / "big").exists()
    # the bound itself is accepted by the one rule
    from hne_edge.exporters.base import parse_batch

    assert parse_batch(f"1:1:{MAX_BATCH}") == (1, 1, MAX_BATCH)


def test_a_manifest_declaring_a_huge_batch_range_is_refused_at_read(bundle_copy):
    from hne_edge.bundle import read_manifest
    from hne_edge.errors import BundleError
    from hne_edge.limits import MAX_BATCH

    edit_manifest(bundle_copy, lambda d: d["input"].__setitem__("batch", [1, 200000, 1000000000]))
    with pytest.raises(BundleError, match=rf"input.batch .* max <= {MAX_BATCH}; received \[1, 200000, 1000000000\]"):
        read_manifest(bundle_copy, verify_files=False)
    one_line_error(run_cli("run", str(bundle_copy), str(bundle_copy / "manifest.json")), "input.batch")


def test_activations_the_graphs_do_not_have_are_named_not_taken_for_a_warm_up_too_big(bundle_copy, tmp_path):
    """The warm-up's estimate trusted the manifest's shapes before the graphs were checked against them: "the
    warm-up at batch 1 ... would need about 62914560.0 TB" (advice to re-export with a smaller OPT)."""

    def spoil(d):
        for f in d["files"]:
            if f["plan"] == "segments":
                for t in f["outputs"]:
                    if t["name"] != "logits":
                        t["shape"] = ["batch", 2**40, 1024, 1024]

    edit_manifest(bundle_copy, spoil)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    one_line_error(run_cli("run", str(bundle_copy), str(tmp_path / "x.npy")), "segments/leaf00.onnx",
                   "in the ONNX graph", "the manifest says")  # fmt: skip


def test_the_warm_up_is_checked_against_the_memory_this_machine_has(bundle_copy, monkeypatch):
    """The runner warms up at the bundle's opt batch: it estimates what that holds and refuses what cannot fit."""
    from hne_edge import limits
    from hne_edge.bundle import read_manifest
    from hne_edge.errors import ResourceExhausted
    from hne_edge.runtime import AnytimeRunner, AnytimeSession

    edit_manifest(bundle_copy, lambda d: d["input"].__setitem__("batch", [1, 4096, 4096]))
    per_sample = read_manifest(bundle_copy, verify_files=False).sample_bytes("segments", "fp32")
    assert per_sample > 3 * 16 * 16 * 4  # the image and every activation a pass over the tree outputs
    monkeypatch.setattr(limits, "available_memory", lambda: 4096 * per_sample - 1)

    def never(*args, **kwargs):
        raise AssertionError("the warm-up ran before its memory was checked")

    monkeypatch.setattr(AnytimeSession, "advance", never)
    with pytest.raises(ResourceExhausted, match=r"warm-up at batch 4096 \(the bundle's opt batch\) would need about .* of memory; this machine has"):
        AnytimeRunner(bundle_copy, load_profile=False)
    monkeypatch.setattr(limits, "available_memory", lambda: 4096 * per_sample + 1)
    with pytest.raises(AssertionError, match="the warm-up ran"):  # enough memory: it goes on to warm up
        AnytimeRunner(bundle_copy, load_profile=False)
    with AnytimeRunner(bundle_copy, load_profile=False, warmup=0):  # no warm-up, nothing to check
        pass


def test_an_onnxruntime_allocation_failure_is_resource_exhausted(bundle_copy, tmp_path):
    """A real ONNX Runtime allocation failure (the address space capped with RLIMIT_AS in a child process)."""
    edit_manifest(bundle_copy, lambda d: d["input"].__setitem__("batch", [1, 1, 4096]))
    script = textwrap.dedent(f"""
        import resource, numpy as np
        from hne_edge.errors import ResourceExhausted
        from hne_edge.runtime import AnytimeRunner
        runner = AnytimeRunner({str(bundle_copy)!r}, load_profile=False, warmup=0, threads=1)
        runner.run(np.zeros((1, 3, 16, 16), np.float32))
        x = np.ones((4096, 3, 16, 16), np.float32)  # allocated before the cap
        vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + 48 * 2**20, resource.RLIM_INFINITY))
        try:
            runner.run(x)
        except ResourceExhausted as exc:
            print("ResourceExhausted:", exc)
        """)  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip()
    assert line.startswith("ResourceExhausted: onnx/fp32/segments/leaf00.onnx: ONNX Runtime could not allocate"), line
    assert "batch 4096" in line and "smaller batch" in line
    assert "[E:onnxruntime" not in proc.stderr  # ONNX Runtime's own log stays quiet: the error says it once


# -- threads ------------------------------------------------------------------------------------------


def _documented_threads_per_cpu() -> int:
    """The bound docs/guarantees.md promises ("at most 4 per CPU"), read there: not from the code under test."""
    import re

    found = re.findall(r"at most (\d+) per\s+CPU", (REPO / "docs" / "guarantees.md").read_text())
    assert found, "docs/guarantees.md no longer states the thread bound"
    return int(found[0])


def test_threads_past_the_bound_are_refused_everywhere(tiny_bundle, tmp_path):
    from hne_edge.errors import InputError
    from hne_edge.limits import cpu_count
    from hne_edge.runtime import AnytimeRunner
    from hne_edge.runtime.backends.onnxruntime import OnnxRuntimeBackend
    from hne_edge.train.config import TrainConfig

    top = _documented_threads_per_cpu() * cpu_count()
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    # a hang of minutes (100,000 OS threads) before the bound; the timeout makes that a failure here
    one_line_error(run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "x.npy"), "--threads", "100000",
                           timeout=120), "threads", "100000", f"1..{top}")  # fmt: skip
    one_line_error(run_cli("train", "--threads", "100000", "--epochs", "1", "--out", str(tmp_path / "t"), timeout=120),
                   "threads", "100000", f"0..{top}")  # fmt: skip
    assert not (tmp_path / "t").exists()
    for make in (
        lambda: AnytimeRunner(tiny_bundle.bundle_dir, threads=top + 1, load_profile=False, warmup=0),
        lambda: OnnxRuntimeBackend(threads=top + 1),
        lambda: TrainConfig(threads=top + 1),
    ):
        with pytest.raises(InputError, match=rf"threads: received {top + 1}; expected an int in [01]\.\.{top}"):
            make()
    with AnytimeRunner(tiny_bundle.bundle_dir, threads=top, load_profile=False, warmup=0) as runner:  # the bound is allowed
        assert runner.run(np.zeros((1, 3, 16, 16), np.float32)).leaves == 16


def test_the_torch_backend_takes_the_same_thread_bound(tiny_bundle):
    from hne_edge.errors import InputError
    from hne_edge.limits import cpu_count
    from hne_edge.runtime.backends.torch import TorchBackend

    top = _documented_threads_per_cpu() * cpu_count()
    with pytest.raises(InputError, match=rf"threads: received {top + 1}; expected an int in 1\.\.{top}"):
        TorchBackend(threads=top + 1)


# -- model size -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value, bound",
    [("--num-classes", "100000000", "num_classes"), ("--input-size", "100000", "input_size")],
)
def test_info_refuses_an_absurd_model_size_in_one_line(flag, value, bound):
    from hne_edge import limits

    limit = {"num_classes": limits.MAX_NUM_CLASSES, "input_size": limits.MAX_INPUT_SIZE}[bound]
    one_line_error(run_cli("info", "hne_tiny", flag, value, timeout=120), f"{flag} must be", f"at most {limit}", value)


def test_model_size_bounds_hold_for_the_library_and_for_configs_without_torch():
    from hne_edge.errors import InputError
    from hne_edge.limits import MAX_IN_CHANS, MAX_INPUT_SIZE, MAX_NUM_CLASSES
    from hne_edge.models import create_model
    from hne_edge.train.config import TrainConfig

    for field, value in (("num_classes", MAX_NUM_CLASSES + 1), ("input_size", MAX_INPUT_SIZE + 1),
                         ("in_chans", MAX_IN_CHANS + 1)):  # fmt: skip
        with pytest.raises(InputError, match=rf"{field} must be a positive integer of at most"):
            create_model("hne_tiny", **{field: value})
        with pytest.raises(InputError, match=rf"{field} must be a positive integer of at most"):
            TrainConfig.from_preset("digits", {"model": {"overrides": {field: value}}})


@pytest.mark.parametrize("key, value", [("num_classes", 0), ("num_classes", 2**49), ("input_size", 2**40)])
def test_a_checkpoints_model_config_is_bounded_where_it_is_read(tiny_bundle, tmp_path, key, value):
    """A checkpoint's model_config past the bounds was refused only when the model was built, as "checkpoint
    weights do not fit its model config", naming neither the file nor the field; a manifest's model.config is
    held to the same rule (tests/test_bundle.py)."""
    import torch

    from hne_edge.errors import CheckpointError
    from hne_edge.train.checkpoint import load_checkpoint

    state = torch.load(tiny_bundle.checkpoint_path, weights_only=True)
    state["model_config"][key] = value
    torch.save(state, tmp_path / "odd.pt")
    match = rf"odd\.pt: model_config\.{key} must be a positive integer of at most \d+; received {value}"
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(tmp_path / "odd.pt")
    line = one_line_error(run_cli("eval", str(tmp_path / "odd.pt"), "--no-plots", "--quiet", timeout=300),
                          "odd.pt", f"model_config.{key}", str(value))  # fmt: skip
    assert "weights do not fit" not in line


def test_a_model_is_checked_against_the_memory_this_machine_has_before_it_is_built(monkeypatch):
    """Within the bounds, a big model on a small machine: refused in one line before any weight is allocated."""
    from click.testing import CliRunner

    from hne_edge import cli, limits
    from hne_edge.errors import ResourceExhausted
    from hne_edge.models import create_model, model_config, model_weight_bytes

    weights = model_weight_bytes(model_config("hne_tiny"))
    model = create_model("hne_tiny")
    assert weights == sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    monkeypatch.setattr(limits, "available_memory", lambda: weights - 1)
    with pytest.raises(ResourceExhausted, match=r"hne_tiny's weights would need about .* of memory; this machine has"):
        create_model("hne_tiny")
    result = CliRunner().invoke(cli.main, ["info", "hne_tiny"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: hne_tiny's weights would need about")
    monkeypatch.setattr(limits, "available_memory", lambda: weights)
    assert create_model("hne_tiny").config.name == "hne_tiny"


# -- bench-streams: the replay's size (issue 42, item 5) --------------------------------------------


def test_bench_streams_refuses_a_replay_past_the_bounds_up_front(tiny_bundle):
    """`--fps 1e9 --seconds 0.1` grew to 1.8 GB and ended in a MemoryError traceback; 100,000 `--streams` with
    `--methods runners` opened runners until thread creation failed. Both are refused before any runner opens."""
    from hne_edge.errors import InputError
    from hne_edge.limits import MAX_REPLAY_FRAMES, max_threads
    from hne_edge.runtime.bench import camera_arrivals

    b = str(tiny_bundle.bundle_dir)
    one_line_error(run_cli("bench-streams", b, "--streams", "4", "--fps", "1e9", "--seconds", "0.1", timeout=120),
                   "--streams 4 x --fps 1e+09 x --seconds 0.1", "400,000,000 frames", f"at most {MAX_REPLAY_FRAMES:,}")  # fmt: skip
    one_line_error(run_cli("bench-streams", b, "--streams", "100000", "--fps", "1", "--seconds", "1", "--methods",
                           "runners", timeout=120), "--streams", "100000", f"1..{max_threads()}", "runners")  # fmt: skip
    one_line_error(run_cli("bench-streams", b, "--fps", "1", "--seconds", "0.5", timeout=120),
                   "--fps 1 x --seconds 0.5", "no frame", "at least one")  # fmt: skip
    with pytest.raises(InputError, match=r"streams 2 x fps 1e\+300 x seconds 1e\+300: more than 1e308 frames .* at most"):
        camera_arrivals(2, 1e300, 1e300)
    assert len(camera_arrivals(2, 10.0, 1.0)) == 20  # within the bounds, as before
    for jitter in (math.nan, math.inf, 1e308, -1.0):  # 1e308: an OverflowError from the random jitter
        with pytest.raises(InputError, match=r"jitter_ms: received .*; expected ms from 0 to 60,000"):
            camera_arrivals(2, 10.0, 1.0, jitter_ms=jitter)
    for deadline in (math.nan, math.inf, 0.0):
        with pytest.raises(InputError, match=r"deadline_ms: received .*; expected a finite number of ms > 0"):
            camera_arrivals(2, 10.0, 1.0, deadline_ms=deadline)


def test_a_replay_is_checked_against_the_memory_this_machine_has(monkeypatch):
    from hne_edge import limits
    from hne_edge.errors import ResourceExhausted
    from hne_edge.runtime.bench import camera_arrivals

    monkeypatch.setattr(limits, "available_memory", lambda: 20 * limits.REPLAY_FRAME_BYTES - 1)
    with pytest.raises(ResourceExhausted, match=r"streams 2 x fps 10 x seconds 1: 20 frames' arrivals and records would need"):
        camera_arrivals(2, 10.0, 1.0)
    monkeypatch.setattr(limits, "available_memory", lambda: 20 * limits.REPLAY_FRAME_BYTES)
    assert len(camera_arrivals(2, 10.0, 1.0)) == 20


# -- files a command reads: bounded before they are read (issue 42, item 10) ---------------------------


def _npy_declaring(path, shape, data_bytes):
    """A .npy whose header declares ``shape`` float32 but which holds only ``data_bytes`` of data."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.write(bytes(data_bytes))


def test_a_frame_file_whose_header_declares_more_than_it_holds_is_refused_before_it_is_read(tiny_bundle, tmp_path):
    """A 1 KB .npy declaring 10**9 frames ended in an _ArrayMemoryError traceback (numpy allocates what the header
    says); so did an .npz whose member declares more than the archive holds."""
    import zipfile

    b = str(tiny_bundle.bundle_dir)
    _npy_declaring(tmp_path / "huge.npy", (10**9, 3, 16, 16), 1024)
    one_line_error(run_cli("run", b, str(tmp_path / "huge.npy"), timeout=120),
                   "huge.npy", "(1000000000, 3, 16, 16)", "holds 1.0 KB")  # fmt: skip
    _npy_declaring(tmp_path / "x.npy", (10**9, 3, 16, 16), 1024)
    with zipfile.ZipFile(tmp_path / "huge.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(tmp_path / "x.npy", "x.npy")
    one_line_error(run_cli("run", b, str(tmp_path / "huge.npz"), timeout=120),
                   "huge.npz", "x.npy", "(1000000000, 3, 16, 16)", "holds 1.0 KB")  # fmt: skip
    one_line_error(run_cli("bench", b, "--frames", str(tmp_path / "huge.npz"), "--out", str(tmp_path / "bench"),
                           timeout=120), "huge.npz", "x.npy")  # fmt: skip


def test_a_frame_file_that_is_not_a_regular_file_is_refused_without_waiting(tiny_bundle, tmp_path):
    """A FIFO hung `run` (numpy waits for a writer); a device is read without end."""
    os.mkfifo(tmp_path / "pipe.npy")
    one_line_error(run_cli("run", str(tiny_bundle.bundle_dir), str(tmp_path / "pipe.npy"), timeout=120),
                   "pipe.npy", "a FIFO", "regular file")  # fmt: skip


def test_a_frame_file_is_checked_against_the_memory_this_machine_has(tiny_bundle, tmp_path, monkeypatch):
    """A 30 KB .npz that inflates to 3 MB, on a machine with 1 MB available: refused in one line before it is
    inflated (a 1.2 MB .npz inflating to 1.2 GB was an _ArrayMemoryError traceback)."""
    from click.testing import CliRunner

    from hne_edge import cli, limits

    np.savez_compressed(tmp_path / "bomb.npz", x=np.zeros((1000, 3, 16, 16), np.float32))
    assert (tmp_path / "bomb.npz").stat().st_size < 100_000
    monkeypatch.setattr(limits, "available_memory", lambda: 2**20)
    result = CliRunner().invoke(cli.main, ["run", str(tiny_bundle.bundle_dir), str(tmp_path / "bomb.npz"),
                                           "--max-leaves", "1"])  # fmt: skip
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "bomb.npz" in result.output and "x.npy" in result.output and "(1000, 3, 16, 16)" in result.output
    assert "would need about 2.9 MB of memory; this machine has 1.0 MB available" in result.output
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)
    result = CliRunner().invoke(cli.main, ["run", str(tiny_bundle.bundle_dir), str(tmp_path / "bomb.npz"),
                                           "--max-leaves", "1", "--batch-size", "8", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output


def test_frames_are_normalised_one_at_a_time(tiny_bundle):
    """run and bench --frames normalised a whole uint8 frame file at once: float32 copies 4x its size and more, never
    checked against memory (load_arrays checks the file's own bytes), a MemoryError traceback where it ran out.
    Normalised frame by frame, what Python allocates beside the file stays far below its size."""
    import tracemalloc

    from hne_edge.runtime import AnytimeRunner
    from hne_edge.runtime.bench import level_accuracy
    from hne_edge.runtime.inputs import as_samples, check_frames, frames

    x = np.random.default_rng(0).integers(0, 256, (4000, 16, 16, 3), dtype=np.uint8)  # 3 MB; 12 MB as float32
    with AnytimeRunner(tiny_bundle.bundle_dir, device="cpu", threads=1) as runner:
        spec = runner.input_spec
        tracemalloc.start()
        try:
            samples = as_samples(x, spec)
            check_frames(samples, spec, 8, "x")
            assert sum(count for _, _, count in frames(samples, spec, 8)) == len(x)
            level_accuracy(runner, x, np.zeros(len(x), np.int64), batch_size=8)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    limit = x.nbytes // 4  # the float32 copy of the file would be 4 times its size
    assert peak < limit, peak


def test_an_accuracy_file_is_bounded_before_it_is_read(tiny_bundle, tmp_path):
    """Deep JSON was a RecursionError traceback, /dev/zero was read without end and a FIFO hung; a file past the
    size bound is refused unread (sparse here: nothing is written)."""
    from hne_edge.errors import InputError
    from hne_edge.limits import MAX_JSON_BYTES
    from hne_edge.runtime.streams import read_accuracy

    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(tmp_path / "pipe.json")
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    (tmp_path / "twice.json").write_text('{"anytime": [], "anytime": [{"n": 1, "accuracy": 0.5}]}')
    for name, match in [("deep.json", "nested too deeply"), ("pipe.json", "a FIFO"), ("big.json", "64.0 MB"),
                        ("twice.json", "duplicate key 'anytime'")]:  # fmt: skip
        with pytest.raises(InputError, match=match):
            read_accuracy(tmp_path / name)
    with pytest.raises(InputError, match="/dev/zero: received a character device; expected"):
        read_accuracy("/dev/zero")
    b = str(tiny_bundle.bundle_dir)
    for path, fragment in [(tmp_path / "deep.json", "nested too deeply"), (tmp_path / "pipe.json", "a FIFO"),
                           (Path("/dev/zero"), "a character device")]:  # fmt: skip
        one_line_error(run_cli("bench-streams", b, "--accuracy", str(path), timeout=120), str(path), fragment,
                       "an eval metrics.json")  # fmt: skip


# -- a container's share: its cgroup's CPU quota and memory limit ----------------------------------------------
# A CI container given 4 CPUs' time and 8 GiB on a 64-core, 512 GiB host sees the host in its affinity mask and
# /proc/meminfo; its share is in its cgroup. Fake hierarchies here, as the kernel lays them out.


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")


def test_a_cgroup_v2_quota_and_limit_are_read_from_the_process_cgroup_and_its_ancestors(tmp_path):
    from hne_edge import limits

    root = tmp_path / "cgroup"
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text("0::/ci/job\n")
    _write(root, {"cgroup.controllers": "cpu memory", "memory.max": "max", "cpu.max": "max 100000",
                  "ci/memory.max": str(8 << 30), "ci/cpu.max": "800000 100000",
                  "ci/job/memory.max": "max", "ci/job/cpu.max": "150000 100000"})  # fmt: skip
    assert limits.cgroup_memory_limit(str(root), str(proc)) == 8 << 30  # the parent's binds
    assert limits.cgroup_cpu_limit(str(root), str(proc)) == 2  # 1.5 CPUs' time: 2 threads keep it busy
    _write(root, {"ci/cpu.max": "max 100000", "ci/job/cpu.max": "max 100000", "ci/memory.max": "max"})
    assert limits.cgroup_memory_limit(str(root), str(proc)) is None
    assert limits.cgroup_cpu_limit(str(root), str(proc)) is None
    proc.write_text("0::/../elsewhere\n")  # a cgroup namespace's view of a path outside it: the mount's root
    _write(root, {"memory.max": str(3 << 30), "cpu.max": "400000 100000"})
    assert limits.cgroup_memory_limit(str(root), str(proc)) == 3 << 30
    assert limits.cgroup_cpu_limit(str(root), str(proc)) == 4


def test_a_cgroup_v1_quota_and_limit_are_read_per_controller(tmp_path):
    from hne_edge import limits

    root = tmp_path / "cgroup"
    proc = tmp_path / "proc_self_cgroup"
    # this development machine's layout: v1 controllers, the memory one nested, the v2 hierarchy empty
    proc.write_text("4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n")
    _write(root, {"memory/memory.limit_in_bytes": "9223372036854771712",  # the kernel's "no limit"
                  "memory/process_api/abc/memory.limit_in_bytes": str(6 << 30),
                  "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000", "unified/cgroup.procs": ""})  # fmt: skip
    assert limits.cgroup_memory_limit(str(root), str(proc)) == 6 << 30
    assert limits.cgroup_cpu_limit(str(root), str(proc)) is None
    _write(root, {"memory/process_api/abc/memory.usage_in_bytes": str(5 << 30)})  # what a command may still take
    assert limits.available_memory(str(root), str(proc)) <= 1 << 30
    _write(root, {"cpu/cpu.cfs_quota_us": "300000"})
    assert limits.cgroup_cpu_limit(str(root), str(proc)) == 3
    assert limits.cgroup_cpu_limit(str(tmp_path / "nothing"), str(tmp_path / "no_proc")) is None  # not Linux


def test_a_cpu_quota_lowers_the_cpus_every_thread_bound_counts(monkeypatch):
    from hne_edge import limits

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setattr(limits, "cgroup_cpu_limit", lambda *a: None)
    assert limits.cpu_count() == affinity
    monkeypatch.setattr(limits, "cgroup_cpu_limit", lambda *a: 1)
    assert limits.cpu_count() == 1
    assert limits.max_threads() == _documented_threads_per_cpu()  # the docs' "at most 4 per CPU", on one CPU
    assert f"at most {_documented_threads_per_cpu()} per CPU" in run_cli("run", "--help", check=True).stdout


@pytest.mark.parametrize(("cpus", "gib", "workers"), [(96, 512, 16), (96, 8, 4), (64, 24, 12), (8, None, 8),
                                                      (8, 5, 0), (2, 64, 0), (1, None, 0), (3, 64, 3)])  # fmt: skip
def test_make_test_runs_a_worker_per_cpu_at_most_16_and_one_per_2_gib(monkeypatch, cpus, gib, workers):
    """`make test`'s JOBS: none (one process) where the rule leaves 2 or fewer."""
    from hne_edge import limits

    monkeypatch.setattr(limits, "total_memory", lambda: None)  # the machine's, where the case leaves it unknown
    assert limits.suite_workers(cpus=cpus, memory=None if gib is None else gib << 30) == workers
