"""What this machine has: Python and the libraries hne-edge uses, each GPU, the CPU and its ISA features.

Nothing here fails: a library that is missing or does not import, a GPU tool that is absent, a
``/proc/cpuinfo`` that does not exist (macOS, Windows) are recorded as such. Imports without numpy (a
numpy that does not import is recorded too; the CUDA probe, which needs the runtime, is then skipped);
torch, onnxruntime, cuda-python and TensorRT are imported only to read their versions and devices.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..limits import cpu_count
from ..tensorrt_compat import device_support, import_cudart, normalize_compute_capability

if TYPE_CHECKING:  # pragma: no cover - the runtime package needs numpy, and a broken numpy is a row of this report
    from ..runtime.backends.cuda import CudaProbe

__all__ = ["Library", "Gpu", "Cpu", "Environment", "collect_environment", "cpu_info", "list_gpus", "ISA_FEATURES"]

# The CPU features that decide which ONNX Runtime / PyTorch kernels run: the name shown -> the /proc/cpuinfo
# flags that mean it (any of them). x86 ("flags"), then Arm ("Features").
ISA_FEATURES = {
    "x86_64": {
        "AVX2": ("avx2",),
        "FMA": ("fma",),
        "AVX-512": ("avx512f",),
        "AVX-512 VNNI": ("avx512_vnni", "avx512vnni"),
        "AVX-VNNI": ("avx_vnni",),
        "AVX-512 BF16": ("avx512_bf16",),
        "AMX": ("amx_tile",),
        "AMX-BF16": ("amx_bf16",),
        "AMX-INT8": ("amx_int8",),
    },
    "arm": {
        "NEON": ("asimd", "neon"),
        "FP16 arithmetic": ("asimdhp", "fphp"),
        "dot product": ("asimddp",),
        "I8MM": ("i8mm",),
        "BF16": ("bf16",),
        "SVE": ("sve",),
        "SVE2": ("sve2",),
    },
}


@dataclass
class Library:
    """One Python package: its version when it imports, else why not (``None`` fields: not installed)."""

    name: str
    version: str | None = None
    error: str | None = None  # installed but failed to import (the message), or None

    @property
    def ok(self) -> bool:
        return self.version is not None

    def describe(self) -> str:
        if self.ok:
            return self.version or ""
        return f"installed but does not import: {self.error}" if self.error else "not installed"


@dataclass
class Gpu:
    index: int
    name: str
    memory_mib: int | None = None
    driver: str | None = None
    compute_capability: str | None = None  # "8.7"
    source: str = ""  # nvidia-smi | torch | cuda-python


@dataclass
class Cpu:
    model: str
    machine: str  # platform.machine(): x86_64, aarch64, arm64, AMD64
    logical_cores: int | None
    usable_cores: int | None  # the process's affinity and cgroup CPU quota (containers, taskset): limits.cpu_count
    features: dict[str, bool] = field(default_factory=dict)  # ISA_FEATURES names; empty: not known here
    features_source: str = ""
    load_average: float | None = None


@dataclass
class Environment:
    python: str
    executable: str
    os: str
    hne_edge: str
    libraries: dict[str, Library]  # numpy, onnxruntime, onnx, torch, cuda-python, tensorrt
    ort_providers: list[str]
    torch_cuda_build: str | None  # torch.version.cuda (None: a CPU-only build, or no torch)
    torch_cudnn: int | None
    cuda: CudaProbe | None  # devices seen by torch / cuda-python (runtime.backends.cuda.probe_cuda); None: numpy is broken
    gpus: list[Gpu]
    gpu_notes: list[str]  # how the GPUs were looked for when none was found, Jetson release, ...
    cpu: Cpu
    tensorrt_support: dict[int, str | None] = field(default_factory=dict)  # GPU index -> why TensorRT cannot run there

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus) or (self.cuda is not None and self.cuda.device_count > 0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cuda"] = None if self.cuda is None else {k: v for k, v in asdict(self.cuda).items()}
        data["has_gpu"] = self.has_gpu
        return data


def _library(module: str, name: str | None = None, version_of=None) -> Library:
    name = name or module
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # a library that prints its own traceback (onnxruntime
            mod = importlib.import_module(module)  # when numpy is broken): the error is recorded below instead
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return Library(name)  # the package itself is missing
        return Library(name, error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # installed but broken (a missing shared library, a stub wheel)
        return Library(name, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    version = version_of(mod) if version_of else getattr(mod, "__version__", None)
    return Library(name, version=str(version or "unknown version"))


def _cuda_python_version(_mod: Any) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("cuda-python", "cuda-bindings"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown version"


def _import_cuda_python() -> Library:
    try:
        module = import_cudart()
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "cuda"
        return Library("cuda-python") if missing else Library("cuda-python", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return Library("cuda-python", error=f"{type(exc).__name__}: {exc}")
    return Library("cuda-python", version=_cuda_python_version(module))


def _driver_version() -> str | None:
    try:  # Linux desktop/server drivers: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+([\d.]+)", text)
    return found.group(1) if found else None


def list_gpus() -> tuple[list[Gpu], list[str]]:
    """Every NVIDIA GPU: nvidia-smi, else torch, else cuda-python. (GPUs, notes on how they were looked for.)"""
    notes: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version,compute_cap", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout  # fmt: skip
            gpus = []
            for line in out.strip().splitlines():
                index, name, memory, driver, cc = (s.strip() for s in line.split(","))
                gpus.append(Gpu(int(index), name, int(float(memory)) if memory.replace(".", "").isdigit() else None,
                                driver, normalize_compute_capability(cc) if cc[:1].isdigit() else None, "nvidia-smi"))  # fmt: skip
            if gpus:
                return gpus, notes
            notes.append("nvidia-smi lists no GPU")
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            notes.append(f"nvidia-smi failed: {' '.join(str(exc).split())[:200]}")
    else:
        notes.append("nvidia-smi not found")
    try:
        import torch

        if torch.version.cuda and torch.cuda.is_available():
            driver = _driver_version()
            gpus = []
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                gpus.append(Gpu(i, p.name, p.total_memory >> 20, driver, f"{p.major}.{p.minor}", "torch"))
            return gpus, notes
        notes.append(f"torch {torch.__version__} sees no CUDA device" + ("" if torch.version.cuda else " (a CPU-only build)"))
    except ImportError:
        pass
    except Exception as exc:
        notes.append(f"torch's CUDA query failed: {exc}")
    try:
        rt = import_cudart()
        err, count = rt.cudaGetDeviceCount()
        if int(err) == 0 and count:
            err_v, driver_api = rt.cudaDriverGetVersion()
            api = f"CUDA driver API {driver_api // 1000}.{driver_api % 1000 // 10}" if int(err_v) == 0 else None
            driver = _driver_version() or api
            gpus = []
            for i in range(int(count)):
                err, p = rt.cudaGetDeviceProperties(i)
                if int(err) == 0:
                    name = p.name.decode() if isinstance(p.name, bytes) else str(p.name)
                    gpus.append(Gpu(i, name.strip("\x00 "), int(p.totalGlobalMem) >> 20, driver, f"{p.major}.{p.minor}",
                                    "cuda-python"))  # fmt: skip
            return gpus, notes
        notes.append(f"cuda-python sees no CUDA device ({err})")
    except ImportError:
        pass
    except Exception as exc:
        notes.append(f"cuda-python's device query failed: {exc}")
    if Path("/etc/nv_tegra_release").is_file():  # a Jetson without nvidia-smi, torch with CUDA or cuda-python
        notes.append("this is a Jetson (/etc/nv_tegra_release): install cuda-python or JetPack's torch to see its GPU")
    return [], notes


def cpu_info() -> Cpu:
    """The CPU's model, cores and ISA features (from /proc/cpuinfo where there is one)."""
    machine = platform.machine() or "unknown"
    model, flags, source = "", None, ""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if not model and key in ("model name", "Model", "Hardware", "cpu model"):
            model = value
        if flags is None and key in ("flags", "Features"):
            flags, source = set(value.split()), f"/proc/cpuinfo {key}"
    lower = machine.lower()
    family = "x86_64" if lower in ("x86_64", "amd64", "i686", "i386") else "arm" if lower.startswith(("arm", "aarch")) else None
    features = {}
    if flags is not None and family:
        features = {name: any(f in flags for f in names) for name, names in ISA_FEATURES[family].items()}
    elif family:
        source = "unknown here (no /proc/cpuinfo)"
    usable = cpu_count()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return Cpu(model or platform.processor() or machine, machine, os.cpu_count(), usable, features, source, load)


def _probe_cuda() -> CudaProbe:
    from ..runtime.backends.cuda import probe_cuda  # the runtime's one probe (it never raises)

    return probe_cuda()


def collect_environment() -> Environment:
    """The whole report (imports torch / onnxruntime / TensorRT where installed; a few seconds)."""
    from .. import __version__

    libraries = {
        "numpy": _library("numpy"),
        "onnxruntime": _library("onnxruntime"),
        "onnx": _library("onnx"),
        "torch": _library("torch"),
        "cuda-python": _import_cuda_python(),
        "tensorrt": _library("tensorrt"),
    }
    providers: list[str] = []
    if libraries["onnxruntime"].ok:
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
    torch_cuda, cudnn = None, None
    if libraries["torch"].ok:
        import torch

        torch_cuda = torch.version.cuda
        try:
            cudnn = torch.backends.cudnn.version() if torch_cuda else None
        except Exception:  # cuDNN missing from a CUDA build: recorded as None
            cudnn = None
    gpus, notes = list_gpus()
    if Path("/etc/nv_tegra_release").is_file():
        notes.append("L4T " + " ".join(Path("/etc/nv_tegra_release").read_text().split()[:5]).strip("# "))
    env = Environment(
        python=platform.python_version(),
        executable=sys.executable,
        os=platform.platform(),
        hne_edge=__version__,
        libraries=libraries,
        ort_providers=providers,
        torch_cuda_build=torch_cuda,
        torch_cudnn=cudnn,
        cuda=_probe_cuda() if libraries["numpy"].ok else None,
        gpus=gpus,
        gpu_notes=notes,
        cpu=cpu_info(),
    )
    if libraries["tensorrt"].ok:
        env.tensorrt_support = {
            g.index: device_support(libraries["tensorrt"].version, g.compute_capability)
            for g in gpus if g.compute_capability  # fmt: skip
        }
    return env
