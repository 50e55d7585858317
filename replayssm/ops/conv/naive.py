"""The depthwise causal conv1d of one decode token, in plain torch, and the activation after it.

Oracle: the definition.  Channel c of the output at token t is
``bias_c + sum_{j=0}^{w-1} weight[c, j] * u[c, t - (w - 1) + j]`` (width ``w = d_conv``; ``u`` the
conv inputs, the window holding the ``w - 1`` inputs before t, oldest first; Dao-AILab
``causal_conv1d_update_ref`` and vLLM ``causal_conv1d_update`` compute the same sum, the latter in
fp32 from j = 0 upwards, the order used here).  In float64 this is the truth; in another dtype it
runs in that dtype with that order.  The new window is the old one shifted by one token: data
movement, so any kernel's committed window must equal the last ``w - 1`` accepted inputs bit for bit.
"""

from __future__ import annotations

import torch


def conv_step(window: torch.Tensor, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``window [..., C, w-1]`` (oldest first), ``u [..., C]``, ``weight [C, w]``, ``bias [C]`` or None,
    all in one dtype: ``(pre-activation output [..., C], new window [..., C, w-1])``."""
    full = torch.cat([window, u[..., None]], dim=-1)
    acc = torch.zeros_like(u) if bias is None else bias.expand_as(u).clone()
    for j in range(full.shape[-1]):
        acc = acc + full[..., j] * weight[:, j]
    return acc, full[..., 1:]


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` (``x / (1 + exp(-x))``, vLLM's form; equal in fp64 to the last bits)."""
    return x / (1 + torch.exp(-x))


def conv_sequence(window: torch.Tensor, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`conv_step` over the token axis (dim -2 of ``u [..., T, C]``): ``(outputs [..., T, C], window)``."""
    outs = []
    for t in range(u.shape[-2]):
        y, window = conv_step(window, u[..., t, :], weight, bias)
        outs.append(y)
    return torch.stack(outs, dim=-2), window
