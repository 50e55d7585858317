"""Fixtures of the benchmark suite (tests/bench): the measured-time feed into pytest-benchmark and
the copy ceiling of the run (see bench_support.py)."""

from __future__ import annotations

import os

import pytest
import torch
from bench_support import MeasuredClock

from replayssm.validators.jobs.bench.run import copy_bandwidth, environment


@pytest.fixture
def measured(benchmark):
    """``measured(samples_s, group=..., **extra_info)``: report the measured times (seconds, one per
    round) through pytest-benchmark, with ``extra_info``; returns the clock (``.used`` rounds fed)."""

    def feed(samples_s: list[float], group: str | None = None, **extra) -> MeasuredClock:
        if not hasattr(benchmark, "_timer"):  # the attribute every pytest-benchmark release times rounds with
            raise RuntimeError("pytest-benchmark: this version has no BenchmarkFixture._timer to feed measured times")
        clock = MeasuredClock(samples_s)
        benchmark._timer = clock
        if group:
            benchmark.group = group
        benchmark.extra_info.update(extra)
        benchmark.pedantic(clock.advance, rounds=len(clock.samples), iterations=1, warmup_rounds=0)
        return clock

    return feed


@pytest.fixture(scope="session")
def copy_ceiling() -> dict:
    """The device copy bandwidth of this run (``validators.bench.copy_bandwidth``), measured once."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    c = copy_bandwidth("cuda")
    torch.cuda.empty_cache()
    return c


@pytest.fixture(scope="session")
def run_env() -> dict:
    """``validators.bench.environment()`` once per session: versions, GPU, and the commit
    (``$REPLAYSSM_COMMIT`` on a copy without .git, where pytest-benchmark's commit_info is empty)."""
    return environment()


def pytest_benchmark_update_commit_info(config, commit_info):
    """A device copy of the tree carries no (or a stale) .git: ``$REPLAYSSM_COMMIT`` names the commit
    the run measured, and the saved JSON's commit_info says so instead of the stale repository's."""
    if os.environ.get("REPLAYSSM_COMMIT"):
        commit_info.clear()
        commit_info.update(id=os.environ["REPLAYSSM_COMMIT"], dirty=False, project="replayssm",
                           source="$REPLAYSSM_COMMIT")
