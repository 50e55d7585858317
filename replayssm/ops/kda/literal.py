"""Kimi Delta Attention ReplaySSM, literally: per-channel decays in the fold and the in-window solve.

Oracle: the ReplaySSM records of docs/recurrences.md section 2 (here d, normalised k and the per-channel log gate g)
and the in-window WY/UT solve of section 4 with the scalar decay of Gated DeltaNet replaced by a
vector over the key axis, read line by line, over the bookkeeping of ``replayssm/ops/literal.py``;
the baseline step is ``naive.kda_step``.  With ``G_j`` the inclusive cumulative sum (compute
dtype: fp32, fp64 for s64a64) of the recorded log gates, per key channel:

* fold: ``S = S_0 Diag(exp G_n) + sum_j d_j (exp(G_n - G_j) ⊙ k_j)ᵀ`` (``G_n`` the last);
* window, from the state ``S_h`` after the history: ``R_i = beta_i (v_i - S_h (exp G_i ⊙ k_i))``,
  ``A_ij = beta_i ((exp(G_i - G_j) ⊙ k_j) · k_i)`` (i > j), ``d = (I + A)^-1 R`` by forward
  substitution, ``o_s = S_h (exp G_s ⊙ q_s) + sum_{j<=s} ((exp(G_s - G_j) ⊙ k_j) · q_s) d_j``.

The decay between two records is a product over tokens per key channel, an elementwise exp of a
difference of fp32 sums of log gates: the place per-channel drift enters (tests/ops/kda/test_kda.py).

* :func:`kda_window_solve`: the in-window solve and the window outputs for one row;
  :func:`kda_window_solve_rows` its row-batched twin.
* :class:`KDALiteralReplay` ("literal-replay") and :class:`KDALiteralBaseline`
  ("literal-baseline"): literal models of the kernel interface;
* legitimate variants (other operation orders the tolerance rule must pass, tests/core/test_variants.py):
  ``literal-replay-cumprod`` (fold weights as running products of exp(g)) and
  ``literal-replay-recurrent`` (the window by stepping the recurrence).

Conventions: the window's q / k normalisation and gates and the baseline step follow ``conv`` (the
declared conventions of the kernel this model is the twin of, replayssm/conventions.py), as in
``naive.py``; the fold takes recorded values and has none.

Expected error: at s64a64 the replay model equals the fp64 recurrence to ~1e-12 relative.
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.delta_rule.literal import CumprodDecays, DeltaRuleMath, _dot
from replayssm.ops.kda.naive import kda_gates, kda_step
from replayssm.ops.literal import LiteralBaselineKernel, LiteralReplayKernel
from replayssm.precision import PrecisionMode
from replayssm.registry import register


def kda_window_solve(s_h, qh, kh, v, g, beta, mode: PrecisionMode | None = None):
    """The in-window WY/UT form with per-channel decays for one row.

    ``s_h [HV, V, K]`` state before the window; per window token ``qh, kh [T, HV, K]``,
    ``v [T, HV, V]``, ``g [T, HV, K]``, ``beta [T, HV]``.  Returns ``(o [T, HV, V], d [T, HV, V])``."""
    T = qh.shape[0]
    G = torch.cumsum(g, dim=0)  # [T, HV, K]
    eG = torch.exp(G)
    s_dot = _dot(s_h, mode)
    sk = (s_dot[None] * _dot(eG * kh, mode)[:, :, None, :]).sum(-1)  # [T, HV, V]
    R = beta[..., None] * (v - sk)
    causal = torch.ones(T, T, dtype=torch.bool, device=g.device).tril()[:, :, None, None]
    # [i, j, HV, K] = exp(G_i - G_j) for i >= j, 0 above the diagonal (where exp could overflow)
    decay = torch.where(causal, torch.exp(torch.where(causal, G[:, None] - G[None, :], 0.0)), 0.0)
    kk = torch.einsum("ijhc,jhc,ihc->hij", decay, kh, kh)  # [HV, i, j]
    d = []
    for i in range(T):
        acc = R[i]
        for j in range(i):
            acc = acc - (beta[i] * kk[:, i, j])[:, None] * d[j]
        d.append(acc)
    d = torch.stack(d)  # [T, HV, V]
    sq = (s_dot[None] * _dot(eG * qh, mode)[:, :, None, :]).sum(-1)  # [T, HV, V]
    kq = torch.einsum("sjhc,jhc,shc->hsj", decay, kh, qh)  # [HV, s, j]
    outs = []
    for s in range(T):
        o = sq[s]
        for j in range(s + 1):
            o = o + kq[:, s, j][:, None] * d[j]
        outs.append(o)
    return torch.stack(outs), d


def kda_window_solve_rows(s_h, qh, kh, v, g, beta, mode: PrecisionMode | None = None):
    """:func:`kda_window_solve` of ``R`` rows at once (every argument and result with a leading
    row axis), the same arithmetic bit for bit (tests/core/test_literal_rows.py)."""
    T = qh.shape[1]
    G = torch.cumsum(g, dim=1)  # [R, T, HV, K]
    eG = torch.exp(G)
    s_dot = _dot(s_h, mode)
    sk = (s_dot[:, None] * _dot(eG * kh, mode)[:, :, :, None, :]).sum(-1)  # [R, T, HV, V]
    Rm = beta[..., None] * (v - sk)
    causal = torch.ones(T, T, dtype=torch.bool, device=g.device).tril()[None, :, :, None, None]
    decay = torch.where(causal, torch.exp(torch.where(causal, G[:, :, None] - G[:, None, :], 0.0)), 0.0)
    kk = torch.einsum("rijhc,rjhc,rihc->rhij", decay, kh, kh)  # [R, HV, i, j]
    d = []
    for i in range(T):
        acc = Rm[:, i]
        for j in range(i):
            acc = acc - (beta[:, i] * kk[:, :, i, j])[:, :, None] * d[j]
        d.append(acc)
    d = torch.stack(d, dim=1)  # [R, T, HV, V]
    sq = (s_dot[:, None] * _dot(eG * qh, mode)[:, :, :, None, :]).sum(-1)
    kq = torch.einsum("rsjhc,rjhc,rshc->rhsj", decay, kh, qh)  # [R, HV, s, j]
    outs = []
    for s in range(T):
        o = sq[:, s]
        for j in range(s + 1):
            o = o + kq[:, :, s, j][:, :, None] * d[:, j]
        outs.append(o)
    return torch.stack(outs, dim=1), d


class KDAMath(DeltaRuleMath):
    """Replay arithmetic (``DeltaRuleMath`` with a per-channel gate): records d and normalised k in the
    activation dtype, the per-channel log gate g in the compute dtype.

    The gates (:meth:`gates`), the fold's decay weights (:meth:`decays`) and the in-window solve
    (:meth:`solve`) are one method each: the places a kernel (or a mutant) does them its own way."""

    per_channel_gate = True
    fold_terms = "jhc,jhv,jhc->hvc"
    gates_fn = staticmethod(kda_gates)
    step_fn = staticmethod(kda_step)
    solve_rows = staticmethod(kda_window_solve_rows)

    def solve(self, s_h, qh, kh, v, g, beta, mode):
        """The window's outputs and d records from the state before the window."""
        return kda_window_solve(s_h, qh, kh, v, g, beta, mode)

    # the row-batched twin of fold / window is the delta rule's, owned here (FamilyMath.rows_batchable)
    batches_rows = True
    fold_rows = DeltaRuleMath.fold_rows
    window_rows = DeltaRuleMath.window_rows

    def error_coefficients(self, tok, params, heads, conv=DEFAULT):
        """The running-error model of one token (fp64, all rows), as ``fp64_bound.norm_terms`` reads
        it, norms being the largest row 2-norm of a head's state ``[V, K]``: per value head, the
        factor an existing error is scaled by, ``rho = max_c alpha_c`` (``Diag(alpha) (I - beta k
        kᵀ)`` has 2-norm <= max_c alpha_c for unit k and beta in [0, 1]), the token's part of the
        bound on the new state's norm (``rho |S| + c``, ``c = beta max|v|``), the magnitude of the
        contributions built from records rounded to the activation format, ``p (q + rho |S|)`` (d
        and the normalised k: ``2 max|d| <= 2 beta (max|v| + max alpha |S|)``); and the token's
        decay exponent for the fold's cumulative sums, ``dL = max_c -g_c``: the fp32 sum of a fast
        channel's log gates carries an absolute error ~u |G_c| into every weight of that channel,
        however slowly the head's slowest channel decays.  State-free: a chunk's tokens can be
        given at once.  ``conv``: the declared conventions (the gate law among them)."""
        g, beta = kda_gates(tok["a"], tok["b"], params["A_log"], params["dt_bias"], conv)  # [R, HV, K], [R, HV]
        vmax = tok["v"].abs().amax(-1)
        vmax = vmax.repeat_interleave(heads // vmax.shape[-1], dim=-1) if vmax.shape[-1] != heads else vmax
        return {"rho": torch.exp(g.amax(-1)), "c": beta * vmax, "p": 2 * beta, "q": vmax, "dL": -g.amin(-1)}


class KDAMathCumprod(CumprodDecays, KDAMath):
    """Fold weights as running products of the per-token, per-channel decays exp(g_j) (fp32)."""


class KDAMathRecurrentWindow(KDAMath):
    """The in-window solve by stepping the delta rule token by token from the state before the
    window (no WY/UT form): ``S' = S Diag(exp g_t)``, ``d_t = beta_t (v_t - S' k_t)``,
    ``S_t = S' + d_t k_tᵀ``, ``o_t = S_t q_t``."""

    def solve(self, s_h, qh, kh, v, g, beta, mode):
        S, outs, ds = s_h, [], []
        for t in range(qh.shape[0]):
            S = S * torch.exp(g[t])[:, None, :]
            sk = (_dot(S, mode) * _dot(kh[t], mode)[:, None, :]).sum(-1)
            d = beta[t][:, None] * (v[t] - sk)
            S = S + d[:, :, None] * kh[t][:, None, :]
            outs.append((_dot(S, mode) * _dot(qh[t], mode)[:, None, :]).sum(-1))
            ds.append(d)
        return torch.stack(outs), torch.stack(ds)


_MATH = KDAMath()


@register
class KDALiteralReplay(LiteralReplayKernel):
    name = "literal-replay"
    family = "kda"
    description = "literal ReplaySSM model: records d, normalised k, per-channel g; WY/UT in-window solve"
    math = _MATH


@register
class KDALiteralBaseline(LiteralBaselineKernel):
    name = "literal-baseline"
    family = "kda"
    description = "literal baseline: state read and written every token; one state per draft position"
    math = _MATH


@register
class KDAReplayCumprod(LiteralReplayKernel):
    name = "literal-replay-cumprod"
    family = "kda"
    description = "legitimate variant: fold weights as running products of exp(g) per channel (fp32)"
    math = KDAMathCumprod()


@register
class KDAReplayRecurrentWindow(LiteralReplayKernel):
    name = "literal-replay-recurrent"
    family = "kda"
    description = "legitimate variant: in-window solve by stepping the delta rule (no WY/UT form)"
    math = KDAMathRecurrentWindow()
