"""Checks ``padding-output``, ``unwritten-output``, ``non-finite``: the raw bits of the window outputs.

Oracle: docs/validation.md's exact output rules, on bits, never values.  Before each verify the output
buffer holds a NaN of a fixed payload in active rows and :data:`~replayssm.validators.engine.invariants.PAD_CANARY`
in padding rows (``invariants.poisoned_out``): a padding row must keep its canary, no active
element may still hold the poison, and an output may be non-finite only where the literal model's
is too (the mode's range overflowed: counted in the coverage, not failed).  The three share one
host sync per step (their flags are gathered before any of them reports).
"""

from __future__ import annotations

import torch

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check


def _pad_changed(ctx) -> torch.Tensor:
    run = ctx.run
    if not run.pad_rows:
        return torch.zeros(1, dtype=torch.bool, device=run.device)
    return (ctx.out.index_select(0, run.pad_idx) != inv.PAD_CANARY).any()


@register_check("padding-output", hooks="after-verify", schedule="every-step", kinds=BOTH, flag=_pad_changed,
                catches="a verify changed the output of a padding row (slot -1), whose canary must stay",
                mutant="mutant-padding-output-zeroed")
def padding_output(ctx) -> None:
    for r in ctx.run.pad_rows:
        changed = ctx.out[r] != inv.PAD_CANARY
        if bool(changed.any()):
            pos = inv.first_index(changed)
            ctx.fail("padding-output", f"padding row output changed (first at {pos})", row=r, position=pos[0])


def _any_unwritten(ctx) -> torch.Tensor:
    return ctx.unwritten.any()


@register_check("unwritten-output", hooks="after-verify", schedule="every-step", kinds=BOTH, flag=_any_unwritten,
                catches="an output element of an active row still holds the NaN poison after verify (never written)",
                mutant="mutant-output-element-unwritten")
def unwritten_output(ctx) -> None:
    run = ctx.run
    for i, r in enumerate(run.active):
        if bool(ctx.unwritten[i].any()):
            pos = inv.first_index(ctx.unwritten[i])
            ctx.fail("unwritten-output", f"output element {pos[1:]} still holds the NaN poison",
                     row=r, slot=run.ids_list[r], position=pos[0])


def _nonfinite(ctx) -> torch.Tensor:
    return ~torch.isfinite(ctx.o_act) & ~ctx.unwritten


def _any_nonfinite(ctx) -> torch.Tensor:
    return _nonfinite(ctx).any()


@register_check("non-finite", hooks="after-verify", schedule="every-step", kinds=BOTH, flag=_any_nonfinite,
                catches="a non-finite output where the reference and the literal model are finite (the state and "
                        "flush-checkpoint checks report non-finite states under this name too)",
                mutant="mutant-output-accumulator-nan")
def non_finite(ctx) -> None:
    run = ctx.run
    nonfinite = _nonfinite(ctx)
    lit_nonfinite = ctx.lit_nonfinite
    for i, r in enumerate(run.active):
        bad = nonfinite[i]
        if lit_nonfinite is not None:
            expected = bad & lit_nonfinite[i]
            if bool(expected.any()):
                run.coverage["non-finite outputs also in the literal model (mode overflow)"] += int(expected.sum())
            bad = bad & ~lit_nonfinite[i]
        if bool(bad.any()):
            pos = inv.first_index(bad)
            ref = "not stored" if ctx.ref_out is None else f"{float(ctx.ref_out[r][pos]):.4g}"
            ctx.fail("non-finite", f"first non-finite output element {pos[1:]} (value {float(ctx.o_act[i][pos]):g}, "
                                   f"reference {ref})",
                     row=r, slot=run.ids_list[r], position=pos[0])


__all__ = ["non_finite", "padding_output", "unwritten_output"]
