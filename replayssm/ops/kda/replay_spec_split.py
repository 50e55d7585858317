"""ReplaySSM KDA speculative verify in two launches: a per-(row, value head) coefficient pre-pass
and a lean checkpoint stream (``options={"prepass": True}``; commit: the delta rule's device-side
cursor update, ``replayssm.ops.delta_rule.replay_spec.launch_replay_spec_commit``).

Oracle: ``literal-replay`` (family kda: its window solve) and the fp64 recurrence on the accepted
stream.  Expected error: within a small factor of the literal model's at the same precision mode
(fp32 reduction order differs from the single kernel's); tests/ops/kda/test_kda_triton.py.

Why: the single kernel (``replay_spec.py``) builds, in every (row, value head, block of value rows)
program, the history's decay-weighted keys ``KW_j = k_j * e^(G - G_j)`` (a ``[history, K]`` tile of
exponentials), their products with the 2 T' window vectors and the in-window decay tiles, all of it
independent of the value rows.  Here the pre-pass does that once per (row, value head) and the
stream program reads its checkpoint tile, the committed d records and the coefficients.

With ``Gw_i [K]`` the inclusive per-channel cumsum of the window's g, ``e^G [K]`` the history's
decay and the window token's ``beta_i``, normalised ``k_i`` and scaled ``q_i``:

    d_i = beta_i v_i - S_0 XK_i - sum_j CK[i, j] d_j - sum_{t<i} AW[i, t] d_t
    o_s = S_0 XQ_s + sum_j CQ[s, j] d_j + sum_{t<=s} MW[s, t] d_t

with ``XK_i = beta_i e^G * e^Gw_i * k_i``, ``CK[i, j] = beta_i KW_j . (e^Gw_i * k_i)``,
``XQ_s = e^G * e^Gw_s * q_s``, ``CQ[s, j] = KW_j . (e^Gw_s * q_s)``,
``AW[i, t] = beta_i sum_c k_i[c] e^(Gw_i[c] - Gw_t[c]) k_t[c]`` (t < i) and
``MW[s, t] = sum_c k_t[c] e^(Gw_s[c] - Gw_t[c]) q_s[c]`` (t <= s; every exponent <= 0).  A flush
verify stores the state before the window, ``S_0 Diag(DECF) + sum_j d_j WF_j^T`` with
``DECF = e^G`` and ``WF_j = KW_j`` (written by the pre-pass only on a flush).  Every window token's
records (d by the stream, normalised k and per-channel g by the pre-pass) go to ring rows
``(origin + write_pos + t) mod ring``, rejected drafts too.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.history_channel import history_row_back
from replayssm.ops.delta_rule.triton_base import gates, l2_normalise, select_row
from replayssm.ops.kda.triton_base import fold_weighted, stream_tile
from replayssm.ops.split_options import coef_offsets
from replayssm.ops.triton.pdl import cursor_snapshot
from replayssm.ops.triton.rounding import STREAM_FLUSH, cast_nearest, store_state


def spec_coef_layout(jb: int, tp: int, bk: int) -> dict[str, int]:
    """Offsets of one (row, value head)'s coefficients (``bk`` = next_pow2(K), ``tp`` = next_pow2(T'),
    ``jb`` = next_pow2(B) history rows)."""
    return coef_offsets((("XK", tp * bk), ("XQ", tp * bk), ("DECF", bk), ("CK", tp * jb), ("CQ", tp * jb),
                        ("AW", tp * tp), ("MW", tp * tp), ("BETA", tp), ("WF", jb * bk)))


@triton.jit
def _kda_spec_coef_kernel(slot_ptr, q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, k_rec_ptr, g_rec_ptr,
                          wpos_ptr, origin_ptr, isflush_ptr, pending_ptr, sr_ptr, coef_ptr, meta_ptr,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, T: tl.constexpr, RING: tl.constexpr,
                          SCALE: tl.constexpr, BK: tl.constexpr, JB: tl.constexpr, TP: tl.constexpr,
                          INTERPRET: tl.constexpr,
                          O_XK: tl.constexpr, O_XQ: tl.constexpr, O_DECF: tl.constexpr, O_CK: tl.constexpr,
                          O_CQ: tl.constexpr, O_AW: tl.constexpr, O_MW: tl.constexpr, O_BETA: tl.constexpr,
                          O_WF: tl.constexpr, NCOEF: tl.constexpr, HU: tl.constexpr = 4):
    h = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    hk = h // (HV // H)
    w = tl.load(wpos_ptr + slot)
    org = tl.load(origin_ptr + slot)
    flush = tl.load(isflush_ptr + slot) != 0
    cnt = tl.load(sr_ptr + slot)
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    # the window [TP, BK]: normalised k, scaled q, per-channel gates and their cumsum; beta [TP]
    tp = tl.arange(0, TP)
    mt = tp < T
    tok = r * T + tp
    mtk = mt[:, None] & mk[None, :]
    Kw = l2_normalise(tl.load(k_ptr + (tok[:, None] * H + hk) * K + offs_k[None, :], mask=mtk,
                              other=0.0).to(tl.float32), 1)
    Qw = l2_normalise(tl.load(q_ptr + (tok[:, None] * H + hk) * K + offs_k[None, :], mask=mtk,
                              other=0.0).to(tl.float32), 1) * SCALE
    aw = tl.load(a_ptr + (tok[:, None] * HV + h) * K + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    bw = tl.load(b_ptr + tok * HV + h, mask=mt, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mk, other=0.0)
    gw, betaw = gates(aw, bw, tl.load(A_log_ptr + h), dt_bias[None, :])
    gw = tl.where(mtk, gw, 0.0)
    Gw = tl.cumsum(gw, 0)
    cb = (r * HV + h) * NCOEF
    EK = tl.exp(Gw) * Kw  # [TP, BK]: e^Gw_i * k_i, zero past the window
    EQ = tl.exp(Gw) * Qw
    fl_k = (offs_k * 0 + flush.to(tl.int32)) != 0
    # the committed history from its last record back, one [K] row at a time (HU records per trip, their
    # loads independent): S = the log gates after record j (fp32, summed from the last record back),
    # KW_j = k_j e^S, and CK[:, j], CQ[:, j] its dot products with the T' window vectors; no [history, K]
    # tile (its cumsum and sums over both axes made the standard pre-pass L1-bound, docs/benchmarks.md)
    j = tl.arange(0, JB)
    tl.store(coef_ptr + cb + O_CK + tp[:, None] * JB + j[None, :], tl.zeros([TP, JB], dtype=tl.float32),
             mask=(j[None, :] + tp[:, None] * 0) >= w)
    tl.store(coef_ptr + cb + O_CQ + tp[:, None] * JB + j[None, :], tl.zeros([TP, JB], dtype=tl.float32),
             mask=(j[None, :] + tp[:, None] * 0) >= w)
    S = tl.zeros([BK], dtype=tl.float32)
    for jq in range(0, (w + HU - 1) // HU):
        for u in tl.static_range(HU):
            jj = jq * HU + u
            jr, live, gj, kw = history_row_back(k_rec_ptr, g_rec_ptr, slot, org, w, jj, S, h, hk, offs_k, mk, H, HV, K,
                                                RING, True)
            mlive = mt & ((tp * 0 + jj) < w)
            tl.store(coef_ptr + cb + O_CK + tp * JB + jr, betaw * tl.sum(EK * kw[None, :], 1), mask=mlive)
            tl.store(coef_ptr + cb + O_CQ + tp * JB + jr, tl.sum(EQ * kw[None, :], 1), mask=mlive)
            tl.store(coef_ptr + cb + O_WF + jr * BK + offs_k, kw, mask=fl_k & live)
            S += gj
    eG = tl.exp(S)
    for i in tl.static_range(T):
        sel = tp == i
        k_i = select_row(Kw, sel)
        q_i = select_row(Qw, sel)
        G_i = select_row(Gw, sel)
        beta_i = tl.sum(tl.where(sel, betaw, 0.0), 0)
        ek = tl.exp(G_i) * k_i
        eq = tl.exp(G_i) * q_i
        tl.store(coef_ptr + cb + O_XK + i * BK + offs_k, beta_i * eG * ek)
        tl.store(coef_ptr + cb + O_XQ + i * BK + offs_k, eG * eq)
        # in-window rows: e^(Gw_i - Gw_t) for t <= i (exponents <= 0), zero past i
        past = tp <= i
        kdec = tl.where(past[:, None] & mk[None, :], Kw * tl.exp(tl.where(past[:, None], G_i[None, :] - Gw, 0.0)),
                        0.0)
        tl.store(coef_ptr + cb + O_AW + i * TP + tp, tl.where(tp < i, beta_i * tl.sum(kdec * k_i[None, :], 1), 0.0))
        tl.store(coef_ptr + cb + O_MW + i * TP + tp, tl.sum(kdec * q_i[None, :], 1))
        tl.store(coef_ptr + cb + O_BETA + i, beta_i)
    # the window's records at logical positions write_pos + t (k by the first value head of its key head)
    srow = slot * RING + (org + w + tp) % RING
    tl.store(g_rec_ptr + (srow[:, None] * HV + h) * K + offs_k[None, :], gw, mask=mtk)
    tl.store(k_rec_ptr + (srow[:, None] * H + hk) * K + offs_k[None, :],
             cast_nearest(Kw, k_rec_ptr.dtype.element_ty, INTERPRET),
             mask=mtk & ((tok[:, None] * 0 + offs_k[None, :] * 0 + h % (HV // H)) == 0))
    tl.store(coef_ptr + cb + O_DECF + offs_k, eG, mask=fl_k)
    q4 = tl.arange(0, 4)
    snap = tl.where(q4 == 0, w.to(tl.int64), tl.where(q4 == 1, org.to(tl.int64),
                                                      tl.where(q4 == 2, flush.to(tl.int64), cnt)))
    tl.store(meta_ptr + r * 4 + q4, snap, mask=(q4 * 0 + h) == 0)
    tl.store(pending_ptr + slot, 1, mask=h == 0)


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _kda_spec_stream_kernel(slot_ptr, v_ptr, out_ptr, ckpt_ptr, sc_ptr, d_rec_ptr, coef_ptr, meta_ptr, seed,
                            num_slots,
                            HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                            RING: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, JB: tl.constexpr,
                            TP: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr,
                            FU: tl.constexpr, NVT: tl.constexpr,
                            O_XK: tl.constexpr, O_XQ: tl.constexpr, O_DECF: tl.constexpr, O_CK: tl.constexpr,
                            O_CQ: tl.constexpr, O_AW: tl.constexpr, O_MW: tl.constexpr, O_BETA: tl.constexpr,
                            O_WF: tl.constexpr, NCOEF: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    w, org, flush, cnt = cursor_snapshot(meta_ptr, r)
    cb = (r * HV + h) * NCOEF
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    j = tl.arange(0, JB)
    hist = j < w
    rows = slot * RING + (org + j) % RING
    tp = tl.arange(0, TP)
    base = (slot * HV + h) * V
    # NVT blocks of value rows per program, one after the other (the per-program work paid once per NVT tiles)
    for vt in range(NVT):
        offs_v, mv, ms, tile, s0, Dh = stream_tile(ckpt_ptr, sc_ptr, d_rec_ptr, base, rows, hist,
                                                   tl.program_id(2) * NVT + vt, h, offs_k, mk, HV, K, V, BV, SCALED)
        Dw = tl.zeros([TP, BV], dtype=tl.float32)
        for i in tl.static_range(T):
            tok = r * T + i
            sk = tl.sum(s0 * tl.load(coef_ptr + cb + O_XK + i * BK + offs_k)[None, :], 1)
            sq = tl.sum(s0 * tl.load(coef_ptr + cb + O_XQ + i * BK + offs_k)[None, :], 1)
            v_i = tl.load(v_ptr + (tok * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
            ck = tl.load(coef_ptr + cb + O_CK + i * JB + j)
            cq = tl.load(coef_ptr + cb + O_CQ + i * JB + j)
            aw = tl.load(coef_ptr + cb + O_AW + i * TP + tp)
            mw = tl.load(coef_ptr + cb + O_MW + i * TP + tp)
            d_i = (tl.load(coef_ptr + cb + O_BETA + i) * v_i - sk - tl.sum(Dh * ck[:, None], 0)
                   - tl.sum(Dw * aw[:, None], 0))
            Dw = tl.where((tp == i)[:, None], d_i[None, :], Dw)
            o_i = sq + tl.sum(Dh * cq[:, None], 0) + tl.sum(Dw * mw[:, None], 0)
            tl.store(out_ptr + (tok * HV + h) * V + offs_v, cast_nearest(o_i, out_ptr.dtype.element_ty, INTERPRET),
                     mask=mv)
            srow = slot * RING + (org + w + i) % RING
            tl.store(d_rec_ptr + (srow * HV + h) * V + offs_v, cast_nearest(d_i, d_rec_ptr.dtype.element_ty, INTERPRET),
                     mask=mv)
        if flush:
            s = fold_weighted(s0 * tl.load(coef_ptr + cb + O_DECF + offs_k)[None, :], d_rec_ptr, coef_ptr + cb + O_WF,
                              slot, org, w, h, offs_v, mv, offs_k, HV, V, RING, BK, JB, FU)
            store_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, s, ms, mv, h * V * K + tile, seed,
                        slot, cnt, STREAM_FLUSH, SCALED, SR, INTERPRET)


def launch_spec_split(kern, slot_ids, inputs, out, phases: str = "both") -> None:
    """One speculative verify of a TritonKDAReplay as pre-pass + stream (``phases``: "coef" or
    "stream" launch one of them alone, for timing)."""
    R = slot_ids.shape[0]
    dec = kern.decode
    coef, meta = kern.scratch(R)
    lay = kern.coef_layout
    offs = {f"O_{k}": v for k, v in lay.items() if k != "NCOEF"}
    common = dict(HV=kern.HV, K=kern.K, T=dec.window, RING=dec.ring_rows, BK=kern.BK, JB=kern.jb, TP=kern.tp,
                  INTERPRET=kern.interpret, NCOEF=lay["NCOEF"], **offs)
    if phases != "stream":
        _kda_spec_coef_kernel[(kern.HV, R)](
            slot_ids, inputs["q"], inputs["k"], inputs["a"], inputs["b"], kern.A_log, kern.dt_bias,
            kern.records["k"], kern.records["g"], kern.write_pos, kern.origin, kern.is_flush, kern.pending,
            kern.sr_count, coef, meta, H=kern.H, SCALE=kern.K ** -0.5, num_warps=kern.coef_warps, **common)
    if phases == "coef":
        return
    bv, nvb, nw = kern.split_shape(R)
    nvt = kern.split_tiles(R, nvb)
    _kda_spec_stream_kernel[(R, kern.HV, triton.cdiv(nvb, nvt))](
        slot_ids, inputs["v"], out, kern.states, kern.scales, kern.records["d"], coef, meta, kern.seed,
        kern.num_slots, V=kern.V, BV=bv, SCALED=kern.scaled, SR=kern.sr, FU=kern.fold_unroll, NVT=nvt,
        num_warps=nw, **common)


__all__ = ["launch_spec_split", "spec_coef_layout"]
