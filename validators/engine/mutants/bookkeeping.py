"""Bookkeeping mutants of the gallery: cursor, ring-row and flush slips (docs/recurrences.md sections 2-4), one each.

Oracle: each mutant is a literal model (``replayssm/ops/*/literal.py``) plus exactly one deliberate
bug; the validation engine must fail every one (the exact invariants and the state checks catch
them), and the fuzzer must shrink each to <= 2 rows and <= 8 steps (docs/mutation_gallery.md).
"""

from __future__ import annotations

import torch

from replayssm.interface import PAD_SLOT, DecodeConfig
from replayssm.ops.literal import WindowResult
from replayssm.validators.engine.mutants._common import DelegatingMath, WrapMath
from replayssm.validators.engine.mutants.registry import register_mutant

SPEC_ONLY = ("speculative",)

class RingWrapOffByOne:
    """Ring row of logical position p: ``origin + p`` when it does not wrap, else ``origin + p + 1 - ring``
    (an off-by-one only past the ring's end)."""

    def _row_of(self, slot, p):
        q = self.origin[slot] + p
        rows = self.decode.ring_rows
        return q if q < rows else (q + 1) % rows


class _EarlyFlushDecode(DecodeConfig):
    def is_flush(self, write_pos: int) -> bool:
        return super().is_flush(write_pos + 1)

    def max_write_pos(self) -> int:
        return max(0, super().max_write_pos() - 1) if not self.speculative else super().max_write_pos()


class EarlyFlush:
    """The flush threshold is tested at ``write_pos + 1``: the checkpoint is rewritten one verify
    early (outputs stay right; the cursor rules and the checkpoint invariant break)."""

    def __init__(self, config):
        super().__init__(config)
        d = self.decode
        self.decode = _EarlyFlushDecode(d.decode, d.window, d.buffer)


class WindowWriteOffset:
    """Verify writes the window's records one ring row too far (logical write_pos + s + 1); reads are
    right, so the next verify reads a stale row at the first window position."""

    _shift = 0

    def _history(self, slot, n):
        self._shift = 0
        try:
            return super()._history(slot, n)
        finally:
            self._shift = 1

    def verify(self, slot_ids, inputs, out=None):
        try:
            return super().verify(slot_ids, inputs, out)
        finally:
            self._shift = 0

    def _row_of(self, slot, p):
        return super()._row_of(slot, p + self._shift)


class StaleCursorOnReuse:
    """reset() of a slot that was already admitted (slot reuse after preemption) loads the new
    initial state but keeps the previous sequence's write_pos and origin."""

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        old = {s: (self.write_pos[s], self.origin[s]) for s in ids if s != PAD_SLOT and self.ready[s]}
        super().reset(slot_ids, initial_state, origin)
        for s, (w, o) in old.items():
            self.write_pos[s], self.origin[s] = w, o


class _FoldsWindowToken(DelegatingMath):
    def window(self, s0, hist, win, params, mode, options):
        res = self.inner.window(s0, hist, win, params, mode, options)
        return WindowResult(res.outputs, res.records, res.state_after_first, res.state_after_first)


class FlushFoldsWindowToken(WrapMath):
    """A speculative flush folds window position 0 into the checkpoint too (the standard-decode
    rule), although that token is written to the ring again after the origin moves: it counts twice."""

    math_wrapper = _FoldsWindowToken


class BoundaryBackwardCopy:
    """Baseline speculative commit: when the accepted count lands exactly on the window boundary
    (k = T'), the accepted-state copy reads one draft state back (draft k-2)."""

    def commit(self, slot_ids, accepted):
        T = self.decode.window
        ks = accepted.clone()
        if self.decode.speculative and T >= 2:
            ks = torch.where(accepted == T, accepted - 1, accepted)
        super().commit(slot_ids, ks)


class RingIndexUnwrapped:
    """Ring row of logical position p computed as ``origin + p`` without the modulo: once the
    window reaches the ring's end the kernel indexes past its storage and raises."""

    def _row_of(self, slot, p):
        return self.origin[slot] + p


# ---- registration --------------------------------------------------------------------------------------
register_mutant(RingWrapOffByOne, "mutant-ring-wrap-off-by-one",
                "ring row off by one for logical positions past the ring's end (origin + p >= ring)",
                klass="bookkeeping", decodes=SPEC_ONLY)
register_mutant(EarlyFlush, "mutant-early-flush",
                "flush tested at write_pos + 1: the checkpoint is rewritten one verify early", klass="bookkeeping")
register_mutant(WindowWriteOffset, "mutant-window-write-offset",
                "window records written one ring row too far (write_pos + s + 1)", klass="bookkeeping",
                decodes=SPEC_ONLY)
register_mutant(StaleCursorOnReuse, "mutant-stale-cursor-on-reuse",
                "reset of a reused slot keeps the previous sequence's write_pos and origin", klass="bookkeeping")
register_mutant(FlushFoldsWindowToken, "mutant-flush-folds-window-token",
                "speculative flush folds window position 0 into the checkpoint as well (counted twice)",
                klass="bookkeeping", decodes=SPEC_ONLY)
register_mutant(BoundaryBackwardCopy, "mutant-boundary-backward-copy",
                "baseline: when k lands on the window boundary (k = T') the accepted-state copy reads draft k-2",
                klass="bookkeeping", base="baseline", decodes=SPEC_ONLY)
register_mutant(RingIndexUnwrapped, "mutant-ring-index-unwrapped",
                "ring row index origin + p without the modulo: an out-of-range index error once the ring wraps",
                klass="bookkeeping", decodes=SPEC_ONLY, raises=True)

__all__: list[str] = []
