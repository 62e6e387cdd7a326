"""ONNX export: per-node and per-segment files, dynamic batch, folded BatchNorm, numerics vs PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from hne_edge.bundle import read_manifest


def test_tiny_bundle_is_a_valid_bundle(tiny_bundle):
    manifest = read_manifest(tiny_bundle.bundle_dir)
    assert manifest.variants() == [("onnx", "nodes", "fp32"), ("onnx", "segments", "fp32"), ("torch", "weights", "fp32")]
    assert len(manifest.files_for("nodes")) == len(manifest.tree.nodes) == 31
    assert len(manifest.files_for("segments")) == manifest.tree.num_leaves == 16
    assert manifest.input.batch == (1, 1, 8)
    assert manifest.class_names[0] == "c0"
    assert manifest.input.mean == (0.49, 0.48, 0.45)
    assert manifest.input.shape == ("batch", 3, 16, 16)
