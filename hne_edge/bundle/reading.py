"""Reading a bundle: its manifest validated, every listed file's size and sha256 checked, and the bytes a
backend loads checked again as loaded (:func:`read_verified`); writing the manifest only after it reads back.

Every bundle file is hashed here (``hashlib``, through :func:`sha256_bytes` and :func:`sha256_file`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

from ..errors import BundleError
from ..fileio import atomic_write_json
from .layout import MANIFEST_NAME, not_a_bundle, resolve_in_bundle
from .schema import Manifest, ModelFile, parse_json

__all__ = [
    "sha256_bytes",
    "sha256_file",
    "read_manifest",
    "read_manifest_and_digest",
    "read_verified",
    "write_manifest",
    "update_manifest",
]


def sha256_bytes(data: bytes) -> str:
    """The sha256 of bytes already in memory (a file's, as loaded or as written)."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _parse_manifest(path: Path) -> tuple[Manifest, bytes]:
    """The manifest in file ``path``, validated (not the files it lists), and the bytes it was parsed from."""
    if not path.is_file():
        raise BundleError(f"{path.parent} is not a bundle: {MANIFEST_NAME} is missing")
    raw = path.read_bytes()
    return Manifest.from_dict(parse_json(raw, str(path))), raw


def read_manifest(bundle_dir: str | os.PathLike, verify_files: bool = True) -> Manifest:
    """Read and validate ``bundle_dir/manifest.json``; with ``verify_files`` also check every file's sha256."""
    return _read_manifest(bundle_dir, verify_files)[0]


def read_manifest_and_digest(bundle_dir: str | os.PathLike, verify_files: bool = True) -> tuple[Manifest, str]:
    """:func:`read_manifest`, and the sha256 of the very bytes it parsed (what a profile is keyed to)."""
    manifest, raw = _read_manifest(bundle_dir, verify_files)
    return manifest, sha256_bytes(raw)


def _read_manifest(bundle_dir: str | os.PathLike, verify_files: bool) -> tuple[Manifest, bytes]:
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise not_a_bundle(bundle_dir) or BundleError(f"bundle directory not found: {bundle_dir}")
    manifest, raw = _parse_manifest(bundle_dir / MANIFEST_NAME)
    for i, f in enumerate(manifest.files):
        target = resolve_in_bundle(bundle_dir, f.path, f"files[{i}]")
        if f.source is not None:
            resolve_in_bundle(bundle_dir, f.source, f"files[{i}].source")
        _check_on_disk(target, f, f"files[{i}]")
        if verify_files:
            _check_size(f, target.stat().st_size, f"files[{i}].bytes")  # a stat first: cheap
            _check_digest(f, sha256_file(target), f"files[{i}].sha256")
    return manifest, raw


def _check_size(f: ModelFile, actual: int, where: str) -> None:
    if actual != f.bytes:
        raise BundleError(
            f"bundle file {f.path} ({where}) is {actual} bytes on disk; the manifest says {f.bytes}; the file was "
            "modified or corrupted"
        )


def _check_digest(f: ModelFile, actual: str, where: str) -> None:
    if actual != f.sha256:
        raise BundleError(
            f"bundle file {f.path} ({where}) does not match the manifest: "
            f"expected {f.sha256}, found {actual}; the file was modified or corrupted"
        )


def read_verified(path: str | os.PathLike, model_file: ModelFile | None) -> bytes:
    """The bytes of a model file, checked against ``model_file.bytes`` and ``.sha256`` (``None``: not checked).

    Backends load these bytes, never the path again: a file swapped after the
    check cannot be what runs.
    """
    data = Path(path).read_bytes()
    if model_file is not None:
        _check_size(model_file, len(data), "bytes at load")
        _check_digest(model_file, sha256_bytes(data), "sha256 at load")
    return data



def _check_on_disk(target: Path, f: "ModelFile", where: str, listed: str = "is listed in the manifest but not on disk") -> None:
    """A listed model file must be a regular file (a folder or a device in its place is not "missing")."""
    if target.is_file():
        return
    if target.exists():
        kind = "a folder" if target.is_dir() else "not a regular file"
        raise BundleError(f"bundle file {f.path} ({where}) is {kind}; expected a file (the bundle was modified)")
    raise BundleError(f"bundle file missing: {f.path} ({where}) {listed}")


def write_manifest(bundle_dir: str | os.PathLike, manifest: Manifest) -> Path:
    """Write ``manifest.json`` (after checking it reads back)."""
    data = manifest.to_dict()
    Manifest.from_dict(json.loads(json.dumps(data)))  # never write what we could not read
    return atomic_write_json(Path(bundle_dir) / MANIFEST_NAME, data, indent=2)


def update_manifest(bundle_dir: str | os.PathLike, entries: "list[ModelFile] | tuple[ModelFile, ...]") -> Manifest:
    """Add (or replace, by path) ``entries`` in a bundle's manifest, written atomically; returns the new manifest.

    Hashes nothing: each entry's sha256 is the one computed when its file was written (from the
    bytes written), and the files already listed were verified by whoever read them. The new
    manifest is validated once - the structure by :func:`write_manifest`'s read-back, the paths
    and the presence of every file by :func:`read_manifest` - and only then replaces the old one.
    """
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir, verify_files=False)
    new_paths = {e.path for e in entries}
    files = tuple(f for f in manifest.files if f.path not in new_paths) + tuple(entries)
    updated = replace(manifest, files=files)
    for i, f in enumerate(updated.files):
        _check_on_disk(resolve_in_bundle(bundle_dir, f.path, f"files[{i}]"), f, f"files[{i}]", "would be listed in the manifest but is not on disk")
    write_manifest(bundle_dir, updated)
    return updated
