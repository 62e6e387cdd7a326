"""What a bundle folder holds, at any depth, and so whether an export may replace it (:func:`why_not_replaceable`):
nothing but its manifest, the files that lists, the folders of :data:`~hne_edge.bundle.layout.BUNDLE_LAYOUT`,
engine folders with their timing caches, profiles, and a killed writer's scratch files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import BundleError
from ..fileio import foreign_entry, is_scratch, json_record
from .layout import _ENGINE_DIR, _PROFILE_NAME, BUNDLE_LAYOUT, MANIFEST_NAME, MAX_PROFILE_BYTES, PROFILE_FORMAT, PROFILES_DIR
from .reading import _parse_manifest
from .schema import Manifest, parse_json

__all__ = ["why_not_replaceable", "not_a_profile"]


def why_not_replaceable(folder: str | os.PathLike) -> str | None:
    """Why an export may not replace ``folder`` (deleting everything in it), or None when it may.

    It may when ``folder`` is empty, or is a bundle: it holds nothing but :data:`BUNDLE_LAYOUT`'s
    entries (no symbolic links), its ``manifest.json`` parses as an hne-edge manifest of this
    schema version, and nothing at any depth but what that manifest lists and what the bundle's
    own tools write beside it (:func:`_foreign_in_bundle`). Its model files are not checked: a
    damaged bundle is still ours to replace. The reason names the first entry that is not a bundle's.
    """
    folder = Path(folder)
    entry = foreign_entry(folder, BUNDLE_LAYOUT)
    if entry is not None:
        return f"it holds {entry}, which is not part of a bundle"
    if not any(folder.iterdir()):
        return None
    try:
        manifest, _ = _parse_manifest(folder / MANIFEST_NAME)
    except BundleError as exc:
        return f"it is not an hne-edge bundle ({exc})"
    entry = _foreign_in_bundle(folder, manifest)
    if entry is not None:
        return f"it holds {entry}, which is not part of the bundle"
    return None


def _foreign_in_bundle(folder: Path, manifest: Manifest) -> str | None:
    """The first entry, at any depth of ``folder``, that is not the bundle's (described for an error), or None.

    The bundle's entries: ``manifest.json``, each file the manifest lists and the folders that hold them,
    the folders of :data:`BUNDLE_LAYOUT`, each TensorRT engine folder (:func:`engine_dir`) and its timing
    cache (``build_engines`` writes both, the folder before its first engine), ``profiles/`` holding
    profiles (:func:`profile_filename`, whose JSON says ``"format": PROFILE_FORMAT``), and a killed
    writer's scratch file beside any of these (:func:`~hne_edge.fileio.is_scratch`, its seal checked).
    Anything else - a file, a folder (even empty), a link, a device, a folder it cannot list - is the user's.
    """
    files = {MANIFEST_NAME} | {"/".join(p for p in f.path.split("/") if p not in ("", ".")) for f in manifest.files}
    folders = {"/".join(p.split("/")[:k]) for p in files for k in range(1, p.count("/") + 1)}
    folders |= {name for name, kind in BUNDLE_LAYOUT.items() if kind == "dir"}  # onnx/, tensorrt/, torch/, profiles/
    engines = [e.name for e in _scandir_or_empty(folder / "tensorrt") if _ENGINE_DIR.fullmatch(e.name) and e.is_dir()]
    folders |= {f"tensorrt/{name}" for name in engines}  # build_engines makes it before its first engine
    files |= {f"tensorrt/{name}/timing.cache" for name in engines}  # ... and keeps its timing cache there
    stack: list[tuple[str, set[str], Any]] = []  # (prefix, its listed names, entries left): depth first, by name

    def enter(path: str, prefix: str) -> str | None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as exc:  # what cannot be listed cannot be known to be ours
            return f"{prefix.rstrip('/') or '.'!r} (not readable: {exc.strerror})"
        here = prefix.rstrip("/")
        stack.append((prefix, {rel.rpartition("/")[2] for rel in files if rel.rpartition("/")[0] == here}, iter(entries)))
        return None

    found = enter(str(folder), "")
    while stack and found is None:
        prefix, listed, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        rel = prefix + entry.name
        if entry.is_symlink():
            return f"{rel!r} (a symbolic link)"
        if entry.is_dir():
            if rel not in folders:
                return f"{rel!r} (a folder, where a file belongs)" if rel in files else repr(rel)
            found = enter(entry.path, rel + "/")
        elif not entry.is_file():
            return f"{rel!r} (not a regular file)"
        elif rel in folders:
            return f"{rel!r} (a file, where a folder belongs)"
        elif rel not in files and not is_scratch(entry.name, listed, ("tmp",)) and not (
            prefix == PROFILES_DIR + "/" and _is_profile(entry)
        ):
            return repr(rel)
    return found


def _scandir_or_empty(path: Path) -> list[os.DirEntry]:
    try:
        return list(os.scandir(path)) if path.is_dir() and not path.is_symlink() else []
    except OSError:
        return []


class _ProfileNames:
    """The names :func:`profile_filename` makes, as a container (for :func:`~hne_edge.fileio.is_scratch`)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _PROFILE_NAME.fullmatch(name) is not None


_PROFILE_RECORD = json_record(PROFILE_FORMAT, lambda data: parse_json(data, "profile"), MAX_PROFILE_BYTES)


def not_a_profile(path: str | os.PathLike) -> str | None:
    """Why the regular file at ``path`` (in a bundle's ``profiles/``) is not a profile the runtime wrote, or None:
    one is named as :func:`profile_filename` names them, at most :data:`MAX_PROFILE_BYTES`, and its JSON says
    ``"format": PROFILE_FORMAT`` (a :data:`~hne_edge.fileio.Judge`: what an export may delete with the bundle,
    and what ``save_profile`` may replace)."""
    path = Path(path)
    if path.name not in _ProfileNames():
        return f"{path.name!r} is not a profile's name"
    return _PROFILE_RECORD(path)


def _is_profile(entry: os.DirEntry) -> bool:
    """Whether ``entry`` (in ``profiles/``) is a profile the runtime wrote, or a killed writer's scratch of one."""
    return is_scratch(entry.name, _ProfileNames(), ("tmp",)) or not_a_profile(entry.path) is None
