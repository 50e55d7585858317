"""The literal ReplaySSM model of a staged fold (``zero_accept = "staged"``): the fold of a flush applied at commit.

Oracle: the spec's rule (sections 3-4) with one change of timing, what a kernel declaring
``zero_accept = "staged"`` promises (replayssm/interface.py): a flush verify computes the fold
(checkpoint + committed history, exactly as the spec's flush does) but stores it in a staging
buffer, leaving the checkpoint as it was; ``commit(k >= 1)`` stores the staged fold as the
checkpoint and moves the cursors by the policy's rule; ``commit(0)`` (every draft rejected)
discards it and leaves checkpoint, scales and cursors exactly as before the verify (the next
verify is a flush again and folds again).  Expected error: the spec's literal model's, bit for
bit on every step that commits k >= 1 (the same fold, stored one call later).
"""

from __future__ import annotations

from replayssm.ops.literal import LiteralReplayKernel


class LiteralStagedFoldKernel(LiteralReplayKernel):
    """The spec's literal replay model with its flush fold staged until the commit."""

    zero_accept = "staged"
    description = "literal ReplaySSM, staged fold (a flush's fold applied at commit(k >= 1), discarded by commit(0))"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.staged: dict[int, tuple] = {}  # slot -> (checkpoint, scale) folded at its flush verify

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        if not self.decode.speculative:  # a staged fold is a speculative declaration: standard decode folds as the spec
            return super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                                  cursors=cursors)
        # (every slot named, before the verify; ids out of range are refused by the verify itself)
        kept = {s: (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
                for s in slot_ids.tolist() if 0 <= s < self.num_slots}
        res = super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                             cursors=cursors)
        for s, (c, sc) in kept.items():
            if self.flushed[s] and self.pending[s]:
                self.staged[s] = (self.ckpt[s].clone(), None if sc is None else self.ckpt_scale[s].clone())
                self.ckpt[s].copy_(c)
                if sc is not None:
                    self.ckpt_scale[s].copy_(sc)
        return res

    def commit(self, slot_ids, accepted) -> None:
        for s, k in self._commit_rows(slot_ids, accepted):
            staged = self.staged.pop(s, None)
            if k == 0:
                self.pending[s] = False
                continue
            if staged is not None:
                self.ckpt[s].copy_(staged[0])
                if staged[1] is not None:
                    self.ckpt_scale[s].copy_(staged[1])
            self.write_pos[s], self.origin[s] = self.decode.commit_cursor(
                self.write_pos[s], self.origin[s], self.flushed[s], k)
            self.pending[s] = False

    def _reset_slot(self, slot: int) -> None:
        self.staged.pop(slot, None)
        super()._reset_slot(slot)


__all__ = ["LiteralStagedFoldKernel"]
