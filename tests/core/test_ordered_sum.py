"""``pairwise_sum``: the fp64 references' readout sum in one fixed order.

Oracle: the halving tree written out by hand for small lengths, and ``math.fsum`` (the exact sum,
rounded once) within log2(n) roundings.
"""

from __future__ import annotations

import math

import pytest
import torch

from replayssm.ops.ordered_sum import pairwise_sum


def test_the_order_is_the_halving_tree():
    x = torch.tensor([1e16, 1.0, -1e16, 1.0, 3.0, 1e-3, 7.0, -2.0], dtype=torch.float64)
    want = ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]))
    assert pairwise_sum(x).item() == want.item()
    assert pairwise_sum(x).item() != x.tolist()[0] + sum(x.tolist()[1:])  # another order, other bits


@pytest.mark.parametrize("n", [1, 3, 5, 16, 100, 128])
def test_pairwise_sum_is_accurate_and_keeps_leading_dims(n):
    x = torch.randn((3, 2, n), generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    got = pairwise_sum(x)
    assert got.shape == (3, 2)
    for idx in ((0, 0), (2, 1)):
        exact = math.fsum(x[idx].tolist())
        bound = max(1, math.ceil(math.log2(n))) * 2.0 ** -53 * float(x[idx].abs().sum())
        assert abs(got[idx].item() - exact) <= bound


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 100])
def test_numpy_levels_equal_torch_levels_bitwise(dtype, n, monkeypatch):
    """The CPU form (NumPy adds) against the torch form (forced by leaving the dtype out of the NumPy
    list), bit for bit, special values included (signed zeros, infinities, NaN)."""
    from replayssm.ops import ordered_sum
    g = torch.Generator().manual_seed(n)
    scale = 10.0 ** torch.randint(-8, 9, (4, 3, n), generator=g)
    x = (torch.randn((4, 3, n), generator=g, dtype=torch.float64) * scale).to(dtype)
    x[0, 0, 0], x[1, 1, -1], x[2, 2, 0] = -0.0, float("inf"), float("nan")
    x[3, 0] = -0.0
    got = pairwise_sum(x)
    monkeypatch.setattr(ordered_sum, "_NUMPY_DTYPES", ())
    want = pairwise_sum(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.int64 if dtype == torch.float64 else torch.int32),
                       want.contiguous().view(torch.int64 if dtype == torch.float64 else torch.int32))
