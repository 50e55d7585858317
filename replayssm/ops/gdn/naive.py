"""Gated DeltaNet decode (the gated delta rule), the reference recurrence in plain torch.

Oracle: docs/recurrences.md section 1, line by line.  In float64 this is the truth every kernel is compared
with; in another dtype it runs in that dtype.  Expected error in fp64: ~1e-16 relative per step
(tests/core/test_reference.py checks it against a whole-sequence triangular solve to 1e-12).

Shapes: state ``[..., HV, V, K]``; per token ``q, k [..., H, K]``, ``v [..., HV, V]``,
``a, b [..., HV]`` (value head h uses key head ``h // (HV / H)``); parameters ``A_log, dt_bias [HV]``.

    g = -exp(A_log) softplus(a + dt_bias),  α = exp(g),  β = sigmoid(b)
    q, k ← u / sqrt(Σu² + 1e-6);  q ← q K^-1/2
    d = β (v − α S k)
    S ← α S + d kᵀ,   o = S q

The sums over K of ``S k`` and ``S q`` are :func:`~replayssm.ops.ordered_sum.pairwise_sum` (a fixed
pairwise order: the same bits on any device and from the drift fast path's fused pass).
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT, Conventions
from replayssm.ops.ordered_sum import pairwise_sum

L2_EPS = DEFAULT.l2_eps


def softplus(u: torch.Tensor) -> torch.Tensor:
    """log1p(exp(u)), the identity for u > 20 (the literal models' and kernels' form)."""
    return DEFAULT.softplus(u)


def l2norm(u: torch.Tensor, conv: Conventions = DEFAULT) -> torch.Tensor:
    """u / sqrt(sum(u^2) + 1e-6) over the last dimension (eps and form: ``conv``)."""
    return conv.l2norm(u)


def gdn_gates(a, b, A_log, dt_bias, conv: Conventions = DEFAULT):
    """g = -exp(A_log) softplus(a + dt_bias) (log decay), beta = sigmoid(b) (threshold and beta's
    rounding: ``conv``, the kernel's declared conventions, replayssm/conventions.py)."""
    return -torch.exp(A_log) * conv.softplus(a + dt_bias), conv.beta(b)


def gdn_prepare(q, k, nv: int, conv: Conventions = DEFAULT):
    """Normalised, per-value-head q (scaled by K^-1/2) and k: ``[..., H, K] -> [..., HV, K]``."""
    K = q.shape[-1]
    rep = nv // q.shape[-2]
    qn = conv.l2norm(q) * K**-0.5
    kn = conv.l2norm(k)
    return qn.repeat_interleave(rep, dim=-2), kn.repeat_interleave(rep, dim=-2)


def gdn_step(state, q, k, v, a, b, A_log, dt_bias, conv: Conventions = DEFAULT):
    """One gated delta-rule step in the dtype of ``state``: ``(o [..., HV, V], new_state)``."""
    dtype = state.dtype
    q, k, v, a, b, A_log, dt_bias = (t.to(dtype) for t in (q, k, v, a, b, A_log, dt_bias))
    qh, kh = gdn_prepare(q, k, v.shape[-2], conv)
    g, beta = gdn_gates(a, b, A_log, dt_bias, conv)
    alpha = torch.exp(g)
    sk = pairwise_sum(state * kh[..., None, :])
    d = beta[..., None] * (v - alpha[..., None] * sk)
    state = alpha[..., None, None] * state + d[..., :, None] * kh[..., None, :]
    o = pairwise_sum(state * qh[..., None, :])
    return o, state


def gdn_sequence(state, q, k, v, a, b, A_log, dt_bias):
    """:func:`gdn_step` over the token axis (dim -3 of q): ``(o [..., T, HV, V], final state)``."""
    outs = []
    for t in range(q.shape[-3]):
        o, state = gdn_step(state, q[..., t, :, :], k[..., t, :, :], v[..., t, :, :], a[..., t, :],
                            b[..., t, :], A_log, dt_bias)
        outs.append(o)
    return torch.stack(outs, dim=-3), state
