"""ReplaySSM standard (autoregressive) decode of a delta-rule family, in Triton: one kernel for both gate widths
(the ``PER_CHANNEL_GATE`` constexpr, as flash-linear-attention's common fused recurrent kernel has ``IS_KDA``;
each branch is its family's instruction sequence, so a family's compiled kernel is what its own kernel was).

One program per (row, value head, NVT blocks of value rows).  Spec 3: the buffer keeps, per token, ``d`` (the
corrected value, activation dtype), the normalised ``k`` (activation dtype, per key head) and ``g`` (fp32 log
decay: one per value head, or one per key channel).  With ``w = write_pos`` buffered tokens the kernel never
builds the state before the current token on a non-flush step (output-only route), it reads it out
(``history_head.py``, ``history_channel.py``):

* one gate per value head (Gated DeltaNet): ``S_prev k = exp(G_w) (S_0 k) + sum_j exp(G_w - G_j) (k_j . k) d_j``
  (same for q), ``d = beta (v - alpha S_prev k)``, ``o = alpha S_prev q + (k . q) d``; the history's keys and
  fold weights and its readout coefficients once per program, for its NVT blocks of value rows;
* one gate per key channel (KDA): ``S_prev x = S_0 (e^G * x) + sum_j [(k_j * e^(G - G_j)) . x] d_j``,
  ``d = beta (v - S_prev (alpha * k))``, ``o = S_prev (alpha * q) + (k . q) d`` (``alpha = e^g`` a ``[K]``
  vector); each program first walks the history from its last record back, one ``[K]`` row at a time (``S``,
  the per-channel sum of the log gates after record j, in fp32: ``e^(G - G_j) = e^S``), and keeps the two readout
  vectors and the ``[history]`` coefficients in registers for its NVT value blocks (from 128 rows up a whole
  value head: the coefficients once per (row, value head), where the two-launch path writes them to memory in a
  pre-pass).

So a non-flush step reads the checkpoint once and writes only the new records.  At ``write_pos = L - 1`` (the
flush) it folds the L - 1 records and the current token into the checkpoint (``S_0 <- alpha S_prev + d k^T``,
per channel ``S_0 <- S_0 Diag(alpha e^G) + sum_j d_j (alpha k_j e^S)^T + d k^T``) and stores it (nearest or
stochastic rounding, fp8 with per-row scales).  The cursor advances inside the kernel: the last of a slot's
programs (atomic ticket) writes ``write_pos <- 0 if flush else write_pos + 1``.

Oracle: the family's literal model ``literal-replay`` (same records, same rounding points) and its fp64
recurrence.  Expected error: within a small factor of the literal model's at the same precision mode; fp32
reduction and summation orders differ (tests/ops/gdn/test_gdn_triton.py, tests/ops/kda/test_kda_triton.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule import history_channel as chan
from replayssm.ops.delta_rule import history_head as head
from replayssm.ops.delta_rule.triton_base import (
    launch_decode,
    program_row,
    store_block,
    ticket,
    token_inputs,
    value_block,
)
from replayssm.ops.triton.rounding import cast_nearest, load_state


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _replay_decode_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                          ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, wpos_ptr, pending_ptr, ticket_ptr,
                          sr_ptr, seed, num_slots,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                          SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr,
                          NPROG: tl.constexpr, NVT: tl.constexpr, HU: tl.constexpr, SCALED: tl.constexpr,
                          SR: tl.constexpr, INTERPRET: tl.constexpr, PER_CHANNEL_GATE: tl.constexpr):
    r, h, pv, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    # the current token
    qn, kn, g, beta = token_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, r, h, hk, offs_k, mk, H, HV, K,
                                   SCALE, PER_CHANNEL_GATE)
    if PER_CHANNEL_GATE:
        g = tl.where(mk, g, 0.0)
    alpha = tl.exp(g)
    if PER_CHANNEL_GATE:
        ak = alpha * kn
        aq = alpha * qn
    else:
        kq = tl.sum(kn * qn, 0)
    w = tl.load(wpos_ptr + slot)
    flush = w == L - 1
    if PER_CHANNEL_GATE:
        # the history from its last record back: S = the log gates after record j, KW_j = k_j e^S
        jv = tl.arange(0, BL)
        ck, cq, S = chan.history_coefficients(k_rec_ptr, g_rec_ptr, slot, w, h, hk, offs_k, mk, ak, aq, d_rec_ptr,
                                              mk, alpha, H, HV, K, L, BK, BL, HU, False)
        eG = tl.exp(S)
        xk = eG * ak  # S_prev (alpha k) = S_0 xk + sum_j ck_j d_j
        xq = eG * aq
        kq = tl.sum(kn * qn, 0)
        hist = jv < w
    else:
        # the buffered history's keys and fold weights, and its readout coefficients: once per program,
        # for its NVT blocks of value rows
        offs_j = tl.arange(0, BL)
        mrow, mj = offs_j < L - 1, offs_j < w
        Kh, wj, eG = head.load_keys(k_rec_ptr, g_rec_ptr, slot, offs_j, mrow, mj, h, hk, offs_k, mk, H, HV, K, L)
        ck = head.history_weights(Kh, wj, kn)
        cq = head.history_weights(Kh, wj, qn)
    base = (slot * HV + h) * V
    cnt = tl.load(sr_ptr + slot)
    for vt in range(NVT):
        offs_v, mv, ms, tile = value_block(pv, vt, offs_k, mk, NVT, BV, V, K)
        s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
        if PER_CHANNEL_GATE:
            Dh = tl.load(d_rec_ptr + ((slot * L + jv[:, None]) * HV + h) * V + offs_v[None, :],
                         mask=hist[:, None] & mv[None, :], other=0.0).to(tl.float32)  # [BL, BV]
        else:
            Dh = head.load_values(d_rec_ptr, slot, offs_j, mrow, mj, h, offs_v, mv, HV, V, L)
        v = tl.load(v_ptr + (r * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        if PER_CHANNEL_GATE:
            d = beta * (v - tl.sum(s0 * xk[None, :], 1) - tl.sum(Dh * ck[:, None], 0))
            o = tl.sum(s0 * xq[None, :], 1) + tl.sum(Dh * cq[:, None], 0) + kq * d
        else:
            d = beta * (v - alpha * head.readout_weighted(s0, eG, Dh, ck, kn))
            o = alpha * head.readout_weighted(s0, eG, Dh, cq, qn) + kq * d
        tl.store(out_ptr + (r * HV + h) * V + offs_v, cast_nearest(o, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
        s = s0
        if flush:
            if PER_CHANNEL_GATE:
                s = s0 * (alpha * eG)[None, :]
                S2 = tl.zeros([BK], dtype=tl.float32)
                for jq in range(0, (w + HU - 1) // HU):
                    for u in tl.static_range(HU):
                        jj = jq * HU + u
                        jr, live, gj, kw = chan.history_row_back(k_rec_ptr, g_rec_ptr, slot, 0, w, jj, S2, h, hk,
                                                                 offs_k, mk, H, HV, K, L, False)
                        dj = tl.load(d_rec_ptr + ((slot * L + jr) * HV + h) * V + offs_v,
                                     mask=mv & ((offs_v * 0 + jj) < w), other=0.0).to(tl.float32)
                        s += dj[:, None] * (alpha * kw)[None, :]  # zeros past the history (never the stale rows)
                        S2 += gj
                s += d[:, None] * kn[None, :]
            else:
                s = head.fold_history(s0, eG, wj, offs_j, w, d_rec_ptr, k_rec_ptr, slot, 0, h, hk, offs_v, mv,
                                      offs_k, mk, H, HV, K, V, L, HU)
                s = alpha * s + d[:, None] * kn[None, :]
        store_block(flush, s, d, ckpt_ptr, sc_ptr, d_rec_ptr, base, tile, ms, offs_v, mv, slot, w, h, seed, cnt,
                    HV, V, K, L, SCALED, SR, INTERPRET)
    # the token's key and gate records (a non-flush step; once per slot and key head)
    if PER_CHANNEL_GATE:
        keep_k = mk & ((offs_k * 0 + flush.to(tl.int32)) == 0) & ((offs_k * 0 + pv) == 0)
        srow = slot * L + w
        tl.store(g_rec_ptr + (srow * HV + h) * K + offs_k, g, mask=keep_k)
        tl.store(k_rec_ptr + (srow * H + hk) * K + offs_k, cast_nearest(kn, k_rec_ptr.dtype.element_ty, INTERPRET),
                 mask=keep_k & ((offs_k * 0 + h % (HV // H)) == 0))
    else:
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
    """Launch one standard-decode step of ``kern`` (a delta-rule replay kernel; its ``PER_CHANNEL_GATE``) for all
    rows (value blocks per program: ``kern.decode_tiles``; four history records per fold trip)."""
    launch_decode(_replay_decode_kernel, kern, slot_ids, inputs, out, kern.decode_tiles, HU=4,
                  PER_CHANNEL_GATE=kern.PER_CHANNEL_GATE)


__all__ = ["launch_replay_decode"]
