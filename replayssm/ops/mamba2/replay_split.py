"""ReplaySSM Mamba-2 decode in two launches: a coefficient pre-pass and a lean checkpoint stream.

Oracle: the literal model ``literal-replay`` (output_only route) and, through it, the fp64
recurrence (docs/recurrences.md).  Expected error against fp64: the literal model's at the
same precision mode within a small factor (fp32 summation order); tests/ops/mamba2/test_mamba2_triton.py.

Why two launches (docs/benchmarks.md, H200): the single-kernel replay program spends three
dependent memory round trips (slot -> cursor -> ring records -> cumsum / decays / B·C) and ~80-180
registers on per-(row, head) scalars before it streams its first checkpoint byte, so fewer
programs are resident and each holds its registers longer than the bytes it moves need.  Here:

1. ``_coef_kernel``, one program per (batch row, group), all heads of the group at once
   (``[heads, positions]`` tiles): reads the cursors, the window's Δ (softplus) and the ring's
   Δ and B, and writes per (row, head) the readout coefficients
   ``M[s, j] = Δ_j exp(A (c_s - c_j)) (B_j · C_s)`` for every logical position j <= s, the window
   decays ``exp(A c_s)``, the fold weights of a flush, and the row's cursor snapshot
   (``write_pos, origin, flush, counter``); it appends the window's B and Δ records and, for the
   fused standard step, advances the cursor (last program of the slot, atomic ticket).
2. ``_stream_kernel``, one program per (batch row, head, headdim split): loads its checkpoint
   rows, the x records and the coefficients -- all addressed from program ids and the cursor
   snapshot, one round trip -- and writes ``y_s = exp(A c_s) (S0 · C_s) + Σ_j M[s, j] x_j + D x_s``
   (z gate), appends the x records, and on a flush folds the buffer into the checkpoint (rank-1
   updates with the pre-pass's weights) and stores it (nearest or Philox stochastic rounding, fp8
   rows with fp32 scales).

Scratch per launch: fp32 coefficients ``[R, H, NCOEF]`` and int32 snapshots ``[R, 4]`` (under 2 %
of a step's checkpoint bytes at T' = 4, 0.3 % at T' = 1); they are written and read in the same
step, so a CUDA graph of a step stays valid.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.triton.math import softplus
from replayssm.ops.triton.pdl import cursors_after_prepass, launch_kwargs, release_next, wait_previous
from replayssm.ops.triton.rounding import STREAM_FLUSH, cast_nearest, store_state
from replayssm.ops.triton.split_dot import parts, split_dot


def coef_layout(jb: int, tp: int) -> dict[str, int]:
    """Offsets of one (row, head)'s coefficients: M [TP, JB], decays [TP], fold weights [JB], fold decay."""
    off = {"M": 0, "DEC": tp * jb, "WF": tp * jb + tp, "DECF": tp * jb + tp + jb}
    off["NCOEF"] = (off["DECF"] + 1 + 3) // 4 * 4
    return off


@triton.jit
def _coef_kernel(
        slot_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, bias_ptr, rB_ptr, rdt_ptr, wp_ptr, org_ptr, cnt_ptr, arr_ptr,
        coef_ptr, meta_ptr,
        H: tl.constexpr, N: tl.constexpr, G: tl.constexpr, T: tl.constexpr, RING: tl.constexpr,
        LSPEC: tl.constexpr, SPEC: tl.constexpr, ADVANCE: tl.constexpr, SR: tl.constexpr,
        BN: tl.constexpr, JB: tl.constexpr, HGP: tl.constexpr,
        OFF_DEC: tl.constexpr, OFF_WF: tl.constexpr, OFF_DECF: tl.constexpr, NCOEF: tl.constexpr,
        PDL: tl.constexpr):
    g = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    wait_previous(PDL)  # its inputs may come from the launch just before it
    release_next(PDL)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    HG: tl.constexpr = H // G
    wp = tl.load(wp_ptr + slot)
    if SPEC:
        org = tl.load(org_ptr + slot)
        flush = wp + 2 * T > LSPEC
    else:
        org = wp * 0
        flush = wp == LSPEC - 1
    if SR:
        ctr = tl.load(cnt_ptr + slot)
    else:
        ctr = wp * 0
    j = tl.arange(0, JB)  # logical buffer position
    hist = j < wp
    win = (j >= wp) & (j < wp + T)
    tj = j - wp
    row = (org + j) % RING
    n = tl.arange(0, BN)
    nm = n < N
    # the group's heads, [heads, positions]: Δ and its cumsum c
    Bh = tl.load(rB_ptr + ((slot * RING + row) * G + g)[:, None] * N + n[None, :], mask=hist[:, None] & nm[None, :],
                 other=0.0)
    Bw = tl.load(B_ptr + ((r * T + tj) * G + g)[:, None] * N + n[None, :], mask=win[:, None] & nm[None, :],
                 other=0.0)
    Bj = tl.where(hist[:, None], Bh.to(tl.float32), Bw.to(tl.float32))  # [JB, BN]
    hh = tl.arange(0, HGP)
    hm = hh < HG
    head = g * HG + hh
    A = tl.load(A_ptr + head, mask=hm, other=0.0)
    bias = tl.load(bias_ptr + head, mask=hm, other=0.0)
    d_hist = tl.load(rdt_ptr + (slot * RING + row)[None, :] * H + head[:, None], mask=hm[:, None] & hist[None, :],
                     other=0.0)
    u = tl.load(dt_ptr + (r * T + tj)[None, :] * H + head[:, None], mask=hm[:, None] & win[None, :],
                other=0.0).to(tl.float32) + bias[:, None]
    d_win = softplus(u)
    delta = tl.where(hist[None, :], d_hist, tl.where(win[None, :], d_win, 0.0))  # [HGP, JB]
    c = tl.cumsum(delta, axis=1)
    base = (r * H + head) * NCOEF  # [HGP]
    mrow = hm[:, None] & (j[None, :] >= 0)
    if SPEC:
        rec = (wp * 0 + 1) != 0
    else:
        rec = wp < LSPEC - 1  # no record on a standard flush
    # per window position s, [heads, positions] tiles only (3-D [heads, s, positions] tiles cost more in
    # layout conversions than the arithmetic, docs/benchmarks.md)
    for s in tl.static_range(T):
        ps = wp + s
        cs = tl.load(C_ptr + ((r * T + s) * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
        bc_s = tl.sum(Bj * cs[None, :], axis=1)  # [JB]: B_j · C_s
        c_s = tl.sum(tl.where((j == ps)[None, :], c, 0.0), axis=1)  # [HGP]
        W_s = tl.where((j <= ps)[None, :], delta * tl.exp(A[:, None] * (c_s[:, None] - c)), 0.0)
        tl.store(coef_ptr + base[:, None] + s * JB + j[None, :], W_s * bc_s[None, :], mask=mrow)
        tl.store(coef_ptr + base + OFF_DEC + s, tl.exp(A * c_s), mask=hm)
        row_s = (org + ps) % RING
        B_s = tl.load(B_ptr + ((r * T + s) * G + g) * N + n, mask=nm, other=0.0)
        tl.store(rB_ptr + ((slot * RING + row_s) * G + g) * N + n, B_s, mask=nm & ((n * 0 + rec.to(tl.int32)) != 0))
        tl.store(rdt_ptr + (slot * RING + row_s) * H + head, tl.sum(tl.where((j == ps)[None, :], delta, 0.0), axis=1),
                 mask=hm & ((hh * 0 + rec.to(tl.int32)) != 0))
    # fold weights of a flush: speculative, the committed history (the state before the window);
    # standard, the history and the current token
    if SPEC:
        last = wp - 1
        infold = hist
    else:
        last = wp
        infold = j <= wp
    c_end = tl.sum(tl.where((j == last)[None, :], c, 0.0), axis=1)  # [HGP]
    wf = tl.where(infold[None, :], delta * tl.exp(A[:, None] * (c_end[:, None] - c)), 0.0)
    tl.store(coef_ptr + base[:, None] + OFF_WF + j[None, :], wf, mask=mrow)
    tl.store(coef_ptr + base + OFF_DECF, tl.exp(A * c_end), mask=hm)

    # the row's cursor snapshot for the stream kernel (group 0)
    q = tl.arange(0, 4)
    snap = tl.where(q == 0, wp, tl.where(q == 1, org, tl.where(q == 2, flush.to(tl.int32), ctr)))
    tl.store(meta_ptr + r * 4 + q, snap, mask=(q * 0 + g) == 0)

    # fused commit(1) of standard decode: the slot's last pre-pass program advances its cursor
    # (every program of the slot has read it before taking its ticket)
    if ADVANCE:
        done = tl.atomic_add(arr_ptr + slot, 1)
        if done == G - 1:
            tl.store(arr_ptr + slot, 0)
            tl.store(wp_ptr + slot, tl.where(flush, 0, wp + 1))
            if SR:
                tl.store(cnt_ptr + slot, ctr + flush.to(tl.int32))


@triton.jit
def _stream_kernel(
        slot_ptr, x_ptr, B_ptr, C_ptr, z_ptr, D_ptr, out_ptr, ck_ptr, cks_ptr, rx_ptr, rB_ptr, coef_ptr, meta_ptr,
        seed,
        H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr, T: tl.constexpr, RING: tl.constexpr,
        LSPEC: tl.constexpr, SPEC: tl.constexpr, HAS_Z: tl.constexpr, STATE: tl.constexpr, ACT: tl.constexpr,
        SR: tl.constexpr, INTERP: tl.constexpr, FOLD_UNROLL: tl.constexpr,
        BP: tl.constexpr, BN: tl.constexpr, JB: tl.constexpr, NSPLIT: tl.constexpr,
        NCH: tl.constexpr, KC: tl.constexpr, DOT: tl.constexpr, RDOT: tl.constexpr, TPD: tl.constexpr,
        NSP: tl.constexpr, NCP: tl.constexpr,
        OFF_DEC: tl.constexpr,
        OFF_WF: tl.constexpr, OFF_DECF: tl.constexpr, NCOEF: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    h = pid // NSPLIT
    split = pid % NSPLIT
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    g = h // (H // G)
    SCALED: tl.constexpr = STATE.primitive_bitwidth == 8
    Dh = tl.load(D_ptr + h)
    cb = (r * H + h) * NCOEF
    j = tl.arange(0, JB)
    n = tl.arange(0, BN)
    nm = n < N
    # One chunk of state rows per program: its checkpoint tile's load goes out first (an earlier step's
    # stream wrote it), then the wait for the pre-pass's cursor snapshot and coefficients
    # (ops/triton/pdl.py).  Several: the wait and the snapshot first, once.
    EARLY: tl.constexpr = NCH == 1
    if not EARLY:
        wp, org, flush, ctr = cursors_after_prepass(meta_ptr, r, PDL)
    for ch in range(NCH):
        p = (split * NCH + ch) * BP + tl.arange(0, BP)
        pm = p < P
        m2 = pm[:, None] & nm[None, :]
        hp = (slot * H + h) * P + p
        if KC == 1:
            S0 = tl.load(ck_ptr + hp[:, None] * N + n[None, :], mask=m2, other=0.0).to(tl.float32)
            if SCALED:
                S0 = S0 * tl.load(cks_ptr + hp, mask=pm, other=1.0)[:, None]
        else:
            # [KC, BP, BNC] chunks of dstate: a readout sums the chunks inside each thread first and
            # reduces across lanes once per row (BNC / 4 lanes instead of BN / 4)
            kc = tl.arange(0, KC)
            nc = tl.arange(0, BN // KC)
            n3 = (kc * (BN // KC))[:, None, None] + nc[None, None, :]
            m3 = pm[None, :, None] & (n3 < N)
            S0 = tl.load(ck_ptr + hp[None, :, None] * N + n3, mask=m3, other=0.0).to(tl.float32)
            if SCALED:
                S0 = S0 * tl.load(cks_ptr + hp, mask=pm, other=1.0)[None, :, None]
            n2 = (kc * (BN // KC))[:, None] + nc[None, :]  # [KC, BNC]
        if EARLY:
            wp, org, flush, ctr = cursors_after_prepass(meta_ptr, r, PDL)
        hist = j < wp
        win = (j >= wp) & (j < wp + T)
        tj = j - wp
        row = (org + j) % RING
        if SPEC:
            keep = wp >= 0
        else:
            keep = wp < LSPEC - 1  # no record on a standard flush
        X_hist = tl.load(rx_ptr + ((slot * RING + row) * H + h)[:, None] * P + p[None, :],
                         mask=hist[:, None] & pm[None, :], other=0.0)
        X_win = tl.load(x_ptr + ((r * T + tj) * H + h)[:, None] * P + p[None, :],
                        mask=win[:, None] & pm[None, :], other=0.0)
        X = tl.where(hist[:, None], X_hist.to(tl.float32), X_win.to(tl.float32))  # [JB, BP]
        rec_m = pm & ((p * 0 + keep.to(tl.int32)) != 0)
        if RDOT:
            # every window position's S0 · C_s as one product (tf32 / tf32x3, or NSP > 0: NSP / NCP bf16
            # parts of S0 / C at fp32 accuracy, on tensor cores, TPD = 16 wide; ieee fp32 on the FMA units
            # with vector_readout, TPD = T' wide)
            sd = tl.arange(0, TPD)
            Ct = tl.load(C_ptr + ((r * T + sd) * G + g)[None, :] * N + n[:, None],
                         mask=nm[:, None] & (sd < T)[None, :], other=0.0).to(tl.float32)  # [BN, TPD]
            if NSP > 0:
                YT = split_dot(S0, Ct, NSP, NCP, INTERP)  # [BP, TPD]
            else:
                YT = tl.dot(S0, Ct, input_precision=DOT)
        for s in tl.static_range(T):
            if RDOT:
                s0c = tl.sum(tl.where((sd == s)[None, :], YT, 0.0), axis=1)
            elif KC == 1:
                cs = tl.load(C_ptr + ((r * T + s) * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
                s0c = tl.sum(S0 * cs[None, :], axis=1)
            else:
                cs2 = tl.load(C_ptr + ((r * T + s) * G + g) * N + n2, mask=n2 < N, other=0.0).to(tl.float32)
                s0c = tl.sum(tl.sum(S0 * cs2[:, None, :], axis=0), axis=1)
            m_s = tl.load(coef_ptr + cb + s * JB + j)
            dec_s = tl.load(coef_ptr + cb + OFF_DEC + s)
            xo = ((r * T + s) * H + h) * P + p
            x_raw = tl.load(x_ptr + xo, mask=pm, other=0.0)
            y = dec_s * s0c + tl.sum(m_s[:, None] * X, axis=0) + Dh * x_raw.to(tl.float32)
            if HAS_Z:
                zz = tl.load(z_ptr + xo, mask=pm, other=0.0).to(tl.float32)
                y = y * zz / (1.0 + tl.exp(-zz))
            tl.store(out_ptr + xo, cast_nearest(y, ACT, INTERP), mask=pm)
            tl.store(rx_ptr + ((slot * RING + (org + wp + s) % RING) * H + h) * P + p, x_raw, mask=rec_m)
        if flush:
            # S0 <- exp(A c_end) S0 + Σ_j w_j x_j B_jᵀ (the pre-pass's weights; zero past the fold),
            # rank-1 updates, FOLD_UNROLL positions' loads in flight together
            nfold = wp + (1 - SPEC)
            x_cur = tl.load(x_ptr + ((r * T) * H + h) * P + p, mask=pm, other=0.0).to(tl.float32)
            if KC == 1:
                b_cur = tl.load(B_ptr + ((r * T) * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
            else:
                b_cur = tl.load(B_ptr + ((r * T) * G + g) * N + n2, mask=n2 < N, other=0.0).to(tl.float32)
            S_new = tl.load(coef_ptr + cb + OFF_DECF) * S0
            for jq in range((nfold + FOLD_UNROLL - 1) // FOLD_UNROLL):
                for ju in tl.static_range(FOLD_UNROLL):
                    jj = tl.minimum(jq * FOLD_UNROLL + ju, JB - 1)
                    row_j = (org + jj) % RING
                    in_hist = jj < wp
                    w_j = tl.load(coef_ptr + cb + OFF_WF + jj)
                    w_j = tl.where(jq * FOLD_UNROLL + ju < nfold, w_j, 0.0)
                    xh = tl.load(rx_ptr + ((slot * RING + row_j) * H + h) * P + p, mask=pm, other=0.0)
                    x_j = tl.where(in_hist, xh.to(tl.float32), x_cur)
                    if KC == 1:
                        bh = tl.load(rB_ptr + ((slot * RING + row_j) * G + g) * N + n, mask=nm, other=0.0)
                        b_j = tl.where(in_hist, bh.to(tl.float32), b_cur)
                        S_new = S_new + (w_j * x_j)[:, None] * b_j[None, :]
                    else:
                        bh = tl.load(rB_ptr + ((slot * RING + row_j) * G + g) * N + n2, mask=n2 < N, other=0.0)
                        b_j = tl.where(in_hist, bh.to(tl.float32), b_cur)
                        S_new = S_new + (w_j * x_j)[None, :, None] * b_j[:, None, :]
            if KC != 1:
                S_new = tl.reshape(tl.permute(S_new, (1, 0, 2)), (BP, BN))
            elem = (h * P + p)[:, None] * N + n[None, :]
            store_state(ck_ptr + hp[:, None] * N + n[None, :], cks_ptr + hp, S_new, m2, pm, elem,
                        seed, slot, ctr, STREAM_FLUSH, SCALED, SR, INTERP)


def launch_split(kern, slot_ids, inputs, out, advance: bool, phases: str = "both") -> None:
    """One verify (``advance``: + commit(1), standard decode) of a ``_TritonReplay`` as pre-pass + stream
    (``phases``: "coef" or "stream" launch one of them alone, for timing)."""
    g, d = kern.geometry, kern.decode
    R = slot_ids.shape[0]
    coef, meta = kern.scratch(R)
    lay = kern.coef_layout
    split = kern.split_for(R)
    nch = triton.cdiv(kern.nchunks, split)
    common = dict(OFF_DEC=lay["DEC"], OFF_WF=lay["WF"], OFF_DECF=lay["DECF"], NCOEF=lay["NCOEF"])
    # PDL (the pdl option): the pre-pass waits first; the stream only behind its own pre-pass
    pdl = kern.pdl_active
    stream_pdl = pdl and phases == "both"
    with kern._device_ctx():
        if phases != "stream":
            _coef_kernel[(g.ngroups, R)](
                slot_ids, inputs["dt"], inputs["B"], inputs["C"], kern.A, kern.dt_bias, kern.records["B"],
                kern.records["dt"], kern.write_pos, kern.origin, kern.counter, kern.arrivals, coef, meta,
                H=g.nheads, N=g.dstate, G=g.ngroups, T=d.window, RING=d.ring_rows, LSPEC=d.lspec, SPEC=d.speculative,
                ADVANCE=advance, SR=kern.sr, BN=kern.block_n, JB=kern.jb,
                HGP=max(2, triton.next_power_of_2(g.nheads // g.ngroups)), num_warps=kern.coef_warps, PDL=pdl,
                **common, **launch_kwargs(pdl))
        if phases == "coef":
            return
        _stream_kernel[(g.nheads * split, R)](
            slot_ids, inputs["x"], inputs["B"], inputs["C"], kern._z(inputs), kern.D, out, kern.ckpt,
            kern.ckpt_scale, kern.records["x"], kern.records["B"], coef, meta, kern.seed,
            H=g.nheads, P=g.headdim, N=g.dstate, G=g.ngroups, T=d.window, RING=d.ring_rows, LSPEC=d.lspec,
            SPEC=d.speculative, HAS_Z=g.has_z, STATE=kern.state_kind, ACT=kern.act_kind, SR=kern.sr,
            INTERP=kern.interp, FOLD_UNROLL=kern.fold_unroll, BP=kern.block_p, BN=kern.block_n, JB=kern.jb,
            NSPLIT=split, NCH=nch, KC=kern.chunks_for(R), DOT=kern.mode.dot,
            RDOT=kern.mode.dot != "ieee" or kern.stream_dot or kern.split_readout,
            TPD=max(16, kern.tp_split) if kern.mode.dot != "ieee" or kern.split_readout else max(2, kern.tp_split),
            NSP=parts(kern.mode.state_dtype) if kern.split_readout else 0, NCP=parts(kern.mode.act_dtype),
            num_warps=kern.split_warps, PDL=stream_pdl, **common, **launch_kwargs(stream_pdl))


__all__ = ["coef_layout", "launch_split"]
