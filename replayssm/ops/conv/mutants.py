"""Conv stores with one bug each, from field reports (the witnesses of the mixer checks).

* :class:`NoRollbackStore` (vLLM #50272: a short conv kept the rejected tokens' activations): the
  commit compacts as if every window position were accepted.
* :class:`CountClampedStore` (xLLM #2249: the accepted count clamped to d_conv - 1): the commit
  records ``min(k, d_conv - 1)``; wrong only when more than d_conv - 1 tokens are accepted.
* :class:`BlockBoundaryStore` (vLLM #42792: after a block boundary the conv read a staging block
  nobody wrote): when the committed length enters a new block of :attr:`BLOCK` tokens, the next
  verify reads its window from the destination column (never written: zeros) instead of the source.
* :class:`UnwrittenSnapshotStore` (llama.cpp #28466: conv windows not saved per rollback position):
  the verify saves only the last position's window; a commit of k < T' copies a stale snapshot.
"""

from __future__ import annotations

import torch

from replayssm.ops.conv.literal import CompactAtCommitStore, DraftSnapshotsStore, LazyOffsetStore


class NoRollbackStore(CompactAtCommitStore):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.last_len = [self.T] * self.S  # window length of each slot's last verify

    def write_window(self, slot, window, x):
        super().write_window(slot, window, x)
        self.last_len[slot] = x.shape[0]

    def commit_slot(self, slot, k):
        super().commit_slot(slot, self.last_len[slot])


class CountClampedStore(LazyOffsetStore):
    def commit_slot(self, slot, k):
        super().commit_slot(slot, min(k, self.W))


class BlockBoundaryStore(LazyOffsetStore):
    BLOCK = 8

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.length = [0] * self.S  # committed tokens per slot
        self.crossed = [False] * self.S  # the last commit entered a new block

    def reset_slot(self, slot, window):
        super().reset_slot(slot, window)
        self.length[slot], self.crossed[slot] = 0, False

    def read_window(self, slot):
        if self.crossed[slot]:  # the destination block's column: never written
            return torch.zeros((self.C, self.W), dtype=self.act, device=self.device)
        return super().read_window(slot)

    def commit_slot(self, slot, k):
        super().commit_slot(slot, k)
        n = self.length[slot]
        self.crossed[slot] = n // self.BLOCK != (n + k) // self.BLOCK
        self.length[slot] = n + k


class UnwrittenSnapshotStore(DraftSnapshotsStore):
    def write_window(self, slot, window, x):
        full = self._extended(window, x)
        s = x.shape[0] - 1
        self.tensors["snapshots"][slot, s] = full[:, s + 1:s + 1 + self.W]
