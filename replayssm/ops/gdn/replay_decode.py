"""ReplaySSM standard (autoregressive) decode for Gated DeltaNet, in Triton.

One program per (row, value head, block of value rows).  Spec 3: the buffer keeps, per token,
``d`` (the corrected value, activation dtype), the normalised ``k`` (activation dtype, per key
head) and ``g`` (fp32 log decay).  With ``w = write_pos`` buffered tokens and ``G_j`` the
inclusive cumsum of their ``g``, the state before the current token is
``S_prev = exp(G_w) S_0 + sum_j exp(G_w - G_j) d_j k_j^T``; the kernel never builds it on a
non-flush step (output-only route):

    S_prev k = exp(G_w) (S_0 k) + sum_j exp(G_w - G_j) (k_j . k) d_j     (same for q)
    d = beta (v - alpha S_prev k),   o = alpha S_prev q + (k . q) d

so a non-flush step reads the checkpoint once and writes only the new records.  At
``write_pos = L - 1`` (the flush) it folds the L - 1 records and the current token into the
checkpoint, ``S_0 <- alpha S_prev + d k^T``, and stores it (nearest or stochastic rounding, fp8
with per-row scales).  The cursor advances inside the kernel: the last of a slot's programs
(atomic ticket) writes ``write_pos <- 0 if flush else write_pos + 1``.

Oracle: the literal model ``literal-replay`` (same records, same rounding points) and
``gdn_sequence`` in fp64.  Expected error: within a small factor of the literal model's at the
same precision mode; fp32 reduction order differs (tests/ops/gdn/test_gdn_triton.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import (
    launch_decode,
    program_row,
    store_block,
    ticket,
    token_inputs,
    value_block,
)
from replayssm.ops.triton.rounding import cast_nearest, load_state


@triton.jit
def load_keys(k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_k, mk,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, RING: tl.constexpr):
    """Records at ring ``rows``: k [BH, BK] (kept in the record dtype: half the registers for bf16),
    the fold weights exp(G_w - G_j) [BH] and exp(G_w).  All ``mrow`` rows are loaded (no wait for the
    cursor: the loads go out beside the checkpoint's); rows past the history (``mj`` false) are
    zeroed with ``where`` (stale rows may hold anything, even non-finite values)."""
    srow = slot * RING + rows
    gj = tl.where(mj, tl.load(g_rec_ptr + srow * HV + h, mask=mrow, other=0.0), 0.0)
    Gt = tl.sum(gj, 0)
    wj = tl.where(mj, tl.exp(Gt - tl.cumsum(gj, 0)), 0.0)
    Kh = tl.load(k_rec_ptr + (srow[:, None] * H + hk) * K + offs_k[None, :], mask=mrow[:, None] & mk[None, :],
                 other=0.0)
    return tl.where(mj[:, None], Kh, tl.zeros_like(Kh)), wj, tl.exp(Gt)


@triton.jit
def load_values(d_rec_ptr, slot, rows, mrow, mj, h, offs_v, mv, HV: tl.constexpr, V: tl.constexpr,
                RING: tl.constexpr):
    """Records at ring ``rows``: d [BH, BV] (fp32), zero past the history (``mj`` false)."""
    srow = slot * RING + rows
    Dh = tl.load(d_rec_ptr + (srow[:, None] * HV + h) * V + offs_v[None, :],
                 mask=mrow[:, None] & mv[None, :], other=0.0).to(tl.float32)
    return tl.where(mj[:, None], Dh, 0.0)


@triton.jit
def load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_v, mv, offs_k, mk,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RING: tl.constexpr):
    """Records at ring ``rows``: d [BH, BV] (fp32; :func:`load_values`), k [BH, BK], the fold weights
    and exp(G_w) (:func:`load_keys`)."""
    Kh, wj, eG = load_keys(k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_k, mk, H, HV, K, RING)
    return load_values(d_rec_ptr, slot, rows, mrow, mj, h, offs_v, mv, HV, V, RING), Kh, wj, eG


@triton.jit
def history_weights(Kh, wj, x):
    """The coefficients ``wj_j (k_j . x)`` [BH] of the history's readout of ``x``."""
    return wj * tl.sum(Kh.to(tl.float32) * x[None, :], 1)


@triton.jit
def readout(s0, eG, Dh, Kh, wj, x):
    """S_prev x [BV] for S_prev = eG s0 + sum_j wj_j d_j k_j^T, without building S_prev."""
    return readout_weighted(s0, eG, Dh, history_weights(Kh, wj, x), x)


@triton.jit
def readout_weighted(s0, eG, Dh, c, x):
    """:func:`readout` with the history's coefficients ``c`` (:func:`history_weights`) given."""
    return eG * tl.sum(s0 * x[None, :], 1) + tl.sum(Dh * c[:, None], 0)


@triton.jit
def fold_history(s0, eG, wj, offs_j, w, d_rec_ptr, k_rec_ptr, slot, origin, h, hk, offs_v, mv, offs_k, mk,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RING: tl.constexpr,
                 CH: tl.constexpr):
    """S_prev = eG s0 + sum_{j < w} wj_j d_j k_j^T in fp32, one rank-1 update per record, CH records
    per loop trip (their loads are independent: one memory round trip per CH records)."""
    s = eG * s0
    for c in range(0, (w + CH - 1) // CH):
        for i in tl.static_range(CH):
            j = c * CH + i
            srow = slot * RING + ((origin + j) % RING)
            dj = tl.load(d_rec_ptr + (srow * HV + h) * V + offs_v, mask=mv & ((offs_v * 0 + j) < w),
                         other=0.0).to(tl.float32)
            kj = tl.load(k_rec_ptr + (srow * H + hk) * K + offs_k, mask=mk & ((offs_k * 0 + j) < w),
                         other=0.0).to(tl.float32)
            wt = tl.sum(tl.where(offs_j == j, wj, 0.0), 0)
            s += (wt * dj)[:, None] * kj[None, :]
    return s


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _replay_decode_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                          ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, wpos_ptr, pending_ptr, ticket_ptr,
                          sr_ptr, seed, num_slots,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                          SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr,
                          NPROG: tl.constexpr, NVT: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr,
                          INTERPRET: tl.constexpr):
    r, h, pv, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    # the current token
    qn, kn, g, beta = token_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, r, h, hk, offs_k, mk, H, HV, K,
                                   SCALE, False)
    alpha = tl.exp(g)
    kq = tl.sum(kn * qn, 0)
    # the buffered history's keys and fold weights, and its readout coefficients: once per program,
    # for its NVT blocks of value rows
    w = tl.load(wpos_ptr + slot)
    flush = w == L - 1
    offs_j = tl.arange(0, BL)
    mrow, mj = offs_j < L - 1, offs_j < w
    Kh, wj, eG = load_keys(k_rec_ptr, g_rec_ptr, slot, offs_j, mrow, mj, h, hk, offs_k, mk, H, HV, K, L)
    ck = history_weights(Kh, wj, kn)
    cq = history_weights(Kh, wj, qn)
    base = (slot * HV + h) * V
    cnt = tl.load(sr_ptr + slot)
    for vt in range(NVT):
        offs_v, mv, ms, tile = value_block(pv, vt, offs_k, mk, NVT, BV, V, K)
        s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
        Dh = load_values(d_rec_ptr, slot, offs_j, mrow, mj, h, offs_v, mv, HV, V, L)
        v = tl.load(v_ptr + (r * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        d = beta * (v - alpha * readout_weighted(s0, eG, Dh, ck, kn))
        o = alpha * readout_weighted(s0, eG, Dh, cq, qn) + kq * d
        tl.store(out_ptr + (r * HV + h) * V + offs_v, cast_nearest(o, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
        s = s0
        if flush:
            s = fold_history(s0, eG, wj, offs_j, w, d_rec_ptr, k_rec_ptr, slot, 0, h, hk, offs_v, mv, offs_k, mk,
                             H, HV, K, V, L, 4)
            s = alpha * s + d[:, None] * kn[None, :]
        store_block(flush, s, d, ckpt_ptr, sc_ptr, d_rec_ptr, base, tile, ms, offs_v, mv, slot, w, h, seed, cnt,
                    HV, V, K, L, SCALED, SR, INTERPRET)
    # the token's key and gate records (a non-flush step; once per slot and key head)
    keep = (offs_k * 0 + flush.to(tl.int32) + pv) == 0
    srow = slot * L + w
    tl.store(g_rec_ptr + srow * HV + h, g, mask=(pv == 0) & (w != L - 1))
    tl.store(k_rec_ptr + (srow * H + hk) * K + offs_k, cast_nearest(kn, k_rec_ptr.dtype.element_ty, INTERPRET),
             mask=mk & keep & ((offs_k * 0 + h % (HV // H)) == 0))
    tl.store(pending_ptr + slot, 1, mask=(h + pv) == 0)
    last = ticket(ticket_ptr, slot, HV * NPROG)
    tl.store(wpos_ptr + slot, tl.where(flush, 0, w + 1), mask=last)
    tl.store(sr_ptr + slot, cnt + flush.to(tl.int64), mask=last)


def launch_replay_decode(kern, slot_ids, inputs, out) -> None:
    """Launch one standard-decode step of ``kern`` (a TritonGDNReplay) for all rows (value blocks per
    program: ``kern.decode_tiles``)."""
    launch_decode(_replay_decode_kernel, kern, slot_ids, inputs, out, kern.decode_tiles)

__all__ = ["fold_history", "history_weights", "launch_replay_decode", "load_history", "load_keys", "load_values",
           "readout", "readout_weighted"]
