"""Checks ``checkpoint-unchanged``, ``committed-ring-rows``: a verify leaves committed storage alone.

Oracle: docs/recurrences.md sections 2-4 under the kernel's declared bookkeeping policy, on bits (snapshots taken just
before and just after the verify).  Only a flush verify (the policy's ``is_flush``) may rewrite a
slot's checkpoint (and its scales); under ``fold_at = "next-verify"`` only the verify right after a
slot's flush (the one owing its fold); no verify may change a record row holding committed history
(the policy's ``committed_rows``: logical positions 0..write_pos-1 from the origin).  Replay kernels only: a
baseline rewrites its state every step and keeps no ring.
Each flag compares the whole set (every non-flush row's checkpoint; every committed ring row) at
once where the snapshots live; the per-row comparison that names the change runs only when raised.
"""

from __future__ import annotations

import torch

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import REPLAY, register_check


def _checkpoints_changed(ctx) -> torch.Tensor:
    run = ctx.run
    before, after = ctx.snapshots["before-verify"], ctx.snapshots["after-verify"]
    folds = ctx.flush_rows if ctx.fold_rows is None else ctx.fold_rows
    slots = [run.ids_list[r] for r in run.active if r not in folds]
    if not slots:
        return torch.zeros((), dtype=torch.bool, device=run.device)
    pairs = [(inv.gather(before.checkpoint, slots), inv.gather(after.checkpoint, slots))]
    if before.checkpoint_scale is not None or after.checkpoint_scale is not None:
        pairs.append((None if before.checkpoint_scale is None else inv.gather(before.checkpoint_scale, slots),
                      None if after.checkpoint_scale is None else inv.gather(after.checkpoint_scale, slots)))
    return inv.any_differ(pairs, run.device)


def _committed_rows_changed(ctx) -> torch.Tensor:
    run = ctx.run
    before, after = ctx.snapshots["before-verify"], ctx.snapshots["after-verify"]
    pairs = [(run.ids_list[r], row) for r in run.active for row in run.dec.committed_rows(run.origin[r], run.wp[r])]
    return inv.ring_rows_differ(before, after, pairs, run.device)


@register_check("checkpoint-unchanged", hooks="after-verify", schedule="invariants", kinds=REPLAY,
                needs=("before-verify", "after-verify"), flag=_checkpoints_changed,
                catches="a non-flush verify changed a slot's checkpoint (or its scales)",
                mutant="mutant-stale-cursor-on-reuse",
                witness={"window": 1, "buffer": 1, "schedule": "explicit", "steps": 3,
                         "schedule_params": {"accepted": [[1, 0, 1]] * 3, "resets": [[1, 0, 0]]}})
def checkpoint_unchanged(ctx) -> None:
    run = ctx.run
    before, after = ctx.snapshots["before-verify"], ctx.snapshots["after-verify"]
    folds = ctx.flush_rows if ctx.fold_rows is None else ctx.fold_rows
    for r in run.active:
        slot = run.ids_list[r]
        if r not in folds and inv.checkpoint_changed(before, after, slot):
            what = ("a verify owing no fold (fold_at = 'next-verify')" if ctx.fold_rows is not None
                    else "non-flush verify")
            ctx.fail("checkpoint-unchanged", f"{what} at write_pos {run.wp[r]} changed the checkpoint",
                     row=r, slot=slot)


@register_check("committed-ring-rows", hooks="after-verify", schedule="invariants", kinds=REPLAY,
                needs=("before-verify", "after-verify"), flag=_committed_rows_changed,
                catches="a verify overwrote a ring row that holds committed history",
                mutant="mutant-ring-wrap-off-by-one",
                witness={"window": 1, "buffer": 1, "schedule": "always-1", "steps": 4})
def committed_ring_rows(ctx) -> None:
    run = ctx.run
    before, after = ctx.snapshots["before-verify"], ctx.snapshots["after-verify"]
    if not before.records:
        return
    for r in run.active:
        slot = run.ids_list[r]
        rows = run.dec.committed_rows(run.origin[r], run.wp[r])
        bad = inv.changed_ring_rows(before, after, slot, rows)
        if bad:
            ctx.fail("committed-ring-rows", f"verify overwrote committed ring rows {bad} "
                                            f"(write_pos {run.wp[r]}, origin {run.origin[r]})", row=r, slot=slot)


__all__ = ["checkpoint_unchanged", "committed_ring_rows"]
