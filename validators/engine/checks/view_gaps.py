"""Check ``view-gaps``: under the ``views`` layout, nothing between the views handed to the kernel changes.

Oracle: the kernel interface (``supports_strided_views``): a kernel reads and writes its tensors
through their strides.  Under a plan with ``layout: "views"`` (validators/engine/engine_views.py) every
input is a slice of one wider buffer, ``out`` a slice of another, ``slot_ids`` (and at commit
``accepted``) a column of a 2-D table; the elements no view covers (canaries between the slices,
the table's other columns) must keep their bits through the verify and the commit.  Catches a
kernel that writes a strided ``out`` as if it were contiguous (its outputs run into the gaps).
A kernel reading a column as if it had unit stride (vLLM #51682) reads other slots and fails the
slot and value checks instead.
"""

from __future__ import annotations

import torch

from replayssm.validators.engine.checks.registry import BOTH, register_check

_CALL = {"verify-returned": "verify", "after-commit": "commit"}


def _changed(ctx) -> torch.Tensor:
    gaps = ctx.run.view_gaps.get(_CALL[ctx.hook], [])
    if not gaps:
        return torch.zeros((), dtype=torch.bool, device=ctx.run.device)
    return torch.stack([g.changed().to(ctx.run.device) for g in gaps]).any()


@register_check("view-gaps", hooks=("verify-returned", "after-commit"), schedule="every-step", kinds=BOTH,
                flag=_changed,
                catches="under the views layout, a verify or commit changed an element between the strided views "
                        "it was handed (the gaps of out's or the inputs' wider buffer, the block table's other "
                        "columns)",
                mutant="mutant-out-assumes-contiguous", witness={"schedule_params": {"layout": "views"}})
def view_gaps(ctx) -> None:
    call = _CALL[ctx.hook]
    for g in ctx.run.view_gaps.get(call, []):
        idx = g.first_change()
        if idx is not None:
            ctx.fail("view-gaps", f"{call} wrote between the views of {g.name}'s wider buffer (shape "
                                  f"{tuple(g.buffer.shape)}) at index {list(idx)}: it did not follow the strides "
                                  f"it was handed")
            return


__all__ = ["view_gaps"]
