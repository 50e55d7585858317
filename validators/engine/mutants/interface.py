"""Interface mutants: right arithmetic, but one rule of the kernel interface (docs/kernel_interface.md) broken.

Oracle: each mutant is the literal replay model plus exactly one slip in how it hands results
back: the ``out=`` buffer, padding rows, every output element written, finite outputs, bitwise
determinism.  Each is caught by exactly one exact check of the engine, the one its registration
in ``validators/engine/checks/`` names as its witness (tests/engine/test_checks.py); every family has them.  One
slip is in a documented default: ``reset(initial_state=None)`` must load zeros; the state and output
checks catch it where the exhaustive schedule re-admits rows through that default (Mamba-2 only:
the default path does not depend on the family).
"""

from __future__ import annotations

from replayssm.interface import PAD_SLOT
from replayssm.validators.engine.invariants import int_view
from replayssm.validators.engine.mutants.registry import register_mutant


class WritesIntoCopy:
    """verify writes its outputs into a private copy of the ``out=`` buffer and returns the copy:
    the values are right, but the caller's buffer is never written."""

    def verify(self, slot_ids, inputs, out=None):
        if out is None:
            return super().verify(slot_ids, inputs, out)
        return super().verify(slot_ids, inputs, out.clone())


class ZeroFillsOutput:
    """verify zero-fills the whole ``out=`` buffer before writing the active rows (a memset over
    the batch, padding rows included)."""

    def verify(self, slot_ids, inputs, out=None):
        if out is not None:
            out.zero_()
        return super().verify(slot_ids, inputs, out)


class LastElementUnwritten:
    """The output tile loop stops one element short: the last element of every window
    position's output is never written."""

    def verify(self, slot_ids, inputs, out=None):
        if out is None:
            return super().verify(slot_ids, inputs, out)
        flat = out.view(out.shape[0], out.shape[1], -1)
        before = flat[:, :, -1].clone()
        res = super().verify(slot_ids, inputs, out)
        flat[:, :, -1] = before
        return res


class UninitialisedAccumulator:
    """The readout accumulator of the last window position starts from uninitialised memory
    instead of zero (modelled as NaN, as a NaN-filling allocator returns it): that output is NaN
    although the reference is finite; the state is right."""

    def verify(self, slot_ids, inputs, out=None):
        res = super().verify(slot_ids, inputs, out)
        for r, s in enumerate(slot_ids.tolist()):
            if s != PAD_SLOT:
                res[r, -1] += float("nan")
        return res


class AlternatingLastBit:
    """Run-to-run non-determinism, as from a reduction whose order depends on the launch (atomics):
    every second instance of the kernel flips the lowest bit of its first output element; each
    run alone is within the tolerance, two runs are not bit-identical."""

    instances = 0

    def __init__(self, config):
        super().__init__(config)
        type(self).instances += 1
        self.flips = type(self).instances % 2 == 0

    def verify(self, slot_ids, inputs, out=None):
        res = super().verify(slot_ids, inputs, out)
        if self.flips:
            r = next((i for i, s in enumerate(slot_ids.tolist()) if s != PAD_SLOT), None)
            if r is not None:
                int_view(res[r]).view(-1)[0] ^= 1
        return res


class ResetNoneKeepsState:
    """``reset(slot_ids, initial_state=None)`` (the documented default: zeros) resets the cursors
    but keeps the slot's previous checkpoint: a re-admitted sequence starts from the last tenant's
    state.  Given an explicit initial state it is right, so only the default path shows it."""

    def reset(self, slot_ids, initial_state=None, origin=None):
        if initial_state is not None:
            return super().reset(slot_ids, initial_state, origin)
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        kept = {s: (self.ckpt[s].clone(), None if self.ckpt_scale is None else self.ckpt_scale[s].clone())
                for s in ids if s != PAD_SLOT}
        super().reset(slot_ids, None, origin)
        for s, (c, sc) in kept.items():
            self.ckpt[s].copy_(c)
            if sc is not None:
                self.ckpt_scale[s].copy_(sc)


register_mutant(WritesIntoCopy, "mutant-out-param-copy",
                "verify writes into a private copy of out= and returns it (the caller's buffer is never written)",
                klass="interface")
register_mutant(ZeroFillsOutput, "mutant-padding-output-zeroed",
                "verify zero-fills the whole out= buffer, padding rows included", klass="interface")
register_mutant(LastElementUnwritten, "mutant-output-element-unwritten",
                "the output tile loop stops one short: the last element of each window position is never written",
                klass="interface")
register_mutant(UninitialisedAccumulator, "mutant-output-accumulator-nan",
                "the last window position's readout accumulator starts from uninitialised memory (NaN)",
                klass="interface")
# Fuzzed on Mamba-2; the other families catch it on the default validation's exhaustive schedule, which
# re-admits rows through reset(initial_state=None) (tests/ops/kda/test_kda.py for KDA).
register_mutant(ResetNoneKeepsState, "mutant-reset-none-keeps-state",
                "reset with initial_state=None (the default: zeros) keeps the slot's previous checkpoint",
                klass="interface", gallery=("mamba2",))
register_mutant(AlternatingLastBit, "mutant-nondeterministic-output",
                "every second run flips the lowest bit of one output (launch-order-dependent reduction)",
                klass="interface")

__all__: list[str] = []
