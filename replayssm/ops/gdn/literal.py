"""Gated DeltaNet ReplaySSM, literally: the in-window solve and the literal replay and baseline models.

Oracle: docs/recurrences.md section 2 (replay records d, normalised k, g) and the in-window WY/UT solve of
section 4, read line by line, over the bookkeeping of ``replayssm/ops/literal.py``; the baseline
step is ``naive.gdn_step``.

* :func:`gdn_window_solve`: the causal in-window solve ``d = (I + A)^-1 R`` and the window
  outputs, from the state before the window; :func:`gdn_window_solve_rows` its row-batched twin.
* :class:`GDNLiteralReplay` ("literal-replay") and :class:`GDNLiteralBaseline`
  ("literal-baseline"): literal models of the kernel interface.

Expected error: at s64a64 the replay model equals the fp64 recurrence to ~1e-12 relative.
"""

from __future__ import annotations

import torch

from replayssm.ops.delta_rule.literal import CumprodDecays, DeltaRuleMath, _dot
from replayssm.ops.gdn.naive import gdn_gates, gdn_step
from replayssm.ops.literal import LiteralBaselineKernel, LiteralReplayKernel
from replayssm.precision import PrecisionMode
from replayssm.registry import register


def gdn_window_solve(s_h, qh, kh, v, g, beta, mode: PrecisionMode | None = None):
    """The in-window WY/UT form (docs/recurrences.md section 3) for one row.

    ``s_h [HV, V, K]`` state before the window; per window token ``qh, kh [T, HV, K]``,
    ``v [T, HV, V]``, ``g, beta [T, HV]``.  With G the inclusive cumsum of g:
    ``R_i = beta_i (v_i - exp(G_i) S_h k_i)``, ``A_ij = beta_i exp(G_i - G_j) (k_i . k_j)`` (i > j),
    ``d = (I + A)^-1 R`` by forward substitution, and
    ``o_s = exp(G_s) S_h q_s + sum_{j<=s} exp(G_s - G_j) (k_j . q_s) d_j``.
    Returns ``(o [T, HV, V], d [T, HV, V])``."""
    T = qh.shape[0]
    G = torch.cumsum(g, dim=0)  # [T, HV]
    eG = torch.exp(G)
    s_h_dot = _dot(s_h, mode)
    sk = (s_h_dot[None] * _dot(kh, mode)[:, :, None, :]).sum(-1)  # [T, HV, V]
    R = beta[..., None] * (v - eG[..., None] * sk)
    kk = torch.einsum("ihk,jhk->hij", kh, kh)  # [HV, T, T]
    decay = torch.exp(G.T[:, :, None] - G.T[:, None, :])  # [HV, i, j] = exp(G_i - G_j)
    d = []
    for i in range(T):
        acc = R[i]
        for j in range(i):
            acc = acc - (beta[i] * decay[:, i, j] * kk[:, i, j])[:, None] * d[j]
        d.append(acc)
    d = torch.stack(d)  # [T, HV, V]
    sq = (s_h_dot[None] * _dot(qh, mode)[:, :, None, :]).sum(-1)  # [T, HV, V]
    kq = torch.einsum("jhk,shk->hsj", kh, qh)  # [HV, s, j]
    outs = []
    for s in range(T):
        o = eG[s][:, None] * sq[s]
        for j in range(s + 1):
            o = o + (decay[:, s, j] * kq[:, s, j])[:, None] * d[j]
        outs.append(o)
    return torch.stack(outs), d


def gdn_window_solve_rows(s_h, qh, kh, v, g, beta, mode: PrecisionMode | None = None):
    """:func:`gdn_window_solve` of ``R`` rows at once (every argument and result with a leading
    row axis), the same arithmetic bit for bit (tests/core/test_literal_rows.py)."""
    T = qh.shape[1]
    G = torch.cumsum(g, dim=1)  # [R, T, HV]
    eG = torch.exp(G)
    s_h_dot = _dot(s_h, mode)
    sk = (s_h_dot[:, None] * _dot(kh, mode)[:, :, :, None, :]).sum(-1)  # [R, T, HV, V]
    Rm = beta[..., None] * (v - eG[..., None] * sk)
    kk = torch.einsum("rihk,rjhk->rhij", kh, kh)  # [R, HV, T, T]
    Gt = G.transpose(1, 2)  # [R, HV, T]
    decay = torch.exp(Gt[:, :, :, None] - Gt[:, :, None, :])  # [R, HV, i, j]
    d = []
    for i in range(T):
        acc = Rm[:, i]
        for j in range(i):
            acc = acc - (beta[:, i] * decay[:, :, i, j] * kk[:, :, i, j])[:, :, None] * d[j]
        d.append(acc)
    d = torch.stack(d, dim=1)  # [R, T, HV, V]
    sq = (s_h_dot[:, None] * _dot(qh, mode)[:, :, :, None, :]).sum(-1)
    kq = torch.einsum("rjhk,rshk->rhsj", kh, qh)  # [R, HV, s, j]
    outs = []
    for s in range(T):
        o = eG[:, s][:, :, None] * sq[:, s]
        for j in range(s + 1):
            o = o + (decay[:, :, s, j] * kq[:, :, s, j])[:, :, None] * d[:, j]
        outs.append(o)
    return torch.stack(outs, dim=1), d


class GDNMath(DeltaRuleMath):
    """Replay arithmetic (``DeltaRuleMath``, one gate per value head): records d and normalised k in the
    activation dtype, g in compute dtype.

    The fold's decay weights are one method (:meth:`decays`) and the in-window solve another
    (:meth:`solve`), the places real kernels differ: the variants below do them other ways."""

    gates_fn = staticmethod(gdn_gates)
    step_fn = staticmethod(gdn_step)
    solve_rows = staticmethod(gdn_window_solve_rows)

    def solve(self, s_h, qh, kh, v, g, beta, mode):
        """The window's outputs and d records from the state before the window."""
        return gdn_window_solve(s_h, qh, kh, v, g, beta, mode)

    # the row-batched twin of fold / window is the delta rule's, owned here (FamilyMath.rows_batchable)
    batches_rows = True
    fold_rows = DeltaRuleMath.fold_rows
    window_rows = DeltaRuleMath.window_rows

    def rows_batchable(self):
        # a mutant replaces the module's per-row solve (validators/engine/mutants/arithmetic.py)
        return super().rows_batchable() and gdn_window_solve is _SOLVE

    def error_coefficients(self, tok, params, heads):
        """The running-error model of one token (fp64, all rows), as ``fp64_bound.norm_terms`` reads
        it, norms being the largest row 2-norm of a head's state ``[V, K]`` (>= its max |S|): per
        value head, the factor an existing error is scaled by, ``rho = exp(g)`` (``I - beta k k^T``
        has 2-norm <= 1 for unit k and beta in [0, 1]), the token's part of the bound on the new
        state's norm (``rho |S| + c``, ``c = beta max|v|``), and the magnitude of the contributions
        built from records rounded to the activation format, ``p (q + rho |S|)`` (d and the
        normalised k: ``2 max|d| <= 2 beta (max|v| + exp(g) |S|)``, so ``p = 2 beta``, ``q = max|v|``).
        State-free: a chunk's tokens can be given at once."""
        g, beta = gdn_gates(tok["a"], tok["b"], params["A_log"], params["dt_bias"])  # [R, HV]
        vmax = tok["v"].abs().amax(-1)
        vmax = vmax.repeat_interleave(heads // vmax.shape[-1], dim=-1) if vmax.shape[-1] != heads else vmax
        return {"rho": torch.exp(g), "c": beta * vmax, "p": 2 * beta, "q": vmax}


class GDNMathCumprod(CumprodDecays, GDNMath):
    """Fold weights as running products of the per-token decays exp(g_j) (fp32)."""


class GDNMathRecurrentWindow(GDNMath):
    """The in-window solve by stepping the delta rule token by token from the state before the
    window (no WY/UT form): ``d_t = beta_t (v_t - exp(g_t) S_{t-1} k_t)``,
    ``S_t = exp(g_t) S_{t-1} + d_t k_t^T``, ``o_t = S_t q_t``."""

    def solve(self, s_h, qh, kh, v, g, beta, mode):
        S, outs, ds = s_h, [], []
        for t in range(qh.shape[0]):
            a = torch.exp(g[t])
            sk = (_dot(S, mode) * _dot(kh[t], mode)[:, None, :]).sum(-1)
            d = beta[t][:, None] * (v[t] - a[:, None] * sk)
            S = a[:, None, None] * S + d[:, :, None] * kh[t][:, None, :]
            outs.append((_dot(S, mode) * _dot(qh[t], mode)[:, None, :]).sum(-1))
            ds.append(d)
        return torch.stack(outs), torch.stack(ds)


_SOLVE = gdn_window_solve  # the per-row solve this module defines (see GDNMath.rows_batchable)
_MATH = GDNMath()


@register
class GDNLiteralReplay(LiteralReplayKernel):
    name = "literal-replay"
    family = "gdn"
    description = "literal ReplaySSM model: records d, normalised k, g; WY/UT in-window solve"
    math = _MATH


@register
class GDNLiteralBaseline(LiteralBaselineKernel):
    name = "literal-baseline"
    family = "gdn"
    description = "literal baseline: state read and written every token; one state per draft position"
    math = _MATH


@register
class GDNReplayCumprod(LiteralReplayKernel):
    name = "literal-replay-cumprod"
    family = "gdn"
    description = "legitimate variant: fold weights as running products of exp(g) (fp32)"
    math = GDNMathCumprod()



@register
class GDNReplayRecurrentWindow(LiteralReplayKernel):
    name = "literal-replay-recurrent"
    family = "gdn"
    description = "legitimate variant: in-window solve by stepping the delta rule (no WY/UT form)"
    math = GDNMathRecurrentWindow()
