"""The compiled schedule: the *steps* that evaluate the tree depth-first, and which step comes next.

A **step** is the unit calls that add a known range of leaves ``[lo, hi)``
(depth-first positions), ending with their logits on the logits slot:

* plans "segments" and "nodes": one step per leaf (``hi = lo + 1``): the
  leaf's chain of segment file(s) or node files;
* plan "subtrees": leaf 0's chain, then one step per whole subtree
  (:attr:`~hne_edge.tree.TreeSpec.subtree_units`; 1, 2, 4, ... leaves);
* plan "fused": one step, the whole tree.

The session's position is the number of leaves done. ``at[n]`` is the step
the plan takes from position ``n`` (``-1`` where the plan cannot be: inside
a subtree step). A **mixed** program (runtime plan "mixed") has the
per-leaf steps as its base walk (steps ``0 .. N-1``, step ``i`` adds leaf
``i``) and, in ``alts[n]``, the bigger steps that also start at ``n`` (a
whole subtree at each sub-ensemble boundary, the whole tree at 0). At a
boundary the cached activations are the same whichever way the session got
there, so :func:`choose` - the one rule that picks - may take a big step or
the next leaf. Its rule, in the order checked:

1. the big step must end within ``max_leaves``;
2. the whole-tree step only when nothing can cancel, refine or stop the
   frame early: a ``run()`` (not a session), without ``stop_when``, that may
   evaluate every leaf. A subtree step only without ``stop_when`` (the stop
   rule sees every leaf, as with plan "segments");
3. its measured median must be no slower than the medians of the
   leaf-by-leaf steps it replaces (so a fused subtree that measures slower is
   never taken; medians, not the budget predictions, whose tail margins and
   caps differ between one big step and many small ones). Until both are
   measured, the one not yet measured is tried, the big step first: a frame
   at a batch size the runner has not seen measures each once
   (``runner.profile()`` measures them all up front);
4. with a budget, it must fit the time left (unless every leaf it adds is
   forced by ``min_leaves``).

Otherwise the next leaf's step (which must fit the budget in its turn).
Leaf 0's step has an export-free twin where the bundle has the first-leaf
file: a frame that ends after leaf 0 runs it (``max_leaves=1``, or a
``run()`` whose budget holds no step after leaf 0: :func:`ends_after_leaf_0`).

:func:`compile_program` is pure: it reads the tree and the runners' units
(which nodes each computes, from which input, with which outputs) and
returns a :class:`Program` of slot indices and callables. It never calls a
runner, so it is testable without a backend.

Slots: the session's activation cache is a list indexed by slot; slot 0 is
the image, slot ``k + 1`` the activation of ``tree.nodes[k]`` and the last
slot the logits of the step just run. After a step every cached activation
whose subtree has no leaf left (last leaf in ``[lo, hi)``) is dropped, so at
most one activation per depth (the current path) plus the image is held.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, Sequence

from ..errors import BundleError
from ..tree import TreeSpec

__all__ = ["Call", "Step", "Program", "compile_program", "choose", "ends_after_leaf_0", "best_leaves", "step_io", "STEP_KINDS"]

#: what a step adds: one leaf, a whole subtree, the whole tree
STEP_KINDS = ("leaf", "subtree", "tree")
_STEP_KIND = {"segment": "leaf", "node": "leaf", "subtree": "subtree", "tree": "tree"}  # by the last unit's kind


class Call(NamedTuple):
    """One unit call of a step: ``cache[dsts[j]] = run((cache[src],))[j]``."""

    run: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    src: int
    dsts: tuple[int, ...]
    name: str  # the unit's name (profiles time units by it)


class Step(NamedTuple):
    """The calls that add leaves ``lo .. hi-1`` (the loop unpacks it; keep the field order)."""

    calls: tuple[Call, ...]
    final: tuple[Call, ...]  # the same, when the session ends here: the last call returns only the logits
    lo: int
    hi: int
    drops: tuple[int, ...]  # slots freed once its logits are on the host
    several: bool  # its logits are one (batch, hi - lo, classes) tensor; else (batch, classes) of leaf lo
    name: str  # its units' names, " + "-joined (profiles)
    kind: str  # one of STEP_KINDS


@dataclass(frozen=True)
class Program:
    """Steps over numbered cache slots, and which one to take at each position (see the module docstring)."""

    slots: dict[str | None, int]  # node id (None: the image) -> slot
    logits_slot: int
    steps: tuple[Step, ...]
    at: tuple[int, ...]  # position n (leaves done) -> the step the plan takes from there; -1: never there
    alts: tuple[tuple[int, ...], ...] | None  # mixed programs: position -> bigger steps from there, biggest first
    path: tuple[int, ...]  # the steps the base walk takes from 0 to N (its cost is the full tree's)
    stops: tuple[int, ...]  # the leaf counts a session can end at (every n for a mixed or per-leaf program)
    first_leaf: bool  # step at[0]'s final runs the export-free first-leaf file (not leaf 0's chain)

    @property
    def num_slots(self) -> int:
        return self.logits_slot + 1

    @property
    def num_leaves(self) -> int:
        return len(self.at)

    @property
    def mixed(self) -> bool:
        return self.alts is not None

    def stop_at_most(self, n: int) -> int:
        """The largest stop <= ``n`` (0: none)."""
        return max((s for s in self.stops if s <= n), default=0)

    def stop_at_least(self, n: int) -> int:
        """The smallest stop >= ``n`` (``n`` <= 0: 0)."""
        return 0 if n <= 0 else min(s for s in self.stops if s >= n)

    def walk(self, start: int, end: int) -> list[int]:
        """The steps the plan takes from position ``start`` until ``end`` leaves are done (a mixed program: its base
        walk; the forced leaves of a frame are ``walk(0, min_leaves)``)."""
        out, n = [], start
        while n < end:
            out.append(self.at[n])
            n = self.steps[out[-1]].hi
        return out

    def routes(self) -> tuple["Program", ...]:
        """One plain program per kind of step a mixed program can take: leaf by leaf, subtree by subtree
        where it can, the whole tree. Same steps (same indices, so the same cost-model entries), no choice:
        the warm-up and the profiler run each, so every step is warmed up and measured. A plain program: itself."""
        if self.alts is None:
            return (self,)
        routes = [self._route(())]
        kinds = {self.steps[c].kind for alts in self.alts for c in alts}
        for kinds_taken in (("subtree",), ("tree",)):
            if set(kinds_taken) & kinds:
                routes.append(self._route(kinds_taken))
        return tuple(routes)

    def _route(self, kinds: Sequence[str]) -> "Program":
        at, path, n = [-1] * self.num_leaves, [], 0
        while n < self.num_leaves:
            j = next((c for c in self.alts[n] if self.steps[c].kind in kinds), self.at[n])  # type: ignore[index]
            at[n] = j
            path.append(j)
            n = self.steps[j].hi
        return replace(self, at=tuple(at), alts=None, path=tuple(path), stops=tuple(self.steps[j].hi for j in path))


def choose(
    program: Program,
    n: int,
    now: float,
    stop_at: float | None,
    pred: Sequence[float],
    median: Sequence[float] | None,
    known: Sequence[bool] | None,
    n_stop: int,
    n_min: int,
    whole: bool,
    subtrees: bool,
) -> int:
    """The step a mixed program takes at position ``n`` (the rule of the module docstring, in one place).

    ``pred``: the cost model's predicted seconds per step (what a budget must fit); ``median``: its measured
    median per step (what the speeds are compared by; None: ``pred``); ``known``: which steps it has
    measured (None: all); ``n_stop`` / ``n_min``: the leaves the call may end at / must reach; ``whole``:
    nothing can cancel, refine or stop this frame early (the whole-tree step is allowed); ``subtrees``:
    subtree steps are allowed (no stop rule).
    """
    steps = program.steps
    speed = pred if median is None else median
    for c in program.alts[n]:  # type: ignore[index]
        step = steps[c]
        if step.hi > n_stop or not (whole if step.kind == "tree" else subtrees):
            continue
        if known is None or known[c]:
            # the base walk's steps n .. hi-1 are steps n .. hi-1; until they are measured, measure them
            if (known is not None and not all(known[n : step.hi])) or speed[c] > sum(speed[n : step.hi]):
                continue  # measured slower than leaf by leaf: never
        if stop_at is not None and step.hi > n_min and now + pred[c] > stop_at:
            continue
        return c
    return program.at[n]


def ends_after_leaf_0(program: Program, now: float, stop_at: float, leaf0: float, pred: Sequence[float],
                      known: Sequence[bool]) -> bool:  # fmt: skip
    """Whether a frame at position 0 with time to ``stop_at`` stops after leaf 0 even if leaf 0's step runs fast
    (``leaf0`` seconds: the fast end of its recent times): then no step that can follow fits at its prediction
    (``pred``, what the budget check after leaf 0 will ask). Such a frame runs the export-free first-leaf file,
    which costs less than leaf 0's exporting chain (``program.first_leaf``; on ONNX Runtime CUDA 1.43 ms against
    about 1.9, issue 40), so a budget between the two is met instead of overrun. Only when the steps involved are
    measured (``known``): a step predicted from nothing is no reason to skip learning it."""
    j = program.at[0]
    hi = program.steps[j].hi
    if not program.first_leaf or hi >= program.num_leaves:
        return False
    after = [program.at[hi], *(program.alts[hi] if program.alts is not None else ())]
    if not (known[j] and all(known[c] for c in after)):
        return False
    return now + leaf0 + min(pred[c] for c in after) > stop_at


def step_io(step: Step) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the slots ``step`` reads from the cache it starts on, the slots it writes that stay cached after it).

    What running a step for several frames at once needs (the stream scheduler): the slots read are stacked
    from each frame's cache, the slots kept are split back into them; the logits slot and the slots the step
    drops are neither (its ``final`` calls, which end a frame, keep nothing)."""
    written: set[int] = set()
    reads: list[int] = []
    for c in step.calls:
        if c.src not in written and c.src not in reads:
            reads.append(c.src)
        written.update(c.dsts)
    keeps = sorted(written - set(step.drops))
    return tuple(reads), tuple(keeps)


def best_leaves(program: Program, seconds: Sequence[float], budget: float, whole: bool = True, split: bool = False) -> int:
    """The most leaves any schedule of ``program`` fits in ``budget`` seconds, knowing every step's true time
    (``seconds[j]`` for step ``j``): the oracle :func:`choose` is measured against. At least the first step's
    leaves (always evaluated). ``whole``: the whole-tree step is allowed (as for a ``run()``).

    The oracle stops only where the program can stop (after a whole step) and takes only the steps it has:
    a plain program its one walk, a mixed program any sequence of its real steps (leaf by leaf, a whole
    subtree, the whole tree). That is the plan-achievable oracle, the one the benchmarks compare with.

    ``split=True`` is an upper bound instead, not a schedule: each step's time is split evenly over its
    leaves and the walk may stop inside a step, as if its leaves came one at a time at their average cost.
    On a GPU a 16-leaf call costs about twice a 1-leaf call, so this credits a plan with stops that no plan
    can make; it is reported only as a labelled bound.
    """
    n_leaves = program.num_leaves
    reach = [0.0] + [float("inf")] * n_leaves  # the least time to have done n leaves
    best = 0
    for n in range(n_leaves):
        if reach[n] == float("inf"):
            continue
        options = (program.at[n], *(program.alts[n] if program.alts is not None else ()))
        for j in options:
            step = program.steps[j]
            if j >= 0 and (whole or step.kind != "tree"):
                reach[step.hi] = min(reach[step.hi], reach[n] + seconds[j])
                if split and reach[n] <= budget:  # the leaves of this step that fit at its average cost per leaf
                    per_leaf = seconds[j] / (step.hi - step.lo)
                    inside = step.hi - n if per_leaf <= 0 else min(step.hi - n, int((budget - reach[n]) / per_leaf + 1e-9))
                    best = max(best, n + inside)
    fit = [n for n in range(1, n_leaves + 1) if reach[n] <= budget]
    return max(max(fit, default=0), best, program.steps[program.at[0]].hi)


def _leaf_chains(tree: TreeSpec, runners: Sequence[Any], slots: dict[str | None, int], logits: int) -> list[tuple]:
    """(calls, last runner, lo, hi) per leaf, from segment or node units matched along each segment's chain."""
    by_first = {r.unit.nodes[0]: r for r in runners}
    chains = []
    for seg in tree.segments:
        chain: list[Call] = []
        k, prev, runner = 0, seg.input, None
        while k < len(seg.nodes):
            if seg.nodes[k] not in by_first:
                raise BundleError(f"no model file starts at node {seg.nodes[k]} (needed by leaf {seg.leaf})")
            runner = by_first[seg.nodes[k]]
            unit = runner.unit
            if tuple(unit.nodes) != tuple(seg.nodes[k : k + len(unit.nodes)]) or unit.inputs[0].node != prev:
                raise BundleError(
                    f"{unit.name} computes {list(unit.nodes)} from {unit.inputs[0].node or 'image'}; leaf "
                    f"{seg.leaf} needs {list(seg.nodes[k:])} from {prev or 'image'}"
                )
            dsts = tuple(logits if t.name == "logits" else slots[t.node] for t in unit.outputs)
            chain.append(Call(runner.run_impl, slots[prev], dsts, unit.name))
            prev, k = unit.nodes[-1], k + len(unit.nodes)
        if chain[-1].dsts[-1] != logits:
            raise BundleError(f"leaf {seg.leaf}: the last model file of its chain does not output logits last")
        chains.append((tuple(chain), runner, seg.leaf, seg.leaf + 1))
    return chains


def _unit_step(tree: TreeSpec, runner: Any, slots: dict[str | None, int], logits: int) -> tuple:
    """(calls, runner, lo, hi) of a unit that is a whole step (plans "subtrees", "fused")."""
    unit = runner.unit
    if unit.kind == "tree":
        lo, hi = 0, tree.num_leaves
    else:
        u = tree.subtree_units[unit.key]
        if tuple(unit.nodes) != u.nodes or unit.inputs[0].node != u.input:
            raise BundleError(f"{unit.name} computes {list(unit.nodes)} from {unit.inputs[0].node or 'image'}; subtree "
                              f"unit {u.index} is {list(u.nodes)} from {u.input or 'image'}")  # fmt: skip
        lo, hi = u.first_leaf, u.end
    if not unit.outputs or unit.outputs[-1].name != "logits":
        raise BundleError(f"{unit.name}: outputs {[t.name for t in unit.outputs]}; expected logits last")
    dsts = tuple(logits if t.name == "logits" else slots[t.node] for t in unit.outputs)
    return (Call(runner.run_impl, slots[unit.inputs[0].node], dsts, unit.name),), runner, lo, hi


def compile_program(tree: TreeSpec, runners: Sequence[Any], first: Any = None, alternatives: Sequence[Any] = ()) -> Program:
    """The program of ``tree`` over ``runners`` (each with ``unit``, ``run_impl`` and ``run_logits_impl``).

    ``runners``: the base walk's units - segment or node units (a step per leaf), or subtree / tree units
    (a step per unit). ``alternatives``: subtree / tree units a mixed program may take instead of the
    base walk's leaves (needs a per-leaf base). ``first``: a runner of the export-free first-leaf file
    (image -> leaf 0 logits), or None. Raises :class:`BundleError` when the units do not cover the tree
    in depth-first order, or a step would read an activation the session does not hold there.
    """
    slots: dict[str | None, int] = {None: 0}
    for k, node in enumerate(tree.nodes):
        slots[node.id] = k + 1
    logits = len(slots)
    n_leaves = tree.num_leaves
    per_leaf = all(r.unit.kind in ("segment", "node") for r in runners)
    if per_leaf:
        base = _leaf_chains(tree, runners, slots, logits)
    else:
        base = sorted((_unit_step(tree, r, slots, logits) for r in runners), key=lambda s: s[2])
        ends = [s[3] for s in base]
        if [s[2] for s in base] != [0] + ends[:-1] or not ends or ends[-1] != n_leaves:
            raise BundleError(f"the units add leaves {[(s[2], s[3]) for s in base]}; expected consecutive ranges from 0 "
                              f"to {n_leaves}")  # fmt: skip
    if alternatives and not per_leaf:
        raise BundleError("a mixed program needs a per-leaf base walk (segments or nodes) beside its bigger steps")
    extra = [_unit_step(tree, r, slots, logits) for r in alternatives]
    written = {d for calls, *_ in base + extra for c in calls for d in c.dsts}

    def step(calls: tuple[Call, ...], runner: Any, lo: int, hi: int) -> Step:
        logits_only = Call(lambda inputs, f=runner.run_logits_impl: (f(inputs),), calls[-1].src, (logits,), calls[-1].name)
        final = calls[:-1] + (logits_only,)
        if lo == 0 and hi == 1 and first is not None:  # leaf 0 alone, without the exports
            final = (Call(lambda inputs, f=first.run_logits_impl: (f(inputs),), slots[None], (logits,), first.unit.name),)
        done = sorted(slots[n.id] for n in tree.nodes if lo <= n.leaves[-1] < hi and slots[n.id] in written)
        several = len(runner.unit.outputs[-1].shape) == 3
        kind = _STEP_KIND[runner.unit.kind]
        return Step(calls, final, lo, hi, tuple(done) + (logits,), several, " + ".join(c.name for c in calls), kind)

    steps = [step(*s) for s in base]
    at = [-1] * n_leaves
    for j, s in enumerate(steps):
        at[s.lo] = j
    path = tuple(j for j in at if j >= 0)
    alts = None
    if extra:
        by_pos: dict[int, list[int]] = {}
        for s in extra:
            steps.append(step(*s))
            by_pos.setdefault(steps[-1].lo, []).append(len(steps) - 1)
        alts = tuple(tuple(sorted(by_pos.get(n, ()), key=lambda c: -steps[c].hi)) for n in range(n_leaves))
    _check_cache(tree, steps, at, alts, slots)
    stops = tuple(range(1, n_leaves + 1)) if per_leaf else tuple(steps[j].hi for j in path)
    return Program(slots, logits, tuple(steps), tuple(at), alts, path, stops, first is not None and steps[at[0]].hi == 1)


def _check_cache(tree: TreeSpec, steps: list[Step], at: list[int], alts, slots: dict[str | None, int]) -> None:
    """Every step reads what the session holds where it starts, and leaves what the base walk would (so a
    mixed program may switch at every position its big steps start from)."""
    name = {s: n for n, s in slots.items()}
    held = {0: frozenset({0})}  # position -> slots holding an activation there (the image: always)
    n = 0
    while n < len(at):
        held[steps[at[n]].hi] = _after(steps[at[n]], held[n], name)
        n = steps[at[n]].hi
    for j, s in enumerate(steps):
        if s.lo not in held:
            raise BundleError(f"{s.name} starts at leaf {s.lo}, where the base walk never stops")
        after = _after(s, held[s.lo], name)
        if s.hi in held and after != held[s.hi]:
            raise BundleError(
                f"{s.name} leaves activations {sorted(name[k] or 'image' for k in after)} after leaf {s.hi - 1}; the "
                f"base walk holds {sorted(name[k] or 'image' for k in held[s.hi])} there"
            )


def _after(s: Step, held: frozenset, name: dict[int, str | None]) -> frozenset:
    cache = set(held)
    for c in s.calls:
        if c.src not in cache:
            raise BundleError(f"{c.name} reads {name[c.src] or 'image'}, which the session does not hold before leaf {s.lo}")
        cache.update(c.dsts)
    return frozenset(cache - set(s.drops))
