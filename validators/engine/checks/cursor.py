"""Check ``cursor``: after each commit the kernel's cursors follow the spec's rule.

Oracle: docs/recurrences.md section 3 under the kernel's declared bookkeeping policy (``DecodeConfig.commit_cursor``
and ``is_flush`` ask ``replayssm.interface.POLICIES[kernel.bookkeeping]``), applied by the
Lockstep to its own copy of every row's (write_pos, origin): the kernel's snapshot after the
commit must hold the same (write_pos, origin, is_flush).  Replay kernels only (a baseline keeps no cursors).
"""

from __future__ import annotations

from replayssm.validators.engine.checks.registry import REPLAY, register_check


@register_check("cursor", hooks="after-commit", schedule="invariants", kinds=REPLAY, needs=("after-commit",),
                catches="after a commit, write_pos / origin / is_flush differ from the declared policy's cursor rule",
                mutant="mutant-no-commit")
def cursor(ctx) -> None:
    run, snap = ctx.run, ctx.snapshots["after-commit"]
    for r in run.active:
        slot = run.ids_list[r]
        got = (int(snap.write_pos[slot]), int(snap.origin[slot]), bool(snap.is_flush[slot]))
        want = (run.wp[r], run.origin[r], run.dec.is_flush(run.wp[r]))
        if got != want:
            ctx.fail("cursor", f"after commit({ctx.plan.accepted[r]}): (write_pos, origin, is_flush) = {got}, "
                               f"the {run.dec.policy!r} rule gives {want}", row=r, slot=slot)


__all__ = ["cursor"]
