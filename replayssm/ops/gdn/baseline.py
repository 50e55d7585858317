"""Triton baseline Gated DeltaNet decode ("triton-baseline"): the state is read and written every
token, as serving engines do it without ReplaySSM.

* Standard decode: one program per (row, value head, block of value rows) loads its state tile,
  applies the gated delta rule (docs/recurrences.md section 1: gating, L2-normalised q/k with the K^-1/2 scale,
  corrected value d = beta (v - alpha S k)), writes the state back and the output.
* Speculative decode: the state is stepped through the T' window tokens in fp32 registers and one
  state per window position is stored (``(1 + T') S`` bytes per verify, the baseline of docs/recurrences.md section 3).
  Each slot keeps T' + 1 state positions; verify reads the committed one (``current``) and
  writes the drafts into the T' others, so ``commit(k)`` only moves ``current`` k positions on
  (a device-side pointer update, no state copy).

Oracle: ``gdn_sequence`` in fp64 and the literal baseline (``literal-baseline``), which rounds at
the same places (state stores in the state dtype, outputs in the activation dtype; within a
speculative window the fp32 state carries over unrounded).  Expected error: within a small
factor of the literal baseline's at the same precision mode (tests/ops/gdn/test_gdn_triton.py).

The kernel, storage, commit and inspection are the delta rule's (``replayssm.ops.delta_rule.baseline``,
one gate per value head).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

from replayssm.ops.delta_rule.baseline import DeltaRuleBaseline
from replayssm.ops.gdn.triton_base import TritonGDNBase
from replayssm.registry import register


@register
class TritonGDNBaseline(TritonGDNBase, DeltaRuleBaseline):
    name = "triton-baseline"
    description = ("Triton baseline: state read and written every token; speculative stores one state per "
                   "draft position and keeps the accepted one")


__all__ = ["TritonGDNBaseline"]
