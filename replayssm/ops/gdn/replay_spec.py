"""ReplaySSM speculative verify for Gated DeltaNet, in Triton: the token-by-token kernel for T' <= 4 with the
``reduce`` readout; longer windows and the ``tile`` readout take the delta rule's window-tile kernel
(``replayssm.ops.delta_rule.replay_spec``, ``PER_CHANNEL_GATE`` false), whose module also holds the device-side
commit and the checkpoint, cursor and flush helpers used here.

Verify, one program per (row, value head, block of value rows), window of T' tokens (docs/recurrences.md section 3):

* the state before the window is ``S_h = exp(G_w) S_0 + sum_{j<w} exp(G_w - G_j) d_j k_j^T`` over
  the committed history (ring rows ``(origin + j) mod ring``); it is read out against each window
  k and q without being built (as in standard decode; ``replayssm.ops.delta_rule.history_head``);
* the causal in-window solve in closed form, token by token (every window quantity a vector or a scalar):
  with ``G`` the inclusive cumsum of the window's g, ``d_i = beta_i (v_i - exp(G_i) S_h k_i) -
  sum_{j<i} beta_i exp(G_i - G_j) (k_i . k_j) d_j`` and
  ``o_s = exp(G_s) S_h q_s + sum_{j<=s} exp(G_s - G_j) (k_j . q_s) d_j``;
* every window token's records (d, normalised k, g) go to ring rows
  ``(origin + write_pos + t) mod ring`` (rejected drafts too: they are never committed);
* a flush verify (``is_flush``) folds the committed history into the checkpoint (``S_h``) and
  writes it back; a non-flush verify never writes the checkpoint.

Oracle: ``literal-replay`` (``gdn_window_solve``) and ``gdn_sequence`` in fp64 on the accepted
stream.  Expected error: within a small factor of the literal model's at the same mode.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.history_head import fold_history, load_history, readout
from replayssm.ops.delta_rule.replay_spec import checkpoint_cursors, launch_replay_spec_commit, store_flush
from replayssm.ops.delta_rule.replay_spec import launch_replay_spec as launch_tile_spec
from replayssm.ops.delta_rule.triton_base import program_row, token_gates, token_qk, value_block
from replayssm.ops.triton.rounding import cast_nearest


@triton.jit
def _token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, tok, h, hk, offs_k, mk, offs_v, mv, A_log, dt_bias,
           H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, SCALE: tl.constexpr):
    """One window token: normalised q (scaled) and k [BK], v [BV], g and beta."""
    qn, kn = token_qk(q_ptr, k_ptr, tok, hk, offs_k, mk, H, K, SCALE)
    v = tl.load(v_ptr + (tok * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
    g, beta = token_gates(a_ptr, b_ptr, tok, h, offs_k, mk, A_log, dt_bias, HV, K, False)
    return qn, kn, v, g, beta


@triton.jit
def _store_token(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, o, d, kn, g, tok, srow, h, hk, vb, offs_v, mv, offs_k,
                 mk, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, INTERPRET: tl.constexpr):
    """Output of a window token and its records (d by every program, g by the first value block,
    k by the first value head of the key head)."""
    tl.store(out_ptr + (tok * HV + h) * V + offs_v, cast_nearest(o, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
    tl.store(d_rec_ptr + (srow * HV + h) * V + offs_v, cast_nearest(d, d_rec_ptr.dtype.element_ty, INTERPRET), mask=mv)
    tl.store(g_rec_ptr + srow * HV + h, g, mask=vb == 0)
    tl.store(k_rec_ptr + (srow * H + hk) * K + offs_k, cast_nearest(kn, k_rec_ptr.dtype.element_ty, INTERPRET),
             mask=mk & ((offs_k * 0 + vb + h % (HV // H)) == 0))


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _replay_spec_small_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                              ckpt_ptr, sc_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, wpos_ptr, origin_ptr, isflush_ptr,
                              pending_ptr, sr_ptr, seed, num_slots,
                              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                              RING: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                              BH: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr):
    """The same verify for T' <= 4, written out token by token: every window quantity is a vector
    or a scalar (no [T', *] tiles, no row extraction), the solve and outputs in closed form:
    d_i = R_i - sum_{j<i} beta_i e^(G_i - G_j) (k_i . k_j) d_j,
    o_s = e^(G_s) S_h q_s + sum_{j<=s} e^(G_s - G_j) (k_j . q_s) d_j."""
    r, h, vb, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    offs_v, mv, ms, tile = value_block(vb, 0, offs_k, mk, 1, BV, V, K)
    base, s0, w, org, flush = checkpoint_cursors(ckpt_ptr, sc_ptr, wpos_ptr, origin_ptr, isflush_ptr, slot, h, offs_v,
                                                 mv, tile, ms, HV, V, K, SCALED)
    offs_j = tl.arange(0, BH)
    Dh, Kh, wj, eG = load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, (org + offs_j) % RING, offs_j < RING,
                                  offs_j < w, h, hk, offs_v, mv, offs_k, mk, H, HV, K, V, RING)
    A_log = tl.load(A_log_ptr + h)
    dt_bias = tl.load(dt_bias_ptr + h)
    t0 = r * T
    q0, k0, v0, g0, b0 = _token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, t0, h, hk, offs_k, mk, offs_v, mv, A_log,
                                dt_bias, H, HV, K, V, SCALE)
    G0 = g0
    d0 = b0 * (v0 - tl.exp(G0) * readout(s0, eG, Dh, Kh, wj, k0))
    o0 = tl.exp(G0) * readout(s0, eG, Dh, Kh, wj, q0) + tl.sum(k0 * q0, 0) * d0
    _store_token(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, o0, d0, k0, g0, t0, slot * RING + (org + w) % RING,
                 h, hk, vb, offs_v, mv, offs_k, mk, H, HV, K, V, INTERPRET)
    if T > 1:
        q1, k1, v1, g1, b1 = _token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, t0 + 1, h, hk, offs_k, mk, offs_v, mv,
                                    A_log, dt_bias, H, HV, K, V, SCALE)
        G1 = G0 + g1
        d1 = (b1 * (v1 - tl.exp(G1) * readout(s0, eG, Dh, Kh, wj, k1))
              - (b1 * tl.exp(G1 - G0) * tl.sum(k1 * k0, 0)) * d0)
        o1 = (tl.exp(G1) * readout(s0, eG, Dh, Kh, wj, q1) + (tl.exp(G1 - G0) * tl.sum(k0 * q1, 0)) * d0
              + tl.sum(k1 * q1, 0) * d1)
        _store_token(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, o1, d1, k1, g1, t0 + 1,
                     slot * RING + (org + w + 1) % RING, h, hk, vb, offs_v, mv, offs_k, mk, H, HV, K, V, INTERPRET)
    if T > 2:
        q2, k2, v2, g2, b2 = _token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, t0 + 2, h, hk, offs_k, mk, offs_v, mv,
                                    A_log, dt_bias, H, HV, K, V, SCALE)
        G2 = G1 + g2
        d2 = (b2 * (v2 - tl.exp(G2) * readout(s0, eG, Dh, Kh, wj, k2))
              - (b2 * tl.exp(G2 - G0) * tl.sum(k2 * k0, 0)) * d0
              - (b2 * tl.exp(G2 - G1) * tl.sum(k2 * k1, 0)) * d1)
        o2 = (tl.exp(G2) * readout(s0, eG, Dh, Kh, wj, q2) + (tl.exp(G2 - G0) * tl.sum(k0 * q2, 0)) * d0
              + (tl.exp(G2 - G1) * tl.sum(k1 * q2, 0)) * d1 + tl.sum(k2 * q2, 0) * d2)
        _store_token(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, o2, d2, k2, g2, t0 + 2,
                     slot * RING + (org + w + 2) % RING, h, hk, vb, offs_v, mv, offs_k, mk, H, HV, K, V, INTERPRET)
    if T > 3:
        q3, k3, v3, g3, b3 = _token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, t0 + 3, h, hk, offs_k, mk, offs_v, mv,
                                    A_log, dt_bias, H, HV, K, V, SCALE)
        G3 = G2 + g3
        d3 = (b3 * (v3 - tl.exp(G3) * readout(s0, eG, Dh, Kh, wj, k3))
              - (b3 * tl.exp(G3 - G0) * tl.sum(k3 * k0, 0)) * d0
              - (b3 * tl.exp(G3 - G1) * tl.sum(k3 * k1, 0)) * d1
              - (b3 * tl.exp(G3 - G2) * tl.sum(k3 * k2, 0)) * d2)
        o3 = (tl.exp(G3) * readout(s0, eG, Dh, Kh, wj, q3) + (tl.exp(G3 - G0) * tl.sum(k0 * q3, 0)) * d0
              + (tl.exp(G3 - G1) * tl.sum(k1 * q3, 0)) * d1 + (tl.exp(G3 - G2) * tl.sum(k2 * q3, 0)) * d2
              + tl.sum(k3 * q3, 0) * d3)
        _store_token(out_ptr, d_rec_ptr, k_rec_ptr, g_rec_ptr, o3, d3, k3, g3, t0 + 3,
                     slot * RING + (org + w + 3) % RING, h, hk, vb, offs_v, mv, offs_k, mk, H, HV, K, V, INTERPRET)
    if flush:
        s_h = fold_history(s0, eG, wj, offs_j, w, d_rec_ptr, k_rec_ptr, slot, org, h, hk, offs_v, mv, offs_k, mk,
                           H, HV, K, V, RING, 4)
        store_flush(ckpt_ptr, sc_ptr, sr_ptr, s_h, base, tile, ms, offs_v, mv, slot, h, seed, V, K, SCALED, SR,
                    INTERPRET)
    tl.store(pending_ptr + slot, 1, mask=(h + vb) == 0)


def launch_replay_spec(kern, slot_ids, inputs, out) -> None:
    """Launch one speculative verify of ``kern`` (a TritonGDNReplay) for all rows: the token-by-token kernel for
    T' <= 4 with the ``reduce`` readout, else the delta rule's window-tile kernel (``PER_CHANNEL_GATE`` false)."""
    dec = kern.decode
    if kern.readout != "reduce" or dec.window > 4:
        launch_tile_spec(kern, slot_ids, inputs, out)
        return
    R = slot_ids.shape[0]
    bv, nvb, nw = kern.launch_shape(R)
    _replay_spec_small_kernel[(R, kern.HV, nvb)](
        slot_ids, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], out, kern.A_log,
        kern.dt_bias, kern.states, kern.scales, kern.records["d"], kern.records["k"], kern.records["g"],
        kern.write_pos, kern.origin, kern.is_flush, kern.pending, kern.sr_count, kern.seed, kern.num_slots,
        H=kern.H, HV=kern.HV, K=kern.K, V=kern.V, T=dec.window, RING=dec.ring_rows, SCALE=kern.K ** -0.5,
        BK=kern.BK, BV=bv, BH=triton.next_power_of_2(dec.buffer), SCALED=kern.scaled, SR=kern.sr,
        INTERPRET=kern.interpret, num_warps=nw)


__all__ = ["launch_replay_spec", "launch_replay_spec_commit"]
