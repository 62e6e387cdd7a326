"""The compiled schedule: which calls evaluate each leaf, depth-first, and what to drop after it.

:func:`compile_program` is pure: it reads the tree and the runners' units
(which nodes each computes, from which input, with which outputs) and
returns a :class:`Program` of slot indices and callables. It never calls a
runner, so it is testable without a backend.

Slots: the session's activation cache is a list indexed by slot; slot 0 is
the image, slot ``k + 1`` the activation of ``tree.nodes[k]`` and the last
slot a leaf's logits. After leaf ``i`` every activation whose subtree has
no leaf left (``node.leaves[-1] == i``) is dropped, so at most one
activation per depth (the current path) plus the image is ever held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from ..errors import BundleError
from ..tree import TreeSpec

__all__ = ["Call", "Program", "compile_program"]


class Call(NamedTuple):
    """One unit call of a leaf's program: ``cache[dsts[j]] = run((cache[src],))[j]``."""

    run: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    src: int
    dsts: tuple[int, ...]
    name: str  # the unit's name (profiles time units by it)


@dataclass(frozen=True)
class Program:
    """Per-leaf calls and drops over numbered cache slots (see the module docstring)."""

    slots: dict[str | None, int]  # node id (None: the image) -> slot
    logits_slot: int
    calls: tuple[tuple[Call, ...], ...]  # leaf i: the calls that add it after leaf i-1
    finals: tuple[tuple[Call, ...], ...]  # same, but the last call returns only the logits (nothing reads the exports)
    drops: tuple[tuple[int, ...], ...]  # leaf i: slots freed once its logits are on the host
    first_leaf: bool  # finals[0] runs the export-free first-leaf file (not leaf 0's segment)

    @property
    def num_slots(self) -> int:
        return self.logits_slot + 1

    @property
    def num_leaves(self) -> int:
        return len(self.calls)


def compile_program(tree: TreeSpec, runners: Sequence[Any], first: Any = None) -> Program:
    """The program of ``tree`` over ``runners`` (each with ``unit``, ``run_impl`` and ``run_logits_impl``).

    ``first``: a runner of the export-free first-leaf file (image -> leaf 0 logits), or None.
    Raises :class:`BundleError` when the units do not cover each leaf's chain in order.
    """
    slots: dict[str | None, int] = {None: 0}
    for k, node in enumerate(tree.nodes):
        slots[node.id] = k + 1
    logits = len(slots)
    by_first = {r.unit.nodes[0]: r for r in runners}

    def logits_only(runner: Any, src: int) -> Call:  # returns only the leaf's logits (no exports)
        return Call(lambda inputs, f=runner.run_logits_impl: (f(inputs),), src, (logits,), runner.unit.name)

    calls, finals, drops = [], [], []
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
        calls.append(tuple(chain))
        if seg.leaf == 0 and first is not None:  # leaf 0 alone, without the exports
            finals.append((logits_only(first, slots[None]),))
        else:
            finals.append(tuple(chain[:-1]) + (logits_only(runner, chain[-1].src),))
        done_here = [n for n in tree.path(seg.leaf) if tree.node(n).leaves[-1] == seg.leaf]
        drops.append(tuple(slots[n] for n in done_here) + (logits,))
    return Program(slots, logits, tuple(calls), tuple(finals), tuple(drops), first is not None)
