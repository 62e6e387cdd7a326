"""The cost profile's file: what :class:`Profile` holds, its strict reader, and where it is saved and found.

**Profiles.** ``AnytimeRunner.profile()`` times every step (and every
unit) after warm-up and saves a :class:`Profile` next to the bundle, as
``<bundle>/profiles/<device>-<backend>-<plan>-<precision>.json`` keyed by
batch size (``...-<precision>-<digest>.json`` when backend options that change
what a step costs, such as threads or bfloat16, are not the defaults). If the
bundle directory is read-only it goes to the user cache
(``$HNE_EDGE_CACHE`` or ``$XDG_CACHE_HOME/hne-edge`` or ``~/.cache/hne-edge``,
under ``profiles/<manifest sha256[:16]>/``) with a warning. A new runner
loads a profile that matches the manifest's sha256, backend, device, plan,
precision and those backend options; where both the bundle and the cache hold one, the one measured last
(its ``created`` time) wins, the bundle's on a tie: profiling a read-only
bundle again replaces its stale profile as profiling a writable one does.

The online model that predicts from a profile is :mod:`.cost_model`.
"""

from __future__ import annotations

import math
import os
import platform
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..bundle import (  # a bundle's profiles/: its rule
    MANIFEST_NAME, PROFILE_FORMAT, PROFILES_DIR, not_a_profile, profile_filename, sha256_bytes,
)  # fmt: skip
from ..bundle.schema import parse_json
from ..errors import BundleError, HNEError, InputError
from ..fileio import atomic_write_json, foreign_file, refuse_foreign
from ..limits import MAX_JSON_BYTES, read_bounded

__all__ = [
    "PROFILE_VERSION",
    "Profile",
    "ProfileError",
    "read_profile",
    "save_profile",
    "check_profile_target",
    "find_profile",
    "profile_filename",
    "user_cache_dir",
    "cache_profile_path",
    "host_info",
    "summarize",
]

PROFILE_VERSION = 1


def summarize(samples_s: Sequence[float]) -> dict[str, float]:
    """median / p90 / p95 / mean in milliseconds of samples given in seconds."""
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {
        "median_ms": float(np.median(a)),
        "p90_ms": float(np.quantile(a, 0.90)),
        "p95_ms": float(np.quantile(a, 0.95)),
        "mean_ms": float(a.mean()),
    }


def user_cache_dir() -> Path:
    if os.environ.get("HNE_EDGE_CACHE"):
        return Path(os.environ["HNE_EDGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hne-edge"


class ProfileError(HNEError, ValueError):
    """A saved cost profile is malformed. Runners ignore such a file with a warning."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(where: str, expected: str, value: Any) -> None:
    raise ProfileError(f"{where} must be {expected}; received {_short(value)}")


def _obj(value: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(value, dict):
        _fail(where, "an object", value)
    missing = sorted(required - set(value))
    if missing:
        raise ProfileError(f"{where} is missing key(s) {missing}")
    extra = sorted(set(value) - required - optional)
    if extra:
        raise ProfileError(f"{where} has unknown key(s) {_short(extra)}; expected only {sorted(required | optional)}")
    return value


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (10**400)
        return False


def _number(value: Any, where: str, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)
    if not ok or value < 0 or (positive and value == 0):
        _fail(where, "a positive finite number" if positive else "a finite number >= 0", value)
    return float(value)


def _batch_entry(entry: Any, where: str, num_leaves: int | None) -> dict[str, Any]:
    """One batch size of a profile: ``leaves`` (used for predictions) and what ``profile()`` reports."""
    _obj(entry, where, {"leaves"}, {"warmup", "repeats", "units", "levels"})
    leaves = entry["leaves"]
    if not isinstance(leaves, list) or not leaves:
        _fail(f"{where}.leaves", "a non-empty list", leaves)
    if num_leaves is not None and len(leaves) != num_leaves:
        raise ProfileError(f"{where}.leaves has {len(leaves)} leaves; expected {num_leaves}")
    for i, leaf in enumerate(leaves):
        at = f"{where}.leaves[{i}]"
        _obj(leaf, at, {"median_ms"}, {"leaf", "adds", "p90_ms", "p95_ms", "mean_ms", "samples_ms"})
        _number(leaf["median_ms"], f"{at}.median_ms", positive=True)
        if "leaf" in leaf and (leaf["leaf"] != i or isinstance(leaf["leaf"], bool)):
            _fail(f"{at}.leaf", str(i), leaf["leaf"])
        adds = leaf.get("adds", [0, 1])
        if not (isinstance(adds, list) and len(adds) == 2 and all(type(v) is int for v in adds) and 0 <= adds[0] < adds[1]):
            _fail(f"{at}.adds", "[first leaf, end] with 0 <= first < end", adds)
        for key in ("p90_ms", "p95_ms", "mean_ms"):
            if key in leaf:
                _number(leaf[key], f"{at}.{key}")
        samples = leaf.get("samples_ms", [])
        if not isinstance(samples, list):
            _fail(f"{at}.samples_ms", "a list", samples)
        for k, v in enumerate(samples):
            _number(v, f"{at}.samples_ms[{k}]")
    for key in ("warmup", "repeats"):
        if key in entry and (type(entry[key]) is not int or entry[key] < 0):
            _fail(f"{where}.{key}", "an int >= 0", entry[key])
    units, levels = entry.get("units", {}), entry.get("levels", [])
    if not isinstance(units, dict):
        _fail(f"{where}.units", "an object", units)
    if not isinstance(levels, list):
        _fail(f"{where}.levels", "a list", levels)
    for at, stats in [*((f"units[{k!r}]", v) for k, v in units.items()), *((f"levels[{k}]", v) for k, v in enumerate(levels))]:
        if not isinstance(stats, dict):
            _fail(f"{where}.{at}", "an object", stats)
        for name, v in stats.items():
            _number(v, f"{where}.{at}.{name}")
    return entry


@dataclass
class Profile:
    """Measured leaf (and unit) latencies of one bundle variant on one device, per batch size.

    ``batches[b]["leaves"][i]`` holds ``median_ms``, ``p90_ms``, ``p95_ms``,
    ``mean_ms`` and ``samples_ms`` for step ``i`` (everything the scheduler
    does to add its leaves ``adds = [first, end)``; for plans "segments" and
    "nodes" step ``i`` adds leaf ``i``: the key keeps its name from then);
    ``batches[b]["units"]`` the same per model file; ``batches[b]["levels"]``
    the latency of the first ``n`` leaves at each stop (median / p95 over
    repetitions).
    """

    model_name: str
    manifest_sha256: str
    backend: str
    device: str
    plan: str
    precision: str
    batches: dict[int, dict[str, Any]]
    backend_info: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    # the file it was read from or last saved to; None while it lives in memory only (measured with save=False)
    path: Path | None = field(default=None, compare=False, repr=False)

    @property
    def filename(self) -> str:
        return profile_filename(self.device, self.backend, self.plan, self.precision, self.backend_info.get("options"))

    @property
    def label(self) -> str:
        """How a warning names it: its file, or an in-memory profile, for which no file of its name exists."""
        return f"saved profile {self.path}" if self.path is not None else "in-memory profile (measured here, in no file)"

    def leaf_medians_s(self, batch: int) -> list[float]:
        return [leaf["median_ms"] / 1e3 for leaf in self.batches[batch]["leaves"]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "model_name": self.model_name,
            "manifest_sha256": self.manifest_sha256,
            "backend": self.backend,
            "device": self.device,
            "plan": self.plan,
            "precision": self.precision,
            "backend_info": self.backend_info,
            "host": self.host,
            "created": self.created,
            "batch_sizes": {str(b): v for b, v in sorted(self.batches.items())},
        }

    @classmethod
    def from_dict(cls, d: Any, num_leaves: int | None = None, batch_range: Sequence[int] | None = None) -> "Profile":
        """Validate a saved profile strictly (:class:`ProfileError` names the location, what was received and
        what was expected); ``num_leaves``: the bundle's, which every batch size must have; ``batch_range``: the
        bundle's ``(min, opt, max)``, which every batch size must be within (no frame of it has another size)."""
        _obj(d, "profile", {"format", "version", "model_name", "manifest_sha256", "backend", "device", "plan",
                            "precision", "batch_sizes"}, {"backend_info", "host", "created"})  # fmt: skip
        if d["format"] != PROFILE_FORMAT:
            _fail("format", repr(PROFILE_FORMAT), d["format"])
        if d["version"] != PROFILE_VERSION or isinstance(d["version"], bool):
            _fail("version", str(PROFILE_VERSION), d["version"])
        for key in ("model_name", "manifest_sha256", "backend", "device", "plan", "precision", "created"):
            if key in d and not isinstance(d[key], str):
                _fail(key, "str", d[key])
        for key in ("backend_info", "host"):
            if key in d and not isinstance(d[key], dict):
                _fail(key, "an object", d[key])
        sizes = d["batch_sizes"]
        if not isinstance(sizes, dict) or not sizes:
            _fail("batch_sizes", "a non-empty object", sizes)
        batches = {}
        for key, entry in sizes.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and key[0] != "0" and len(key) <= 6):
                _fail(f"batch_sizes key {key!r}", 'a positive int (written as a string, like "1")', key)
            if batch_range is not None and not batch_range[0] <= int(key) <= batch_range[-1]:
                _fail(f"batch_sizes key {key!r}", f"a batch size in the bundle's range {batch_range[0]}..{batch_range[-1]}", key)
            batches[int(key)] = _batch_entry(entry, f"batch_sizes[{key!r}]", num_leaves)
            num_leaves = len(entry["leaves"])  # every batch size profiles the same leaves
        return cls(
            model_name=d["model_name"],
            manifest_sha256=d["manifest_sha256"],
            backend=d["backend"],
            device=d["device"],
            plan=d["plan"],
            precision=d["precision"],
            batches=batches,
            backend_info=d.get("backend_info", {}),
            host=d.get("host", {}),
            created=d.get("created", ""),
        )

    def matches(self, manifest_sha256: str, backend: str, device: str, plan: str, precision: str,
                timing: Mapping[str, Any] | None = None) -> bool:
        return self.mismatch(manifest_sha256, backend, device, plan, precision, timing) is None

    def mismatch(self, manifest_sha256: str, backend: str, device: str, plan: str, precision: str,
                 timing: Mapping[str, Any] | None = None) -> str | None:
        """Why this profile is not the one of that bundle and variant (None: it is); ``timing``: the backend's
        options that change what a step costs, as its ``describe()`` says them (each one this profile's
        ``backend_info`` records must be the same: bfloat16 or other threads time other steps)."""
        if self.manifest_sha256 != manifest_sha256:
            return (f"it was measured for another version of this bundle (manifest sha256 {self.manifest_sha256[:12]}...; "
                    f"this bundle's is {manifest_sha256[:12]}...)")  # fmt: skip
        for name, mine, wanted in (("backend", self.backend, backend), ("device", self.device, device),
                                   ("plan", self.plan, plan), ("precision", self.precision, precision)):  # fmt: skip
            if mine != wanted:
                return f"it was measured for {name} {_short(mine)}, not {_short(wanted)}"
        for name, wanted in (timing or {}).items():
            if name in self.backend_info and self.backend_info[name] != wanted:
                return f"it was measured with {name}={_short(self.backend_info[name])}, not {_short(wanted)}"
        return None


def host_info() -> dict[str, Any]:
    return {"machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count(), "python": platform.python_version()}


def cache_profile_path(profile: Profile) -> Path:
    return user_cache_dir() / "profiles" / profile.manifest_sha256[:16] / profile.filename


def _outside(bundle_dir: str | os.PathLike, path: Path) -> str | None:
    """Why ``path`` (under the bundle) must not be used: it resolves outside the bundle (a symlink); else None."""
    root, target = Path(bundle_dir).resolve(), path.resolve()
    if root in target.parents:
        return None
    return f"{path} resolves to {target}, outside the bundle {root} (a symlink)"


def check_profile_target(bundle_dir: str | os.PathLike, filename: str, force: bool = False) -> Path:
    """Where a profile named ``filename`` goes in the bundle, once nothing of the user's is there (``hne-edge
    profile`` asks before it measures): raises :class:`~hne_edge.errors.InputError` naming the file when it is not
    a profile the runtime wrote (:func:`~hne_edge.bundle.not_a_profile`), unless ``force``."""
    target = Path(bundle_dir) / PROFILES_DIR / filename
    refuse_foreign(target, not_a_profile, force=force, under=bundle_dir)
    return target


def _not_the_bundle(bundle_dir: str | os.PathLike, profile: Profile) -> str | None:
    """Why ``bundle_dir`` no longer holds the bundle ``profile`` measured: its manifest gone (the folder is never
    re-created for a profile) or another bundle's (one put at its path must not get this profile); else None."""
    manifest = Path(bundle_dir) / MANIFEST_NAME
    try:
        raw = read_bounded(manifest, "a bundle manifest", MAX_JSON_BYTES)
    except (OSError, HNEError):
        return f"{manifest} is gone (the bundle was removed or moved)"
    if sha256_bytes(raw) != profile.manifest_sha256:
        return f"{manifest} is another bundle's (replaced since the runner opened it)"
    return None


def save_profile(profile: Profile, bundle_dir: str | os.PathLike, force: bool = False) -> tuple[Path, bool]:
    """Write next to the bundle, else to the user cache. Returns (path, fell_back_to_cache).

    Never writes through a symlink that leads out of the bundle (``profiles/`` or the file itself), and never
    over what is not a profile the runtime wrote (:func:`~hne_edge.bundle.not_a_profile`: a user's file of that
    name, a link; ``force`` replaces those, a link itself, not what it points to) nor over a folder: what is there
    stays, and the profile goes to the user cache, with a warning. So does a profile whose bundle is no longer at
    ``bundle_dir`` (its manifest gone or another's).
    """
    if not profile.created:
        profile.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    target = Path(bundle_dir) / PROFILES_DIR / profile.filename
    # force replaces a link at the name, not its target
    why = _not_the_bundle(bundle_dir, profile) or _outside(bundle_dir, target.parent if force else target)
    if why is None and (foreign := foreign_file(target, not_a_profile, force=force, under=bundle_dir)) is not None:
        why = f"refusing to replace {target}: {foreign}"
    if why is None:
        try:
            atomic_write_json(target, profile.to_dict())
            profile.path = target
            return target, False
        except OSError as exc:
            why = f"bundle directory {bundle_dir} is not writable ({exc.strerror or exc})"
    fallback = cache_profile_path(profile)
    atomic_write_json(fallback, profile.to_dict())
    profile.path = fallback
    warnings.warn(f"{why}; saved the profile to {fallback}", stacklevel=2)
    return fallback, True


def read_profile(path: Path, num_leaves: int | None = None, batch_range: Sequence[int] | None = None) -> Profile:
    """Read and validate one saved profile (:class:`ProfileError` if it is not valid): a regular file of at most
    :data:`~hne_edge.limits.MAX_JSON_BYTES`, strict JSON as the manifest is (no key twice, no NaN), then
    :meth:`Profile.from_dict`."""
    try:
        data = parse_json(read_bounded(path, "a saved profile"), "profile", "a saved profile")
    except (BundleError, InputError) as exc:
        raise ProfileError(str(exc).removeprefix(f"{path}: ").removeprefix("profile: ")) from None
    profile = Profile.from_dict(data, num_leaves, batch_range)
    profile.path = path
    return profile


_SAID: set[tuple[str, str, str]] = set()  # (path, its manifest sha256, the bundle's): stale profiles already named


def find_profile(
    bundle_dir: str | os.PathLike,
    manifest_sha256: str,
    backend: str,
    device: str,
    plan: str,
    precision: str,
    num_leaves: int | None = None,
    batch_range: Sequence[int] | None = None,
    options: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
) -> tuple[Profile | None, Path | None, str]:
    """The matching saved profile, its path, and why (not) found: of the bundle's and the user cache's, the one
    measured last (the bundle's on a tie, or when neither says when), so that a profile saved to the cache because
    the bundle is read-only is not hidden by the bundle's older one.

    An invalid profile, or one reached through a symlink out of the bundle, is ignored with a warning; so is one
    made for another version of the bundle or another variant, once a process (each runner on the bundle would
    say it again: bench-streams opens one per camera). ``options``: the backend's options not at their defaults
    (they name the file); ``timing``: see :meth:`Profile.mismatch`.
    """
    name = profile_filename(device, backend, plan, precision, options)
    in_bundle = Path(bundle_dir) / PROFILES_DIR / name
    candidates = [in_bundle, user_cache_dir() / "profiles" / manifest_sha256[:16] / name]
    reasons, found = [], []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            why = _outside(bundle_dir, path) if path is in_bundle else None
            if why is not None:
                raise ProfileError(f"not read: {why}")
            profile = read_profile(path.resolve(), num_leaves, batch_range)
        except (ProfileError, OSError) as exc:
            warnings.warn(f"ignoring saved profile {path}: {exc}", stacklevel=2)
            reasons.append(f"{path}: ignored ({exc})")
            continue
        why = profile.mismatch(manifest_sha256, backend, device, plan, precision, timing)
        if why is not None:
            if (str(path), profile.manifest_sha256, manifest_sha256) not in _SAID:
                _SAID.add((str(path), profile.manifest_sha256, manifest_sha256))
                warnings.warn(f"ignoring saved profile {path}: {why}; profiling the bundle again replaces it", stacklevel=2)
            reasons.append(f"{path}: ignored ({why})")
            continue
        found.append((profile, path))
    if not found:
        return None, None, "; ".join(reasons) or f"no saved profile {name}"
    profile, path = max(found, key=lambda pair: _measured_at(pair[0]))  # max keeps the first on a tie: the bundle's
    older = [str(p) for other, p in found if _measured_at(other) < _measured_at(profile)]
    return profile, path, f"loaded {path}" + (f" (measured after {older[0]})" if older else "")


def _measured_at(profile: Profile) -> float:
    """When ``profile`` was measured (seconds since the epoch, as its ``created`` says); -inf when it does not say."""
    try:
        return datetime.strptime(profile.created, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        try:  # another ISO 8601 form; without a zone, local time (as time.strftime wrote it)
            return datetime.fromisoformat(profile.created).timestamp()
        except ValueError:
            return -math.inf
