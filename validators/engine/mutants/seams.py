"""Mutants of the seams where serving engines break kernels (issue 50): one bug each, from public reports.

Oracle: each mutant is a literal model plus exactly one bug at a seam the contract now expresses;
the default validation (``Scenario.tiny``: exhaustive schedule, a padding row, unused slots) must
fail each one with the check docs/field_bugs.md names (tests/engine/test_seams.py runs each there).

* ``mutant-input-rescaled-in-place`` (KernelBench's evaluator hack): verify halves its first input
  tensor in place before computing.  Its outputs, records and states are those of the halved
  inputs, and the fp64 reference, which reads the inputs after the verify, agrees: only
  ``inputs-unchanged`` sees it.
* ``mutant-accepted-clamped`` (vLLM #50021, accepted-count-derived indices out of range): commit
  clamps each live row's count into its range instead of refusing an out-of-range one.
* ``mutant-padding-count-commits`` (vLLM's RecoverSSM tests put garbage in padding rows'
  counts): commit reads a padding row's count as if the row were live; its slot -1, read as a
  Python index, is the last slot, whose write_pos becomes the garbage count wrapped into range.
* ``mutant-unwritten-slab-adopted`` (kekzl/imp #1503: an all-rejected verify adopted a snapshot
  slab the forward never wrote): commit adopts, for every committed row, a ``torch.empty`` slab
  written only where the verify flushed.  Whatever the allocator hands back decides what the
  default validation sees; under ``--poison-allocations nan`` the slab is NaN and it fails at once.
* ``mutant-out-assumes-contiguous``: verify stores its outputs through ``out``'s first element as
  if it were contiguous; under the ``views`` layout they run into the gaps (``view-gaps``).
* ``mutant-slot-ids-unit-stride`` (vLLM #51682: with spec decode the state index is the strided
  column ``block_table[:, 0]``): verify and commit read ``slot_ids`` with unit stride, i.e. along
  the block table's first row, so rows act on other slots.
* ``mutant-staged-fold-kept-at-zero``: a kernel declaring ``zero_accept = "staged"`` (the fold of
  a flush applied at commit) whose commit(0) keeps the fold as a ``"noop"`` kernel would
  (``staged-fold``: the checkpoint and cursors must be as before the verify).
* ``mutant-next-verify-fold-skipped`` (ROCm/ATOM folds at the start of the next verify): a kernel
  declaring ``fold_at = "next-verify"`` whose next verify drops the fold its slot owes instead of
  applying it: the checkpoint never absorbs the flushed history (``flush-checkpoint``, judged
  after that verify).
* ``mutant-materialize-off-by-one``, ``mutant-materialize-rewrites-source`` (prefix-cache
  materialisation: FlashInfer ``replayssm_materialize``, vLLM RecoverSSM ``boundary_state_indices``,
  vLLM #55688, SGLang ``force_flush``): the published prefix has one token too many; the source
  slot is rewritten (``materialize``).
* ``mutant-transposed-state`` (SGLang #40398): the state is stored as ``[.., K, V]`` memory
  where ``[.., V, K]`` is read; with K = V (the ``tiny-square`` geometry) the shapes match and
  nothing asserts, elsewhere the same store scrambles it.
"""

from __future__ import annotations

import torch

from replayssm.interface import PAD_SLOT
from replayssm.ops.literal_next_verify import LiteralNextVerifyFoldKernel
from replayssm.ops.literal_staged import LiteralStagedFoldKernel
from replayssm.validators.engine.mutants.registry import register_mutant


class NextVerifyFoldSkipped(LiteralNextVerifyFoldKernel):
    """A fold at the next verify (``fold_at = "next-verify"``) whose next verify forgets the fold its
    slot owes: the owed history is dropped, the checkpoint stays the one before the flush."""

    fold_at = "next-verify"

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        for s in slot_ids.tolist():
            self.owed.pop(s, None)
        return super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                              cursors=cursors)


class InputRescaledInPlace:
    """verify multiplies its first input tensor by 0.5 in place (a fused pre-scaling written back
    into the caller's buffer), then computes from it."""

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        if isinstance(inputs, dict) and inputs:
            next(iter(inputs.values())).mul_(0.5)
        return super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                              cursors=cursors)


class AcceptedClamped:
    """commit clamps each live row's accepted count into ``1..T'_r`` instead of refusing it."""

    def commit(self, slot_ids, accepted):
        acc = accepted.clone()
        for r, s in enumerate(slot_ids.tolist()):
            if s != PAD_SLOT:
                acc[r] = min(max(int(acc[r]), 1), self.win_len[s])
        super().commit(slot_ids, acc)


class PaddingCountCommits:
    """commit applies a padding row's count too: slot -1 (the last slot, as a Python index) gets
    ``write_pos = count mod (max write_pos + 1)``."""

    zero_accept = "noop"

    def commit(self, slot_ids, accepted):
        super().commit(slot_ids, accepted)
        for s, k in zip(slot_ids.tolist(), accepted.tolist()):
            if s == PAD_SLOT and k:
                self.write_pos[-1] = k % (self.decode.max_write_pos() + 1)


class TransposedState:
    """The state is stored with its last two axes swapped in memory (written ``[.., K, V]``, read
    ``[.., V, K]``)."""

    def _store_state(self, slot, s, target, target_scale):
        super()._store_state(slot, s.transpose(-1, -2).contiguous().view(s.shape), target, target_scale)


class OutAssumesContiguous:
    """verify computes into a scratch buffer and stores it through ``out``'s first element as if
    ``out`` were contiguous (a launch passing ``out.data_ptr()`` without its strides)."""

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        if out is None or out.is_contiguous():
            return super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                                  cursors=cursors)
        scratch = out.clone()  # the poison and canaries the caller put there, contiguous
        super().verify(slot_ids, inputs, scratch, window_lens=window_lens, query_start_loc=query_start_loc,
                       cursors=cursors)
        torch.as_strided(out, (out.numel(),), (1,)).copy_(scratch.reshape(-1))
        return out


class SlotIdsUnitStride:
    """verify and commit read ``slot_ids`` as if it had unit stride (vLLM #51682): a column of a
    block table is read along its first row."""

    @staticmethod
    def _unit(t):
        return torch.as_strided(t, t.shape, (1,)) if not t.is_contiguous() else t

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        return super().verify(self._unit(slot_ids), inputs, out, window_lens=window_lens,
                              query_start_loc=query_start_loc, cursors=cursors)

    def commit(self, slot_ids, accepted):
        super().commit(self._unit(slot_ids), accepted)


class StagedFoldKeptAtZero(LiteralStagedFoldKernel):
    """A staged fold (``zero_accept = "staged"``) whose commit(0) after a flush keeps the fold, as a
    ``"noop"`` kernel does: it applies the staged checkpoint and moves the cursors by the policy's
    rule with k = 0.  The committed state is right; the checkpoint a caller rolls back to is not."""

    zero_accept = "staged"

    def commit(self, slot_ids, accepted):
        kept = []
        for s, k in zip(slot_ids.tolist(), accepted.tolist()):
            if s != PAD_SLOT and k == 0 and s in self.staged:
                c, sc = self.staged.pop(s)
                self.ckpt[s].copy_(c)
                if sc is not None:
                    self.ckpt_scale[s].copy_(sc)
                kept.append(s)
        super().commit(slot_ids, accepted)
        for s in kept:
            self.write_pos[s], self.origin[s] = self.decode.commit_cursor(self.write_pos[s], self.origin[s], True, 0)


class MaterializeOffByOne:
    """materialize folds one history token more than asked (``upto + 1``, clamped to the history)."""

    def materialize(self, slot_ids, upto, dst_slot_ids):
        more = torch.tensor([min(n + 1, self.write_pos[s]) if s != PAD_SLOT else n
                             for s, n in zip(slot_ids.tolist(), upto.tolist())], dtype=upto.dtype, device=upto.device)
        super().materialize(slot_ids, more, dst_slot_ids)


class MaterializeRewritesSource:
    """materialize also folds the published prefix into the source slot (its checkpoint absorbs
    the first ``upto`` records, the origin and write_pos move past them): the source's committed
    state is the same, its storage is not."""

    def materialize(self, slot_ids, upto, dst_slot_ids):
        super().materialize(slot_ids, upto, dst_slot_ids)
        for s, n in zip(slot_ids.tolist(), upto.tolist()):
            if s != PAD_SLOT and n > 0:
                st = self.math.fold(self._load_checkpoint(s), self._history(s, n), self.params, self.mode)
                self._store_state(s, st, self.ckpt[s], None if self.ckpt_scale is None else self.ckpt_scale[s])
                self.write_pos[s] -= n
                self.origin[s] = (self.origin[s] + n) % self.decode.ring_rows if self.decode.uses_ring else 0


class UnwrittenSlabAdopted:
    """verify stages each slot's next checkpoint in a slab from ``torch.empty_like`` and writes a
    slot's row only when the verify folds (a flush); commit adopts the slab's row as the
    checkpoint of every committed row, so a non-flush row adopts memory nobody wrote."""

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        res = super().verify(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc,
                             cursors=cursors)
        self._slab = torch.empty_like(self.ckpt)
        for s in slot_ids.tolist():
            if s != PAD_SLOT and self.flushed[s]:
                self._slab[s].copy_(self.ckpt[s])
        return res

    def commit(self, slot_ids, accepted):
        super().commit(slot_ids, accepted)
        slab, self._slab = self._slab, None
        for s in slot_ids.tolist():
            if s != PAD_SLOT:
                self.ckpt[s].copy_(slab[s])


register_mutant(InputRescaledInPlace, "mutant-input-rescaled-in-place",
                "verify halves its first input in place before computing: outputs agree with a reference that "
                "reads the inputs afterwards (KernelBench's evaluator hack)", klass="interface", gallery=False)
register_mutant(AcceptedClamped, "mutant-accepted-clamped",
                "commit clamps an out-of-range accepted count on a live row instead of refusing it (vLLM #50021)",
                klass="interface", gallery=False)
register_mutant(PaddingCountCommits, "mutant-padding-count-commits",
                "commit applies a padding row's (garbage) accepted count to slot -1, the last slot (vLLM RecoverSSM)",
                klass="bookkeeping", gallery=False)
register_mutant(TransposedState, "mutant-transposed-state",
                "the state is stored [K, V] where [V, K] is read: with K = V nothing asserts (SGLang #40398)",
                klass="interface", families=("gdn", "kda"), gallery=False)

register_mutant(UnwrittenSlabAdopted, "mutant-unwritten-slab-adopted",
                "commit adopts a torch.empty slab as the checkpoint, written only where the verify flushed "
                "(kekzl/imp #1503)", klass="bookkeeping", gallery=False)
register_mutant(OutAssumesContiguous, "mutant-out-assumes-contiguous",
                "verify stores its outputs through out's first element as if out were contiguous (strides ignored)",
                klass="interface", gallery=False)
register_mutant(SlotIdsUnitStride, "mutant-slot-ids-unit-stride",
                "slot_ids read with unit stride: a block-table column block_table[:, 0] is read along its first row "
                "(vLLM #51682)", klass="interface", gallery=False)
register_mutant(StagedFoldKeptAtZero, "mutant-staged-fold-kept-at-zero",
                "a staged fold's commit(0) after a flush keeps the fold (checkpoint and cursors move, as under 'noop')",
                klass="bookkeeping", decodes=("speculative",), gallery=False)
register_mutant(NextVerifyFoldSkipped, "mutant-next-verify-fold-skipped",
                "a fold at the next verify never lands: the next verify drops the fold its slot owes (ROCm/ATOM's "
                "deferred fold)", klass="bookkeeping", decodes=("speculative",), gallery=False)
register_mutant(MaterializeOffByOne, "mutant-materialize-off-by-one",
                "materialize publishes the state after upto + 1 history tokens (off-by-one prefix)",
                klass="bookkeeping", gallery=False)
register_mutant(MaterializeRewritesSource, "mutant-materialize-rewrites-source",
                "materialize also folds the published prefix into its source slot (the source's storage changes)",
                klass="bookkeeping", gallery=False)

__all__: list[str] = []
