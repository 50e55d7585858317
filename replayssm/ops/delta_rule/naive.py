"""The parts of the fp64 delta-rule step that Gated DeltaNet and KDA share (``ops/gdn/naive.py``,
``ops/kda/naive.py``): the softplus, the L2 norm and the normalised, per-value-head q and k.

Oracle: docs/recurrences.md section 1 (``q, k <- u / sqrt(sum u^2 + 1e-6)``, ``q <- q K^-1/2``), line by line.
Expected error in fp64: ~1e-16 relative.
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT, Conventions

L2_EPS = DEFAULT.l2_eps


def softplus(u: torch.Tensor) -> torch.Tensor:
    """log1p(exp(u)), the identity for u > 20 (the literal models' and kernels' form)."""
    return DEFAULT.softplus(u)


def l2norm(u: torch.Tensor, conv: Conventions = DEFAULT) -> torch.Tensor:
    """u / sqrt(sum(u^2) + 1e-6) over the last dimension (eps and form: ``conv``)."""
    return conv.l2norm(u)


def qk_prepare(q, k, nv: int, conv: Conventions = DEFAULT):
    """Normalised, per-value-head q (scaled by K^-1/2) and k: ``[..., H, K] -> [..., HV, K]``."""
    K = q.shape[-1]
    rep = nv // q.shape[-2]
    qn = conv.l2norm(q) * K**-0.5
    kn = conv.l2norm(k)
    return qn.repeat_interleave(rep, dim=-2), kn.repeat_interleave(rep, dim=-2)


__all__ = ["L2_EPS", "l2norm", "qk_prepare", "softplus"]
