"""Kernels driven the way serving engines drive them (issue 14).

Oracle: the contract of ``replayssm/interface.py`` (``zero_accept``, ``supports_ragged_windows``
and ``window_lens``, ``supports_packed_layout`` and ``query_start_loc``, ``supports_mixed_decode``,
``bookkeeping`` policies with host-owned cursors) and the engine's checks of it: the literal models,
which declare every behaviour, pass; kernels that break one declared behaviour fail with the
check that guards it; kernels that do not declare a behaviour are never driven with it; bad
arguments are refused with one line naming the argument and the row, before anything changes.
Tiny geometry, literal models (Python), few steps.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from core_drive import make_inputs, make_params
from hypothesis import HealthCheck, find, given, settings

from replayssm.families import preset
from replayssm.interface import POLICIES, DecodeConfig, KernelConfig
from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.scenarios.inputs import PREFILL_TOKENS, make_initial_state
from replayssm.scenarios.inputs import make_inputs as scenario_inputs
from replayssm.scenarios.inputs import make_params as scenario_params
from replayssm.scenarios.strategies import scenarios, serving_options
from replayssm.validators import run_scenario
from replayssm.validators.engine.runner import policy_literal_name, reference_step
from replayssm.validators.jobs.fuzz.run import fuzz_kernel, sweep_kernel

pytestmark = pytest.mark.usefixtures("one_thread")


def _literal(family="mamba2", name="literal-replay"):
    return get(name, family)


# ---- rows that accept nothing --------------------------------------------------------------------------
@pytest.mark.parametrize("kernel,family", [("literal-replay", "mamba2"), ("literal-baseline", "gdn")],
                         ids=["replay-mamba2", "baseline-gdn"])
def test_literal_models_commit_nothing_as_a_noop(kernel, family):
    sc = Scenario.tiny(family, schedule="zero-accept", steps=6, schedule_params={"zero_prob": 0.5})
    res = run_scenario(sc, kernel)
    assert res.passed, res.to_markdown()
    assert res.coverage["k = 0 commits (noop)"] > 0


def _zero_in_active(slot_ids, accepted) -> bool:
    return any(k == 0 for s, k in zip(slot_ids.tolist(), accepted.tolist()) if s >= 0)


class _Refusing(_literal()):
    name = "refusing"
    zero_accept = "refuse"


class _RefusesAfterMoving(_Refusing):
    """Refuses k = 0, but only after advancing the cursor of the rows before it."""

    name = "refuses-after-moving"

    def commit(self, slot_ids, accepted):
        if _zero_in_active(slot_ids, accepted):
            for s in slot_ids.tolist():
                if s >= 0:
                    self.write_pos[s] += 1
        super().commit(slot_ids, accepted)


class _RefusesVaguely(_Refusing):
    name = "refuses-vaguely"

    def commit(self, slot_ids, accepted):
        if _zero_in_active(slot_ids, accepted):
            raise ValueError("bad accepted counts")
        super().commit(slot_ids, accepted)


@pytest.mark.parametrize("cls,passes", [(_Refusing, True), (_RefusesAfterMoving, False), (_RefusesVaguely, False)],
                         ids=["refuses", "refuses-after-moving", "refuses-vaguely"])
def test_a_refusing_kernel_is_probed_before_anything_changes(cls, passes):
    sc = Scenario.tiny("mamba2", schedule="zero-accept", steps=4, schedule_params={"zero_prob": 0.5})
    res = run_scenario(sc, cls)
    assert res.passed == passes, res.to_markdown()
    assert res.coverage.get("k = 0 refusals probed", 0) > 0
    if not passes:
        assert res.first_failure.check == "zero-accept"


# ---- ragged windows, permuted batches, recycled slots ----------------------------------------------------
@pytest.mark.parametrize("kernel,family", [("literal-replay", "gdn"), ("literal-baseline", "mamba2")],
                         ids=["replay-gdn", "baseline-mamba2"])
def test_literal_models_run_ragged_permuted_batches(kernel, family):
    sc = Scenario.tiny(family, schedule="ragged", steps=8, schedule_params={"zero_prob": 0.2, "permute_rows": True})
    res = run_scenario(sc, kernel)
    assert res.passed, res.to_markdown()
    assert res.coverage["permuted batches"] == 8
    assert res.tokens_verified < 8 * 2 * sc.window  # the rows' windows really were shorter


@pytest.mark.parametrize("poison", ["nan", "large"])
def test_recycled_slots_are_poisoned_and_a_correct_kernel_never_sees_it(poison):
    sc = Scenario.tiny("mamba2", schedule="slot-reuse", steps=10,
                       schedule_params={"reset_prob": 0.3, "poison": poison})
    res = run_scenario(sc, "literal-replay")
    assert res.passed, res.to_markdown()
    assert res.coverage[f"recycled slots poisoned ({poison})"] > 0


class _NoRagged(_literal()):
    name = "no-ragged"
    supports_ragged_windows = False


# ---- the packed layout, standard steps on speculative slots, host-owned cursors, prefill hand-off -----------
@pytest.mark.parametrize("kernel,family,overrides", [
    ("literal-replay", "gdn", {"schedule": "ragged", "schedule_params": {"layout": "packed", "permute_rows": True}}),
    ("literal-baseline", "mamba2", {"schedule": "mixed", "schedule_params": {"layout": "packed"}}),
    ("literal-replay", "mamba2", {"schedule": "mixed", "initial_state": "prefill"}),
    ("literal-replay-host-cursors", "gdn", {"schedule": "mixed", "schedule_params": {"layout": "packed"}}),
    ("literal-replay-host-cursors", "mamba2", {"schedule": "slot-reuse", "initial_state": "prefill",
                                               "schedule_params": {"reset_prob": 0.3, "poison": "large"}}),
], ids=["packed-ragged-replay-gdn", "packed-mixed-baseline-mamba2", "mixed-prefill-replay-mamba2",
        "packed-mixed-host-cursors-gdn", "slot-reuse-prefill-host-cursors-mamba2"])
def test_literal_models_run_packed_mixed_and_host_cursor_plans(kernel, family, overrides):
    res = run_scenario(Scenario.tiny(family, steps=8, **overrides), kernel)
    assert res.passed, res.to_markdown()
    params = overrides.get("schedule_params", {})
    if params.get("layout") == "packed":
        assert res.coverage["packed verifies"] == 8
    if overrides["schedule"] == "mixed":
        assert 0 < res.coverage["standard steps on speculative slots"] < 8


def test_the_prefill_hand_off_state_is_an_fp64_prefill_of_a_prompt():
    sc = Scenario.tiny("gdn", initial_state="prefill")
    prompt = scenario_inputs(sc, 0, stream="prompt", tokens=PREFILL_TOKENS)
    params = {k: v.double() for k, v in scenario_params(sc).items()}
    want = torch.zeros(sc.rows, *sc.geometry_obj.state_shape, dtype=torch.float64)
    for t in range(PREFILL_TOKENS):
        _, want = reference_step("gdn", want, {n: v[:, t].double() for n, v in prompt.items()}, params)
    s0 = make_initial_state(sc, 0)
    assert torch.equal(s0, want.float().double()) and s0.abs().amax() > 0.1  # handed over in fp32
    assert not torch.equal(s0, make_initial_state(sc, 1))  # each re-admitted request has its own prompt


class _NoMixed(_literal()):
    name = "no-mixed"
    supports_mixed_decode = False


class _NoPacked(_literal()):
    name = "no-packed"
    supports_packed_layout = False


@pytest.mark.parametrize("cls,overrides,match", [
    (_NoMixed, {"schedule": "mixed", "schedule_params": {"switch_prob": 1.0}},
     r"standard steps on a speculative slot and the kernel 'no-mixed' does not"),
    (_NoPacked, {"schedule": "per-row", "schedule_params": {"layout": "packed"}}, r"the packed layout"),
], ids=["mixed-undeclared", "packed-undeclared"])
def test_a_kernel_is_never_driven_with_what_it_does_not_declare(cls, overrides, match):
    with pytest.raises(ValueError, match=match):
        run_scenario(Scenario.tiny("mamba2", steps=2, **overrides), cls)


def test_a_kernel_without_ragged_windows_is_refused_a_ragged_plan():
    with pytest.raises(ValueError, match=r"scenario.schedule: .*'no-ragged' does not support them"):
        run_scenario(Scenario.tiny("mamba2", schedule="ragged", steps=2), _NoRagged)


class _FirstLayout(_literal()):
    """Keys its storage on the batch layout of its first verify (row r is always that slot)."""

    name = "first-layout"

    def verify(self, slot_ids, inputs, out=None, window_lens=None):
        self._ids = getattr(self, "_ids", None)
        if self._ids is None and slot_ids.numel() == 3 and int((slot_ids >= 0).sum()) == 2:
            self._ids = slot_ids.clone()
        return super().verify(self._ids if self._ids is not None else slot_ids, inputs, out, window_lens)

    def commit(self, slot_ids, accepted):
        return super().commit(self._ids if getattr(self, "_ids", None) is not None else slot_ids, accepted)


def test_a_kernel_keyed_on_batch_rows_fails_only_when_rows_are_permuted():
    sc = Scenario.tiny("mamba2", schedule="per-row", steps=4)
    assert run_scenario(sc, _FirstLayout).passed
    res = run_scenario(sc.replace(schedule_params={"permute_rows": True}), _FirstLayout)
    assert not res.passed


# ---- bookkeeping policies ----------------------------------------------------------------------------------
@pytest.mark.parametrize("impl,declared", list(itertools.product(POLICIES, POLICIES)),
                         ids=[f"{a}-as-{b}" for a, b in itertools.product(POLICIES, POLICIES)])
def test_each_policy_literal_passes_under_its_own_policy_only(impl, declared):
    base = get(policy_literal_name("mamba2", impl), "mamba2")
    cls = type("Declared", (base,), {"name": f"{impl}-as-{declared}", "bookkeeping": declared})
    sc = Scenario.tiny("mamba2", "standard", buffer=3, schedule="always-1", steps=7)
    res = run_scenario(sc, cls, repeat_check=False)
    assert res.passed == (impl == declared), res.to_markdown()
    if impl != declared:
        # (a linear-buffer kernel declared flush-when-full refuses the ring origins that policy allows)
        assert res.first_failure.check in ("cursor", "checkpoint-unchanged", "committed-ring-rows",
                                           "flush-checkpoint", "exception"), res.to_markdown()


@pytest.mark.parametrize("pol", ["flush-when-full", "fold-every-commit", "fold-at-commit"])
def test_policy_literals_run_speculative_ragged_plans(pol):
    sc = Scenario.tiny("gdn", schedule="ragged", steps=8, schedule_params={"zero_prob": 0.2})
    res = run_scenario(sc, policy_literal_name("gdn", pol))
    assert res.passed, res.to_markdown()


def test_flush_when_full_is_standard_decode_as_the_speculative_rule_with_one_token():
    dec = DecodeConfig("standard", 1, 4, "flush-when-full")
    assert dec.ring_rows == 8 and [dec.is_flush(w) for w in range(5)] == [False] * 4 + [True]
    assert dec.commit_cursor(4, 2, True, 1) == (1, 6) and not dec.flush_folds_first
    assert DecodeConfig("standard", 1, 4).commit_cursor(3, 0, True, 1) == (0, 0)


def test_fold_at_commit_folds_the_held_history_at_commit_and_never_at_a_verify():
    dec = DecodeConfig("speculative", 4, 12, "fold-at-commit")  # SGLang's serving ring: 16 rows, threshold 16
    assert dec.ring_rows == 16 and dec.max_write_pos() == 8 and not any(dec.is_flush(w) for w in range(9))
    assert dec.commit_cursor(5, 3, False, 3) == (8, 3) and dec.commit_cursor(5, 14, False, 4) == (0, 7)
    every = DecodeConfig("speculative", 4, 4, "fold-at-commit")  # B = T': a fold after every commit
    assert [every.commit_cursor(0, 6, False, k) for k in range(5)] == [(0, 6), (0, 7), (0, 0), (0, 1), (0, 2)]


# ---- bad input: one line naming the argument and the row, nothing changed -------------------------------------
SPEC_T3_B4 = DecodeConfig("speculative", 3, 4)


def _kernel(cls=None, decode=SPEC_T3_B4):
    g = preset("tiny", "mamba2")
    cls = cls or _literal()
    k = cls(KernelConfig(g, make_params(g, torch.Generator().manual_seed(0)), "s32a16", decode, num_slots=3))
    slots = torch.tensor([0, 1])
    k.reset(slots)
    return k, g, slots


@pytest.mark.parametrize("call,match", [
    ("lens_zero", r"window_lens\[1\]: expected a window length 1 <= T'_r <= T'max = 3, got 0"),
    ("lens_big", r"window_lens\[0\]: expected a window length 1 <= T'_r <= T'max = 3, got 4"),
    ("lens_shape", r"window_lens: expected an integer tensor of shape \(2,\)"),
    ("lens_float", r"window_lens: expected an integer tensor of shape \(2,\)"),
    ("lens_unsupported", r"window_lens: kernel 'no-ragged' does not support ragged windows"),
    ("k_past_window", r"accepted\[1\]: expected 0 <= k <= T'_r = 2 \(the row's window length\), got 3"),
    ("k0_refused", r"accepted\[0\]: expected 1 <= k <= T' = 3 .*zero_accept = 'refuse'"),
    ("k0_standard", r"accepted\[0\]: expected 1 <= k <= T' = 1 .*standard decode"),
], ids=["lens-zero", "lens-too-long", "lens-shape", "lens-float", "lens-unsupported", "k-past-window",
        "k0-refused", "k0-standard"])
def test_bad_serving_arguments_are_refused_before_anything_changes(call, match):
    cls = {"lens_unsupported": _NoRagged, "k0_refused": _Refusing}.get(call)
    decode = DecodeConfig("standard", 1, 4) if call == "k0_standard" else DecodeConfig("speculative", 3, 4)
    k, g, slots = _kernel(cls, decode)
    T = decode.window
    inp = make_inputs(g, 2, T, torch.bfloat16, torch.Generator().manual_seed(1))
    if call.startswith("k"):
        lens = torch.tensor([3, 2]) if call == "k_past_window" else None
        k.verify(slots, inp, window_lens=lens) if lens is not None else k.verify(slots, inp)
    before = k.snapshot()
    with pytest.raises(ValueError, match=match):
        if call == "lens_zero":
            k.verify(slots, inp, window_lens=torch.tensor([2, 0]))
        elif call == "lens_big":
            k.verify(slots, inp, window_lens=torch.tensor([4, 1]))
        elif call == "lens_shape":
            k.verify(slots, inp, window_lens=torch.tensor([1, 1, 1]))
        elif call == "lens_float":
            k.verify(slots, inp, window_lens=torch.tensor([1.0, 1.0]))
        elif call == "lens_unsupported":
            k.verify(slots, inp, window_lens=torch.tensor([1, 1]))
        elif call == "k_past_window":
            k.commit(slots, torch.tensor([3, 3]))
        else:
            k.commit(slots, torch.tensor([0, 1]))
    after = k.snapshot()
    assert torch.equal(before.checkpoint, after.checkpoint)
    assert all(torch.equal(before.records[n], after.records[n]) for n in before.records)
    assert torch.equal(before.write_pos, after.write_pos) and torch.equal(before.origin, after.origin)
    assert torch.equal(before.extra["pending"], after.extra["pending"])


# (slots [0, 1], T' = 3: packed inputs of 4 tokens)
@pytest.mark.parametrize("qsl,match", [
    ([1, 2, 4], r"query_start_loc\[0\]: expected 0 \(row 0's first token\), got 1"),
    ([0, 0, 2], r"query_start_loc\[1\]: row 0's window length .* = 0, expected 1 <= T'_r <= T'max = 3"),
    ([0, 4, 4], r"query_start_loc\[1\]: row 0's window length .* = 4, expected 1 <= T'_r <= T'max = 3"),
    ([0, 2, 1], r"query_start_loc\[2\]: row 1's window length .* = -1"),
    ([0, 2, 5], r"query_start_loc\[2\]: the offsets hold 5 tokens, the packed inputs 4"),
    ([0, 2], r"query_start_loc: expected an integer tensor of shape \(3,\)"),
    ([0.0, 2.0, 4.0], r"query_start_loc: expected an integer tensor of shape \(3,\)"),
    ("pad", r"query_start_loc\[2\]: row 1 is a padding row \(slot -1\), expected no tokens"),
    ("lens", r"window_lens: the packed layout takes its window lengths from query_start_loc"),
    ("unsupported", r"query_start_loc: kernel 'no-packed' does not support the packed layout"),
], ids=["first-not-0", "empty-row", "row-too-long", "decreasing", "past-the-inputs", "shape", "float", "padding-row",
        "with-window-lens", "unsupported"])
def test_bad_packed_offsets_are_refused_naming_the_entry_before_anything_changes(qsl, match):
    k, g, slots = _kernel(_NoPacked if qsl == "unsupported" else None)
    packed = {n: v[0] for n, v in make_inputs(g, 1, 4, torch.bfloat16, torch.Generator().manual_seed(1)).items()}
    kw = {"query_start_loc": torch.tensor([0, 2, 4])}
    if qsl == "pad":
        slots = torch.tensor([0, -1])
    elif qsl == "lens":
        kw["window_lens"] = torch.tensor([2, 2])
    elif isinstance(qsl, list):
        kw["query_start_loc"] = torch.tensor(qsl)
    before = k.snapshot()
    with pytest.raises(ValueError, match=match):
        k.verify(slots, packed, **kw)
    after = k.snapshot()
    assert torch.equal(before.checkpoint, after.checkpoint) and torch.equal(before.write_pos, after.write_pos)
    assert all(torch.equal(before.records[n], after.records[n]) for n in before.records)


@pytest.mark.parametrize("cursors,match", [
    (None, r"cursors: kernel .* keeps no cursors \(bookkeeping 'host-cursors'\): expected the caller's integer table "
           r"\[num_slots = 3, 2\]"),
    ([[0, 0], [0, 0]], r"cursors: kernel .* expected the caller's integer table \[num_slots = 3, 2\]"),
    ([[0, 0], [9, 0], [0, 0]], r"cursors\[1, 0\]: write_pos of row 1 \(slot 1\): expected 0 <= write_pos <= 4, got 9"),
    ([[0, 8], [0, 0], [0, 0]], r"cursors\[0, 1\]: origin of row 0 \(slot 0\): expected a ring row in \[0, 8\), got 8"),
    ("own", r"cursors: kernel 'literal-replay' keeps its own cursors \(bookkeeping 'spec'\); pass no cursor table"),
], ids=["missing", "shape", "write-pos", "origin", "to-a-kernel-owning-them"])
def test_bad_cursor_tables_are_refused_naming_the_entry(cursors, match):
    own = cursors == "own"
    host = _literal() if own else get(policy_literal_name("mamba2", "host-cursors"), "mamba2")
    dec = SPEC_T3_B4 if own else DecodeConfig("speculative", 3, 4, "host-cursors")
    k, g, slots = _kernel(host, dec)
    inp = make_inputs(g, 2, 3, torch.bfloat16, torch.Generator().manual_seed(1))
    table = torch.zeros(3, 2, dtype=torch.int64) if own else (None if cursors is None else torch.tensor(cursors))
    before = k.snapshot()
    with pytest.raises(ValueError, match=match):
        k.verify(slots, inp, cursors=table)
    assert torch.equal(before.checkpoint, k.snapshot().checkpoint)
    assert all(torch.equal(before.records[n], k.snapshot().records[n]) for n in before.records)


def test_unknown_policy_names_are_refused():
    with pytest.raises(ValueError, match=r"policy: expected one of \['flush-when-full', 'fold-at-commit', "
                                         r"'fold-every-commit', 'host-cursors', 'spec'\], got 'lru'"):
        DecodeConfig("standard", 1, 4, "lru")
    bad = type("BadPolicy", (_literal(),), {"name": "bad-policy", "bookkeeping": "lru"})
    with pytest.raises(ValueError, match=r"bookkeeping: kernel 'bad-policy' declares an unknown policy"):
        run_scenario(Scenario.tiny("mamba2", steps=1), bad)
    with pytest.raises(ValueError, match=r"decode.policy: kernel 'literal-replay' keeps its books by 'spec'"):
        _kernel(_literal(), DecodeConfig("speculative", 3, 4, "fold-every-commit"))


@pytest.mark.parametrize("params,match", [
    ({"accepted": [[2, 0, 1]], "window_lens": [[1, 0, 3]]},
     r"accepted\[0\]\[0\]: expected an accepted count 0 <= k <= window_lens\[0\]\[0\] = 1, got 2"),
    ({"accepted": [[1, 0, 1]], "window_lens": [[5, 0, 3]]},
     r"window_lens\[0\]\[0\]: expected a window length 1 <= T'_r <= T'max = 4, got 5"),
    ({"accepted": [[1, 0, 1]], "window_lens": [[1, 2, 3]]}, r"window_lens\[0\]\[1\]: row 1 is a padding row"),
    ({"accepted": [[1, 0, 1]], "poison": "zero"}, r"poison: expected one of"),
    ({"accepted": [[1, 0, 1]], "layout": "ragged"}, r"layout: expected one of \('padded', 'packed', 'views'\)"),
    ({"accepted": [[1, 0, 1], [2, 0, 1]], "standard_steps": [1]},
     r"accepted\[1\]\[0\]: step 1 is a standard step, expected k = 1, got 2"),
    ({"accepted": [[1, 0, 1]], "standard_steps": [3]}, r"standard_steps\[0\]: expected a step in \[0, 1\), got 3"),
], ids=["k-past-window", "window-too-long", "padding-window", "unknown-poison", "unknown-layout", "standard-step-k",
        "standard-step-index"])
def test_bad_serving_plans_name_the_entry(params, match):
    with pytest.raises(ValueError, match=match):
        Scenario.tiny("mamba2", schedule="explicit", schedule_params=params)


# ---- fuzzing -----------------------------------------------------------------------------------------------
class _SpecOnly(_literal()):
    name = "spec-only"

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return None if decode.speculative else "speculative decode only"


class _AlwaysWrong(get("literal-replay-host-cursors", "gdn")):
    """Outputs 1.5x too large: every scenario fails (whatever Hypothesis draws)."""

    name = "always-wrong-host-cursors"

    def verify(self, *a, **k):
        return super().verify(*a, **k).mul_(1.5)


@pytest.mark.parametrize("kernel", ["literal-replay-host-cursors", "mutant-host-cursors-stale", _AlwaysWrong],
                         ids=["host-cursors-literal", "host-cursors-stale-mutant", "always-wrong"])
def test_the_nightly_sweep_counts_every_failing_scenario_without_stopping(kernel, monkeypatch):
    """Properties, not the counts a Hypothesis version happens to draw: every drawn scenario runs (a
    failure stops neither the sweep nor the scenarios after it), and the sweep's counts are exactly the
    scenarios whose own run fails, with the checks they fail."""
    import replayssm.validators.jobs.fuzz.run as F

    ran = []

    def spy(sc, kernel_arg, **kw):
        res = F_run(sc, kernel_arg, **kw)
        ran.append((sc, kernel_arg, kw, res.passed,
                    None if res.passed else (res.first_failure.check if res.first_failure else "exception")))
        return res

    F_run = F.run_scenario
    monkeypatch.setattr(F, "run_scenario", spy)
    out = sweep_kernel(kernel, "gdn", examples=4, seed=5, strategy={"max_steps": 3, "max_rows": 2, "max_dim": 2},
                       keep=2)
    monkeypatch.undo()
    failing = [(sc, check) for sc, _, _, passed, check in ran if not passed]
    assert out["scenarios"] == len(ran) == out["planned"] == 4
    assert out["failures"] == len(failing) and sum(out["checks"].values()) == len(failing)
    assert out["checks"] == {c: sum(1 for _, ch in failing if ch == c) for c in {ch for _, ch in failing}}
    assert [e["scenario"] for e in out["examples_failed"]] == [sc.to_dict() for sc, _ in failing[:2]]
    for sc, kernel_arg, kw, passed, _ in ran:  # each verdict is the scenario's own, run alone
        assert run_scenario(sc, kernel_arg, **kw).passed == passed
    if kernel == "literal-replay-host-cursors":
        assert not failing
    elif kernel == "mutant-host-cursors-stale":
        assert set(out["checks"]) <= {"state"}
    else:  # every scenario fails, so the sweep ran past its first failure to the last
        assert len(failing) == len(ran) and all(Scenario.from_dict(e["scenario"]) for e in out["examples_failed"])


def test_fuzz_runs_a_kernel_that_supports_one_decode_kind():
    report = fuzz_kernel(_SpecOnly, max_examples=3)
    assert not report.caught and report.examples == 3, report.summary()



@pytest.mark.parametrize("option", ["window_lens", "zero", "permute_rows", "poison", "layout", "views",
                                    "standard_steps"])
def test_the_strategies_draw_serving_options_where_declared(option):
    slot_ids = (3, -1, 1)
    plan = {"accepted": [[2, 0, 1], [1, 0, 2], [2, 0, 2]], "resets": [[1, 0, 4]]}
    strat = serving_options(_literal(), DecodeConfig("speculative", 2, 4), slot_ids, plan)
    preds = {"window_lens": lambda p: "window_lens" in p and all(
                 a <= n for rows in zip(p["accepted"], p["window_lens"]) for a, n in zip(*rows)),
             "zero": lambda p: any(row[0] == 0 or row[2] == 0 for row in p["accepted"]),
             "permute_rows": lambda p: p.get("permute_rows", False),
             "poison": lambda p: p.get("poison") in ("nan", "large"),
             "layout": lambda p: p.get("layout") == "packed",
             "views": lambda p: p.get("layout") == "views",
             "standard_steps": lambda p: bool(p.get("standard_steps")) and all(
                 p["accepted"][s][r] == 1 for s in p["standard_steps"] for r in (0, 2))}
    find(strat, preds[option], settings=settings(max_examples=200, database=None))
    # the shrunk example turned every other option off
    assert plan["accepted"][0] == [2, 0, 1]


@settings(max_examples=25, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(kernel=type("Plain", (_NoRagged,), {"zero_accept": "refuse", "name": "plain",
                                                    "supports_packed_layout": False, "supports_mixed_decode": False,
                                                    "supports_strided_views": False}),
                 max_steps=6))
def test_the_strategies_never_draw_what_a_kernel_does_not_declare(sc):
    p = sc.schedule_params
    assert "window_lens" not in p and "layout" not in p and "standard_steps" not in p
    assert all(a >= 1 for row in p["accepted"] for a, s in zip(row, sc.resolved_slot_ids) if s >= 0)


# ---- the field catalogue (docs/field_bugs.md): each report's mechanism caught on its named scenario ---------
FIELD = [
    # (mutant, family, Scenario.tiny overrides, the check that catches it first)
    ("mutant-nonspec-reads-draft-slot-0", "gdn", {"schedule": "ragged", "steps": 12}, "state"),
    ("mutant-nonspec-reads-draft-slot-0", "gdn", {"schedule": "mixed", "steps": 12}, "state"),
    ("mutant-packed-window-overrun", "mamba2",
     {"schedule": "ragged", "steps": 4, "schedule_params": {"layout": "packed"}}, "padding-output"),
    ("mutant-host-cursors-stale", "gdn", {"schedule": "per-row", "steps": 4}, "state"),
    ("mutant-zero-accept-commits-drafts", "mamba2",
     {"schedule": "zero-accept", "steps": 4, "schedule_params": {"zero_prob": 0.5}}, "zero-accept"),
    ("mutant-zero-accept-reads-draft-minus-1", "gdn",
     {"schedule": "zero-accept", "steps": 4, "schedule_params": {"zero_prob": 0.5}}, "zero-accept"),
    ("mutant-accepted-for-compacted-rows", "mamba2", {"schedule": "per-row", "steps": 4}, "cursor"),
    ("mutant-low-precision-state", "mamba2", {"schedule": "random", "steps": 4}, "state"),
    ("mutant-padding-lane-writes", "gdn", {"schedule": "ragged", "steps": 3}, "window-tail"),
    ("mutant-recycled-slot-keeps-state", "mamba2",
     {"schedule": "slot-reuse", "steps": 12, "schedule_params": {"reset_prob": 0.3, "poison": "nan"}}, "non-finite"),
    ("mutant-recycled-slot-keeps-state", "mamba2",
     {"schedule": "slot-reuse", "steps": 12, "schedule_params": {"reset_prob": 0.3, "poison": "large"}}, "state"),
]
FIELD_DOC = Path(__file__).resolve().parents[2] / "docs" / "field_bugs.md"


@pytest.mark.parametrize("mutant,family,overrides,check", FIELD,
                         ids=[f"{m.removeprefix('mutant-')}-{o.get('schedule_params', {}).get('poison', o['schedule'])}"
                              for m, _f, o, _c in FIELD])
def test_field_bug_mechanism_is_caught_on_its_named_scenario(mutant, family, overrides, check):
    res = run_scenario(Scenario.tiny(family, **overrides), mutant)
    assert not res.passed and res.first_failure.check == check, res.to_markdown()


def test_the_field_catalogue_names_every_mutant_and_check():
    text = FIELD_DOC.read_text()
    for mutant, _family, overrides, check in FIELD:
        assert f"`{mutant}`" in text and f"`{check}`" in text and f"`{overrides['schedule']}`" in text, mutant
