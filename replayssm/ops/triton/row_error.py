"""Per-row relative L2 error of a state against the fp64 reference, in one fixed summation order.

``err[r] = sqrt(sum (a[r] - b[r])^2) / max(sqrt(sum b[r]^2), TINY)`` over every element of row ``r``,
with ``a`` and ``b`` upcast to fp64 (exact from fp32/fp16/bf16) -- drift's flush, local and state
errors on a CUDA device (``validators/metrics.row_rel_l2``).

Why a kernel of our own: ``torch.linalg.vector_norm`` over ``dim=1`` adds in an order the CUDA
reduction picks from the tensor's shape, so a row's norm taken among 2 selected rows and among all
8 rows can differ in the last bits.  Drift's slow path measures the selected rows (an
``index_select``); its fast path measures inside a CUDA graph, where which rows flushed is a device
mask, so it measures them in place on the whole state.  Here every row is summed in the same order
whatever the other rows are (blocks of ``BLOCK`` elements, each reduced by ``tl.sum``, then the
row's block sums by ``tl.sum``: the order depends on the row's length only), so both give the same
bits, and a masked-off row costs no reads (its loads are masked).

Oracle: exact arithmetic; the error is that of any fp64 summation order (~log2(n) roundings, 1e-15
relative): tests/core/test_row_error.py keeps it within 1e-13 of the torch expression and holds the
masked, selected and whole forms to the same bits.  Non-finite inputs give a non-finite error.

Shapes: ``a, b [R, ...]`` of one shape on one CUDA device (or CPU under ``TRITON_INTERPRET=1``);
``mask [R]`` bool; ``out [R]`` fp64 (the unmasked rows left as they were).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 2048  # elements per first-level program (fp64: 16 KB per operand)
MAX_BLOCKS = 4096  # block sums per row: a longer row takes longer blocks (a power of two)


@triton.jit
def _block_sums_kernel(a_ptr, b_ptr, mask_ptr, part_ptr, n, nblk, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    """``part[r, blk] = (sum (a - b)^2, sum b^2)`` over block ``blk`` of row ``r`` (masked-off rows: no read)."""
    blk = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1).to(tl.int64)
    lim = n
    if MASKED:
        lim = n * (tl.load(mask_ptr + r) != 0).to(tl.int64)
    off = blk * BLOCK + tl.arange(0, BLOCK)
    m = off < lim
    a = tl.load(a_ptr + r * n + off, mask=m, other=0.0).to(tl.float64)
    b = tl.load(b_ptr + r * n + off, mask=m, other=0.0).to(tl.float64)
    d = a - b
    tl.store(part_ptr + (r * nblk + blk) * 2, tl.sum(d * d, axis=0), mask=lim > 0)
    tl.store(part_ptr + (r * nblk + blk) * 2 + 1, tl.sum(b * b, axis=0), mask=lim > 0)


@triton.jit
def _finish_kernel(part_ptr, mask_ptr, out_ptr, nblk, NB: tl.constexpr, MASKED: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    lim = nblk
    if MASKED:
        lim = nblk * (tl.load(mask_ptr + r) != 0).to(tl.int32)
    i = tl.arange(0, NB)
    m = i < lim
    num = tl.sum(tl.load(part_ptr + (r * nblk + i) * 2, mask=m, other=0.0), axis=0)
    den = tl.sum(tl.load(part_ptr + (r * nblk + i) * 2 + 1, mask=m, other=0.0), axis=0)
    num = tl.sqrt(num)  # fp64: sqrt.rn.f64, correctly rounded
    den = tl.sqrt(den)
    tiny = tl.full((), 1e-300, tl.float64)  # metrics.TINY, built in fp64 (a float literal is fp32: 0 here)
    den = tl.where(den < tiny, tiny, den)  # clamp_min: a NaN stays NaN
    tl.store(out_ptr + r, num / den, mask=lim > 0)


def _block(n: int) -> int:
    """The first level's block length for rows of ``n`` elements (fixed by ``n`` alone)."""
    b = BLOCK
    while triton.cdiv(n, b) > MAX_BLOCKS:
        b *= 2
    return b


def row_rel_l2_rows(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """The error of every row of ``a`` against ``b`` (``mask``: only the rows it marks; the others of
    ``out`` untouched) into ``out`` (fp64 ``[R]``, allocated when None); returns it.  Refused (nothing
    written) unless ``a`` and ``b`` are ``[R, ...]`` floating tensors of one shape on ``out``'s device."""
    if a.dim() < 1 or not a.is_floating_point():
        raise ValueError(f"a: expected a floating [R, ...] tensor, got {a.dtype} of shape {tuple(a.shape)}")
    if tuple(b.shape) != tuple(a.shape) or b.device != a.device or not b.is_floating_point():
        raise ValueError(f"b: expected a floating {tuple(a.shape)} tensor on {a.device}, got {b.dtype} "
                         f"{tuple(b.shape)} on {b.device}")
    R = a.shape[0]
    if out is None:
        out = torch.empty(R, dtype=torch.float64, device=a.device)
    elif out.dtype != torch.float64 or tuple(out.shape) != (R,) or out.device != a.device or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous float64 [{R}] tensor on {a.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (R,) or mask.device != a.device):
        raise ValueError(f"mask: expected a bool [{R}] tensor on {a.device}, got {mask.dtype} "
                         f"{tuple(mask.shape)} on {mask.device}")
    n = a.numel() // R if R else 0
    if R == 0:
        return out
    if n == 0:  # empty rows: 0 / TINY, as the torch expression gives
        return out.copy_(torch.where(mask, 0.0, out) if mask is not None else torch.zeros_like(out))
    a, b = a.contiguous(), b.contiguous()
    blk = _block(n)
    nblk = triton.cdiv(n, blk)
    part = torch.empty((R, nblk, 2), dtype=torch.float64, device=a.device)
    m = mask.contiguous().view(torch.uint8) if mask is not None else out  # an unread pointer when unmasked
    with torch.cuda.device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
        _block_sums_kernel[(nblk, R)](a, b, m, part, n, nblk, BLOCK=blk, MASKED=mask is not None, num_warps=4)
        _finish_kernel[(R,)](part, m, out, nblk, NB=triton.next_power_of_2(nblk), MASKED=mask is not None,
                             num_warps=4)
    return out


__all__ = ["row_rel_l2_rows"]
