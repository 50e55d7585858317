"""The bench job's bookkeeping under the interpreter (cursor cycles, rotated sets, the engine's
validation of each configuration, the bytes model) at tiny shapes; GPU timings are docs/benchmarks.md."""

from __future__ import annotations

import json

import pytest

from replayssm.families import family, family_names, preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.records import Recorder, errors
from replayssm.records.jobs import bench_records
from replayssm.registry import kernels
from replayssm.validators.jobs.bench.run import (
    GATE_BATCHES,
    GATE_KERNELS,
    GATE_SPEC_BATCHES,
    SLOW_ENV,
    SPEC_BATCHES,
    STANDARD_BATCHES,
    BenchCase,
    bench_cases,
    bench_family,
    check_configuration,
    check_scenario_of,
    cursor_cycle,
    measure_case,
    slow_fraction,
)
from replayssm.validators.jobs.bench.table import load_runs, render


# gdn's and kda's smoke runs are the slowest (77 s of a loaded 2-core run; kda 19 s idle, 2026-12-01):
# slow tier, for ./dev test's 10 minutes; every Triton kernel is benched in every run by
# tests/bench/test_bench_cpu.py and validated by the family's Triton tests.
@pytest.mark.parametrize("fam", [pytest.param(f, marks=pytest.mark.slow) if f in ("gdn", "kda") else f
                                 for f in family_names()])
def test_bench_family_runs_under_the_interpreter(fam, tmp_path):
    if (fam, "triton-replay") not in kernels(fam):
        pytest.skip(f"family {fam!r} has no Triton kernels (triton-baseline / triton-replay) to bench yet")
    res = bench_family(fam, "tiny", "s32a32", L=2, batches=(1,), spec_batches=(1,), window=2, spec_buffer=2,
                       device="cpu", sweep=False, copy={"tbps": 1.0, "bytes": 1, "ms": 1.0}, max_sets=2,
                       log=lambda s: None)
    assert [r["case"] for r in res["rows"]] == ["standard L=2", "spec T'=2 B=2 all accepted",
                                                "spec T'=2 B=2 half accepted"]
    assert all(r["replay_us"] > 0 and r["baseline_us"] > 0 for r in res["rows"])
    assert all("of bound" in r["check"] for r in res["rows"])
    path = tmp_path / "bench.json"  # the table of docs/benchmarks.md regenerated from the saved result
    path.write_text(json.dumps(res))
    text = render(load_runs([path])[0])
    rows = [ln for ln in text.splitlines() if ln.startswith("| spec") or ln.startswith("| standard")]
    assert len(rows) == 3 and f"{res['rows'][0]['ratio']:.3g}" in rows[0]
    # the bench job's records (it needs a GPU; they are built from this result of the interpreter's bench)
    recs = bench_records(Recorder("bench"), res)
    assert all(errors(r) == [] for r in recs) and len(recs) == 2 * len(res["rows"])
    by_case = {r["case"]: r for r in recs}
    row = res["rows"][0]
    assert by_case[f"{fam}/triton-replay/s32a32/tiny/standard-L2/b1"]["metrics"]["us"] == row["replay_us"]
    assert by_case[f"{fam}/triton-baseline/s32a32/tiny/standard-L2/b1"]["metrics"]["us"] == row["baseline_us"]
    assert f"{fam}/triton-replay/s32a32/tiny/spec-T2-B2-half-accepted/b1" in by_case


def test_bench_refuses_a_configuration_that_fails_validation():
    """A broken configuration cannot be timed: the engine's verdict comes first."""
    sc = check_scenario_of("mamba2", "tiny", "s32a32", DecodeConfig("speculative", 2, 2), 2, {})
    with pytest.raises(AssertionError, match="fails validation"):
        check_configuration("mutant-stale-read", sc, "cpu")


@pytest.mark.parametrize("fam, geometry, lo, hi", [("mamba2", "nano4b", 1.75, 1.85), ("gdn", "qwen35-4b", 1.74, 1.84)])
def test_bytes_model_limits(fam, geometry, lo, hi):
    """Spec 10: bytes-model limits of replay over baseline at fp32 state, bf16 activations, L = 16
    (Mamba-2 AR 1.81x, GDN AR 1.79x); the speculative cursor cycle of T' = 4, B = 16 at k = 4."""
    t = family(fam).traffic(preset(geometry, fam), parse_mode("s32a16"))
    dec = DecodeConfig("standard", 1, 16)
    limit = t.baseline_step(1) / t.replay_cycle_mean(dec, cursor_cycle(dec, 1)[1])
    assert lo < limit < hi
    spec = DecodeConfig("speculative", 4, 16)
    prefix, cycle = cursor_cycle(spec, 4)
    assert prefix == [0] and [w for w, _ in cycle] == [4, 8, 12, 16] and [f for _, f in cycle][-1]


def test_suite_cases_come_from_the_registry():
    """tests/bench: every family x deployable kernel x decode case x batch of docs/benchmarks.md; the
    gate's subset is our two kernels at its batch sizes; literal models and mutants are never timed."""
    cases = bench_cases()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    for fam in family_names():
        mine = [c for c in cases if c.family == fam and c.kernel == "triton-replay"]
        assert sorted({c.batch for c in mine if c.decode == "standard"}) == list(STANDARD_BATCHES)
        assert {(c.accepted, c.batch) for c in mine if c.decode == "speculative"} == {
            (a, b) for a in ("all", "half") for b in SPEC_BATCHES}
    assert not any(c.kernel.startswith(("literal-", "mutant-")) for c in cases)
    gate = bench_cases(gate=True)
    assert {c.kernel for c in gate} == set(GATE_KERNELS) and set(gate) <= set(cases)
    assert {c.batch for c in gate} == set(GATE_BATCHES) | set(GATE_SPEC_BATCHES)
    base = next(c for c in cases if c.kernel == "triton-baseline" and c.decode == "standard")
    assert base.decode_config.buffer == 1 and base.id == f"{base.family}-triton-baseline-std-L16-b{base.batch}"


@pytest.mark.parametrize("text, kernel, expected", [("", "triton-replay", 0.0),
                                                    ("triton-replay=0.5", "triton-replay", 0.5),
                                                    ("triton-replay=0.5, triton-baseline=2", "triton-baseline", 2.0),
                                                    ("triton-replay=0.5", "triton-baseline", 0.0)])
def test_slowdown_applies_to_the_named_kernel_only(text, kernel, expected):
    assert slow_fraction(kernel, text) == expected


@pytest.mark.parametrize("text", ["triton-replay", "triton-replay=", "=0.5", "triton-replay=-1", "triton-replay=x"])
def test_a_malformed_slowdown_is_refused(text):
    with pytest.raises(ValueError, match="REPLAYSSM_BENCH_SLOW: expected KERNEL=FRACTION"):
        slow_fraction("triton-replay", text)


def test_the_slowdown_is_recorded_with_the_timing(monkeypatch):
    """A slowed timing says so (the gate's report and the JSON show which cases were slowed)."""
    monkeypatch.setenv(SLOW_ENV, "triton-baseline=0.5")
    case = BenchCase("mamba2", "triton-baseline", "baseline", "standard", "", 1, "tiny", mode="s32a32")
    timing, extra = measure_case(case, copy=None, device="cpu", max_sets=2)
    assert timing.slow_fraction == extra["slow_fraction"] == 0.5


def test_bench_table_refuses_what_is_not_a_run(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": [], "family": "mamba2"}))  # a bench result would name copy and env too
    with pytest.raises(ValueError, match="not pytest-benchmark JSON"):
        load_runs([p])
    with pytest.raises(ValueError, match="cannot read"):
        load_runs([tmp_path / "missing.json"])
