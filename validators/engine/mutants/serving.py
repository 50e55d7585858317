"""Mutants of serving-engine behaviour (issue 14): the mechanisms of public reports, one bug each.

Oracle: each mutant is a literal model plus exactly one bug seen in a serving engine; the engine
must fail it on the scenario docs/field_bugs.md names (tests/engine/test_serving.py runs each there).

* ``mutant-zero-accept-commits-drafts`` (vLLM #56419): declares ``zero_accept = "noop"`` but a
  commit with k = 0 commits the whole window, rejected drafts included.
* ``mutant-zero-accept-reads-draft-minus-1`` (vLLM #56419, the out-of-bounds read): a baseline
  that declares ``"noop"`` but copies draft state ``k - 1`` on every commit: with k = 0 that is
  index -1 (the last draft slot; out of bounds in a kernel without Python's wrap-around).
* ``mutant-accepted-for-compacted-rows`` (vLLM PR #55504, PR #47428): the accepted counts are
  read for the active rows compacted (padding rows dropped) while the tensor holds one entry per
  batch row: every active row after a padding row gets its neighbour's count.
* ``mutant-recycled-slot-keeps-state`` (tpu-inference PR #2408): re-admitting a slot that held a
  sequence keeps that sequence's checkpoint instead of loading the new initial state.
* ``mutant-padding-lane-writes`` (SGLang ``gdn_replayssm_spec_decode``): a ragged verify stores
  the whole padded block: the padding lanes past T'_r get the stale value of the last valid lane.
* ``mutant-nonspec-reads-draft-slot-0`` (vLLM #39273): a baseline keeping one state per draft
  position; after a commit of k >= 2 the live state sits in draft slot k-1, and the next
  non-speculative step of that sequence (window length 1, or a standard step on the speculative
  slot) reads slot 0.
* ``mutant-packed-window-overrun``: in the packed layout (``query_start_loc``) every row runs
  T'max tokens from its offset: a short row's window runs into the next row's tokens (or the
  buffer's spare tail) and writes outputs there (later rows overwrite theirs; the last row's
  overrun stays).
* ``mutant-host-cursors-stale``: a host-cursors kernel that materialises its committed state
  from the cursors of its last verify instead of the table the caller passes (the caller has
  advanced them at commit).
"""

from __future__ import annotations

import torch

from replayssm.interface import PAD_SLOT
from replayssm.ops.literal import LiteralHostCursorsKernel
from replayssm.validators.engine.mutants.registry import register_mutant

SPEC_ONLY = ("speculative",)


class ZeroAcceptCommitsDrafts:
    """k = 0 is committed as the row's whole window (the rejected drafts become history)."""

    zero_accept = "noop"

    def commit(self, slot_ids, accepted):
        ids = slot_ids.tolist()
        acc = accepted.clone()
        for r, s in enumerate(ids):
            if s != PAD_SLOT and int(acc[r]) == 0:
                acc[r] = self.win_len[s]
        super().commit(slot_ids, acc)


class ZeroAcceptReadsDraftMinus1:
    """commit(k) copies draft state k - 1 whatever k is: k = 0 reads index -1."""

    zero_accept = "noop"

    def commit(self, slot_ids, accepted):
        ids, ks = self.check_commit_args(slot_ids, accepted, self.pending, self.win_len)
        for s, k in zip(ids, ks):
            if s == PAD_SLOT:
                continue
            self.ckpt[s].copy_(self.draft[s, k - 1])
            if self.ckpt_scale is not None:
                self.ckpt_scale[s].copy_(self.draft_scale[s, k - 1])
            self.pending[s] = False


class AcceptedForCompactedRows:
    """The i-th active row commits ``accepted[i]`` (indexing the batch-row tensor by the active
    rows' compacted index)."""

    def commit(self, slot_ids, accepted):
        ids = slot_ids.tolist()
        active = [r for r, s in enumerate(ids) if s != PAD_SLOT]
        acc = accepted.clone()
        for i, r in enumerate(active):
            acc[r] = max(1, int(accepted[i]))  # a padding row's 0 is read as "at least 1"
        super().commit(slot_ids, acc)


class RecycledSlotKeepsState:
    """reset() of a slot already admitted keeps its previous tenant's checkpoint (and scales);
    cursors are reset as they should be."""

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        old = {s: (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
               for s in ids if s != PAD_SLOT and self.ready[s]}
        super().reset(slot_ids, initial_state, origin)
        for s, (c, sc) in old.items():
            self.ckpt[s].copy_(c)
            if sc is not None:
                self.ckpt_scale[s].copy_(sc)


class PaddingLaneWrites:
    """A ragged verify writes every lane of the padded block: lanes past T'_r repeat the last
    valid lane's output."""

    def verify(self, slot_ids, inputs, out=None, window_lens=None):
        res = super().verify(slot_ids, inputs, out, window_lens=window_lens)
        if window_lens is not None:
            for r, (s, n) in enumerate(zip(slot_ids.tolist(), window_lens.tolist())):
                if s != PAD_SLOT and n < self.decode.window:
                    res[r, n:] = res[r, n - 1]
        return res


class NonSpecReadsDraftSlot0:
    """After commit(k >= 2) the next verify with window length 1 (a step without drafts) starts
    from draft slot 0 (the state after the first window token of the last verify), not from the
    live state (slot k-1, which the commit copied); a standard step on the speculative slot
    (one-token inputs) likewise."""

    supports_mixed_decode = True

    def commit(self, slot_ids, accepted):
        super().commit(slot_ids, accepted)
        self._live = getattr(self, "_live", {})
        for s, k in zip(slot_ids.tolist(), accepted.tolist()):
            if s != PAD_SLOT:
                self._live[s] = k - 1

    def reset(self, slot_ids, initial_state=None, origin=None):
        super().reset(slot_ids, initial_state, origin)
        for s in slot_ids.tolist():
            getattr(self, "_live", {}).pop(s, None)

    def verify(self, slot_ids, inputs, out=None, window_lens=None):
        saved = {}
        lens = window_lens
        if lens is None and self.call_window(inputs) == 1 < self.decode.window:
            lens = torch.ones(slot_ids.shape, dtype=torch.int64)
        if lens is not None:
            for s, n in zip(slot_ids.tolist(), lens.tolist()):
                if s != PAD_SLOT and n == 1 and getattr(self, "_live", {}).get(s, 0) >= 1:
                    saved[s] = (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
                    self.ckpt[s].copy_(self.draft[s, 0])
                    if self.ckpt_scale is not None:
                        self.ckpt_scale[s].copy_(self.draft_scale[s, 0])
        try:
            return super().verify(slot_ids, inputs, out, window_lens=window_lens)
        finally:
            for s, (c, sc) in saved.items():
                self.ckpt[s].copy_(c)
                if sc is not None:
                    self.ckpt_scale[s].copy_(sc)


class PackedWindowOverrun:
    """Packed layout: each active row verifies T'max tokens from its offset (clamped to the
    buffer), writing their outputs in row order; commits stay within the row's real window."""

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        if query_start_loc is None:
            return super().verify(slot_ids, inputs, out, window_lens, cursors=cursors)
        ids = self._check_slot_ids(slot_ids)
        self.check_verify_args(slot_ids, inputs, out, query_start_loc=query_start_loc)
        n_tok = int(next(iter(inputs.values())).shape[0])
        lens = self.check_query_start_loc(ids, query_start_loc, n_tok)
        qs, T = [int(v) for v in query_start_loc.tolist()], self.decode.window
        runs = [0 if n == 0 else min(T, n_tok - qs[r]) for r, n in enumerate(lens)]
        padded = {}
        for k, v in inputs.items():
            padded[k] = torch.zeros((len(ids), T, *v.shape[1:]), dtype=v.dtype, device=v.device)
            for r, n in enumerate(runs):
                padded[k][r, :n] = v[qs[r]:qs[r] + n]
        res = self._verify(slot_ids, padded, None, torch.tensor([max(n, 1) if s != PAD_SLOT else 0
                                                                  for s, n in zip(ids, runs)]))
        if out is None:
            out = torch.full((n_tok, *self.out_shape), float("nan"), dtype=self.mode.act_dtype, device=self.device)
        for r, n in enumerate(runs):
            out[qs[r]:qs[r] + n] = res[r, :n]
        return out


class HostCursorsStale(LiteralHostCursorsKernel):
    """committed_state checks the caller's table but folds by the cursors of the last verify."""

    def committed_state(self, slot_ids, cursors=None):
        self.check_cursors(self._check_slot_ids(slot_ids), cursors)
        return self._committed_by_own_cursors(slot_ids)


# On every family (the mechanisms are family-independent).  ``gallery=False``: CI catches each by a
# direct run of its named scenario (tests/engine/test_serving.py on one family, tests/ops/kda/test_kda.py
# on KDA, a few steps each) rather than by fuzzing, which is slower (the ci profile, catch + shrink on
# the loaded 2-core machine: rec:f6dd16490ecd90af and the 4 other records of that run);
# ``replayssm fuzz --kernel <name>`` still finds each.
register_mutant(ZeroAcceptCommitsDrafts, "mutant-zero-accept-commits-drafts",
                "commit(k = 0) commits the whole window, rejected drafts included (vLLM #56419)",
                klass="bookkeeping", decodes=SPEC_ONLY, gallery=False)
register_mutant(ZeroAcceptReadsDraftMinus1, "mutant-zero-accept-reads-draft-minus-1",
                "commit(k) copies draft state k - 1 even for k = 0: index -1 (vLLM #56419, out-of-bounds read)",
                klass="bookkeeping", base="baseline", decodes=SPEC_ONLY, gallery=False)
register_mutant(AcceptedForCompactedRows, "mutant-accepted-for-compacted-rows",
                "accepted counts read by compacted active-row index, not batch row (vLLM PR #55504, PR #47428)",
                klass="bookkeeping", decodes=SPEC_ONLY, gallery=False)
register_mutant(RecycledSlotKeepsState, "mutant-recycled-slot-keeps-state",
                "a re-admitted slot keeps its previous tenant's checkpoint (tpu-inference PR #2408)",
                klass="bookkeeping", gallery=False)
register_mutant(PaddingLaneWrites, "mutant-padding-lane-writes",
                "a ragged verify writes the padding lanes past T'_r (SGLang gdn_replayssm_spec_decode)",
                klass="interface", decodes=SPEC_ONLY, gallery=False)
register_mutant(NonSpecReadsDraftSlot0, "mutant-nonspec-reads-draft-slot-0",
                "after commit(k >= 2) a window-1 step reads draft slot 0, not the live slot k-1 (vLLM #39273)",
                klass="bookkeeping", base="baseline", gallery=False)
register_mutant(PackedWindowOverrun, "mutant-packed-window-overrun",
                "packed layout: every row runs T'max tokens from its offset, writing outputs past its window",
                klass="interface", decodes=SPEC_ONLY, gallery=False)
register_mutant(HostCursorsStale, "mutant-host-cursors-stale",
                "host-cursors: committed_state folds by the last verify's cursors, not the caller's table",
                klass="bookkeeping", gallery=False)
