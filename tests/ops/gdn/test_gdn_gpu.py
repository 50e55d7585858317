"""GDN Triton kernels on a GPU, through the validation engine (issue 5).

Oracle: ``replayssm.validators.engine.runner.run_scenario``: the fp64 token-by-token recurrence on the
GPU, the literal model at the same precision mode (tolerance rule), and the exact invariants.
Geometries qwen35-4b (16 key / 32 value heads, K = V = 128) and gdn-hv64 (16 / 64 heads);
every supported precision mode; batch 1 to 512.  At batch 512 the literal model (per-row Python)
and the snapshot invariants are off: the run checks every output for poison/non-finite values
and bounds the worst error in units of the mode's u by what the small-batch runs reach.

Expected error: the tolerance rule (<= 2 x literal + 4 u x scale) on every output and state.
Run: ``nox -s gpu`` or ``pytest -m gpu tests/ops/gdn/test_gdn_gpu.py`` (skips without CUDA).
"""

from __future__ import annotations

import pytest
import torch
from gpu_tiers import BIG_MEMORY, scenario_in_merge_tier, tiered

from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SUPPORTED = ("s32a32", "s32a16", "s32afp16", "s16a16", "s16a16-sr", "sfp16a16", "sfp16a16-sr", "sfp16afp16",
             "sfp8a16", "sfp8a16-sr")
SLOTS6 = (4, -1, 0, 7, -1, 2)
# worst output error at batch 512, in units of u x the row's max |reference| (small batches reach ~2)
MAX_IN_U_LARGE = 8.0


def _sc(geometry, mode, decode, T, B, schedule, steps, rows=6, slot_ids=SLOTS6, num_slots=9, **kw) -> Scenario:
    return Scenario(family="gdn", geometry=geometry, mode=mode, decode=decode, window=T, buffer=B, rows=rows,
                    num_slots=num_slots, slot_ids=slot_ids, schedule=schedule, steps=steps, **kw)


def _cases():
    out = []
    for mode in SUPPORTED:
        out += [
            (f"replay-{mode}-L16-T1-qwen35-4b", "triton-replay", _sc("qwen35-4b", mode, "standard", 1, 16,
                                                                     "random", 18)),
            (f"replay-{mode}-B16-T4-qwen35-4b", "triton-replay", _sc("qwen35-4b", mode, "speculative", 4, 16,
                                                                     "per-row", 10)),
            (f"baseline-{mode}-T1-qwen35-4b", "triton-baseline", _sc("qwen35-4b", mode, "standard", 1, 16,
                                                                     "random", 3)),
            (f"baseline-{mode}-B16-T4-qwen35-4b", "triton-baseline", _sc("qwen35-4b", mode, "speculative", 4, 16,
                                                                         "per-row", 4)),
        ]
        pre = {"prepass": True}  # rows = 6: the automatic choice is the fused kernel
        out += [
            (f"replay-prepass-{mode}-L16-T1-qwen35-4b", "triton-replay",
             _sc("qwen35-4b", mode, "standard", 1, 16, "random", 18, kernel_options=pre)),
            (f"replay-prepass-{mode}-B16-T4-qwen35-4b", "triton-replay",
             _sc("qwen35-4b", mode, "speculative", 4, 16, "per-row", 10, kernel_options=pre)),
        ]
    for mode in ("s32a16", "s32a32", "s16a16-sr", "sfp8a16-sr"):  # the pair with programmatic dependent launch
        pdl = {"prepass": True, "pdl": True}
        out += [
            (f"replay-prepass-pdl-{mode}-L16-T1-qwen35-4b", "triton-replay",
             _sc("qwen35-4b", mode, "standard", 1, 16, "random", 18, kernel_options=pdl)),
            (f"replay-prepass-pdl-{mode}-B16-T4-qwen35-4b", "triton-replay",
             _sc("qwen35-4b", mode, "speculative", 4, 16, "per-row", 10, kernel_options=pdl)),
        ]
    for mode in ("s32a32-tf32", "s32a16-tf32x3"):
        out.append((f"replay-prepass-{mode}-B16-T4-qwen35-4b", "triton-replay",
                    _sc("qwen35-4b", mode, "speculative", 4, 16, "per-row", 10)))
    for mode in ("s32a32", "sfp8a16", "s16a16"):  # the split tensor-core readouts (an option: the slow tier)
        out.append((f"replay-split-{mode}-B16-T4-qwen35-4b", "triton-replay",
                    _sc("qwen35-4b", mode, "speculative", 4, 16, "per-row", 10, kernel_options={"readout": "split"})))
    for L in (1, 4, 8, 32):
        out.append((f"replay-s32a16-L{L}-T1-qwen35-4b", "triton-replay",
                    _sc("qwen35-4b", "s32a16", "standard", 1, L, "random", L + 2)))
    out.append(("replay-s32a16-B8-T4-exhaustive-qwen35-4b", "triton-replay",
                _sc("qwen35-4b", "s32a16", "speculative", 4, 8, "exhaustive", None)))
    out.append(("replay-prepass-s32a16-B8-T4-exhaustive-qwen35-4b", "triton-replay",
                _sc("qwen35-4b", "s32a16", "speculative", 4, 8, "exhaustive", None, kernel_options={"prepass": True})))
    for mode in ("s32a16", "sfp8a16-sr"):
        out += [
            (f"replay-{mode}-L16-T1-gdn-hv64", "triton-replay", _sc("gdn-hv64", mode, "standard", 1, 16,
                                                                    "random", 18)),
            (f"replay-{mode}-B16-T4-gdn-hv64", "triton-replay", _sc("gdn-hv64", mode, "speculative", 4, 16,
                                                                    "slot-reuse", 10)),
            (f"baseline-{mode}-T1-gdn-hv64", "triton-baseline", _sc("gdn-hv64", mode, "standard", 1, 16, "random",
                                                                    3)),
            (f"baseline-{mode}-B16-T4-gdn-hv64", "triton-baseline", _sc("gdn-hv64", mode, "speculative", 4, 16,
                                                                        "per-row", 4)),
        ]
    for name in ("triton-replay", "triton-baseline"):
        out += [
            (f"{name[7:]}-s32a16-L16-T1-batch1", name, _sc("qwen35-4b", "s32a16", "standard", 1, 16, "random", 17,
                                                          rows=1, slot_ids=(1,), num_slots=2)),
            (f"{name[7:]}-s32a16-B16-T4-batch1", name, _sc("qwen35-4b", "s32a16", "speculative", 4, 16, "per-row",
                                                          8, rows=1, slot_ids=(1,), num_slots=2)),
        ]
    return out


CASES = _cases()


def _merge_tier(case) -> bool:
    return scenario_in_merge_tier(case[1], "qwen35-4b")  # tests/gpu_tiers.py


@pytest.mark.parametrize("name,sc", tiered([c[1:] for c in CASES], _merge_tier, ids=[c[0] for c in CASES]))
def test_engine_gpu(name, sc):
    res = run_scenario(sc, name, device="cuda")
    assert res.exception is None, res.exception
    assert res.passed, [str(f) for f in res.failures[:5]]


LARGE = [(f"{n[7:]}-{d}-batch512", n, d, T, steps) for n in ("triton-replay", "triton-baseline")
         for d, T, steps in (("standard", 1, 17), ("speculative", 4, 8))]


@BIG_MEMORY  # tests/gpu_tiers.py: one at a time under pytest-xdist
@pytest.mark.parametrize("name,decode,T,steps", [c[1:] for c in LARGE], ids=[c[0] for c in LARGE])
def test_engine_gpu_batch512(name, decode, T, steps):
    ids = tuple(range(1, 513))[::-1]  # a permutation: row r uses slot 512 - r
    sc = _sc("qwen35-4b", "s32a16", decode, T, 16, "per-row" if T > 1 else "random", steps, rows=512, slot_ids=ids,
             num_slots=513)
    res = run_scenario(sc, name, device="cuda", repeat_check=False, literal_every=0, invariants_every=steps,
                       state_every=steps)
    assert res.exception is None, res.exception
    assert res.passed, [str(f) for f in res.failures[:5]]
    assert res.summary["worst in_u"] <= MAX_IN_U_LARGE, res.summary
