"""Kernel benchmarks of every registered family (pytest-benchmark, GPU): our Triton kernels and the
adapters registered on this machine, standard decode L = 16 and speculative T' = 4, B = 16 (all and
half of each window accepted), at the batch sizes of docs/benchmarks.md, each case in its default
launch configuration.

Oracle: each case is first validated by the engine against the fp64 reference over a whole cursor
cycle (``validators.bench.check_configuration``: ``run_scenario``, the literal model's tolerance rule,
every exact check); a case that fails validation fails here and is never timed.  The timing is the
bench harness's (``validators.bench.time_kernel_samples``: CUDA graph of whole cursor cycles over
rotated input/state sets, L2 cleared before each replay, CUDA events): every replay is one round of
the pytest-benchmark statistics (seconds per decode step).  ``extra_info`` carries the modelled bytes
per step, the achieved bandwidth and the copy ceiling measured in the same run.  Nothing here asserts
a time: the regression gate is ``nox -s bench -- --baseline DIR`` (``replayssm results gate``).
"""

from __future__ import annotations

import os
import pathlib

import pytest
import torch
from bench_support import gate, rep_ms

from replayssm import adapters
from replayssm.adapters import _vllm_source
from replayssm.validators.jobs.bench.run import bench_cases, measure_case

pytestmark = [pytest.mark.gpu, pytest.mark.bench,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PEERS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "peers" / "vllm-replayssm"
if torch.cuda.is_available() and not gate():  # the gate times our kernels only (adapters do not change per commit)
    if not os.environ.get(_vllm_source.ENV) and PEERS.is_dir():
        os.environ[_vllm_source.ENV] = str(PEERS)
    adapters.load()
CASES = bench_cases(gate=gate())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel(case, measured, copy_ceiling, run_env):
    why = case.unsupported_reason()
    if why:
        pytest.skip(why)
    timing, extra = measure_case(case, copy=copy_ceiling, device="cuda", rep_ms=rep_ms())
    measured([us * 1e-6 for us in timing.samples_us], group=case.group, commit=run_env.get("commit"), **extra)
