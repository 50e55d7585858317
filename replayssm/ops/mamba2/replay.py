"""ReplaySSM Mamba-2 decode in Triton: standard decode (L = 1..32) and speculative verify/commit.

Oracle: the literal models of ``naive.py`` ("literal-replay", "literal-replay-state") and,
through them, the fp64 recurrence ``mamba2_sequence`` (docs/recurrences.md).  Expected error
against fp64: the literal model's error at the same precision mode, within a small factor (fp32
summation order, tree cumsum, the GPU's exp/log); tests/ops/mamba2/test_mamba2_triton.py measures the factor.

One kernel serves both decodes and both routes.  One program owns one (batch row, head) and
``NCH`` tiles of ``BP`` state rows (``split`` programs per head cover headdim).  It

1. reads the slot's cursors (``write_pos``, ``origin``) on the device;
2. gathers Δ (fp32 records, the window's softplus), B (records, window inputs) for logical
   positions ``j < write_pos + T'`` from the ring (``row = (origin + j) mod ring``) and the
   inputs, and forms ``c = cumsum(Δ)``, the window decays ``exp(A c_s)`` and the causal weights
   ``W[j, s] = Δ_j exp(A (c_s - c_j))`` once per program;
3. per tile: loads the checkpoint rows and the x records and writes, for every window
   position s,
   * output_only: ``y = exp(A c_s) (S0 C_s) + Σ_j W[j, s] (B_j · C_s) x_j + D x_s``
   * state_and_output: ``S_s = exp(A c_s) S0 + Σ_j W[j, s] x_j B_jᵀ`` (a dot), ``y = S_s C_s + D x_s``
   the readout dots ``S0 · C``, ``B · C``, ``S · C`` in the mode's dot precision (ieee: fp32
   multiply-reduce per window position, or with ``vector_readout`` one fp32 ``tl.dot``;
   tf32 / tf32x3: ``tl.dot`` with that ``input_precision``);
4. appends the window's records (x, B, Δ) at ring rows ``write_pos + s`` (not on a standard
   flush), and on a flush folds the buffer into the checkpoint in fp32 (standard: the L-1
   records and the current token; speculative: the committed history, the state before the
   window) -- rank-1 updates newest first with the decay as a running suffix sum of Δ (GPU), or
   one fp32 ``tl.dot`` (interpreter) -- and stores it in the state dtype (nearest or Philox
   stochastic rounding, fp8 rows with fp32 scales).

Performance (H200, docs/benchmarks.md): this single kernel runs the standard-decode replay step at
75 % of the copy bandwidth, bound by per-program serial work (cursor -> ring records ->
cumsum/decays -> B·C before the first state byte is used).  From 8 rows up in standard decode
(16 in the speculative verify) "triton-replay" therefore runs the output_only route as a
coefficient pre-pass + checkpoint stream (``replay_split.py``, 90-92 % of copy); this kernel stays
the path below that (one launch is faster there), the state_and_output route and ``prepass=False``.

A non-flush verify only reads the checkpoint.  Cursors move in :func:`_commit_kernel` (one tiny
launch, no host synchronisation), or, for standard decode, inside the step itself
(``launch_step``: the last program of a slot to finish, counted with an atomic, advances the
slot's cursor; verify + commit in one launch, CUDA-graph safe).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.interface import PAD_SLOT, KernelSnapshot, next_pow2
from replayssm.ops.committed import committed_rows_fp64
from replayssm.ops.mamba2.literal import ROUTES, Mamba2Math
from replayssm.ops.mamba2.replay_split import coef_layout, launch_split
from replayssm.ops.mamba2.triton_common import OPTIONS, TritonMamba2Base
from replayssm.ops.split_options import int_choice, prepass_option
from replayssm.ops.triton.pdl import pdl_active, pdl_option
from replayssm.ops.triton.rounding import INTERPRET, STREAM_FLUSH, STREAM_RESET, cast_nearest, store_state
from replayssm.registry import register
from replayssm.rounding import dequantize_state


@triton.jit
def _replay_kernel(
        slot_ptr, x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, A_ptr, bias_ptr, D_ptr, out_ptr,
        ck_ptr, cks_ptr, rx_ptr, rB_ptr, rdt_ptr, wp_ptr, org_ptr, cnt_ptr, arr_ptr, seed,
        H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
        T: tl.constexpr, RING: tl.constexpr, LSPEC: tl.constexpr, SPEC: tl.constexpr,
        STATE_ROUTE: tl.constexpr, ADVANCE: tl.constexpr, HAS_Z: tl.constexpr,
        STATE: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr, SR: tl.constexpr, INTERP: tl.constexpr,
        VEC: tl.constexpr, FOLD_DOT: tl.constexpr, FOLD_UNROLL: tl.constexpr, PREFETCH: tl.constexpr,
        BP: tl.constexpr, BN: tl.constexpr, JB: tl.constexpr, TP: tl.constexpr, NSPLIT: tl.constexpr,
        NCH: tl.constexpr):
    # Helpers are inlined on the per-tile path: under the interpreter every nested @triton.jit
    # call re-patches triton.language, which costs more than the arithmetic itself.
    pid = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    h = pid // NSPLIT
    split = pid % NSPLIT
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    g = h // (H // G)
    SCALED: tl.constexpr = STATE.primitive_bitwidth == 8
    LOOP: tl.constexpr = DOT == "ieee" and not VEC  # ieee sums as loops of fp32 multiply-reduce, not tl.dot
    NCB: tl.constexpr = BN if INTERP or BN <= 32 else 32
    n = tl.arange(0, BN)
    nm = n < N
    if PREFETCH:
        # The first checkpoint tile's address needs only the slot: issue its load before the
        # cursor-dependent work, and keep one tile in flight ahead of the one in use.
        p_nx = split * NCH * BP + tl.arange(0, BP)
        hp_nx = (slot * H + h) * P + p_nx
        S0_nx = tl.load(ck_ptr + hp_nx[:, None] * N + n[None, :], mask=(p_nx < P)[:, None] & nm[None, :],
                        other=0.0)
        if SCALED:
            sc_nx = tl.load(cks_ptr + hp_nx, mask=p_nx < P, other=1.0)
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
        ctr = 0
    A = tl.load(A_ptr + h)
    bias = tl.load(bias_ptr + h)
    Dh = tl.load(D_ptr + h)

    # ---- the window's per-(row, head) quantities, once per program ---------------------------------
    j = tl.arange(0, JB)  # logical buffer position
    hist = j < wp
    win = (j >= wp) & (j < wp + T)
    tj = j - wp
    row = (org + j) % RING
    d_hist = tl.load(rdt_ptr + (slot * RING + row) * H + h, mask=hist, other=0.0)
    u = tl.load(dt_ptr + (r * T + tj) * H + h, mask=win, other=0.0).to(tl.float32) + bias
    ev = tl.exp(tl.minimum(u, 20.0))  # softplus = log1p(exp(u)), log1p(v) = log(w) v / (w - 1), w = 1 + v
    ew = 1.0 + ev
    d_win = tl.where(u > 20.0, u, tl.where(ew == 1.0, ev, tl.log(ew) * (ev / (ew - 1.0))))
    delta = tl.where(hist, d_hist, tl.where(win, d_win, 0.0))
    c = tl.cumsum(delta, axis=0)
    if STATE_ROUTE:
        B_hist = tl.load(rB_ptr + ((slot * RING + row) * G + g)[:, None] * N + n[None, :],
                         mask=hist[:, None] & nm[None, :], other=0.0)
        B_win = tl.load(B_ptr + ((r * T + tj) * G + g)[:, None] * N + n[None, :],
                        mask=win[:, None] & nm[None, :], other=0.0)
        Bj = tl.where(hist[:, None], B_hist.to(tl.float32), B_win.to(tl.float32))  # [JB, BN]
    sidx = tl.arange(0, TP)  # window position
    sm = sidx < T
    pos = wp + sidx
    c_at = tl.sum(tl.where(j[:, None] == pos[None, :], c[:, None], 0.0), axis=0)  # [TP]
    dec = tl.exp(A * c_at)
    causal = (j[:, None] <= pos[None, :]) & sm[None, :]
    W = tl.where(causal, delta[:, None] * tl.exp(A * (c_at[None, :] - c[:, None])), 0.0)  # [JB, TP]
    Cmat = tl.load(C_ptr + ((r * T + sidx) * G + g)[None, :] * N + n[:, None],
                   mask=nm[:, None] & sm[None, :], other=0.0).to(tl.float32)  # [BN, TP]
    if not STATE_ROUTE:
        # B_j · C_s over slices of dstate (unrolled: all slices' loads in flight together; a
        # [JB, NCB] tile at a time keeps registers low)
        bc = tl.zeros((JB, TP), tl.float32)
        for nc in tl.static_range(BN // NCB):
            nn = nc * NCB + tl.arange(0, NCB)
            nnm = nn < N
            Bh = tl.load(rB_ptr + ((slot * RING + row) * G + g)[:, None] * N + nn[None, :],
                         mask=hist[:, None] & nnm[None, :], other=0.0)
            Bw = tl.load(B_ptr + ((r * T + tj) * G + g)[:, None] * N + nn[None, :],
                         mask=win[:, None] & nnm[None, :], other=0.0)
            Bc = tl.where(hist[:, None], Bh.to(tl.float32), Bw.to(tl.float32))
            Cc = tl.load(C_ptr + ((r * T + sidx) * G + g)[None, :] * N + nn[:, None],
                         mask=nnm[:, None] & sm[None, :], other=0.0).to(tl.float32)
            if LOOP:
                for s in tl.static_range(T):
                    sel = sidx == s
                    c_sl = tl.sum(tl.where(sel[None, :], Cc, 0.0), axis=1)
                    bc = tl.where(sel[None, :], bc + tl.sum(Bc * c_sl[None, :], axis=1)[:, None], bc)
            else:
                bc += tl.dot(Bc, Cc, input_precision=DOT)
        M = W * bc  # [JB, TP]: Δ_j exp(A (c_s - c_j)) (B_j · C_s)
    if SPEC:
        c_hist = tl.sum(tl.where(j == wp - 1, c, 0.0), axis=0)
        w_fold = tl.where(hist, delta * tl.exp(A * (c_hist - c)), 0.0)
        dec_fold = tl.exp(A * c_hist)
    else:
        w_fold = tl.sum(tl.where((sidx == 0)[None, :], W, 0.0), axis=1)
        dec_fold = tl.sum(tl.where(sidx == 0, dec, 0.0), axis=0)

    # ---- records of the window (B, Δ here; x per tile) ----------------------------------------------------
    # Masks are built from vector comparisons (the interpreter rejects scalar booleans in a mask).
    if SPEC:
        rec_v = sm
    else:
        rec_v = sm & ((sidx * 0 + wp) < LSPEC - 1)  # no record on a standard flush
    first_v = (sidx * 0 + split) == 0
    lead_v = first_v & (((sidx * 0 + h) % (H // G)) == 0)
    row_w = (org + pos) % RING
    wmask = sm[:, None] & nm[None, :]
    B_w = tl.load(B_ptr + ((r * T + sidx) * G + g)[:, None] * N + n[None, :], mask=wmask, other=0.0)
    tl.store(rB_ptr + ((slot * RING + row_w) * G + g)[:, None] * N + n[None, :], B_w,
             mask=wmask & (rec_v & lead_v)[:, None])
    dw = tl.sum(tl.where(j[:, None] == pos[None, :], delta[:, None], 0.0), axis=0)
    tl.store(rdt_ptr + (slot * RING + row_w) * H + h, dw, mask=rec_v & first_v)

    # ---- the tiles of headdim ------------------------------------------------------------------------------
    for ch in range(NCH):
        p = (split * NCH + ch) * BP + tl.arange(0, BP)
        pm = p < P
        m2 = pm[:, None] & nm[None, :]
        hp = (slot * H + h) * P + p
        if PREFETCH:
            S0 = S0_nx.to(tl.float32)
            if SCALED:
                S0 = S0 * sc_nx[:, None]
            p_nx = p + BP
            pm_nx = (p_nx < P) & ((p_nx * 0 + ch + 1) < NCH)
            hp_nx = (slot * H + h) * P + p_nx
            S0_nx = tl.load(ck_ptr + hp_nx[:, None] * N + n[None, :], mask=pm_nx[:, None] & nm[None, :],
                            other=0.0)
            if SCALED:
                sc_nx = tl.load(cks_ptr + hp_nx, mask=pm_nx, other=1.0)
        else:
            S0 = tl.load(ck_ptr + hp[:, None] * N + n[None, :], mask=m2, other=0.0).to(tl.float32)
            if SCALED:
                S0 = S0 * tl.load(cks_ptr + hp, mask=pm, other=1.0)[:, None]
        X_hist = tl.load(rx_ptr + ((slot * RING + row) * H + h)[:, None] * P + p[None, :],
                         mask=hist[:, None] & pm[None, :], other=0.0)
        X_win = tl.load(x_ptr + ((r * T + tj) * H + h)[:, None] * P + p[None, :],
                        mask=win[:, None] & pm[None, :], other=0.0)
        X = tl.where(hist[:, None], X_hist.to(tl.float32), X_win.to(tl.float32))  # [JB, BP]
        pmask = sm[:, None] & pm[None, :]
        wo = ((r * T + sidx) * H + h)[:, None] * P + p[None, :]  # [TP, BP] offsets of the window's x, z, y
        x_w = tl.load(x_ptr + wo, mask=pmask, other=0.0)
        tl.store(rx_ptr + ((slot * RING + row_w) * H + h)[:, None] * P + p[None, :], x_w,
                 mask=pmask & rec_v[:, None])
        S_first = S0
        if STATE_ROUTE:
            Y = tl.zeros((TP, BP), tl.float32)
            for s in tl.static_range(T):
                sel = sidx == s
                dec_s = tl.sum(tl.where(sel, dec, 0.0), axis=0)
                w_s = tl.sum(tl.where(sel[None, :], W, 0.0), axis=1)
                S_s = dec_s * S0 + tl.dot(tl.trans(X * w_s[:, None]), Bj, input_precision="ieee")
                if DOT == "ieee":
                    cs = tl.sum(tl.where(sel[None, :], Cmat, 0.0), axis=1)
                    y_s = tl.sum(S_s * cs[None, :], axis=1)
                else:
                    y_s = tl.sum(tl.where(sel[None, :], tl.dot(S_s, Cmat, input_precision=DOT), 0.0), axis=1)
                Y = tl.where(sel[:, None], y_s[None, :], Y)
                if s == 0:
                    S_first = S_s
        else:
            if LOOP:
                Y = tl.zeros((TP, BP), tl.float32)
                for s in tl.static_range(T):
                    sel = sidx == s
                    cs = tl.sum(tl.where(sel[None, :], Cmat, 0.0), axis=1)
                    m_s = tl.sum(tl.where(sel[None, :], M, 0.0), axis=1)
                    y_s = tl.sum(S0 * cs[None, :], axis=1) * tl.sum(tl.where(sel, dec, 0.0), axis=0) \
                        + tl.sum(m_s[:, None] * X, axis=0)
                    Y = tl.where(sel[:, None], y_s[None, :], Y)
            else:
                Y = dec[:, None] * tl.trans(tl.dot(S0, Cmat, input_precision=DOT)) \
                    + tl.dot(tl.trans(M), X, input_precision="ieee")
        Y = Y + Dh * x_w.to(tl.float32)
        if HAS_Z:
            zz = tl.load(z_ptr + wo, mask=pmask, other=0.0).to(tl.float32)
            Y = Y * zz / (1.0 + tl.exp(-zz))
        tl.store(out_ptr + wo, cast_nearest(Y, ACT, INTERP), mask=pmask)
        if flush:
            if STATE_ROUTE and not SPEC:
                S_new = S_first
            elif STATE_ROUTE:
                S_new = dec_fold * S0 + tl.dot(tl.trans(X * w_fold[:, None]), Bj, input_precision="ieee")
            elif not FOLD_DOT:
                # S0 <- exp(A c_n) S0 + Σ_j Δ_j exp(A (c_n - c_j)) x_j B_jᵀ as rank-1 updates, newest
                # position first so the decay is a running suffix sum of Δ (scalar work); unrolled
                # over the buffer so every x_j, B_j, Δ_j load (L1/L2) is independent and in flight
                # together.  (A [BP, JB] x [JB, BN] fp32 dot needs ~150 registers: 1/3 the occupancy.)
                FMAX: tl.constexpr = LSPEC - T if SPEC else LSPEC
                nfold = wp + (1 - SPEC)  # speculative: the committed history; standard: + the token
                x_cur = tl.load(x_ptr + ((r * T) * H + h) * P + p, mask=pm, other=0.0).to(tl.float32)
                b_cur = tl.load(B_ptr + ((r * T) * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
                d_cur = tl.sum(tl.where(j == wp, delta, 0.0), axis=0)
                S_new = S0 * 0.0
                suf = A * 0.0
                for jq in range((FMAX + FOLD_UNROLL - 1) // FOLD_UNROLL):
                  for ju in tl.static_range(FOLD_UNROLL):  # noqa: E111 - an unrolled group of positions
                    jj = tl.maximum(FMAX - 1 - (jq * FOLD_UNROLL + ju), -1)
                    row_j = (org + tl.maximum(jj, 0)) % RING
                    in_hist = wp > jj
                    d_h = tl.load(rdt_ptr + (slot * RING + row_j) * H + h)
                    xh = tl.load(rx_ptr + ((slot * RING + row_j) * H + h) * P + p, mask=pm, other=0.0)
                    bh = tl.load(rB_ptr + ((slot * RING + row_j) * G + g) * N + n, mask=nm, other=0.0)
                    d_j = tl.where((nfold > jj) & (jj >= 0), tl.where(in_hist, d_h, d_cur), 0.0)
                    w_j = d_j * tl.exp(A * suf)
                    suf = suf + d_j
                    x_j = tl.where(in_hist, xh.to(tl.float32), x_cur)
                    b_j = tl.where(in_hist, bh.to(tl.float32), b_cur)
                    S_new = S_new + (w_j * x_j)[:, None] * b_j[None, :]
                S_new = S_new + tl.exp(A * suf) * S0
            else:
                Bf_hist = tl.load(rB_ptr + ((slot * RING + row) * G + g)[:, None] * N + n[None, :],
                                  mask=hist[:, None] & nm[None, :], other=0.0)
                Bf_win = tl.load(B_ptr + ((r * T + tj) * G + g)[:, None] * N + n[None, :],
                                 mask=win[:, None] & nm[None, :], other=0.0)
                Bf = tl.where(hist[:, None], Bf_hist.to(tl.float32), Bf_win.to(tl.float32))
                S_new = dec_fold * S0 + tl.dot(tl.trans(X * w_fold[:, None]), Bf, input_precision="ieee")
            elem = (h * P + p)[:, None] * N + n[None, :]
            store_state(ck_ptr + hp[:, None] * N + n[None, :], cks_ptr + hp, S_new, m2, pm, elem,
                        seed, slot, ctr, STREAM_FLUSH, SCALED, SR, INTERP)

    # ---- fused commit(1) of standard decode: the slot's last program advances its cursor ----------
    if ADVANCE:
        done = tl.atomic_add(arr_ptr + slot, 1)
        if done == H * NSPLIT - 1:
            tl.store(arr_ptr + slot, 0)
            tl.store(wp_ptr + slot, tl.where(flush, 0, wp + 1))
            if SR:
                tl.store(cnt_ptr + slot, ctr + flush.to(tl.int32))


@triton.jit
def _commit_kernel(slot_ptr, acc_ptr, wp_ptr, org_ptr, cnt_ptr, R,
                   T: tl.constexpr, RING: tl.constexpr, LSPEC: tl.constexpr, SPEC: tl.constexpr,
                   SR: tl.constexpr, BLOCK: tl.constexpr):
    """commit(k) on the device (docs/recurrences.md sections 2-4): non-flush ``write_pos += k``; flush (standard) ``0``,
    (speculative) ``origin += write_pos mod ring, write_pos = k``; flushes count a state write."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + i, mask=i < R, other=-1).to(tl.int64)
    act = (i < R) & (slot >= 0)
    wp = tl.load(wp_ptr + slot, mask=act, other=0)
    k = tl.load(acc_ptr + i, mask=act, other=1).to(tl.int32)
    if SPEC:
        flush = wp + 2 * T > LSPEC
        org = tl.load(org_ptr + slot, mask=act, other=0)
        tl.store(org_ptr + slot, tl.where(flush, (org + wp) % RING, org), mask=act)
        tl.store(wp_ptr + slot, tl.where(flush, k, wp + k), mask=act)
    else:
        flush = wp == LSPEC - 1
        tl.store(wp_ptr + slot, tl.where(flush, 0, wp + 1), mask=act)
    if SR:
        ctr = tl.load(cnt_ptr + slot, mask=act, other=0)
        tl.store(cnt_ptr + slot, ctr + flush.to(tl.int32), mask=act)


@triton.jit
def write_state_kernel(slot_ptr, src_ptr, dst_ptr, dsts_ptr, cnt_ptr, seed, NBUF,
                       H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, HAS_SRC: tl.constexpr,
                       STATE: tl.constexpr, SR: tl.constexpr, INTERP: tl.constexpr, STREAM: tl.constexpr,
                       BP: tl.constexpr, BN: tl.constexpr, NCH: tl.constexpr):
    """Store ``src[r]`` (fp32 ``[R, H, P, N]``; zeros without a source) as the state of slot
    ``slot_ids[r]`` (buffer 0 of ``NBUF``), in the state dtype: the reset of every kernel."""
    h = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    SCALED: tl.constexpr = STATE.primitive_bitwidth == 8
    if SR:
        ctr = tl.load(cnt_ptr + slot)
    else:
        ctr = 0
    n = tl.arange(0, BN)
    nm = n < N
    for ch in range(NCH):
        p = ch * BP + tl.arange(0, BP)
        pm = p < P
        m2 = pm[:, None] & nm[None, :]
        if HAS_SRC:
            S = tl.load(src_ptr + ((r * H + h) * P + p)[:, None] * N + n[None, :], mask=m2, other=0.0)
        else:
            S = tl.zeros((BP, BN), tl.float32)
        hp = (slot * NBUF * H + h) * P + p
        elem = (h * P + p)[:, None] * N + n[None, :]
        store_state(dst_ptr + hp[:, None] * N + n[None, :], dsts_ptr + hp, S, m2, pm, elem, seed, slot, ctr,
                    STREAM, SCALED, SR, INTERP)


class _TritonReplay(TritonMamba2Base):
    """ReplaySSM Mamba-2 in Triton (standard and speculative decode)."""

    kind = "replay"
    route = "output_only"
    dots = ("ieee", "tf32", "tf32x3")
    accepted_options = tuple(OPTIONS)

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        reason = super().unsupported_reason(mode, decode, options)
        if reason:
            return reason
        if options.get("route", cls.route) != cls.route:
            return f"kernel {cls.name!r} implements the {cls.route} route, options['route'] asks {options['route']!r}"
        if decode.lspec > 64:
            return f"the buffer holds at most 64 positions (L or B + T'), got {decode.lspec}"
        return None

    def __init__(self, config):
        super().__init__(config)
        g, d, m = self.geometry, self.decode, self.mode
        S, dev, rows = self.num_slots, self.device, d.ring_rows
        self.ckpt = torch.zeros((S, *self.state_shape), dtype=m.state_dtype, device=dev)
        self.ckpt_scale = (torch.ones((S, g.nheads, g.headdim), dtype=torch.float32, device=dev)
                           if m.scaled_state else torch.ones(1, dtype=torch.float32, device=dev))
        self.records = {
            "x": torch.zeros((S, rows, g.nheads, g.headdim), dtype=m.act_dtype, device=dev),
            "B": torch.zeros((S, rows, g.ngroups, g.dstate), dtype=m.act_dtype, device=dev),
            "dt": torch.zeros((S, rows, g.nheads), dtype=torch.float32, device=dev),
        }
        self.arrivals = torch.zeros(S, dtype=torch.int32, device=dev)
        self.jb = max(16, next_pow2(d.lspec))
        # window axis: 16 wide where a tl.dot runs over it (tf32 readouts, vector readouts), else T'
        dotted = m.dot != "ieee" or self.vector_readout
        self.tp = max(16, next_pow2(d.window)) if dotted else next_pow2(d.window)
        # the two-launch path (replay_split.py): the output_only route; by default from 8 rows up (16 in
        # the speculative verify) on the GPU (below, the single kernel's one launch is faster:
        # docs/benchmarks.md) and always under the interpreter (so that the CPU tests run it by default;
        # prepass=False runs the single kernel)
        opts = config.options
        self.prepass = prepass_option(opts)
        self.coef_warps = int_choice(opts, "coef_warps", (1, 2, 4, 8), 2)
        # pdl: the pair's launches overlap (programmatic dependent launch, ops/triton/pdl.py; sm_90+, compiled).
        # Default on in the speculative verify, where the pair with it measured 0.5-1 % faster from batch 8 and
        # faster than the single kernel at batch 1 on an H200 (17.5 us, rec:25fb67bf488603d2, against 18.7 at
        # k = 4; 16.6, rec:cc40516931f9cf66, against 18.3 at k = 2); off in standard decode (equal from 32 rows,
        # slower at 8: 18.8 us against 17.6 without it, rec:5afe5f33cac2abf3)
        self.pdl_active = pdl_active(pdl_option(opts, d.speculative), self.device, INTERPRET)
        # stream launch defaults measured fastest on an H200 at batch 128-512 (docs/benchmarks.md):
        # one warp per 16-row tile; speculative windows read out over the whole dstate tile
        self.split_warps = int(opts.get("num_warps", 1))
        self.tp_split = next_pow2(d.window)
        # the stream's ieee readouts as one fp32 tl.dot (FMA units, dstate summed inside a thread): only
        # when the option is given (a launch candidate of the bench, not yet measured as a default)
        self.stream_dot = bool(opts.get("vector_readout", False))
        self.split_readout = bool(opts.get("split_readout", False))
        if self.split_readout and (m.dot != "ieee" or self.stream_dot or self.prepass is False
                                   or self.route != "output_only"):
            raise ValueError(f"options['split_readout']: the fp32-accurate tensor-core readout of the ieee modes' "
                             f"pre-pass path (needs dot=ieee, not vector_readout, prepass not False, the output_only "
                             f"route; kernel {self.name!r}, mode {m.id!r}, options {dict(opts)})")
        # whole-dstate readouts by default: measured faster than 4 dstate chunks at every batch (one H200,
        # both timed side by side in one run, T' = 4, k = 4 and k = 2, batches 8, 32 and 512; unrecorded)
        self.kchunks = int(opts.get("kchunks", 1))
        if (self.stream_dot or self.split_readout) and self.kchunks != 1:
            raise ValueError("options['vector_readout' / 'split_readout']: the stream's dot readout takes the whole "
                             f"dstate tile (kchunks must be 1, got {self.kchunks})")
        if self.kchunks < 1 or self.kchunks & (self.kchunks - 1) or (self.kchunks > 1
                                                                      and self.block_n // self.kchunks < 4):
            raise ValueError(f"options['kchunks']: expected a power of two with dstate / kchunks >= 4, "
                             f"got {self.kchunks}")
        if self.kchunks > 1 and m.dot != "ieee":
            raise ValueError(f"options['kchunks']: chunked readouts are the ieee path; mode {m.id!r} reads out "
                             f"with a {m.dot} tensor-core dot (kchunks must be 1)")
        self.coef_layout = coef_layout(self.jb, self.tp_split)
        self.interp = INTERPRET
        self._scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def chunks_for(self, rows: int) -> int:
        """dstate chunks of the stream's readouts for a launch of ``rows`` rows."""
        return self.kchunks

    def use_split(self, rows: int) -> bool:
        """Whether a launch of ``rows`` rows takes the two-launch path."""
        if self.route != "output_only":
            return False
        if self.prepass is not None:
            return self.prepass
        if self.split_readout:
            return True  # the stream's readout
        # from 8 rows (one H200): standard decode at batch 8 17.6 us (rec:5afe5f33cac2abf3) against the
        # single kernel's 23.4 (batch 1: 8.2 against 6.3); the speculative verify at batch 8 46.1 us (whole-dstate
        # readouts) against 73.8, and with PDL at every batch (batch 1: 17.5 us, rec:25fb67bf488603d2, against 18.7)
        return INTERPRET or rows >= 8 or (self.pdl_active and self.decode.speculative)

    def scratch(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-pass outputs for a launch of ``rows`` rows (kept per row count: a captured CUDA graph
        replays against the same buffers)."""
        if rows not in self._scratch:
            self._scratch[rows] = (
                torch.zeros((rows, self.geometry.nheads, self.coef_layout["NCOEF"]), dtype=torch.float32,
                            device=self.device),
                torch.zeros((rows, 4), dtype=torch.int32, device=self.device))
        return self._scratch[rows]

    # ---- raw launches (no host synchronisation) ------------------------------------------------------
    def _launch(self, slot_ids, inputs, out, advance: bool) -> None:
        if self.use_split(slot_ids.shape[0]):
            launch_split(self, slot_ids, inputs, out, advance)
            return
        g, d = self.geometry, self.decode
        R = slot_ids.shape[0]
        split = self.split_for(R)
        nch = triton.cdiv(self.nchunks, split)
        with self._device_ctx():
            _replay_kernel[(g.nheads * split, R)](
                slot_ids, inputs["x"], inputs["dt"], inputs["B"], inputs["C"], self._z(inputs),
                self.A, self.dt_bias, self.D, out, self.ckpt, self.ckpt_scale,
                self.records["x"], self.records["B"], self.records["dt"],
                self.write_pos, self.origin, self.counter, self.arrivals, self.seed,
                H=g.nheads, P=g.headdim, N=g.dstate, G=g.ngroups, T=d.window, RING=d.ring_rows, LSPEC=d.lspec,
                SPEC=d.speculative, STATE_ROUTE=self.route == "state_and_output", ADVANCE=advance,
                HAS_Z=g.has_z, STATE=self.state_kind, ACT=self.act_kind, DOT=self.mode.dot, SR=self.sr,
                INTERP=INTERPRET, VEC=self.vector_readout, FOLD_DOT=self.fold == "dot",
                FOLD_UNROLL=self.fold_unroll, PREFETCH=self.prefetch, BP=self.block_p, BN=self.block_n, JB=self.jb,
                TP=self.tp,
                NSPLIT=split, NCH=nch,
                num_warps=self.num_warps)

    def launch_verify(self, slot_ids, inputs, out) -> None:
        """Raw verify: outputs for every window position, records appended, checkpoint folded on
        a flush; cursors untouched (``launch_commit`` moves them)."""
        self._launch(slot_ids, inputs, out, advance=False)

    def launch_commit(self, slot_ids, accepted) -> None:
        """Raw commit(k) on the device."""
        d = self.decode
        R = slot_ids.shape[0]
        BLOCK = 128
        with self._device_ctx():
            _commit_kernel[(triton.cdiv(R, BLOCK),)](
                slot_ids, accepted, self.write_pos, self.origin, self.counter, R, T=d.window, RING=d.ring_rows,
                LSPEC=d.lspec, SPEC=d.speculative, SR=self.sr, BLOCK=BLOCK)

    def launch_step(self, slot_ids, inputs, out) -> None:
        """Raw standard-decode step: verify and commit(1) in one launch (the slot's last program
        advances the cursor).  Bit-identical to launch_verify + launch_commit(1)."""
        if self.decode.speculative:
            raise ValueError("launch_step: the fused step is standard decode; speculative decode commits k "
                             "with launch_commit")
        self._launch(slot_ids, inputs, out, advance=True)

    # ---- the interface -----------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None) -> None:
        ids = self.check_reset_args(slot_ids, initial_state, origin) if self.checks else slot_ids.tolist()
        g = self.geometry
        src = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        with self._device_ctx():
            write_state_kernel[(g.nheads, slot_ids.shape[0])](
                slot_ids, src if src is not None else self._dummy, self.ckpt, self.ckpt_scale, self.counter,
                self.seed, 1, H=g.nheads, P=g.headdim, N=g.dstate, HAS_SRC=src is not None, STATE=self.state_kind,
                SR=self.sr, INTERP=INTERPRET, STREAM=STREAM_RESET, BP=self.block_p, BN=self.block_n,
                NCH=self.nchunks, num_warps=self.num_warps)
        self._reset_cursors(slot_ids, origin)
        self._host_reset(ids)

    def verify_padded(self, slot_ids, inputs, out=None):
        if self.checks:
            ids = self.check_verify_args(slot_ids, inputs, out, self.write_pos.tolist(), self.ready)
        out = self._new_out(slot_ids.shape[0]) if out is None else out
        self.launch_verify(slot_ids, inputs, out)
        if self.checks:
            for s in ids:
                if s != PAD_SLOT:
                    self.pending[s] = True
        return out

    def commit(self, slot_ids, accepted) -> None:
        if self.checks:
            ids, ks = self.check_commit_args(slot_ids, accepted, self.pending, self.window_bound())
            if not self.decode.speculative and any(k != 1 for s, k in zip(ids, ks) if s != PAD_SLOT):
                raise ValueError("accepted: standard decode commits exactly 1 token per row")
            if accepted.device != self.device:
                raise ValueError(f"accepted: expected device {self.device}, got {accepted.device}")
        self.launch_commit(slot_ids, accepted)
        if self.checks:
            for s in ids:
                if s != PAD_SLOT:
                    self.pending[s] = False

    def step(self, slot_ids, inputs, out=None):
        """Standard decode verify + commit(1) in one launch (validated like verify + commit)."""
        if self.checks:
            ids = self.check_verify_args(slot_ids, inputs, out, self.write_pos.tolist(), self.ready)
            for r, s in enumerate(ids):
                if s != PAD_SLOT and self.pending[s]:
                    raise ValueError(f"slot_ids[{r}]: slot {s} has an uncommitted verify; commit it before a step")
        out = self._new_out(slot_ids.shape[0]) if out is None else out
        self.launch_step(slot_ids, inputs, out)
        return out

    # ---- inspection -----------------------------------------------------------------------------------------
    def _checkpoint64(self, s: int) -> torch.Tensor:
        scale = self.ckpt_scale[s] if self.mode.scaled_state else None
        return dequantize_state(self.ckpt[s], scale, torch.float64)

    def checkpoint_state(self, slot_ids):
        ids = self._check_slot_ids(slot_ids)
        out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                out[r] = self._checkpoint64(s)
        return out

    def launch_checkpoint(self, slot_ids) -> torch.Tensor:
        """Raw checkpoint_state of slots that are not padding: the same fp64 values, gathered on the
        device without host checks (no host sync; the drift fast path's flush measurement)."""
        scale = self.ckpt_scale.index_select(0, slot_ids) if self.mode.scaled_state else None
        return dequantize_state(self.ckpt.index_select(0, slot_ids), scale, torch.float64)

    def committed_state(self, slot_ids):
        """Checkpoint + committed records folded in fp64 (the exact value the stored data represent)."""
        ids = self._check_slot_ids(slot_ids)
        params = {"A": self.A.double(), "dt_bias": self.dt_bias.double(), "D": self.D.double()}
        return committed_rows_fp64(ids, self.write_pos.tolist(), self.origin.tolist(), self.decode.ring_rows,
                                   self.records, self.launch_checkpoint,
                                   lambda s0, hist: Mamba2Math().fold_rows(s0, hist, params, self.mode),
                                   self.state_shape, self.device)

    supports_restore = True

    def snapshot(self) -> KernelSnapshot:
        wp = self.write_pos.detach().cpu().to(torch.int64)
        return KernelSnapshot(
            checkpoint=self.ckpt.detach().clone(),
            checkpoint_scale=self.ckpt_scale.detach().clone() if self.mode.scaled_state else None,
            records={k: v.detach().clone() for k, v in self.records.items()},
            write_pos=wp,
            origin=self.origin.detach().cpu().to(torch.int64),
            is_flush=torch.tensor([self.decode.is_flush(int(w)) for w in wp.tolist()], dtype=torch.bool),
            extra=self._host_flags(),
        )

    def restore(self, snapshot: KernelSnapshot) -> None:
        S = self.num_slots
        self._check_tensor("snapshot.checkpoint", snapshot.checkpoint, self.ckpt.shape, self.ckpt.dtype)
        if set(snapshot.records) != set(self.records):
            raise ValueError(f"snapshot.records: expected keys {sorted(self.records)}, got {sorted(snapshot.records)}")
        for k, v in self.records.items():
            self._check_tensor(f"snapshot.records[{k!r}]", snapshot.records[k], v.shape, v.dtype)
        if self.mode.scaled_state:
            self._check_tensor("snapshot.checkpoint_scale", snapshot.checkpoint_scale, self.ckpt_scale.shape,
                               torch.float32)
        for name in ("write_pos", "origin"):
            t = getattr(snapshot, name)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != (S,):
                raise ValueError(f"snapshot.{name}: expected shape ({S},), got {tuple(getattr(t, 'shape', ()))}")
        self._restore_flags(snapshot)
        self.ckpt.copy_(snapshot.checkpoint.to(self.device))
        if self.mode.scaled_state:
            self.ckpt_scale.copy_(snapshot.checkpoint_scale.to(self.device))
        for k, v in self.records.items():
            v.copy_(snapshot.records[k].to(self.device))
        self.write_pos.copy_(snapshot.write_pos.to(self.device, torch.int32))
        self.origin.copy_(snapshot.origin.to(self.device, torch.int32))
        self.arrivals.zero_()


@register
class TritonReplay(_TritonReplay):
    name = "triton-replay"
    description = ("ReplaySSM Triton kernel, output_only route: y from S0·C and the buffered B·C, x "
                   "(standard L = 1..32 and speculative verify/commit; fused step for standard decode); "
                   "coefficient pre-pass + checkpoint stream from 8 rows up (speculative: 16), one fused kernel below")
    route = "output_only"


@register
class TritonReplayState(_TritonReplay):
    name = "triton-replay-state"
    description = "ReplaySSM Triton kernel, state_and_output route: rebuilds S = decay S0 + Σ x Bᵀ, reads y = S C"
    route = "state_and_output"
    literal_twin = "literal-replay-state"


__all__ = ["ROUTES", "TritonReplay", "TritonReplayState", "write_state_kernel"]
