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
from replayssm.ops.delta_rule.naive import L2_EPS, l2norm, softplus
from replayssm.ops.delta_rule.naive import qk_prepare as gdn_prepare
from replayssm.ops.ordered_sum import pairwise_sum


def gdn_gates(a, b, A_log, dt_bias, conv: Conventions = DEFAULT):
    """g = -exp(A_log) softplus(a + dt_bias) (log decay), beta = sigmoid(b) (threshold and beta's
    rounding: ``conv``, the kernel's declared conventions, replayssm/conventions.py)."""
    return -torch.exp(A_log) * conv.softplus(a + dt_bias), conv.beta(b)


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


__all__ = ["L2_EPS", "gdn_gates", "gdn_prepare", "gdn_sequence", "gdn_step", "l2norm", "softplus"]
