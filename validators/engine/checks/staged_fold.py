"""Check ``staged-fold``: a kernel declaring a staged fold leaves everything as before the verify when it commits k = 0.

Oracle: the contract's ``zero_accept = "staged"`` (replayssm/interface.py), on bits: a flush
verify stages its fold without touching the checkpoint, ``commit(k >= 1)`` applies it (the
at-flush checks judge that checkpoint after the commit), ``commit(0)`` discards it: the row's
checkpoint, scales and cursors after the commit equal, bit for bit, what they were before the
verify.  Catches a staged kernel whose commit(0) keeps the fold as a ``"noop"`` kernel does
(checkpoint and cursors move; the committed state is right, the checkpoint a caller rolls back
to is not).  Rows that are not flushes are the ``zero-accept``
check's (nothing changes at all).
"""

from __future__ import annotations

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import REPLAY, register_check

_KEPT = ("checkpoint", "checkpoint_scale", "write_pos", "origin")


@register_check("staged-fold", hooks="after-commit", schedule="invariants", kinds=REPLAY,
                needs=("before-verify", "after-commit"),
                catches="a kernel declaring zero_accept = 'staged' changed the checkpoint, scales or cursors of a row "
                        "that committed k = 0 after a flush verify (the staged fold must be discarded)",
                mutant="mutant-staged-fold-kept-at-zero",
                witness={"schedule": "zero-accept", "steps": 16, "schedule_params": {"zero_prob": 0.5}})
def staged_fold(ctx) -> None:
    run = ctx.run
    if not run.staged:
        return
    rows = [r for r in ctx.zero_rows if r in ctx.flush_rows]
    run.coverage["k = 0 commits after a staged flush"] += len(rows)
    before, after = ctx.snapshots["before-verify"], ctx.snapshots["after-commit"]
    for r in rows:
        slot = run.ids_list[r]
        changed = [f for f in inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot))
                   if f in _KEPT]
        if changed:
            ctx.fail("staged-fold", f"commit(0) after a flush verify changed {changed}; zero_accept = 'staged' "
                                    f"promises the staged fold is discarded and everything stays as before the verify",
                     row=r, slot=slot)


__all__ = ["staged_fold"]
