"""Storage, cursors and inspection of the KDA Triton kernels, and the two-launch streams' jitted tile and fold
helpers (rounding: ``replayssm.ops.triton.rounding``; the history's helpers, shared with the one-launch kernels:
``replayssm.ops.delta_rule.history_channel``).

KDA is the delta rule with a per-key-channel gate (``naive.py``): per value head the state
``S [V, K]`` decays column by column, ``S <- S Diag(alpha)`` with ``alpha = exp(g)``, ``g [K]``.
The state storage, the device cursors, the reset and the host-side checks are those of the Gated
DeltaNet kernels (same ``[slots, positions, HV, V, K]`` layout, same cursor rules, same
options): :class:`TritonKDABase` is ``replayssm.ops.delta_rule.triton_base.TritonDeltaRuleBase`` and changes
what is family-specific: the per-channel gate parameters and the fp64 fold of the records.

Oracle: the literal models of ``replayssm.ops.kda.literal`` (same records, same cursor rules of
``DecodeConfig``; gates and the L2 norm as written in ``naive.py``).  Expected error: none for the
storage; ``committed_state`` folds the stored checkpoint and records in fp64 through the literal
model's own fold; gates and norms are fp32 (a few ulp, from the GPU's exp/log).

Replay algebra with per-channel decays: ``replayssm.ops.delta_rule.history_channel``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import TritonDeltaRuleBase
from replayssm.ops.kda.literal import KDAMath
from replayssm.ops.triton.rounding import load_state


@triton.jit
def stream_tile(ckpt_ptr, sc_ptr, d_rec_ptr, base, rows, hist, vb, h, offs_k, mk,
                HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, SCALED: tl.constexpr):
    """A two-launch stream's tile ``vb`` of value rows: its indices and masks, the checkpoint tile
    ``s0 [BV, BK]`` (fp32) and the committed d records at record ``rows`` ``[JB, BV]`` (zero past
    the history: ``hist`` false)."""
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    ms = mv[:, None] & mk[None, :]
    tile = offs_v[:, None] * K + offs_k[None, :]
    s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
    Dh = tl.load(d_rec_ptr + (rows[:, None] * HV + h) * V + offs_v[None, :], mask=hist[:, None] & mv[None, :],
                 other=0.0).to(tl.float32)
    return offs_v, mv, ms, tile, s0, Dh


@triton.jit
def fold_weighted(s, d_rec_ptr, wf_ptr, slot, origin, w, h, offs_v, mv, offs_k,
                  HV: tl.constexpr, V: tl.constexpr, RING: tl.constexpr, BK: tl.constexpr, JB: tl.constexpr,
                  FU: tl.constexpr):
    """``s + sum_{j < w} d_j WF_j^T`` with the pre-pass's weighted keys ``WF [JB, BK]`` at ``wf_ptr``
    and the d records at rows ``(origin + j) mod RING``: rank-1 updates, FU records per trip (their
    loads independent: one memory round trip per FU records).  The update sits in a ``where``: one FMA per
    element without it made the speculative stream slower on an H200 at batch 512 (non-flush and flush
    verifies alike), though the standard pair's flush was faster (unrecorded)."""
    for jq in range(0, (w + FU - 1) // FU):
        for ju in tl.static_range(FU):
            jj = jq * FU + ju
            live = jj < w
            dj = tl.load(d_rec_ptr + ((slot * RING + (origin + jj) % RING) * HV + h) * V + offs_v,
                         mask=mv & ((offs_v * 0 + jj) < w), other=0.0).to(tl.float32)
            wf = tl.load(wf_ptr + tl.minimum(jj, JB - 1) * BK + offs_k, mask=(offs_k * 0 + jj) < w, other=0.0)
            s += tl.where(live, dj[:, None] * wf[None, :], 0.0)
    return s


class TritonKDABase(TritonDeltaRuleBase):
    """Common part of the KDA Triton kernels (not registered itself): the delta-rule kernels' storage and
    cursors with KDA's per-channel gate parameters ``A_log [HV]``, ``dt_bias [HV, K]``
    (their shapes are checked by ``KernelConfig`` against the geometry's ``param_shapes``).  They
    compute the softplus gate law only (``replayssm.ops.delta_rule.triton_base.gates``): a config whose
    conventions carry the bounded law (``gate_lower_bound``, replayssm/conventions.py) is refused before any work."""

    family = "kda"
    PER_CHANNEL_GATE = True

    def __init__(self, config) -> None:
        lb = config.conventions.gate_lower_bound
        if lb is not None:
            raise ValueError(f"conventions: kernel {self.name!r} computes the gate -exp(A_log) softplus(a + dt_bias) "
                             f"only, not the bounded law gate_lower_bound={lb!r} (lb * sigmoid(exp(A_log) "
                             f"(a + dt_bias)))")
        super().__init__(config)


def fold_fp64(s0: torch.Tensor, hist: dict[str, torch.Tensor]) -> torch.Tensor:
    """The state after folding records ``hist`` (d, k, g) into ``s0``, in fp64 (the literal model's fold)."""
    return KDAMath().fold(s0, {k: v.to(torch.float64) for k, v in hist.items()}, None, None)


__all__ = ["TritonKDABase", "fold_fp64", "fold_weighted", "stream_tile"]
