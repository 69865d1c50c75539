"""Tree verification with exact acceptance.

A verified tree: row 0 is the root (the last token already chosen, whose logits give the next
token's distribution) and rows 1..N the draft nodes, ``parents[i]`` the row-0-based draft index
of node i's parent (-1 for the root), children listed after their parents.

- Greedy: from the root, follow the child whose token is the target's argmax while one exists;
  then the bonus token is the argmax at the last accepted node. The emitted tokens are exactly
  what plain greedy decoding would produce, one forward per tree instead of one per token.
- Sampling (SpecInfer's multi-step speculative sampling with a deterministic, point-mass drafter):
  at a node with target distribution p (repetition penalty from that path, temperature, top-p),
  try the children in order: accept child x with probability p(x) under the current residual; on
  rejection set p(x) = 0 and renormalize; if every child is rejected (or there is none), sample
  the bonus token from the residual. Each emitted token is distributed as plain sampling's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"Sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(
                f"Sampling.repetition_penalty must be > 0, got {self.repetition_penalty}"
            )


def penalize(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    """HF's repetition penalty over the tokens ``seen`` on this path (divide positive scores,
    multiply negative ones)."""
    if penalty == 1.0 or not seen:
        return logits
    idx = torch.tensor(sorted(set(seen)), device=logits.device)
    s = logits[idx]
    out = logits.clone()
    out[idx] = torch.where(s < 0, s * penalty, s / penalty)
    return out


def target_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """float64 distribution after temperature and top-p (HF's order and tie rule: drop the
    ascending-sorted prefix whose cumulative mass is <= 1 - top_p, keep at least one)."""
    x = logits.to(torch.float64) / s.temperature
    if s.top_p < 1.0:
        srt, order = torch.sort(x, descending=False)
        cum = torch.softmax(srt, -1).cumsum(-1)
        drop = cum <= 1 - s.top_p
        drop[-1] = False
        x = x.clone()
        x[order[drop]] = float("-inf")
    return torch.softmax(x, -1)


def children_lists(parents: list[int]) -> list[list[int]]:
    """children[r] for rows r = 0 (root) .. N, in draft order."""
    ch: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        ch[p + 1].append(i + 1)
    return ch


def greedy_choices(logits: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The greedy token of every row of ``logits`` [R, V]. ``allowed`` [R, C] (token ids
    ascending, -1 pads; a row of pads only is unconstrained): the argmax over a row's allowed
    tokens, ties to the lowest id: the same token as the argmax of the logits with every other
    entry set to -inf, without building that [R, V] mask."""
    best = logits.argmax(-1)
    if allowed is None:
        return best
    valid = allowed >= 0
    vals = logits.gather(1, allowed.clamp(min=0)).masked_fill(~valid, float("-inf"))
    pick = allowed.gather(1, vals.argmax(-1, keepdim=True))[:, 0]
    return torch.where(valid.any(-1), pick, best)


def constrain(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` [R, V] with every token outside a row's ``allowed`` [R, C] (-1 pads) set to
    -inf; a row of pads only is left as it is (sampling's view of ``greedy_choices``' rule)."""
    valid = allowed >= 0
    v = logits.shape[-1]
    keep = torch.zeros(logits.shape[0], v + 1, dtype=torch.bool, device=logits.device)
    keep.scatter_(1, torch.where(valid, allowed, v), True)  # pads land in the extra column
    keep = keep[:, :v] | ~valid.any(-1, keepdim=True)
    return logits.masked_fill(~keep, float("-inf"))


def verify_greedy(best: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """``best``: the greedy token after the root and after each of the N draft nodes (rows of
    ``greedy_choices``) -> (accepted draft indices, bonus token)."""
    ch = children_lists(parents)
    row, accepted = 0, []
    while True:
        nxt = next((c for c in ch[row] if tokens[c - 1] == best[row]), None)
        if nxt is None:
            return accepted, best[row]
        accepted.append(nxt - 1)
        row = nxt


def verify_sample(
    logits: torch.Tensor,
    tokens: list[int],
    parents: list[int],
    s: Sampling,
    generator: torch.Generator,
    history: list[int] | None = None,
) -> tuple[list[int], int]:
    """Rejection sampling over the tree; ``history`` are the tokens before the root (and the
    root's own token) for the per-path repetition penalty."""
    ch = children_lists(parents)
    row, accepted = 0, []
    path = list(history or [])
    while True:
        p = target_probs(penalize(logits[row], path, s.repetition_penalty), s).cpu()
        for c in ch[row]:
            x = tokens[c - 1]
            mass = p.sum()
            px = float(p[x] / mass) if mass > 0 else 0.0
            if float(torch.rand((), generator=generator, dtype=torch.float64)) < px:
                break
            p[x] = 0.0
        else:
            bonus = int(torch.multinomial(p / p.sum(), 1, generator=generator))
            return accepted, bonus
        accepted.append(c - 1)
        path.append(x)
        row = c


def sample_plain(
    logits: torch.Tensor, s: Sampling, generator: torch.Generator, history: list[int] | None = None
) -> int:
    """One token of plain sampling, with the same distribution pipeline as the tree."""
    p = target_probs(penalize(logits, list(history or []), s.repetition_penalty), s).cpu()
    return int(torch.multinomial(p, 1, generator=generator))
