"""Kimi Delta Attention (KDA) decode, the reference recurrence in plain torch.

KDA is the gated delta rule with one forget gate per key channel instead of one per head.
Oracle: the recurrence of the Kimi Linear report (arXiv 2510.26692, eq. for KDA) as
flash-linear-attention 0.6.0 writes it (``fla/ops/kda/naive.py``, ``naive_recurrent_kda``, state
``[K, V]``; here the state is stored transposed, ``[V, K]``, like Gated DeltaNet's) with FLA's gate
(``fla/ops/kda/gate.py``, ``naive_kda_gate``) and its in-kernel q/k L2 normalisation.  In float64
this is the truth every kernel is compared with; in another dtype it runs in that dtype.
Expected error in fp64: ~1e-16 relative per step (tests/ops/kda/test_kda.py checks it against
:func:`kda_closed_form`, a whole-sequence triangular solve, to 1e-12).

Shapes: state ``[..., HV, V, K]``; per token ``q, k [..., H, K]``, ``v [..., HV, V]``,
``a [..., HV, K]`` (the gate pre-activation, one per key channel), ``b [..., HV]``; value head h
uses key head ``h // (HV / H)``; parameters ``A_log [HV]``, ``dt_bias [HV, K]``.

    g = -exp(A_log) softplus(a + dt_bias)     per key channel, g <= 0 (log decay)
    α = exp(g) [HV, K],  β = sigmoid(b)
    q, k ← u / sqrt(Σu² + 1e-6);  q ← q K^-1/2
    S' = S Diag(α)                            (column c of S [V, K] decays by α_c)
    d = β (v − S' k)
    S ← S' + d kᵀ,   o = S q

The bounded gate law (a declared convention, ``gate_lower_bound`` lb in [-5, 0): Kimi-K3, vLLM
0.33.0's RecoverSSM kernels) replaces the first line by

    g = lb * sigmoid(exp(A_log) (a + dt_bias))   per key channel, lb < g < 0

so no channel forgets faster than exp(lb) per token; the input laws are the same (``family.py``).

With ``A_log = 0`` the (default) gate is ``log sigmoid(-(a + dt_bias))``: a log-sigmoid log decay per
channel, the direct form some models use.

Conventions (``conv``, replayssm/conventions.py; the kernel's declared ones, the defaults above
otherwise): the softplus threshold, beta rounded to the activation dtype, the L2-norm eps and form,
as for Gated DeltaNet (``ops/gdn/naive.py``).
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT, Conventions
from replayssm.ops.delta_rule.naive import L2_EPS, l2norm, softplus
from replayssm.ops.delta_rule.naive import qk_prepare as kda_prepare


def kda_gates(a, b, A_log, dt_bias, conv: Conventions = DEFAULT):
    """Per-channel log decay ``g = -exp(A_log) softplus(a + dt_bias)`` ``[..., HV, K]`` and
    ``beta = sigmoid(b)`` ``[..., HV]`` (threshold, beta's rounding and the gate law: ``conv``)."""
    return conv.kda_log_gate(a, A_log, dt_bias), conv.beta(b)


def kda_step(state, q, k, v, a, b, A_log, dt_bias, conv: Conventions = DEFAULT):
    """One KDA step in the dtype of ``state``: ``(o [..., HV, V], new_state)``."""
    dtype = state.dtype
    q, k, v, a, b, A_log, dt_bias = (t.to(dtype) for t in (q, k, v, a, b, A_log, dt_bias))
    qh, kh = kda_prepare(q, k, v.shape[-2], conv)
    g, beta = kda_gates(a, b, A_log, dt_bias, conv)
    decayed = state * torch.exp(g)[..., None, :]
    sk = (decayed * kh[..., None, :]).sum(-1)
    d = beta[..., None] * (v - sk)
    state = decayed + d[..., :, None] * kh[..., None, :]
    o = (state * qh[..., None, :]).sum(-1)
    return o, state


def kda_sequence(state, q, k, v, a, b, A_log, dt_bias):
    """:func:`kda_step` over the token axis (dim -3 of q): ``(o [..., T, HV, V], final state)``."""
    outs = []
    for t in range(q.shape[-3]):
        o, state = kda_step(state, q[..., t, :, :], k[..., t, :, :], v[..., t, :, :], a[..., t, :, :],
                            b[..., t, :], A_log, dt_bias)
        outs.append(o)
    return torch.stack(outs, dim=-3), state


def kda_closed_form(state, q, k, v, a, b, A_log, dt_bias):
    """The same sequence without a recurrence: one triangular solve over the whole sequence.

    For one row (``state [HV, V, K]``, tokens ``[T, ...]``), with ``G_t = sum_{i<=t} g_i`` per
    channel and ``E_tj = exp(G_t - G_j)`` (``[HV, K]``, t >= j):
    ``S_t = S_0 Diag(exp G_t) + sum_{j<=t} d_j (E_tj ⊙ k_j)ᵀ``, so
    ``(I + Diag(β) A) d = β ⊙ (v - S_0 (exp G ⊙ k))`` with ``A_tj = (E_tj ⊙ k_j) · k_t`` (t > j),
    solved by ``torch.linalg.solve_triangular``;
    ``o_t = S_0 (exp G_t ⊙ q_t) + sum_{j<=t} ((E_tj ⊙ k_j) · q_t) d_j``.
    Returns ``(o [T, HV, V], final state)``."""
    dtype = state.dtype
    q, k, v, a, b, A_log, dt_bias = (t.to(dtype) for t in (q, k, v, a, b, A_log, dt_bias))
    qh, kh = kda_prepare(q, k, v.shape[-2])  # [T, HV, K]
    g, beta = kda_gates(a, b, A_log, dt_bias)  # [T, HV, K], [T, HV]
    T = q.shape[0]
    G = torch.cumsum(g, dim=0)
    E = torch.exp(G[:, None] - G[None, :])  # [t, j, HV, K]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=state.device))
    E = torch.where(causal[:, :, None, None], E, torch.zeros((), dtype=dtype, device=state.device))
    ek = E * kh[None, :]  # [t, j, HV, K]: E_tj ⊙ k_j
    A = torch.einsum("tjhc,thc->htj", ek, kh).tril(-1)  # [HV, t, j]
    rhs = beta[..., None] * (v - torch.einsum("hvc,thc->thv", state, torch.exp(G) * kh))  # [T, HV, V]
    M = torch.eye(T, dtype=dtype, device=state.device) + beta.T[:, :, None] * A  # [HV, T, T]
    d = torch.linalg.solve_triangular(M, rhs.permute(1, 0, 2), upper=False, unitriangular=True)  # [HV, T, V]
    o = torch.einsum("hvc,thc->thv", state, torch.exp(G) * qh) + torch.einsum(
        "tjhc,thc,hjv->thv", ek, qh, d)
    final = state * torch.exp(G[-1])[:, None, :] + torch.einsum("jhc,hjv->hvc", ek[-1], d)
    return o, final


__all__ = ["L2_EPS", "kda_closed_form", "kda_gates", "kda_prepare", "kda_sequence", "kda_step", "l2norm", "softplus"]
