"""Check ``zero-accept``: a commit that accepts nothing (k = 0) does what the kernel declares.

Oracle: the contract's ``zero_accept`` (replayssm/interface.py), on bits.  A ``"noop"`` kernel:
commit(0) leaves the row's checkpoint (and scales) and every record row bit-identical to what the
verify left, and, after a non-flush verify, its cursors too (after a flush verify the cursors move
by the policy's rule with k = 0: the ``cursor`` check).  A ``"refuse"`` kernel is probed before the
step's real commit: commit with k = 0 on those rows must raise ``ValueError`` naming
``accepted[r]`` (its first k = 0 row) and change nothing in any slot; the step then commits k = 1.
Catches a kernel that commits the rejected drafts when every draft is rejected (vLLM #56419).
"""

from __future__ import annotations

import torch

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check

_STORAGE = ("checkpoint", "checkpoint_scale")


def _storage_changes(before, after, slot: int, cursors: bool) -> list[str]:
    changed = inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot))
    keep = [f for f in changed if f in _STORAGE or f.startswith("records.")]
    if cursors:
        keep += [f for f in changed if f in ("write_pos", "origin")]
    return keep


def _probe_refusal(ctx) -> None:
    run, k = ctx.run, ctx.kernel
    before = ctx.snapshots["after-verify"]
    acc = [0 if r in ctx.probe_rows else a for r, a in enumerate(ctx.plan.accepted)]
    first = min(ctx.probe_rows)
    run.coverage["k = 0 refusals probed"] += 1
    try:
        k.commit(run.ids, torch.tensor(acc, dtype=torch.int64, device=run.device))
    except ValueError as e:
        if f"accepted[{first}]" not in str(e):
            ctx.fail("zero-accept", f"commit(k = 0) raised ValueError without naming accepted[{first}]: {e}",
                     row=first, slot=run.ids_list[first])
    else:
        ctx.fail("zero-accept", "the kernel declares zero_accept = 'refuse' but commit(k = 0) was accepted",
                 row=first, slot=run.ids_list[first])
    after = run.snapshot()
    for slot in range(run.sc.num_slots):
        changed = inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot))
        if changed:
            ctx.fail("zero-accept", f"a refused commit(k = 0) changed slot {slot}: {changed}", slot=slot)
            return


def _check_noop(ctx) -> None:
    run = ctx.run
    before, after = ctx.snapshots["after-verify"], ctx.snapshots["after-commit"]
    run.coverage["k = 0 commits (noop)"] += len(ctx.zero_rows)
    for r in ctx.zero_rows:
        if run.staged and r in ctx.flush_rows:  # a staged fold's discarded flush: the staged-fold check's
            continue
        slot = run.ids_list[r]
        bad = _storage_changes(before, after, slot, cursors=r not in ctx.flush_rows)
        if bad:
            ctx.fail("zero-accept", f"commit(0) (every draft rejected) changed {bad}; zero_accept = "
                                    f"{ctx.kernel.zero_accept!r} promises nothing changes", row=r, slot=slot)


@register_check("zero-accept", hooks=("after-verify", "after-commit"), schedule="invariants", kinds=BOTH,
                needs=("after-verify", "after-commit"),
                catches="commit(k = 0) changed storage or cursors of a 'noop' kernel, or a 'refuse' kernel did not "
                        "raise a ValueError naming accepted[r] before changing anything",
                mutant="mutant-zero-accept-commits-drafts",
                witness={"schedule": "zero-accept", "steps": 4, "schedule_params": {"zero_prob": 0.5}})
def zero_accept(ctx) -> None:
    if ctx.hook == "after-verify":
        if ctx.probe_rows:
            _probe_refusal(ctx)
    elif ctx.zero_rows:
        _check_noop(ctx)


__all__ = ["zero_accept"]
