"""Check ``output``: the tolerance rule on every window position's outputs.

Oracle: the fp64 reference run on the committed prefix + window[0..s] (drafts included), and the
literal model at the same precision mode: per row and window position, the max abs error must be
<= factor x the literal's error (its envelope over the window and its stochastic-rounding
replicas) + floor_u x u x scale, where scale is the largest output or readout-term magnitude of
the row's window (``runner.readout_magnitude``).  Positions the unwritten-output or non-finite
checks already explain (poison left, or the literal model non-finite too) are not judged here.
The fp64 running-error bound of ``checks/fp64_bound.py`` (the readout of the state's bound) +
the same floor applies alone on steps without the literal model; on literal steps its
arithmetic-only part + floor where it is larger (another operation order, tolerance_rule.py).
"""

from __future__ import annotations

import torch

from replayssm.validators.engine.checks.registry import BOTH, register_check
from replayssm.validators.engine.metrics import error_metrics


@register_check("output", banded=True, hooks="after-verify", schedule="every-step", kinds=BOTH,
                catches="a window output further from the fp64 reference than factor x the literal model's error "
                        "+ the floor (wrong arithmetic, or a lower precision than declared)",
                mutant="mutant-readout-without-skip")
def output(ctx) -> None:
    if ctx.ref_out is None:  # golden truth: no outputs stored at this step
        return
    if ctx.lit_outs:
        _against_literal(ctx)
    elif ctx.fp64 is not None:
        _against_fp64_bound(ctx)


def _scale(ctx, act):
    """Per row: the largest output or readout term magnitude of the row's window."""
    mag = ctx.ref_magnitude.index_select(0, act).flatten(2).amax(-1)
    return torch.maximum(ctx.metrics["ref_max"], mag).amax(-1, keepdim=True)


def _against_fp64_bound(ctx) -> None:
    run, rule, m = ctx.run, ctx.rule, ctx.metrics
    act = run.active_idx
    scale = _scale(ctx, act)
    fp = ctx.fp64["output"].index_select(0, act)
    b = fp + rule.tol.floor_u * rule.u_out * scale * ctx.sr_walk[:, None]
    # Poison left and non-finite values are the unwritten-output and non-finite checks' to report.
    explained = ctx.unwritten.flatten(2).any(-1) | ~torch.isfinite(ctx.o_act).flatten(2).all(-1)
    excess = (m["max_abs"] > b) & ~explained
    ratio = m["max_abs"] / b.clamp_min(1e-300)
    ctx.device_record["bound_ratio"] = torch.where(torch.isfinite(ratio), ratio, torch.zeros_like(ratio)).amax()
    if bool(excess.any()):
        for i, t in torch.nonzero(excess).tolist():
            r = run.active[i]
            e, bb = float(m["max_abs"][i, t]), float(b[i, t])
            ctx.fail("output", rule.explain_fp64(e, bb, float(fp[i, t]), float(scale[i, 0]), rule.u_out,
                                                 ctx.cause(r, t)),
                     row=r, slot=run.ids_list[r], position=t, value=e, bound=bb)


def _against_literal(ctx) -> None:
    run, rule, m = ctx.run, ctx.rule, ctx.metrics
    act = run.active_idx
    ref_a = ctx.ref_out.index_select(0, act)
    mls = [error_metrics(x.index_select(0, act), ref_a, rule.u_out, lead=2) for x in ctx.lit_outs]
    # The literal's envelope over the window (and over its SR replicas).
    lit_row = rule.running_max("output", act, torch.stack([x["max_abs"] for x in mls]).amax(0).amax(-1, keepdim=True))
    # The floor's scale: the largest output or readout term magnitude of the row's window.
    scale = _scale(ctx, act)
    b = rule.bound(lit_row, scale * rule.sr_walk(act)[:, None]).expand_as(m["max_abs"])
    fp = None
    if ctx.fp64 is not None:  # the envelope with the fp64 running-error bound (tolerance_rule.py)
        fp = ctx.fp64["output_arith"].index_select(0, act)
        b = torch.maximum(b, fp + rule.tol.floor_u * rule.u_out * scale * rule.sr_walk(act)[:, None])
    excess = (m["max_abs"] > b) & ~(ctx.unwritten.flatten(2).any(-1))
    if ctx.lit_nonfinite is not None:
        excess &= ~ctx.lit_nonfinite.flatten(2).any(-1)
    ratio = m["max_abs"] / b.clamp_min(1e-300)
    ctx.device_record["literal_max_abs"] = mls[0]["max_abs"].amax()
    ctx.device_record["bound_ratio"] = torch.where(torch.isfinite(ratio), ratio, torch.zeros_like(ratio)).amax()
    if bool(excess.any()):
        for i, t in torch.nonzero(excess).tolist():
            r = run.active[i]
            e, bb = float(m["max_abs"][i, t]), float(b[i, t])
            ctx.fail("output", rule.explain(e, bb, float(lit_row[i, 0]), float(scale[i, 0]), rule.u_out,
                                            None if fp is None else float(fp[i, t]), where=ctx.cause(r, t)),
                     row=r, slot=run.ids_list[r], position=t, value=e, bound=bb)


__all__ = ["output"]
