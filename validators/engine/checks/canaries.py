"""Check ``unused-slot``: slots no row uses stay bit-identical all run.

Oracle: docs/validation.md.  Before the run the Lockstep fills every unused slot with canary data (a reset,
a verify and a commit of their own: state, ring rows, cursors) and snapshots it; after every
verify and every commit each field of those slots in the kernel's snapshot must still have the
same bits (a kernel writing through a wrong slot index, e.g. slot -1 read as the last slot).
The flag compares every field of all unused slots at once where the snapshot lives; the
per-slot, per-field comparison that names the change runs only when it is raised.
"""

from __future__ import annotations

import torch

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check

_WHEN = {"after-verify": "verify", "after-commit": "commit"}


def _canary_stack(run) -> dict[str, torch.Tensor]:
    """The canaries of every unused slot, each field stacked ``[slots, ...]`` (rebuilt when the
    Lockstep's canary dict is replaced, e.g. by ``load_state_dict``)."""
    if getattr(run, "_canary_stack_of", None) is not run.canary:
        slots = list(run.canary)
        names = list(run.canary[slots[0]])
        run._canary_stack = {n: torch.stack([run.canary[s][n] for s in slots]) if all(
            n in run.canary[s] for s in slots) else None for n in names}
        run._canary_stack_of = run.canary
    return run._canary_stack


def _canaries_changed(ctx) -> torch.Tensor:
    run = ctx.run
    if not run.canary:
        return torch.zeros((), dtype=torch.bool, device=run.device)
    return inv.fields_differ(_canary_stack(run), inv.slots_view(ctx.snapshots[ctx.hook], list(run.canary)),
                             run.device)


@register_check("unused-slot", hooks=("after-verify", "after-commit"), schedule="invariants", kinds=BOTH,
                needs=("canaries", "after-verify", "after-commit"), flag=_canaries_changed,
                catches="a verify or commit changed a slot no row uses (its canary state, ring rows or cursors)",
                mutant="mutant-padding-writer")
def unused_slot(ctx) -> None:
    snap = ctx.snapshots[ctx.hook]
    for slot, before in ctx.run.canary.items():
        changed = inv.changed_fields(before, inv.slot_view(snap, slot))
        if changed:
            ctx.fail("unused-slot", f"{_WHEN[ctx.hook]} changed unused slot {slot}: {', '.join(changed)}", slot=slot)


__all__ = ["unused_slot"]
