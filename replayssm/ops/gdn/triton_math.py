"""Jitted building blocks shared by the Gated DeltaNet Triton kernels: gates, normalisation,
rounding to storage dtypes, stochastic rounding and per-row fp8 quantisation of state tiles.

Oracle: ``replayssm.ops.gdn.naive`` (gates, L2 norm) and ``replayssm.rounding`` (torch's
round-to-nearest-even casts, ``stochastic_round``, ``quantize_state``).  Expected error: casts
are bit-identical to torch's; gates and norms are fp32 (a few ulp, from the GPU's exp/log).

Triton interpreter (CPU CI) workarounds, spec section 9 and measured here on triton 3.9:

* fp32 -> bf16 casts truncate under the interpreter: :func:`to_bf16_rne` rounds with integer bit
  arithmetic instead (selected by the ``INTERPRET`` constexpr).
* fp32 -> fp8 e4m3 casts are wrong under the interpreter (1.98 -> 1.0 when rounding carries into
  the exponent, subnormals truncated: 98 of 4,096 random values): :func:`to_fp8e4m3_rne` does it
  with bit arithmetic.
* No kernel here uses ``tl.dot`` (every contraction is an fp32 FMA reduction), so the bf16-dot
  garbage of the interpreter cannot arise.

On a GPU the native casts are used (round to nearest even, fp8 with saturation; inputs to the
fp8 cast are clamped to +-448 first, where saturation and torch agree).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
FP8_MAX = tl.constexpr(448.0)


@triton.jit
def log1p(x):
    """log(1 + x) accurate for small x (Goldberg's correction)."""
    y = 1.0 + x
    return tl.where(y == 1.0, x, tl.log(y) * (x / (y - 1.0)))


@triton.jit
def gates(a, b, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) (softplus is the identity above 20)."""
    u = a + dt_bias
    sp = tl.where(u > 20.0, u, log1p(tl.exp(tl.minimum(u, 20.0))))
    g = -tl.exp(A_log) * sp
    beta = 1.0 / (1.0 + tl.exp(-b))
    return g, beta


@triton.jit
def l2_normalise(x, axis: tl.constexpr):
    """x / sqrt(sum(x^2) + 1e-6) along ``axis``."""
    n = tl.sqrt_rn(tl.sum(x * x, axis) + 1e-6)
    return x / tl.expand_dims(n, axis)


@triton.jit
def to_bf16_rne(x):
    """fp32 -> bf16, round to nearest even, by integer arithmetic (NaN stays NaN)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def to_fp8e4m3_rne(x):
    """fp32 in [-448, 448] -> fp8 e4m3fn, round to nearest even, by integer arithmetic."""
    xb = x.to(tl.uint32, bitcast=True)
    a = tl.abs(x)
    # subnormals (|x| < 2^-6): the value in units of 2^-9, rounded to an integer (1.5 * 2^23 trick)
    sub = ((a * 512.0 + 12582912.0) - 12582912.0).to(tl.uint32)
    ab = a.to(tl.uint32, bitcast=True)
    ab = ab + 0x7FFFF + ((ab >> 20) & 1)
    nrm = ((((ab >> 23) & 0xFF) - 120) << 3) | ((ab >> 20) & 7)
    bits = tl.where(a < 0.015625, sub, nrm)
    bits = tl.where(a != a, 0x7F, bits) | ((xb >> 31) << 7)
    return bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def cast_rne(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """Round fp32 ``x`` to ``dtype`` to nearest even, the same on the GPU and the interpreter."""
    if INTERPRET and dtype == tl.bfloat16:
        return to_bf16_rne(x)
    elif INTERPRET and dtype == tl.float8e4nv:
        return to_fp8e4m3_rne(x)
    else:
        return x.to(dtype)


@triton.jit
def cast_stochastic(x, dtype: tl.constexpr, u, INTERPRET: tl.constexpr):
    """Round fp32 ``x`` to ``dtype`` (bf16, fp16, fp8 e4m3) stochastically with uniforms ``u``:
    the upper neighbour with probability (|x| - lo) / (hi - lo), as ``rounding.stochastic_round``
    (NaN stays NaN, inf stays inf, a finite value above the format's range takes its largest
    finite neighbour as in the reference; fp8 saturates at 448)."""
    ity: tl.constexpr = tl.int8 if dtype == tl.float8e4nv else tl.int16
    mag = tl.abs(x)
    near = cast_rne(mag, dtype, INTERPRET)
    nbits = near.to(ity, bitcast=True).to(tl.int32)
    nval = near.to(tl.float32)
    above = nval > mag
    obits = tl.where(above, nbits - 1, nbits + 1)
    if dtype == tl.float8e4nv:
        obits = tl.minimum(obits, 0x7E)
    oval = obits.to(ity).to(dtype, bitcast=True).to(tl.float32)
    lo = tl.where(above, oval, nval)
    hi = tl.where(above, nval, oval)
    gap = hi - lo
    p_hi = tl.where(gap > 0, (mag - lo) / tl.where(gap > 0, gap, 1.0), 0.0)
    pick = tl.where(u < p_hi, hi, lo)
    pick = tl.where(x < 0, -pick, pick)
    return cast_rne(pick, dtype, INTERPRET)


@triton.jit
def load_state_tile(ptr, scale_ptr, offs, row_offs, mask, row_mask, SCALED: tl.constexpr):
    """A state tile as fp32 (dequantised with its per-row scales when SCALED)."""
    s = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        sc = tl.load(scale_ptr + row_offs, mask=row_mask, other=1.0)
        s = s * sc[:, None]
    return s


@triton.jit
def store_state_tile(ptr, scale_ptr, s, offs, row_offs, mask, row_mask, rand_key, rand_offs,
                     SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr):
    """Store fp32 tile ``s`` [rows, K] in the dtype of ``ptr``: nearest or stochastic rounding; fp8
    with one fp32 scale per row (amax / 448, 1 for an all-zero row) as ``rounding.quantize_state``.
    Stochastic rounding draws ``tl.rand(rand_key, rand_offs)``: the int64 key is unique per slot, state
    write and head, the int32 offsets [rows, K] per element (Philox4x32-10)."""
    dtype: tl.constexpr = ptr.dtype.element_ty
    if SCALED:
        amax = tl.max(tl.where(mask, tl.abs(s), 0.0), 1)
        scale = tl.where(amax > 0, tl.div_rn(amax, FP8_MAX), 1.0)
        scale = tl.where(amax == amax, scale, amax)  # a NaN row keeps a NaN scale
        q = tl.div_rn(s, scale[:, None])
        q = tl.where(q != q, q, tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX))
        tl.store(scale_ptr + row_offs, scale, mask=row_mask)
    else:
        q = s
    if SR:
        u = tl.rand(rand_key, rand_offs)
        val = cast_stochastic(q, dtype, u, INTERPRET)
    else:
        val = cast_rne(q, dtype, INTERPRET)
    tl.store(ptr + offs, val, mask=mask)


@triton.jit
def ticket(ticket_ptr, slot, NPROG: tl.constexpr):
    """True in exactly one program of a slot's ``NPROG`` programs: the last to take a ticket, which
    then resets it for the next launch.  Called after every read of the slot's cursor: each program
    has consumed the cursor (its loads and stores depend on it) before it issues the atomic, so the
    last program's cursor write cannot reach a read of this launch.  A relaxed atomic suffices (an
    acq_rel one would fence every program on its outstanding stores)."""
    old = tl.atomic_add(ticket_ptr + slot, 1, sem="relaxed")
    last = old == NPROG - 1
    tl.store(ticket_ptr + slot, 0, mask=last)
    return last
