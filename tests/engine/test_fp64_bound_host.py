"""The fp64 bound's window on host arrays is RunningBound.window, bit for bit (checks/fp64_bound_host.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replayssm.precision import parse_mode
from replayssm.validators.engine.checks.fp64_bound import RunningBound
from replayssm.validators.engine.checks.fp64_bound_host import window_outputs

R, H, T = 3, 5, 4


def _bound(mode: str, replay: bool, seed: int) -> RunningBound:
    b = RunningBound(lambda tok, params, heads: {k: v.clone() for k, v in tok.items()}, parse_mode(mode), replay,
                     R, H, "cpu")
    g = torch.Generator().manual_seed(seed)
    b.cur = {k: torch.rand((R, H), generator=g, dtype=torch.float64) * 10.0 ** (3 * i - 6)
             for i, k in enumerate(("E", "A", "M", "n", "L"))}
    return b


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64)


@pytest.mark.parametrize("records", [False, True], ids=["rho-c", "rho-c-p-q"])
@pytest.mark.parametrize("decode", ["standard", "speculative", "speculative-all"])
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "baseline"])
@pytest.mark.parametrize("mode", ["s32a16", "sfp16a16-sr"])
def test_host_window_is_the_torch_window_bitwise(mode, replay, decode, records):
    spec = decode.startswith("speculative")
    g = torch.Generator().manual_seed(7)
    keys = ("rho", "c", "dL") + (("p", "q") if records else ())
    toks = [{k: torch.rand((R, H), generator=g, dtype=torch.float64) * 3 for k in keys} for _ in range(T)]
    toks[1]["c"][0, 2] = float("nan")  # a NaN is kept by the maximum over heads, as amax keeps it
    weights = torch.rand((T, R, H), generator=g, dtype=torch.float64)
    flush = torch.tensor([True, False, True])
    accepted = torch.tensor([0, 2, 4]) if decode == "speculative" else None
    if decode == "speculative-all":
        accepted = torch.tensor([4, 4, 4])
    ref, host = _bound(mode, replay, 1), _bound(mode, replay, 1)
    want = ref.window(toks, {}, flush, spec, accepted, torch.zeros((R, H, 2, 2), dtype=torch.float64), None,
                      weights=weights, outputs_only=True)["output"]
    coef = {k: np.stack([t[k].numpy() for t in toks]) for k in keys}
    got = window_outputs(host, coef, weights.numpy(), flush.numpy(), spec,
                         None if accepted is None else accepted.numpy())
    assert torch.equal(_bits(torch.from_numpy(got)), _bits(want))
    for k in ref.cur:
        assert torch.equal(_bits(host.cur[k]), _bits(ref.cur[k])), k
