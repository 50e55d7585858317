"""Broken KDA kernels: slips only a per-key-channel gate allows, each one bug in the literal math.

Oracle: each mixin is :class:`~replayssm.ops.kda.literal.KDALiteralReplay` with its ``math`` replaced
by :class:`~replayssm.ops.kda.literal.KDAMath` with exactly one method wrong; the validation engine
must fail each (tests/ops/kda/test_kda.py runs each on a named scenario; the gallery fuzzes them,
tests/jobs/test_mutation_gallery.py).  The family lists them in ``KimiDeltaAttention.mutants``; the
mutant registry registers them (``validators/engine/mutants/family_mutants.py``).

* :class:`GateOnValueAxis`: the history fold applies the per-channel decay along the value axis
  (the gate vector loaded with the value offsets, masked to the key dimension: value row v decays
  by channel v's gate, rows past K not at all) instead of along the key axis;
* :class:`ScalarGate`: a scalar gate where a vector is declared (channel 0's gate read with a zero
  stride for every channel: Gated DeltaNet's gate);
* :class:`LogGateSumsBf16`: the fold's cumulative sums of the log gates are kept in bf16 (each
  partial sum rounded) instead of fp32;
* :class:`SolveWithoutBeta`: the in-window WY/UT solve drops ``beta_i`` from the off-diagonal
  (Gated DeltaNet's slip of the same name, on KDA's per-channel solve).
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.kda.literal import KDAMath, _dot, kda_window_solve


def _on_value_axis(g: torch.Tensor, nv: int) -> torch.Tensor:
    """``g [..., K]`` read at the value offsets ``0..V-1`` with the mask ``< K`` (log gate 0 past K)."""
    K = g.shape[-1]
    if nv <= K:
        return g[..., :nv]
    return torch.cat([g, torch.zeros((*g.shape[:-1], nv - K), dtype=g.dtype, device=g.device)], dim=-1)


class _GateOnValueAxisMath(KDAMath):
    def fold(self, s0, hist, params, mode):
        g = hist["g"]
        if g.shape[0] == 0:
            return s0
        total, w = self.decays(_on_value_axis(g, s0.shape[-2]))  # [HV, V], [n, HV, V]
        kh = hist["k"].repeat_interleave(s0.shape[0] // hist["k"].shape[-2], dim=-2)
        return total[:, :, None] * s0 + torch.einsum("jhv,jhv,jhc->hvc", w, hist["d"], kh)


class _ScalarGateMath(KDAMath):
    def gates(self, win, params, conv=DEFAULT):
        g, beta = super().gates(win, params, conv)
        return g[..., :1].expand_as(g).clone(), beta


def _cumsum_bf16(g: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros_like(g[0]).to(torch.bfloat16)
    out = []
    for j in range(g.shape[0]):
        acc = (acc.to(g.dtype) + g[j]).to(torch.bfloat16)
        out.append(acc.to(g.dtype))
    return torch.stack(out)


class _LogGateSumsBf16Math(KDAMath):
    def decays(self, g):
        G = _cumsum_bf16(g)
        return torch.exp(G[-1]), torch.exp(G[-1] - G)


class _SolveWithoutBetaMath(KDAMath):
    def solve(self, s_h, qh, kh, v, g, beta, mode):
        # The bug: d_i = R_i - sum_j A_ij d_j with A_ij = (k_i . exp(G_i - G_j) k_j), beta_i dropped: the
        # solve with beta = 1 on values v' whose residual v' - S k_i is R_i = beta_i (v_i - S k_i).
        sk = (_dot(s_h, mode)[None] * _dot(torch.exp(torch.cumsum(g, dim=0)) * kh, mode)[:, :, None, :]).sum(-1)
        b = beta[..., None]
        return kda_window_solve(s_h, qh, kh, b * v + (1 - b) * sk, g, torch.ones_like(beta), mode)


class GateOnValueAxis:
    """The history fold decays value row v by channel v's gate (the gate broadcast over the wrong
    axis of the state tile), instead of key column c by channel c's."""

    math = _GateOnValueAxisMath()


class ScalarGate:
    """One gate per head (channel 0's, read with a zero stride) where a per-channel vector is declared."""

    math = _ScalarGateMath()


class SolveWithoutBeta:
    """Speculative verify: the in-window solve drops beta_i from the off-diagonal, so every draft
    position after the first is wrong (T' >= 2)."""

    math = _SolveWithoutBetaMath()


class LogGateSumsBf16:
    """The fold's cumulative sums of the per-channel log gates rounded to bf16 at every token."""

    math = _LogGateSumsBf16Math()
