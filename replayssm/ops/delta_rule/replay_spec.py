"""The speculative replay verify's shared parts for a delta-rule family, in Triton: the window prologue (the
window's normalised q, k, its v and gates, their cumulative sum), the checkpoint and cursors, the window's
outputs and records (``PER_CHANNEL_GATE``: one log gate per value head, or one per key channel), and the
device-side commit, which is family-independent.

Commit, one program per block of rows, on the device: ``k`` accepted; flush slot:
``origin += write_pos (mod ring), write_pos = k``; else ``write_pos += k``; then
``is_flush = write_pos + 2 T' > B + T'`` (flush one window early).

Oracle: each family's ``literal-replay`` (its window solve and the cursor rules of ``DecodeConfig``).
Expected error: none for the cursors and the loads and stores; normalisation and gates fp32 (a few ulp).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import gates, l2_normalise
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


__all__ = ["checkpoint_cursors", "launch_replay_spec_commit", "store_flush", "store_window", "window_inputs"]
