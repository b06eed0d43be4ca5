"""Split backward on a stage's autograd graph: B now, W later, no work done twice.

B asks autograd for the input gradient only. The engine then runs just the nodes on
paths from the output to the input (the *input closure*); a node there that also leads
to parameters (an *intermediate*, e.g. a Linear's AddmmBackward) runs with only its
input-side outputs requested. A pre-hook captures the gradient arriving at each
intermediate. W later asks autograd for the parameter gradients starting from those
captured gradients, one call per group of parameters sharing intermediates, so it runs
the intermediates again with only their parameter-side outputs requested, plus the
nodes between them and the parameters: exactly the weight-gradient work.

B keeps the graph (retain_graph) for W. What stays from B to W is what W needs: nodes
above the intermediates die with the output's reference after B, and the caller
releases the saved tensors that input-side nodes below them unpacked
(`executor.stage`), leaving the intermediates' and parameter-side nodes' saved tensors
and the captured gradients. Limitation: a parameter that meets the input path at
several intermediates (a layer applied twice, tied weights) makes W walk the input path
between them again (as torch's split does); then B keeps everything and W redoes that
part of B's work.

Ideas from torch.distributed.pipelining._backward; the code is ours.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge


@dataclass
class WeightGroup:
    """Parameters whose gradients start at the same intermediates."""

    params: list[torch.nn.Parameter]
    intermediates: list[Node]
    captured: list[tuple | None] = field(default_factory=list)  # grad_outputs seen by each intermediate

    def roots(self) -> tuple[list[GradientEdge], list[Tensor]]:
        edges, grads = [], []
        for node, grads_in in zip(self.intermediates, self.captured):
            for i, g in enumerate(grads_in or ()):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(g)
        return edges, grads


def parents_of(root: Node) -> dict[Node, list[Node]]:
    """Every node reachable from `root`, mapped to the nodes that feed it a gradient."""
    parents: dict[Node, list[Node]] = {root: []}
    todo = [root]
    while todo:
        node = todo.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            seen = parents.get(child)
            if seen is None:
                parents[child] = [node]
                todo.append(child)
            else:
                seen.append(node)
    return parents


def _upward(start: Node, parents: dict[Node, list[Node]], stop: set[Node]) -> set[Node]:
    """Nodes of `stop` first met walking from `start` towards the output (or, with no
    stop set, every node on the way)."""
    seen, hits, todo = {start}, set(), [start]
    while todo:
        for up in parents[todo.pop()]:
            if up in seen:
                continue
            seen.add(up)
            if up in stop:
                hits.add(up)
            else:
                todo.append(up)
    return seen if not stop else hits


def plan(root: Node, input_node: Node | None,
         params: list[torch.nn.Parameter]) -> tuple[list[WeightGroup], bool]:
    """Group `params` by the intermediates where their gradient leaves the input closure;
    also say whether the input is reached at all. Without an input path (the first
    stage) the whole backward is W's: one group starting at the root."""
    parents = parents_of(root)
    used = [(p, get_gradient_edge(p).node) for p in params]
    used = [(p, n) for p, n in used if n in parents]
    if input_node is None or input_node not in parents:
        return ([WeightGroup([p for p, _ in used], [root])] if used else []), False
    closure = _upward(input_node, parents, set())
    owner: dict[Node, WeightGroup] = {}
    for p, acc in used:
        hits = _upward(acc, parents, closure)
        members, nodes = [p], dict.fromkeys(hits)
        for other in {id(owner[h]): owner[h] for h in hits if h in owner}.values():
            members = other.params + members
            nodes.update(dict.fromkeys(other.intermediates))
        group = WeightGroup(members, list(nodes))
        for node in group.intermediates:
            owner[node] = group
    return list({id(g): g for g in owner.values()}.values()), True


def backward_input(out: GradientEdge, grad: Tensor, x: Tensor | None, params: list[torch.nn.Parameter],
                   observe: Callable[[Node | None], None]) -> tuple[Tensor | None, list[WeightGroup]]:
    """B: the gradient of the stage input `x` (None on the first stage), the graph kept
    for W. `observe(node)` is told which intermediate is running (None between them) so
    the caller can tell which saved tensors only input-side nodes used."""
    input_node = get_gradient_edge(x).node if x is not None else None
    groups, reaches_input = plan(out.node, input_node, params)
    if not reaches_input:
        for group in groups:  # B has nothing to compute: W starts at the output
            group.captured = [tuple(grad if i == out.output_nr else None for i in range(out.output_nr + 1))]
        return (None if x is None else torch.zeros_like(x)), groups
    handles = []
    for group in groups:
        group.captured = [None] * len(group.intermediates)
        for i, node in enumerate(group.intermediates):
            def capture(grad_outputs, group=group, i=i, node=node):
                group.captured[i] = grad_outputs
                observe(node)
            handles.append(node.register_prehook(capture))
            handles.append(node.register_hook(lambda grad_inputs, grad_outputs: observe(None)))
    try:
        (dx,) = torch.autograd.grad([out], [x], [grad], retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    return (torch.zeros_like(x) if dx is None else dx), groups


def backward_weight(groups: list[WeightGroup]) -> None:
    """W: accumulate the parameter gradients of the groups B left into `.grad`, freeing
    the graph as it goes."""
    for group in groups:
        edges, grads = group.roots()
        if not edges:
            continue
        handles = []
        if len(group.intermediates) > 1:
            # a shared parameter: autograd walks the input path between its intermediates
            # again, and the one reached that way must still see only its own gradient
            for node, seen in zip(group.intermediates, group.captured):
                handles.append(node.register_prehook(lambda grad_outputs, seen=seen: seen))
        try:
            torch.autograd.backward(edges, grads, inputs=group.params)
        finally:
            for h in handles:
                h.remove()
        group.captured, group.intermediates = [], []


def shares_parameters(groups: list[WeightGroup]) -> bool:
    """Whether some parameter meets the input path at several intermediates, so that W
    re-runs input-side nodes (and B must keep their saved tensors)."""
    return any(len(g.intermediates) > 1 for g in groups)


def backward_full(out: GradientEdge, grad: Tensor, x: Tensor | None,
                  params: list[torch.nn.Parameter]) -> Tensor | None:
    """BW: input and parameter gradients in one pass (into `x.grad` and `.grad`),
    freeing the graph as it goes; returns the input gradient."""
    torch.autograd.backward([out], [grad], inputs=([x] if x is not None else []) + params)
    if x is None:
        return None
    return torch.zeros_like(x) if x.grad is None else x.grad
