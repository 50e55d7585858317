"""The books of a baseline adapter that keeps the draft states itself (``fla.py``, ``mamba_ssm.py``):
the external kernel runs one token at a time and has no speculative bookkeeping, so the adapter keeps
one state per draft position and a per-slot accepted count ``self.live`` (commit(k) makes draft
``k - 1`` live; standard decode has one draft position, ``self.T = 1``).  There are no records: the
committed state is the live draft.

Oracle: none of its own (bookkeeping); the engine judges what it returns.  Expected error: exact
(data movement).
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import SlotAdapter
from replayssm.interface import KernelSnapshot


class DraftStatesAdapter(SlotAdapter):
    """Inspection over the adapter's own draft states: ``_drafts()`` ``[slots, T, *state_shape]`` and the
    accepted counts ``self.live``."""

    def _drafts(self) -> torch.Tensor:
        """The draft states, ``[slots, T, *state_shape]`` (a view of the adapter's storage)."""
        raise NotImplementedError

    def _live(self, s: int) -> torch.Tensor:
        return self._drafts()[s, int(self.live[s]) - 1]

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self._live(s).double())

    def committed_state(self, slot_ids):
        return self.checkpoint_state(slot_ids)

    def snapshot(self):
        n = self.num_slots
        return KernelSnapshot(
            checkpoint=torch.stack([self._live(s) for s in range(n)]).cpu().clone(), checkpoint_scale=None,
            records={}, write_pos=torch.zeros(n, dtype=torch.int64), origin=torch.zeros(n, dtype=torch.int64),
            is_flush=torch.full((n,), not self.decode.speculative),
            extra={"drafts": self._drafts().cpu().clone(), "accepted": self.live.cpu().clone()})
