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

from replayssm.ops.triton.row_error import row_rel_l2_rows

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
    non-finite): the drift report's state error.  On a CUDA device each row is summed in one fixed
    order, whatever the other rows (``ops/triton/row_error.py``): a row measured among a selection
    and in place in the whole state (drift's fast path, inside a CUDA graph) gives the same bits."""
    if a.device.type == "cuda":
        return row_rel_l2_rows(_kernel_dtype(a), _kernel_dtype(b))
    if torch.float64 in (a.dtype, b.dtype):  # the other side is upcast exactly inside the subtraction
        d = torch.sub(a.flatten(1), b.flatten(1))
    else:
        d = a.to(torch.float64).flatten(1) - b.to(torch.float64).flatten(1)
    b = b.to(torch.float64).flatten(1)
    return torch.linalg.vector_norm(d, dim=1) / torch.linalg.vector_norm(b, dim=1).clamp_min(TINY)


def row_rel_l2_masked(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`row_rel_l2` of the rows ``mask`` (bool ``[R]``, a device value) marks, into those rows of ``out``
    (fp64 ``[R]``; the others untouched) with the bits :func:`row_rel_l2` gives them among any selection:
    in place on a CUDA device (no host sync: what a CUDA graph captures), by an index of the marked rows
    elsewhere."""
    if a.device.type == "cuda":
        return row_rel_l2_rows(_kernel_dtype(a), _kernel_dtype(b), out=out, mask=mask)
    idx = mask.nonzero().flatten()
    return out.index_copy_(0, idx, row_rel_l2(a.index_select(0, idx), b.index_select(0, idx)))


def _kernel_dtype(t: torch.Tensor) -> torch.Tensor:
    """``t`` for the row-error kernel: fp64/fp32/fp16/bf16 as they are, other floats (fp8) upcast to fp32
    (exact)."""
    return t if t.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16) else t.to(torch.float32)


def rms_ratio(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_2 / ||ref||_2 over all elements (FLA's metric)."""
    e = abs_error(out, ref)
    return float(torch.linalg.vector_norm(e) / torch.linalg.vector_norm(ref.to(torch.float64)).clamp_min(TINY))


__all__ = ["abs_error", "error_metrics", "rel_l2_into", "rms_ratio", "row_rel_l2", "row_rel_l2_masked"]
