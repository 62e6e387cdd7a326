"""One home for writing files so that a crash never leaves half of one (stdlib only).

Every writer in the package (checkpoints, JSON records, profiles, metrics,
manifests, bundles) goes through these helpers: the bytes go to a hidden
sibling ``.NAME.hne-KIND-PID-NONCESEAL`` (:func:`scratch_path`), are flushed
and fsync'ed, and are renamed over the target in one step. A reader therefore
sees the old file or the new one, never a prefix. The PID in the scratch name
lets a later writer remove the leftovers of a killed one (:func:`remove_stale`).

What is ours to delete is decided by the name alone, so the name carries a
seal: 8 hex digits of a sha256 over NAME, KIND, PID and the random NONCE. A
user's ``.bk.old-2024-06`` or ``.bk.partial-31337-mine`` (or a copy of one of
our leftovers under another name, or beside another target) does not carry it,
and is never taken for a dead writer's scratch. A marker file inside scratch
folders would not do: a scratch file has no inside, a staged folder becomes
the user's output by a rename (the marker would have to go first, leaving a
window), and the ``old`` folder is the user's previous output renamed aside.

Folders: a command that writes several files into an output folder stages them
(:func:`staged_output`), so a failure leaves the folder as it was and no new
empty folder behind; a bundle is swapped in whole (:func:`swap_dir_into_place`).
What a command may replace is decided by its owner's layout (a bundle's in
``bundle/folder.py``, a training run's in ``train/engine.py``, a demo's in ``demo.py``)
through :func:`foreign_entry`, never by the presence of one file name.

Files: a command that writes files of fixed names into a folder the user names (``eval``'s ``metrics.json``
and figures, ``bench``'s, a profile, ``info --plot``) replaces a file there only when it is ours, by name and
format (:func:`foreign_file`): a JSON record that says our ``"format"`` (:func:`json_record`) or a PNG that
carries our seal (:func:`seal_png`: the sha256 of the rest of the file, so a figure edited since is the user's).
Anything else at such a name (a file of the user's, a link, a folder) is refused unless the user passes
``--force`` (a folder never is replaced).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import struct
import sys
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Container, Iterator, Mapping, Sequence

from .limits import MAX_JSON_BYTES

__all__ = [
    "scratch_path",
    "remove_stale",
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "swap_dir_into_place",
    "replace_files_then",
    "absolute_folder",
    "check_output_dir",
    "check_outputs",
    "foreign_entry",
    "is_scratch",
    "staged_output",
    "new_folders",
    "remove_new_folders",
    "foreign_file",
    "refuse_foreign",
    "json_record",
    "seal_png",
    "sealed_png",
    "SCRATCH_KINDS",
]

SCRATCH_KINDS = ("tmp", "partial", "old")  # a file being written; a folder being filled; a folder being replaced
# what scratch_path makes, exactly (the seal is checked by is_scratch)
_SCRATCH = re.compile(r"\.(?P<name>.+)\.hne-(?P<kind>tmp|partial|old)-(?P<pid>[1-9][0-9]{0,9})-(?P<nonce>[0-9a-f]{8})(?P<seal>[0-9a-f]{8})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:  # no such pid can exist here, so no writer of ours made it: keep what it names
        return True
    except OSError:  # exists, owned by someone else
        return True
    return True


def absolute_folder(path: str | os.PathLike) -> Path:
    """``path`` made absolute, a last component ``..`` resolved to the folder it names: a writer's scratch siblings
    (``.NAME.hne-partial-*``) go beside that folder, not inside the one below it (``--out bundle/onnx/..`` staged
    into ``bundle/onnx/`` and then refused its own scratch folder as a file the bundle does not hold)."""
    path = Path(path)
    return path.resolve() if path.name == ".." else path.absolute()


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Refuse, before any work, an output folder writing into which could only fail later: an existing file, a
    folder this user may not write to, or a new folder that cannot be created (a file on its path, its nearest
    existing folder not writable, or one that refuses new names whatever its modes: /proc, to root too). Nothing
    is left behind: a new folder is made by the writer, which removes it again when it fails."""
    from .errors import InputError

    path = Path(path)
    expected = "expected a folder (new or existing) that this user can write into"
    if path.is_symlink() and not path.exists():  # first: the checks below follow links, and nothing is there
        raise InputError(f"{what} {path}: received a symbolic link to {os.readlink(path)}, which does not exist; "
                         f"{expected}")
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path}: received an existing file; {expected}")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError(f"{what} {path}: received a folder this user may not write to; {expected}")
        return path
    missing = path
    while not os.path.lexists(missing.parent) and missing.parent != missing:
        missing = missing.parent
    parent = missing.parent  # the nearest existing path above: where the first new folder goes
    if not parent.is_dir():
        raise InputError(f"{what} {path}: received a path through {parent}, which is not a folder; {expected}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what} {path}: cannot be created, {parent} is a folder this user may not write to; "
                         f"{expected}")
    probe = scratch_path(parent / "probe", "partial")  # access() answers from the modes; only making a folder tells
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot be created, {parent} refuses new folders ({exc.strerror}); "
                         f"{expected}") from exc
    return path


# what a layout allows at a name: "file" (a regular file), "dir" (a folder, its contents not looked at), a
# layout (a folder holding only what that layout allows, checked at every depth) or a check of the folder that
# returns why it is not ours (None: it is)
Layout = Mapping[str, "str | Layout | Callable[[Path], str | None]"]


def foreign_entry(folder: str | os.PathLike, layout: Layout, _prefix: str = "") -> str | None:
    """The first entry of ``folder`` (by name, depth first) that ``layout`` does not allow, described for an error;
    None if none.

    ``layout`` maps each allowed name to ``"file"`` (a regular file), ``"dir"`` (a folder), a nested layout
    (a folder whose entries are checked the same way) or a callable that checks the folder and returns why
    it is not ours (the bundle inside a demo's folder: :func:`hne_edge.bundle.why_not_replaceable`). A
    symbolic link is never allowed (what a link points to is not ours to judge). A scratch sibling of an
    allowed name (from :func:`scratch_path`, its seal checked: :func:`is_scratch`) is ours: a killed writer's
    leftover.
    """
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        rel = _prefix + entry.name
        if is_scratch(entry.name, layout) and not entry.is_symlink():
            continue
        kind = layout.get(entry.name)
        if entry.is_symlink():
            return f"{rel!r} (a symbolic link)"
        if kind is None:
            return repr(rel)
        if (kind != "file") != entry.is_dir():
            found, expected = ("folder", "file") if entry.is_dir() else ("file", "folder")
            return f"{rel!r} (a {found}, where a {expected} belongs)"
        if isinstance(kind, Mapping):
            inner = foreign_entry(entry.path, kind, rel + "/")
            if inner is not None:
                return inner
        elif callable(kind):
            why = kind(Path(entry.path))
            if why is not None:
                return f"{rel!r} ({why})"
    return None


def _seal(name: str, kind: str, pid: str, nonce: str) -> str:
    """8 hex digits that only :func:`scratch_path` writes: a sha256 over the target's name, the kind, pid and nonce."""
    text = "\0".join(("hne-edge scratch", name, kind, pid, nonce))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _scratch_match(name: str) -> re.Match | None:
    """The parts of ``name`` when it is exactly a name :func:`scratch_path` made (its seal checked), else None."""
    found = _SCRATCH.fullmatch(name)
    if found is None or found["seal"] != _seal(found["name"], found["kind"], found["pid"], found["nonce"]):
        return None
    return found


def is_scratch(name: str, of: Container[str], kinds: Container[str] = SCRATCH_KINDS) -> bool:
    """Whether ``name`` is a scratch sibling (:func:`scratch_path`, seal included) of one of the names ``of``."""
    found = _scratch_match(name)
    return found is not None and found["name"] in of and found["kind"] in kinds


def scratch_path(target: Path, kind: str) -> Path:
    """A fresh sibling name ``.NAME.hne-KIND-PID-NONCESEAL`` of ``target``: the pid lets a later run tell a dead
    writer's leftovers, the seal (see the module docstring) that the name is ours."""
    if kind not in SCRATCH_KINDS:
        raise ValueError(f"scratch_path kind: received {kind!r}; expected one of {list(SCRATCH_KINDS)}")
    pid, nonce = str(os.getpid()), secrets.token_hex(4)
    return target.parent / f".{target.name}.hne-{kind}-{pid}-{nonce}{_seal(target.name, kind, pid, nonce)}"


def remove_stale(target: Path, kinds: Sequence[str] = ("partial", "old")) -> None:
    """Remove the scratch siblings of ``target`` of these ``kinds`` whose writer process is gone (a killed writer).

    Only a name :func:`scratch_path` made for ``target`` qualifies (:func:`is_scratch`: the exact pattern and its
    seal); a process id that is alive, or this process's, keeps its scratch.
    """
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in names:
        found = _scratch_match(name)
        if found is None or found["name"] != target.name or found["kind"] not in kinds:
            continue
        pid = int(found["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        p = target.parent / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a scratch sibling of ``path`` for writing; on a clean exit it replaces ``path``, on an error it is removed.

    The file gets the umask's mode (not ``mkstemp``'s 0600), and its bytes
    reach the disk (fsync) before the rename, so a power cut after the
    rename cannot leave an empty file. An OS error that names no file (a
    full disk fails ``write()``) is raised again naming ``path``.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_file mode: received {mode!r}; expected 'wb' or 'w'")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target, ("tmp",))
    tmp = scratch_path(target, "tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        _raise_naming(exc, target, tmp)
    try:
        with os.fdopen(fd, mode, encoding=encoding if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        _raise_naming(exc, target, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _raise_naming(exc: OSError, target: Path, tmp: Path) -> None:
    """Raise ``exc`` again naming ``target``, the file the user knows, where it names no file (write()/fsync():
    ENOSPC, EFBIG, EIO) or our scratch sibling (a folder that refuses new files, ``/proc``; a failed rename)."""
    if exc.errno is None or exc.filename not in (None, str(tmp), os.fsencode(tmp), tmp):
        raise exc
    raise type(exc)(exc.errno, exc.strerror, str(target)) from exc


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_file(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_file(path, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int = 1, allow_nan: bool = False) -> Path:
    """Newline-terminated JSON, written atomically; strict by default (NaN/Infinity, which other parsers
    reject, raise ``ValueError``). Records of a run that may hold a diverged loss pass ``allow_nan=True``."""
    return atomic_write_text(path, json.dumps(data, indent=indent, allow_nan=allow_nan) + "\n")


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    sys.audit("hne_edge.fileio.exchange", a, b)  # os.rename raises os.rename; a crash test can stop here too
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def swap_dir_into_place(tmp: Path, out: Path) -> None:
    """Make the complete directory ``tmp`` appear at ``out``, replacing what is there.

    One atomic exchange where the OS has one (Linux), so a crash leaves the
    old directory or the new one at ``out``; elsewhere two renames, the old
    directory put back when the second fails.
    """
    if out.exists() and _exchange(tmp, out):  # out now holds the new tree, tmp the old one
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = None
    if out.exists():
        old = scratch_path(out, "old")
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def replace_files_then(moves: Mapping[Path, Path], commit: Callable[[], Any]) -> Any:
    """Move each written scratch file of ``moves`` (scratch -> target) over its target, then return ``commit()`` (the
    write of what lists the files: a manifest). All or nothing: when a move or ``commit`` fails, every target gets its
    old file back (or none, where it had none), so the listing on disk still matches the files it lists."""
    olds: dict[Path, Path | None] = {}
    try:
        for scratch, target in moves.items():
            old = None
            if os.path.lexists(target):
                old = scratch_path(target, "old")
                os.replace(target, old)
            olds[target] = old
            os.replace(scratch, target)
        result = commit()
    except BaseException:
        for target, old in reversed(olds.items()):
            if old is None:
                target.unlink(missing_ok=True)
            else:
                os.replace(old, target)
        raise
    for old in olds.values():
        if old is not None:
            old.unlink(missing_ok=True)
    return result


@contextlib.contextmanager
def staged_output(out_dir: str | os.PathLike, what: str = "output folder", *, ours: Mapping[str, Judge] | None = None,
                  force: bool = False) -> Iterator[Path]:
    """Yield an empty scratch folder for a command's output files; they reach ``out_dir`` only if the block succeeds.

    On success each file replaces its namesake in ``out_dir`` (``os.replace``: atomic per file, from a scratch
    folder inside it, on its file system), or, when ``out_dir`` is new, the whole folder appears in one rename. A
    namesake is replaced only when it is ours (``ours`` maps each name to its :data:`Judge`; :func:`refuse_foreign`,
    checked just before the move; ``force``: any file or link), so a user's file that appeared while the command
    ran stays. On an
    error the scratch folder, and any parent folder this call created, are removed: a failed ``eval`` or
    ``bench`` leaves ``out_dir`` as it was and no new empty folder behind.
    """
    out = absolute_folder(check_output_dir(out_dir, what))
    created = new_folders(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    # staged on the file system the files end up on: inside an existing folder (a link to a folder elsewhere, a
    # mount point), as a scratch of a name of ours (a layout takes a killed run's leftover for ours); beside a new one
    anchor = out / min(ours or {"output": _no_rule}) if out.is_dir() else out
    try:
        remove_stale(out)
        remove_stale(anchor)
        stage = scratch_path(anchor, "partial")
        stage.mkdir()
        try:
            yield stage
            if out.is_dir():
                for entry in sorted(stage.iterdir()):
                    refuse_foreign(out / entry.name, (ours or {}).get(entry.name, _no_rule), force=force, flag=what)
                _move_into(stage, out)
                stage.rmdir()
            else:
                os.rename(stage, out)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    except BaseException:
        remove_new_folders(created)
        raise


def _move_into(src: Path, dst: Path) -> None:
    for entry in sorted(src.iterdir()):
        os.replace(entry, dst / entry.name)


def new_folders(path: str | os.PathLike) -> list[Path]:
    """``path`` and its parents that do not exist yet, outermost first: what a writer about to make ``path`` creates
    (for :func:`remove_new_folders` after a failure)."""
    path = Path(path).absolute()
    # "x/../y": x is made, "x/.." is not a folder of its own (and rmdir refuses it, which kept x)
    return [p for p in (path, *path.parents) if p.name not in ("..", ".") and not os.path.lexists(p)][::-1]


def remove_new_folders(created: Sequence[Path]) -> None:
    """Remove the folders of :func:`new_folders` that are empty, innermost first, stopping at the first that is not
    (a folder someone filled meanwhile stays): a command that failed leaves no folder it made."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break


# -- what is ours among a folder's files (see the module docstring) ---------------------------------------------------

# why the regular file at a path is not ours, in words that follow "hne-edge did not write it"; None: it is ours
Judge = Callable[[Path], "str | None"]
MAX_OURS_BYTES = MAX_JSON_BYTES  # a record or a figure of ours is smaller; a bigger file is not read to find out
_PNG = b"\x89PNG\r\n\x1a\n"
_IEND = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
_SEAL_KEY = b"hne-edge\0sha256:"  # a tEXt chunk: keyword "hne-edge", text "sha256:" + 64 hex digits
_SEAL_CHUNK = 4 + 4 + len(_SEAL_KEY) + 64 + 4


def _no_rule(path: Path) -> str:
    return "no rule of this command says it is its own"


def _read_small(path: Path, limit: int = MAX_OURS_BYTES) -> bytes | None:
    """The bytes of ``path``, or None when it cannot be read or holds more than ``limit`` (not read to the end)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def json_record(fmt: str, parse: Callable[[bytes], Any] = json.loads, max_bytes: int = MAX_OURS_BYTES) -> Judge:
    """The :data:`Judge` of a JSON record of ours: a JSON object (``parse``d) whose ``"format"`` is ``fmt``, of at
    most ``max_bytes``."""

    from .errors import HNEError  # a strict parser (the bundle's) raises its own

    def judge(path: Path) -> str | None:
        data = _read_small(path, max_bytes)
        try:
            record = parse(data) if data is not None else None
        except (ValueError, RecursionError, HNEError):
            record = None
        if isinstance(record, dict) and record.get("format") == fmt:
            return None
        return f'it is not a JSON object saying "format": "{fmt}"'

    return judge


def seal_png(data: bytes) -> bytes:
    """``data`` (a PNG) sealed as ours: a ``tEXt`` chunk ``hne-edge`` before its end that holds the sha256 of the
    file without that chunk. A figure changed since (or a user's PNG) does not carry it (:func:`sealed_png`)."""
    if not (data.startswith(_PNG) and data.endswith(_IEND)):
        raise ValueError("seal_png: received bytes that are not a PNG ending in IEND")
    body = _SEAL_KEY + hashlib.sha256(data).hexdigest().encode()
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    return data[: -len(_IEND)] + chunk + _IEND


def sealed_png(path: Path) -> str | None:
    """The :data:`Judge` of a figure of ours: a PNG that carries :func:`seal_png`'s seal of its own bytes."""
    data = _read_small(path)
    if data is not None and data.startswith(_PNG) and data.endswith(_IEND) and len(data) > _SEAL_CHUNK + len(_IEND):
        chunk = data[-len(_IEND) - _SEAL_CHUNK : -len(_IEND)]
        rest = data[: -len(_IEND) - _SEAL_CHUNK] + _IEND
        if chunk[4:8] == b"tEXt" and chunk[8 : 8 + len(_SEAL_KEY)] == _SEAL_KEY and \
                chunk[8 + len(_SEAL_KEY) : -4] == hashlib.sha256(rest).hexdigest().encode():  # fmt: skip
            return None
    return "it is not a figure hne-edge drew, or it was changed since (no hne-edge seal of its bytes)"


def foreign_file(path: str | os.PathLike, judge: Judge, *, force: bool = False, under: str | os.PathLike | None = None
                 ) -> str | None:  # fmt: skip
    """Why a command may not write its file at ``path``, replacing what is there (described for an error); None
    when it may: nothing is there, or a regular file ``judge`` says is ours, or (``force``) any file or link.

    A folder is never replaced. ``under``: the folders between it and ``path`` (a bundle's ``profiles/``) must
    be real folders or not exist yet: a link there would send the file elsewhere.
    """
    path = Path(path)
    if under is not None:
        for folder in reversed(path.relative_to(under).parents[:-1]):
            try:
                mode = os.lstat(Path(under) / folder).st_mode
            except FileNotFoundError:
                break
            if not stat.S_ISDIR(mode):
                return f"{Path(under) / folder} is {'a symbolic link' if stat.S_ISLNK(mode) else 'not a folder'}"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return "it is a folder"
    if force:
        return None
    if stat.S_ISLNK(mode):
        return f"it is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISREG(mode):
        return "it is not a regular file"
    why = judge(path)
    return None if why is None else f"hne-edge did not write it ({why})"


def refuse_foreign(path: str | os.PathLike, judge: Judge, *, force: bool = False, flag: str | None = None,
                   under: str | os.PathLike | None = None) -> None:  # fmt: skip
    """Raise :class:`~hne_edge.errors.InputError` naming ``path`` when :func:`foreign_file` says it is not ours to
    replace. The fix names ``--force`` (``force=True``) where that would help, and another ``flag`` (the option that
    chose the path, e.g. ``--out``; None: move the file away)."""
    from .errors import InputError

    why = foreign_file(path, judge, force=force, under=under)
    if why is None:
        return
    other = f"choose another {flag}" if flag else "move it away"
    if force or foreign_file(path, judge, force=True, under=under) is not None:  # --force would not help
        raise InputError(f"refusing to replace {path}: {why}", hint="move it away, or write elsewhere",
                         cli_hint="move it away" + (f", or {other}" if flag else ""))  # fmt: skip
    raise InputError(f"refusing to replace {path}: {why}", hint="pass force=True to replace it, or write elsewhere",
                     cli_hint=f"pass --force to replace it, or {other}")  # fmt: skip


def check_outputs(out_dir: str | os.PathLike, ours: Mapping[str, Judge], *, force: bool = False,
                  flag: str = "--out") -> Path:  # fmt: skip
    """Before any work, what :func:`staged_output` checks again at the move: ``out_dir`` is a folder or new
    (:func:`check_output_dir`), and no file there of a name in ``ours`` is the user's (:func:`refuse_foreign`,
    by its judge). Returns ``out_dir`` as a :class:`Path`."""
    if check_output_dir(out_dir, flag).is_dir():
        for name, judge in ours.items():
            refuse_foreign(Path(out_dir) / name, judge, force=force, flag=flag)
    return Path(out_dir)
