"""Check ``accepted-range``: commit refuses an out-of-range accepted count on a live row, before anything changes.

Oracle: the kernel interface (spec 3): ``commit`` takes ``lo <= accepted[r] <= T'_r`` for every
active row (``lo`` 1, or 0 for a ``zero_accept = "noop"`` kernel; T'_r the row's window length
at its last verify) and must raise ``ValueError`` naming ``accepted[r]`` for anything else,
changing no slot's storage or cursors; padding rows' counts are garbage it ignores (the engine
hands garbage there every step, ``Lockstep.commit_counts``).  On the run's first step and on every
step with a flush verify (a sample of the window's phases that costs one snapshot each), before
the step's real commit, the engine probes one live row, in turn, with ``T' + 1`` (T'max + 1; 2 at a
standard step) and with ``-1``; the step then commits as planned.  Catches a kernel that derives indices from a count
it never bounds (vLLM #50021: accepted-count-derived indices out of range), here one that clamps
the count into range instead of refusing it.
"""

from __future__ import annotations

import torch

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check


def _call_window(ctx) -> int:
    """The verify's window: T' (T'max), or 1 at a standard step (a probe past it is out of range
    for every row, whatever window length a kernel took for it)."""
    return 1 if ctx.plan.standard else ctx.run.sc.window


@register_check("accepted-range", hooks="after-verify", schedule="invariants", kinds=BOTH,
                needs=("after-verify",),
                catches="commit took an out-of-range accepted count on a live row (k > T' or k < 0) instead of "
                        "raising a ValueError naming accepted[r] before changing anything",
                mutant="mutant-accepted-clamped")
def accepted_range(ctx) -> None:
    run = ctx.run
    if not run.active or not (ctx.flush_rows or ctx.step == run.plans[0].step):
        return
    n = run.coverage["out-of-range counts probed"]
    run.coverage["out-of-range counts probed"] += 1
    r = run.active[n // 2 % len(run.active)]
    bad = _call_window(ctx) + 1 if n % 2 == 0 else -1
    acc = run.commit_counts(ctx.plan)
    acc[r] = bad
    before = ctx.snapshots["after-verify"]
    try:
        ctx.kernel.commit(run.ids, torch.tensor(acc, dtype=torch.int64, device=run.device))
    except ValueError as e:
        if f"accepted[{r}]" not in str(e):
            ctx.fail("accepted-range", f"commit(accepted[{r}] = {bad}) raised ValueError without naming "
                                       f"accepted[{r}]: {e}", slot=run.ids_list[r])
    else:
        ctx.fail("accepted-range", f"commit took accepted[{r}] = {bad} for row {r} (slot {run.ids_list[r]}), "
                                   f"past the call's window T' = {_call_window(ctx)} or below 0: expected a "
                                   f"ValueError naming accepted[{r}] and nothing changed", slot=run.ids_list[r])
        return
    after = run.snapshot()
    for slot in range(run.sc.num_slots):
        changed = inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot))
        if changed:
            ctx.fail("accepted-range", f"a refused commit(accepted[{r}] = {bad}) changed slot {slot}: {changed}",
                     slot=slot)
            return


__all__ = ["accepted_range"]
