"""The R2R / RxR action grammars as a trie of real token ids, ranked by an online prior.

A reply is 1 to 3 phrases joined by ", ", each phrase a move (25 / 50 / 75 cm), a turn (left or
right by 15 / 30 / 45 degrees on R2R, 30 / 60 / 90 on RxR) or "stop", then the end-of-turn token.
Every such reply is tokenized whole by the checkpoint's tokenizer, so the trie's paths are exactly
the token sequences a grammatical reply has; its nodes are every grammar-valid continuation.

The prior: each node counts how many earlier replies passed through it; a child's conditional
probability is ``(count(child) + 1 / n_children) / (count(node) + 1)`` (add-one smoothing spread
uniformly over the children), and a node's score is the product along its path from the node the
decoder stands on. ``draft`` returns the ``budget`` best-scoring descendants, best first, with
ancestors always before descendants.
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import dataclass, field

import torch

MOVES = ("move forward 25cm", "move forward 50cm", "move forward 75cm")
TURN_DEGREES = {"r2r": (15, 30, 45), "rxr": (30, 60, 90)}
MAX_PHRASES = 3


def phrases(dataset: str) -> tuple[str, ...]:
    if dataset not in TURN_DEGREES:
        raise ValueError(f"grammar: dataset must be one of {sorted(TURN_DEGREES)}, got {dataset!r}")
    turns = tuple(
        f"turn {side} {deg} degrees" for side in ("left", "right") for deg in TURN_DEGREES[dataset]
    )
    return MOVES + turns + ("stop",)


def replies(dataset: str) -> list[str]:
    ph = phrases(dataset)
    out = []
    for n in range(1, MAX_PHRASES + 1):
        out.extend(", ".join(c) for c in itertools.product(ph, repeat=n))
    return out


_PHRASE = re.compile(r"move forward (25|50|75)cm|turn (left|right) (\d+) degrees|stop")


def parse_actions(reply: str, dataset: str = "r2r") -> list[tuple]:
    """The reply's actions: ("forward", cm), ("left" | "right", degrees), ("stop",); a reply that
    is not in the grammar gives the actions of its grammatical leading phrases only."""
    valid = set(phrases(dataset))
    out = []
    for part in reply.strip().split(", ")[:MAX_PHRASES]:
        m = _PHRASE.fullmatch(part.strip())
        if m is None or part.strip() not in valid:
            break
        if m.group(1):
            out.append(("forward", int(m.group(1))))
        elif m.group(2):
            out.append((m.group(2), int(m.group(3))))
        else:
            out.append(("stop",))
    return out


@dataclass(eq=False)
class Node:
    token: int
    parent: Node | None
    depth: int
    children: dict[int, Node] = field(default_factory=dict)
    count: int = 0
    terminal: bool = False
    index: int = 0  # position in ``GrammarTrie.nodes`` (the root is 0)


class GrammarTrie:
    def __init__(self, token_sequences: list[list[int]]):
        self.root = Node(token=-1, parent=None, depth=0)
        self.nodes = [self.root]
        for seq in token_sequences:
            node = self.root
            for t in seq:
                nxt = node.children.get(t)
                if nxt is None:
                    nxt = Node(token=t, parent=node, depth=node.depth + 1, index=len(self.nodes))
                    node.children[t] = nxt
                    self.nodes.append(nxt)
                node = nxt
            node.terminal = True
        self.size = len(self.nodes) - 1

    def children_table(self) -> torch.Tensor:
        """int64 [nodes + 1, widest]: row ``node.index`` lists the node's child tokens ascending,
        padded with -1; the last row is all -1 (for a reply that has left the grammar)."""
        widest = max(len(n.children) for n in self.nodes)
        table = torch.full((len(self.nodes) + 1, widest), -1, dtype=torch.long)
        for n in self.nodes:
            kids = sorted(n.children)
            table[n.index, : len(kids)] = torch.tensor(kids, dtype=torch.long)
        return table

    @classmethod
    def from_tokenizer(cls, tokenizer, dataset: str, eos_id: int) -> GrammarTrie:
        seqs = [
            tokenizer.encode(r, add_special_tokens=False).ids + [eos_id] for r in replies(dataset)
        ]
        return cls(seqs)

    def step(self, node: Node | None, token: int) -> Node | None:
        """The node after ``token``; None once the reply has left the grammar."""
        return None if node is None else node.children.get(token)

    def observe(self, tokens: list[int]) -> None:
        """Online prior: count every node the reply passed through (stops where it leaves)."""
        node = self.root
        node.count += 1
        for t in tokens:
            node = node.children.get(t)
            if node is None:
                return
            node.count += 1

    @staticmethod
    def child_prob(node: Node, child: Node) -> float:
        return (child.count + 1.0 / len(node.children)) / (node.count + 1.0)

    def draft(self, node: Node | None, budget: int) -> tuple[list[Node], list[int]]:
        """The ``budget`` most likely descendants of ``node`` and each one's parent index in that
        list (-1: the node itself). Deterministic: ties go to the earlier-inserted child."""
        if node is None or budget <= 0:
            return [], []
        tie = itertools.count()
        heap = [(-self.child_prob(node, c), next(tie), c, -1) for c in node.children.values()]
        heapq.heapify(heap)
        picked, parents, index = [], [], {}
        while heap and len(picked) < budget:
            neg, _, n, parent = heapq.heappop(heap)
            index[id(n)] = len(picked)
            picked.append(n)
            parents.append(parent)
            for c in n.children.values():
                heapq.heappush(heap, (neg * self.child_prob(n, c), next(tie), c, index[id(n)]))
        return picked, parents

    def draft_rows(
        self, starts: list[Node | None], budgets: list[int], total: int
    ) -> list[tuple[list[Node], list[int]]]:
        """``draft`` for several rows under one budget: the ``total`` best-scoring nodes over all
        the rows, each row's score measured from its own start node and each row taking at most
        its ``budgets[r]`` nodes. Every row's list is ordered as ``draft`` orders it (its parent
        indices into its own list), and with a ``total`` that binds no row it is ``draft``'s."""
        if len(starts) != len(budgets):
            raise ValueError(f"draft_rows: {len(starts)} start nodes for {len(budgets)} budgets")
        tie = itertools.count()
        heap = []
        for r, (node, budget) in enumerate(zip(starts, budgets, strict=True)):
            if node is not None and budget > 0:
                heap += [(-self.child_prob(node, c), next(tie), r, c, -1)
                         for c in node.children.values()]  # fmt: skip
        heapq.heapify(heap)
        out: list[tuple[list[Node], list[int]]] = [([], []) for _ in starts]
        index: dict[tuple[int, int], int] = {}  # (row, node id): rows may share start nodes
        taken = 0
        while heap and taken < total:
            neg, _, r, n, parent = heapq.heappop(heap)
            picked, parents = out[r]
            if len(picked) >= budgets[r]:
                continue
            index[r, id(n)] = len(picked)
            picked.append(n)
            parents.append(parent)
            taken += 1
            for c in n.children.values():
                heapq.heappush(
                    heap, (neg * self.child_prob(n, c), next(tie), r, c, index[r, id(n)])
                )
        return out
