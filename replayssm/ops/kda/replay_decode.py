"""ReplaySSM standard (autoregressive) decode for KDA, in Triton, one kernel per step.

One program per (row, value head, NVT blocks of value rows).  Records per buffered token (the
literal model's layout): ``d`` (the corrected value, activation dtype), the normalised ``k``
(activation dtype, per key head) and ``g`` (fp32 per-channel log gate, per value head).  With
``w = write_pos`` buffered tokens, ``G_j`` the inclusive per-channel cumsum of their ``g`` and
``G = G_{w-1}``, the state before the current token is
``S_prev = S_0 Diag(e^G) + sum_j d_j (k_j * e^(G - G_j))^T``; a non-flush step never builds it
(output-only route):

    S_prev x = S_0 (e^G * x) + sum_j [(k_j * e^(G - G_j)) . x] d_j
    d = beta (v - S_prev (alpha * k)),   o = S_prev (alpha * q) + (k . q) d

(``alpha = e^g`` of the current token, a ``[K]`` vector), so a non-flush step reads the
checkpoint once and writes only the new records.  Each program first walks the history from its
last record back, one ``[K]`` row at a time (``S``, the per-channel sum of the log gates after
record j, in fp32 from the last record back: ``e^(G - G_j) = e^S``), and keeps the two readout
vectors and the ``[history]`` coefficients ``(k_j e^S) . (alpha k)``, ``(k_j e^S) . (alpha q)`` in
registers for its NVT value blocks (from 128 rows up a whole value head: the coefficients once
per (row, value head), where the two-launch path, ``replay_split.py``, writes them to memory in a
pre-pass).  At ``write_pos = L - 1`` (the flush) it folds the L - 1 records and the current token
into the checkpoint, ``S_0 <- S_0 Diag(alpha e^G) + sum_j d_j (alpha k_j e^S)^T + d k^T`` (the same
walk back over the records, per value block), and stores it (nearest or stochastic rounding, fp8
with per-row scales).  The cursor advances inside the kernel (the last program of the slot,
atomic ticket).

Oracle: the literal model ``literal-replay`` (family kda: same records, same rounding points) and
the fp64 recurrence.  Expected error: within a small factor of the literal model's at the same
precision mode; fp32 reduction and summation orders differ (tests/ops/kda/test_kda_triton.py).
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
from replayssm.ops.kda.triton_base import history_coefficients, history_row_back
from replayssm.ops.triton.rounding import cast_nearest, load_state


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _kda_replay_decode_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                              ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, wpos_ptr, pending_ptr, ticket_ptr,
                              sr_ptr, seed, num_slots,
                              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                              SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr,
                              NPROG: tl.constexpr, NVT: tl.constexpr, HU: tl.constexpr, SCALED: tl.constexpr,
                              SR: tl.constexpr, INTERPRET: tl.constexpr):
    r, h, pv, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    # the current token
    qn, kn, g, beta = token_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, r, h, hk, offs_k, mk, H, HV, K,
                                   SCALE, True)
    g = tl.where(mk, g, 0.0)
    alpha = tl.exp(g)
    ak = alpha * kn
    aq = alpha * qn
    w = tl.load(wpos_ptr + slot)
    flush = w == L - 1
    # the history from its last record back: S = the log gates after record j, KW_j = k_j e^S
    jv = tl.arange(0, BL)
    ck, cq, S = history_coefficients(k_rec_ptr, g_rec_ptr, slot, w, h, hk, offs_k, mk, ak, aq, d_rec_ptr, mk, alpha,
                                     H, HV, K, L, BK, BL, HU, False)
    eG = tl.exp(S)
    xk = eG * ak  # S_prev (alpha k) = S_0 xk + sum_j ck_j d_j
    xq = eG * aq
    kq = tl.sum(kn * qn, 0)
    hist = jv < w
    base = (slot * HV + h) * V
    cnt = tl.load(sr_ptr + slot)
    for vt in range(NVT):
        offs_v, mv, ms, tile = value_block(pv, vt, offs_k, mk, NVT, BV, V, K)
        s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
        Dh = tl.load(d_rec_ptr + ((slot * L + jv[:, None]) * HV + h) * V + offs_v[None, :],
                     mask=hist[:, None] & mv[None, :], other=0.0).to(tl.float32)  # [BL, BV]
        v = tl.load(v_ptr + (r * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        d = beta * (v - tl.sum(s0 * xk[None, :], 1) - tl.sum(Dh * ck[:, None], 0))
        o = tl.sum(s0 * xq[None, :], 1) + tl.sum(Dh * cq[:, None], 0) + kq * d
        tl.store(out_ptr + (r * HV + h) * V + offs_v, cast_nearest(o, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
        s = s0
        if flush:
            s = s0 * (alpha * eG)[None, :]
            S2 = tl.zeros([BK], dtype=tl.float32)
            for jq in range(0, (w + HU - 1) // HU):
                for u in tl.static_range(HU):
                    jj = jq * HU + u
                    jr, live, gj, kw = history_row_back(k_rec_ptr, g_rec_ptr, slot, 0, w, jj, S2, h, hk, offs_k, mk,
                                                        H, HV, K, L, False)
                    dj = tl.load(d_rec_ptr + ((slot * L + jr) * HV + h) * V + offs_v,
                                 mask=mv & ((offs_v * 0 + jj) < w), other=0.0).to(tl.float32)
                    s += dj[:, None] * (alpha * kw)[None, :]  # zeros past the history (never the stale rows)
                    S2 += gj
            s += d[:, None] * kn[None, :]
        store_block(flush, s, d, ckpt_ptr, sc_ptr, d_rec_ptr, base, tile, ms, offs_v, mv, slot, w, h, seed, cnt,
                    HV, V, K, L, SCALED, SR, INTERPRET)
    keep_k = mk & ((offs_k * 0 + flush.to(tl.int32)) == 0) & ((offs_k * 0 + pv) == 0)
    srow = slot * L + w
    tl.store(g_rec_ptr + (srow * HV + h) * K + offs_k, g, mask=keep_k)
    tl.store(k_rec_ptr + (srow * H + hk) * K + offs_k, cast_nearest(kn, k_rec_ptr.dtype.element_ty, INTERPRET),
             mask=keep_k & ((offs_k * 0 + h % (HV // H)) == 0))
    tl.store(pending_ptr + slot, 1, mask=(h + pv) == 0)
    last = ticket(ticket_ptr, slot, HV * NPROG)
    tl.store(wpos_ptr + slot, tl.where(flush, 0, w + 1), mask=last)
    tl.store(sr_ptr + slot, cnt + flush.to(tl.int64), mask=last)


def launch_replay_decode(kern, slot_ids, inputs, out) -> None:
    """Launch one standard-decode step of ``kern`` (a TritonKDAReplay) for all rows (value blocks
    per program: ``kern.split_tiles``, a whole value head from 128 rows up)."""
    launch_decode(_kda_replay_decode_kernel, kern, slot_ids, inputs, out, kern.split_tiles, HU=4)

__all__ = ["launch_replay_decode"]
