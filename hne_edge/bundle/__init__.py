"""The bundle: the on-disk contract between the exporters and every device runtime.

A bundle is a directory::

    bundle/
      manifest.json                 # .schema's manifest, version SCHEMA_VERSION
      onnx/fp32/nodes/b0.0.onnx     # one file per tree node  (plan "nodes")
      onnx/fp32/segments/leaf00.onnx# one file per leaf chain (plan "segments")
      onnx/fp32/first/leaf00.onnx   # optional: leaf 0's chain with no exports (plan "first")
      onnx/fp32/subtrees/unit00.onnx# leaf 0's chain, then one whole fused subtree per file (plan "subtrees")
      onnx/fp32/fused/tree.onnx     # the whole fused tree in one file: image -> every leaf (plan "fused")
      tensorrt/...                  # engines, when built on the target
      torch/model.pt                # optional: the fused state_dict, for the PyTorch backend
      profiles/*.json               # cost models written by the runtime (not listed in the manifest)

and nothing else (:data:`BUNDLE_LAYOUT`): a folder holding anything more is
not a bundle, and an export never replaces it (:func:`why_not_replaceable`).

The manifest is the only thing the runtime reads to know what to run. Reading
it validates everything: the schema version, the exact key set of every
object (missing and unknown keys are errors), that every file path stays
inside the bundle (no ``..``, no absolute path, no symlink that leads out),
that each file exists with the recorded sha256, and that the tree and the
files agree (every node or leaf covered exactly once per plan).

This package is pure Python (json, hashlib, pathlib): the edge runtime
imports it without torch. Each rule has one home module, and this one
re-exports their public names (``from hne_edge.bundle import read_manifest``):

* :mod:`.vocabulary`: the plans (one table, :data:`PLAN_TABLE`, from which every list of
  them derives), precisions, dtypes, formats, tensor names;
* :mod:`.layout`: where each file goes (:func:`file_path`), :data:`BUNDLE_LAYOUT`, profile and
  engine folder names, paths that stay inside the bundle;
* :mod:`.schema`: the manifest's dataclasses and the strict reader they are read with;
* :mod:`.reading`: reading, hashing and verifying the files, (re)writing the manifest;
* :mod:`.onnx_proto`: the protobuf reader that refuses ONNX files with external data;
* :mod:`.folder`: what a bundle folder holds, so what an export may replace.

Tensor naming inside model files: the image is ``image``; the activation of
node ``b2.1`` is ``act_b2.1``; a leaf's logits are ``logits``, shape
``(batch, classes)``. A file that outputs several leaves (plans "subtrees"
and "fused") outputs one ``logits`` tensor of shape ``(batch, leaves,
classes)``, in depth-first order: the fused model's own head layout, so no
per-leaf split in the graph. Its ``node`` is the subtree's root (``None`` for
the whole tree). Every tensor entry also names its ``node`` so nothing
depends on parsing names.
"""

from __future__ import annotations

# Each home module's public names (its __all__), re-exported: the list is theirs, not spelled twice.
from . import folder, layout, onnx_proto, reading, schema, vocabulary
from .folder import *  # noqa: F403
from .layout import *  # noqa: F403
from .onnx_proto import *  # noqa: F403
from .reading import *  # noqa: F403
from .schema import *  # noqa: F403
from .vocabulary import *  # noqa: F403

__all__ = [*vocabulary.__all__, *layout.__all__, *schema.__all__, *reading.__all__, *onnx_proto.__all__,
           *folder.__all__]  # fmt: skip
