"""The committed history of a delta-rule replay with one log gate per key channel (KDA's records ``d [V]``,
``k [K]``, ``g [K]``), in Triton: the records' decay-weighted keys, the history walked back one ``[K]`` row at a
time, the readout of the state before a token without building it, and the flush's fold (``PER_CHANNEL_GATE``
true in the shared replay kernels, ``replay_decode.py`` and ``replay_spec.py``, and KDA's two-launch paths).

Replay algebra with per-channel decays (``G_j`` the inclusive per-channel cumsum of the history's ``g`` in fp32,
``G = G_{w-1}`` its total):

    S_prev = S_0 Diag(e^G) + sum_j d_j (k_j * e^(G - G_j))^T
    S_prev x = S_0 (e^G * x) + sum_j [(k_j * e^(G - G_j)) . x] d_j

so the history weights ``e^(G - G_j)`` are a ``[history, K]`` tile where one gate per value head has a vector,
and the readout vector of the checkpoint is channel-scaled.

Oracle: the family's literal model ``literal-replay`` (``replayssm.ops.kda.literal``: same records, same fold).
Expected error: fp32 sums in another order than the literal model's fp64 (a few ulp of the state's scale).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_history(d_rec_ptr, k_rec_ptr, g_rec_ptr, slot, rows, mrow, mj, h, hk, offs_v, mv, offs_k, mk,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RING: tl.constexpr):
    """Records at ring ``rows`` [BH]: d [BH, BV] (fp32), the decay-weighted keys
    ``KW_j = k_j * e^(G - G_j)`` [BH, BK] (fp32) and the checkpoint's decay ``e^G`` [BK].  Rows past
    the history (``mj`` false) are zeroed with ``where`` before any sum (stale rows may hold
    anything, even non-finite values)."""
    srow = slot * RING + rows
    KW, eG = decay_weighted_keys(k_rec_ptr, g_rec_ptr, srow, mrow, mj, h, hk, offs_k, mk, H, HV, K)
    Dh = tl.load(d_rec_ptr + (srow[:, None] * HV + h) * V + offs_v[None, :],
                 mask=mrow[:, None] & mv[None, :], other=0.0).to(tl.float32)
    return tl.where(mj[:, None], Dh, 0.0), KW, eG


@triton.jit
def decay_weighted_keys(k_rec_ptr, g_rec_ptr, srow, mload, mj, h, hk, offs_k, mk,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr):
    """The history's decay-weighted keys ``KW_j = k_j * e^(G - G_j)`` [JB, BK] (fp32) and its decay
    ``e^G`` [BK], from the k and per-channel g records at record rows ``srow`` (loaded where
    ``mload``; rows past the history, ``mj`` false, are zeroed with ``where`` before any sum)."""
    mjk = mj[:, None] & mk[None, :]
    ml = mload[:, None] & mk[None, :]
    gj = tl.where(mjk, tl.load(g_rec_ptr + (srow[:, None] * HV + h) * K + offs_k[None, :], mask=ml, other=0.0), 0.0)
    Gt = tl.sum(gj, 0)
    Kh = tl.load(k_rec_ptr + (srow[:, None] * H + hk) * K + offs_k[None, :], mask=ml, other=0.0).to(tl.float32)
    return tl.where(mjk, Kh, 0.0) * tl.where(mjk, tl.exp(Gt[None, :] - tl.cumsum(gj, 0)), 0.0), tl.exp(Gt)


@triton.jit
def history_row_back(k_rec_ptr, g_rec_ptr, slot, org, w, jj, S, h, hk, offs_k, mk,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, RING: tl.constexpr, RINGED: tl.constexpr):
    """Record ``w - 1 - jj`` of a slot's history, counted back from its last (row
    ``(org + w - 1 - jj) mod RING`` of a speculative ring with ``RINGED``, else row ``w - 1 - jj``
    of a standard buffer, ``org`` unused): the record's index, a ``[BK]`` mask (false past the history:
    the loads are zeros there, never the stale rows; the interpreter takes no scalar mask), its log
    gates ``g_j`` and its decay-weighted key ``k_j e^S``, with ``S`` the per-channel sum of the log
    gates after it (the caller adds ``g_j`` for the next record back)."""
    live = (offs_k * 0 + jj) < w
    jr = tl.maximum(w - 1 - jj, 0)
    if RINGED:
        row = slot * RING + (org + jr) % RING
    else:
        row = slot * RING + jr
    gj = tl.load(g_rec_ptr + (row * HV + h) * K + offs_k, mask=mk & live, other=0.0)
    kw = tl.load(k_rec_ptr + (row * H + hk) * K + offs_k, mask=mk & live, other=0.0).to(tl.float32) * tl.exp(S)
    return jr, live, gj, kw


@triton.jit
def history_coefficients(k_rec_ptr, g_rec_ptr, slot, w, h, hk, offs_k, mk, ak, aq, wf_ptr, wf_mask, alpha,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, L: tl.constexpr, BK: tl.constexpr,
                         JB: tl.constexpr, HU: tl.constexpr, STORE_WF: tl.constexpr):
    """A standard-decode step's history coefficients, the history walked from its last record back
    one ``[K]`` row at a time (HU records per trip, their loads independent; no ``[history, K]``
    tile: its cumsum and sums over both axes made the pre-pass L1-bound on the H200 at batch 512):
    ``ck[j] = KW_j . ak`` and ``cq[j] = KW_j . aq`` ``[JB]``
    (zero past the history) with ``KW_j = k_j e^S``, and ``S`` ``[BK]``, the sum of all the
    history's log gates (fp32, summed from the last record back: ``e^G = e^S``).  With
    ``STORE_WF`` the flush's weighted keys ``alpha KW_j`` go to ``wf_ptr`` rows j where ``wf_mask``."""
    jv = tl.arange(0, JB)
    ck = tl.zeros([JB], dtype=tl.float32)
    cq = tl.zeros([JB], dtype=tl.float32)
    S = tl.zeros([BK], dtype=tl.float32)
    for jq in range(0, (w + HU - 1) // HU):
        for u in tl.static_range(HU):
            jj = jq * HU + u
            jr, live, gj, kw = history_row_back(k_rec_ptr, g_rec_ptr, slot, 0, w, jj, S, h, hk, offs_k, mk, H, HV, K,
                                                L, False)
            hit = (jv == jr) & ((jv * 0 + jj) < w)
            ck = tl.where(hit, tl.sum(kw * ak, 0), ck)
            cq = tl.where(hit, tl.sum(kw * aq, 0), cq)
            if STORE_WF:
                tl.store(wf_ptr + jr * BK + offs_k, alpha * kw, mask=wf_mask & live)
            S += gj
    return ck, cq, S


@triton.jit
def readout(s0, eG, Dh, KW, x):
    """S_prev x [BV] for S_prev = s0 Diag(eG) + sum_j d_j KW_j^T, without building S_prev."""
    c = tl.sum(KW * x[None, :], 1)
    return tl.sum(s0 * (eG * x)[None, :], 1) + tl.sum(Dh * c[:, None], 0)


@triton.jit
def fold_history(s0, eG, KW, offs_j, w, d_rec_ptr, slot, origin, h, offs_v, mv,
                 HV: tl.constexpr, V: tl.constexpr, RING: tl.constexpr):
    """S_prev = s0 Diag(eG) + sum_{j < w} d_j KW_j^T in fp32, one rank-1 update per record (the
    weighted key row taken from the tile, d reloaded: only on a flush)."""
    s = s0 * eG[None, :]
    for j in range(0, w):
        srow = slot * RING + ((origin + j) % RING)
        dj = tl.load(d_rec_ptr + (srow * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        kw = tl.sum(tl.where((offs_j == j)[:, None], KW, 0.0), 0)
        s += dj[:, None] * kw[None, :]
    return s


__all__ = ["decay_weighted_keys", "fold_history", "history_coefficients", "history_row_back", "load_history",
           "readout"]
