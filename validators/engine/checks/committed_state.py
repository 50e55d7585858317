"""Check ``state``: after each commit the committed state equals the reference after the accepted prefix.

Oracle: the fp64 token-by-token recurrence on the accepted stream and the tolerance rule
(:class:`~replayssm.validators.engine.checks.tolerance_rule.ToleranceRule`: factor x the literal
model's state error + floor, relative to the reference state's size; on steps without the literal
model, the fp64 running-error bound of ``checks/fp64_bound.py`` + floor).  A non-finite state
fails as ``non-finite``.
"""

from __future__ import annotations

import torch

from replayssm.validators.engine.checks.registry import BOTH, register_check


@register_check("state", banded=True, hooks="after-commit", schedule="state", kinds=BOTH,
                catches="after a commit the committed state differs from the reference after the accepted prefix "
                        "by more than the tolerance rule allows",
                mutant="mutant-exclusive-cumsum")
def state(ctx) -> None:
    run = ctx.run
    if ctx.ref_state is None:  # golden truth: no state stored at this step
        return
    got = ctx.judged_state(run.committed_state(ctx.kernel))
    lit = [ctx.judged_state(run.committed_state(x)) for x in run.literals] if ctx.use_literal else None
    ctx.record["state_err"], ctx.record["state_bound_ratio"] = ctx.rule.check_states(
        ctx, "state", got, ctx.ref_state, lit, run.active, None if ctx.fp64 is None else ctx.fp64["state"],
                          None if ctx.fp64 is None else ctx.fp64["state_arith"])
    if run.active:  # each row's largest committed-state error since its reset (the materialize check's envelope)
        idx = torch.tensor(run.active, device=got.device)
        err = (got.index_select(0, idx).to(torch.float64) - ctx.ref_state.index_select(0, idx)).abs()
        err = err.reshape(len(run.active), -1).amax(1)
        env = ctx.rule.envelope["state_err"]
        env.index_copy_(0, idx.to(env.device), torch.maximum(env.index_select(0, idx.to(env.device)),
                                                             torch.where(torch.isfinite(err), err, 0.0).to(env.device)))


__all__ = ["state"]
