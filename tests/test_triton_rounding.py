"""The Triton rounding helpers (replayssm/ops/triton_rounding.py) against torch's casts.

Oracle: torch's round-to-nearest-even casts (bf16, fp16, fp8 e4m3fn) and the definition of
unbiased stochastic rounding.  Runs through the Triton interpreter on CPU, where the plain casts
are wrong (spec 9): fp32 -> bf16 truncates, fp32 -> fp8 e4m3 drops the carry of a mantissa
round-up into the exponent.  The first two tests show both traps are real, so the helpers'
bit-exact tests below are not vacuous.
"""

import pytest
import torch
import triton
import triton.language as tl

from replayssm.ops.triton_rounding import INTERPRET, cast_nearest, philox_bits, stochastic_round

KINDS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float8_e4m3fn: torch.uint8}


@triton.jit
def _plain_cast_kernel(x_ptr, y_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    if KIND == "bf16":
        y = x.to(tl.bfloat16)
    else:
        y = x.to(tl.float8e4nv)
    tl.store(y_ptr + i, y, mask=i < n)


@triton.jit
def _nearest_kernel(x_ptr, y_ptr, n, KIND: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, cast_nearest(x, KIND, INTERP), mask=i < n)


@triton.jit
def _stochastic_kernel(x_ptr, y_ptr, n, seed, counter, KIND: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    bits = philox_bits(seed, i, tl.program_id(0), counter, 0)
    tl.store(y_ptr + i, stochastic_round(x, bits, KIND), mask=i < n)


def _values(n=4096, seed=0, fp8=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-12, 12, (n,), generator=g).float())
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 1.9961, 0.49, 1e-30, -1e-30, 3.0e-3, 65504.0, 448.0, -448.0,
                          float("inf"), float("-inf"), float("nan")])
    x[: edges.numel()] = edges
    if fp8:
        x = x.clamp(-448.0, 448.0)
    return x


def _run(kernel, x, dtype, **kw):
    y = torch.empty(x.shape, dtype=dtype)
    kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024, **kw)
    return y


def _bit_mismatches(a, b):
    a_nan, b_nan = torch.isnan(a.float()), torch.isnan(b.float())
    same = (a.view(_BITS[a.dtype]) == b.view(_BITS[b.dtype])) | (a_nan & b_nan)
    return int((~same).sum())


@pytest.mark.skipif(not INTERPRET, reason="the trap is the interpreter's (the GPU casts round to nearest even)")
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_interpreter_plain_casts_are_wrong(kind):
    x = _values(fp8=kind == "fp8")
    y = _run(_plain_cast_kernel, x, KINDS[kind], KIND=kind)
    assert _bit_mismatches(y, x.to(KINDS[kind])) > 10


@pytest.mark.parametrize("kind", ["bf16", "fp16", "fp8"])
def test_cast_nearest_is_torchs_round_to_nearest_even(kind):
    x = _values(fp8=kind == "fp8")
    y = _run(_nearest_kernel, x, KINDS[kind], KIND=kind, INTERP=INTERPRET)
    assert _bit_mismatches(y, x.to(KINDS[kind])) == 0


def _neighbours(x, dtype):
    """The two representable values around each x (torch only), as fp64."""
    near = x.to(dtype)
    bits = near.view(_BITS[dtype]).to(torch.int32)
    nv = near.double()
    up = torch.where(nv.abs() < x.double().abs(), bits + 1, bits - 1)
    other = up.to(_BITS[dtype]).view(dtype).double()
    return torch.minimum(nv, other), torch.maximum(nv, other)


@pytest.mark.parametrize("kind", ["bf16", "fp16", "fp8"])
def test_stochastic_round_picks_a_neighbour_unbiased_and_reproducibly(kind):
    dtype = KINDS[kind]
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(64, generator=g) * 3).clamp(-400, 400)
    x = base.repeat_interleave(512)  # 512 draws of each value
    y = _run(_stochastic_kernel, x, torch.float32, seed=7, counter=3, KIND=kind)
    lo, hi = _neighbours(x, dtype)
    yd = y.double()
    assert bool(((yd == lo) | (yd == hi)).all()), "a stochastically rounded value is not a neighbour"
    assert torch.equal(y.to(dtype).float(), y), "the result must be exactly representable"
    gap = (hi - lo).view(64, 512)[:, 0]
    mean_err = (yd - x.double()).view(64, 512).mean(1) / gap
    # unbiased: the mean over 512 draws within 4.5 sigma (sigma <= 0.5 / sqrt(512) ulp)
    assert float(mean_err.abs().max()) < 4.5 * 0.5 / 512 ** 0.5
    assert torch.equal(y, _run(_stochastic_kernel, x, torch.float32, seed=7, counter=3, KIND=kind))
    other = _run(_stochastic_kernel, x, torch.float32, seed=8, counter=3, KIND=kind)
    assert not torch.equal(y, other), "a different seed must give a different stream"
    assert not torch.equal(y, _run(_stochastic_kernel, x, torch.float32, seed=7, counter=4, KIND=kind))


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # numpy on inf - inf inside the interpreter
def test_stochastic_round_keeps_exact_and_special_values():
    x = torch.tensor([0.0, 1.0, -2.0, 0.5, float("inf"), float("-inf"), float("nan")] + [3.0] * 9)
    for kind in ("bf16", "fp16", "fp8"):
        y = _run(_stochastic_kernel, x, torch.float32, seed=1, counter=0, KIND=kind)
        assert torch.equal(y[:4], x[:4])
        assert torch.isnan(y[6]) and y[4] == float("inf") and y[5] == float("-inf")
