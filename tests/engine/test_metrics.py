"""The mismatch metrics of validators/engine/metrics.py against their definitions, written out in fp64.

Oracle: ``||a - b|| / ||b||`` with both sides upcast to fp64 first.  Expected difference: none, bit
for bit -- a narrower operand is upcast exactly inside a mixed-dtype subtraction, so
``row_rel_l2`` need not materialise the upcast copy of a whole state (what drift's flush and state
measurements pass it: a kernel's fp32 / bf16 state against the fp64 reference).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.validators.engine.metrics import rel_l2_into, row_rel_l2


def _written_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.to(torch.float64).flatten(1), b.to(torch.float64).flatten(1)
    return torch.linalg.vector_norm(a - b, dim=1) / torch.linalg.vector_norm(b, dim=1).clamp_min(1e-300)


DTYPES = [(torch.float32, torch.float64), (torch.bfloat16, torch.float64), (torch.float64, torch.float16),
          (torch.float32, torch.float32), (torch.float64, torch.float64)]


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_row_rel_l2_equals_its_definition_bitwise(dtypes):
    g = torch.Generator().manual_seed(3)
    b64 = torch.randn(5, 3, 17, dtype=torch.float64, generator=g)
    a = (b64 + 1e-3 * torch.randn(5, 3, 17, dtype=torch.float64, generator=g)).to(dtypes[0])
    b = b64.to(dtypes[1])
    b[2] = 0  # a zero reference row: the clamp
    a[4, 1, 3] = float("nan")  # non-finite stays non-finite
    got, want = row_rel_l2(a, b), _written_out(a, b)
    assert got.dtype == torch.float64 and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_rel_l2_into_writes_per_row_and_position():
    g = torch.Generator().manual_seed(4)
    ref = torch.randn(3, 2, 4, 5, dtype=torch.float64, generator=g)
    out = (ref + 1e-4).to(torch.float32)
    dst = torch.empty(3, 2, dtype=torch.float64)
    rel_l2_into(out, ref, dst)
    want = (torch.linalg.vector_norm((out.double() - ref).flatten(2), dim=2)
            / torch.linalg.vector_norm(ref.flatten(2), dim=2))
    assert torch.equal(dst, want)
