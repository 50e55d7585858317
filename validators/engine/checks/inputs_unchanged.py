"""Check ``inputs-unchanged``: verify and commit leave every tensor they are handed bit-identical.

Oracle: the kernel interface (spec 3): inputs are read-only.  Before each verify and each commit
the Lockstep copies every tensor it hands the kernel (``slot_ids``, each ``inputs[name]``,
``window_lens``, ``query_start_loc``, the cursor table; ``accepted``); after the call each must
hold the same bits.  Catches a kernel that uses its inputs as scratch or "fixes" them in place: the
fp64 reference reads the inputs after the verify, so a kernel that rewrites them so that its
outputs agree would pass every value check (KernelBench tests its evaluator for this).  The flag
compares every tensor at once where it lives; the per-tensor message runs only when it is raised.
"""

from __future__ import annotations

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check

_CALL = {"verify-returned": "verify", "after-commit": "commit"}


def _given(ctx) -> dict:
    return ctx.run.given.get(_CALL[ctx.hook], {})


def _changed(ctx):
    return inv.any_differ(((copy, t) for t, copy in _given(ctx).values()), ctx.run.device)


@register_check("inputs-unchanged", hooks=("verify-returned", "after-commit"), schedule="invariants", kinds=BOTH,
                needs=("inputs",), flag=_changed,
                catches="verify or commit changed a tensor it was handed (an input, slot_ids, window_lens, "
                        "query_start_loc, the cursor table or accepted): inputs are read-only",
                mutant="mutant-input-rescaled-in-place")
def inputs_unchanged(ctx) -> None:
    call = _CALL[ctx.hook]
    for name, (t, copy) in _given(ctx).items():
        if inv.bits_equal(copy, t):
            continue
        where = ""
        if t.shape == copy.shape and t.dtype == copy.dtype:
            idx = inv.first_index(inv.int_view(t) != inv.int_view(copy.to(t.device)))
            where = f", first at index {list(idx)}" if idx is not None else ""
        ctx.fail("inputs-unchanged", f"{call} changed its argument {name} in place{where}; the caller's tensors "
                                     f"are read-only")
        return


__all__ = ["inputs_unchanged"]
