"""Decaying linear attention, the reference recurrence in plain torch (fp64: the truth).

    g = -exp(A_log) softplus(a + dt_bias),   S <- exp(g) S + v k^T,   o = S q

Shapes: state ``[..., H, V, K]``; per token ``q, k [..., H, K]``, ``v [..., H, V]``, ``a [..., H]``."""

from __future__ import annotations

import torch


def log_decay(a, A_log, dt_bias):
    u = a + dt_bias
    return -torch.exp(A_log) * torch.where(u > 20, u, torch.log1p(torch.exp(torch.clamp(u, max=20))))


def toy_step(state, q, k, v, a, A_log, dt_bias):
    dtype = state.dtype
    q, k, v, a, A_log, dt_bias = (t.to(dtype) for t in (q, k, v, a, A_log, dt_bias))
    g = log_decay(a, A_log, dt_bias)
    state = torch.exp(g)[..., None, None] * state + v[..., :, None] * k[..., None, :]
    return (state * q[..., None, :]).sum(-1), state
