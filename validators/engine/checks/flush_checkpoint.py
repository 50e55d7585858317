"""Check ``flush-checkpoint``: at a flush the checkpoint equals the reference at the folded count.

Oracle: the fp64 token-by-token recurrence on the accepted stream and the tolerance rule
(:class:`~replayssm.validators.engine.checks.tolerance_rule.ToleranceRule`: factor x the literal
model's checkpoint error + floor, relative to the reference state's size; on steps without the
literal model, the fp64 running-error bound of ``checks/fp64_bound.py`` + floor).  The folded count is
what the declared policy's flush folds: the committed prefix, or the prefix plus window position 0
(the spec's standard decode).  Replay
kernels only (a baseline has no checkpoint apart from its state).  A non-finite checkpoint fails
as ``non-finite``.
"""

from __future__ import annotations

from replayssm.validators.engine.checks.registry import REPLAY, register_check


@register_check("flush-checkpoint", banded=True, hooks="at-flush", schedule="every-flush", kinds=REPLAY,
                needs=("checkpoint",),
                catches="at a flush the checkpoint differs from the reference state at the folded token count",
                mutant="mutant-late-flush")
def flush_checkpoint(ctx) -> None:
    folded = ctx.ref_first if ctx.run.dec.flush_folds_first else ctx.ref_state_before
    if folded is None:  # golden truth: no state at the folded count is stored
        return
    _, ratio = ctx.rule.check_states(ctx, "flush-checkpoint", ctx.checkpoint, folded, ctx.lit_checkpoints,
                                     ctx.flush_rows, None if ctx.fp64 is None else ctx.fp64["checkpoint"],
                                     None if ctx.fp64 is None else ctx.fp64["checkpoint_arith"])
    if ratio is not None:
        ctx.record["checkpoint_bound_ratio"] = max(ctx.record.get("checkpoint_bound_ratio", 0.0), ratio)


__all__ = ["flush_checkpoint"]
