"""Run a script or module with the staged onnxruntime-gpu: torch first (its CUDA libraries), then
``onnxruntime.preload_dlls()``, then the command (gpu_acceptance.py's ``ort-gpu`` stage runs its children so).

    PYTHONPATH=STAGED:. python3 benchmarks/ort_gpu_child.py --probe OUT.json
    PYTHONPATH=STAGED:. python3 benchmarks/ort_gpu_child.py -m pytest tests/runtime/test_gpu_hardware.py -m gpu
    PYTHONPATH=STAGED:. python3 benchmarks/ort_gpu_child.py benchmarks/bench_gpu.py --backends onnxruntime ...

``STAGED`` is where ``pip install --no-deps --target`` put the wheel; first on ``PYTHONPATH``, its
``onnxruntime`` shadows the machine's CPU one. ``--probe FILE`` writes what this process sees (where the first ``onnxruntime`` on the path is,
its version and file, its providers, what ``preload_dlls`` did) as JSON, and runs nothing else.
"""

from __future__ import annotations

import json
import runpy
import sys


def preload() -> dict:
    """torch (when installed: it loads its CUDA and cuDNN libraries), then onnxruntime.preload_dlls()."""
    info: dict = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except Exception as exc:  # no torch: the CUDA libraries come from the nvidia packages or the system
        info["torch"] = f"not imported ({type(exc).__name__})"
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")  # the first on the path: the staged wheel's, when staged
    info["onnxruntime_found"] = spec.origin if spec is not None else None
    try:
        import onnxruntime as ort
    except Exception as exc:
        info["onnxruntime"] = f"not importable: {type(exc).__name__}: {exc}"
        return info
    info.update(onnxruntime=ort.__version__, onnxruntime_file=getattr(ort, "__file__", None))
    fn = getattr(ort, "preload_dlls", None)
    if fn is None:
        info["preload_dlls"] = "absent (onnxruntime < 1.21)"
    else:
        try:
            fn()
            info["preload_dlls"] = "called"
        except Exception as exc:  # recorded; the provider may still load what torch loaded
            info["preload_dlls"] = f"failed: {type(exc).__name__}: {exc}"
    try:
        info["providers"] = ort.get_available_providers()
    except Exception as exc:
        info["providers"] = f"failed: {type(exc).__name__}: {exc}"
    return info


def main(argv: list[str]) -> int:
    info = preload()
    if argv[:1] == ["--probe"]:
        text = json.dumps(info, indent=1)
        if len(argv) > 1:
            with open(argv[1], "w") as f:
                f.write(text + "\n")
        print(text)
        return 0
    print(f"ort_gpu_child: {json.dumps(info)}", file=sys.stderr, flush=True)
    if argv[:1] == ["-m"] and len(argv) > 1:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv:
        sys.argv = list(argv)
        sys.path.insert(0, str(__import__("pathlib").Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")
    else:
        print("usage: ort_gpu_child.py --probe FILE | -m MODULE ARGS... | SCRIPT ARGS...", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))  # a command's own SystemExit passes through with its status
