"""Broken Gated DeltaNet kernels: slips of GDN's own arithmetic, each one bug in the literal math.

Oracle: each mixin is :class:`~replayssm.ops.gdn.literal.GDNLiteralReplay` with its ``math`` replaced
by :class:`~replayssm.ops.gdn.literal.GDNMath` with exactly one method wrong; the validation engine
must fail each (the gallery fuzzes them, tests/jobs/test_mutation_gallery.py).  The family lists them in
``GatedDeltaNet.mutants``; the mutant registry registers them (``validators/engine/mutants/family_mutants.py``).

* :class:`SolveWithoutBeta`: the in-window WY/UT solve builds ``A_ij = exp(G_i - G_j) (k_i . k_j)``
  without ``beta_i`` (speculative verify, every draft position after the first wrong).
"""

from __future__ import annotations

import torch

from replayssm.ops.gdn.literal import GDNMath


def _solve_without_offdiag_beta(s_h, qh, kh, v, g, beta):
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


class _SolveWithoutBetaMath(GDNMath):
    def solve(self, s_h, qh, kh, v, g, beta, mode):
        return _solve_without_offdiag_beta(s_h, qh, kh, v, g, beta)


class SolveWithoutBeta:
    """Speculative verify: the in-window solve builds A_ij = exp(G_i - G_j) (k_i . k_j) without
    beta_i, so every draft position after the first is wrong (T' >= 2)."""

    math = _SolveWithoutBetaMath()
