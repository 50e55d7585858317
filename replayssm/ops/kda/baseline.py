"""Triton baseline KDA decode ("triton-baseline", family kda): the state is read and written every
token, as serving engines do it without ReplaySSM (FLA's fused recurrent KDA form).

* Standard decode: one program per (row, value head, block of value rows) loads its state tile,
  applies the per-channel gated delta rule (``naive.py``: ``alpha = exp(g)`` per key channel,
  L2-normalised q/k with the K^-1/2 scale, ``S <- S Diag(alpha)``, ``d = beta (v - S k)``,
  ``S <- S + d k^T``, ``o = S q``), writes the state back and the output.
* Speculative decode: the state is stepped through the T' window tokens in fp32 registers and one
  state per window position is stored (``(1 + T') S`` bytes per verify, the baseline of docs/recurrences.md section 3);
  ``commit(k)`` moves the slot's ``current`` position k on (no state copy).

The kernel, storage, commit and inspection are the delta rule's (``replayssm.ops.delta_rule.baseline``,
one gate per key channel).

Oracle: ``naive.py``'s recurrence in fp64 and the literal baseline (``literal-baseline``, family
kda), which rounds at the same places (state stores in the state dtype, outputs in the activation
dtype; within a speculative window the fp32 state carries over unrounded).  Expected error: within
a small factor of the literal baseline's at the same precision mode (tests/ops/kda/test_kda_triton.py).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

from replayssm.ops.delta_rule.baseline import DeltaRuleBaseline
from replayssm.ops.kda.triton_base import TritonKDABase
from replayssm.registry import register


@register
class TritonKDABaseline(TritonKDABase, DeltaRuleBaseline):
    """The delta-rule baseline (one state per draft position, ``current`` moved on commit) with the
    per-channel gated step."""

    name = "triton-baseline"
    family = "kda"
    description = ("Triton baseline: state read and written every token (per-channel gates); speculative "
                   "stores one state per draft position and keeps the accepted one")


__all__ = ["TritonKDABaseline"]
