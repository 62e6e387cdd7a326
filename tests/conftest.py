"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import traceback
from pathlib import Path
from typing import Any, NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Under pytest-xdist (`make test` on more than 2 CPUs) the workers and the commands they start share the cores:
# each gets its share of torch / OpenMP threads (before torch is imported), or N workers of N threads each
# oversubscribe the machine and crawl. An OMP_NUM_THREADS set by the caller is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    from hne_edge.limits import cpu_count

    os.environ["OMP_NUM_THREADS"] = str(max(1, cpu_count() // _WORKERS))


# -- a failing test ends; it never hangs the run (issue 42) ----------------------------------------------------
# pytest-timeout limits every test (pyproject.toml: `timeout`; the longest end-to-end tests raise theirs with
# @pytest.mark.timeout). A thread a test leaves running would keep the interpreter alive after the last test (it
# joins every non-daemon thread at exit): each test must join its threads or make them daemon, and a run that still
# has one at its end exits anyway, naming it.
@pytest.fixture(autouse=True)
def _no_thread_left_running():
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and not t.daemon]
    for t in left:
        t.join(5)
    left = [t.name for t in left if t.is_alive()]
    if left:
        pytest.fail(f"the test left non-daemon thread(s) {left} running; expected it to join them or make them daemon "
                    "(a thread alive at exit keeps the test run from ending)")  # fmt: skip


def pytest_sessionfinish(session, exitstatus):
    session.config._hne_exitstatus = int(exitstatus)


def pytest_unconfigure(config):
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        frames = sys._current_frames()
        for t in left:
            print(f"\nnon-daemon thread {t.name!r} still running at the end of the run:", file=sys.stderr)
            traceback.print_stack(frames.get(t.ident), file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(getattr(config, "_hne_exitstatus", 0) or 1)


def randomize_(model, seed: int = 0):
    """Give a model non-trivial BatchNorm statistics/affines and O(1) logits (eval-mode tests).

    Fresh BatchNorm layers are the identity in eval mode, which would hide
    slicing bugs in running statistics; default classifier init gives tiny
    logits, which would make absolute tolerances meaningless.
    """
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
            elif isinstance(m, nn.Conv2d) and m.bias is not None:
                fan_in = m.in_channels // m.groups
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / fan_in**0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model.eval()


def blocking_env(tmp_path: Path, *packages: str) -> dict[str, str]:
    """Environment for a subprocess in which importing ``packages`` fails (edge devices lack torch).

    Writes a ``sitecustomize.py`` into ``tmp_path`` that installs a meta-path
    finder refusing those top-level packages, and puts it first on PYTHONPATH.
    """
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {tuple(packages)!r}:\n"
        "            raise ModuleNotFoundError(name + ' is blocked: edge devices do not carry it', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}


def breaking_env(tmp_path: Path, package: str, error: str) -> dict[str, str]:
    """Environment for a subprocess in which importing ``package`` raises ``error`` (Python source of an exception,
    e.g. ``OSError('libtorch_cpu.so: cannot open shared object file')``): an installed package that is broken."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Break:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {package!r}:\n"
        f"            raise {error}\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Break())\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path) -> Path:
    """A private copy of tiny_bundle's bundle, for tests that edit it or let a runner write profiles into it."""
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.bundle_dir, bundle)
    return bundle


def edit_manifest(bundle: Path, edit) -> None:
    """Apply ``edit`` to the parsed manifest.json of ``bundle`` and write it back (hashes untouched)."""
    import json

    data = json.loads((bundle / "manifest.json").read_text())
    edit(data)
    (bundle / "manifest.json").write_text(json.dumps(data))


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed) -> a file's sha256, a link's target, or 'dir'.

    Equal digests before and after a command: it deleted, added and changed nothing there.
    """
    import hashlib

    found: dict[str, str] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(here) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                found[rel] = "link -> " + os.readlink(p)
            elif p.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


def dead_writers_scratch(target: Path, kind: str = "tmp") -> Path:
    """The name a writer that has since exited gave its scratch sibling of ``target`` (``fileio.scratch_path``, run
    in a process that is gone): what a killed writer leaves behind. The path is returned, not created.

    Its pid is one no process can have (Linux's largest pid_max is 2**22): a real exited writer's pid is reused by a
    later process or thread within minutes on a busy machine (pytest-xdist workers), which would keep the scratch."""
    code = "import os, sys; from pathlib import Path; from hne_edge.fileio import scratch_path; " \
           "os.getpid = lambda: 2**22 + 1; print(scratch_path(Path(sys.argv[1]), sys.argv[2]))"  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(target), kind], capture_output=True, text=True, check=True,
                          cwd=REPO, timeout=120)  # fmt: skip
    return Path(proc.stdout.strip())


# `train` and `eval` default to --device auto: a GPU where there is one, at its own batch (512), in bfloat16 and with
# TF32. The suite's training and evaluation tests read CPU runs (bit-exact resumes, step counts, "on cpu" in a line,
# accuracies against a float64 model), so they say --device cpu and pass on a GPU machine too; the GPU paths have
# tests of their own (marked gpu, or skipped without CUDA).
CPU_DEVICE = ("--device", "cpu")


def digits_npz(path: Path, *, keep=None, labels=None, classes=None, upsample: int = 1, order_seed=None) -> Path:
    """scikit-learn's digits as an npz (x: N,8,8,1 uint8, y, and ``classes`` when given): ``keep`` the digits kept,
    ``labels`` how they are numbered in the file (default: the digit), ``upsample`` each side repeated, the images
    in another order with ``order_seed``."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    y = digits.target
    if order_seed is not None:
        order = np.random.default_rng(order_seed).permutation(len(y))
        x, y = x[order], y[order]
    if keep is not None:
        mask = np.isin(y, keep)
        x, y = x[mask], y[mask]
        if labels is not None:
            y = np.array([labels[keep.index(v)] for v in y])
    arrays = {"x": x.repeat(upsample, axis=1).repeat(upsample, axis=2), "y": y}
    if classes is not None:
        arrays["classes"] = np.array(classes)
    np.savez(path, **arrays)
    return path


def run_cli(*args: str, check: bool = False, env: dict | None = None, cwd: Path | None = None, timeout: float = 600):
    """Run ``hne-edge`` in a subprocess (what users do) and return the CompletedProcess."""
    proc = subprocess.run(
        [sys.executable, "-m", "hne_edge", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"hne-edge {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


# a Progress line ("export: 3/16 files (19%), ..."; "eval: 4 images, ..."): hne_edge/progress.py's format
PROGRESS_LINE = re.compile(r"^[\w-]+: \d+(/\d+)? \w")


def one_line_error(proc, *fragments: str, after_progress: bool = False) -> str:
    """The CLI's failure contract: exit 2, the error in one line ("Error: ..."), no traceback; returns it.

    ``after_progress``: the failure came mid-work, so Progress lines may precede the error (nothing else may).
    """
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    before, error = lines[:-1], lines[-1] if lines else ""
    if after_progress:
        before = [line for line in before if not PROGRESS_LINE.match(line)]
    assert not before and error.startswith("Error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in error, (fragment, error)
    return error


def clone_working_tree(repo: Path, dest: Path) -> Path:
    """A fresh ``git clone`` of ``repo`` at ``dest`` holding its working tree as it would be committed: tracked
    changes and new files git does not ignore, nothing ignored (no .venv, runs/, build outputs). On a clean
    checkout (CI) that is exactly HEAD. Skips the test where git is not installed, or ``repo`` is not a git
    checkout (a source archive)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed here")
    inside = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if inside.returncode != 0 or Path(inside.stdout.strip()).resolve() != repo.resolve():
        pytest.skip(f"{repo} is not a git checkout (a source archive?): nothing to clone")

    def git(*args: str, cwd: Path = dest) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=300)

    git("clone", "--quiet", "--no-checkout", str(repo), str(dest), cwd=dest.parent)
    git(f"--work-tree={repo}", "add", "--all")  # the clone's index := repo's working tree (its .gitignore applies)
    git("checkout-index", "--all")
    return dest


@pytest.fixture
def shared_cifar10() -> Path:
    path = SHARED_DATA / "cifar10_train.npz"
    if not path.exists():
        pytest.skip(f"real data not present: {path} (the ../shared folder is absent on this machine)")
    return path


class TinyBundle(NamedTuple):
    """An exported hne_tiny bundle shared by the whole session (treat it as read-only)."""

    bundle_dir: Path  # ONNX fp32, plans nodes + segments, batch (1, 1, 8), torch/model.pt
    model: Any  # the randomized fused hne_tiny model it was exported from (eval mode)
    checkpoint_path: Path  # a checkpoint of that model (class names "c0".."c9", non-trivial normalization)


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> TinyBundle:
    """Export a randomized hne_tiny once per session: plan both, fp32, batch 1:1:8, with torch weights."""
    import torch

    from hne_edge.exporters import export_onnx
    from hne_edge.models import create_model
    from hne_edge.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = randomize_(create_model("hne_tiny"))
    root = tmp_path_factory.mktemp("tiny_bundle")
    class_names = [f"c{i}" for i in range(model.config.num_classes)]
    normalization = {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26]}
    checkpoint = save_checkpoint(root / "tiny.pt", model=model, class_names=class_names, normalization=normalization)
    bundle = export_onnx(
        model,
        root / "bundle",
        class_names=class_names,
        normalization=normalization,
        precisions=("fp32",),
        plan="both",
        batch=(1, 1, 8),
        torch_weights=True,
    )
    return TinyBundle(bundle_dir=bundle, model=model, checkpoint_path=checkpoint)


@pytest.fixture(scope="module")
def reference64(tiny_bundle):
    """A fixed input batch and the float64 fused model's leaf logits on it: the independent reference."""
    import copy

    import numpy as np
    import torch

    x = np.random.default_rng(3).standard_normal((3, 3, 16, 16)).astype(np.float32)
    model = copy.deepcopy(tiny_bundle.model).double().eval()
    with torch.no_grad():
        ref = model(torch.from_numpy(x).double()).numpy()  # (B, N, classes)
    return x, ref


@pytest.fixture(scope="session")
def steps_bundle(tiny_bundle, tmp_path_factory) -> Path:
    """tiny_bundle's model exported for steps of several leaves: plans segments, subtrees and fused (what
    ``plan="mixed"`` runs), fp32 and fp16, the first-leaf file and torch weights; verified at export."""
    from hne_edge.exporters import export_onnx

    return export_onnx(
        tiny_bundle.model,
        tmp_path_factory.mktemp("steps_bundle") / "bundle",
        class_names=[f"c{i}" for i in range(tiny_bundle.model.config.num_classes)],
        precisions=("fp32", "fp16"),
        plan="segments,subtrees,fused",
        batch=(1, 1, 8),
    )
@pytest.fixture
def fake_torch_cuda(monkeypatch):
    """TorchCudaBackend builds FakeTorchCuda devices (CPU tensors) and skips the CUDA check; yields them."""
    import hne_edge.runtime.backends.torch_cuda as tc
    from runtime_fakes import FakeTorchCuda

    devices = []

    def make(device_id=0):
        devices.append(FakeTorchCuda(device_id))
        return devices[-1]

    monkeypatch.setattr(tc, "require_cuda", lambda backend, device_id, torch: None)
    monkeypatch.setattr(tc, "TorchCuda", make)
    return devices


@pytest.fixture
def fake_gpu(monkeypatch, fake_torch_cuda):
    """Every GPU backend runs on the CPU: torch CUDA on CPU tensors (``fake_torch_cuda``), ONNX Runtime CUDA on
    CPU OrtValues, TensorRT on engines that are their ONNX files (runtime_fakes.run_gpu_backends_on_fakes);
    returns the fake TensorRT."""
    from runtime_fakes import run_gpu_backends_on_fakes

    return run_gpu_backends_on_fakes(monkeypatch)


@pytest.fixture(scope="session")
def every_file_bundle(tmp_path_factory) -> Path:
    """A bundle with every kind of file a bundle can hold: every plan (``plan="all"``) in fp32 and fp16, the
    first-leaf files, the torch weights, and a TensorRT engine for each ONNX file (built by the real exporter on
    the fake TensorRT of runtime_fakes, so the GPU backends load them through the fakes). Read-only.

    The model is a randomized hne_tiny, slimmer, with a 4-leaf tree of 9 nodes (branching 1, 1, 1, 2, 2): its
    subtrees plan has units of one and of two leaves, and a test that loads each file in turn stays short."""
    import torch

    from runtime_fakes import run_gpu_backends_on_fakes

    from hne_edge.exporters import export_onnx
    from hne_edge.exporters.tensorrt import build_engines
    from hne_edge.models import create_model

    torch.manual_seed(0)
    model = randomize_(create_model("hne_tiny", tree=(1, 1, 1, 2, 2), stem_channels=(4, 8),
                                    blocks=((8, 1, 1), (8, 1, 1), (16, 2, 1), (16, 1, 1), (16, 1, 1))))  # fmt: skip
    bundle = export_onnx(
        model,
        tmp_path_factory.mktemp("every_file_bundle") / "bundle",
        class_names=[f"c{i}" for i in range(model.config.num_classes)],
        precisions=("fp32", "fp16"),
        plan="all",
        batch=(1, 1, 8),
        verify=False,  # what is checked here is the files' integrity, not their numerics (tested elsewhere)
        torch_weights=True,
    )
    with pytest.MonkeyPatch.context() as mp:
        run_gpu_backends_on_fakes(mp)
        build_engines(bundle)
    return bundle


def without_scripts_on_path() -> str:
    """PATH without this interpreter's scripts folder: `hne-edge` is found only if a command activates .venv."""
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != scripts)


def run_all(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run, but a timeout stops every process the command started, not only the first (make's and
    bash's children would run on, on a shared machine)."""
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"{' '.join(args)} ran past {timeout:.0f} s:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


class DemoRun(NamedTuple):
    """One digits demo, run as a newcomer runs it (see :func:`digits_demo`)."""

    root: Path  # where it ran: a fresh clone of this checkout (make demo), or an empty folder (hne-edge demo)
    proc: subprocess.CompletedProcess
    env: dict[str, str]  # the environment it ran in (the quickstart goes on in it)
    by_make: bool  # True: `make demo` in a clone that reuses this virtualenv


@pytest.fixture(scope="session")
def digits_demo(tmp_path_factory) -> DemoRun:
    """The default demo on digits, run once per session and shared (it is the suite's longest command):
    test_demo.py checks its output, test_quickstart.py goes on with the README's quickstart in the same folder
    (both marked ``xdist_group("digits_demo")``: one worker runs them, so the demo runs once there too).

    `make demo VENV=<this virtualenv> INSTALL=no` in a fresh clone of this checkout (nothing ignored in it; not
    beside ../shared, so ``--data auto`` picks digits), with `hne-edge` off the PATH as after a real `make demo`;
    where there is no virtualenv, make, bash or git checkout, `hne-edge demo` in an empty folder. One torch thread:
    on a shared, loaded machine two threads wait for each other (this changes how hard the commands compete for
    the cores, not the commands)."""
    root = tmp_path_factory.mktemp("demo") / "hne-edge"
    venv = Path(sys.prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "MAKEFLAGS", "MFLAGS")}
    env.update(PATH=without_scripts_on_path(), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    by_make = venv != Path(sys.base_prefix) and (venv / "bin" / "activate").is_file() and all(
        shutil.which(tool) for tool in ("make", "bash", "git"))  # fmt: skip
    if by_make:
        try:
            clone_working_tree(REPO, root)
        except pytest.skip.Exception:  # not a git checkout: no clone to run make in
            by_make = False
    if by_make:
        (root / ".venv").symlink_to(venv, target_is_directory=True)  # the README's commands start from .venv
        # `hne-edge` (a script of that virtualenv) must import the clone's package, not the checkout the
        # virtualenv was installed from; `make` and `python -` in the clone's root do so anyway
        env["PYTHONPATH"] = str(root)
        proc = run_all(["make", "demo", f"VENV={venv}", "INSTALL=no"], cwd=root, env=env, timeout=3600)
    else:
        root.mkdir(parents=True)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # this checkout's package
        proc = run_all([sys.executable, "-m", "hne_edge", "demo"], cwd=root, env=env, timeout=3600)
    return DemoRun(root, proc, env, by_make)
