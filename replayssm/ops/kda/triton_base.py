"""Storage, cursors and inspection of the KDA Triton kernels, and their jitted gate and history
helpers (rounding: ``replayssm.ops.triton.rounding``).

KDA is the delta rule with a per-key-channel gate (``naive.py``): per value head the state
``S [V, K]`` decays column by column, ``S <- S Diag(alpha)`` with ``alpha = exp(g)``, ``g [K]``.
The state storage, the device cursors, the reset and the host-side checks are those of the Gated
DeltaNet kernels (same ``[slots, positions, HV, V, K]`` layout, same cursor rules, same
options): :class:`TritonKDABase` is ``replayssm.ops.delta_rule.triton_base.TritonDeltaRuleBase`` and changes
what is family-specific: the per-channel gate parameters and the fp64 fold of the records.

Oracle: the literal models of ``replayssm.ops.kda.literal`` (same records, same cursor rules of
``DecodeConfig``; gates and the L2 norm as written in ``naive.py``).  Expected error: none for the
storage; ``committed_state`` folds the stored checkpoint and records in fp64 through the literal
model's own fold; gates and norms are fp32 (a few ulp, from the GPU's exp/log).

Replay algebra with per-channel decays (records ``d_j [V]``, ``k_j [K]``, ``g_j [K]``; ``G_j`` the
inclusive per-channel cumsum of the history's ``g`` in fp32, ``G = G_{w-1}`` its total):

    S_prev = S_0 Diag(e^G) + sum_j d_j (k_j * e^(G - G_j))^T
    S_prev x = S_0 (e^G * x) + sum_j [(k_j * e^(G - G_j)) . x] d_j

so the history weights ``e^(G - G_j)`` are a ``[history, K]`` tile where Gated DeltaNet has a
vector, and the readout vector of the checkpoint is channel-scaled.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import TritonDeltaRuleBase
from replayssm.ops.kda.literal import KDAMath
from replayssm.ops.triton.rounding import load_state


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


@triton.jit
def stream_tile(ckpt_ptr, sc_ptr, d_rec_ptr, base, rows, hist, vb, h, offs_k, mk,
                HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, SCALED: tl.constexpr):
    """A two-launch stream's tile ``vb`` of value rows: its indices and masks, the checkpoint tile
    ``s0 [BV, BK]`` (fp32) and the committed d records at record ``rows`` ``[JB, BV]`` (zero past
    the history: ``hist`` false)."""
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    ms = mv[:, None] & mk[None, :]
    tile = offs_v[:, None] * K + offs_k[None, :]
    s0 = load_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
    Dh = tl.load(d_rec_ptr + (rows[:, None] * HV + h) * V + offs_v[None, :], mask=hist[:, None] & mv[None, :],
                 other=0.0).to(tl.float32)
    return offs_v, mv, ms, tile, s0, Dh


@triton.jit
def fold_weighted(s, d_rec_ptr, wf_ptr, slot, origin, w, h, offs_v, mv, offs_k,
                  HV: tl.constexpr, V: tl.constexpr, RING: tl.constexpr, BK: tl.constexpr, JB: tl.constexpr,
                  FU: tl.constexpr):
    """``s + sum_{j < w} d_j WF_j^T`` with the pre-pass's weighted keys ``WF [JB, BK]`` at ``wf_ptr``
    and the d records at rows ``(origin + j) mod RING``: rank-1 updates, FU records per trip (their
    loads independent: one memory round trip per FU records).  The update sits in a ``where``: one FMA per
    element without it made the speculative stream slower on an H200 at batch 512 (non-flush and flush
    verifies alike), though the standard pair's flush was faster (unrecorded)."""
    for jq in range(0, (w + FU - 1) // FU):
        for ju in tl.static_range(FU):
            jj = jq * FU + ju
            live = jj < w
            dj = tl.load(d_rec_ptr + ((slot * RING + (origin + jj) % RING) * HV + h) * V + offs_v,
                         mask=mv & ((offs_v * 0 + jj) < w), other=0.0).to(tl.float32)
            wf = tl.load(wf_ptr + tl.minimum(jj, JB - 1) * BK + offs_k, mask=(offs_k * 0 + jj) < w, other=0.0)
            s += tl.where(live, dj[:, None] * wf[None, :], 0.0)
    return s


class TritonKDABase(TritonDeltaRuleBase):
    """Common part of the KDA Triton kernels (not registered itself): the delta-rule kernels' storage and
    cursors with KDA's per-channel gate parameters ``A_log [HV]``, ``dt_bias [HV, K]``
    (their shapes are checked by ``KernelConfig`` against the geometry's ``param_shapes``).  They
    compute the softplus gate law only (``replayssm.ops.delta_rule.triton_base.gates``): a config whose
    conventions carry the bounded law (``gate_lower_bound``, replayssm/conventions.py) is refused before any work."""

    family = "kda"
    PER_CHANNEL_GATE = True

    def __init__(self, config) -> None:
        lb = config.conventions.gate_lower_bound
        if lb is not None:
            raise ValueError(f"conventions: kernel {self.name!r} computes the gate -exp(A_log) softplus(a + dt_bias) "
                             f"only, not the bounded law gate_lower_bound={lb!r} (lb * sigmoid(exp(A_log) "
                             f"(a + dt_bias)))")
        super().__init__(config)


def fold_fp64(s0: torch.Tensor, hist: dict[str, torch.Tensor]) -> torch.Tensor:
    """The state after folding records ``hist`` (d, k, g) into ``s0``, in fp64 (the literal model's fold)."""
    return KDAMath().fold(s0, {k: v.to(torch.float64) for k, v in hist.items()}, None, None)


__all__ = ["TritonKDABase", "decay_weighted_keys", "fold_fp64", "fold_history", "fold_weighted", "history_coefficients",
           "history_row_back", "load_history", "readout", "stream_tile"]
