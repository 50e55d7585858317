"""KDA Triton kernels on a GPU, through the validation engine, at the real preset.

Oracle: ``replayssm.validators.engine.runner.run_scenario``: the fp64 token-by-token KDA recurrence on the
GPU, the family's literal model at the same precision mode (tolerance rule), and the exact
invariants.  Geometry kimi-linear-48b (32 heads, K = V = 128); every supported precision mode;
both paths (single kernel, pre-pass + stream) of standard decode and speculative verify; batch 1
to 512.  At batch 512 the
literal model (per-row Python) and the snapshot invariants are off: the run checks every output
for poison/non-finite values and bounds the worst error in units of the mode's u.

Expected error: the tolerance rule (<= 2 x literal + 4 u x scale) on every output and state.
Run: ``pytest -m gpu tests/ops/kda/test_kda_gpu.py`` (skips without CUDA); the gpu-merge-tier profile runs it.
"""

from __future__ import annotations

import pytest
import torch
from gpu_tiers import BIG_MEMORY, scenario_in_merge_tier, tiered

from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GEO = "kimi-linear-48b"
SUPPORTED = ("s32a32", "s32a16", "s32afp16", "s16a16", "s16a16-sr", "sfp16a16", "sfp16a16-sr", "sfp16afp16",
             "sfp8a16", "sfp8a16-sr")
SLOTS6 = (4, -1, 0, 7, -1, 2)
# worst output error at batch 512, in units of u x the row's max |reference| (the GDN kernels' bound)
MAX_IN_U_LARGE = 8.0


def _sc(mode, decode, T, B, schedule, steps, rows=6, slot_ids=SLOTS6, num_slots=9, **kw) -> Scenario:
    return Scenario(family="kda", geometry=GEO, mode=mode, decode=decode, window=T, buffer=B, rows=rows,
                    num_slots=num_slots, slot_ids=slot_ids, schedule=schedule, steps=steps, **kw)


def _cases():
    out = []
    for mode in SUPPORTED:
        out += [
            (f"replay-{mode}-L16-T1", "triton-replay", _sc(mode, "standard", 1, 16, "random", 18)),
            (f"replay-prepass-{mode}-L16-T1", "triton-replay",
             _sc(mode, "standard", 1, 16, "random", 18, kernel_options={"prepass": True})),
            (f"replay-fused-{mode}-B16-T4", "triton-replay",
             _sc(mode, "speculative", 4, 16, "per-row", 10, kernel_options={"prepass": False})),
            (f"replay-prepass-{mode}-B16-T4", "triton-replay", _sc(mode, "speculative", 4, 16, "per-row", 10)),
            (f"baseline-{mode}-T1", "triton-baseline", _sc(mode, "standard", 1, 16, "random", 3)),
            (f"baseline-{mode}-B16-T4", "triton-baseline", _sc(mode, "speculative", 4, 16, "per-row", 4)),
        ]
    for mode in ("s32a32-tf32", "s32a16-tf32x3"):  # tensor-core readouts: the pre-pass path at every batch size
        out.append((f"replay-{mode}-L16-T1", "triton-replay", _sc(mode, "standard", 1, 16, "random", 18)))
    for L in (1, 4, 8, 32):
        out.append((f"replay-prepass-s32a16-L{L}-T1", "triton-replay",
                    _sc("s32a16", "standard", 1, L, "random", L + 2, kernel_options={"prepass": True})))
    out.append(("replay-s32a16-B8-T4-exhaustive", "triton-replay",
                _sc("s32a16", "speculative", 4, 8, "exhaustive", None)))
    for name in ("triton-replay", "triton-baseline"):
        out += [
            (f"{name[7:]}-s32a16-L16-T1-batch1", name, _sc("s32a16", "standard", 1, 16, "random", 17, rows=1,
                                                          slot_ids=(1,), num_slots=2)),
            (f"{name[7:]}-s32a16-B16-T4-batch1", name, _sc("s32a16", "speculative", 4, 16, "per-row", 8, rows=1,
                                                          slot_ids=(1,), num_slots=2)),
        ]
    return out


CASES = _cases()


def _merge_tier(case) -> bool:
    return scenario_in_merge_tier(case[1], GEO)  # tests/gpu_tiers.py


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
    sc = _sc("s32a16", decode, T, 16, "per-row" if T > 1 else "random", steps, rows=512, slot_ids=ids,
             num_slots=513)
    res = run_scenario(sc, name, device="cuda", repeat_check=False, literal_every=0, invariants_every=steps,
                       state_every=steps)
    assert res.exception is None, res.exception
    assert res.passed, [str(f) for f in res.failures[:5]]
    assert res.summary["worst in_u"] <= MAX_IN_U_LARGE, res.summary
