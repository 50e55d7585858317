"""Drift analysis on synthetic curves whose law, rate and crossing point are known.

Noise is multiplicative log-normal (sigma 0.3), so the binned RMS curve is the noiseless curve
times exp(sigma^2): the truths below carry that factor.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from replayssm.validators.jobs.drift.analysis import (
    BinnedCurve,
    compare_speculative,
    effective_precision,
    fit_growth,
    injected_per_flush,
    log_bins,
    predict_at,
    tokens_to_budget,
)

T = 20000
SIGMA = 0.3
RMS = math.exp(SIGMA**2)
t = np.arange(1, T + 1, dtype=np.float64)

CURVES = {
    "bounded-constant": (lambda t: np.full_like(t, 3e-4), "bounded"),
    "bounded-saturating": (lambda t: np.sqrt(1e-8 + 1e-6 * -np.expm1(-t / 500.0)), "bounded"),
    "sqrt": (lambda t: np.sqrt(1e-8 + 1e-9 * t), "sqrt"),
    "linear": (lambda t: 1e-5 + 1e-7 * t, "linear"),
    "exponential": (lambda t: 1e-6 + 1e-6 * np.expm1(t / 3000.0), "exponential"),
}


def noisy(f: np.ndarray, seed: int) -> np.ndarray:
    return f * np.exp(np.random.default_rng(seed).normal(0.0, SIGMA, f.shape))


@pytest.mark.parametrize("seed", [0, 1, 2], ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("name", list(CURVES))
def test_law_is_recovered(name, seed):
    f, law = CURVES[name]
    fit = fit_growth(t, noisy(f(t), seed))
    assert fit.law == law, fit.to_dict()["weights"]


@pytest.mark.parametrize("criterion", ["aic", "bic"])
def test_rates_within_standard_errors(criterion):
    fit = fit_growth(t, noisy(np.sqrt(1e-8 + 1e-9 * t), 5), criterion=criterion)
    assert fit.best.model == "sqrt"
    a, se = fit.best.params["a"], fit.best.stderr["a"]
    assert 0 < se < 0.1 * a
    assert abs(a - math.sqrt(1e-9) * RMS) < 4 * se
    assert abs(fit.exponent - 0.5) < 4 * fit.exponent_stderr + 0.02
    lin = fit_growth(t, noisy(1e-5 + 1e-7 * t, 6), criterion=criterion)
    assert abs(lin.best.params["b"] - 1e-7 * RMS) < 4 * lin.best.stderr["b"]
    ex = fit_growth(t, noisy(1e-6 + 1e-6 * np.expm1(t / 3000.0), 7), criterion=criterion)
    assert abs(ex.best.params["lam"] - 1 / 3000.0) < 4 * ex.best.stderr["lam"]


def test_saturation_level_and_unsaturated_curve():
    sat = fit_growth(t, noisy(np.sqrt(1e-8 + 1e-6 * -np.expm1(-t / 500.0)), 3))
    assert sat.saturation == pytest.approx(math.sqrt(1e-8 + 1e-6) * RMS, rel=0.05)
    # The same process with a memory far longer than the run has not saturated: not bounded.
    slow = fit_growth(t, noisy(np.sqrt(1e-8 + 1e-6 * -np.expm1(-t / 2e6)), 3))
    assert slow.law == "sqrt" and slow.saturation is None


def test_tokens_to_budget_matches_the_law():
    e = noisy(np.sqrt(1e-8 + 1e-9 * t), 4)
    fit = fit_growth(t, e)
    budget = 6e-3  # crossing at (b^2 - e0^2) / a^2 ~ 3e4 tokens, beyond the 2e4 observed
    want = (budget**2 - (1e-4 * RMS) ** 2) / (1e-9 * RMS**2)
    r = tokens_to_budget(fit, budget, t, e)
    assert r["predicted"] == pytest.approx(want, rel=0.1)
    assert r["predicted_stderr"] is not None and r["predicted_stderr"] < 0.2 * r["predicted"]
    assert r["observed"] is None  # never crossed within the 2e4 tokens observed
    low = tokens_to_budget(fit, 2e-3, t, e)
    assert low["observed"] is not None and 0.5 * low["predicted"] < low["observed"] < 2 * low["predicted"]
    assert tokens_to_budget(fit, 1e-6)["predicted"] == 0.0
    bounded = fit_growth(t, noisy(np.full_like(t, 3e-4), 1))
    assert tokens_to_budget(bounded, 1e-3)["predicted"] == math.inf
    assert predict_at(fit, 1e6) == pytest.approx(math.sqrt((1e-4 * RMS) ** 2 + 1e-9 * RMS**2 * 1e6), rel=0.1)


def test_special_outcomes_and_bad_input():
    assert fit_growth(t, np.zeros_like(t)).law == "exact"
    e = np.full_like(t, 1e-5)
    e[100] = np.nan
    nf = fit_growth(t, e)
    assert nf.law == "nonfinite" and tokens_to_budget(nf, 1.0)["predicted"] == 0.0
    with pytest.raises(ValueError, match="criterion"):
        fit_growth(t, e, criterion="r2")
    with pytest.raises(ValueError, match="at least 6"):
        fit_growth(t[:4], np.ones(4))
    with pytest.raises(ValueError, match="err"):
        fit_growth(t, np.ones(3))
    with pytest.raises(ValueError, match="budget"):
        tokens_to_budget(nf, -1.0)


def test_log_bins_rms_and_positions():
    tb, rms, count = log_bins([1, 1, 2, 100], [3.0, 4.0, 1.0, 2.0], nbins=4)
    assert count.sum() == 4
    # Edges floor(geomspace(1, 101, 5)) = 1, 3, 10, 31, 101: positions 1, 1, 2 share the first bin.
    assert rms[0] == pytest.approx(math.sqrt(26 / 3)) and tb[0] == pytest.approx(2 ** (1 / 3))
    assert rms[-1] == pytest.approx(2.0) and tb[-1] == pytest.approx(100.0)


def test_injected_per_flush_recovers_a_random_walk():
    rng = np.random.default_rng(0)
    delta, D, F = 1e-3, 512, 400
    walk = np.cumsum(rng.normal(0, delta / math.sqrt(D), (F, D)), axis=0)
    E = np.linalg.norm(walk, axis=1)
    f = np.arange(1, F + 1)
    r = injected_per_flush(f, E)
    assert r["basis"] == "growth" and r["estimate"] == pytest.approx(delta, rel=0.1)
    local = np.abs(rng.normal(0, 2e-3, F))
    r2 = injected_per_flush(f, E, local)
    assert r2["basis"] == "local" and r2["estimate"] == pytest.approx(2e-3, rel=0.15)
    with pytest.raises(ValueError, match="flush_index"):
        injected_per_flush([0, 1], [1.0, 1.0])


def test_speculation_test_detects_added_error_and_stays_quiet_otherwise():
    rng = np.random.default_rng(1)
    base = 1e-4 * np.exp(rng.normal(0, 0.5, (4, 4096)))
    same = base * np.exp(rng.normal(0, 0.05, base.shape))
    more = base * 1.3 * np.exp(rng.normal(0, 0.05, base.shape))
    yes = compare_speculative(base, more)
    assert yes["adds_error"] and yes["p_value"] < 1e-6 and yes["test"] == "wilcoxon-signed-rank"
    assert yes["ratio_ci95"][0] < 1.3 < yes["ratio_ci95"][1] * 1.02
    no = compare_speculative(base, same)
    assert not no["adds_error"] and no["p_value"] > 0.01
    unpaired = compare_speculative(base, more[:, :3000])
    assert unpaired["test"] == "mann-whitney-u" and unpaired["adds_error"]
    assert compare_speculative(base, base)["p_value"] == 1.0


def test_effective_precision_flags_lost_bits():
    ok = effective_precision(2e-3, 2.0**-8)
    assert ok["basis"] == "direct" and not ok["worse"] and ok["bits_eff"] == pytest.approx(-math.log2(2e-3))
    # A kernel 10x worse than the literal model at the same mode lost ~3.3 bits.
    bad = effective_precision(1e-5, 2.0**-24, literal_err=1e-6)
    assert bad["worse"] and bad["bits_eff"] == pytest.approx(24 - math.log2(10))
    assert not effective_precision(1.5e-6, 2.0**-24, literal_err=1e-6)["worse"]
    assert effective_precision(math.nan, 2.0**-8)["worse"]
    with pytest.raises(ValueError, match="declared_u"):
        effective_precision(1e-3, 0.0)


def test_binned_curve_streams_bit_for_bit_and_round_trips():
    from replayssm.validators.jobs.drift.analysis import BinnedCurve
    e = noisy(np.sqrt(1e-8 + 1e-9 * t), 8)
    whole = BinnedCurve.new(T)
    parts = BinnedCurve.new(T)
    for lo in range(0, T, 777):
        whole.add(t[lo:lo + 777], e[lo:lo + 777])
        parts = BinnedCurve.from_dict(json.loads(json.dumps(parts.to_dict())))  # a resume
        parts.add(t[lo:lo + 777], e[lo:lo + 777])
    assert parts.to_dict() == whole.to_dict()
    assert fit_growth(parts).law == "sqrt"
    assert parts.peak_rms() == pytest.approx(whole.binned()[1].max())
    bad = BinnedCurve.new(100)
    bad.add([5, 7], [1e-3, np.inf])
    assert bad.peak_rms() == math.inf and bad.first_nonfinite == 7 and fit_growth(bad).law == "nonfinite"


def _ar1_errors(seed: int, rows: int = 2, n: int = 4096, rho: float = 0.998) -> np.ndarray:
    from scipy.signal import lfilter
    rng = np.random.default_rng(seed)
    x = lfilter([math.sqrt(1 - rho**2)], [1, -rho], rng.normal(0, 1, (rows, n)), axis=1)
    return 1e-3 * np.exp(0.5 * x)


def test_speculation_test_merges_autocorrelated_blocks():
    # Same law for both runs, strong autocorrelation (memory ~500 tokens): per-block tests on
    # 64-token blocks reject far too often; merging until lag-1 autocorrelation <= 0.2 does not.
    fp_merged = fp_raw = 0
    for s in range(20):
        a, b = _ar1_errors(2 * s), _ar1_errors(2 * s + 1)
        r = compare_speculative(a, b, paired=False)
        fp_merged += r["adds_error"]
        fp_raw += compare_speculative(a, b, paired=False, max_autocorr=0.99)["adds_error"]
        assert r["block_level"] > 1 and r["lag1_autocorr"] <= 0.2 + 0.1
    assert fp_merged <= 2 < 4 <= fp_raw


def test_h200_fp32_checkpoint_error_that_rises_then_plateaus_is_bounded():
    """Measured curve (tests/fixtures/drift_h200_nano4b_state_curve.json: the state curve of an H200
    drift report, triton-replay s32a16 nano4b, 10^6 tokens; the fixture says how it was cut): the
    state error rises like t^0.8 for three decades, then stays flat for 1.5 decades.  A sqrt(t)
    rise before the plateau could not follow it (RSS 37 vs 3 in log space); the law must be
    bounded, with the plateau where the data flattens."""
    import pathlib

    fixture = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "drift_h200_nano4b_state_curve.json"
    curve = json.loads(fixture.read_text())
    t, rms = np.array(curve["t"]), np.array(curve["rms"])
    fit = fit_growth(t, rms)
    assert fit.law == "bounded"
    assert fit.saturation == pytest.approx(rms[t > 2e4].mean(), rel=0.15)


def test_uncalibrated_effective_precision_is_judged_against_the_declared_format():
    """Issue 46: the ⚠ (``worse``) appears whenever the measured bits are below the declared format by
    more than log2(factor), calibrated or not; the basis says which comparison it is."""
    direct = effective_precision(1e-6, 2.0 ** -24)  # an accumulated error, no literal model to compare
    assert direct["basis"] == "direct" and direct["worse"] and direct["bits_eff"] < 24 - 1
    near = effective_precision(1.9 * 2.0 ** -24, 2.0 ** -24)  # within x2 of the declared u: no flag
    assert near["basis"] == "direct" and not near["worse"]
    broken = effective_precision(0.6, 2.0 ** -24)  # the broken kernel: 0.75 of 24 bits
    assert broken["worse"] and broken["bits_eff"] < 1
    calibrated = effective_precision(1e-6, 2.0 ** -24, literal_err=1e-8)
    assert calibrated["basis"] == "literal" and calibrated["worse"]


def test_the_speculation_decision_agrees_with_the_interval_it_prints():
    rng = np.random.default_rng(0)
    for shift in (0.0, 0.01, 0.03, 0.2):
        std = np.exp(rng.normal(size=(2, 512)))
        spec = std * np.exp(shift + 0.2 * rng.normal(size=(2, 512)))
        r = compare_speculative(std, spec, block=8, alpha=0.01)
        lo = r["ratio_ci_test"][0]
        assert r["adds_error"] == (r["p_value"] < 0.01 and lo > 1)
        assert r["inconclusive"] == ((r["p_value"] < 0.01) != (lo > 1))
        assert f"{r['ci_test_level']:g}% CI" in r["statement"]


def test_add_groups_is_add_per_item_bitwise():
    """BinnedCurve.add_groups (the drift drain: one pass per curve over a chunk's pending errors) equals add()
    item by item, bit for bit: items of one and several samples, empty ones, out-of-range positions and
    non-finite errors; an item whose errors do not match its positions is refused, nothing added."""
    rng = np.random.default_rng(11)
    items = []
    for i in range(60):
        k = int(rng.integers(0, 4))
        t, e = rng.integers(0, 1100, k).astype(np.float64), rng.lognormal(-8, 3, k)
        if k and i % 13 == 0:
            e[0] = np.inf if i % 2 else np.nan
        items.append((t, e))
    one, groups = BinnedCurve.new(1000, 48), BinnedCurve.new(1000, 48)
    for t, e in items:
        one.add(t, e)
    groups.add_groups(items)
    assert one.to_dict() == groups.to_dict()
    assert groups.nonfinite > 0
    before = groups.to_dict()
    with pytest.raises(ValueError, match="in item 1"):
        groups.add_groups([(np.ones(2), np.ones(2)), (np.ones(3), np.ones(2))])
    assert groups.to_dict() == before


def test_add_each_is_add_per_group_bitwise():
    """BinnedCurve.add_each (the drift drain's one pass over a chunk) equals add() group by group,
    bit for bit, out-of-range positions, non-finite errors and empty groups included."""
    rng = np.random.default_rng(7)
    n = 600
    t = rng.integers(0, 1100, n).astype(np.float64)
    e = rng.lognormal(-8, 3, n)
    e[rng.integers(0, n, 9)] = np.inf
    e[rng.integers(0, n, 5)] = np.nan
    g = np.sort(rng.integers(0, 40, n)) * 2  # gaps: groups with no element
    one, each = BinnedCurve.new(1000, 48), BinnedCurve.new(1000, 48)
    one.add([3.0], [0.5])
    each.add([3.0], [0.5])
    for k in np.unique(g):
        one.add(t[g == k], e[g == k])
    each.add_each(t, e, g)
    assert one.to_dict() == each.to_dict()
    assert each.nonfinite > 0 and each.first_nonfinite is not None
    with pytest.raises(ValueError, match="err, group"):
        each.add_each(t, e, g[:-1])
