"""The Triton precision library: every op family's kernels round, quantise and draw random bits here.

Oracle: :mod:`replayssm.rounding` (torch's own round-to-nearest-even casts; ``stochastic_round``'s
unbiased choice between the two neighbouring representable values; ``quantize_state``'s scaled
rows, ``scale = amax(|row|) / qmax``, 1 for an all-zero row, values clamped to +-qmax then
rounded).  Expected error: nearest rounding is bit-identical to torch's casts, and scaled rows
bit-identical to ``quantize_state`` (on the GPU and under the interpreter,
tests/core/test_triton_rounding.py); stochastic rounding returns one of the two neighbours of ``x``,
the upper one with probability (|x| - lo) / (hi - lo), so it is unbiased up to the 2^-24
resolution of the uniform draw and never more than one ulp away.

Formats: the storage formats of ``precision.FORMATS`` that have a Triton dtype (fp32, bf16, fp16,
fp8 e4m3, int8).  The jitted functions dispatch on the Triton dtype (a constexpr: the element type
of the pointer stored through, or the dtype a wrapper passes from :func:`triton_dtype`).  Every
8-bit format is row-scaled (``precision.FORMATS``: ``scaled`` exactly for the 1-byte rows), so a
kernel may derive its ``SCALED`` constexpr as ``dtype.primitive_bitwidth == 8``.

Random numbers: one counter-based scheme for every family, Philox4x32-10 (``tl.philox``):

* key: the mode's seed (``PrecisionMode.seed``, the ``-sr<seed>`` of the mode id), as is;
* counter ``(c0, c1, c2, c3)`` = (element, slot, write counter, stream):
  ``element`` the element's index in the slot's state, head-major
  (``(head * rows + row) * cols + col``); ``slot`` the cache slot; ``write counter`` the slot's
  count of state writes, kept on the device and advanced by the kernel after every write round
  (a commit, a standard step, a reset / re-admission), so a re-admitted slot never reuses a stream;
  ``stream`` which write of that round: the window position ``t`` of a per-token state write,
  :data:`STREAM_FLUSH` for a checkpoint fold, :data:`STREAM_RESET` for a reset's write;
* the draw: the first 32-bit output word; its top 24 bits give a uniform in [0, 1) exact in fp32.

So a stream is reproducible for a seed, distinct for every element of every state write of every
slot, and independent of the launch grid (tile sizes, programs per head).  The torch literal
models draw from their own generator (``rounding.philox_generator``): the two agree in
distribution, not draw for draw.

Triton interpreter traps handled here (docs/kernel_interface.md; ``INTERP`` is a constexpr kernels receive
from :data:`INTERPRET`; no module-level alias of a ``tl`` builtin exists here, the interpreter
would not patch it):

* fp32 -> bf16 casts truncate under the interpreter: round with integer bit arithmetic instead.
* fp32 -> fp8 casts under the interpreter (triton 3.9) do not carry a mantissa round-up into the
  exponent (e4m3: 1.99 -> 1.0, 0.49 -> 0.25), turn NaN into 384 and inf into NaN: round on the
  format's grid in fp32 arithmetic first (its exponent bias and mantissa width from the Triton
  dtype, so every fp8 format shares the code), so the final cast only sees representable values,
  and write NaN's and inf's bit patterns directly.
* Scaled rows: the clamp to +-qmax propagates NaN (``tl.minimum`` alone would turn NaN into qmax
  and hide a non-finite state).
* fp16 casts are correct in both.

On the GPU the native casts are used (round to nearest even; fp8 saturates, and its inputs are
clamped to +-448 first, where saturation and torch agree).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from replayssm.precision import FORMATS

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# the stream word of the Philox counter for writes that are not one window position's
STREAM_FLUSH = tl.constexpr(0)
STREAM_RESET = tl.constexpr(1 << 16)

# the largest stored magnitude of the scaled formats (precision.FORMATS)
_FP8E4M3_QMAX = tl.constexpr(FORMATS["fp8e4m3"].qmax)
_INT8_QMAX = tl.constexpr(FORMATS["int8"].qmax)
_FP8E4M3_MAX = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)

# format name -> the Triton dtype kernels store it as
TRITON_DTYPES = {f.name: getattr(tl, f.triton) for f in FORMATS.values() if f.triton is not None}


def triton_dtype(fmt: str | torch.dtype) -> tl.dtype:
    """The Triton dtype of a storage format (its ``precision.FORMATS`` name or its torch dtype)."""
    for f in FORMATS.values():
        if fmt in (f.name, f.dtype) and f.name in TRITON_DTYPES:
            return TRITON_DTYPES[f.name]
    raise ValueError(f"fmt: expected a storage format Triton kernels can store ({sorted(TRITON_DTYPES)} or their "
                     f"torch dtypes), got {fmt!r}")


@triton.jit
def cast_nearest(x, dtype: tl.constexpr, INTERP: tl.constexpr):
    """fp32 ``x`` in the storage format ``dtype``, rounded to nearest even (fp8: |x| at most the
    format's largest finite value; int8: ``x`` is a quantised value, |x| <= 127).  The interpreter
    roundings are inlined: a nested call re-patches ``triton.language`` under the interpreter."""
    if dtype == tl.float32:
        y = x
    elif dtype == tl.bfloat16:
        if INTERP:
            b = x.to(tl.uint32, bitcast=True)
            rb = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            y = tl.where(x != x, x, rb.to(tl.float32, bitcast=True)).to(tl.bfloat16)
        else:
            y = x.to(tl.bfloat16)
    elif dtype == tl.float16:
        y = x.to(tl.float16)
    elif dtype.primitive_bitwidth == 8 and dtype.is_floating():
        if INTERP:
            # the format's grid at |x|: spacing 2^k, k = max(exponent, 1 - bias) - mantissa bits; the 2^23
            # shifter rounds to nearest even, so the final cast only sees a representable value
            EMIN: tl.constexpr = 1 - dtype.exponent_bias
            MANT: tl.constexpr = dtype.fp_mantissa_width
            mag = tl.abs(x)
            e = (mag.to(tl.int32, bitcast=True) >> 23) & 0xFF
            k = tl.maximum(e - 127, EMIN) - MANT
            q = mag * ((127 - k) << 23).to(tl.float32, bitcast=True)
            rq = ((q + 8388608.0) - 8388608.0) * ((k + 127) << 23).to(tl.float32, bitcast=True)
            sign = x.to(tl.uint32, bitcast=True) & 0x80000000
            rs = (rq.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
            # NaN and inf by their bit patterns (the interpreter's cast makes NaN 384, inf NaN); 0x7F is a NaN
            # in every fp8 format, all-ones exponent and zero mantissa is inf (e4m3fn has none: NaN, as torch)
            INF8: tl.constexpr = 0x7F if dtype == tl.float8e4nv else (0x7F >> MANT) << MANT
            special = tl.where(x != x, 0x7F, INF8).to(tl.uint32) | (sign >> 24)
            y = tl.where(e == 255, special.to(tl.uint8).to(dtype, bitcast=True), rs.to(dtype))
        else:
            y = x.to(dtype)
    else:
        tl.static_assert(dtype == tl.int8, "cast_nearest: dtype must be a storage format's (precision.FORMATS)")
        y = ((x + 12582912.0) - 12582912.0).to(tl.int8)  # 1.5 * 2^23 shifter: round half to even
    return y


@triton.jit
def philox_bits(seed, elem, slot, counter, stream):
    """32 random bits per element of ``elem`` (int tensor): Philox keyed by ``seed`` at the
    counter (element, slot, write counter, stream); see the module docstring."""
    e = elem.to(tl.uint32)
    zero = e * 0
    c0, _, _, _ = tl.philox(seed, e, (zero + slot).to(tl.uint32), (zero + counter).to(tl.uint32),
                            (zero + stream).to(tl.uint32))
    return c0


@triton.jit
def uniform01(bits):
    """uint32 -> uniform in [0, 1) from the top 24 bits (exact in fp32)."""
    return (bits >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def cast_stochastic(x, bits, dtype: tl.constexpr, INTERP: tl.constexpr):
    """fp32 ``x`` in the storage format ``dtype`` (bf16, fp16, fp8 e4m3, int8), rounded
    stochastically with the random ``bits``, as ``rounding.stochastic_round``: the upper neighbour
    with probability (|x| - lo) / (hi - lo).  NaN stays NaN, inf stays inf, a finite value above the
    format's range takes its largest finite neighbour; fp8 e4m3 saturates at 448 (int8: ``x`` is a
    quantised value, |x| <= 127)."""
    u = uniform01(bits)
    if dtype == tl.int8:
        lo = tl.floor(x)
        y = (lo + tl.where(u < x - lo, 1.0, 0.0)).to(tl.int8)
    else:
        tl.static_assert(dtype.is_floating() and dtype.primitive_bitwidth <= 16,
                         "cast_stochastic: dtype must be a 16- or 8-bit float format, or int8")
        ity: tl.constexpr = tl.int8 if dtype.primitive_bitwidth == 8 else tl.int16
        mag = tl.abs(x)
        if dtype == tl.float8e4nv:  # no infinity: saturate (NaN stays NaN)
            mag = tl.minimum(mag, _FP8E4M3_MAX, propagate_nan=tl.PropagateNan.ALL)
        near = cast_nearest(mag, dtype, INTERP)
        nbits = near.to(ity, bitcast=True).to(tl.int32)
        nval = near.to(tl.float32)
        above = nval > mag
        obits = tl.where(above, nbits - 1, nbits + 1)
        if dtype == tl.float8e4nv:
            obits = tl.minimum(obits, 0x7E)  # 0x7F is NaN in e4m3fn: saturate at 448
        oval = obits.to(ity).to(dtype, bitcast=True).to(tl.float32)
        lo = tl.where(above, oval, nval)
        hi = tl.where(above, nval, oval)
        gap = hi - lo
        p_hi = tl.where(gap > 0, (mag - lo) / tl.where(gap > 0, gap, 1.0), 0.0)
        pick = tl.where(u < p_hi, hi, lo)
        pick = tl.where((mag.to(tl.int32, bitcast=True) == 0x7F800000), mag, pick)  # inf (the fp8 upcasts lose it)
        y = cast_nearest(tl.where(x < 0, -pick, pick), dtype, INTERP)
    return y


@triton.jit
def store_state(ptrs, scale_ptrs, S, mask, row_mask, elem, seed, slot, counter, stream,
                SCALED: tl.constexpr, SR: tl.constexpr, INTERP: tl.constexpr):
    """Store an fp32 state tile ``S [rows, cols]`` through ``ptrs`` in their element type.

    SCALED (the 8-bit formats): one fp32 scale per row, ``amax(|row|) / qmax`` (1 for an all-zero
    row), stored through ``scale_ptrs [rows]``, as ``rounding.quantize_state``.  SR: stochastic
    rounding with the Philox counter (``elem`` [rows, cols], slot, counter, stream) under ``seed``."""
    dtype: tl.constexpr = ptrs.dtype.element_ty
    tl.static_assert(SCALED == (dtype.primitive_bitwidth == 8), "store_state: exactly the 8-bit formats are scaled")
    if SCALED:
        if dtype == tl.float8e4nv:
            QMAX: tl.constexpr = _FP8E4M3_QMAX
        else:
            tl.static_assert(dtype == tl.int8, "store_state: no qmax for this 8-bit format")
            QMAX: tl.constexpr = _INT8_QMAX
        amax = tl.max(tl.where(mask, tl.abs(S), 0.0), axis=1)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32)), 1.0)
        q = tl.math.div_rn(S, tl.broadcast_to(scale[:, None], S.shape))
        q = tl.minimum(tl.maximum(q, -QMAX, propagate_nan=tl.PropagateNan.ALL), QMAX,
                       propagate_nan=tl.PropagateNan.ALL)
        tl.store(scale_ptrs, scale, mask=row_mask)
    else:
        q = S
    if SR:
        stored = cast_stochastic(q, philox_bits(seed, elem, slot, counter, stream), dtype, INTERP)
    else:
        stored = cast_nearest(q, dtype, INTERP)
    tl.store(ptrs, stored, mask=mask)


@triton.jit
def load_state(ptrs, scale_ptrs, mask, row_mask, SCALED: tl.constexpr):
    """A stored state tile as fp32 (dequantised with its per-row scales when SCALED)."""
    S = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        sc = tl.load(scale_ptrs, mask=row_mask, other=1.0)
        S = S * sc[:, None]
    return S


__all__ = ["INTERPRET", "STREAM_FLUSH", "STREAM_RESET", "TRITON_DTYPES", "cast_nearest", "cast_stochastic",
           "load_state", "philox_bits", "store_state", "triton_dtype", "uniform01"]
