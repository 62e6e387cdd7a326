"""Every file the runtime loads is verified (issue 28 §2): a bundle with every plan, precision and format
(conftest's ``every_file_bundle``), each file of it tampered in turn, is refused with the sha256 error by every
backend that loads it - ONNX Runtime and torch on the CPU, and the GPU backends (ONNX Runtime CUDA, torch CUDA,
TensorRT) through the fakes of tests/runtime_fakes.py, whose loading code is the real backends'.

Which runner loads which file is stated here from the bundle's layout (docs/guide.md "Plans"), not read from
the runtime: a plan's own files, the first-leaf file for every plan but ``fused``, for ``mixed`` the segments,
the subtrees of several leaves and the fused tree, and for torch the one weights file whatever the plan.
"""

from __future__ import annotations

import shutil

import pytest

from hne_edge.bundle import MIXED_PLANS, PRECISIONS, RUNNER_PLANS, Manifest, ModelFile, read_manifest
from hne_edge.errors import BundleError
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.backends import BACKENDS, backend_class

pytestmark = pytest.mark.xdist_group("every_file_bundle")  # one pytest-xdist worker builds the bundle, not each

CASES = [(name, kind, plan, precision) for name, kind in BACKENDS for plan in RUNNER_PLANS for precision in PRECISIONS]


def loads(manifest: Manifest, f: ModelFile, fmt: str, plan: str, precision: str) -> bool:
    """Whether a runner of ``plan`` / ``precision`` on a backend reading ``fmt`` files loads ``f``."""
    if f.format != fmt:
        return False
    if fmt == "torch":  # every plan is a view of the one (fp32) weights file; fp16 converts it
        return f.plan == "weights"
    if f.precision != precision:
        return False
    if f.plan == plan or (f.plan == "first" and plan != "fused"):
        return True
    several_leaves = sum(manifest.tree.node(n).is_leaf for n in f.nodes) > 1
    return plan == "mixed" and f.plan in MIXED_PLANS and (f.plan != "subtrees" or several_leaves)


@pytest.fixture(scope="module")
def tampered(every_file_bundle, tmp_path_factory):
    """A private copy of the bundle and a function that flips one byte of a file in it, for a ``with`` block."""
    import contextlib

    bundle = tmp_path_factory.mktemp("tampered") / "b"
    shutil.copytree(every_file_bundle, bundle)

    @contextlib.contextmanager
    def flipped(rel: str):
        path = bundle / rel
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x40  # mid-file: initializer data, so the file still parses (only the hash tells)
        path.write_bytes(bytes(data))
        try:
            yield bundle
        finally:
            path.write_bytes(original)

    return bundle, flipped


def test_every_file_of_the_bundle_is_loaded_by_some_backend(every_file_bundle):
    """The cases below cover the bundle's whole file list: every format, plan and precision it has."""
    manifest = read_manifest(every_file_bundle)
    assert {f.format for f in manifest.files} == {"onnx", "torch", "tensorrt"}
    assert {(f.plan, f.precision) for f in manifest.files if f.format == "tensorrt"} == {
        (p, q) for p in ("nodes", "segments", "subtrees", "fused", "first") for q in PRECISIONS
    }
    covered = {f.path for f in manifest.files for name, kind, plan, precision in CASES
               if loads(manifest, f, backend_class(name, kind).format, plan, precision)}  # fmt: skip
    assert covered == {f.path for f in manifest.files}


@pytest.mark.parametrize("name, kind, plan, precision", CASES, ids=["-".join(c) for c in CASES])
def test_a_tampered_file_is_refused_by_every_backend_that_loads_it(tampered, request, name, kind, plan, precision):
    if kind == "cuda":
        request.getfixturevalue("fake_gpu")  # the real GPU backends' loading code, on the CPU
    bundle, flipped = tampered
    manifest = read_manifest(bundle)
    fmt = backend_class(name, kind).format
    options = {"threads": 1} if name == "onnxruntime" else {}
    files = [f.path for f in manifest.files if loads(manifest, f, fmt, plan, precision)]
    assert files, f"{name} {kind} loads no file of the bundle for {plan} {precision}"
    with AnytimeRunner(bundle, backend=name, device=kind, plan=plan, precision=precision, load_profile=False, warmup=0,
                       **options) as runner:  # fmt: skip  (untampered, it loads: a refusal below is the tampering's)
        assert runner.num_leaves == manifest.tree.num_leaves
    not_refused = {}
    for rel in files:
        with flipped(rel):
            try:
                AnytimeRunner(bundle, backend=name, device=kind, plan=plan, precision=precision, load_profile=False,
                              warmup=0, **options).close()  # fmt: skip
                not_refused[rel] = "loaded"
            except BundleError as exc:
                if f"bundle file {rel} (sha256 at load) does not match the manifest" not in str(exc):
                    not_refused[rel] = f"refused for another reason: {exc}"
    assert not not_refused, f"{name} on {kind}, plan {plan}, {precision}: tampered files not refused by their sha256: {not_refused}"
