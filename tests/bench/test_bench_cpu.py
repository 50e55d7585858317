"""The benchmark suite's CPU smoke set (Triton interpreter, tiny shapes): the kernel benchmark and the
suite-speed benchmarks of every family run end to end through pytest-benchmark, and
``validators.bench_table`` turns a saved run into the tables of docs/benchmarks.md.  Interpreter
timings mean nothing: nothing here is compared or gates (the GPU suite is tests/bench/test_bench_*.py
under ``nox -s bench``).

Oracle: the bench harness's own validation (fp64 reference, every exact check) before each timing; the
reported bytes and bandwidth are the bytes model over the measured median; the JSON pytest-benchmark
writes carries them and the table generator reads them back.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_support import drift_chunks, fuzz_rounds

from replayssm.families import family_names
from replayssm.registry import get
from replayssm.validators.jobs.bench.run import BenchCase, measure_case, step_bytes
from replayssm.validators.jobs.bench.table import fmt, load_runs, render

FAMILIES = family_names()


def tiny_case(fam: str, kernel: str = "triton-replay", decode: str = "standard") -> BenchCase:
    return BenchCase(fam, kernel, get(kernel, fam).kind, decode, "all" if decode == "speculative" else "", 1, "tiny",
                     mode="s32a32", L=2, window=2, spec_buffer=2)


@pytest.mark.parametrize("kernel", ["triton-baseline", "triton-replay"])
@pytest.mark.parametrize("fam", FAMILIES)
def test_kernel_cpu(fam, kernel, measured, one_thread):
    case = tiny_case(fam, kernel)
    timing, extra = measure_case(case, copy=None, device="cpu", max_sets=2)
    assert timing.timing == "wall" and "of bound" in timing.verdict
    row = step_bytes(fam, "tiny", "s32a32", case.kind, case.decode_config, 1)
    assert extra["bytes_per_step"] == row
    assert math.isclose(extra["tbps"], row / (timing.median_us * 1e-6) / 1e12)
    assert extra["copy_tbps"] is None and extra["pct_copy"] is None  # no copy ceiling on a CPU
    measured([us * 1e-6 for us in timing.samples_us], group=case.group, **extra)


@pytest.mark.parametrize("fam", FAMILIES)
def test_drift_lockstep_cpu(fam, measured, one_thread):
    samples, extra = drift_chunks(fam, "literal-replay", "tiny", "cpu", rows=2, chunk=16, warm=1, timed=2)
    assert len(samples) == 2 and extra["tokens_per_s"] > 0
    measured(samples, group="suite: drift lock-step (CPU smoke)", **extra)


def test_fuzz_cpu(measured, one_thread):
    samples, extra = fuzz_rounds(FAMILIES[0], "literal-replay", "cpu", examples=2, rounds=1)
    assert extra["scenarios_per_s"] > 0
    measured(samples, group="suite: fuzz (CPU smoke)", **extra)


@pytest.mark.slow  # a subprocess pytest run (the 10-minute budget; tests/jobs/test_bench.py renders tables in CI)
def test_tables_come_from_a_saved_run(tmp_path):
    """A real pytest-benchmark run of two smoke cases (subprocess, no xdist) saved as JSON; the table
    generator reads it back: one row per case with the run's own medians."""
    out = tmp_path / "run.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    here = Path(__file__).resolve()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "no:randomly",
           str(here), "-k", f"test_kernel_cpu and {FAMILIES[0]}", f"--benchmark-json={out}"]
    proc = subprocess.run(cmd, cwd=here.parents[2], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    benches = {b["extra_info"]["case"]: b for b in data["benchmarks"]}
    assert sorted(benches) == sorted(tiny_case(FAMILIES[0], k).id for k in ("triton-baseline", "triton-replay"))
    runs = load_runs([out])
    text = render(runs[0])
    for b in benches.values():  # the measured samples went through pytest-benchmark unchanged
        assert math.isclose(b["extra_info"]["median_us"], b["stats"]["median"] * 1e6, rel_tol=1e-9)
    assert f"## {FAMILIES[0]}" in text and "| case | batch |" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("| standard L=2 | 1 |")]
    assert len(lines) == 1, text
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    for kernel in ("triton-baseline", "triton-replay"):
        assert fmt(benches[tiny_case(FAMILIES[0], kernel).id]["stats"]["median"] * 1e6) in cells
    base, rep = (benches[tiny_case(FAMILIES[0], k).id]["stats"]["median"] for k in ("triton-baseline", "triton-replay"))
    assert fmt(base / rep) in cells
