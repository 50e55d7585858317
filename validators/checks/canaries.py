"""Check ``unused-slot``: slots no row uses stay bit-identical all run.

Oracle: spec 6.  Before the run the Lockstep fills every unused slot with canary data (a reset,
a verify and a commit of their own: state, ring rows, cursors) and snapshots it; after every
verify and every commit each field of those slots in the kernel's snapshot must still have the
same bits (a kernel writing through a wrong slot index, e.g. slot -1 read as the last slot).
"""

from __future__ import annotations

from replayssm.validators import invariants as inv
from replayssm.validators.checks.registry import BOTH, register_check

_WHEN = {"after-verify": "verify", "after-commit": "commit"}


@register_check("unused-slot", hooks=("after-verify", "after-commit"), schedule="invariants", kinds=BOTH,
                needs=("canaries", "after-verify", "after-commit"),
                catches="a verify or commit changed a slot no row uses (its canary state, ring rows or cursors)",
                mutant="mutant-padding-writer")
def unused_slot(ctx) -> None:
    snap = ctx.snapshots[ctx.hook]
    for slot, before in ctx.run.canary.items():
        changed = inv.changed_fields(before, inv.slot_view(snap, slot))
        if changed:
            ctx.fail("unused-slot", f"{_WHEN[ctx.hook]} changed unused slot {slot}: {', '.join(changed)}", slot=slot)


__all__ = ["unused_slot"]
