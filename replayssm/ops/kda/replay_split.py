"""ReplaySSM KDA standard decode in two launches: a per-(row, value head) coefficient pre-pass and
a lean checkpoint stream (T' = 1, flush at write_pos = L - 1, cursor advanced on the device; the
speculative verify's two launches: ``replay_spec_split.py``).

Oracle: ``literal-replay`` (family kda) and the fp64 recurrence.  Expected error: within a small
factor of the literal model's at the same precision mode (fp32 reduction order differs from the
single-kernel path's); tests/ops/kda/test_kda_triton.py.

Not the default in standard decode (``options={"prepass": True}``; always with the tf32 readouts):
the one-launch kernel (the delta rule's ``replay_decode.py``) walks the history once per program and keeps the
coefficients in registers over a whole value head, and measured faster at every batch size on an
H200 (``ops/kda/replay.py``, ``use_split``; docs/benchmarks.md, "KDA: replay against baseline").
Here the pre-pass does everything that does not touch the state once per (row, value head) (the
history walked back one ``[K]`` row at a time: ``history_coefficients``) and writes per-(row, value
head) coefficients; the stream program reads its checkpoint tile, the d records and those coefficients.

With ``KW_j = k_j * e^(G - G_j)`` (the decay-weighted history keys), the current token's
``alpha = e^g [K]``, ``beta``, normalised ``k`` and scaled ``q``:

    d = beta v - S_0 XK - sum_j CK[j] d_j,           XK = beta alpha e^G * k,  CK[j] = beta KW_j . (alpha * k)
    o = S_0 XQ + sum_j CQ[j] d_j + (k . q) d,        XQ = alpha e^G * q,       CQ[j] = KW_j . (alpha * q)

and a flush stores ``S_0 Diag(DECF) + sum_j d_j WF_j^T + d k^T`` with ``DECF = alpha e^G`` and
``WF_j = alpha * KW_j`` (written by the pre-pass only on a flush step).  With a tf32 / tf32x3 mode the
two checkpoint readouts ``S_0 XK`` and ``S_0 XQ`` are one tensor-core product (full fp32 under the
interpreter, docs/kernel_interface.md: the tf32 effect exists only on the GPU); the rest stays fp32 FMA.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.history_channel import history_coefficients
from replayssm.ops.delta_rule.triton_base import gates, l2_normalise, ticket
from replayssm.ops.kda.replay_spec_split import launch_spec_split
from replayssm.ops.kda.triton_base import fold_weighted, stream_tile
from replayssm.ops.split_options import coef_offsets
from replayssm.ops.triton.rounding import STREAM_FLUSH, cast_nearest, store_state


def coef_layout(jb: int, bk: int) -> dict[str, int]:
    """Offsets of one (row, value head)'s coefficients (vectors of ``bk`` = next_pow2(K) floats)."""
    return coef_offsets((("XK", bk), ("XQ", bk), ("DECF", bk), ("KN", bk), ("CK", jb), ("CQ", jb), ("WF", jb * bk),
                        ("BETA", 1), ("KQ", 1)))


@triton.jit
def _kda_coef_kernel(slot_ptr, q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, k_rec_ptr, g_rec_ptr,
                     wpos_ptr, pending_ptr, ticket_ptr, sr_ptr, coef_ptr, meta_ptr,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, L: tl.constexpr, SCALE: tl.constexpr,
                     BK: tl.constexpr, JB: tl.constexpr, INTERPRET: tl.constexpr,
                     O_XK: tl.constexpr, O_XQ: tl.constexpr, O_DECF: tl.constexpr, O_KN: tl.constexpr,
                     O_CK: tl.constexpr, O_CQ: tl.constexpr, O_WF: tl.constexpr, O_BETA: tl.constexpr,
                     O_KQ: tl.constexpr, NCOEF: tl.constexpr, HU: tl.constexpr = 4):
    h = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    hk = h // (HV // H)
    w = tl.load(wpos_ptr + slot)
    flush = w == L - 1
    keep = w < L - 1  # no record on a flush
    cnt = tl.load(sr_ptr + slot)
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    q = tl.load(q_ptr + (r * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (r * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + (r * HV + h) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    qn = l2_normalise(q, 0) * SCALE
    kn = l2_normalise(k, 0)
    g, beta = gates(a, tl.load(b_ptr + r * HV + h).to(tl.float32), tl.load(A_log_ptr + h),
                    tl.load(dt_bias_ptr + h * K + offs_k, mask=mk, other=0.0))
    g = tl.where(mk, g, 0.0)
    alpha = tl.exp(g)
    ak = alpha * kn
    aq = alpha * qn
    cb = (r * HV + h) * NCOEF
    fl_k = (offs_k * 0 + flush.to(tl.int32)) != 0
    jv = tl.arange(0, JB)
    ck, cq, S = history_coefficients(k_rec_ptr, g_rec_ptr, slot, w, h, hk, offs_k, mk, ak, aq, coef_ptr + cb + O_WF,
                                     fl_k, alpha, H, HV, K, L, BK, JB, HU, True)
    eG = tl.exp(S)
    tl.store(coef_ptr + cb + O_XK + offs_k, beta * alpha * eG * kn)
    tl.store(coef_ptr + cb + O_XQ + offs_k, alpha * eG * qn)
    tl.store(coef_ptr + cb + O_CK + jv, beta * ck)
    tl.store(coef_ptr + cb + O_CQ + jv, cq)
    tl.store(coef_ptr + cb + O_BETA, beta)
    tl.store(coef_ptr + cb + O_KQ, tl.sum(kn * qn, 0))
    tl.store(coef_ptr + cb + O_DECF + offs_k, alpha * eG, mask=fl_k)
    tl.store(coef_ptr + cb + O_KN + offs_k, kn, mask=fl_k)
    # the current token's records (k by the first value head of its key head)
    srow = slot * L + w
    keep_k = (offs_k * 0 + keep.to(tl.int32)) != 0
    tl.store(g_rec_ptr + (srow * HV + h) * K + offs_k, g, mask=mk & keep_k)
    tl.store(k_rec_ptr + (srow * H + hk) * K + offs_k, cast_nearest(kn, k_rec_ptr.dtype.element_ty, INTERPRET),
             mask=mk & keep_k & ((offs_k * 0 + h % (HV // H)) == 0))
    q4 = tl.arange(0, 4)
    snap = tl.where(q4 == 0, w.to(tl.int64), tl.where(q4 == 2, flush.to(tl.int64), tl.where(q4 == 3, cnt, 0)))
    tl.store(meta_ptr + r * 4 + q4, snap, mask=(q4 * 0 + h) == 0)
    tl.store(pending_ptr + slot, 1, mask=h == 0)
    last = ticket(ticket_ptr, slot, HV)
    tl.store(wpos_ptr + slot, tl.where(flush, 0, w + 1), mask=last)
    tl.store(sr_ptr + slot, cnt + flush.to(tl.int64), mask=last)


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _kda_stream_kernel(slot_ptr, v_ptr, out_ptr, ckpt_ptr, sc_ptr, d_rec_ptr, coef_ptr, meta_ptr, seed, num_slots,
                       HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, JB: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr,
                       INTERPRET: tl.constexpr, FU: tl.constexpr, NVT: tl.constexpr, DOT: tl.constexpr,
                       O_XK: tl.constexpr, O_XQ: tl.constexpr, O_DECF: tl.constexpr, O_KN: tl.constexpr,
                       O_CK: tl.constexpr, O_CQ: tl.constexpr, O_WF: tl.constexpr, O_BETA: tl.constexpr,
                       O_KQ: tl.constexpr, NCOEF: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    w = tl.load(meta_ptr + r * 4)
    flush = tl.load(meta_ptr + r * 4 + 2) != 0
    cnt = tl.load(meta_ptr + r * 4 + 3)
    keep = w < L - 1
    cb = (r * HV + h) * NCOEF
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    xk = tl.load(coef_ptr + cb + O_XK + offs_k)
    xq = tl.load(coef_ptr + cb + O_XQ + offs_k)
    if DOT != "ieee":
        # both readouts as one tensor-core product: rows 0 and 1 of XKQ are XK and XQ (16 rows: the dot's minimum)
        c16 = tl.arange(0, 16)
        XKQ = tl.where((c16 == 0)[:, None], xk[None, :], tl.where((c16 == 1)[:, None], xq[None, :], 0.0))
    j = tl.arange(0, JB)
    hist = j < w
    ck = tl.load(coef_ptr + cb + O_CK + j)
    cq = tl.load(coef_ptr + cb + O_CQ + j)
    beta = tl.load(coef_ptr + cb + O_BETA)
    kq = tl.load(coef_ptr + cb + O_KQ)
    rows = slot * L + j
    base = (slot * HV + h) * V
    # NVT blocks of value rows per program, one after the other (the per-program work paid once per NVT tiles)
    for vt in range(NVT):
        offs_v, mv, ms, tile, s0, Dh = stream_tile(ckpt_ptr, sc_ptr, d_rec_ptr, base, rows, hist,
                                                   tl.program_id(2) * NVT + vt, h, offs_k, mk, HV, K, V, BV, SCALED)
        v = tl.load(v_ptr + (r * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        if DOT != "ieee":
            SKQ = tl.dot(s0, tl.trans(XKQ), input_precision=DOT)  # [BV, 16]
            sk = tl.sum(tl.where((c16 == 0)[None, :], SKQ, 0.0), 1)
            sq = tl.sum(tl.where((c16 == 1)[None, :], SKQ, 0.0), 1)
        else:
            sk = tl.sum(s0 * xk[None, :], 1)
            sq = tl.sum(s0 * xq[None, :], 1)
        d = beta * v - sk - tl.sum(Dh * ck[:, None], 0)
        o = sq + tl.sum(Dh * cq[:, None], 0) + kq * d
        tl.store(out_ptr + (r * HV + h) * V + offs_v, cast_nearest(o, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
        srow = slot * L + w
        tl.store(d_rec_ptr + (srow * HV + h) * V + offs_v, cast_nearest(d, d_rec_ptr.dtype.element_ty, INTERPRET),
                 mask=mv & ((offs_v * 0 + keep.to(tl.int32)) != 0))
        if flush:
            s = fold_weighted(s0 * tl.load(coef_ptr + cb + O_DECF + offs_k)[None, :], d_rec_ptr, coef_ptr + cb + O_WF,
                              slot, 0, w, h, offs_v, mv, offs_k, HV, V, L, BK, JB, FU)
            s += d[:, None] * tl.load(coef_ptr + cb + O_KN + offs_k)[None, :]
            store_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, s, ms, mv, h * V * K + tile, seed,
                        slot, cnt, STREAM_FLUSH, SCALED, SR, INTERPRET)


def launch_split(kern, slot_ids, inputs, out, phases: str = "both") -> None:
    """One standard-decode step of a TritonKDAReplay as pre-pass + stream (the cursor advances;
    ``phases``: "coef" or "stream" launch one of them alone, for timing); a speculative verify goes
    to ``replay_spec_split.py``."""
    if kern.decode.speculative:
        launch_spec_split(kern, slot_ids, inputs, out, phases)
        return
    R = slot_ids.shape[0]
    L = kern.decode.buffer
    coef, meta = kern.scratch(R)
    lay = kern.coef_layout
    offs = {f"O_{k}": v for k, v in lay.items() if k != "NCOEF"}
    offs["NCOEF"] = lay["NCOEF"]
    if phases != "stream":
        _kda_coef_kernel[(kern.HV, R)](
            slot_ids, inputs["q"], inputs["k"], inputs["a"], inputs["b"], kern.A_log, kern.dt_bias,
            kern.records["k"], kern.records["g"], kern.write_pos, kern.pending, kern.ticket, kern.sr_count, coef,
            meta, H=kern.H, HV=kern.HV, K=kern.K, L=L, SCALE=kern.K ** -0.5, BK=kern.BK, JB=kern.jb,
            INTERPRET=kern.interpret, num_warps=kern.coef_warps, **offs)
    if phases == "coef":
        return
    bv, nvb, nw = kern.split_shape(R)
    if kern.mode.dot != "ieee" and bv < 16:  # a tensor-core dot needs 16 rows
        bv, nvb = 16, triton.cdiv(kern.V, 16)
    nvt = kern.split_tiles(R, nvb)
    _kda_stream_kernel[(R, kern.HV, triton.cdiv(nvb, nvt))](
        slot_ids, inputs["v"], out, kern.states, kern.scales, kern.records["d"], coef, meta, kern.seed,
        kern.num_slots, HV=kern.HV, K=kern.K, V=kern.V, L=L, BK=kern.BK, BV=bv, JB=kern.jb, SCALED=kern.scaled,
        SR=kern.sr, INTERPRET=kern.interpret, FU=kern.fold_unroll, NVT=nvt, DOT=kern.mode.dot, num_warps=nw, **offs)


__all__ = ["coef_layout", "launch_split"]
