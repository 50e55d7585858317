"""Mamba-2 decode (selective state update), the reference recurrence in plain torch.

Oracle: docs/recurrences.md section 1, line by line.  In float64 this is the truth every kernel is compared
with; in another dtype it runs in that dtype.  Expected error in fp64: ~1e-16 relative per step
(tests/core/test_reference.py checks it against the SSD matrix form to 1e-12).

Shapes: state ``[..., H, P, N]``; per token ``x [..., H, P]``, ``dt [..., H]``, ``B, C [..., G, N]``
(head h uses group ``h // (H / G)``), optional ``z [..., H, P]``; parameters ``A, dt_bias, D [H]``.

    Δ = softplus(dt + dt_bias)          softplus(u) = log1p(exp(u)), the identity for u > 20
    a = exp(A Δ)
    S ← a S + Δ x Bᵀ
    y = S C + D x,   y ← y · z · sigmoid(z) when z is given

The sum over N of ``S C`` is :func:`~replayssm.ops.ordered_sum.pairwise_sum` (a fixed pairwise
order: the same bits on any device and from the drift fast path's fused pass).

The step is written as two parts so a long run can prepare a whole chunk of tokens at once with
the same bits: :func:`prepare` holds the exact elementwise work (casts, the group-to-head
broadcast, the bias add, D x), :func:`advance` the rest.  :func:`mamba2_step` is the two together.
"""

from __future__ import annotations

import torch

from replayssm.ops.ordered_sum import pairwise_sum


def prepare(x, dt, B, C, A, dt_bias, D, z=None, dtype=torch.float64, threshold: float = 20.0
            ) -> dict[str, torch.Tensor]:
    """The exact part of a step, for any leading dims: per-head B/C ``[..., H, 1, N]``, the softplus
    argument ``u = dt + dt_bias`` and its clamp ``[..., H, 1, 1]``, ``x [..., H, P, 1]``, ``D x``, z.
    ``threshold``: softplus is the identity above it (a declared convention, replayssm/conventions.py)."""
    x, dt, B, C, dt_bias, D = (t.to(dtype) for t in (x, dt, B, C, dt_bias, D))
    H = x.shape[-2]
    u = dt + dt_bias
    prep = {
        "u": u[..., None, None],
        "large": (u > threshold)[..., None, None],
        "u_clamped": torch.clamp(u, max=threshold)[..., None, None],
        "x": x[..., None],
        "Bh": B.repeat_interleave(H // B.shape[-2], dim=-2)[..., None, :],
        "Ch": C.repeat_interleave(H // C.shape[-2], dim=-2)[..., None, :],
        "Dx": D[..., None] * x,
    }
    if z is not None:
        prep["z"] = z.to(dtype)
    return prep


def advance(state: torch.Tensor, p: dict[str, torch.Tensor], A: torch.Tensor):
    """One step on prepared inputs: ``(y [..., H, P], new state [..., H, P, N])``."""
    delta = torch.where(p["large"], p["u"], torch.log1p(torch.exp(p["u_clamped"])))
    a = torch.exp(A.to(state.dtype)[:, None, None] * delta)
    state = torch.add(a * state, delta * p["x"] * p["Bh"])
    y = torch.add(pairwise_sum(state * p["Ch"]), p["Dx"])
    if "z" in p:
        y = torch.mul(y * p["z"], torch.sigmoid(p["z"]))
    return y, state


def mamba2_step(state, x, dt, B, C, A, dt_bias, D, z=None, threshold: float = 20.0):
    """One selective-state update in the dtype of ``state``: ``(y [..., H, P], new_state)``."""
    return advance(state, prepare(x, dt, B, C, A, dt_bias, D, z, dtype=state.dtype, threshold=threshold), A)


def mamba2_sequence(state, x, dt, B, C, A, dt_bias, D, z=None):
    """:func:`mamba2_step` over the token axis (dim -3 of x): ``(y [..., T, H, P], final state)``."""
    ys = []
    for t in range(x.shape[-3]):
        y, state = mamba2_step(state, x[..., t, :, :], dt[..., t, :], B[..., t, :, :], C[..., t, :, :],
                               A, dt_bias, D, None if z is None else z[..., t, :, :])
        ys.append(y)
    return torch.stack(ys, dim=-3), state


def softplus(u: torch.Tensor, threshold: float = 20.0) -> torch.Tensor:
    """log1p(exp(u)), the identity for u > threshold (20: the literal models' and kernels' form)."""
    return torch.where(u > threshold, u, torch.log1p(torch.exp(torch.clamp(u, max=threshold))))
