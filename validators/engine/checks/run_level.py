"""Checks ``exception``, ``repeat``: what only the whole run shows.

Oracle: docs/validation.md.  A kernel that raises fails at the step it raised (the run keeps the metrics of
the steps before).  A second run of a fresh instance on the same inputs and plan must give
bit-identical outputs at every step (chained sha256 over the output bytes) and leave
bit-identical stored state (sha256 of the final snapshot); the repeat run drives the kernel
alone (no reference, no literal model).
"""

from __future__ import annotations

from replayssm.scenarios.inputs import make_inputs
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check


@register_check("exception", hooks="end-of-run", schedule="once", kinds=BOTH,
                catches="the kernel raised (the run stops at that step and keeps the metrics before it)",
                mutant="mutant-ring-index-unwrapped")
def exception(ctx) -> None:
    e = ctx.exception
    if e is not None:
        ctx.fail(e["step"], "exception", f"{e['type']}: {e['message']}")


def masked_digest(snap, skip=()) -> str:
    """The snapshot's digest with the slots ``skip`` zeroed (the slots the main run published
    into with ``materialize``, which the repeat run leaves as canaries)."""
    for slot in skip:
        for t in inv.slot_view(snap, slot).values():
            t.zero_()
    return inv.snapshot_digest(snap)


def repeat_digests(run, kernel, n: int, skip=()) -> tuple[str, list[str]]:
    """Run a fresh ``kernel`` (a name or a class) through the first ``n`` planned steps of ``run``
    (a Lockstep): (digest of the final snapshot, slots ``skip`` zeroed; the chained output digest
    after each step)."""
    ls = type(run)(run.resolved, kernel, device=run.device, literal_every=0, invariants_every=0, state_every=0,
                   record_metrics=False, steps=run.plans, poison_allocations=run.poison_allocations)
    hexes = []
    ls.start()
    for _ in range(n):
        p, _zero, _probe = ls.effective_plan(ls.plans[ls.step_idx])
        ls.reset_rows(p)
        inputs = make_inputs(run.resolved.inputs, p.step, ls.device)
        out, ret = ls.kernel_verify(p, inputs)
        ls.digest.update(ls.verify_outputs(p, out if ret is None else ret))
        ls.kernel_commit(p)
        hexes.append(ls.digest.hex)
        ls.step_idx += 1
    return masked_digest(ls.snapshot(), skip), hexes


@register_check("repeat", hooks="end-of-run", schedule="repeat", kinds=BOTH,
                catches="a second run of a fresh instance on the same inputs was not bit-identical (outputs or "
                        "stored state)",
                mutant="mutant-nondeterministic-output")
def repeat(ctx) -> None:
    run = ctx.run
    try:
        skip = sorted(run.published)
        final, hexes = repeat_digests(run, ctx.kernel, run.step_idx, skip)
        first_bad = next((i for i, (a, b) in enumerate(zip(ctx.step_digests, hexes)) if a != b), None)
        if first_bad is not None:
            ctx.fail(run.plans[first_bad].step, "repeat", "a second run on the same inputs gave different output bits")
        elif final != masked_digest(run.snapshot(), skip):
            ctx.fail(run.plans[run.step_idx - 1].step, "repeat",
                     "a second run on the same inputs left different stored state bits")
    except Exception as e:  # noqa: BLE001 - the repeat run's error is this check's failure
        ctx.fail(0, "repeat", f"the repeat run raised {type(e).__name__}: {e}")


__all__ = ["exception", "repeat", "repeat_digests"]
