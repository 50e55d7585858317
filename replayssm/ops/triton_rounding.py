"""Rounding, stochastic rounding and per-row quantisation inside Triton kernels.

Oracle: :mod:`replayssm.rounding` (torch's own round-to-nearest-even casts; the unbiased
stochastic rounding of ``rounding.stochastic_round``; ``quantize_state``'s fp8 e4m3 rows with
``scale = amax / 448``).  Expected error: nearest rounding is bit-identical to torch's casts (on
the GPU and under the interpreter, tests/test_triton_rounding.py); stochastic rounding returns
one of the two neighbouring representable values, the upper one with probability equal to the
distance from the lower one in units of the gap (unbiased up to the 2^-24 resolution of the
uniform draw).

Triton interpreter traps handled here (spec section 9; ``INTERP`` is a constexpr that kernels
receive from :data:`INTERPRET`):

* fp32 -> bf16 casts truncate under the interpreter: round with integer bit arithmetic instead.
* fp32 -> fp8 e4m3 casts under the interpreter (triton 3.9) do not carry a mantissa round-up into
  the exponent (1.99 -> 1.0, 0.49 -> 0.25; 25 of 1,024 normal samples wrong) and turn NaN into
  384: round on the e4m3 grid in fp32 arithmetic first, so the final cast only sees
  representable values, and write NaN's bit pattern directly.
* fp8 rows: the clamp to +-448 propagates NaN (``tl.minimum`` alone would turn NaN into 448 and
  hide a non-finite state).
* fp16 casts are correct in both.

Random bits come from Philox (``tl.philox``) keyed by ``seed`` with the counter
``(element index, slot, per-slot write counter, stream)``: reproducible for a seed, distinct for
every state write of every slot, independent of the launch grid.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

FP8_MAX = 448.0
_FP8_MAX = tl.constexpr(448.0)

# storage dtype -> the constexpr name kernels use
KIND_OF_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}


@triton.jit
def round_bf16_rne(x):
    """fp32 -> bf16, round to nearest even, by integer arithmetic (exact on every backend)."""
    b = x.to(tl.uint32, bitcast=True)
    lsb = (b >> 16) & 1
    r = (b + 0x7FFF + lsb) & 0xFFFF0000
    y = tl.where(x != x, x, r.to(tl.float32, bitcast=True))
    return y.to(tl.bfloat16)


@triton.jit
def _pow2(k):
    """2^k as fp32 for integer k in [-126, 127]."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _grid_exponent(mag, EMIN: tl.constexpr, MANT: tl.constexpr):
    """k with 2^k the spacing of a float format (MANT explicit mantissa bits, min normal
    exponent EMIN) at magnitude ``mag`` (fp32, >= 0)."""
    e = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    return tl.maximum(e, EMIN) - MANT


@triton.jit
def round_fp8_rne(x):
    """fp32 (|x| <= 448) -> fp8 e4m3fn, round to nearest even, without relying on the cast's
    rounding: x is first rounded on the e4m3 grid in fp32 (2^23 shifter, exact for |x/ulp| < 2^22)."""
    mag = tl.abs(x)
    k = _grid_exponent(mag, -6, 3)
    q = mag * _pow2(-k)
    r = ((q + 8388608.0) - 8388608.0) * _pow2(k)
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    rs = (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    nan8 = ((sign >> 24) | 0x7F).to(tl.uint8).to(tl.float8e4nv, bitcast=True)  # the cast gives 384 for NaN
    return tl.where(x != x, nan8, rs.to(tl.float8e4nv))


@triton.jit
def cast_nearest(x, KIND: tl.constexpr, INTERP: tl.constexpr):
    """Store-ready ``x`` (fp32) in the storage format KIND, rounded to nearest even.  (The two
    interpreter roundings are inlined: a nested call costs ~5 ms under the interpreter.)"""
    if KIND == "fp32":
        y = x
    elif KIND == "bf16":
        if INTERP:
            b = x.to(tl.uint32, bitcast=True)
            rb = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            y = tl.where(x != x, x, rb.to(tl.float32, bitcast=True)).to(tl.bfloat16)
        else:
            y = x.to(tl.bfloat16)
    elif KIND == "fp16":
        y = x.to(tl.float16)
    else:
        tl.static_assert(KIND == "fp8", "KIND must be fp32, bf16, fp16 or fp8")
        if INTERP:
            mag = tl.abs(x)
            k = tl.maximum(((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6) - 3
            q = mag * ((127 - k) << 23).to(tl.float32, bitcast=True)
            rq = ((q + 8388608.0) - 8388608.0) * ((k + 127) << 23).to(tl.float32, bitcast=True)
            sign = x.to(tl.uint32, bitcast=True) & 0x80000000
            rs = (rq.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
            nan8 = ((sign >> 24) | 0x7F).to(tl.uint8).to(tl.float8e4nv, bitcast=True)  # the cast gives 384 for NaN
            y = tl.where(x != x, nan8, rs.to(tl.float8e4nv))
        else:
            y = x.to(tl.float8e4nv)
    return y


@triton.jit
def philox_bits(seed, elem, slot, counter, stream):
    """32 random bits per element of ``elem`` (int tensor), keyed by seed and the counter
    (element, slot, counter, stream)."""
    e = elem.to(tl.uint32)
    zero = e * 0
    c0, _, _, _ = tl.philox(seed, e, zero + slot.to(tl.uint32), zero + counter.to(tl.uint32), zero + stream)
    return c0


@triton.jit
def _uniform01(bits):
    """uint32 -> uniform in [0, 1) with 24 random bits (exact in fp32)."""
    return (bits >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def stochastic_round(x, bits, KIND: tl.constexpr):
    """Round fp32 ``x`` stochastically to KIND (bf16, fp16 or fp8 with |x| <= 448), unbiased.
    Returns an fp32 value exactly representable in KIND (so any later cast is exact)."""
    if KIND == "bf16":
        b = x.to(tl.uint32, bitcast=True)
        r = (b + (bits >> 16)) & 0xFFFF0000
        y = tl.where(x != x, x, r.to(tl.float32, bitcast=True))
    else:
        tl.static_assert(KIND == "fp16" or KIND == "fp8", "stochastic rounding targets bf16, fp16 or fp8")
        if KIND == "fp16":
            k = _grid_exponent(tl.abs(x), -14, 10)
        else:
            k = _grid_exponent(tl.abs(x), -6, 3)
        mag = tl.abs(x)
        q = mag * _pow2(-k)
        lo = tl.floor(q)
        up = _uniform01(bits) < (q - lo)
        r = (lo + tl.where(up, 1.0, 0.0)) * _pow2(k)
        special = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) == 255  # inf (nan handled below)
        r = tl.where(special, mag, r)
        y = tl.where(x != x, x, tl.where(x < 0, -r, r))
    return y


@triton.jit
def store_state_rows(ptrs, scale_ptrs, S, mask, row_mask, elem, seed, slot, counter, stream,
                     KIND: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERP: tl.constexpr):
    """Store an fp32 state tile ``S [rows, cols]`` in the storage format KIND.

    fp8 (SCALED): one fp32 scale per row, ``amax(|row|) / 448`` (1 for an all-zero row), stored
    through ``scale_ptrs [rows]``, as ``rounding.quantize_state``.  SR: stochastic rounding with
    the Philox stream (seed; elem, slot, counter, stream)."""
    if SCALED:
        amax = tl.max(tl.where(mask, tl.abs(S), 0.0), axis=1)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, _FP8_MAX, tl.float32)), 1.0)
        q = tl.math.div_rn(S, tl.broadcast_to(scale[:, None], S.shape))
        q = tl.minimum(tl.maximum(q, -_FP8_MAX, propagate_nan=tl.PropagateNan.ALL), _FP8_MAX,
                       propagate_nan=tl.PropagateNan.ALL)
        tl.store(scale_ptrs, scale, mask=row_mask)
    else:
        q = S
    if SR:
        v = stochastic_round(q, philox_bits(seed, elem, slot, counter, stream), KIND)
        if KIND == "bf16":
            stored = v.to(tl.bfloat16)
        elif KIND == "fp16":
            stored = v.to(tl.float16)
        else:
            sign = v.to(tl.uint32, bitcast=True) & 0x80000000
            nan8 = ((sign >> 24) | 0x7F).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
            stored = tl.where(v != v, nan8, v.to(tl.float8e4nv))
    else:
        stored = cast_nearest(q, KIND, INTERP)
    tl.store(ptrs, stored, mask=mask)


@triton.jit
def load_state_rows(ptrs, scale_ptrs, mask, row_mask, SCALED: tl.constexpr):
    """Load a stored state tile as fp32 (dequantised with the per-row scale when SCALED)."""
    S = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        sc = tl.load(scale_ptrs, mask=row_mask, other=1.0)
        S = S * sc[:, None]
    return S


__all__ = ["FP8_MAX", "INTERPRET", "KIND_OF_DTYPE", "cast_nearest", "load_state_rows", "philox_bits",
           "round_bf16_rne", "round_fp8_rne", "stochastic_round", "store_state_rows"]
