"""The bundle's vocabulary: its plans (one table, :data:`PLAN_TABLE`), precisions, dtypes and formats.

Each plan name is spelled here and nowhere else: every other module, the CLI's
``--plan`` choices and help included, names a plan through these constants or
derives its list from the table (``tests/test_structure.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Plan",
    "PLAN_TABLE",
    "NODES",
    "SEGMENTS",
    "SUBTREES",
    "FUSED",
    "FIRST",
    "WEIGHTS",
    "MIXED",
    "DEFAULT_PLAN",
    "PLANS",
    "ANYTIME_PLANS",
    "MIXED_PLANS",
    "MIXED_NEEDS",
    "MIXED_BASE",
    "RUNNER_PLANS",
    "EXPORT_PLANS",
    "BOTH",
    "ALL",
    "PLAN_GROUPS",
    "FIRST_HOSTS",
    "FORMATS",
    "PRECISIONS",
    "DTYPES",
    "DTYPE_OF",
    "ITEMSIZE",
    "variant_label",
    "activation_name",
]

NODES, SEGMENTS, SUBTREES, FUSED, FIRST, WEIGHTS, MIXED = "nodes", "segments", "subtrees", "fused", "first", "weights", "mixed"
BOTH, ALL = "both", "all"  # `export --plan` groups: see PLAN_GROUPS


@dataclass(frozen=True)
class Plan:
    """One row of :data:`PLAN_TABLE`: how a plan cuts the tree into files and how a runner runs them."""

    name: str
    files: str  # what its files are (`export --plan`'s help); "" for a plan of no files of its own
    runs: str = ""  # how a runner runs it (`run --plan`'s help); "" where no runner runs it alone
    # what one of its files computes, as a runtime unit (runtime.backends.Unit.kind); None: no files, or not run alone
    unit: str | None = None
    # the file_path keyword that names one of its files: "node", "leaf", "unit"; None: one file per variant
    key: str | None = None
    anytime: bool = False  # runs the whole tree, stopping on the way: `export --plan` writes it, a runner runs it
    # its part in the runtime plan "mixed": "base" (the walk leaf by leaf), "needed" (bigger steps it must have),
    # "if present" (bigger steps it takes when the bundle has them); None: no part
    mixed: str | None = None
    both: bool = False  # in `export --plan both` (the two plans there were at first)
    # its run reaches leaf 0 before any other leaf, so the first-leaf file (plan "first") can stand in for its
    # first steps: "first" is written and accepted only beside such a plan (the fused plan's one call is every leaf)
    hosts_first: bool = False
    omitted_by: str | None = None  # written by every export unless this `export` flag is given
    has_files: bool = True  # False: a runtime plan over other plans' files


# In the manifest's order (which is also `export --plan all`'s). A runner's default comes first in ANYTIME_PLANS.
PLAN_TABLE: dict[str, Plan] = {p.name: p for p in (
    Plan(NODES, "one file per tree node", "one call per tree node", unit="node", key="node", anytime=True, both=True,
         hosts_first=True),
    Plan(SEGMENTS, "one file per leaf (its chain from the last shared node)", "leaf by leaf", unit="segment", key="leaf",
         anytime=True, mixed="base", both=True, hosts_first=True),
    # leaf 0's chain, then each later whole subtree as one fused (grouped-convolution) call (TreeSpec.subtree_units):
    # the tree in B + 1 calls, stopping at n = 1, 2, 4, ..., N
    Plan(SUBTREES, "leaf 0's chain, then one file per whole subtree (B+1 calls)",
         "a whole subtree per call (stops at 1, 2, 4, ... leaves)", unit="subtree", key="unit", anytime=True,
         mixed="needed", hosts_first=True),
    # image -> every leaf's logits: the one-call baseline
    Plan(FUSED, "the whole tree in one file", "the whole tree in one call", unit="tree", anytime=True, mixed="if present"),
    # leaf 0's chain (image -> logits) without the exported activations, which a run that stops after the first
    # leaf never reads and which cost up to ~10% (layout reorders, no fusion across them); beside a plan of
    # FIRST_HOSTS
    Plan(FIRST, "leaf 0's chain without the activations later leaves read", unit="segment", key="leaf",
         omitted_by="--no-first-leaf"),
    Plan(WEIGHTS, "torch/model.pt, the fused state_dict (the PyTorch backend)", omitted_by="--no-torch-weights"),
    # a runtime plan, not files: leaf by leaf, or a whole subtree or the whole tree in one call where the budget
    # fits it (runtime/program.py says when)
    Plan(MIXED, "", "per frame, a whole subtree where the budget fits it, else leaf by leaf", has_files=False),
)}  # fmt: skip

DEFAULT_PLAN = SEGMENTS  # what a runner (and `run --plan`) runs unless told
# the plans of a bundle's files, in the manifest's order
PLANS = tuple(name for name, p in PLAN_TABLE.items() if p.has_files)
# the plans that run the whole tree (what a runtime and `hne-edge run --plan` choose from); default first
ANYTIME_PLANS = (DEFAULT_PLAN,) + tuple(name for name, p in PLAN_TABLE.items() if p.anytime and name != DEFAULT_PLAN)
MIXED_PLANS = tuple(name for name, p in PLAN_TABLE.items() if p.mixed)  # whose files plan "mixed" runs, its base first
MIXED_BASE = next(name for name in MIXED_PLANS if PLAN_TABLE[name].mixed == "base")  # its walk, leaf by leaf
MIXED_NEEDS = tuple(name for name in MIXED_PLANS if PLAN_TABLE[name].mixed in ("base", "needed"))  # what it must have
RUNNER_PLANS = ANYTIME_PLANS + tuple(name for name, p in PLAN_TABLE.items() if not p.has_files)
FIRST_HOSTS = tuple(name for name in ANYTIME_PLANS if PLAN_TABLE[name].hosts_first)  # the plans "first" is an add-on to
EXPORT_PLANS = tuple(name for name in PLANS if PLAN_TABLE[name].anytime)  # what `export --plan` names, one by one
PLAN_GROUPS = {BOTH: tuple(name for name in PLANS if PLAN_TABLE[name].both), ALL: EXPORT_PLANS}

FORMATS = ("onnx", "tensorrt", "torch")
PRECISIONS = ("fp32", "fp16")
DTYPES = ("float32", "float16")
DTYPE_OF = dict(zip(PRECISIONS, DTYPES))  # a precision's tensor dtype: {"fp32": "float32", "fp16": "float16"}
ITEMSIZE = {"float32": 4, "float16": 2}


def variant_label(fmt: str, plan: str, precision: str) -> str:
    """How a variant is named to users: in the order of its folders on disk (``onnx/fp32/nodes``)."""
    return f"{fmt}/{precision}/{plan}"


def activation_name(node_id: str | None) -> str:
    """Tensor name of a node's activation (``None``: the image)."""
    return "image" if node_id is None else f"act_{node_id}"
