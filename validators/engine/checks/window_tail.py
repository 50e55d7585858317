"""Check ``window-tail``: a ragged verify leaves the outputs past each row's window untouched.

Oracle: the contract of ``verify(..., window_lens=)`` (replayssm/interface.py), on bits: the
output buffer is NaN-poisoned before the verify (``invariants.poisoned_out``); positions
``window_lens[r]..T'max-1`` of an active row are padding lanes and must still hold the exact
poison afterwards.  Catches a kernel that runs the padded block and writes its padding lanes
(SGLang ``gdn_replayssm_spec_decode``: stale padding-lane values leaking into outputs).
"""

from __future__ import annotations

import torch

from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import BOTH, register_check


def _written_tail(ctx) -> torch.Tensor:
    written = ~inv.unwritten_mask(ctx.out_raw).flatten(2).all(-1)  # [R, T']
    return ctx.tail & written


def _any_written_tail(ctx) -> torch.Tensor:
    if ctx.tail is None:
        return torch.zeros((), dtype=torch.bool, device=ctx.run.device)
    return _written_tail(ctx).any()


@register_check("window-tail", hooks="after-verify", schedule="every-step", kinds=BOTH, flag=_any_written_tail,
                catches="a ragged verify wrote an output past the row's window length window_lens[r] (a padding lane)",
                mutant="mutant-padding-lane-writes",
                witness={"schedule": "ragged", "steps": 3})
def window_tail(ctx) -> None:
    run = ctx.run
    bad = _written_tail(ctx)
    lens = ctx.plan.window_lens
    for r in run.active:
        if bool(bad[r].any()):
            t = int(torch.nonzero(bad[r])[0, 0])
            ctx.fail("window-tail", f"output position {t} past the row's window (window_lens[{r}] = {lens[r]}) was "
                                    f"written", row=r, slot=run.ids_list[r], position=t)


__all__ = ["window_tail"]
