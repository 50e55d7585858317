"""The Gated DeltaNet Triton kernels' base (:class:`TritonGDNBase`: the delta-rule storage, cursors, checks and
inspection of ``replayssm.ops.delta_rule.triton_base`` with one gate per value head), their jitted history
fold and window-token helpers, and the fp64 fold of the records.

Oracle: the literal models of ``replayssm.ops.gdn.literal`` over ``replayssm.ops.gdn.naive`` (same snapshot
layout, same cursor rules of ``DecodeConfig``).  Expected error: none for the storage; ``fold_fp64`` folds in
fp64 through the literal model's own fold; the jitted helpers are fp32 (a few ulp).

Options, cursors and serving layouts: ``replayssm.ops.delta_rule.triton_base``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import TritonDeltaRuleBase, launch_shape
from replayssm.ops.gdn.literal import GDNMath
from replayssm.ops.triton.rounding import cast_nearest


@triton.jit
def fold_records(s, w, org, slot, h, hk, offs_v, mv, offs_k, mk, d_rec_ptr, k_rec_ptr, wf_ptr, H: tl.constexpr,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RING: tl.constexpr, JB: tl.constexpr,
                 FU: tl.constexpr, KC: tl.constexpr):
    """``s + sum_{j<w} WF[j] d_j k_j^T`` over a slot's committed records, for the value rows
    ``offs_v`` and the keys ``offs_k`` (``[BK]``, or ``[KC, BK / KC]`` chunks with ``s`` in
    ``[KC, BV, BK / KC]``): rank-1 updates, FU records per trip (their loads independent: one round
    trip per FU records); past the history the loads are zeros (stale rows may be non-finite)."""
    for jq in range(0, (w + FU - 1) // FU):
        for ju in tl.static_range(FU):
            jj = jq * FU + ju
            srow = slot * RING + (org + jj) % RING
            dj = tl.load(d_rec_ptr + (srow * HV + h) * V + offs_v, mask=mv & ((offs_v * 0 + jj) < w),
                         other=0.0).to(tl.float32)
            kj = tl.load(k_rec_ptr + (srow * H + hk) * K + offs_k, mask=mk & ((offs_k * 0 + jj) < w),
                         other=0.0).to(tl.float32)
            wt = tl.load(wf_ptr + tl.minimum(jj, JB - 1))
            if KC == 1:
                s += (wt * dj)[:, None] * kj[None, :]
            else:
                s += (wt * dj)[None, :, None] * kj[:, None, :]
    return s


@triton.jit
def window_token(i, sk, sq, Dh, Dw, r, h, slot, org, w, offs_v, mv, rec_m, j, tp, cb, v_ptr, out_ptr, d_rec_ptr,
                 coef_ptr, HV: tl.constexpr, V: tl.constexpr, T: tl.constexpr, RING: tl.constexpr, JB: tl.constexpr,
                 TP: tl.constexpr, INTERPRET: tl.constexpr, O_A: tl.constexpr, O_B: tl.constexpr,
                 O_BETA: tl.constexpr, O_CK: tl.constexpr, O_CQ: tl.constexpr, O_AW: tl.constexpr,
                 O_MW: tl.constexpr):
    """Window token i of a block of value rows from its checkpoint readouts ``sk = S_0 k_i``,
    ``sq = S_0 q_i`` [BV], the history's d records ``Dh`` [JB, BV] and the window's earlier d
    (``Dw`` [TP, BV]): its d (returned, with ``Dw`` updated), its output and its d record stored."""
    tok = r * T + i
    v_i = tl.load(v_ptr + (tok * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
    ck = tl.load(coef_ptr + cb + O_CK + i * JB + j)
    cq = tl.load(coef_ptr + cb + O_CQ + i * JB + j)
    aw = tl.load(coef_ptr + cb + O_AW + i * TP + tp)
    mw = tl.load(coef_ptr + cb + O_MW + i * TP + tp)
    r_i = tl.load(coef_ptr + cb + O_BETA + i) * v_i - tl.load(coef_ptr + cb + O_A + i) * sk \
        - tl.sum(Dh * ck[:, None], 0)
    d_i = r_i - tl.sum(Dw * aw[:, None], 0)
    Dw = tl.where((tp == i)[:, None], d_i[None, :], Dw)
    o_i = tl.load(coef_ptr + cb + O_B + i) * sq + tl.sum(Dh * cq[:, None], 0) + tl.sum(Dw * mw[:, None], 0)
    tl.store(out_ptr + (tok * HV + h) * V + offs_v, cast_nearest(o_i, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
    srow = slot * RING + (org + w + i) % RING
    tl.store(d_rec_ptr + (srow * HV + h) * V + offs_v, cast_nearest(d_i, d_rec_ptr.dtype.element_ty, INTERPRET),
             mask=rec_m)
    return d_i, Dw


class TritonGDNBase(TritonDeltaRuleBase):
    """Common part of the GDN Triton kernels (not registered itself)."""

    family = "gdn"


def fold_fp64(s0: torch.Tensor, hist: dict[str, torch.Tensor]) -> torch.Tensor:
    """The state after folding records ``hist`` (d, k, g) into ``s0``, in fp64 (docs/recurrences.md section 2)."""
    return GDNMath().fold(s0, {k: v.to(torch.float64) for k, v in hist.items()}, None, None)


__all__ = ["TritonGDNBase", "fold_fp64", "launch_shape"]
