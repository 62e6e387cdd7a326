"""TensorRT compatibility rules and device info, shared by the exporter and the runtime (no torch, no TensorRT).

* :func:`load_tensorrt` - ``import tensorrt`` or :class:`BackendUnavailable` with the install hint;
* :func:`normalize_compute_capability`, :func:`version_tuple` - the spellings both sides accept;
* :func:`engine_compatibility` - why an engine built with one TensorRT / GPU cannot run on another;
* :func:`device_support` - why a TensorRT version cannot run on a GPU at all (its architecture);
* :func:`device_info` - (GPU name, compute capability) of a CUDA device, without torch if possible.

Engines are built by :mod:`hne_edge.exporters.tensorrt` and run by
:mod:`hne_edge.runtime.backends.tensorrt`; the rules both apply live here,
so the runtime never imports the exporters.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Sequence

from .errors import BackendUnavailable, InputError, install_hint

__all__ = [
    "INSTALL_HINT",
    "load_tensorrt",
    "normalize_compute_capability",
    "version_tuple",
    "engine_compatibility",
    "version_compatible",
    "device_support",
    "MIN_TENSORRT",
    "device_info",
]

INSTALL_HINT = (
    f"TensorRT is not available: install it on the target (x86_64: {install_hint('tensorrt')}; "
    "Jetson: the JetPack 6 python3-libnvinfer package) and run on a machine with an NVIDIA GPU"
)


NO_GPU_HINT = ("run on the CPU with backend 'onnxruntime' (or 'torch'), or build the engines on the GPU device: "
               "hne_edge.exporters.build_engines(BUNDLE)")
NO_GPU_CLI_HINT = ("run on the CPU: --backend onnxruntime (or torch); build the engines on the GPU device: hne-edge "
                   "export BUNDLE --format tensorrt")
# an export: the ONNX bundle is made here, its engines on the device (export has no --backend)
NO_GPU_EXPORT_HINT = ("export the ONNX bundle here (format='onnx') and build its engines on the GPU device: "
                      "hne_edge.exporters.build_engines(BUNDLE)")
NO_GPU_EXPORT_CLI_HINT = ("export the ONNX bundle here (--format onnx) and build its engines on the GPU device: "
                          "hne-edge export BUNDLE --format tensorrt")


def load_tensorrt(exporting: bool = False) -> Any:
    """``import tensorrt``, or :class:`BackendUnavailable`: on a machine without an NVIDIA GPU, saying so (installing
    TensorRT cannot help there) and what to do instead (``exporting``: an export's, else a runner's), else with the
    install hint."""
    try:
        import tensorrt as trt  # noqa: PLC0415
    except ImportError as exc:
        from .runtime.backends.cuda import no_gpu_here  # the one probe of the driver's device nodes

        if absent := no_gpu_here():
            hint, cli_hint = (NO_GPU_EXPORT_HINT, NO_GPU_EXPORT_CLI_HINT) if exporting else (NO_GPU_HINT, NO_GPU_CLI_HINT)
            raise BackendUnavailable(f"TensorRT runs on an NVIDIA GPU, and {absent}", hint=hint,
                                     cli_hint=cli_hint) from None  # fmt: skip
        raise BackendUnavailable(f"{INSTALL_HINT} (import tensorrt failed: {exc})") from None
    return trt


def normalize_compute_capability(cc: str | Sequence[int] | float) -> str:
    """``(8, 7)``, ``"8.7"``, ``"sm_87"``, ``"sm87"``, ``87`` -> ``"8.7"``."""
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    text = str(cc).strip().lower().removeprefix("sm").lstrip("_")
    if re.fullmatch(r"\d+\.\d+", text):
        return text
    if re.fullmatch(r"\d{2,3}", text):  # "87" -> 8.7, "100" -> 10.0, "121" -> 12.1
        return f"{text[:-1]}.{text[-1]}"
    raise InputError(f"compute capability must look like 8.7, sm_87 or (8, 7); received {cc!r}")


def version_tuple(version: str) -> tuple[int, ...]:
    """``"10.3.0"`` -> ``(10, 3, 0)``, ``"10.13.3.9"`` -> ``(10, 13, 3, 9)``: major, minor, patch and, where the
    version says it (TensorRT's wheels do), the build number."""
    parts = re.findall(r"\d+", str(version))
    if len(parts) < 2:
        raise InputError(f"TensorRT version must look like 10.3.0; received {version!r}")
    return tuple(int(p) for p in parts[:4]) + (0,) * (3 - min(3, len(parts)))


# Across major versions, a version-compatible engine runs only on these (built, runtime) majors (TensorRT's support
# matrix, 11.4: "TensorRT 10 version-compatible engines can run with a TensorRT 11 runtime, and TensorRT 8
# version-compatible engines can run with a TensorRT 10 runtime. No other combination across major versions").
VERSION_COMPATIBLE_MAJORS = {(8, 10), (10, 11)}


def version_compatible(build_info: dict) -> bool:
    """Whether an engine's build info says it was built ``VERSION_COMPATIBLE`` (it then embeds a lean runtime)."""
    return "VERSION_COMPATIBLE" in {str(f).upper() for f in (build_info or {}).get("flags", [])}


def engine_compatibility(build_info: dict, trt_version: str, compute_capability: str | Sequence[int]) -> str | None:
    """Why an engine cannot run here (``None``: it can).

    Rules (TensorRT documentation, "Engine Compatibility" and its support policies):
      * version: by default only the exact TensorRT version that built it ("version numbers must match across
        major, minor, patch, and build"; the build number is compared where both versions state it); built with
        ``VERSION_COMPATIBLE``, the same or a later version of the same major, or of the next major where
        :data:`VERSION_COMPATIBLE_MAJORS` allows it (10 -> 11).
      * hardware: by default only the same compute capability;
        ``ampere_plus`` engines run on any GPU of compute capability >= 8.0.
    """
    try:
        built = version_tuple(build_info["tensorrt_version"])
        built_cc = normalize_compute_capability(build_info["compute_capability"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"engine build info is incomplete or malformed ({exc}); rebuild the engines"
    here = version_tuple(trt_version)
    here_cc = normalize_compute_capability(compute_capability)
    v_built, v_here = ".".join(map(str, built)), ".".join(map(str, here))
    common = min(len(built), len(here))  # a build number is compared only where both versions state one
    if version_compatible(build_info):
        later = [m for b, m in sorted(VERSION_COMPATIBLE_MAJORS) if b == built[0]]
        if (here[0] != built[0] or here[:common] < built[:common]) and here[0] not in later:
            also = "".join(f" or {m}.x" for m in later)
            return (
                f"engine built with TensorRT {v_built} (version-compatible) needs TensorRT {built[0]}.x >= {v_built}"
                f"{also}; this device has {v_here}"
            )
    elif here[:common] != built[:common]:
        return f"engine built with TensorRT {v_built}; this device has TensorRT {v_here} (engines need the exact version)"
    level = str(build_info.get("hardware_compatibility", "none")).lower()
    if level == "ampere_plus":
        if float(here_cc) < 8.0:
            return f"engine built for Ampere and newer (compute capability >= 8.0); this GPU is sm_{here_cc.replace('.', '')}"
    elif here_cc != built_cc:
        return (
            f"engine built for compute capability {built_cc} (sm_{built_cc.replace('.', '')}); "
            f"this GPU is {here_cc} (sm_{here_cc.replace('.', '')})"
        )
    return None


# hne-edge builds strongly typed networks and uses the name-based I/O API of TensorRT 10 (pyproject: tensorrt>=10).
MIN_TENSORRT = (10, 0)
# The oldest architecture each TensorRT release runs on (NVIDIA's release notes and support matrices): 10.0-10.4
# support compute capability 7.0 (Volta) and newer; 10.5 removed Volta, so from 10.5 on the floor is 7.5 (Turing).
_OLDEST_CC = (((10, 5), 7.5), ((10, 0), 7.0))  # (first version, oldest compute capability), newest rule first
# Blackwell (compute capability 10.x and 12.x) is supported from TensorRT 10.8 on.
_NEWEST_ARCH = ((10.0, (10, 8)),)  # (compute capability at or above which, the first version that runs it)


def device_support(trt_version: str, compute_capability: str | Sequence[int]) -> str | None:
    """Why TensorRT ``trt_version`` cannot run on a GPU of ``compute_capability`` at all (``None``: it can).

    Applies the rules above (too old for hne-edge, architecture dropped, architecture newer than the
    release); an architecture the rules do not name is assumed supported.
    """
    here = version_tuple(trt_version)
    cc_text = normalize_compute_capability(compute_capability)
    cc, sm = float(cc_text), f"sm_{cc_text.replace('.', '')}"
    shown = ".".join(map(str, here))
    if here[:2] < MIN_TENSORRT:
        return f"TensorRT {shown} is older than hne-edge supports (>= {'.'.join(map(str, MIN_TENSORRT))})"
    oldest = next(floor for since, floor in _OLDEST_CC if here[:2] >= since)
    if cc < oldest:
        return f"TensorRT {shown} supports compute capability {oldest} and newer; this GPU is {cc_text} ({sm})"
    for arch, since in _NEWEST_ARCH:
        if cc >= arch and here[:2] < since:
            return (
                f"this GPU ({cc_text}, {sm}) needs TensorRT {'.'.join(map(str, since))} or newer; "
                f"TensorRT {shown} does not support it"
            )
    return None


def import_cudart() -> Any:
    """cuda-python's runtime module under either of its import paths (ImportError when not installed)."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


def device_info(device_id: int = 0) -> tuple[str, str]:
    """``(gpu name, compute capability "8.7")`` of CUDA device ``device_id``: cuda-python, torch, then nvidia-smi.

    nvidia-smi numbers the GPUs in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; CUDA numbers them fastest
    first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. So its row is taken only where both numberings agree: one GPU
    listed, or PCI order asked, and no ``CUDA_VISIBLE_DEVICES`` set (else another GPU's name and compute capability
    would be recorded in the engines' build info). :class:`BackendUnavailable` when none of them finds the device.
    """
    try:
        err, prop = import_cudart().cudaGetDeviceProperties(device_id)
        if int(err) == 0:
            name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
            return name.strip("\x00 "), f"{prop.major}.{prop.minor}"
    except Exception:  # not installed / no device: try the next source
        pass
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > device_id:
            return torch.cuda.get_device_name(device_id), normalize_compute_capability(torch.cuda.get_device_capability(device_id))
    except Exception:
        pass
    try:
        rows = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip().splitlines()  # fmt: skip
        pci_order = len(rows) == 1 or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        if pci_order and "CUDA_VISIBLE_DEVICES" not in os.environ and device_id < len(rows):
            name, cc = (s.strip() for s in rows[device_id].rsplit(",", 1))
            return name, normalize_compute_capability(cc)
    except Exception:
        pass
    raise BackendUnavailable(f"no CUDA device {device_id} was found (tried cuda-python, torch and nvidia-smi)")
