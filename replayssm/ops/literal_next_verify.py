"""The literal ReplaySSM model of a fold at the next verify (``fold_at = "next-verify"``, ROCm/ATOM).

Oracle: the spec's rule (sections 3-4) with one change of timing, what a kernel declaring
``fold_at = "next-verify"`` promises (replayssm/interface.py): a flush verify computes its outputs
exactly as the spec's does but leaves the checkpoint as it was; its commit moves the cursors by the
policy's rule and remembers the fold it owes (the ``n`` = write_pos history records from the old
origin, still in the ring behind the new one); the slot's next verify first folds those records
into the checkpoint (the family's ``fold``, stored in the declared format), then runs as its own
write_pos says.  ``committed_state`` folds an owed fold on the fly (the storage unchanged).
Expected error: the spec's literal model's (the same records folded into the same checkpoint, by
the family's fold rather than the window's running state: the same sums, rounded once to the state
format).
"""

from __future__ import annotations

import torch

from replayssm.interface import PAD_SLOT
from replayssm.ops.literal import LiteralReplayKernel


class LiteralNextVerifyFoldKernel(LiteralReplayKernel):
    """The spec's literal replay model with a flush's fold applied at the slot's next verify."""

    fold_at = "next-verify"
    description = ("literal ReplaySSM, fold at the next verify (a flush's commit only moves the cursors; the next "
                   "verify of the slot folds first)")

    def __init__(self, config) -> None:
        super().__init__(config)
        self.owed: dict[int, tuple[int, int]] = {}  # slot -> (origin, n): the history its next verify folds
        self.flush_from: dict[int, tuple[int, int]] = {}  # slot -> (origin, write_pos) of its last flush verify

    def _fold_owed(self, slot: int) -> torch.Tensor:
        """The checkpoint with the slot's owed history folded in (compute dtype)."""
        origin, n = self.owed[slot]
        rows = torch.tensor([(origin + p) % self.decode.ring_rows for p in range(n)], dtype=torch.long,
                            device=self.device)
        hist = {k: v[slot].index_select(0, rows).to(self.ct) for k, v in self.records.items()}
        return self.math.fold(self._load_checkpoint(slot), hist, self.params, self.mode)

    def _apply_owed(self, slot: int) -> None:
        st = self._fold_owed(slot)
        self._store_state(slot, st, self.ckpt[slot], None if self.ckpt_scale is None else self.ckpt_scale[slot])
        del self.owed[slot]

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        if not self.decode.speculative:  # a fold at the next verify is a speculative declaration
            return super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                                  cursors=cursors)
        ids = [s for s in slot_ids.tolist() if 0 <= s < self.num_slots]
        self._check_slot_ids(slot_ids)
        for s in ids:  # the fold the slot's last flush owes, first
            if s in self.owed:
                self._apply_owed(s)
        kept = {s: (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
                for s in ids}
        res = super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                             cursors=cursors)
        for s, (c, sc) in kept.items():
            self.flush_from.pop(s, None)
            if self.flushed[s] and self.pending[s]:  # this flush's fold is owed to the next verify
                self.flush_from[s] = (self.origin[s], self.write_pos[s])
                self.ckpt[s].copy_(c)
                if sc is not None:
                    self.ckpt_scale[s].copy_(sc)
        return res

    def commit(self, slot_ids, accepted) -> None:
        rows = self._commit_rows(slot_ids, accepted)
        super().commit(slot_ids, accepted)
        for s, _k in rows:
            if s in self.flush_from:
                self.owed[s] = self.flush_from.pop(s)

    def committed_state(self, slot_ids, cursors=None) -> torch.Tensor:
        ids = [s for s in self._check_slot_ids(slot_ids) if s != PAD_SLOT and s in self.owed]
        kept = {s: (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
                for s in ids}
        owed = dict(self.owed)
        try:
            for s in ids:
                self._apply_owed(s)
            return super().committed_state(slot_ids, cursors=cursors)
        finally:
            self.owed = owed
            for s, (c, sc) in kept.items():
                self.ckpt[s].copy_(c)
                if sc is not None:
                    self.ckpt_scale[s].copy_(sc)

    def materialize(self, slot_ids, upto, dst_slot_ids) -> None:
        rows = self.check_materialize_args(slot_ids, upto, dst_slot_ids, self.write_pos, self.ready)
        ids = [s for s, _n, _d in rows if s in self.owed]
        dsts = {d for _s, _n, d in rows}  # a padding row's destination entry names no slot
        kept = {s: (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
                for s in ids}
        owed = dict(self.owed)
        try:
            for s in ids:
                self._apply_owed(s)
            super().materialize(slot_ids, upto, dst_slot_ids)
        finally:
            self.owed = {s: v for s, v in owed.items() if s not in dsts}
            for s, (c, sc) in kept.items():
                self.ckpt[s].copy_(c)
                if sc is not None:
                    self.ckpt_scale[s].copy_(sc)

    def _reset_slot(self, slot: int) -> None:
        self.owed.pop(slot, None)
        self.flush_from.pop(slot, None)
        super()._reset_slot(slot)

    def _host_flags(self) -> dict[str, torch.Tensor]:
        flags = super()._host_flags()
        S = self.num_slots
        flags["owed_origin"] = torch.tensor([self.owed.get(s, (0, 0))[0] for s in range(S)], dtype=torch.int64)
        flags["owed_n"] = torch.tensor([self.owed[s][1] if s in self.owed else -1 for s in range(S)],
                                       dtype=torch.int64)
        return flags

    def _restore_common(self, snap) -> None:
        super()._restore_common(snap)
        if "owed_n" in snap.extra:
            self.owed = {s: (int(o), int(n)) for s, (o, n) in
                         enumerate(zip(snap.extra["owed_origin"].tolist(), snap.extra["owed_n"].tolist())) if n >= 0}
        self.flush_from = {}


__all__ = ["LiteralNextVerifyFoldKernel"]
