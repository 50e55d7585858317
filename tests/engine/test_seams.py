"""The seams where serving engines break kernels (issue 50): each new mutant caught by the default validation.

Oracle: each mutant of ``validators/engine/mutants/seams.py`` carries one bug at a seam (inputs rewritten
in place, an out-of-range or garbage accepted count, a state transposed in memory); the default
validation (``Scenario.tiny``: the exhaustive schedule, a padding row, unused slots; the
``tiny-square`` geometry, K = V, for the transposed state) must fail it with the check
docs/field_bugs.md names as its first failure, while the literal models and our Triton kernels
pass the same scenarios.  A refused out-of-range count names the row and the range and leaves
every slot bit-identical; padding rows' counts are garbage at every commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.scenarios.inputs import make_initial_state, make_inputs
from replayssm.validators import Lockstep, run_scenario
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.runner import build_kernel

pytestmark = pytest.mark.usefixtures("one_thread")

FIELD_DOC = Path(__file__).resolve().parents[2] / "docs" / "field_bugs.md"

ZERO_ACCEPT = {"schedule": "zero-accept", "steps": 16, "schedule_params": {"zero_prob": 0.5}}

SEAMS = [
    # (mutant, family, Scenario.tiny overrides, the check that catches it first)
    ("mutant-input-rescaled-in-place", "mamba2", {}, "inputs-unchanged"),
    ("mutant-input-rescaled-in-place", "gdn", {"decode": "standard"}, "inputs-unchanged"),
    ("mutant-accepted-clamped", "mamba2", {}, "accepted-range"),
    ("mutant-accepted-clamped", "gdn", {"decode": "standard"}, "accepted-range"),
    ("mutant-padding-count-commits", "mamba2", {}, "unused-slot"),
    ("mutant-unwritten-slab-adopted", "mamba2", {"poison_allocations": "nan"}, "non-finite"),
    ("mutant-unwritten-slab-adopted", "gdn", {"poison_allocations": "large"}, "state"),
    ("mutant-slot-ids-unit-stride", "gdn", {"schedule_params": {"layout": "views"}}, "unused-slot"),
    ("mutant-out-assumes-contiguous", "mamba2", {"schedule_params": {"layout": "views"}}, "view-gaps"),
    ("mutant-staged-fold-kept-at-zero", "mamba2", ZERO_ACCEPT, "staged-fold"),
    ("mutant-next-verify-fold-skipped", "mamba2", {}, "flush-checkpoint"),
    ("mutant-next-verify-fold-skipped", "gdn", {}, "flush-checkpoint"),
    ("mutant-materialize-off-by-one", "mamba2", {"schedule_params": {"publish": 1.0}}, "materialize"),
    ("mutant-materialize-rewrites-source", "gdn", {"schedule_params": {"publish": 1.0}}, "materialize"),
    ("mutant-transposed-state", "gdn", {"geometry": "tiny-square"}, "state"),
    ("mutant-transposed-state", "kda", {"geometry": "tiny-square"}, "state"),
]


def _id(m, f, o):
    poison = f"-poison-{o['poison_allocations']}" if "poison_allocations" in o else ""
    sp = o.get("schedule_params", {})
    layout = f"-{sp.get('layout', 'publish' if 'publish' in sp else o.get('schedule'))}" if sp else ""
    return (f"{m.removeprefix('mutant-')}-{f}-{o.get('geometry', 'tiny')}-{o.get('decode', 'speculative')}"
            f"{poison}{layout}")


@pytest.mark.parametrize("mutant,family,overrides,check", SEAMS, ids=[_id(m, f, o) for m, f, o, _ in SEAMS])
def test_seam_mutant_is_caught_by_the_default_validation(mutant, family, overrides, check):
    kw = dict(overrides)
    poison = kw.pop("poison_allocations", None)
    res = run_scenario(Scenario.tiny(family, **kw), mutant, poison_allocations=poison)
    assert not res.passed and res.first_failure.check == check, res.to_markdown()


def test_the_field_catalogue_names_every_seam_mutant_and_check():
    text = FIELD_DOC.read_text()
    for mutant, _family, _o, check in SEAMS:
        assert f"`{mutant}`" in text and f"`{check}`" in text, mutant


@pytest.mark.parametrize("family,kernel,decode,geometry", [
    ("gdn", "literal-replay", "speculative", "tiny-square"),
    ("kda", "literal-replay", "speculative", "tiny-square"),
    ("gdn", "literal-baseline", "speculative", "tiny-square"),
    ("gdn", "triton-replay", "standard", "tiny-square"),
    ("kda", "triton-baseline", "standard", "tiny-square"),
    ("mamba2", "triton-replay", "speculative", "tiny"),
], ids=lambda v: str(v))
def test_our_kernels_pass_the_new_checks(family, kernel, decode, geometry):
    """The new checks (inputs-unchanged, accepted-range, garbage padding counts) and the K = V
    geometry raise no false alarm on our literal models and Triton kernels (interpreter)."""
    res = run_scenario(Scenario.tiny(family, decode, geometry=geometry, steps=6), kernel, repeat_check=False)
    assert res.passed, res.to_markdown()
    assert res.coverage["out-of-range counts probed"] >= 1
    assert any(c.startswith("inputs-unchanged") for c in res.checks)


def test_the_square_geometry_has_k_equal_v():
    for family in ("gdn", "kda"):
        g = Scenario.tiny(family, geometry="tiny-square").geometry_obj
        assert g.head_k_dim == g.head_v_dim and g.state_shape[-1] == g.state_shape[-2]


@pytest.mark.parametrize("family,kernel", [("mamba2", "literal-replay"), ("gdn", "literal-baseline"),
                                           ("gdn", "triton-replay")])
@pytest.mark.parametrize("bad", ["past", "negative"])
def test_an_out_of_range_count_is_refused_naming_the_row_and_the_range_before_anything_changes(family, kernel, bad):
    sc = Scenario.tiny(family, steps=2)
    k = build_kernel(kernel, sc, "cpu")
    ids = torch.tensor(sc.resolved_slot_ids, dtype=torch.int64)
    k.reset(ids, make_initial_state(sc, 0, "cpu"), torch.zeros(sc.rows, dtype=torch.int64))
    k.verify(ids, make_inputs(sc, 0, "cpu"))
    before = k.snapshot()
    row = 2  # the second active row (row 1 is padding)
    acc = [2, 12345, 3]
    acc[row] = sc.window + 1 if bad == "past" else -1
    with pytest.raises(ValueError, match=rf"accepted\[{row}\]: expected \d+ <= k <= T' = {sc.window}"):
        k.commit(ids, torch.tensor(acc, dtype=torch.int64))
    after = k.snapshot()
    for slot in range(sc.num_slots):
        assert not inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot)), slot
    k.commit(ids, torch.tensor([2, -7, 3], dtype=torch.int64))  # the refusal left the verify to commit


def test_padding_rows_carry_garbage_counts_drawn_from_the_seed():
    sc = Scenario.tiny("mamba2", steps=8)
    ls = Lockstep(sc, "literal-replay")
    pad = ls.pad_rows[0]
    counts = [ls.commit_counts(p) for p in ls.plans]
    garbage = {c[pad] for c in counts}
    assert len(garbage) > 1 and any(not 0 <= g <= sc.window for g in garbage)
    assert all(c[r] == p.accepted[r] for c, p in zip(counts, ls.plans) for r in ls.active)
    assert counts == [Lockstep(sc, "literal-replay").commit_counts(p) for p in ls.plans]


def test_inputs_unchanged_names_the_tensor_and_the_call():
    res = run_scenario(Scenario.tiny("mamba2", steps=2), "mutant-input-rescaled-in-place", repeat_check=False)
    first = res.first_failure
    assert first.step == 0 and "verify changed its argument inputs[" in first.message


# ---- the staged fold (zero_accept = "staged"): its literal model passes only under its own declaration -------
@pytest.mark.parametrize("family,overrides", [("mamba2", ZERO_ACCEPT), ("gdn", ZERO_ACCEPT), ("kda", {"steps": 8})],
                         ids=["mamba2-zero-accept", "gdn-zero-accept", "kda-exhaustive"])
def test_the_staged_fold_literal_model_passes_under_its_declaration(family, overrides):
    res = run_scenario(Scenario.tiny(family, **overrides), "literal-replay-staged")
    assert res.passed, res.to_markdown()
    if overrides is ZERO_ACCEPT:
        assert res.coverage["k = 0 commits after a staged flush"] >= 1


@pytest.mark.parametrize("base,declares,check", [("literal-replay-staged", "noop", "flush-checkpoint"),
                                                 ("literal-replay", "staged", "staged-fold")],
                         ids=["staged-declared-noop", "noop-declared-staged"])
def test_a_literal_model_fails_under_the_other_declaration(base, declares, check):
    cls = type("Misdeclared", (get(base, "mamba2"),), {"zero_accept": declares, "name": f"{base}-as-{declares}"})
    res = run_scenario(Scenario.tiny("mamba2", **ZERO_ACCEPT), cls, repeat_check=False)
    assert not res.passed and res.first_failure.check == check, res.to_markdown()


def test_a_staged_commit_of_nothing_leaves_the_checkpoint_and_cursors_as_before_the_verify():
    sc = Scenario.tiny("gdn", steps=2)
    k = build_kernel("literal-replay-staged", sc, "cpu")
    ids = torch.tensor([3], dtype=torch.int64)
    k.reset(ids, make_initial_state(sc.replace(rows=1, slot_ids=(3,), origins=None), 0, "cpu"),
            torch.zeros(1, dtype=torch.int64))
    step = 0

    def one():
        return {n: v[:1] for n, v in make_inputs(sc, step, "cpu").items()}
    while not k.decode.is_flush(k.write_pos[3]):  # fill the history until the next verify flushes
        k.verify(ids, one())
        k.commit(ids, torch.tensor([sc.window]))
        step += 1
    before = k.snapshot()
    k.verify(ids, one())
    assert torch.equal(k.ckpt[3], before.checkpoint[3]) and 3 in k.staged
    k.commit(ids, torch.tensor([0]))
    after = k.snapshot()
    assert not [f for f in inv.changed_fields(inv.slot_view(before, 3), inv.slot_view(after, 3))
                if not f.startswith("records.") and not f.startswith("extra.")]
    k.verify(ids, one())
    k.commit(ids, torch.tensor([2]))
    assert not torch.equal(k.ckpt[3], before.checkpoint[3]) and (k.write_pos[3], 3 not in k.staged) == (2, True)


def test_staged_fold_discarded_by_commit_zero_keeps_the_running_bound():
    """The calibration population's one false alarm (rec:a6982faee2f1ac5a, reproducer below): a
    staged fold's commit(0) throws the flush's fold away, so the next flush folds the whole history
    again; the fp64 running-error bound had counted the discarded fold as stored and sized the next
    flush's arithmetic for the records since it (flush-increment at 2x its limit, 7x for GDN)."""
    sc = Scenario.tiny("kda", "speculative", mode="s32a16", schedule="zero-accept", distribution="fast-forget",
                 seed=921777637, steps=12, initial_state="random")
    res = run_scenario(sc, "literal-replay-staged", repeat_check=False)
    assert res.passed, [(f.step, f.check, f.message) for f in res.failures[:3]]
    assert res.summary["worst flush_increment_ratio"] < 1.0


# ---- the fold at the next verify (fold_at = "next-verify"): passes only under its own declaration ------------
@pytest.mark.parametrize("family,overrides", [("mamba2", {}), ("gdn", ZERO_ACCEPT), ("kda", {"steps": 8}),
                                              ("mamba2", {"decode": "standard"}),
                                              ("gdn", {"window": 4, "buffer": 4, "steps": 8})],
                         ids=["mamba2-exhaustive", "gdn-zero-accept", "kda-exhaustive", "mamba2-standard",
                              "gdn-B4-T4-every-verify-flushes"])
def test_the_next_verify_fold_literal_model_passes_under_its_declaration(family, overrides):
    res = run_scenario(Scenario.tiny(family, **overrides), "literal-replay-fold-at-next-verify")
    assert res.passed, res.to_markdown()
    if overrides.get("decode") != "standard":
        assert res.coverage["flush folds judged at the next verify"] >= 1


@pytest.mark.parametrize("base,declares,check", [("literal-replay-fold-at-next-verify", "flush", "flush-checkpoint"),
                                                 ("literal-replay", "next-verify", "checkpoint-unchanged")],
                         ids=["next-verify-declared-flush", "flush-declared-next-verify"])
def test_a_fold_timing_literal_model_fails_under_the_other_declaration(base, declares, check):
    cls = type("Misdeclared", (get(base, "mamba2"),), {"fold_at": declares, "name": f"{base}-as-{declares}"})
    res = run_scenario(Scenario.tiny("mamba2", steps=8), cls, repeat_check=False)
    assert not res.passed and res.first_failure.check == check, res.to_markdown()


def test_a_next_verify_fold_is_owed_across_the_commit_and_lands_at_the_next_verify():
    sc = Scenario.tiny("gdn", steps=2)
    k = build_kernel("literal-replay-fold-at-next-verify", sc, "cpu")
    ids = torch.tensor([3], dtype=torch.int64)
    k.reset(ids, make_initial_state(sc.replace(rows=1, slot_ids=(3,), origins=None), 0, "cpu"),
            torch.zeros(1, dtype=torch.int64))
    step = 0

    def one():
        return {n: v[:1] for n, v in make_inputs(sc, step, "cpu").items()}
    while not k.decode.is_flush(k.write_pos[3]):  # fill the history until the next verify flushes
        k.verify(ids, one())
        k.commit(ids, torch.tensor([sc.window]))
        step += 1
    before, committed = k.snapshot(), k.committed_state(ids)
    k.verify(ids, one())
    k.commit(ids, torch.tensor([1]))
    assert torch.equal(k.ckpt[3], before.checkpoint[3]) and k.owed[3] == (0, before.write_pos[3].item())
    assert k.write_pos[3] == 1  # the cursors moved by the spec's rule; the fold is owed
    assert torch.allclose(k.checkpoint_state(ids), before.checkpoint[3:4].to(torch.float64))
    owed_state = k.committed_state(ids)  # the fold included, the storage untouched
    assert torch.equal(k.ckpt[3], before.checkpoint[3]) and 3 in k.owed
    assert not torch.allclose(owed_state, committed)
    k.verify(ids, one())
    assert 3 not in k.owed and not torch.equal(k.ckpt[3], before.checkpoint[3])
    k.reset(ids, None, torch.zeros(1, dtype=torch.int64))
    assert not k.owed and not k.flush_from


@pytest.mark.parametrize("attrs,needle", [({"fold_at": "later"}, "fold_at"),
                                          ({"fold_at": "next-verify", "zero_accept": "staged"}, "fold_at"),
                                          ({"fold_at": "next-verify", "bookkeeping": "fold-at-commit"}, "fold_at")],
                         ids=["unknown", "with-staged", "with-fold-at-commit"])
def test_a_bad_fold_at_declaration_is_refused_naming_it(attrs, needle):
    cls = type("Bad", (get("literal-replay", "mamba2"),), {"name": "bad", **attrs})
    with pytest.raises(ValueError, match=needle):
        build_kernel(cls, Scenario.tiny("mamba2"), "cpu")


# ---- a fold still owed when the run ends or is checkpointed: judged by a closing verify, then restored -------
LAST_STEP_FLUSH = {"steps": 4, "schedule": "always-T"}  # the one flush at the last step (step 3)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_a_fold_owed_by_the_last_step_is_judged_at_the_end(family):
    """s32a32-T4-B12 tiny, 4 steps accepting T' each: the only flush is the last step's, whose fold
    no verify of the scenario applies.  The closing verify judges it: the fold-skipping mutant fails
    there, the literal model passes with the fold counted as judged."""
    sc = Scenario.tiny(family, **LAST_STEP_FLUSH)
    bad = run_scenario(sc, "mutant-next-verify-fold-skipped", repeat_check=False)
    assert not bad.passed and (bad.first_failure.step, bad.first_failure.check) == (3, "flush-checkpoint")
    good = run_scenario(sc, "literal-replay-fold-at-next-verify")
    assert good.passed and good.coverage["flush folds judged at the next verify"] >= 1, good.to_markdown()


def test_a_checkpoint_judges_the_owed_fold_and_the_resumed_run_goes_on_unchanged():
    """state_dict cannot keep a flush's context: it judges the owed fold first (a closing verify,
    every model restored after it), so a run resumed from it reports what the uninterrupted run does."""
    sc = Scenario.tiny("mamba2", steps=6, schedule="always-T")
    whole = Lockstep(sc, "literal-replay-fold-at-next-verify")
    for _ in range(6):
        whole.step()
    first = Lockstep(sc, "literal-replay-fold-at-next-verify")
    for _ in range(4):
        first.step()
    assert first.deferred is not None
    d = first.state_dict()
    assert first.deferred is None and not first.failures
    resumed = Lockstep(sc, "literal-replay-fold-at-next-verify")
    resumed.load_state_dict(d)
    for _ in range(2):
        resumed.step()
    torch.testing.assert_close(resumed.kernel.checkpoint_state(resumed.ids), whole.kernel.checkpoint_state(whole.ids),
                               rtol=0, atol=0, equal_nan=True)  # (the padding row's is NaN)
    assert resumed.coverage == whole.coverage and not resumed.failures
    bad = Lockstep(sc, "mutant-next-verify-fold-skipped")
    for _ in range(4):
        bad.step()
    bad.state_dict()
    assert [f.check for f in bad.failures][:1] == ["flush-checkpoint"]


def test_an_owed_fold_of_a_kernel_that_cannot_restore_is_said_unjudged():
    cls = type("NoRestore", (get("literal-replay-fold-at-next-verify", "mamba2"),),
               {"supports_restore": False, "name": "literal-replay-fold-at-next-verify-no-restore"})
    res = run_scenario(Scenario.tiny("mamba2", **LAST_STEP_FLUSH), cls, repeat_check=False)
    assert res.coverage["flush folds left unjudged"] >= 1
    assert any("left unjudged" in n for n in res.notes), res.notes
