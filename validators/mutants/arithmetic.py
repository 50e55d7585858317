"""Arithmetic mutants of the gallery: a wrong formula in the literal math, one each.

Oracle: each mutant is a literal model (``replayssm/ops/*/literal.py``) plus exactly one deliberate
bug in its arithmetic (prefix sums, head mapping, softplus, the GDN in-window solve); the
tolerance rule on states and outputs must catch it.
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.gdn import literal as gdn_literal
from replayssm.ops.gdn import naive as gdn_naive
from replayssm.ops.literal import WindowResult
from replayssm.ops.mamba2 import literal as mamba2_literal
from replayssm.validators.mutants._common import DelegatingMath, WrapMath, patched
from replayssm.validators.mutants.registry import register_mutant

SPEC_ONLY = ("speculative",)

class _ExclusiveCumsumMath(DelegatingMath):
    """fold with an exclusive prefix sum of the log decays (Mamba-2 Δ, GDN g)."""

    def fold(self, s0, hist, params, mode):
        key = "dt" if "dt" in hist else "g"
        dec = hist[key]
        if dec.shape[0] == 0:
            return s0
        # The bug: c_j = sum_{i < j} instead of sum_{i <= j}.
        excl = torch.cumsum(dec, dim=0) - dec
        total = excl[-1]
        if key == "dt":
            A = params["A"]
            w = dec * torch.exp(A * (total - excl))
            Bh = mamba2_literal._per_head(hist["B"], s0.shape[0])
            return torch.exp(A * total)[:, None, None] * s0 + torch.einsum("jh,jhp,jhn->hpn", w, hist["x"], Bh)
        w = torch.exp(total - excl)
        kh = hist["k"].repeat_interleave(s0.shape[0] // hist["k"].shape[-2], dim=-2)
        return torch.exp(total)[:, None, None] * s0 + torch.einsum("jh,jhv,jhk->hvk", w, hist["d"], kh)


class ExclusiveCumsum(WrapMath):
    """The history fold decays with an exclusive instead of inclusive prefix sum (flush checkpoint
    and committed state wrong; window outputs, computed separately, right)."""

    math_wrapper = _ExclusiveCumsumMath


def _tile_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, N] -> [..., heads, N] with head h using group h % G (the bug: tiling, not interleaving)."""
    reps = [1] * t.dim()
    reps[-2] = heads // t.shape[-2]
    return t.repeat(*reps)


class _TiledHeadsMath(DelegatingMath):
    """Head h reads group (or key head) h % G instead of h // (H / G)."""

    def _expand(self, s0, d: dict, names) -> dict:
        return {k: (_tile_heads(v, s0.shape[0]) if k in names else v) for k, v in d.items()}

    def fold(self, s0, hist, params, mode):
        names = ("B",) if "B" in hist else ("k",)
        return self.inner.fold(s0, self._expand(s0, hist, names), params, mode)

    def window(self, s0, hist, win, params, mode, options):
        mamba = "B" in win
        res = self.inner.window(s0, self._expand(s0, hist, ("B",) if mamba else ("k",)),
                                self._expand(s0, win, ("B", "C") if mamba else ("q", "k")), params, mode, options)
        records = dict(res.records)
        if mamba:
            records["B"] = win["B"]
        else:
            records["k"] = gdn_naive.l2norm(win["k"])
        return WindowResult(res.outputs, records, self.fold(s0, hist, params, mode), res.state_after_first)


class TiledHeadGroups(WrapMath):
    """Wrong head-to-group mapping: head h uses group h % G (Mamba-2 B, C) or key head h % H
    (GDN q, k) instead of h // (H / G)."""

    math_wrapper = _TiledHeadsMath


class DtBiasTwice:
    """dt_bias is added twice before the softplus (once by the caller, once in the kernel)."""

    def __init__(self, config):
        super().__init__(config)
        self.params = {**self.params, "dt_bias": 2 * self.params["dt_bias"]}


class _SoftplusThresholdMath(DelegatingMath):
    def window(self, s0, hist, win, params, mode, options, conv=DEFAULT):
        # The bug: the window computes with threshold 2 while the kernel declares the default 20.
        return self.inner.window(s0, hist, win, params, mode, options,
                                 conv=dataclasses.replace(conv, softplus_threshold=2.0))


class SoftplusThreshold(WrapMath):
    """softplus switches to the identity for u > 2 instead of u > 20 (a threshold typed for a
    different dtype, undeclared): Δ / the gate is off by log1p(exp(-u)) for 2 < u <= 20."""

    math_wrapper = _SoftplusThresholdMath


class _NoBetaSolveMath(DelegatingMath):
    """GDN: the in-window WY/UT solve drops beta_i from the off-diagonal A_ij."""

    def window(self, s0, hist, win, params, mode, options):
        with patched(gdn_literal, "gdn_window_solve", _solve_without_offdiag_beta):
            return self.inner.window(s0, hist, win, params, mode, options)


class SolveWithoutBeta(WrapMath):
    """GDN speculative verify: the in-window solve builds A_ij = exp(G_i - G_j) (k_i . k_j) without
    beta_i, so every draft position after the first is wrong (T' >= 2)."""

    math_wrapper = _NoBetaSolveMath


def _solve_without_offdiag_beta(s_h, qh, kh, v, g, beta, mode=None):
    """gdn_window_solve with A_ij = exp(G_i - G_j) (k_i . k_j): beta only in R (the bug)."""
    T = qh.shape[0]
    G = torch.cumsum(g, dim=0)
    eG = torch.exp(G)
    sk = (s_h[None] * kh[:, :, None, :]).sum(-1)
    R = beta[..., None] * (v - eG[..., None] * sk)
    kk = torch.einsum("ihk,jhk->hij", kh, kh)
    decay = torch.exp(G.T[:, :, None] - G.T[:, None, :])
    d = []
    for i in range(T):
        acc = R[i]
        for j in range(i):
            acc = acc - (decay[:, i, j] * kk[:, i, j])[:, None] * d[j]
        d.append(acc)
    d = torch.stack(d)
    sq = (s_h[None] * qh[:, :, None, :]).sum(-1)
    kq = torch.einsum("jhk,shk->hsj", kh, qh)
    outs = []
    for s in range(T):
        o = eG[s][:, None] * sq[s]
        for j in range(s + 1):
            o = o + (decay[:, s, j] * kq[:, s, j])[:, None] * d[j]
        outs.append(o)
    return torch.stack(outs), d


class _NoSkipMath(DelegatingMath):
    """Mamba-2 window outputs with D = 0 (the fold and the state never use D)."""

    def window(self, s0, hist, win, params, mode, options):
        return self.inner.window(s0, hist, win, {**params, "D": torch.zeros_like(params["D"])}, mode, options)


class ReadoutWithoutSkip(WrapMath):
    """Mamba-2 readout drops the skip term: y = C . S instead of C . S + D x (outputs wrong, the
    state and the checkpoint right)."""

    math_wrapper = _NoSkipMath


# ---- registration --------------------------------------------------------------------------------------
register_mutant(ExclusiveCumsum, "mutant-exclusive-cumsum",
                "history fold decays with an exclusive instead of inclusive prefix sum", klass="arithmetic")
register_mutant(TiledHeadGroups, "mutant-tiled-head-groups",
                "head h uses group h % G (tiled) instead of h // (H/G) (Mamba-2 B/C, GDN q/k)", klass="arithmetic")
register_mutant(DtBiasTwice, "mutant-dt-bias-twice", "dt_bias added twice before the softplus", klass="arithmetic")
register_mutant(SoftplusThreshold, "mutant-softplus-threshold",
                "softplus switches to the identity above 2 instead of 20", klass="arithmetic")
register_mutant(SolveWithoutBeta, "mutant-solve-without-beta",
                "GDN in-window WY/UT solve drops beta_i from the off-diagonal", klass="arithmetic", families=("gdn",),
     decodes=SPEC_ONLY)
register_mutant(ReadoutWithoutSkip, "mutant-readout-without-skip",
                "Mamba-2 readout drops the D x skip term (outputs wrong, state right)", klass="arithmetic",
                families=("mamba2",))

__all__: list[str] = []
