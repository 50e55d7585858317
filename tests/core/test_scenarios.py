"""Scenarios: JSON round trip, bitwise regeneration, input distributions, schedules, bad input.

Oracle: a scenario is plain data (equal after a JSON round trip); inputs are a pure function of
the scenario (equal bits on regeneration, whatever the global RNG state; pinned digests catch a
change of generator or machine); schedules follow the spec's cursor rules (simulated here with
``DecodeConfig``); every bad field raises ValueError naming ``scenario.<field>``.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from replayssm.interface import PAD_SLOT
from replayssm.precision import STANDARD_MODES
from replayssm.scenarios import DISTRIBUTIONS, SCHEDULES, Scenario, make_initial_state, make_inputs, make_params, plan
from replayssm.scenarios.inputs import inputs_digest, sample, table_digest
from replayssm.scenarios.schedules import default_steps

# Pinned on 2026-11-29 (x86-64 CPU, torch 2.13): any change of generator, table or key layout
# changes every input, and every stored scenario would silently mean something else.
TABLE_DIGEST = "7ea1fd075034a027f661a221ab9687514b3cfd404041e07a993e96db6f5157ec"
TINY_DIGESTS = {
    "mamba2": "7ba555a152b58bd0bf3fe47d476ecf116c5201ae14010b6566f364ebb35e997c",
    "gdn": "836840b8a53ab3e604bde507448392a153aed46bc87b363fe3e72fb2695e2ec2",
}

SCENARIOS = [
    Scenario.tiny("mamba2"),
    Scenario.tiny("gdn", "standard", mode="s16a16", schedule="always-1"),
    Scenario.tiny("gdn", mode="sfp8a16-sr7", schedule="slot-reuse", schedule_params={"reset_prob": 0.3},
                  distribution="heavy-tailed", seed=12345),
    Scenario.build("mamba2", geometry={"nheads": 4, "headdim": 4, "dstate": 8, "ngroups": 1, "has_z": True,
                                       "family": "mamba2"}, batch=5, padding=2, schedule="per-row",
                   schedule_params={"k_weights": [1, 0, 2, 1]}, steps=7, kernel_options={"route": "state_and_output"}),
]


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.label)
def test_json_round_trip(sc, tmp_path):
    text = sc.to_json()
    back = Scenario.from_json(text)
    assert back == sc
    assert back.to_json() == text
    assert Scenario.from_dict(json.loads(text)) == sc
    p = sc.save(tmp_path / "s.json")
    assert Scenario.load(p) == sc


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.label)
def test_regeneration_is_bitwise_and_ignores_global_rng(sc):
    def everything(s):
        return [*make_params(s).values(), make_initial_state(s), make_initial_state(s, 3),
                *make_inputs(s, 0).values(), *make_inputs(s, 5).values()]

    first = everything(sc)
    torch.manual_seed(999)
    np.random.seed(7)
    random.seed(3)
    torch.rand(100)
    second = everything(Scenario.from_json(sc.to_json()))
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.uint8) if b.dtype == torch.bfloat16 else b)


def test_pinned_digests():
    assert table_digest() == TABLE_DIGEST
    for fam, want in TINY_DIGESTS.items():
        assert inputs_digest(Scenario.tiny(fam, mode="s32a16")) == want


def test_batched_generation_equals_per_tensor_generation():
    from replayssm.scenarios.inputs import key_of, random_bits, random_bits_batched
    keys, counts = [key_of(1, 2, 3), key_of(4), 2**63 + 5], [7, 1, 300]
    for k, c, b in zip(keys, counts, random_bits_batched(keys, counts, "cpu")):
        assert torch.equal(b, random_bits(k, c, "cpu"))


def test_step_keys_equal_key_of():
    from replayssm.scenarios.inputs import _key_words, key_of, keys_of_steps
    steps = [0, 1, 7, 4096, 2**40 + 3]
    for prefix in [(0, 1), (12345, 2**32 + 5), (-3, 2**63)]:
        keys = keys_of_steps(prefix, steps)
        assert keys.tolist() == [key_of(*prefix, s) for s in steps]
        assert _key_words(keys).tolist() == _key_words([key_of(*prefix, s) for s in steps]).tolist()


def test_inputs_differ_by_step_seed_and_stream():
    sc = Scenario.tiny("mamba2", mode="s32a32")
    a, b = make_inputs(sc, 0)["x"], make_inputs(sc, 1)["x"]
    c = make_inputs(sc.replace(seed=1), 0)["x"]
    d = make_inputs(sc, 0, stream="canary")["x"]
    for other in (b, c, d):
        assert not torch.equal(a, other)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generation_matches_cpu_bit_for_bit():
    for sc in SCENARIOS:
        for name, t in make_inputs(sc, 4).items():
            g = make_inputs(sc, 4, "cuda")[name].cpu()
            assert torch.equal(t.view(torch.uint8) if t.dtype == torch.bfloat16 else t,
                               g.view(torch.uint8) if g.dtype == torch.bfloat16 else g), name
        assert torch.equal(make_initial_state(sc, 2), make_initial_state(sc, 2, "cuda").cpu())


FUSED_CASES = [  # every law and scale of _value_law: normal, t2, a gate scale, a value scale, bf16 / fp32 / fp16 casts
    Scenario.tiny("mamba2", mode="s32a16"),
    Scenario.tiny("gdn", mode="s32a32", distribution="heavy-tailed", seed=77),
    Scenario.tiny("mamba2", "standard", mode="s16a16", distribution="large-delta"),
    Scenario.tiny("gdn", "standard", mode="s32a16", distribution="near-fp16-limit", seed=5),
]


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t


@pytest.mark.parametrize("sc", FUSED_CASES, ids=lambda s: f"{s.family}-{s.distribution}-{s.mode}")
def test_fused_inputs_equal_the_torch_path_bitwise(sc, monkeypatch):
    """The one-launch generator (replayssm/ops/triton/counter_inputs.py, here under the Triton
    interpreter) against the torch path, bit for bit: per step and for a chunk of steps."""
    from replayssm.scenarios import inputs as mod
    steps = [0, 3, 4, 11]
    want = [make_inputs(sc, s) for s in steps]
    want_steps = mod.make_inputs_steps(sc, steps)
    monkeypatch.setattr(mod, "FUSED_DEVICE_TYPES", {"cpu"})
    assert mod.fused_on("cpu")
    for s, w in zip(steps, want):
        got = make_inputs(sc, s)
        for name, t in w.items():
            assert got[name].dtype == t.dtype and torch.equal(_bits(got[name]), _bits(t)), (s, name)
    got_steps = mod.make_inputs_steps(sc, steps)
    for name, t in want_steps.items():
        assert got_steps[name].shape == t.shape and torch.equal(_bits(got_steps[name]), _bits(t)), name


def test_counter_values_uniform_and_bad_arguments():
    from replayssm.ops.triton.counter_inputs import counter_values
    from replayssm.scenarios.inputs import _apply_law, _key_words, key_of, random_bits_batched
    keys = [key_of(1, 2, 3), 2**64 - 1, 0]
    want = torch.cat([_apply_law("uniform", b) for b in random_bits_batched(keys, [300] * 3, "cpu")])
    assert torch.equal(counter_values(_key_words(keys), 300, None), want)
    with pytest.raises(ValueError, match="key_words"):
        counter_values(_key_words(keys).to(torch.int32), 300, None)
    with pytest.raises(ValueError, match="count"):
        counter_values(_key_words(keys), 0, None)
    with pytest.raises(ValueError, match="table"):
        counter_values(_key_words(keys), 3, (torch.zeros(4), torch.zeros(4)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sc", FUSED_CASES, ids=lambda s: f"{s.family}-{s.distribution}-{s.mode}")
def test_cuda_fused_chunk_inputs_match_cpu_bit_for_bit(sc):
    from replayssm.scenarios.inputs import make_inputs_steps
    steps = list(range(0, 40, 3))
    want, got = make_inputs_steps(sc, steps), make_inputs_steps(sc, steps, "cuda")
    for name, t in want.items():
        assert torch.equal(_bits(t), _bits(got[name].cpu())), name


@pytest.mark.parametrize("mode", STANDARD_MODES)
def test_inputs_are_in_the_activation_dtype(mode):
    sc = Scenario.tiny("gdn", mode=mode)
    g = sc.geometry_obj
    for name, t in make_inputs(sc, 2).items():
        assert t.dtype == sc.precision.act_dtype
        assert tuple(t.shape) == (sc.rows, sc.window, *g.input_shapes()[name])
    for t in make_params(sc).values():
        assert t.dtype == torch.float32
    init = make_initial_state(sc)
    assert init.dtype == torch.float64
    assert torch.equal(init, init.float().double())  # representable in fp32


def test_sampler_laws():
    n = 200_000
    x = sample("normal", 1, (n,))
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1.0) < 0.01
    assert float(x.abs().max()) < 4.33
    u = sample("uniform", 2, (n,))
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.005
    t = sample("t2", 3, (n,))
    kurt = lambda v: float(((v - v.mean()) ** 4).mean() / v.var() ** 2)
    assert kurt(t) > 10 * kurt(x)


def test_distribution_regimes():
    for fam in ("mamba2", "gdn"):
        mild = make_params(Scenario.tiny(fam, distribution="mild"))
        neg_a = -mild["A"] if fam == "mamba2" else torch.exp(mild["A_log"])
        assert bool(((neg_a >= 1) & (neg_a <= 2)).all())
        assert bool(((mild["dt_bias"] >= -4) & (mild["dt_bias"] <= -3)).all())
        slow = make_params(Scenario.tiny(fam, distribution="long-memory"))
        neg_slow = -slow["A"] if fam == "mamba2" else torch.exp(slow["A_log"])
        assert float(neg_slow.max()) <= 0.1
    near = make_inputs(Scenario.tiny("mamba2", mode="s32afp16", distribution="near-fp16-limit", rows=3), 0)["x"]
    assert 1e4 < float(near.abs().max()) < 65504
    big = make_inputs(Scenario.tiny("mamba2", distribution="large-delta"), 0)["dt"].float()
    assert float(big.std()) > 4


def _simulate(sc, steps):
    """(write_pos, k) pairs seen per active row, flush count, wraps, under the spec cursor rules."""
    dec = sc.decode_config
    ids = sc.resolved_slot_ids
    wp = {r: 0 for r, s in enumerate(ids) if s != PAD_SLOT}
    org = {r: sc.resolved_origins[r] for r in wp}
    seen = {r: set() for r in wp}
    flushes = wraps = 0
    for p in steps:
        for r, o in zip(p.reset_rows, p.reset_origins):
            wp[r], org[r] = 0, o
        for r in wp:
            k = p.accepted[r]
            assert 1 <= k <= sc.window
            f = dec.is_flush(wp[r])
            seen[r].add((wp[r], k))
            if f:
                flushes += 1
                wraps += (org[r] + wp[r]) >= dec.ring_rows
            wp[r], org[r] = dec.commit_cursor(wp[r], org[r], f, k)
        for r, s in enumerate(ids):
            if s == PAD_SLOT:
                assert p.accepted[r] == 0 and r not in p.reset_rows
    return seen, flushes, wraps


@pytest.mark.parametrize("T,B", [(4, 12), (1, 4), (3, 3), (2, 7)], ids=lambda v: str(v))
def test_exhaustive_covers_every_k_at_every_phase(T, B):
    sc = Scenario.tiny("mamba2", window=T, buffer=B, schedule="exhaustive", origins=None)
    sc = sc.replace(origins=tuple(0 if s == PAD_SLOT else 1 for s in sc.resolved_slot_ids))
    steps = plan(sc)
    assert len(steps) == default_steps(sc)
    seen, flushes, wraps = _simulate(sc, steps)
    want = {(w, k) for w in range(B + 1) for k in range(1, T + 1)}
    for r, pairs in seen.items():
        assert pairs >= want, f"row {r} misses {sorted(want - pairs)}"
    assert flushes > 0 and wraps > 0


def test_standard_exhaustive_covers_two_buffers_and_a_reset():
    sc = Scenario.tiny("gdn", "standard", schedule="exhaustive")
    steps = plan(sc)
    assert all(k in (0, 1) for p in steps for k in p.accepted)
    assert any(p.reset_rows for p in steps)
    seen, flushes, _ = _simulate(sc, steps)
    assert flushes >= 2 * len(seen)


def test_schedule_shapes():
    base = Scenario.tiny("gdn", steps=40)
    active = base.active_rows
    ks = lambda name, **kw: [[p.accepted[r] for r in active] for p in plan(base.replace(schedule=name, **kw))]
    assert all(k == [1, 1] for k in ks("always-1"))
    assert all(k == [4, 4] for k in ks("always-T"))
    assert all(k == [2, 2] for k in ks("fixed", schedule_params={"k": 2}))
    assert all(a == b for a, b in ks("random"))
    assert any(a != b for a, b in ks("per-row"))
    assert all(k != 2 for row in ks("per-row", schedule_params={"k_weights": [1, 0, 1, 1]}) for k in row)
    reuse = plan(base.replace(schedule="slot-reuse", schedule_params={"reset_prob": 0.2}))
    resets = [(r, o) for p in reuse for r, o in zip(p.reset_rows, p.reset_origins)]
    assert resets and all(r in active and 0 <= o < base.ring_rows for r, o in resets)
    assert len(plan(base.replace(schedule="long", steps=None))) == 4096
    assert set(SCHEDULES) >= {"exhaustive", "random", "per-row", "always-1", "always-T", "fixed", "slot-reuse",
                              "long"}
    assert set(DISTRIBUTIONS) == {"mild", "long-memory", "fast-forget", "large-delta", "heavy-tailed",
                                  "near-fp16-limit"}


def test_plans_are_reproducible():
    sc = Scenario.tiny("mamba2", schedule="slot-reuse", seed=5)
    assert plan(sc) == plan(Scenario.from_json(sc.to_json()))
    assert plan(sc) != plan(sc.replace(seed=6))


BAD = [
    ({"windw": 4}, "scenario.windw"),
    ({"window": "4"}, "scenario.window"),
    ({"window": 5, "buffer": 4}, "scenario.buffer"),
    ({"steps": -3}, "scenario.steps"),
    ({"steps": 2.5}, "scenario.steps"),
    ({"rows": 0}, "scenario.rows"),
    ({"slot_ids": [0, 9, 1]}, "scenario.slot_ids"),
    ({"slot_ids": [1, 1, 2]}, "scenario.slot_ids"),
    ({"slot_ids": [0, 1]}, "scenario.slot_ids"),
    ({"slot_ids": 3}, "scenario.slot_ids"),
    ({"origins": "5"}, "scenario.origins"),
    ({"kernel_options": [1]}, "scenario.kernel_options"),
    ({"geometry": 7}, "scenario.geometry"),
    ({"slot_ids": [-1, -1, -1]}, "scenario.slot_ids"),
    ({"origins": [0, 0, 99]}, "scenario.origins"),
    ({"mode": "s32a8"}, "scenario.mode"),
    ({"family": "rwkv"}, "scenario.family"),
    ({"geometry": "nano4b", "family": "gdn"}, "scenario.geometry"),
    ({"geometry": {"nheads": 3, "headdim": 4, "dstate": 8, "ngroups": 2, "family": "mamba2"}}, "scenario.geometry"),
    ({"distribution": "spiky"}, "scenario.distribution"),
    ({"schedule": "sometimes"}, "scenario.schedule"),
    ({"schedule": "fixed", "schedule_params": {"k": 5}}, "scenario.schedule_params"),
    ({"schedule": "random", "schedule_params": {"k_weights": [1, 1]}}, "scenario.schedule_params"),
    ({"schedule": "random", "schedule_params": {"reset_prob": 0.5}}, "scenario.schedule_params"),
    ({"initial_state": "ones"}, "scenario.initial_state"),
    ({"seed": -1}, "scenario.seed"),
    ({"decode": "standard", "window": 4}, "scenario.window"),
    ({"schema_version": 2}, "scenario.schema_version"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[f for _, f in BAD])
def test_bad_fields_are_named(change, field):
    d = json.loads(Scenario.tiny("mamba2").to_json())
    d.update(change)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Scenario.from_json(json.dumps(d))


def test_bad_json_text_and_files(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON"):
        Scenario.from_json("{family: mamba2")
    with pytest.raises(ValueError, match="expected a JSON object"):
        Scenario.from_json("[1, 2]")
    with pytest.raises(ValueError, match="cannot read"):
        Scenario.load(tmp_path / "missing.json")
