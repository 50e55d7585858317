"""fp32-accurate matrix products on bf16 tensor cores: each fp32 operand written as a sum of bf16
parts, the products of the parts accumulated in fp32.

An fp32 value ``x`` (24-bit significand) is ``hi + mid + lo`` with ``hi = bf16(x)``,
``mid = bf16(x - hi)``, ``lo = bf16(x - hi - mid)``: each difference is exact in fp32 and each part
carries the next 8 bits, so the three parts hold all 24 (exactly, for normal values whose parts stay
normal in bf16).  ``a @ b`` is then the sum of the part products ``a_i @ b_j``; a bf16 x bf16 product
is exact in fp32 (16-bit significand), so the only errors are the fp32 accumulation and the dropped
terms ``i + j > 2`` (relative size ``2^-24`` and below).  :func:`split_dot` keeps the (up to six)
terms with ``i + j <= 2`` (``NA`` / ``NB`` parts of each operand: 3 for fp32 values, 2 for values
exact in fp16, 1 for values exact in bf16 -- an fp16 or bf16 state, bf16 inputs -- whose further
parts are zero) and adds the smallest first.

Oracle: the fp32 / fp64 product of the same operands (tests/core/test_split_dot.py).  Expected error: a
few fp32 ulps of ``|a| |b|`` per output element, as an fp32 FMA reduction; that is 2^8 - 2^16 times
smaller than one bf16 or tf32 product (the official ReplaySSM kernels' readouts).

Under the Triton interpreter a bf16 ``tl.dot`` returns wrong values (docs/kernel_interface.md): there the parts are
widened to fp32 first (exact) and multiplied with an ieee fp32 dot, so the interpreter computes the
same sum of part products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def split3(x):
    """(hi, mid, lo) bf16 parts of an fp32 tensor, hi + mid + lo == x."""
    hi = x.to(tl.bfloat16)
    r = x - hi.to(tl.float32)
    mid = r.to(tl.bfloat16)
    lo = (r - mid.to(tl.float32)).to(tl.bfloat16)
    return hi, mid, lo


@triton.jit
def _mma(a, b, acc, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    return tl.dot(a, b, acc=acc, out_dtype=tl.float32)


@triton.jit
def split_dot(a, b, NA: tl.constexpr, NB: tl.constexpr, INTERPRET: tl.constexpr):
    """``a @ b`` in fp32 accuracy for fp32 ``a`` [M, K] and ``b`` [K, N] (M, N, K >= 16 compiled),
    from bf16 tensor-core products of their parts; ``NA``, ``NB`` (1-3): how many bf16 parts each
    operand needs (:func:`parts`)."""
    a0, a1, a2 = split3(a)
    b0, b1, b2 = split3(b)
    acc = tl.zeros((a.shape[0], b.shape[1]), dtype=tl.float32)
    if NA > 2:
        acc = _mma(a2, b0, acc, INTERPRET)
    if NA > 1 and NB > 1:
        acc = _mma(a1, b1, acc, INTERPRET)
    if NB > 2:
        acc = _mma(a0, b2, acc, INTERPRET)
    if NA > 1:
        acc = _mma(a1, b0, acc, INTERPRET)
    if NB > 1:
        acc = _mma(a0, b1, acc, INTERPRET)
    return _mma(a0, b0, acc, INTERPRET)


def parts(dtype) -> int:
    """bf16 parts an operand holding values of ``dtype`` needs (bf16: 1, fp16: 2, else 3; a scaled fp8
    state's dequantised values are fp32 products: 3)."""
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 3)


__all__ = ["parts", "split3", "split_dot"]
