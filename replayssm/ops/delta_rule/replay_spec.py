"""ReplaySSM speculative verify and commit of a delta-rule family, in Triton: the verify as one kernel for both
gate widths (the ``PER_CHANNEL_GATE`` constexpr, as flash-linear-attention's common fused recurrent kernel has
``IS_KDA``; each branch is its family's instruction sequence, so a family's compiled kernel is what its own kernel
was), its window prologue (the window's normalised q, k, its v and gates, their cumulative sum), the checkpoint and
cursors, the window's outputs and records (one log gate per value head, or one per key channel), and the
device-side commit, which is family-independent.

Verify, one program per (row, value head, block of value rows), window of T' tokens (docs/recurrences.md section 3):

* the state before the window, over the committed history (ring rows ``(origin + j) mod ring``), is read out
  against each window vector without being built (``history_head.py``: ``S_h = exp(G_w) S_0 +
  sum_{j<w} exp(G_w - G_j) d_j k_j^T``; ``history_channel.py``: ``S_h = S_0 Diag(e^G) +
  sum_{j<w} d_j (k_j * e^(G - G_j))^T``);
* the causal in-window solve (WY/UT form), with ``G`` the inclusive cumsum of the window's g: one gate per value
  head, ``R_i = beta_i (v_i - exp(G_i) S_h k_i)``, ``A_ij = beta_i exp(G_i - G_j) (k_i . k_j)`` for i > j and
  ``o_s = exp(G_s) S_h q_s + sum_{j<=s} exp(G_s - G_j) (k_j . q_s) d_j``; per key channel (``Gw_i [K]``),
  ``R_i = beta_i (v_i - S_h (e^Gw_i * k_i))``, ``A_ij = beta_i sum_c k_i[c] e^(Gw_i[c] - Gw_j[c]) k_j[c]`` and
  ``o_s = S_h (e^Gw_s * q_s) + sum_{j<=s} [sum_c k_j[c] e^(Gw_s[c] - Gw_j[c]) q_s[c]] d_j``, every exponent a
  difference of fp32 cumsums taken only where it is <= 0 (j <= s); ``d = (I + A)^-1 R`` by forward substitution
  (T' rows, each a [BV] vector);
* every window token's records (d, normalised k, g) go to ring rows ``(origin + write_pos + t) mod ring``
  (rejected drafts too: they are never committed);
* a flush verify (``is_flush``) folds the committed history into the checkpoint (``S_h``) and writes it back; a
  non-flush verify never writes the checkpoint.

Commit, one program per block of rows, on the device: ``k`` accepted; flush slot:
``origin += write_pos (mod ring), write_pos = k``; else ``write_pos += k``; then
``is_flush = write_pos + 2 T' > B + T'`` (flush one window early).

Oracle: each family's ``literal-replay`` (its window solve and the cursor rules of ``DecodeConfig``) and its fp64
recurrence on the accepted stream.  Expected error: within a small factor of the literal model's at the same
mode; none for the cursors and the loads and stores; normalisation and gates fp32 (a few ulp).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule import history_channel as chan
from replayssm.ops.delta_rule import history_head as head
from replayssm.ops.delta_rule.triton_base import gates, l2_normalise, program_row, select_row, value_block
from replayssm.ops.triton.rounding import STREAM_FLUSH, cast_nearest, load_state, store_state


@triton.jit
def window_inputs(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, r, h, hk, offs_k, mk, offs_v, mv,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                  BT: tl.constexpr, SCALE: tl.constexpr, PER_CHANNEL_GATE: tl.constexpr):
    """Row ``r``'s window for value head ``h``: window offsets ``[BT]``, their mask, token indices and the
    ``[BT, BK]`` / ``[BT, BV]`` masks; normalised q (times ``SCALE``) and k ``[BT, BK]``, v ``[BT, BV]``; the
    log gates ``[BT]`` (or ``[BT, BK]`` per key channel; zero past the window), beta ``[BT]`` and the gates'
    inclusive cumulative sum."""
    offs_t = tl.arange(0, BT)
    mt = offs_t < T
    tok = r * T + offs_t
    mtk = mt[:, None] & mk[None, :]
    mtv = mt[:, None] & mv[None, :]
    Qw = tl.load(q_ptr + (tok[:, None] * H + hk) * K + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    Kw = tl.load(k_ptr + (tok[:, None] * H + hk) * K + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    Vw = tl.load(v_ptr + (tok[:, None] * HV + h) * V + offs_v[None, :], mask=mtv, other=0.0).to(tl.float32)
    if PER_CHANNEL_GATE:
        aw = tl.load(a_ptr + (tok[:, None] * HV + h) * K + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    else:
        aw = tl.load(a_ptr + tok * HV + h, mask=mt, other=0.0).to(tl.float32)
    bw = tl.load(b_ptr + tok * HV + h, mask=mt, other=0.0).to(tl.float32)
    Qw = l2_normalise(Qw, 1) * SCALE
    Kw = l2_normalise(Kw, 1)
    if PER_CHANNEL_GATE:
        dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mk, other=0.0)
        gw, betaw = gates(aw, bw, tl.load(A_log_ptr + h), dt_bias[None, :])
        gw = tl.where(mtk, gw, 0.0)
    else:
        gw, betaw = gates(aw, bw, tl.load(A_log_ptr + h), tl.load(dt_bias_ptr + h))
        gw = tl.where(mt, gw, 0.0)
    return offs_t, mt, tok, mtk, mtv, Qw, Kw, Vw, gw, betaw, tl.cumsum(gw, 0)


@triton.jit
def checkpoint_cursors(ckpt_ptr, sc_ptr, wpos_ptr, origin_ptr, isflush_ptr, slot, h, offs_v, mv, tile, ms,
                       HV: tl.constexpr, V: tl.constexpr, K: tl.constexpr, SCALED: tl.constexpr):
    """A slot's checkpoint tile ``s0 [BV, BK]`` (fp32; its row base returned) and cursors: write position,
    origin and whether this verify flushes."""
    base = (slot * HV + h) * V
    s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
    w = tl.load(wpos_ptr + slot)
    org = tl.load(origin_ptr + slot)
    flush = tl.load(isflush_ptr + slot) != 0
    return base, s0, w, org, flush


@triton.jit
def store_window(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, O, D, Kw, gw, slot, org, w, offs_t, mt, tok, h, hk, vb,
                 offs_v, offs_k, mtk, mtv, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 RING: tl.constexpr, INTERPRET: tl.constexpr, PER_CHANNEL_GATE: tl.constexpr):
    """The window's outputs ``O`` and its records (all T' tokens, at logical positions write_pos + t): d by
    every program, g by the first value block, k by the first value head of the key head."""
    tl.store(out_ptr + (tok[:, None] * HV + h) * V + offs_v[None, :],
             cast_nearest(O, out_ptr.dtype.element_ty, INTERPRET), mask=mtv)
    srow = slot * RING + (org + w + offs_t) % RING
    tl.store(d_rec_ptr + (srow[:, None] * HV + h) * V + offs_v[None, :],
             cast_nearest(D, d_rec_ptr.dtype.element_ty, INTERPRET), mask=mtv)
    if PER_CHANNEL_GATE:
        tl.store(g_rec_ptr + (srow[:, None] * HV + h) * K + offs_k[None, :], gw,
                 mask=mtk & ((tok[:, None] * 0 + offs_k[None, :] * 0 + vb) == 0))
    else:
        tl.store(g_rec_ptr + srow * HV + h, gw, mask=mt & ((offs_t * 0 + vb) == 0))
    tl.store(k_rec_ptr + (srow[:, None] * H + hk) * K + offs_k[None, :],
             cast_nearest(Kw, k_rec_ptr.dtype.element_ty, INTERPRET),
             mask=mtk & ((tok[:, None] * 0 + offs_k[None, :] * 0 + vb + h % (HV // H)) == 0))


@triton.jit
def store_flush(ckpt_ptr, sc_ptr, sr_ptr, s_h, base, tile, ms, offs_v, mv, slot, h, seed,
                V: tl.constexpr, K: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr):
    """A flush verify's folded history ``s_h`` written back as the checkpoint (nearest or stochastic rounding
    on the slot's flush stream)."""
    cnt = tl.load(sr_ptr + slot)
    store_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, s_h, ms, mv, h * V * K + tile, seed, slot,
                cnt, STREAM_FLUSH, SCALED, SR, INTERPRET)


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _replay_spec_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                        ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, wpos_ptr, origin_ptr, isflush_ptr,
                        pending_ptr, sr_ptr, seed, num_slots,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                        RING: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        BT: tl.constexpr, BH: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr,
                        INTERPRET: tl.constexpr, PER_CHANNEL_GATE: tl.constexpr):
    r, h, vb, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    offs_v, mv, ms, tile = value_block(vb, 0, offs_k, mk, 1, BV, V, K)
    # the window: normalised q (scaled), k [BT, BK]; v [BT, BV]; gates [BT] (per channel [BT, BK]), their cumsum
    # Gw; beta [BT]
    offs_t, mt, tok, mtk, mtv, Qw, Kw, Vw, gw, betaw, Gw = window_inputs(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, r, h, hk, offs_k, mk, offs_v, mv, H, HV, K, V, T,
        BT, SCALE, PER_CHANNEL_GATE)
    # checkpoint and committed history
    base, s0, w, org, flush = checkpoint_cursors(ckpt_ptr, sc_ptr, wpos_ptr, origin_ptr, isflush_ptr, slot, h, offs_v,
                                                 mv, tile, ms, HV, V, K, SCALED)
    offs_j = tl.arange(0, BH)
    if PER_CHANNEL_GATE:
        Dh, KW, eG = chan.load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, (org + offs_j) % RING, offs_j < RING,
                                       offs_j < w, h, hk, offs_v, mv, offs_k, mk, H, HV, K, V, RING)
    else:
        Dh, Kh, wj, eG = head.load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, (org + offs_j) % RING,
                                           offs_j < RING, offs_j < w, h, hk, offs_v, mv, offs_k, mk, H, HV, K, V, RING)
    # the checkpoint's readouts [BT, BV]: S_h k_t, S_h q_t (per channel S_h (e^Gw * k), S_h (e^Gw * q)); per channel
    # A[i, j], M[s, j] [BT, BT], else KK[i, t] = k_i . k_t, KQ[s, j] = k_j . q_s
    SK = tl.zeros([BT, BV], dtype=tl.float32)
    SQ = tl.zeros([BT, BV], dtype=tl.float32)
    if PER_CHANNEL_GATE:
        A = tl.zeros([BT, BT], dtype=tl.float32)
        M = tl.zeros([BT, BT], dtype=tl.float32)
    else:
        KK = tl.zeros([BT, BT], dtype=tl.float32)
        KQ = tl.zeros([BT, BT], dtype=tl.float32)
    for t in tl.static_range(T):
        sel = offs_t == t
        if PER_CHANNEL_GATE:
            Gt = select_row(Gw, sel)
        kt = select_row(Kw, sel)
        qt = select_row(Qw, sel)
        if PER_CHANNEL_GATE:
            SK = tl.where(sel[:, None], chan.readout(s0, eG, Dh, KW, tl.exp(Gt) * kt)[None, :], SK)
            SQ = tl.where(sel[:, None], chan.readout(s0, eG, Dh, KW, tl.exp(Gt) * qt)[None, :], SQ)
            past = offs_t <= t
            dec = tl.exp(tl.where(past[:, None] & mk[None, :], Gt[None, :] - Gw, 0.0))  # [j, K]: e^(Gw_t - Gw_j)
            kdec = tl.where(past[:, None], Kw * dec, 0.0)
            A = tl.where(sel[:, None] & (offs_t < t)[None, :], tl.sum(kdec * kt[None, :], 1)[None, :], A)
            M = tl.where(sel[:, None], tl.sum(kdec * qt[None, :], 1)[None, :], M)
        else:
            SK = tl.where(sel[:, None], head.readout(s0, eG, Dh, Kh, wj, kt)[None, :], SK)
            SQ = tl.where(sel[:, None], head.readout(s0, eG, Dh, Kh, wj, qt)[None, :], SQ)
            KK = tl.where(offs_t[None, :] == t, tl.sum(Kw * kt[None, :], 1)[:, None], KK)
            KQ = tl.where(sel[:, None], tl.sum(Kw * qt[None, :], 1)[None, :], KQ)
    # causal solve d = (I + A)^-1 R
    if PER_CHANNEL_GATE:
        R = betaw[:, None] * (Vw - SK)
        A = betaw[:, None] * A
    else:
        eGw = tl.exp(Gw)
        R = betaw[:, None] * (Vw - eGw[:, None] * SK)
        lower = offs_t[:, None] > offs_t[None, :]
        dG = tl.where(offs_t[:, None] >= offs_t[None, :], Gw[:, None] - Gw[None, :], 0.0)
        A = tl.where(lower, betaw[:, None] * tl.exp(dG) * KK, 0.0)
    D = tl.zeros([BT, BV], dtype=tl.float32)
    for t in tl.static_range(T):
        sel = offs_t == t
        dt = select_row(R, sel) - tl.sum(D * select_row(A, sel)[:, None], 0)
        D = tl.where(sel[:, None], dt[None, :], D)
    # outputs o_s = (the checkpoint's readout) + sum_{j<=s} M[s, j] d_j
    if PER_CHANNEL_GATE:
        O = SQ
    else:
        M = tl.where(offs_t[:, None] >= offs_t[None, :], tl.exp(dG) * KQ, 0.0)
        O = eGw[:, None] * SQ
    for t in tl.static_range(T):
        sel = offs_t == t
        O += tl.where(sel[:, None], tl.sum(D * select_row(M, sel)[:, None], 0)[None, :], 0.0)
    store_window(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, O, D, Kw, gw, slot, org, w, offs_t, mt, tok, h, hk, vb,
                 offs_v, offs_k, mtk, mtv, H, HV, K, V, RING, INTERPRET, PER_CHANNEL_GATE)
    if flush:
        if PER_CHANNEL_GATE:
            s_h = chan.fold_history(s0, eG, KW, offs_j, w, d_rec_ptr, slot, org, h, offs_v, mv, HV, V, RING)
        else:
            s_h = head.fold_history(s0, eG, wj, offs_j, w, d_rec_ptr, k_rec_ptr, slot, org, h, hk, offs_v, mv, offs_k,
                                    mk, H, HV, K, V, RING, 4)
        store_flush(ckpt_ptr, sc_ptr, sr_ptr, s_h, base, tile, ms, offs_v, mv, slot, h, seed, V, K, SCALED, SR,
                    INTERPRET)
    tl.store(pending_ptr + slot, 1, mask=(h + vb) == 0)


def launch_replay_spec(kern, slot_ids, inputs, out) -> None:
    """Launch one speculative verify of ``kern`` (a delta-rule replay kernel; its ``PER_CHANNEL_GATE``) for all
    rows: the single kernel over [T', *] window tiles."""
    R = slot_ids.shape[0]
    bv, nvb, nw = kern.launch_shape(R)
    dec = kern.decode
    _replay_spec_kernel[(R, kern.HV, nvb)](
        slot_ids, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], out, kern.A_log, kern.dt_bias,
        kern.states, kern.scales, kern.records["d"], kern.records["k"], kern.records["g"], kern.write_pos,
        kern.origin, kern.is_flush, kern.pending, kern.sr_count, kern.seed, kern.num_slots,
        H=kern.H, HV=kern.HV, K=kern.K, V=kern.V, T=dec.window, RING=dec.ring_rows, SCALE=kern.K ** -0.5,
        BK=kern.BK, BV=bv, BT=triton.next_power_of_2(dec.window), BH=triton.next_power_of_2(dec.buffer),
        SCALED=kern.scaled, SR=kern.sr, INTERPRET=kern.interpret, PER_CHANNEL_GATE=kern.PER_CHANNEL_GATE,
        num_warps=nw)


@triton.jit(do_not_specialize=["R"])
def _replay_spec_commit_kernel(slot_ptr, acc_ptr, wpos_ptr, origin_ptr, isflush_ptr, pending_ptr, sr_ptr, R,
                               T: tl.constexpr, LSPEC: tl.constexpr, RING: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + offs, mask=offs < R, other=-1)
    m = (offs < R) & (slot >= 0)
    k = tl.load(acc_ptr + offs, mask=m, other=1).to(tl.int32)
    w = tl.load(wpos_ptr + slot, mask=m, other=0)
    org = tl.load(origin_ptr + slot, mask=m, other=0)
    f = tl.load(isflush_ptr + slot, mask=m, other=0) != 0
    nw = tl.where(f, k, w + k)
    tl.store(origin_ptr + slot, tl.where(f, (org + w) % RING, org), mask=m)
    tl.store(wpos_ptr + slot, nw, mask=m)
    tl.store(isflush_ptr + slot, (nw + 2 * T > LSPEC).to(tl.int32), mask=m)
    tl.store(pending_ptr + slot, 0, mask=m)
    cnt = tl.load(sr_ptr + slot, mask=m, other=0)
    tl.store(sr_ptr + slot, cnt + f.to(tl.int64), mask=m)


def launch_replay_spec_commit(kern, slot_ids, accepted) -> None:
    """Launch the device-side commit of ``accepted`` tokens per row of ``kern`` (a delta-rule replay kernel)."""
    R = slot_ids.shape[0]
    dec = kern.decode
    _replay_spec_commit_kernel[(triton.cdiv(R, 256),)](
        slot_ids, accepted, kern.write_pos, kern.origin, kern.is_flush, kern.pending, kern.sr_count, R,
        T=dec.window, LSPEC=dec.lspec, RING=dec.ring_rows, BLOCK=256)


__all__ = ["checkpoint_cursors", "launch_replay_spec", "launch_replay_spec_commit", "store_flush", "store_window",
           "window_inputs"]
