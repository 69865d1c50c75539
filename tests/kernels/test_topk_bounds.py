"""Memory bounds of the multi-program hinted select (CPU interpreter only).

The Triton interpreter reads and writes raw host memory without bounds checks, so this test adds
two of its own: every buffer the kernels touch (outputs, state, the cached workspace) is a view
into the middle of a larger sentinel-filled tensor, and the interpreter's masked loads, stores and
atomics are wrapped to record any unmasked address outside the tensors the call was given.

Regression (of the earlier radix design, kept for the present one): a row admitted by its hint
read its per-program tie counts at ``lhist[-1]``, 4 bytes before the workspace tensor -- an
illegal access on the GPU. Every per-program table, segment and prefix is checked here.
"""

import numpy as np
import pytest
import torch

from flashrt_kernels.backends import triton_interpreter_active
from flashrt_kernels.topk import hints, reference, select
from flashrt_kernels.topk import state as st

PAD = 64  # sentinel elements on each side of every embedded buffer
SENTINEL = {torch.int32: -123456789, torch.float32: 7.25e33}

pytestmark = pytest.mark.skipif(
    not triton_interpreter_active(), reason="checks the Triton CPU interpreter's memory accesses"
)


def _embed(shape, dtype, fill):
    """(outer, view): a contiguous ``shape`` view, filled with ``fill``, inside sentinels."""
    numel = int(np.prod(shape))
    outer = torch.full((numel + 2 * PAD,), SENTINEL[dtype], dtype=dtype)
    view = outer[PAD : PAD + numel].view(shape)
    view.fill_(fill)
    return outer, view


def _sentinels_intact(outer):
    s = SENTINEL[outer.dtype]
    return bool((outer[:PAD] == s).all() and (outer[-PAD:] == s).all())


class _AccessRecorder:
    """Wraps the interpreter's memory ops; records unmasked accesses outside ``ranges``."""

    def __init__(self, monkeypatch, tensors):
        from triton.runtime import interpreter

        self.ranges = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
                       for name, t in tensors.items()]  # fmt: skip
        self.checked = 0
        self.outside = []
        cls = interpreter.InterpreterBuilder
        load, store, rmw = cls.create_masked_load, cls.create_masked_store, cls.create_atomic_rmw

        def masked_load(builder, ptrs, mask, other, cache, volatile):
            self._check("load", ptrs, mask)
            return load(builder, ptrs, mask, other, cache, volatile)

        def masked_store(builder, ptrs, value, mask, cache):
            self._check("store", ptrs, mask)
            return store(builder, ptrs, value, mask, cache)

        def atomic_rmw(builder, op, ptrs, value, mask, sem, scope):
            self._check("atomic", ptrs, mask)
            return rmw(builder, op, ptrs, value, mask, sem, scope)

        monkeypatch.setattr(cls, "create_masked_load", masked_load)
        monkeypatch.setattr(cls, "create_masked_store", masked_store)
        monkeypatch.setattr(cls, "create_atomic_rmw", atomic_rmw)

    def _check(self, kind, ptrs, mask):
        addr = np.asarray(ptrs.data).astype(np.uint64).ravel()
        live = np.broadcast_to(np.asarray(mask.data).astype(bool).ravel(), addr.shape)
        addr = addr[live]
        self.checked += addr.size
        inside = np.zeros(addr.shape, dtype=bool)
        for lo, hi, _ in self.ranges:
            inside |= (addr >= lo) & (addr < hi)
        for a in addr[~inside][:4]:
            lo, _, name = min(self.ranges, key=lambda r: abs(int(a) - r[0]))
            self.outside.append(f"{kind} at byte {int(a) - lo:+d} of {name}")


def test_hinted_split_rows_stay_in_bounds(monkeypatch):
    b, n, k = 3, 1000, 8  # n not a multiple of 32 or of the interpreter's block (128)
    x = torch.randn(b, n, generator=torch.Generator().manual_seed(0))
    x[:, ::9] = x[:, 4:5]  # ties
    lengths = torch.tensor([n, 700, n + 50], dtype=torch.int32)
    want_v, want_i = reference.topk(x, k, lengths)
    hint = want_i.clone()  # row 0: the exact previous indices (admitted by its guess)
    hint[1] = -1  # row 1: cold
    hint[2, ::2] = -1  # row 2: degenerate (-1, out of range, duplicates)
    hint[2, 1] = n + 5
    hint[2, 3] = 2**31 - 1
    hint[2, 5:] = hint[2, 5]

    split, chunk, _, _ = select.plan(b, n, x.device)
    assert split > 1  # the multi-program path with per-program counts and segments
    cap = select.capacity(k)
    key = (str(x.device), b, split, chunk, cap)
    monkeypatch.setattr(select, "_WORKSPACES", {})  # a private cache for this test
    fresh = select.workspace(torch.device("meta"), b, split, chunk, cap)  # shapes only
    outers, ws = {}, {}
    for name, t in fresh.items():
        outers[name], ws[name] = _embed(tuple(t.shape), torch.int32, 0)
    monkeypatch.setitem(select._WORKSPACES, key, ws)
    outers["out_values"], ov = _embed((b, k), torch.float32, 0.0)
    outers["out_indices"], oi = _embed((b, k), torch.int32, 0)
    outers["state"], state = _embed((b, st.STATE_WORDS), torch.int32, 0)

    rec = _AccessRecorder(monkeypatch, {"scores": x, "hint": hint, "lengths": lengths,
                                        "out_values": ov, "out_indices": oi, "state": state,
                                        **{f"ws.{nm}": t for nm, t in ws.items()}})  # fmt: skip
    rv, ri = hints.topk_hinted(x, k, hint, lengths=lengths, out_values=ov, out_indices=oi,
                               state=state)  # fmt: skip

    assert rec.checked > 0 and rec.outside == []
    assert [nm for nm, o in outers.items() if not _sentinels_intact(o)] == []
    assert rv.data_ptr() == ov.data_ptr() and ri.data_ptr() == oi.data_ptr()
    assert torch.equal(oi, want_i)
    assert torch.equal(ov.view(torch.int32), want_v.view(torch.int32))  # bit for bit
    # row 0 resolved by its hint's first round; the degenerate rows needed refinement too
    rounds = state[:, st.ROUNDS].tolist()
    assert rounds[0] == 1 and min(rounds[1:]) >= 1, rounds
    assert not ws["tc"].any()  # the counting totals are left zeroed for the next call
