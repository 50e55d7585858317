"""Mismatch metrics between a kernel's outputs (or states) and the fp64 reference.

Oracle: the definitions themselves, computed in fp64 on the device, batched (no Python loops
over elements).  For outputs ``[R, T', ...]`` each metric is per (row, window position):

* ``max_abs``: max |out - ref| (non-finite differences count as +inf);
* ``rel_l2``: ||out - ref||_2 / ||ref||_2;
* ``in_u``: max_abs / (u * max |ref|), the error in units of the mode's unit roundoff relative
  to the row's scale (1 means one rounding of the coarsest format).

and per call, over all rows and positions given:

* ``rms_ratio``: ||out - ref||_2 / ||ref||_2 (flash-linear-attention's RMS ratio).
"""

from __future__ import annotations

import torch

TINY = 1e-300


def _flat(t: torch.Tensor, lead: int) -> torch.Tensor:
    return t.reshape(*t.shape[:lead], -1)


def abs_error(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| in fp64, +inf where either side is non-finite."""
    d = (out.to(torch.float64) - ref.to(torch.float64)).abs()
    return torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))


def error_metrics(out: torch.Tensor, ref: torch.Tensor, u: float, lead: int = 2) -> dict[str, torch.Tensor]:
    """Per-leading-index metrics (``lead`` leading dims kept, e.g. [R, T'] for outputs, [R] for
    states): ``max_abs``, ``rel_l2``, ``ref_max``, ``in_u``; plus the scalar ``rms_ratio``."""
    e = _flat(abs_error(out, ref), lead)
    r = _flat(ref.to(torch.float64), lead)
    max_abs = e.amax(-1)
    ref_max = r.abs().amax(-1)
    err_l2 = torch.linalg.vector_norm(e, dim=-1)
    ref_l2 = torch.linalg.vector_norm(r, dim=-1)
    rel_l2 = err_l2 / ref_l2.clamp_min(TINY)
    in_u = max_abs / (u * ref_max).clamp_min(TINY)
    rms = torch.linalg.vector_norm(e) / torch.linalg.vector_norm(r).clamp_min(TINY)
    return {"max_abs": max_abs, "rel_l2": rel_l2, "ref_max": ref_max, "in_u": in_u, "rms_ratio": rms}


def rel_l2_into(out: torch.Tensor, ref: torch.Tensor, dst: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """:func:`error_metrics`'s ``rel_l2`` per (row, position) of ``[R, T', ...]`` outputs, written into
    ``dst [R, T']`` (fixed buffers: the drift fast path and its CUDA graphs).  ``exact=False`` skips
    the non-finite-to-inf step: the same bits when every difference is finite, a non-finite value
    otherwise (recompute those with ``exact=True`` to name them)."""
    d = torch.sub(out, ref).abs()  # a bf16/fp16/fp32 output is upcast exactly inside the subtraction
    if exact:
        d = torch.where(torch.isfinite(d), d, float("inf"))
    dims = tuple(range(2, d.dim()))
    return torch.div(torch.linalg.vector_norm(d, dim=dims), torch.linalg.vector_norm(ref, dim=dims).clamp_min(TINY),
                     out=dst)


def row_rel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ``||a - b|| / ||b||`` in fp64 over everything but the first dim (non-finite stays
    non-finite): the drift report's state error."""
    if torch.float64 in (a.dtype, b.dtype):  # the other side is upcast exactly inside the subtraction
        d = torch.sub(a.flatten(1), b.flatten(1))
    else:
        d = a.to(torch.float64).flatten(1) - b.to(torch.float64).flatten(1)
    b = b.to(torch.float64).flatten(1)
    return torch.linalg.vector_norm(d, dim=1) / torch.linalg.vector_norm(b, dim=1).clamp_min(TINY)


def rms_ratio(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_2 / ||ref||_2 over all elements (FLA's metric)."""
    e = abs_error(out, ref)
    return float(torch.linalg.vector_norm(e) / torch.linalg.vector_norm(ref.to(torch.float64)).clamp_min(TINY))


__all__ = ["abs_error", "error_metrics", "rel_l2_into", "rms_ratio", "row_rel_l2"]
