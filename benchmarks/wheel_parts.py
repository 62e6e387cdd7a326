"""A wheel too big for one copy (onnxruntime-gpu: ~255 MB) as xz-compressed parts, and back.

    python3 benchmarks/wheel_parts.py split onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl runs/ort_parts
    python3 benchmarks/wheel_parts.py join runs/ort_a runs/ort_b --out /tmp/wheels     # (gpu_acceptance.py does this)

``split`` xz-compresses the wheel (onnxruntime-gpu 1.31.1's cp312 wheel packs to a 209 MiB stream) and cuts the
stream into parts of at most ``--max-mib`` (default 52: five parts, each of which travels beside a checkout in a
64 MiB copy), named ``<wheel file name>.xz.part00``, ``.part01``, ... with ``<wheel file name>.sha256`` beside
them; ``--folders N`` puts them round-robin into ``OUT/a``, ``OUT/b``, ... (one per copy). The same parts, without
Python:

    xz -T0 -6 -c WHEEL | split -b 52M -d -a 2 - OUT/WHEEL.xz.part && sha256sum WHEEL > OUT/WHEEL.sha256

``join`` finds the parts of exactly one wheel in the folders given (in any of them, each once, or twice with the
same bytes), checks that they run from ``part00`` without a gap, decompresses the stream into ``OUT/<wheel>``
and checks its sha256 when a ``.sha256`` file came along. A missing part, a part that differs between folders,
two wheels, or a damaged stream is named in one line (``SystemExit``).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import re
import sys
from pathlib import Path

PART = re.compile(r"^(?P<wheel>.+\.whl)\.xz\.part(?P<index>\d{2,})$")
CHUNK = 1 << 20
XZ_STREAM_MIB = 209  # onnxruntime-gpu 1.31.1, cp312 (the H200 run of 2026-11-28 staged it)
MAX_MIB = 52  # five parts of that stream; each beside a checkout (~6 MiB of tracked files) in a 64 MiB copy


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def split_wheel(wheel: Path, out: Path, max_mib: float = MAX_MIB, folders: int = 1, preset: int = 6) -> list[Path]:
    """xz-compress ``wheel`` and cut the stream into parts of at most ``max_mib`` MiB under ``out`` (or
    ``out/a``, ``out/b``, ... round-robin when ``folders`` > 1); returns the parts in order."""
    if not wheel.name.endswith(".whl") or not wheel.is_file():
        raise SystemExit(f"split: received {wheel}; expected a .whl file")
    limit = int(max_mib * 2**20)
    dirs = [out] if folders <= 1 else [out / chr(ord("a") + i) for i in range(folders)]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    parts: list[Path] = []
    buf = bytearray()

    def flush(final: bool = False) -> None:
        while len(buf) >= limit or (final and buf):
            path = dirs[len(parts) % len(dirs)] / f"{wheel.name}.xz.part{len(parts):02d}"
            path.write_bytes(bytes(buf[:limit]))
            del buf[:limit]
            parts.append(path)

    comp = lzma.LZMACompressor(preset=preset)
    with open(wheel, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            buf += comp.compress(block)
            flush()
    buf += comp.flush()
    flush(final=True)
    digest = f"{sha256_file(wheel)}  {wheel.name}\n"
    for d in dirs:
        (d / f"{wheel.name}.sha256").write_text(digest)
    return parts


def join_wheel(folders: list[Path], out: Path) -> Path:
    """The wheel whose parts lie in ``folders``, decompressed into ``out`` (see the module docstring)."""
    name, parts, digest = scan_parts(folders)
    expected = list(range(max(parts) + 1))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / name
    dec = lzma.LZMADecompressor()
    try:
        with open(wheel, "wb") as f:
            for i in expected:
                with open(parts[i], "rb") as p:
                    for block in iter(lambda: p.read(CHUNK), b""):
                        f.write(dec.decompress(block))
    except lzma.LZMAError as exc:
        raise SystemExit(f"--ort-gpu-parts: {name}: the parts do not decompress ({exc}); expected an xz stream cut in order") from None
    if not dec.eof:
        raise SystemExit(f"--ort-gpu-parts: {name}: the xz stream ends early after part{expected[-1]:02d}; a last part is missing")
    if digest is not None and sha256_file(wheel) != digest:
        raise SystemExit(f"--ort-gpu-parts: {name}: sha256 {sha256_file(wheel)[:16]}... after joining; expected {digest[:16]}...")
    return wheel


def scan_parts(folders: list[Path]) -> tuple[str, dict[int, Path], str | None]:
    """(the wheel's file name, its parts by index, its sha256 from the ``.sha256`` file or None) of the one wheel
    whose parts lie in ``folders``, checked to run from part00 without a gap (nothing is decompressed)."""
    found: dict[str, dict[int, Path]] = {}
    digests: dict[str, str] = {}
    for folder in folders:
        if not folder.is_dir():
            raise SystemExit(f"--ort-gpu-parts: received {folder}, which is not a folder; expected folders of WHEEL.xz.partNN")
        for path in sorted(folder.iterdir()):
            m = PART.match(path.name)
            if m:
                parts = found.setdefault(m["wheel"], {})
                i = int(m["index"])
                if i in parts and parts[i].read_bytes() != path.read_bytes():
                    raise SystemExit(f"--ort-gpu-parts: {path.name} is in two folders with different bytes ({parts[i]}, {path})")
                parts[i] = path
            elif path.name.endswith(".whl.sha256"):
                digests[path.name[: -len(".sha256")]] = path.read_text().split()[0]
    if len(found) != 1:
        raise SystemExit(f"--ort-gpu-parts: received parts of {sorted(found) or 'no wheel'} under {[str(f) for f in folders]}; "
                         "expected the WHEEL.xz.partNN files of one wheel (benchmarks/wheel_parts.py split)")  # fmt: skip
    (name, parts), = found.items()
    expected = list(range(max(parts) + 1))
    if sorted(parts) != expected:
        missing = [f"part{i:02d}" for i in expected if i not in parts]
        raise SystemExit(f"--ort-gpu-parts: {name}: received parts {[f'part{i:02d}' for i in sorted(parts)]}; missing {missing}")
    return name, parts, digests.get(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="WHEEL OUT: xz parts of at most --max-mib each")
    s.add_argument("wheel", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--max-mib", type=float, default=MAX_MIB)
    s.add_argument("--folders", type=int, default=1, help="spread the parts over OUT/a, OUT/b, ... (one per copy)")
    j = sub.add_parser("join", help="FOLDER... --out DIR: the wheel back, checked")
    j.add_argument("folders", type=Path, nargs="+")
    j.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "split":
        for p in split_wheel(args.wheel, args.out, args.max_mib, args.folders):
            print(f"{p} ({p.stat().st_size / 2**20:.1f} MiB)")
    else:
        print(join_wheel(args.folders, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
