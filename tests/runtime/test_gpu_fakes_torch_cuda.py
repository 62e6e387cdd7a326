"""The torch CUDA backend on the CPU (the rest of the GPU backends' fakes: tests/runtime/test_gpu_fakes.py): its runner
on a fake device (CPU tensors), CUDA graphs per unit and batch size, the TF32 / fp32 precision policy.
"""

from __future__ import annotations

import contextlib
import threading
import types

import numpy as np
import pytest

from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.backends import create_backend

from runtime_fakes import every_stop_twice_and_an_interleaved_session  # noqa: E402

FP32 = dict(rtol=1e-4, atol=1e-4)
FP16 = dict(rtol=1e-2, atol=3e-2)  # fp16 end to end vs the fp32 (or float64) fused model, O(1) logits


# -- the torch CUDA backend's logic on a fake device (CPU tensors) ---------------------------------


def _count_calls(runner, dev):
    """{phase: module calls} for every unit module of ``runner`` (eager, capture, replay)."""
    counts = {"eager": 0, "capture": 0, "replay": 0}
    for r in runner._runners:
        r.module.register_forward_pre_hook(lambda m, a: counts.__setitem__(dev.phase, counts[dev.phase] + 1))
    return counts


@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_torch_cuda_runner_logic_on_a_fake_device(tiny_bundle, reference64, fake_torch_cuda, plan, cuda_graph, precision):
    """The real TorchCudaBackend / Runner on CPU tensors: fp16 from fp32 weights, channels-last, graphs by
    default (every capture size captured at construction, replayed from the first frame whatever its rows), every
    prefix vs the float64 model."""
    import torch

    x, ref = reference64
    tol = FP16 if precision == "fp16" else FP32
    options = {} if cuda_graph else {"cuda_graph": False}  # graphs are the default
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", plan=plan, precision=precision,
                       load_profile=False, **options) as runner:  # fmt: skip
        (dev,) = fake_torch_cuda
        n_units = len(runner._runners)
        info = runner.backend.describe()
        assert info["cuda_graph"] is cuda_graph and info["allow_tf32"] is False and info["gpu"].startswith("FakeGPU")
        want = torch.float16 if precision == "fp16" else torch.float32
        for r in runner._runners:
            assert {p.dtype for p in r.module.parameters()} == {want}
            assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in r.module.modules())
            convs = [m for m in r.module.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
            assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
        # the construction warm-up ran each unit at each capture size (1, 2, 4, 8 of the bundle's 1..8) once,
        # eagerly, captured it and launched the new graph once (a graph's first launch uploads it: not in a frame)
        sizes = len(runner.backend.capture_sizes) if cuda_graph else 0
        assert runner.warmup_report["batch_sizes"] == ([1, 2, 4, 8] if cuda_graph else [1])
        assert dev.captures == dev.replays == n_units * sizes
        counts = _count_calls(runner, dev)
        r1 = runner.run(x[:1])  # the first real frame: replays only
        np.testing.assert_allclose(r1.logits, ref[:1].mean(1), **tol)
        assert counts == ({"eager": 0, "capture": 0, "replay": n_units} if cuda_graph else {"eager": n_units, "capture": 0, "replay": 0})
        # 3 rows: the 4-row graph replays, its first 3 rows copied out - from the first frame, never eagerly
        for n in range(1, runner.num_leaves + 1):
            for k in range(2):
                r = runner.run(x, max_leaves=n)
                np.testing.assert_allclose(r.logits, ref[:, :n].mean(1), **tol)
                assert r.logits.dtype == np.float32
        assert counts["eager"] == (0 if cuda_graph else counts["eager"]) and counts["capture"] == 0
        # a paused session holds its own copies of its outputs while frames of the same batch size replay, then resumes
        s = runner.start(x)
        s.step()
        other = runner.run(x[::-1].copy())
        np.testing.assert_allclose(other.logits, ref[::-1].mean(1), **tol)
        while s.step():
            pass
        np.testing.assert_allclose(s.result().leaf_logits, ref.transpose(1, 0, 2), **tol)
        if cuda_graph:  # nothing captured or run eagerly while serving: every call a replay
            assert dev.captures == n_units * sizes and counts["eager"] == 0 and counts["capture"] == 0
        prof = runner.profile(batch_sizes=(3,), warmup=0, repeats=1, save=False)
        assert all(u["median_ms"] == 1.0 for u in prof.batches[3]["units"].values())  # the fake's CUDA events


@pytest.mark.parametrize("plan", ["subtrees", "fused", "mixed"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_torch_cuda_graph_per_unit_and_batch_size_for_steps_of_several_leaves(steps_bundle, reference64, fake_torch_cuda,
                                                                             plan, cuda_graph):  # fmt: skip
    """Plans subtrees / fused / mixed on the torch CUDA backend (fake device): the construction warm-up runs every
    route at every capture size, so every unit (the mixed runner's subtrees and tree too) is captured once per
    capture size and real frames of any rows replay; every stop against the float64 model."""
    x, ref = reference64
    options = {} if cuda_graph else {"cuda_graph": False}
    with AnytimeRunner(steps_bundle, backend="torch", device="cuda", plan=plan, load_profile=False, **options) as runner:
        (dev,) = fake_torch_cuda
        n_units = len(runner._runners)
        sizes = len(runner.backend.capture_sizes) if cuda_graph else 0
        assert dev.captures == n_units * sizes  # every capture size at construction, every route
        counts = _count_calls(runner, dev)
        for n in runner.stops:
            np.testing.assert_allclose(runner.run(x[:1], max_leaves=n).logits, ref[:1, :n].mean(1), **FP32)
        if cuda_graph:
            assert counts["eager"] == 0 and counts["replay"] > 0  # batch 1: replays only
        every_stop_twice_and_an_interleaved_session(runner, x, ref)
        if cuda_graph:  # batch 3 replayed the 4-row graphs: nothing captured, nothing eager
            assert dev.captures == n_units * sizes and counts["eager"] == 0


def test_a_warm_up_of_more_sizes_than_max_graphs_keeps_every_one(tiny_bundle, reference64, fake_torch_cuda):
    """Six capture sizes against 4 graphs kept per unit (a bundle's batch range up to 16 has five: 1, 2, 4, 8, 16):
    the warm-up keeps all six - the bound once dropped the first sizes captured, batch 1's among them, before the
    warm-up pinned what was left, and every frame of one row then ran eagerly and captured again while serving."""
    x, ref = reference64
    with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", plan="segments", load_profile=False,
                       capture_sizes=(1, 2, 3, 4, 6, 8), max_graphs=4) as runner:  # fmt: skip
        (dev,) = fake_torch_cuda
        n_units = len(runner._runners)
        assert all(sorted(k[0] for k in r._graphs.graphs) == [1, 2, 3, 4, 6, 8] for r in runner._runners)
        assert dev.captures == 6 * n_units
        counts = _count_calls(runner, dev)
        for rows in range(1, 9):  # every row count replays a graph captured at open
            np.testing.assert_allclose(runner.run(x[:rows]).logits, ref[:rows].mean(1), **FP32)
        assert counts["eager"] == counts["capture"] == 0 and dev.captures == 6 * n_units


def test_the_graph_cache_holds_everything_between_hold_and_pin_then_bounds_the_rest():
    from hne_edge.runtime.backends.cuda import GraphCache

    cache = GraphCache(lambda key: (lambda: key), max_graphs=2)
    cache.hold()
    for key in range(6):
        cache.get(key)
    assert list(cache.graphs) == [0, 1, 2, 3, 4, 5]  # a warm-up of 6 sizes: none dropped
    cache.pin()
    for key in (10, 11, 12, 10, 13):  # shapes never warmed: at most 2 of them, the least recently used dropped
        cache.get(key)
    assert list(cache.graphs) == [0, 1, 2, 3, 4, 5, 10, 13] and cache.captures == 11  # 10 again: dropped at 12


def _tf32_flags():
    import torch

    b = torch.backends
    return (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.benchmark)  # matmul: never touched


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_torch_cuda_tf32_policy_is_scoped_to_the_backends_calls(tiny_bundle, fake_torch_cuda, allow_tf32):
    """Inside every unit call (eager and capture): TF32 off for convolutions unless allow_tf32, cudnn.benchmark
    on, matmul as the user set it; outside: exactly the user's process-wide settings, whatever they were."""
    import torch

    saved = _tf32_flags()
    try:
        torch.backends.cudnn.conv.fp32_precision = "tf32"  # the user's choices, to be left alone
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.benchmark = False
        user = _tf32_flags()
        seen = set()
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", allow_tf32=allow_tf32,
                           load_profile=False, warmup=0) as runner:  # fmt: skip
            (dev,) = fake_torch_cuda

            def record(module, args):  # a replay runs captured kernels: torch's flags play no part in it
                if dev.phase != "replay":
                    seen.add((dev.phase, *_tf32_flags()))

            for r in runner._runners:
                r.module.register_forward_pre_hook(record)
            x = np.zeros((2, 3, 16, 16), np.float32)
            runner.run(x)  # eager + capture
            assert _tf32_flags() == user
            runner.run(x)  # replays (no flags needed: the kernels were chosen at capture)
            assert _tf32_flags() == user
        mode = "tf32" if allow_tf32 else "ieee"
        assert seen == {("eager", mode, "tf32", True), ("capture", mode, "tf32", True)}
        torch.backends.cudnn.conv.fp32_precision = "ieee"  # the user changes their mind: still theirs afterwards
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", cudnn_benchmark=None,
                           cuda_graph=False, load_profile=False, warmup=0) as runner:  # fmt: skip
            runner.run(x)
            assert _tf32_flags() == ("ieee", "tf32", False)
    finally:
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.benchmark = saved


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_the_bmm_lever_computes_its_matmuls_as_the_convolutions(tiny_bundle, reference64, fake_torch_cuda, allow_tf32):
    """pointwise="bmm" runs the 1x1 convolutions as torch.bmm, which follows matmul's TF32 flag, not cuDNN's: with
    the user's matmul in TF32 the lever computed them in TF32 (and the 1e-4 check would have failed on a GPU for
    the lever, not for the function). Inside its calls matmul follows allow_tf32; outside it is the user's."""
    import torch

    saved = _tf32_flags()
    x, ref = reference64
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"  # the user's
        seen = set()
        with AnytimeRunner(tiny_bundle.bundle_dir, backend="torch", device="cuda", pointwise="bmm",
                           allow_tf32=allow_tf32, load_profile=False, warmup=0) as runner:  # fmt: skip
            (dev,) = fake_torch_cuda
            for r in runner._runners:
                r.module.register_forward_pre_hook(lambda m, a: seen.add(_tf32_flags()[:2]) if dev.phase != "replay" else None)
            np.testing.assert_allclose(runner.run(x).logits, ref.mean(1), **FP32)
            assert _tf32_flags()[1] == "tf32"
        mode = "tf32" if allow_tf32 else "ieee"
        assert seen == {(mode, mode)}
    finally:
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.benchmark = saved


def test_fp32_policy_on_a_torch_without_the_fp32_precision_api():
    """torch < 2.9 has only the allow_tf32 flags: the policy sets and restores those (nested entries too)."""
    from hne_edge.runtime.backends.torch_cuda import Fp32Policy

    cudnn = types.SimpleNamespace(allow_tf32=True, benchmark=False)
    fake = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=cudnn))
    policy = Fp32Policy(fake, allow_tf32=False, cudnn_benchmark=True)
    with policy:
        assert (cudnn.allow_tf32, cudnn.benchmark) == (False, True)
        with policy:
            pass
        assert (cudnn.allow_tf32, cudnn.benchmark) == (False, True)
    assert (cudnn.allow_tf32, cudnn.benchmark) == (True, False)
    cudnn.allow_tf32 = False
    with Fp32Policy(fake, allow_tf32=True, cudnn_benchmark=None):
        assert (cudnn.allow_tf32, cudnn.benchmark) == (True, False)
    assert (cudnn.allow_tf32, cudnn.benchmark) == (False, False)
    matmul = types.SimpleNamespace(allow_tf32=True)  # the bmm lever's matmuls, on the legacy flag too
    fake.backends.cuda = types.SimpleNamespace(matmul=matmul)
    with Fp32Policy(fake, allow_tf32=False, matmul=True):
        assert (cudnn.allow_tf32, matmul.allow_tf32) == (False, False)
    assert matmul.allow_tf32 is True


def test_fp32_policy_holds_across_threads_that_enter_and_leave_in_any_order():
    """torch's flags are the process's: runners serving in two threads (A enters, B enters, A leaves, B runs on)
    must not leave B running on the user's TF32 that A put back, nor end with A's flags. Where they ask differently
    at once, fp32 wins over TF32 and autotuning is on if one asks."""
    from hne_edge.runtime.backends.torch_cuda import Fp32Policy

    conv = types.SimpleNamespace(fp32_precision="tf32")  # the user's: TF32, no autotuning
    cudnn = types.SimpleNamespace(conv=conv, benchmark=False)
    fake = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=cudnn))
    a_entered, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, tuple] = {}

    def runner_a() -> None:
        with Fp32Policy(fake, allow_tf32=False, cudnn_benchmark=True):
            a_entered.set()
            b_entered.wait(5)
        a_left.set()

    def runner_b() -> None:
        a_entered.wait(5)
        with Fp32Policy(fake, allow_tf32=False, cudnn_benchmark=True):
            b_entered.set()
            a_left.wait(5)
            seen["b after a left"] = (conv.fp32_precision, cudnn.benchmark)

    threads = [threading.Thread(target=runner_a), threading.Thread(target=runner_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"b after a left": ("ieee", True)}
    assert (conv.fp32_precision, cudnn.benchmark) == ("tf32", False)  # the user's, once both left

    tf32_runner, fp32_runner = Fp32Policy(fake, allow_tf32=True, cudnn_benchmark=None), Fp32Policy(fake)
    conv.fp32_precision = "ieee"
    with tf32_runner:
        assert conv.fp32_precision == "tf32"
        with fp32_runner:  # held at once (another thread's call): fp32 wins
            assert (conv.fp32_precision, cudnn.benchmark) == ("ieee", True)
        assert (conv.fp32_precision, cudnn.benchmark) == ("tf32", False)
    assert conv.fp32_precision == "ieee"


def test_torch_cuda_captures_one_at_a_time_and_never_stops_other_threads_work():
    """torch.cuda.graph's default mode, "global", makes every other thread's potentially unsafe CUDA call fail while a
    capture is underway (a user's torch work, another runner's allocation), and torch allows one capture at a time in
    a process. Modelled on a stand-in torch as CUDA behaves: two runners opening in two threads while a third thread
    allocates; captures never overlap and the allocation never fails."""
    import time

    from hne_edge.runtime.backends.cuda import TorchCuda

    underway: list[tuple[int, str]] = []  # (thread, mode) of the captures in progress
    errors: list[str] = []
    inside, allocated = threading.Event(), threading.Event()

    class Graph:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global") -> None:
            self.mode = capture_error_mode

        def __enter__(self):
            if underway:
                errors.append("two captures at once")
            underway.append((threading.get_ident(), self.mode))
            inside.set()

        def __exit__(self, *exc):
            underway.pop()

    def empty(*shape, **kw) -> None:  # an allocation in another thread: fails under a global-mode capture
        if any(t != threading.get_ident() and mode == "global" for t, mode in underway):
            errors.append("operation not permitted when stream is capturing")

    stream = types.SimpleNamespace(synchronize=lambda: None)
    cuda = types.SimpleNamespace(CUDAGraph=object, graph_pool_handle=object, graph=Graph,
                                 stream=lambda s: contextlib.nullcontext())
    fake = types.SimpleNamespace(cuda=cuda, empty=empty)

    def open_runner() -> None:
        dev = TorchCuda.__new__(TorchCuda)
        dev.torch, dev.stream, dev._pool = fake, stream, None
        dev.capture(lambda: (allocated.wait(5), time.sleep(0.05)))  # long enough to meet the others

    def user_work() -> None:
        inside.wait(5)
        fake.empty(16)
        allocated.set()

    threads = [threading.Thread(target=f) for f in (open_runner, open_runner, user_work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []


@pytest.mark.parametrize("options, message", [
    (dict(graph_warmup=0), r"graph_warmup: received 0; expected an int >= 1"),
    (dict(capture_sizes=[0, 2]), r"capture_sizes: received \[0, 2\]; expected batch sizes \(ints >= 1\)"),
    (dict(max_graphs=0), r"max_graphs: received 0; expected an int >= 1"),
    (dict(cuda_graph="false"), r"cuda_graph: received 'false'; expected True or False"),  # bool("false") is True
    (dict(allow_tf32="no"), r"allow_tf32: received 'no'; expected True or False"),
    (dict(fold_batchnorm=0), r"fold_batchnorm: received 0; expected True or False"),
    (dict(channels_last="false"), r"channels_last: received 'false'; expected True or False"),
])  # fmt: skip
def test_torch_cuda_refuses_bad_options_as_input_errors_naming_them(fake_torch_cuda, options, message):
    from hne_edge.errors import InputError

    with pytest.raises(InputError, match=message):
        create_backend("torch", device="cuda", **options)
