"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


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


@pytest.fixture
def shared_cifar10() -> Path:
    path = SHARED_DATA / "cifar10_train.npz"
    if not path.exists():
        pytest.skip(f"real data not present: {path} (the ../shared folder is absent on this machine)")
    return path
