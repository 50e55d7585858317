"""Settings of the benchmark suite from the environment, and the clock that feeds measured times
into pytest-benchmark (used by tests/bench/conftest.py and the benchmark modules).

pytest-benchmark times a callable with its own clock; our kernel times are CUDA-event times of CUDA
graph replays (validators/jobs/bench/run.py), so the ``measured`` fixture hands pytest-benchmark a
:class:`MeasuredClock` that advances by exactly one measured sample per round: its statistics (min,
median, IQR, ...), and so the regression gate's comparison against a saved run (``replayssm results
gate``), are those of the measured samples.

Environment: ``REPLAYSSM_BENCH_GATE=1`` the regression gate's subset of cases
(``validators.bench.bench_cases(gate=True)``); ``REPLAYSSM_BENCH_REP_MS`` the ``do_bench`` time per case
(default 100 ms); ``REPLAYSSM_BENCH_SLOW`` the test-only slowdown (``validators.bench.slow_fraction``).
"""

from __future__ import annotations

import os
import time

import torch

from replayssm.precision import parse_mode
from replayssm.validators.jobs.drift.sweep import CellRun, CellSpec, SweepConfig
from replayssm.validators.jobs.fuzz.run import fuzz_kernel

GATE_ENV = "REPLAYSSM_BENCH_GATE"
REP_ENV = "REPLAYSSM_BENCH_REP_MS"


def gate() -> bool:
    return os.environ.get(GATE_ENV, "") == "1"


def rep_ms() -> float:
    text = os.environ.get(REP_ENV, "100")
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ValueError(f"{REP_ENV}: expected a positive number of milliseconds, got {text!r}")
    return v


class MeasuredClock:
    """A clock for pytest-benchmark that moves only when :meth:`advance` consumes the next measured sample."""

    __name__ = "replayssm-measured-samples"

    def __init__(self, samples_s: list[float]) -> None:
        if not samples_s or min(samples_s) <= 0:
            raise ValueError(f"samples_s: expected positive measured times in seconds, got {samples_s[:4]!r}")
        self.now = 0.0
        self.samples = list(samples_s)
        self.used = 0

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += self.samples[self.used]
        self.used += 1


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def drift_chunks(family_name: str, kernel: str, geometry: str, device, *, rows: int, chunk: int, warm: int,
                 timed: int) -> tuple[list[float], dict]:
    """Wall seconds of each of ``timed`` chunks of ``chunk`` steps of one drift cell (standard decode
    L = 16, s32a16 on a GPU / s32a32 on a CPU, ``long-memory``), after ``warm`` chunks (compilation,
    CUDA-graph capture), and the cell's throughput.  Fails when the cell reports an exception or a
    failed exact check: the speed of a broken run is not a benchmark."""
    mode = "s32a16" if torch.device(device).type == "cuda" else "s32a32"
    tokens = chunk * (warm + timed)
    cfg = SweepConfig(families=(family_name,), kernels=(kernel,), modes=(mode,), schedules=("standard",),
                      geometry={family_name: geometry}, rows=rows, tokens=tokens, blocks=min(128, tokens))
    run = CellRun(CellSpec(family_name, kernel, parse_mode(mode).id, "long-memory", "standard"), cfg, device,
                  chunk=chunk)
    for _ in range(warm):
        run.run_steps(chunk)
    _sync(device)
    samples = []
    for _ in range(timed):
        t0 = time.perf_counter()
        run.run_steps(chunk)
        _sync(device)
        samples.append(time.perf_counter() - t0)
    res = run.result()
    assert res["exception"] is None and not res["failures"], (res["exception"], res["failures"][:2])
    assert res["tokens_run"] == tokens, res["tokens_run"]
    per_chunk = sorted(samples)[len(samples) // 2]
    return samples, {"family": family_name, "kernel": kernel, "geometry": geometry, "mode": mode, "rows": rows,
                     "chunk_steps": chunk, "fast_path": run.fast is not None,
                     "tokens_per_s": rows * chunk / per_chunk}


def fuzz_rounds(family_name: str, kernel: str, device, *, examples: int, rounds: int) -> tuple[list[float], dict]:
    """Wall seconds per scenario of ``rounds`` fuzzing runs of ``examples`` scenarios each (the ``ci``
    profile: derandomized, the same scenarios every round and every run), after one untimed round
    that compiles what they need; fails when the fuzzer finds a failure."""
    def one() -> float:
        rep = fuzz_kernel(kernel, family_name, profile="ci", device=device, max_examples=examples)
        assert not rep.caught, rep.summary()
        assert rep.examples >= 1, rep.summary()
        return rep.wall_s / rep.examples

    one()
    samples = [one() for _ in range(rounds)]
    per = sorted(samples)[len(samples) // 2]
    return samples, {"family": family_name, "kernel": kernel, "examples": examples, "scenarios_per_s": 1.0 / per}
