"""The engine's own broken kernels: docs/field_bugs.md's seven field bugs, each with the step where it must show.

Oracle: each mutant is the literal replay model plus exactly one field-seen bug; the validation
engine must fail it (exit 1) and name the first step where the bug shows.  ``first_bad_step(name,
sc)`` (``registry.py``) says, from the scenario's plan alone, which step that is;
tests/engine/test_mutants_engine.py checks the engine names exactly that step.
"""

from __future__ import annotations

import torch

from replayssm.interface import PAD_SLOT, DecodeConfig
from replayssm.ops.literal import LiteralReplayKernel
from replayssm.precision import FORMATS, FP4_E2M1, FP4_E2M1_GRID, lower_format
from replayssm.validators.engine.mutants.registry import MUTANTS, register_mutant


# ---- helpers: each row's cursor history under the plan (spec rules) -----------------------------------------
def _walk(sc, steps):
    """Yield (step, row, write_pos before verify, flush?, k) for active rows, spec cursor rules."""
    dec = sc.decode_config
    ids = sc.resolved_slot_ids
    wp = {r: 0 for r, s in enumerate(ids) if s != PAD_SLOT}
    for p in steps:
        for r in p.reset_rows:
            wp[r] = 0
        for r in sorted(wp):
            flush = dec.is_flush(wp[r])
            yield p.step, r, wp[r], flush, p.accepted[r]
            wp[r], _ = dec.commit_cursor(wp[r], 0, flush, p.accepted[r])


def _first(sc, steps, pred, offset=0):
    for s, _r, w, f, k in _walk(sc, steps):
        if pred(sc, w, f, k):
            return s + offset
    return None


# ---- the mutants ----------------------------------------------------------------------------------------------
class StaleReadAfterAccept:
    """After a commit that accepted drafts (k >= 2), the next verify reads the history as it was
    before that commit (a stale slot/cursor read); writes go to the right rows."""

    def commit(self, slot_ids, accepted):
        before = list(self.write_pos)
        super().commit(slot_ids, accepted)
        self._stale = getattr(self, "_stale", {})
        for s, k in zip(slot_ids.tolist(), accepted.tolist()):
            if s != PAD_SLOT and k >= 2 and not self.flushed[s]:
                self._stale[s] = before[s]

    def verify(self, slot_ids, inputs, out=None):
        self._reading = True
        try:
            return super().verify(slot_ids, inputs, out)
        finally:
            self._reading = False
            self._stale = {}

    def _history(self, slot, n):
        stale = getattr(self, "_stale", {})
        if getattr(self, "_reading", False) and slot in stale:
            n = stale[slot]
        return super()._history(slot, n)


class CommitNeverApplied:
    """commit() closes the step but never advances the cursor: accepted tokens are never committed."""

    def commit(self, slot_ids, accepted):
        ids, ks = self.check_commit_args(slot_ids, accepted, self.pending)
        for s in ids:
            if s != PAD_SLOT:
                self.pending[s] = False


class ClampedAccept:
    """The accepted count is clamped to the draft capacity T' - 1: the bonus token of a fully
    accepted window is dropped."""

    def commit(self, slot_ids, accepted):
        cap = max(1, self.decode.window - 1)
        super().commit(slot_ids, torch.where(accepted == self.decode.window, cap, accepted))


class StaleRingRowAfterShortWindow:
    """When the previous commit accepted fewer than T' tokens, the next verify does not rewrite
    the ring row of window position 0 (it still holds the rejected draft)."""

    def commit(self, slot_ids, accepted):
        super().commit(slot_ids, accepted)
        self._short = getattr(self, "_short", set())
        for s, k in zip(slot_ids.tolist(), accepted.tolist()):
            if s != PAD_SLOT:
                if k < self.decode.window and not self.flushed[s]:
                    self._short.add(s)
                else:
                    self._short.discard(s)

    def verify(self, slot_ids, inputs, out=None):
        keep = {}
        for s in getattr(self, "_short", set()):
            if s in slot_ids.tolist():
                row = self._row_of(s, self.write_pos[s])
                keep[s] = (row, {k: v[s, row].clone() for k, v in self.records.items()})
        res = super().verify(slot_ids, inputs, out)
        for s, (row, saved) in keep.items():
            for k, v in saved.items():
                self.records[k][s, row].copy_(v)
        self._short = set()
        return res


def _round_fp4(q: torch.Tensor) -> torch.Tensor:
    """Nearest fp4 e2m1 value (ties to the lower magnitude) of ``q`` (|q| <= 6)."""
    grid = torch.tensor(FP4_E2M1_GRID, dtype=q.dtype, device=q.device)
    idx = (q.abs().unsqueeze(-1) - grid).abs().argmin(-1)
    return grid[idx] * torch.sign(q)


def store_one_lower(x: torch.Tensor, low: str) -> torch.Tensor:
    """``x`` (fp32) rounded through format ``low`` (``precision.lower_format``) and back: a scaled format
    with its per-row scale amax / qmax, fp4 e2m1 with amax / 6."""
    if low == FP4_E2M1:
        qmax = FP4_E2M1_GRID[-1]
    else:
        fmt = FORMATS[low]
        if not fmt.scaled:
            return x.to(fmt.dtype).to(torch.float32)
        qmax = fmt.qmax
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / qmax
    q = (x / scale).clamp(-qmax, qmax)
    if low == FP4_E2M1:
        q = _round_fp4(q)
    elif FORMATS[low].dtype.is_floating_point:
        q = q.to(FORMATS[low].dtype).to(torch.float32)
    else:
        q = torch.round(q)
    return q * scale


class LowPrecisionState:
    """The state is rounded through the next lower format before it is stored (``precision.lower_format``:
    fp32 -> bf16, bf16/fp16/int8 -> fp8 e4m3, fp8 e4m3 -> fp4 e2m1; 8- and 4-bit formats with a per-row
    scale) while the declared mode is unchanged.  A format with no lower one refuses the mode."""

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if lower_format(mode.state) is None:
            return f"no storage format below {mode.state} (precision.lower_format) to store the state in"
        return super().unsupported_reason(mode, decode, options)

    def _store_state(self, slot, s, target, target_scale):
        x = store_one_lower(s.to(torch.float32), lower_format(self.mode.state))
        super()._store_state(slot, x.to(s.dtype), target, target_scale)


class _ForcedFlush:
    """A DecodeConfig whose is_flush answers a forced value (everything else delegated)."""

    def __init__(self, dec: DecodeConfig, value: bool) -> None:
        self._dec, self._value = dec, value

    def is_flush(self, write_pos: int) -> bool:
        return self._value

    def __getattr__(self, name):
        return getattr(self._dec, name)


class LateFlush:
    """The flush happens one verify late: at the verify the spec makes a flush the kernel only
    appends; it flushes at the next one."""

    def verify(self, slot_ids, inputs, out=None):
        ids = self.check_verify_args(slot_ids, inputs, out, self.write_pos, self.ready)
        out = self._alloc_out(len(ids), out)
        self._due = getattr(self, "_due", set())
        real = self.decode
        for r, s in enumerate(ids):
            if s == PAD_SLOT:
                continue
            spec_flush = real.is_flush(self.write_pos[s])
            if s in self._due:
                force = True
                self._due.discard(s)
            elif spec_flush:
                force = False
                self._due.add(s)
            else:
                force = False
            one = torch.full_like(slot_ids, PAD_SLOT)
            one[r] = s
            self.decode = _ForcedFlush(real, force)
            try:
                LiteralReplayKernel.verify(self, one, inputs, out)
            finally:
                self.decode = real
        return out

    def check_verify_args(self, slot_ids, inputs, out, write_pos=None, ready=None, window_lens=None):
        # The late flush lets write_pos run one window past the spec's bound: check the rest.
        return super().check_verify_args(slot_ids, inputs, out, None, ready, window_lens)


class PaddingSlotWriter:
    """Outputs are right, but for a padding row (slot -1) the window's input records are appended
    to slot ``-1`` read as a Python index: the last slot."""

    def verify(self, slot_ids, inputs, out=None):
        res = super().verify(slot_ids, inputs, out)
        for r, s in enumerate(slot_ids.tolist()):
            if s != PAD_SLOT:
                continue
            for name, rec in self.records.items():
                if name in inputs:
                    src = inputs[name][r, 0].to(rec.dtype)
                    if src.shape == rec[-1, 0].shape:
                        rec[-1, self.write_pos[-1] % rec.shape[1]].copy_(src)
        return res


register_mutant(StaleReadAfterAccept, "mutant-stale-read",
                "after accepting drafts (k >= 2) the next verify reads the pre-commit history (stale slot read)",
                decodes=("speculative",),
                klass="bookkeeping", field_bug=True,
                first_bad=lambda sc, st: _first(sc, st, lambda sc, w, f, k: k >= 2 and not f, offset=1))
register_mutant(CommitNeverApplied, "mutant-no-commit", "commit never advances the cursor (accepted never committed)",
                klass="bookkeeping", field_bug=True,
                first_bad=lambda sc, st: st[0].step)
register_mutant(ClampedAccept, "mutant-clamped-accept", "accepted count clamped to T' - 1 (bonus token dropped)",
                decodes=("speculative",),
                klass="bookkeeping", field_bug=True,
                first_bad=lambda sc, st: _first(sc, st, lambda sc, w, f, k: k == sc.window))
register_mutant(StaleRingRowAfterShortWindow, "mutant-stale-ring-row",
                "ring row of window position 0 left stale after a shorter accepted window",
                decodes=("speculative",),
                klass="bookkeeping", field_bug=True,
                first_bad=lambda sc, st: _first(sc, st, lambda sc, w, f, k: k < sc.window and not f, offset=1))
register_mutant(LowPrecisionState, "mutant-low-precision-state",
                "state rounded through the next lower format than declared (fp32->bf16, 16/8-bit->fp8, fp8->fp4)",
                # A random initial state is fp32-representable: only an fp64 state stores it exactly.
                klass="precision", field_bug=True,
                first_bad=lambda sc, st: st[0].step if sc.initial_state == "random" and not sc.precision.is_reference
                else _first(sc, st, lambda sc, w, f, k: f))
register_mutant(LateFlush, "mutant-late-flush", "flush one verify later than the spec's rule",
                klass="bookkeeping", field_bug=True,
                first_bad=lambda sc, st: _first(sc, st, lambda sc, w, f, k: f))
register_mutant(PaddingSlotWriter, "mutant-padding-writer",
                "correct outputs, but padding rows write records into slot -1 (the last slot)",
                klass="bookkeeping", field_bug=True,
                first_bad=lambda sc, st: st[0].step if PAD_SLOT in sc.resolved_slot_ids else None)


# The field bugs, name -> spec (a view of the one registry).
FIELD_BUGS = {n: m for n, m in MUTANTS.items() if m.field_bug}

__all__ = ["FIELD_BUGS"]
