"""The books of an adapter that keeps no records: the committed state is the checkpoint ``self.state``
at the slot's block (block ``s + 1`` is slot ``s``, ``_base.py``), written in place by the kernel's
standard step or by the adapter's commit (FlashInfer's and SGLang's Mamba-2 baselines, the
fold-every-commit adapters of ``_fold_every_commit.py``).  No history, no cursor: the snapshot's
``write_pos`` and ``origin`` are 0, and standard decode flushes at every step.

Oracle: none of its own (bookkeeping); the engine judges what it returns.  Expected error: exact
(data movement).
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import SlotAdapter
from replayssm.interface import KernelSnapshot


class CheckpointOnlyAdapter(SlotAdapter):
    """Inspection and snapshot of an adapter whose committed state is its checkpoint (no records)."""

    def snapshot_extra(self) -> dict[str, torch.Tensor]:
        """What the snapshot keeps beside the checkpoint (draft states, accepted counts, window books)."""
        return {}

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self.state[s + 1].double())

    def committed_state(self, slot_ids):
        return self.checkpoint_state(slot_ids)

    def snapshot(self):
        n = self.num_slots
        return KernelSnapshot(
            checkpoint=self.state[1:].cpu().clone(), checkpoint_scale=None, records={},
            write_pos=torch.zeros(n, dtype=torch.int64), origin=torch.zeros(n, dtype=torch.int64),
            is_flush=torch.full((n,), not self.decode.speculative), extra=self.snapshot_extra())
