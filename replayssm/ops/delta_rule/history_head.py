"""The committed history of a delta-rule replay with one log gate per value head (Gated DeltaNet's records
``d [V]``, ``k [K]``, ``g`` scalar), in Triton: the records' loads, their fold weights, the readout of the state
before a token without building it, and the flush's fold (``PER_CHANNEL_GATE`` false in the shared replay kernels,
``replay_decode.py`` and ``replay_spec.py``).

With ``w`` buffered records and ``G_j`` the inclusive cumsum of their ``g``:
``S_prev = exp(G_w) S_0 + sum_j exp(G_w - G_j) d_j k_j^T`` and
``S_prev x = exp(G_w) (S_0 x) + sum_j exp(G_w - G_j) (k_j . x) d_j``.

Oracle: the family's literal model ``literal-replay`` (``replayssm.ops.gdn.literal``: same records, same fold).
Expected error: fp32 sums in another order than the literal model's fp64 (a few ulp of the state's scale).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_keys(k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_k, mk,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, RING: tl.constexpr):
    """Records at ring ``rows``: k [BH, BK] (kept in the record dtype: half the registers for bf16),
    the fold weights exp(G_w - G_j) [BH] and exp(G_w).  All ``mrow`` rows are loaded (no wait for the
    cursor: the loads go out beside the checkpoint's); rows past the history (``mj`` false) are
    zeroed with ``where`` (stale rows may hold anything, even non-finite values)."""
    srow = slot * RING + rows
    gj = tl.where(mj, tl.load(g_rec_ptr + srow * HV + h, mask=mrow, other=0.0), 0.0)
    Gt = tl.sum(gj, 0)
    wj = tl.where(mj, tl.exp(Gt - tl.cumsum(gj, 0)), 0.0)
    Kh = tl.load(k_rec_ptr + (srow[:, None] * H + hk) * K + offs_k[None, :], mask=mrow[:, None] & mk[None, :],
                 other=0.0)
    return tl.where(mj[:, None], Kh, tl.zeros_like(Kh)), wj, tl.exp(Gt)


@triton.jit
def load_values(d_rec_ptr, slot, rows, mrow, mj, h, offs_v, mv, HV: tl.constexpr, V: tl.constexpr,
                RING: tl.constexpr):
    """Records at ring ``rows``: d [BH, BV] (fp32), zero past the history (``mj`` false)."""
    srow = slot * RING + rows
    Dh = tl.load(d_rec_ptr + (srow[:, None] * HV + h) * V + offs_v[None, :],
                 mask=mrow[:, None] & mv[None, :], other=0.0).to(tl.float32)
    return tl.where(mj[:, None], Dh, 0.0)


@triton.jit
def load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_v, mv, offs_k, mk,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RING: tl.constexpr):
    """Records at ring ``rows``: d [BH, BV] (fp32; :func:`load_values`), k [BH, BK], the fold weights
    and exp(G_w) (:func:`load_keys`)."""
    Kh, wj, eG = load_keys(k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_k, mk, H, HV, K, RING)
    return load_values(d_rec_ptr, slot, rows, mrow, mj, h, offs_v, mv, HV, V, RING), Kh, wj, eG


@triton.jit
def history_weights(Kh, wj, x):
    """The coefficients ``wj_j (k_j . x)`` [BH] of the history's readout of ``x``."""
    return wj * tl.sum(Kh.to(tl.float32) * x[None, :], 1)


@triton.jit
def readout(s0, eG, Dh, Kh, wj, x):
    """S_prev x [BV] for S_prev = eG s0 + sum_j wj_j d_j k_j^T, without building S_prev."""
    return readout_weighted(s0, eG, Dh, history_weights(Kh, wj, x), x)


@triton.jit
def readout_weighted(s0, eG, Dh, c, x):
    """:func:`readout` with the history's coefficients ``c`` (:func:`history_weights`) given."""
    return eG * tl.sum(s0 * x[None, :], 1) + tl.sum(Dh * c[:, None], 0)


@triton.jit
def fold_history(s0, eG, wj, offs_j, w, d_rec_ptr, k_rec_ptr, slot, origin, h, hk, offs_v, mv, offs_k, mk,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RING: tl.constexpr,
                 CH: tl.constexpr):
    """S_prev = eG s0 + sum_{j < w} wj_j d_j k_j^T in fp32, one rank-1 update per record, CH records
    per loop trip (their loads are independent: one memory round trip per CH records)."""
    s = eG * s0
    for c in range(0, (w + CH - 1) // CH):
        for i in tl.static_range(CH):
            j = c * CH + i
            srow = slot * RING + ((origin + j) % RING)
            dj = tl.load(d_rec_ptr + (srow * HV + h) * V + offs_v, mask=mv & ((offs_v * 0 + j) < w),
                         other=0.0).to(tl.float32)
            kj = tl.load(k_rec_ptr + (srow * H + hk) * K + offs_k, mask=mk & ((offs_k * 0 + j) < w),
                         other=0.0).to(tl.float32)
            wt = tl.sum(tl.where(offs_j == j, wj, 0.0), 0)
            s += (wt * dj)[:, None] * kj[None, :]
    return s


__all__ = ["fold_history", "history_weights", "load_history", "load_keys", "load_values", "readout",
           "readout_weighted"]
