"""The Gated DeltaNet speculative verify's checkpoint stream with tensor-core readouts at fp32
accuracy, the key axis in chunks (``readout="split"``; the pre-pass is ``replay_split.py``'s).

Per program (row, value head, NVT blocks of BV value rows), for each chunk of BKT keys: the
checkpoint chunk ``S_0 [BV, BKT]`` is loaded once, every ``S_0 k_i`` and ``S_0 q_s`` of the window is
accumulated as one product with the pre-pass's window vectors (``split_dot``: bf16 parts of both,
fp32 accuracy, on tensor cores), and on a flush verify the chunk of
``S_h = DECF S_0 + sum_j WF[j] d_j k_j^T`` is folded and stored from the same registers; then the
window's solve and outputs (``triton_base.window_token``).  A chunk is all a program holds of the
state (the whole-tile form spills on sm_90a: 255 registers for 64 x 128 fp32, tools/sm90_static.py),
so each chunk's store is final -- except for a scaled (fp8) state, whose per-row scale needs the
whole row: there BKT = K.

Oracle: ``literal-replay`` and ``gdn_sequence`` in fp64.  Expected error: that of the ieee stream
(``replay_split.py``): the readouts are fp32-accurate (``replayssm/ops/triton/split_dot.py``), the
fold is the same fp32 rank-1 update.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.gdn.triton_base import fold_records, window_token
from replayssm.ops.triton.pdl import cursor_snapshot
from replayssm.ops.triton.rounding import STREAM_FLUSH, load_state, store_state
from replayssm.ops.triton.split_dot import split_dot


@triton.jit(do_not_specialize=["seed", "num_slots"])
def gdn_spec_tc_stream_kernel(slot_ptr, v_ptr, out_ptr, ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, coef_ptr, meta_ptr,
                              qk_ptr, seed, num_slots,
                              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                              RING: tl.constexpr, BK: tl.constexpr, BKT: tl.constexpr, BV: tl.constexpr,
                              JB: tl.constexpr, TP: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr,
                              INTERPRET: tl.constexpr, NSP: tl.constexpr, FU: tl.constexpr, NVT: tl.constexpr,
                              O_A: tl.constexpr, O_B: tl.constexpr, O_BETA: tl.constexpr, O_CK: tl.constexpr,
                              O_CQ: tl.constexpr, O_AW: tl.constexpr, O_MW: tl.constexpr, O_WF: tl.constexpr,
                              O_DECF: tl.constexpr, NCOEF: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    hk = h // (HV // H)
    w, org, flush, cnt = cursor_snapshot(meta_ptr, r)
    cb = (r * HV + h) * NCOEF
    base = (slot * HV + h) * V
    j = tl.arange(0, JB)
    hist = j < w
    rows = slot * RING + (org + j) % RING
    tp = tl.arange(0, TP)
    # rows of the window-vector operand: k_i at i, q_s at T' + s (16 wide: the tensor-core minimum)
    qk = tl.arange(0, 16)
    vec_row = tl.where(qk < T, 2 * qk, 2 * (qk - T) + 1)
    vec_ok = qk < 2 * T
    decf = tl.load(coef_ptr + cb + O_DECF)
    for vt in range(NVT):
        vb = tl.program_id(2) * NVT + vt
        offs_v = vb * BV + tl.arange(0, BV)
        mv = offs_v < V
        SQK = tl.zeros([BV, 16], dtype=tl.float32)
        for kt in range(BK // BKT):
            offs_k = kt * BKT + tl.arange(0, BKT)
            mk = offs_k < K
            ms = mv[:, None] & mk[None, :]
            tile = offs_v[:, None] * K + offs_k[None, :]
            s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
            QK = tl.load(qk_ptr + ((r * H + hk) * 2 * TP + vec_row)[:, None] * BK + offs_k[None, :],
                         mask=vec_ok[:, None], other=0.0)  # [16, BKT]
            SQK = SQK + split_dot(s0, tl.trans(QK), NSP, 3, INTERPRET)
            if flush:
                s = fold_records(decf * s0, w, org, slot, h, hk, offs_v, mv, offs_k, mk, d_rec_ptr, k_rec_ptr,
                                 coef_ptr + cb + O_WF, H, HV, K, V, RING, JB, FU, 1)
                store_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, s, ms, mv, h * V * K + tile, seed,
                            slot, cnt, STREAM_FLUSH, SCALED, SR, INTERPRET)
        Dh = tl.load(d_rec_ptr + (rows[:, None] * HV + h) * V + offs_v[None, :], mask=hist[:, None] & mv[None, :],
                     other=0.0).to(tl.float32)  # [JB, BV]
        Dw = tl.zeros([TP, BV], dtype=tl.float32)
        rec_m = mv & ((offs_v * 0 + (w >= 0).to(tl.int32)) != 0)
        for i in tl.static_range(T):
            sk = tl.sum(tl.where((qk == i)[None, :], SQK, 0.0), 1)
            sq = tl.sum(tl.where((qk == T + i)[None, :], SQK, 0.0), 1)
            d_i, Dw = window_token(i, sk, sq, Dh, Dw, r, h, slot, org, w, offs_v, mv, rec_m, j, tp, cb, v_ptr, out_ptr,
                                   d_rec_ptr, coef_ptr, HV, V, T, RING, JB, TP, INTERPRET, O_A, O_B, O_BETA, O_CK,
                                   O_CQ, O_AW, O_MW)


__all__ = ["gdn_spec_tc_stream_kernel"]
