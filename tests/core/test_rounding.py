"""Rounding to storage precisions: nearest equals torch's cast, stochastic is unbiased and only
ever returns a neighbour, scaled fp8/int8 states stay within half a step of the row maximum.
Every format of ``precision.FORMATS`` it applies to is tested (a new row is covered at once)."""

import pytest
import torch

from replayssm.precision import FORMATS, parse_mode
from replayssm.rounding import dequantize_state, philox_generator, quantize_state, round_tf32, stochastic_round

SR_FLOATS = {f.name: f.dtype for f in FORMATS.values() if f.stochastic and f.dtype.is_floating_point}
SCALED = [f for f in FORMATS.values() if f.scaled]


@pytest.mark.parametrize("dtype", SR_FLOATS.values(), ids=SR_FLOATS.keys())
def test_stochastic_round_unbiased_and_neighbours(dtype):
    x = torch.tensor([1.0 + 1.0 / 3.0, -0.7123, 3.14159, 0.013], dtype=torch.float32)
    n = 40000
    samples = stochastic_round(x.repeat(n, 1), dtype, philox_generator(1, 2, 3)).to(torch.float64)
    for j in range(x.numel()):
        vals = samples[:, j].unique()
        assert vals.numel() == 2, f"expected the two neighbours of {x[j].item()}, got {vals.tolist()}"
        gap = (vals.max() - vals.min()).item()
        standard_error = gap / 2 / n**0.5
        assert abs(samples[:, j].mean().item() - x[j].item()) < 5 * standard_error


def test_stochastic_round_is_reproducible():
    x = torch.randn(1000)
    a = stochastic_round(x, torch.bfloat16, philox_generator(7))
    b = stochastic_round(x, torch.bfloat16, philox_generator(7))
    c = stochastic_round(x, torch.bfloat16, philox_generator(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("dtype", SR_FLOATS.values(), ids=SR_FLOATS.keys())
def test_stochastic_round_exact_values_unchanged(dtype):
    x = torch.tensor([1.0, -2.5, 0.0, 448.0])
    assert torch.equal(stochastic_round(x, dtype, philox_generator(0)).float(), x)


def test_stochastic_round_refuses_other_dtypes():
    with pytest.raises(ValueError, match="dtype: stochastic rounding targets"):
        stochastic_round(torch.ones(2), torch.float32, philox_generator(0))


@pytest.mark.parametrize("mode_id", [f"s{f.token}a16{sr}" for f in SCALED for sr in ("", "-sr")])
def test_scaled_state_error_bound(mode_id):
    m = parse_mode(mode_id)
    s = torch.randn(3, 4, 8, 16) * torch.logspace(-3, 2, 16)
    stored, scale = quantize_state(s, m, philox_generator(0))
    assert stored.dtype == m.state_dtype and scale.shape == s.shape[:-1]
    back = dequantize_state(stored, scale, torch.float64)
    rowmax = s.abs().amax(-1, keepdim=True).double()
    # nearest: half a step; stochastic: under one step. fp8 steps are relative (3 mantissa bits).
    rel = (back - s.double()).abs() / rowmax
    bound = 2 * m.state_unit_roundoff * (2 if m.rounding == "stochastic" else 1)
    assert rel.max().item() <= bound


@pytest.mark.parametrize("fmt", SCALED, ids=[f.name for f in SCALED])
def test_quantize_zero_row_and_saturation(fmt):
    s = torch.zeros(2, 4)
    s[1] = torch.tensor([1.0, -3.0, 0.5, 2.0])
    stored, scale = quantize_state(s, parse_mode(f"s{fmt.token}a16"))
    assert float(scale[0]) == 1.0 and float(stored.float().abs().max()) == fmt.qmax
    assert torch.equal(dequantize_state(stored, scale)[0], torch.zeros(4))


def test_round_tf32():
    x = torch.randn(10000)
    r = round_tf32(x)
    assert ((r - x).abs() / x.abs()).max().item() <= 2.0**-11
    assert torch.equal(round_tf32(r), r)
    assert (r.view(torch.int32) & 0x1FFF).eq(0).all()
