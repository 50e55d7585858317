"""Jitted scalar math both op families' kernels use.

Oracle: the fp64 recurrences (``replayssm/ops/mamba2/naive.py``, ``replayssm/ops/gdn/naive.py``;
docs/recurrences.md section 1), which write softplus as ``log1p(exp(u))``, the identity above 20.  Expected error of
:func:`softplus`: a few fp32 ulps (``log1p(v)`` through Goldberg's ``w = 1 + v`` correction, so a
small Δ keeps its relative precision).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(u):
    """log1p(exp(u)) for u <= 20, u above (docs/recurrences.md section 1); log1p(v) = log(w) * v / (w - 1)."""
    v = tl.exp(tl.minimum(u, 20.0))
    w = 1.0 + v
    lp = tl.where(w == 1.0, v, tl.log(w) * (v / (w - 1.0)))
    return tl.where(u > 20.0, u, lp)


__all__ = ["softplus"]
