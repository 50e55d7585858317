"""The suite's own speed as benchmarks (GPU): validated tokens/s of the drift lock-step (the fast
path: CUDA graphs of the kernel and the fp64 reference steps, ``replayssm drift``) and scenarios/s of
the fuzzer (``nox -s fuzz``), per registered family, for its ``triton-replay`` kernel.

Oracle: each run must itself pass (no exception, no failed exact check in the drift cell, no
failure found by the fuzzer): the speed of a broken run is not a benchmark.  Rounds: one drift chunk
(64 steps x 8 rows) or one fuzzing run of the same derandomized scenarios, wall time after a
synchronize.  Nothing asserts a time: the gate is ``nox -s bench``.
"""

from __future__ import annotations

import pytest
import torch
from bench_support import drift_chunks, fuzz_rounds, gate

from replayssm.families import family, family_names
from replayssm.registry import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.bench,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
KERNEL = "triton-replay"
FAMILIES = [f for f in family_names() if (f, KERNEL) in kernels(f)]


@pytest.mark.parametrize("fam", FAMILIES)
def test_drift_lockstep_tokens_per_s(fam, measured):
    samples, extra = drift_chunks(fam, KERNEL, family(fam).bench_geometry, "cuda", rows=8, chunk=64,
                                  warm=2 if gate() else 3, timed=6 if gate() else 12)
    measured(samples, group="suite: drift lock-step (s per 64-step chunk, 8 rows)", **extra)


@pytest.mark.skipif(gate(), reason="the gate leaves the fuzzer's speed out: its first round compiles the kernels "
                                   "for every scenario shape (minutes of device time); the full run measures it")
@pytest.mark.parametrize("fam", FAMILIES)
def test_fuzz_scenarios_per_s(fam, measured):
    samples, extra = fuzz_rounds(fam, KERNEL, "cuda", examples=12, rounds=3)
    measured(samples, group="suite: fuzz (s per scenario, ci profile)", **extra)
