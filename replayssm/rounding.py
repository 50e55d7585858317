"""Rounding to storage precisions, as the literal models do it.

Oracle: torch's own casts (round to nearest even) for nearest rounding.  Stochastic rounding
picks one of the two neighbouring representable values with probability proportional to
closeness, so it is unbiased: E[round(x)] = x exactly (tested for bias in tests/test_rounding.py).

fp8 e4m3 and int8 states carry one fp32 scale per row (the last state dimension is the row):
``scale = amax(|row|) / qmax`` (448 for e4m3, 127 for int8), ``stored = round(row / scale)``.
Expected error: half a unit in the last place of the storage format, relative to the element
(fp/bf16), or to the row maximum (fp8, int8).
"""

from __future__ import annotations

import torch

from replayssm.precision import PrecisionMode

FP8_MAX = 448.0
INT8_MAX = 127.0

_BITS_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float8_e4m3fn: torch.uint8}


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
    """Round ``x`` (fp32/fp64) to ``dtype`` (bf16, fp16 or fp8 e4m3) stochastically, unbiased."""
    if dtype not in _BITS_VIEW:
        raise ValueError(f"dtype: stochastic rounding targets bf16, fp16 or fp8 e4m3, got {dtype}")
    mag = x.abs()
    if dtype == torch.float8_e4m3fn:
        mag = mag.clamp(max=FP8_MAX)
    near = mag.to(dtype)
    bits = near.view(_BITS_VIEW[dtype]).to(torch.int32)
    near_val = near.to(torch.float64)
    mag64 = mag.to(torch.float64)
    above = near_val > mag64
    other_bits = torch.where(above, bits - 1, bits + 1)
    if dtype == torch.float8_e4m3fn:
        other_bits = other_bits.clamp(max=0x7E)  # 0x7F is NaN in e4m3fn: saturate at 448
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
    """Store a compute-precision state in the mode's state dtype.

    Returns ``(stored, scale)``; ``scale`` is None unless the state is fp8/int8, when it has the
    state's shape without its last dimension (one fp32 scale per slot/head/row).
    """
    sr = mode.rounding == "stochastic"
    if sr and generator is None:
        raise ValueError("generator: stochastic rounding needs a torch.Generator")
    if not mode.scaled_state:
        return round_to(s, mode.state_dtype, stochastic=sr, generator=generator), None
    s32 = s.to(torch.float32)
    qmax = FP8_MAX if mode.state == "fp8e4m3" else INT8_MAX
    amax = s32.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = s32 / scale.unsqueeze(-1)
    if mode.state == "fp8e4m3":
        q = q.clamp(-FP8_MAX, FP8_MAX)
        stored = round_to(q, torch.float8_e4m3fn, stochastic=sr, generator=generator)
    else:
        if sr:
            fl = torch.floor(q)
            q = fl + (_uniform_like(q, generator) < (q - fl).to(torch.float64)).to(q.dtype)
        else:
            q = torch.round(q)
        stored = q.clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return stored, scale


def dequantize_state(stored: torch.Tensor, scale: torch.Tensor | None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The value a stored state represents, in ``dtype`` (exact for fp64/fp32 targets)."""
    if scale is None:
        return stored.to(dtype)
    return (stored.to(torch.float32) * scale.to(torch.float32).unsqueeze(-1)).to(dtype)
