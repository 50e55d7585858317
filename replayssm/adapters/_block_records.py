"""The books of an adapter whose kernels keep, per physical block, a checkpoint and record buffers.

Kernels of this shape (the ReplaySSM GDN, KDA and Mamba-2 kernels of the vLLM fork, of the vLLM
0.33.0 release and of SGLang 0.5.23) hold ``self.state [blocks, *state_shape]`` (block ``s + 1`` is
slot ``s``, ``_base.py``), record buffers ``[blocks, heads, rows, ...]`` that the adapter's
``_records()`` returns in our layout ``{name: [slots, rows, heads, ...]}``
(:meth:`BlockRecordsAdapter.block_records`), one cursor per block ``self.write_pos`` and, where the
ring does not start at row 0, one ring origin per block (:meth:`BlockRecordsAdapter.ring_origins`).
Over those, :class:`BlockRecordsAdapter` gives the inspection every such adapter has
(``checkpoint_state``; a ``committed_state`` that folds the committed records into the checkpoint in
fp64 with the family's literal math, ``record_math``; ``snapshot``) and the commit: the host
check, then the speculative commit kernel (the adapter's ``commit_spec``) or standard decode's
cursor advance (``0`` after a flush, ``write_pos == L - 1``, else ``+ 1``).

Oracle: none of its own (bookkeeping read back from the kernels' tensors, no arithmetic but the
fp64 fold of the literal model); the engine judges what it returns.  Expected error: exact (data
movement; the fold is the literal model's).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from replayssm.adapters._base import SlotAdapter
from replayssm.interface import KernelSnapshot


class BlockRecordsAdapter(SlotAdapter):
    """Inspection and standard-decode cursor books over per-block checkpoints, records and cursors."""

    record_math: ClassVar[type]  # the family's literal math: record_math().fold(state, hist, params64, mode)

    @staticmethod
    def block_records(**buffers: torch.Tensor) -> dict[str, torch.Tensor]:
        """Our records layout ``{name: [slots, rows, heads, ...]}`` from the kernels' record buffers
        ``[blocks, heads, rows, ...]`` (views; the null block 0 left out)."""
        return {k: v[1:].movedim(2, 1) for k, v in buffers.items()}

    def ring_origins(self) -> torch.Tensor | None:
        """The per-block ring origin tensor (the ring row of logical position 0), or None: every ring
        starts at row 0."""
        return None

    def snapshot_extra(self) -> dict[str, torch.Tensor]:
        """What the snapshot keeps beside the records (e.g. a speculative path's raw window)."""
        return {}

    def commit_spec(self, blk: torch.Tensor, accepted: torch.Tensor) -> None:
        """The speculative commit kernel on the rows' blocks ``blk`` (padding rows: the null block 0)."""
        raise NotImplementedError

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        if self.decode.speculative:
            self.commit_spec(self.blocks(slot_ids), accepted)
        else:
            self.advance_cursors(slot_ids)

    def advance_cursors(self, slot_ids: torch.Tensor) -> None:
        """Standard decode's commit of the active rows' cursors: 0 after a flush, else + 1."""
        b = self.blocks(slot_ids).index_select(0, self.active_rows(slot_ids)).long()
        wp = self.write_pos[b]
        self.write_pos[b] = torch.where(wp == self.decode.buffer - 1, 0, wp + 1).to(torch.int32)

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self.state[s + 1].double())

    def committed_state(self, slot_ids):
        """Checkpoint + the committed records folded in fp64 (the family's literal fold)."""
        rec, origins = self._records(), self.ring_origins()

        def fold(s):
            start = 0 if origins is None else int(origins[s + 1])
            idx = self.hist_rows(s, int(self.write_pos[s + 1]), start)
            hist = {k: v[s].index_select(0, idx).double() for k, v in rec.items()}
            return self.record_math().fold(self.state[s + 1].double(), hist, self.params64, self.mode)
        return self.per_slot(slot_ids, fold)

    def snapshot(self):
        wp = self.write_pos[1:].cpu().to(torch.int64)
        origins = self.ring_origins()
        flush = self.is_flush[1:].cpu() != 0 if self.decode.speculative else wp == self.decode.buffer - 1
        return KernelSnapshot(
            checkpoint=self.state[1:].cpu().clone(), checkpoint_scale=None,
            records={k: v.cpu().clone() for k, v in self._records().items()},
            write_pos=wp, origin=torch.zeros_like(wp) if origins is None else origins[1:].cpu().to(torch.int64),
            is_flush=flush, extra=self.snapshot_extra())
