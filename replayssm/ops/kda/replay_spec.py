"""ReplaySSM speculative verify for KDA, in Triton (commit: the delta rule's device-side cursor
update, which is family-independent: ``replayssm.ops.delta_rule.replay_spec.launch_replay_spec_commit``; the
window prologue, checkpoint and cursor loads and the window's stores are that module's too).

Verify, one program per (row, value head, block of value rows), window of T' tokens (docs/recurrences.md section 3 with
per-channel decays):

* the state before the window, ``S_h = S_0 Diag(e^G) + sum_{j<w} d_j (k_j * e^(G - G_j))^T`` over
  the committed history (ring rows ``(origin + j) mod ring``), is read out against each window
  vector without being built;
* the causal in-window solve (WY/UT form): with ``Gw_i [K]`` the inclusive per-channel cumsum of
  the window's g, ``R_i = beta_i (v_i - S_h (e^Gw_i * k_i))``,
  ``A_ij = beta_i sum_c k_i[c] e^(Gw_i[c] - Gw_j[c]) k_j[c]`` for i > j, ``d = (I + A)^-1 R`` by
  forward substitution, and
  ``o_s = S_h (e^Gw_s * q_s) + sum_{j<=s} [sum_c k_j[c] e^(Gw_s[c] - Gw_j[c]) q_s[c]] d_j``;
  every exponent is a difference of fp32 cumsums taken only where it is <= 0 (j <= s);
* every window token's records (d, normalised k, per-channel g) go to ring rows
  ``(origin + write_pos + t) mod ring`` (rejected drafts too: they are never committed);
* a flush verify (``is_flush``) folds the committed history into the checkpoint (``S_h``) and
  writes it back; a non-flush verify never writes the checkpoint.

Oracle: ``literal-replay`` (family kda: its window solve) and the fp64 recurrence on the accepted
stream.  Expected error: within a small factor of the literal model's at the same mode.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.replay_spec import (
    checkpoint_cursors,
    launch_replay_spec_commit,
    store_flush,
    store_window,
    window_inputs,
)
from replayssm.ops.delta_rule.triton_base import program_row, select_row, value_block
from replayssm.ops.kda.triton_base import fold_history, load_history, readout


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _kda_replay_spec_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                            ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, wpos_ptr, origin_ptr, isflush_ptr,
                            pending_ptr, sr_ptr, seed, num_slots,
                            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                            RING: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                            BT: tl.constexpr, BH: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr,
                            INTERPRET: tl.constexpr):
    r, h, vb, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    offs_v, mv, ms, tile = value_block(vb, 0, offs_k, mk, 1, BV, V, K)
    # the window: normalised q (scaled), k [BT, BK]; v [BT, BV]; per-channel gates [BT, BK] (their cumsum Gw),
    # beta [BT]
    offs_t, mt, tok, mtk, mtv, Qw, Kw, Vw, gw, betaw, Gw = window_inputs(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, r, h, hk, offs_k, mk, offs_v, mv, H, HV, K, V, T,
        BT, SCALE, True)
    # checkpoint and committed history
    base, s0, w, org, flush = checkpoint_cursors(ckpt_ptr, sc_ptr, wpos_ptr, origin_ptr, isflush_ptr, slot, h, offs_v,
                                                 mv, tile, ms, HV, V, K, SCALED)
    offs_j = tl.arange(0, BH)
    Dh, KW, eG = load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, (org + offs_j) % RING, offs_j < RING,
                              offs_j < w, h, hk, offs_v, mv, offs_k, mk, H, HV, K, V, RING)
    # R = beta (V - S_h (e^Gw * k)) and SQ = S_h (e^Gw * q) [BT, BV]; A[i, j], M[s, j] [BT, BT]
    SK = tl.zeros([BT, BV], dtype=tl.float32)
    SQ = tl.zeros([BT, BV], dtype=tl.float32)
    A = tl.zeros([BT, BT], dtype=tl.float32)
    M = tl.zeros([BT, BT], dtype=tl.float32)
    for t in tl.static_range(T):
        sel = offs_t == t
        Gt = select_row(Gw, sel)
        kt = select_row(Kw, sel)
        qt = select_row(Qw, sel)
        SK = tl.where(sel[:, None], readout(s0, eG, Dh, KW, tl.exp(Gt) * kt)[None, :], SK)
        SQ = tl.where(sel[:, None], readout(s0, eG, Dh, KW, tl.exp(Gt) * qt)[None, :], SQ)
        past = offs_t <= t
        dec = tl.exp(tl.where(past[:, None] & mk[None, :], Gt[None, :] - Gw, 0.0))  # [j, K]: e^(Gw_t - Gw_j)
        kdec = tl.where(past[:, None], Kw * dec, 0.0)
        A = tl.where(sel[:, None] & (offs_t < t)[None, :], tl.sum(kdec * kt[None, :], 1)[None, :], A)
        M = tl.where(sel[:, None], tl.sum(kdec * qt[None, :], 1)[None, :], M)
    R = betaw[:, None] * (Vw - SK)
    A = betaw[:, None] * A
    D = tl.zeros([BT, BV], dtype=tl.float32)
    for t in tl.static_range(T):
        sel = offs_t == t
        dt = select_row(R, sel) - tl.sum(D * select_row(A, sel)[:, None], 0)
        D = tl.where(sel[:, None], dt[None, :], D)
    O = SQ
    for t in tl.static_range(T):
        sel = offs_t == t
        O += tl.where(sel[:, None], tl.sum(D * select_row(M, sel)[:, None], 0)[None, :], 0.0)
    store_window(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, O, D, Kw, gw, slot, org, w, offs_t, mt, tok, h, hk, vb,
                 offs_v, offs_k, mtk, mtv, H, HV, K, V, RING, INTERPRET, True)
    if flush:
        s_h = fold_history(s0, eG, KW, offs_j, w, d_rec_ptr, slot, org, h, offs_v, mv, HV, V, RING)
        store_flush(ckpt_ptr, sc_ptr, sr_ptr, s_h, base, tile, ms, offs_v, mv, slot, h, seed, V, K, SCALED, SR,
                    INTERPRET)
    tl.store(pending_ptr + slot, 1, mask=(h + vb) == 0)


def launch_replay_spec(kern, slot_ids, inputs, out) -> None:
    """Launch one speculative verify of ``kern`` (a TritonKDAReplay) for all rows."""
    R = slot_ids.shape[0]
    bv, nvb, nw = kern.launch_shape(R)
    dec = kern.decode
    _kda_replay_spec_kernel[(R, kern.HV, nvb)](
        slot_ids, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], out, kern.A_log, kern.dt_bias,
        kern.states, kern.scales, kern.records["d"], kern.records["k"], kern.records["g"], kern.write_pos,
        kern.origin, kern.is_flush, kern.pending, kern.sr_count, kern.seed, kern.num_slots,
        H=kern.H, HV=kern.HV, K=kern.K, V=kern.V, T=dec.window, RING=dec.ring_rows, SCALE=kern.K ** -0.5,
        BK=kern.BK, BV=bv, BT=triton.next_power_of_2(dec.window), BH=triton.next_power_of_2(dec.buffer),
        SCALED=kern.scaled, SR=kern.sr, INTERPRET=kern.interpret, num_warps=nw)


__all__ = ["launch_replay_spec", "launch_replay_spec_commit"]
