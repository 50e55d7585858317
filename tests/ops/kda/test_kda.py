"""Kimi Delta Attention (issue 19): the reference, the literal models, the family's own mutants and
every job of the suite on the new family (one folder ``replayssm/ops/kda/`` + one registration line).

Oracles: the fp64 recurrence (``ops/kda/naive.py``) against an independent whole-sequence
triangular solve (1e-12); with every channel's gate equal it is the Gated DeltaNet step (1e-14);
flash-linear-attention's ``naive_recurrent_kda`` when it is installed (fp32: 1e-5).  The literal
ReplaySSM and baseline models at s64a64 equal the recurrence to 1e-12 (``core_drive.drive``); at the
serving modes they pass the validation engine; each KDA mutant fails it while the literal model
passes the same scenario.  All at the ``tiny`` preset, a few steps.  The fuzzer runs the KDA
kernels through tests/jobs/test_fuzz_properties.py and fuzzes the KDA mutants in
tests/jobs/test_mutation_gallery.py (both iterate the registries), the golden trajectories cover KDA
(tests/engine/test_golden.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from core_drive import drive

from replayssm import registry
from replayssm.cli import main
from replayssm.families import family, preset
from replayssm.interface import DecodeConfig
from replayssm.ops.gdn.naive import gdn_step
from replayssm.ops.kda import naive
from replayssm.ops.kda.literal import kda_window_solve
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.bench.run import bench_family
from replayssm.validators.jobs.drift.sweep import SweepConfig, run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-12
KDA_MUTANTS = ("mutant-gate-on-value-axis", "mutant-scalar-gate", "mutant-log-gate-sums-bf16")


def _draw(T, H, HV, K, V, *, seed=0, gate_shift=-4.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=g, dtype=dtype)  # noqa: E731
    state = r(HV, V, K) * 0.5
    tok = (r(T, H, K), r(T, H, K), r(T, HV, V), r(T, HV, K), r(T, HV))
    return state, tok, torch.log(1 + u(HV)), u(HV, K) + gate_shift


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("T,H,HV,K,V,shift", [(1, 1, 1, 4, 4, -4.0), (16, 2, 4, 16, 8, -4.0),
                                              (24, 1, 2, 8, 16, 1.0), (12, 2, 2, 8, 8, -8.0)],
                         ids=["T1-h1-k4", "T16-h2v4-k16v8-mild", "T24-h1v2-k8v16-fast", "T12-h2-k8-slow"])
def test_reference_matches_closed_form(T, H, HV, K, V, shift):
    state, tok, A_log, dt_bias = _draw(T, H, HV, K, V, gate_shift=shift)
    o1, s1 = naive.kda_sequence(state, *tok, A_log, dt_bias)
    o2, s2 = naive.kda_closed_form(state, *tok, A_log, dt_bias)
    assert _rel(o1, o2) < TOL and _rel(s1, s2) < TOL


def test_equal_channel_gates_are_the_gated_delta_rule():
    """With the same gate on every key channel the KDA step is the GDN step: the decay acts on the
    key axis of S [V, K] exactly as GDN's scalar does (the orientation check without FLA)."""
    state, (q, k, v, a, b), A_log, _ = _draw(1, 2, 4, 16, 8, seed=3)
    dt_bias = torch.full((4,), -3.0, dtype=torch.float64)
    o_g, s_g = gdn_step(state, q[0], k[0], v[0], a[0, :, 0], b[0], A_log, dt_bias)
    a_k = a[0, :, :1].expand(4, 16)
    o_k, s_k = naive.kda_step(state, q[0], k[0], v[0], a_k, b[0], A_log, dt_bias[:, None].expand(4, 16))
    assert _rel(o_k, o_g) < 1e-14 and _rel(s_k, s_g) < 1e-14
    # and a per-channel gate differs from every scalar one
    o_c, _ = naive.kda_step(state, q[0], k[0], v[0], a[0], b[0], A_log, dt_bias[:, None].expand(4, 16))
    assert _rel(o_c, o_k) > 1e-3


def test_reference_matches_fla_naive_when_installed():
    fla_naive = pytest.importorskip("fla.ops.kda.naive", reason="flash-linear-attention not installed")
    state, (q, k, v, a, b), A_log, dt_bias = _draw(7, 2, 4, 16, 8, seed=1)
    o, s = naive.kda_sequence(state, q, k, v, a, b, A_log, dt_bias)
    g, beta = naive.kda_gates(a, b, A_log, dt_bias)
    o_f, s_f = fla_naive.naive_recurrent_kda(naive.l2norm(q)[None], naive.l2norm(k)[None], v[None], g[None],
                                             beta[None], initial_state=state.transpose(-1, -2)[None],
                                             output_final_state=True)
    # FLA's naive form computes in fp32.
    assert _rel(o_f[0].double(), o) < 1e-5 and _rel(s_f[0].transpose(-1, -2).double(), s) < 1e-5


def test_window_solve_matches_stepping():
    state, (q, k, v, a, b), A_log, dt_bias = _draw(5, 2, 4, 16, 8, seed=2)
    o_ref, _ = naive.kda_sequence(state, q, k, v, a, b, A_log, dt_bias)
    qh, kh = naive.kda_prepare(q, k, 4)
    g, beta = naive.kda_gates(a, b, A_log, dt_bias)
    o, _ = kda_window_solve(state, qh, kh, v, g, beta)
    assert _rel(o, o_ref) < TOL


@pytest.mark.parametrize("name", ["literal-replay", "literal-baseline"])
@pytest.mark.parametrize("decode", [DecodeConfig("standard", 1, 4), DecodeConfig("speculative", 3, 4)],
                         ids=["s64a64-L4-T1-tiny", "s64a64-T3-B4-tiny"])
def test_literal_models_match_reference(name, decode):
    res = drive(registry.get(name, "kda"), preset("tiny", "kda"), "s64a64", decode, steps=14)
    assert res.violations == []
    assert res.max_out_err < TOL and res.max_state_err < TOL and res.max_ckpt_err < TOL


def test_presets_and_geometry_checks():
    kimi = preset("kimi-linear-48b", "kda")
    assert (kimi.num_k_heads, kimi.num_v_heads, kimi.head_k_dim, kimi.head_v_dim) == (32, 32, 128, 128)
    assert kimi.input_shapes()["a"] == (32, 128) and kimi.param_shapes()["dt_bias"] == (32, 128)
    with pytest.raises(ValueError, match="num_v_heads"):
        family("kda").geometry_from_dict({"num_k_heads": 2, "num_v_heads": 3, "head_k_dim": 4, "head_v_dim": 4})
    # fp32 per-channel log-gate records: the fold's bytes grow with K
    t = family("kda").traffic(kimi, Scenario.tiny("kda", mode="s32a16").precision)
    assert t.record == 32 * 128 * 2 * 2 + 32 * 128 * 4


@pytest.mark.parametrize("kernel", ["literal-replay", "literal-baseline"])
@pytest.mark.parametrize("decode,mode", [("speculative", "s32a16"), ("standard", "sfp8a16")],
                         ids=["s32a16-T4-B12-tiny", "sfp8a16-L8-T1-tiny"])
def test_validate_passes(kernel, decode, mode):
    res = run_scenario(Scenario.tiny("kda", decode=decode, mode=mode, schedule="exhaustive"), kernel)
    assert res.passed, res.failures[:3]
    assert res.steps_run == res.steps_planned > 0


def test_fast_channels_fold_within_the_bound():
    """large-delta gates (log gates down to ~-60 per channel and token): the fp32 cumulative sums of a
    fast channel carry ~u |G_c| into its fold weights.  The fp64 bound's decay exponent is the
    largest over channels (the dL of KDAMath.error_coefficients); with the slowest channel's, as a
    scalar gate's, the literal model failed flush-increment at step 3 (measured 2026-12-01)."""
    sc = Scenario.tiny("kda", decode="speculative", mode="s32a32", schedule="random", steps=10,
                       distribution="large-delta", initial_state="random")
    res = run_scenario(sc, "literal-replay", repeat_check=False)
    assert res.passed, res.failures[:3]


@pytest.mark.parametrize("decode", ["speculative", "standard"])
@pytest.mark.parametrize("name", KDA_MUTANTS)
def test_kda_mutants_are_caught(name, decode):
    spec = all_mutants()[name]
    assert set(spec.classes) == {"kda"} and spec.fuzzed("kda")
    sc = Scenario.tiny("kda", decode=decode, mode="s32a32", schedule="random", steps=6)
    assert run_scenario(sc, "literal-replay", repeat_check=False).passed
    res = run_scenario(sc, name, repeat_check=False, stop_on_failure=True)
    assert not res.passed and res.first_failure.check in ("state", "output", "flush-checkpoint", "flush-increment")


def test_drift_kda(tmp_path):
    cfg = SweepConfig(families=("kda",), kernels=("literal-replay",), modes=("s32a16",), schedules=("standard",),
                      geometry=(("kda", "tiny"),), tokens=48, rows=2, blocks=8, nbins=8)
    out = run_sweep(cfg, tmp_path, progress=False)
    assert out.ran and out.tokens >= 48 * 2


def test_bench_runs_kda_with_the_literal_kernels():
    res = bench_family("kda", "tiny", "s32a32", L=2, batches=(1,), spec_batches=(1,), window=2, spec_buffer=2,
                       device="cpu", sweep=False, copy={"tbps": 1.0, "bytes": 1, "ms": 1.0}, max_sets=2,
                       baseline="literal-baseline", replay="literal-replay", log=lambda s: None)
    assert len(res["rows"]) == 3 and all("of bound" in r["check"] for r in res["rows"])


def test_cli_lists_and_validates_kda(tmp_path, capsys):
    assert main(["list", "geometries", "--json"]) == 0
    assert "kimi-linear-48b" in capsys.readouterr().out
    assert main(["list", "kernels", "--family", "kda", "--json"]) == 0
    names = {k["name"] for k in json.loads(capsys.readouterr().out)["kernels"]}
    assert {"literal-replay", "literal-baseline", *KDA_MUTANTS} <= names
    assert main(["validate", "--family", "kda", "--kernel", "literal-replay", "--precision", "s32a16",
                 "--schedule", "random", "--steps", "4", "--out", str(tmp_path), "--quiet"]) == 0
    assert main(["validate", "--family", "kda", "--kernel", "mutant-scalar-gate", "--precision", "s32a32",
                 "--schedule", "random", "--steps", "4", "--out", str(tmp_path / "m"), "--quiet"]) == 1
