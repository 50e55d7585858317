"""ReplaySSM Gated DeltaNet verify in two launches: a per-(row, key head) coefficient pre-pass and a
lean checkpoint stream, for standard decode (T' = 1, flush at write_pos = L - 1, cursor advanced on
the device) and speculative verify (the in-window WY/UT solve, docs/recurrences.md section 3).

Oracle: ``literal-replay`` and ``gdn_sequence`` in fp64.  Expected error: within a small factor of
the literal model's at the same precision mode (fp32 reduction order differs from the single-kernel
path's); tests/ops/gdn/test_gdn_triton.py.

Why (docs/benchmarks.md, H200): in the single-kernel path every (row, value head, block of value
rows) program re-reads its key head's k records and recomputes the history coefficients
``k_j . k`` and ``k_j . q`` -- as many bytes from L1/L2 as its own state tile -- and holds them in
registers beside the tile (127-255 registers).  Here the pre-pass computes everything that does not
touch the state once per (row, key head) for its value heads and writes it as per-(row, value head)
coefficients, and the window's normalised k and scaled q once per (row, key head) (fp32, the
kernel's ``window_vectors``: the stream renormalised them for every tile of value rows before;
measured faster on an H200); the stream program reads its checkpoint tile, the d records,
those vectors and the coefficients.

With ``S_h = exp(G) S_0 + sum_{j<w} w_j d_j k_j^T`` (the committed history), window tokens
``i = 0..T'-1`` with window-local gate sums ``Gw_i`` and gates ``beta_i``:

    R_i = beta_i v_i - a_i (S_0 k_i) - sum_j CK[i, j] d_j
    d_i = R_i - sum_{j<i} AW[i, j] d_j
    o_s = b_s (S_0 q_s) + sum_j CQ[s, j] d_j + sum_{j<=s} MW[s, j] d_j

with ``a_i = beta_i e^Gw_i e^G``, ``b_s = e^Gw_s e^G``, ``CK[i, j] = beta_i e^Gw_i w_j (k_j . k_i)``,
``CQ[s, j] = e^Gw_s w_j (k_j . q_s)``,
``AW[i, j] = beta_i e^(Gw_i - Gw_j) (k_i . k_j)`` (j < i), ``MW[s, j] = e^(Gw_s - Gw_j) (k_j . q_s)``
(j <= s).  Standard decode is T' = 1 (``e^Gw_0`` is the token's alpha).  A flush stores
``DECF S_0 + sum_j WF[j] d_j k_j^T`` (+ ``d_0 k_0^T`` in standard decode, which folds the token).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import gates, l2_normalise, ticket
from replayssm.ops.gdn.replay_split_tc import gdn_spec_tc_stream_kernel
from replayssm.ops.gdn.triton_base import fold_records, window_token
from replayssm.ops.split_options import coef_offsets
from replayssm.ops.triton.pdl import cursors_after_prepass, launch_kwargs, release_next, wait_previous
from replayssm.ops.triton.rounding import STREAM_FLUSH, cast_nearest, load_state, store_state
from replayssm.ops.triton.split_dot import parts, split_dot


def coef_layout(jb: int, tp: int) -> dict[str, int]:
    """Offsets of one (row, value head)'s coefficients."""
    return coef_offsets((("A", tp), ("B", tp), ("BETA", tp), ("CK", tp * jb), ("CQ", tp * jb), ("AW", tp * tp),
                        ("MW", tp * tp), ("WF", jb), ("DECF", 1)))


@triton.jit
def _gdn_coef_kernel(slot_ptr, q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, k_rec_ptr, g_rec_ptr,
                     wpos_ptr, origin_ptr, isflush_ptr, pending_ptr, ticket_ptr, sr_ptr, coef_ptr, meta_ptr, qk_ptr,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, T: tl.constexpr, RING: tl.constexpr,
                     SPEC: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr, JB: tl.constexpr,
                     TP: tl.constexpr, INTERPRET: tl.constexpr,
                     O_A: tl.constexpr, O_B: tl.constexpr, O_BETA: tl.constexpr, O_CK: tl.constexpr,
                     O_CQ: tl.constexpr, O_AW: tl.constexpr, O_MW: tl.constexpr, O_WF: tl.constexpr,
                     O_DECF: tl.constexpr, NCOEF: tl.constexpr, PDL: tl.constexpr):
    hk = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    wait_previous(PDL)  # its inputs may come from the launch just before it
    release_next(PDL)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    HVG: tl.constexpr = HV // H
    w = tl.load(wpos_ptr + slot)
    if SPEC:
        org = tl.load(origin_ptr + slot)
        flush = tl.load(isflush_ptr + slot) != 0
        keep = w >= 0
    else:
        org = w * 0
        flush = w == RING - 1
        keep = w < RING - 1  # no record on a standard flush
    cnt = tl.load(sr_ptr + slot)
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    j = tl.arange(0, JB)
    hist = j < w
    rows = slot * RING + (org + j) % RING
    Kh = tl.load(k_rec_ptr + (rows[:, None] * H + hk) * K + offs_k[None, :], mask=hist[:, None] & mk[None, :],
                 other=0.0).to(tl.float32)  # [JB, BK]
    tp = tl.arange(0, TP)
    mt = tp < T
    tok = r * T + tp
    keep_k = mk & ((offs_k * 0 + keep.to(tl.int32)) != 0)
    # token by token, vectors and scalars only (no [T', J, K] products: their layout conversions made
    # this kernel L1-bound, docs/benchmarks.md)
    for i in tl.static_range(T):
        tok_i = r * T + i
        q_i = l2_normalise(tl.load(q_ptr + (tok_i * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32),
                           0) * SCALE
        k_i = l2_normalise(tl.load(k_ptr + (tok_i * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32), 0)
        kk_i = tl.sum(Kh * k_i[None, :], 1)  # [JB]: k_j . k_i
        kq_i = tl.sum(Kh * q_i[None, :], 1)  # [JB]: k_j . q_i
        # the normalised window vectors for the stream (which would otherwise renormalise them per tile)
        qkb = ((r * H + hk) * 2 * TP + 2 * i) * BK
        tl.store(qk_ptr + qkb + offs_k, k_i)
        tl.store(qk_ptr + qkb + BK + offs_k, q_i)
        srow_i = slot * RING + (org + w + i) % RING
        tl.store(k_rec_ptr + (srow_i * H + hk) * K + offs_k, cast_nearest(k_i, k_rec_ptr.dtype.element_ty, INTERPRET),
                 mask=keep_k)
        for e in tl.static_range(HVG):
            vh = hk * HVG + e
            gh = tl.load(g_rec_ptr + rows * HV + vh, mask=hist, other=0.0)
            Gt = tl.sum(gh, 0)
            wj = tl.where(hist, tl.exp(Gt - tl.cumsum(gh, 0)), 0.0)
            eG = tl.exp(Gt)
            aw = tl.load(a_ptr + tok * HV + vh, mask=mt, other=0.0).to(tl.float32)
            bw = tl.load(b_ptr + tok * HV + vh, mask=mt, other=0.0).to(tl.float32)
            gw, betaw = gates(aw, bw, tl.load(A_log_ptr + vh), tl.load(dt_bias_ptr + vh))
            gw = tl.where(mt, gw, 0.0)
            Gw = tl.cumsum(gw, 0)
            G_i = tl.sum(tl.where(tp == i, Gw, 0.0), 0)
            beta_i = tl.sum(tl.where(tp == i, betaw, 0.0), 0)
            eGi = tl.exp(G_i)
            cb = (r * HV + vh) * NCOEF
            tl.store(coef_ptr + cb + O_A + i, beta_i * eGi * eG)
            tl.store(coef_ptr + cb + O_B + i, eGi * eG)
            tl.store(coef_ptr + cb + O_BETA + i, beta_i)
            tl.store(coef_ptr + cb + O_CK + i * JB + j, (beta_i * eGi) * wj * kk_i)
            tl.store(coef_ptr + cb + O_CQ + i * JB + j, eGi * wj * kq_i)
            # in-window rows: AW[i, t] = beta_i e^(G_i - G_t) (k_i . k_t), t < i; MW[i, t] = e^(G_i - G_t) (k_t . q_i)
            for t in tl.static_range(TP):
                if t < i:
                    k_t = l2_normalise(tl.load(k_ptr + ((r * T + t) * H + hk) * K + offs_k, mask=mk,
                                               other=0.0).to(tl.float32), 0)
                    e_it = tl.exp(G_i - tl.sum(tl.where(tp == t, Gw, 0.0), 0))
                    tl.store(coef_ptr + cb + O_AW + i * TP + t, beta_i * e_it * tl.sum(k_i * k_t, 0))
                    tl.store(coef_ptr + cb + O_MW + i * TP + t, e_it * tl.sum(k_t * q_i, 0))
                elif t == i:
                    tl.store(coef_ptr + cb + O_AW + i * TP + t, 0.0)
                    tl.store(coef_ptr + cb + O_MW + i * TP + t, tl.sum(k_i * q_i, 0))
                else:
                    tl.store(coef_ptr + cb + O_AW + i * TP + t, 0.0)
                    tl.store(coef_ptr + cb + O_MW + i * TP + t, 0.0)
            tl.store(g_rec_ptr + srow_i * HV + vh, tl.sum(tl.where(tp == i, gw, 0.0), 0), mask=keep)
            if i == 0:
                if SPEC:
                    fscale = eG * 0.0 + 1.0  # the state before the window: S_h itself
                else:
                    fscale = eGi  # alpha: S_0 <- alpha S_prev + d k^T
                tl.store(coef_ptr + cb + O_WF + j, fscale * wj)
                tl.store(coef_ptr + cb + O_DECF, fscale * eG)
    q4 = tl.arange(0, 4)
    snap = tl.where(q4 == 0, w.to(tl.int64), tl.where(q4 == 1, org.to(tl.int64),
                                                      tl.where(q4 == 2, flush.to(tl.int64), cnt)))
    tl.store(meta_ptr + r * 4 + q4, snap, mask=(q4 * 0 + hk) == 0)
    tl.store(pending_ptr + slot, 1, mask=hk == 0)
    if not SPEC:
        last = ticket(ticket_ptr, slot, H)
        tl.store(wpos_ptr + slot, tl.where(flush, 0, w + 1), mask=last)
        tl.store(sr_ptr + slot, cnt + flush.to(tl.int64), mask=last)


@triton.jit
def _rows_to_2d(s3, BV: tl.constexpr, BK: tl.constexpr):
    """[KC, BV, BK / KC] chunks -> the [BV, BK] tile (column = chunk * BK / KC + i)."""
    return tl.reshape(tl.permute(s3, (1, 0, 2)), (BV, BK))


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _gdn_stream_kernel(slot_ptr, v_ptr, out_ptr, ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, coef_ptr,
                       meta_ptr, qk_ptr, seed, num_slots,
                       H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                       RING: tl.constexpr, SPEC: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, JB: tl.constexpr, TP: tl.constexpr, SCALED: tl.constexpr,
                       SR: tl.constexpr, INTERPRET: tl.constexpr, KC: tl.constexpr, DOT: tl.constexpr,
                       RDOT: tl.constexpr, NSP: tl.constexpr, FU: tl.constexpr, NVT: tl.constexpr,
                       O_A: tl.constexpr, O_B: tl.constexpr, O_BETA: tl.constexpr, O_CK: tl.constexpr,
                       O_CQ: tl.constexpr, O_AW: tl.constexpr, O_MW: tl.constexpr, O_WF: tl.constexpr,
                       O_DECF: tl.constexpr, NCOEF: tl.constexpr, PDL: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    hk = h // (HV // H)
    cb = (r * HV + h) * NCOEF
    # One tile per program: its checkpoint tile's load goes out first (an earlier step's stream wrote it),
    # then the wait for the pre-pass's cursors and coefficients (ops/triton/pdl.py).  Several: the wait
    # and the cursors first, once (measured: the cursors re-read per tile slowed the whole-head programs).
    EARLY: tl.constexpr = NVT == 1
    if not EARLY:
        w, org, flush, cnt = cursors_after_prepass(meta_ptr, r, PDL)
    # NVT blocks of value rows per program, one after the other (the per-program work -- slot,
    # cursor snapshot, scheduling -- paid once per NVT tiles)
    for vt in range(NVT):
        vb = tl.program_id(2) * NVT + vt
        offs_v = vb * BV + tl.arange(0, BV)
        mv = offs_v < V
        base = (slot * HV + h) * V
        # key-dim index: [BK] (KC = 1) or [KC, BK / KC] chunks (a readout sums the chunks inside a thread
        # before it reduces across lanes)
        if KC == 1:
            offs_k = tl.arange(0, BK)
        else:
            offs_k = (tl.arange(0, KC) * (BK // KC))[:, None] + tl.arange(0, BK // KC)[None, :]
        mk = offs_k < K
        if KC == 1:
            ms = mv[:, None] & mk[None, :]
            tile = offs_v[:, None] * K + offs_k[None, :]
            s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
        else:
            ms3 = mv[None, :, None] & mk[:, None, :]
            s0 = tl.load(ckpt_ptr + base * K + offs_v[None, :, None] * K + offs_k[:, None, :], mask=ms3,
                         other=0.0).to(tl.float32)
            if SCALED:
                s0 = s0 * tl.load(sc_ptr + base + offs_v, mask=mv, other=1.0)[None, :, None]
        if EARLY:
            w, org, flush, cnt = cursors_after_prepass(meta_ptr, r, PDL)
        if SPEC:
            keep = w >= 0
        else:
            keep = w < RING - 1
        j = tl.arange(0, JB)
        hist = j < w
        rows = slot * RING + (org + j) % RING
        Dh = tl.load(d_rec_ptr + (rows[:, None] * HV + h) * V + offs_v[None, :], mask=hist[:, None] & mv[None, :],
                     other=0.0).to(tl.float32)  # [JB, BV]
        tp = tl.arange(0, TP)
        if RDOT:
            # every S_0 k_i and S_0 q_s as one product: rows i of QK are k_i, rows T' + s are q_s (tf32 /
            # tf32x3, or NSP > 0: bf16 parts of both at fp32 accuracy, on tensor cores, 16 wide; ieee on the
            # FMA units, 2 T' wide)
            NQK: tl.constexpr = 2 * TP if (2 * TP >= 16 or (DOT == "ieee" and NSP == 0)) else 16
            qk = tl.arange(0, NQK)
            QK = tl.zeros([NQK, BK], dtype=tl.float32)
            for i in tl.static_range(T):
                qkb = ((r * H + hk) * 2 * TP + 2 * i) * BK
                k_i = tl.load(qk_ptr + qkb + offs_k)
                q_i = tl.load(qk_ptr + qkb + BK + offs_k)
                QK = tl.where((qk == i)[:, None], k_i[None, :], QK)
                QK = tl.where((qk == T + i)[:, None], q_i[None, :], QK)
            if NSP > 0:
                SQK = split_dot(s0, tl.trans(QK), NSP, 3, INTERPRET)  # [BV, NQK]
            else:
                SQK = tl.dot(s0, tl.trans(QK), input_precision=DOT)
        Dw = tl.zeros([TP, BV], dtype=tl.float32)
        d_cur = tl.zeros([BV], dtype=tl.float32)
        k_cur = tl.zeros(offs_k.shape, dtype=tl.float32)
        rec_m = mv & ((offs_v * 0 + keep.to(tl.int32)) != 0)
        for i in tl.static_range(T):
            qkb = ((r * H + hk) * 2 * TP + 2 * i) * BK
            k_i = tl.load(qk_ptr + qkb + offs_k)  # normalised by the pre-pass ([BK] or [KC, BK / KC])
            q_i = tl.load(qk_ptr + qkb + BK + offs_k)
            if KC == 1:
                if RDOT:
                    sk = tl.sum(tl.where((qk == i)[None, :], SQK, 0.0), 1)
                    sq = tl.sum(tl.where((qk == T + i)[None, :], SQK, 0.0), 1)
                else:
                    sk = tl.sum(s0 * k_i[None, :], 1)
                    sq = tl.sum(s0 * q_i[None, :], 1)
            else:
                sk = tl.sum(tl.sum(s0 * k_i[:, None, :], 0), 1)
                sq = tl.sum(tl.sum(s0 * q_i[:, None, :], 0), 1)
            d_i, Dw = window_token(i, sk, sq, Dh, Dw, r, h, slot, org, w, offs_v, mv, rec_m, j, tp, cb, v_ptr, out_ptr,
                                   d_rec_ptr, coef_ptr, HV, V, T, RING, JB, TP, INTERPRET, O_A, O_B, O_BETA, O_CK,
                                   O_CQ, O_AW, O_MW)
            if i == 0:
                d_cur = d_i
                k_cur = k_i
        if flush:
            s = fold_records(tl.load(coef_ptr + cb + O_DECF) * s0, w, org, slot, h, hk, offs_v, mv, offs_k, mk,
                             d_rec_ptr, k_rec_ptr, coef_ptr + cb + O_WF, H, HV, K, V, RING, JB, FU, KC)
            if not SPEC:
                if KC == 1:
                    s += d_cur[:, None] * k_cur[None, :]
                else:
                    s += d_cur[None, :, None] * k_cur[:, None, :]
            if KC != 1:
                s = _rows_to_2d(s, BV, BK)
            k2 = tl.arange(0, BK)
            tile2 = offs_v[:, None] * K + k2[None, :]
            ms2 = mv[:, None] & (k2 < K)[None, :]
            store_state(ckpt_ptr + base * K + tile2, sc_ptr + base + offs_v, s, ms2, mv, h * V * K + tile2, seed,
                        slot, cnt, STREAM_FLUSH, SCALED, SR, INTERPRET)


def launch_split(kern, slot_ids, inputs, out, phases: str = "both") -> None:
    """One verify of a TritonGDNReplay as pre-pass + stream (standard decode: the cursor advances;
    ``phases``: "coef" or "stream" launch one of them alone, for timing)."""
    R = slot_ids.shape[0]
    dec = kern.decode
    coef, meta = kern.scratch(R)
    qk = kern.window_vectors(R)
    lay = kern.coef_layout
    offs = {f"O_{k}": v for k, v in lay.items() if k != "NCOEF"}
    bv, nvb, nw = kern.split_shape(R)
    rdot = kern.mode.dot != "ieee" or kern.readout in ("dot", "split")
    nsp = parts(kern.mode.state_dtype) if kern.readout == "split" else 0
    if (kern.mode.dot != "ieee" or nsp) and bv < 16:  # a tensor-core dot needs 16 rows
        bv, nvb = 16, triton.cdiv(kern.V, 16)
    common = dict(H=kern.H, HV=kern.HV, K=kern.K, T=dec.window, RING=dec.ring_rows, SPEC=dec.speculative,
                  SCALE=kern.K ** -0.5, BK=kern.BK, JB=kern.jb, TP=kern.tp, INTERPRET=kern.interpret,
                  NCOEF=lay["NCOEF"], **offs)
    # PDL (the pdl option): the pre-pass waits first; the stream only behind its own pre-pass
    pdl = kern.pdl_active
    if phases != "stream":
        _gdn_coef_kernel[(kern.H, R)](
            slot_ids, inputs["q"], inputs["k"], inputs["a"], inputs["b"], kern.A_log, kern.dt_bias,
            kern.records["k"], kern.records["g"], kern.write_pos, kern.origin, kern.is_flush, kern.pending,
            kern.ticket, kern.sr_count, coef, meta, qk, num_warps=kern.coef_warps, PDL=pdl, **common,
            **launch_kwargs(pdl))
    if phases == "coef":
        return
    nvt = kern.split_tiles(R, nvb)
    if nsp and dec.speculative:  # the tensor-core stream, the key axis in chunks (replay_split_tc.py)
        bkt = kern.BK if kern.scaled else min(kern.BK, kern.key_chunk)
        gdn_spec_tc_stream_kernel[(R, kern.HV, triton.cdiv(nvb, nvt))](
            slot_ids, inputs["v"], out, kern.states, kern.scales, kern.records["d"], kern.records["k"], coef, meta, qk,
            kern.seed, kern.num_slots, H=kern.H, HV=kern.HV, K=kern.K, V=kern.V, T=dec.window, RING=dec.ring_rows,
            BK=kern.BK, BKT=bkt, BV=bv, JB=kern.jb, TP=kern.tp, SCALED=kern.scaled, SR=kern.sr,
            INTERPRET=kern.interpret, NSP=nsp, FU=kern.fold_unroll, NVT=nvt, NCOEF=lay["NCOEF"], num_warps=nw, **offs)
        return
    _gdn_stream_kernel[(R, kern.HV, triton.cdiv(nvb, nvt))](
        slot_ids, inputs["v"], out, kern.states, kern.scales, kern.records["d"],
        kern.records["k"], coef, meta, qk, kern.seed, kern.num_slots, V=kern.V, BV=bv, SCALED=kern.scaled, SR=kern.sr,
        KC=kern.kchunks, DOT=kern.mode.dot, RDOT=rdot, NSP=nsp, FU=kern.fold_unroll, NVT=nvt, num_warps=nw,
        PDL=pdl and phases == "both", **common, **launch_kwargs(pdl and phases == "both"))


__all__ = ["coef_layout", "launch_split"]
