"""The bench job's bookkeeping under the interpreter (cursor cycles, rotated sets, the engine's
validation of each configuration, the bytes model) at tiny shapes; GPU timings are docs/benchmarks.md."""

from __future__ import annotations

import pytest

from replayssm.families import family, family_names, preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import kernels
from replayssm.validators.bench import bench_family, check_configuration, check_scenario_of, cursor_cycle


@pytest.mark.parametrize("fam", family_names())
def test_bench_family_runs_under_the_interpreter(fam):
    if (fam, "triton-replay") not in kernels(fam):
        pytest.skip(f"family {fam!r} has no Triton kernels (triton-baseline / triton-replay) to bench yet")
    res = bench_family(fam, "tiny", "s32a32", L=2, batches=(1,), spec_batches=(1,), window=2, spec_buffer=2,
                       device="cpu", sweep=False, copy={"tbps": 1.0, "bytes": 1, "ms": 1.0}, max_sets=2,
                       log=lambda s: None)
    assert [r["case"] for r in res["rows"]] == ["standard L=2", "spec T'=2 B=2 all accepted",
                                                "spec T'=2 B=2 half accepted"]
    assert all(r["replay_us"] > 0 and r["baseline_us"] > 0 for r in res["rows"])
    assert all("of bound" in r["check"] for r in res["rows"])


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
