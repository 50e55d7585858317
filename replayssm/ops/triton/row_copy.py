"""Copy the rows a mask selects, in place: ``dst[r] = src[r]`` where ``mask[r]``, the other rows untouched.

Oracle: ``torch.where(mask.view(R, 1, ...), src.to(dst.dtype), dst)``.  Expected difference: none --
every element is moved, or upcast to fp64 (exact from fp16, bf16 and fp32), never computed.

Why: drift's speculative pieces keep, per row, the fp64 reference state after that row's accepted
tokens.  Inside a CUDA graph the accepted counts are device values, so the choice was a
``torch.where`` over the whole state for each of the window's tokens: three state-sized passes per
token, more than the reference step itself (one pass for Mamba-2, two for Gated DeltaNet).  Here
a row is read and written only at the token it keeps (each row once per verify), and the
unselected rows' programs load nothing (their loads and stores are masked off).

Shapes: ``dst, src [R, ...]`` with the same shape, contiguous; ``mask [R]`` bool on the same device.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 2048
_EXACT_UP = {torch.float64: (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


@triton.jit
def _copy_rows_kernel(dst_ptr, src_ptr, mask_ptr, n, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    lim = n * (tl.load(mask_ptr + r) != 0).to(tl.int64)  # an unselected row: no element in bounds
    off = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < lim
    x = tl.load(src_ptr + r * n + off, mask=m)
    tl.store(dst_ptr + r * n + off, x.to(dst_ptr.dtype.element_ty), mask=m)


def can_copy_rows(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether :func:`copy_rows` takes this pair: both contiguous ``[R, ...]`` of one shape on one device,
    ``src``'s dtype ``dst``'s or held exactly by it (fp64 from fp32/fp16/bf16).  Callers with other
    tensors keep ``torch.where``."""
    return (dst.dim() >= 1 and dst.is_contiguous() and src.is_contiguous() and tuple(src.shape) == tuple(dst.shape)
            and src.device == dst.device and (src.dtype == dst.dtype or src.dtype in _EXACT_UP.get(dst.dtype, ())))


def copy_rows(dst: torch.Tensor, src: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``dst[r] = src[r]`` (upcast to ``dst``'s dtype, exactly) for every row ``r`` with ``mask[r]``; returns
    ``dst``.  Refused (nothing written) unless both are contiguous ``[R, ...]`` of the same shape on one
    device, ``src``'s dtype is ``dst``'s or exactly representable in it (fp64 from fp32/fp16/bf16), and
    ``mask`` is a bool ``[R]`` there."""
    if dst.dim() < 1 or not dst.is_contiguous():
        raise ValueError(f"dst: expected a contiguous [R, ...] tensor, got shape {tuple(dst.shape)} "
                         f"(contiguous: {dst.is_contiguous()})")
    if tuple(src.shape) != tuple(dst.shape) or src.device != dst.device or not src.is_contiguous():
        raise ValueError(f"src: expected a contiguous {tuple(dst.shape)} tensor on {dst.device}, got "
                         f"{tuple(src.shape)} on {src.device} (contiguous: {src.is_contiguous()})")
    if src.dtype != dst.dtype and src.dtype not in _EXACT_UP.get(dst.dtype, ()):
        raise ValueError(f"src: expected {dst.dtype} or a dtype it holds exactly, got {src.dtype}")
    R = dst.shape[0]
    if mask.dtype != torch.bool or tuple(mask.shape) != (R,) or mask.device != dst.device:
        raise ValueError(f"mask: expected a bool [{R}] tensor on {dst.device}, got {mask.dtype} "
                         f"{tuple(mask.shape)} on {mask.device}")
    n = dst.numel() // R if R else 0
    if n == 0:
        return dst
    with torch.cuda.device(dst.device) if dst.device.type == "cuda" else contextlib.nullcontext():
        _copy_rows_kernel[(R, triton.cdiv(n, BLOCK))](dst, src, mask.contiguous().view(torch.uint8), n,
                                                      BLOCK=BLOCK, num_warps=4)
    return dst


__all__ = ["copy_rows", "can_copy_rows"]
