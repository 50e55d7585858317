"""Rounding to storage precisions, as the literal models do it.

Oracle: torch's own casts (round to nearest even) for nearest rounding.  Stochastic rounding
picks one of the two neighbouring representable values with probability proportional to
closeness, so it is unbiased: E[round(x)] = x exactly (tested for bias in tests/core/test_rounding.py).

Scaled formats (fp8 e4m3, int8: the rows of ``precision.FORMATS`` with a ``qmax``) carry one fp32
scale per row (the last state dimension is the row): ``scale = amax(|row|) / qmax`` (1 for an
all-zero row; 448 for e4m3, 127 for int8), ``stored = round(clamp(row / scale, +-qmax))``.
Everything here is generic over the format table: a float format rounds through torch's cast and
the bit neighbours of its result, an integer format through ``torch.round`` / floor plus a draw.
Expected error: half a unit in the last place of the storage format, relative to the element
(fp/bf16), or to the row maximum (fp8, int8).
"""

from __future__ import annotations

import functools

import torch

from replayssm.precision import FORMATS, PrecisionMode

FP8_MAX = FORMATS["fp8e4m3"].qmax
INT8_MAX = FORMATS["int8"].qmax

# the float formats stochastic rounding targets, viewed as integers of their width
_BITS_VIEW = {f.dtype: {1: torch.uint8, 2: torch.int16}[f.nbytes] for f in FORMATS.values()
              if f.stochastic and f.dtype.is_floating_point}


@functools.cache
def _max_finite_bits(dtype: torch.dtype) -> int:
    """The bit pattern of the largest finite value of a float format."""
    return int(torch.tensor(torch.finfo(dtype).max).to(dtype).view(_BITS_VIEW[dtype]).to(torch.int32))


@functools.cache
def _has_inf(dtype: torch.dtype) -> bool:
    return bool(torch.tensor(float("inf")).to(dtype).float().isinf())


def philox_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded from an integer key (reproducible, independent of global RNG)."""
    h = 0x9E3779B97F4A7C15
    for k in key:
        h = (h ^ (int(k) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    g = torch.Generator(device="cpu")
    g.manual_seed(h & 0x7FFFFFFFFFFFFFFF)
    return g


def _uniform_like(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(x.shape, generator=generator, dtype=torch.float64).to(x.device)


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Round ``x`` (fp32/fp64) to a float ``dtype`` of the format table (bf16, fp16, fp8 e4m3)
    stochastically, unbiased.  A format without infinities (e4m3fn) saturates at its largest
    finite value; one with infinities keeps inf and never rounds a finite value up to it."""
    if dtype not in _BITS_VIEW:
        raise ValueError(f"dtype: stochastic rounding targets one of {list(_BITS_VIEW)}, got {dtype}")
    mag = x.abs()
    if not _has_inf(dtype):
        mag = mag.clamp(max=torch.finfo(dtype).max)
    near = mag.to(dtype)
    bits = near.view(_BITS_VIEW[dtype]).to(torch.int32)
    near_val = near.to(torch.float64)
    mag64 = mag.to(torch.float64)
    above = near_val > mag64
    other_bits = torch.where(above, bits - 1, bits + 1)
    other_bits = other_bits.clamp(max=_max_finite_bits(dtype))  # e4m3fn: 0x7F is NaN, saturate at 448
    other = other_bits.to(_BITS_VIEW[dtype]).view(dtype)
    other_val = other.to(torch.float64)
    lo_val = torch.where(above, other_val, near_val)
    hi_val = torch.where(above, near_val, other_val)
    gap = hi_val - lo_val
    p_hi = torch.where(gap > 0, (mag64 - lo_val) / torch.where(gap > 0, gap, 1.0), torch.zeros_like(gap))
    take_hi = _uniform_like(p_hi, generator) < p_hi
    lo = torch.where(above, other, near)
    hi = torch.where(above, near, other)
    out = torch.where(take_hi, hi, lo)
    out = torch.where(torch.isfinite(mag), out, near)  # inf/nan pass through as the nearest cast
    neg = x < 0
    return torch.where(neg, -out.to(torch.float32), out.to(torch.float32)).to(dtype)


def round_to(x: torch.Tensor, dtype: torch.dtype, *, stochastic: bool = False,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Round to ``dtype``: nearest-even, or stochastic when asked (needs a generator)."""
    if not stochastic or dtype in (torch.float32, torch.float64):
        return x.to(dtype)
    if generator is None:
        raise ValueError("generator: stochastic rounding needs a torch.Generator")
    return stochastic_round(x, dtype, generator)


def truncate_tf32(x: torch.Tensor) -> torch.Tensor:
    """Cut fp32 values to tf32 (10 explicit mantissa bits) toward zero, kept in fp32: what a tensor core's
    tf32 MMA does with fp32 operands given to it unrounded (Triton's ``tl.dot(..., input_precision="tf32")``
    on NVIDIA GPUs), an error up to 2^-10 relative and one-signed, where rounding to nearest gives 2^-11."""
    out = (x.to(torch.float32).view(torch.int32) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x.to(torch.float32))


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to tf32 (10 explicit mantissa bits), nearest-even, kept in fp32."""
    b = x.to(torch.float32).view(torch.int32).to(torch.int64)
    lsb = (b >> 13) & 1
    b = (b + 0x0FFF + lsb) & ~0x1FFF
    b = torch.where(b >= 2**31, b - 2**32, b)
    out = b.to(torch.int32).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x.to(torch.float32))


def quantize_state(s: torch.Tensor, mode: PrecisionMode,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Store a compute-precision state in the mode's state format.

    Returns ``(stored, scale)``; ``scale`` is None unless the format is scaled (fp8, int8), when it
    has the state's shape without its last dimension (one fp32 scale per slot/head/row).
    """
    sr = mode.rounding == "stochastic"
    if sr and generator is None:
        raise ValueError("generator: stochastic rounding needs a torch.Generator")
    if not mode.scaled_state:
        return round_to(s, mode.state_dtype, stochastic=sr, generator=generator), None
    fmt = FORMATS[mode.state]
    s32 = s.to(torch.float32)
    amax = s32.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / fmt.qmax, torch.ones_like(amax))
    q = s32 / scale.unsqueeze(-1)
    if fmt.dtype.is_floating_point:
        q = q.clamp(-fmt.qmax, fmt.qmax)
        stored = round_to(q, fmt.dtype, stochastic=sr, generator=generator)
    else:
        if sr:
            fl = torch.floor(q)
            q = fl + (_uniform_like(q, generator) < (q - fl).to(torch.float64)).to(q.dtype)
        else:
            q = torch.round(q)
        stored = q.clamp(-fmt.qmax, fmt.qmax).to(fmt.dtype)
    return stored, scale


def dequantize_state(stored: torch.Tensor, scale: torch.Tensor | None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The value a stored state represents, in ``dtype`` (exact for fp64/fp32 targets)."""
    if scale is None:
        return stored.to(dtype)
    return (stored.to(torch.float32) * scale.to(torch.float32).unsqueeze(-1)).to(dtype)
