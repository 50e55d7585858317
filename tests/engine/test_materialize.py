"""Prefix-cache materialisation: ``materialize(slot_ids, upto, dst)`` judged against the fp64 state at that token.

Oracle: the interface's ``supports_materialize`` contract and the ``materialize`` check: under a
``publish`` plan every published prefix (at the history's edges, the ring's wrap point, at
random) is within the check's bound of the fp64 state after ``upto`` history tokens and no slot
but the destinations changes; the literal replay models pass at several modes and policies, the
two materialisation mutants fail.  A bad call is refused naming the argument before anything
changes; kernels that do not declare it refuse it, and a publish plan for them is refused up front.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from replayssm.interface import DecodeConfig
from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.scenarios.inputs import make_initial_state, make_inputs
from replayssm.scenarios.strategies import serving_options
from replayssm.validators import Lockstep, run_scenario
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.runner import build_kernel

pytestmark = pytest.mark.usefixtures("one_thread")

PUBLISH = {"publish": 1.0}


@pytest.mark.parametrize("family,kernel,decode,mode", [
    ("mamba2", "literal-replay", "speculative", "s32a16"),
    ("gdn", "literal-replay", "standard", "s32a16"),
    ("kda", "literal-replay-fold-at-commit", "speculative", "s32a16"),
    ("gdn", "literal-replay-staged", "speculative", "s16a16"),
    ("mamba2", "literal-replay", "speculative", "sfp8a16"),
], ids=lambda v: str(v))
def test_the_literal_models_publish_the_fp64_prefix_state(family, kernel, decode, mode):
    res = run_scenario(Scenario.tiny(family, decode, mode=mode, steps=12, schedule_params=PUBLISH), kernel)
    assert res.passed, res.to_markdown()
    assert res.coverage["prefixes published"] >= 12 and res.coverage["prefixes published at the history's edges"] >= 1


def _filled(family="gdn"):
    sc = Scenario.tiny(family, steps=2)
    k = build_kernel("literal-replay", sc, "cpu")
    ids = torch.tensor(sc.resolved_slot_ids, dtype=torch.int64)
    k.reset(ids, make_initial_state(sc, 0, "cpu"), torch.zeros(sc.rows, dtype=torch.int64))
    k.verify(ids, make_inputs(sc, 0, "cpu"))
    k.commit(ids, torch.tensor([3, 0, 2]))
    return sc, k, ids


@pytest.mark.parametrize("upto,dst,match", [([4, 0, 1], [0, 0, 2], r"upto\[0\]: expected 0 <= upto <= write_pos = 3"),
                                            ([1, 0, 1], [1, 0, 2], r"dst_slot_ids\[0\]: expected a slot in \[0, 5\) "
                                                                   r"that is no source"),
                                            ([1, 0, 1], [2, 0, 2], r"dst_slot_ids\[2\]")],
                         ids=["upto-past-history", "dst-is-a-source", "dst-twice"])
def test_a_bad_materialize_is_refused_naming_the_argument_before_anything_changes(upto, dst, match):
    sc, k, ids = _filled()
    before = k.snapshot()
    with pytest.raises(ValueError, match=match):
        k.materialize(ids, torch.tensor(upto), torch.tensor(dst))
    after = k.snapshot()
    assert all(not inv.changed_fields(inv.slot_view(before, s), inv.slot_view(after, s)) for s in range(sc.num_slots))


def test_materialize_of_the_whole_history_is_the_committed_state_and_leaves_the_source():
    sc, k, ids = _filled()
    before = k.snapshot()
    k.materialize(ids, torch.tensor([3, 0, 2]), torch.tensor([0, 0, 2]))
    after = k.snapshot()
    for s in (3, 1, 4):
        assert not inv.changed_fields(inv.slot_view(before, s), inv.slot_view(after, s)), s
    got = k.committed_state(torch.tensor([0, 2]))
    want = k.committed_state(torch.tensor([3, 1]))
    assert torch.allclose(got, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    assert (k.write_pos[0], k.write_pos[2]) == (0, 0)


@pytest.mark.parametrize("family,kernel", [("mamba2", "triton-replay"), ("gdn", "triton-baseline"),
                                           ("gdn", "literal-replay-host-cursors"), ("mamba2", "literal-baseline")])
def test_kernels_without_materialize_refuse_it_and_a_publish_plan(family, kernel):
    assert get(kernel, family).supports_materialize is False
    with pytest.raises(ValueError, match=r"publish.*supports_materialize is False"):
        Lockstep(Scenario.tiny(family, steps=2, schedule_params=PUBLISH), kernel)
    sc = Scenario.tiny(family, steps=2)
    k = build_kernel(kernel, sc, "cpu")
    with pytest.raises(ValueError, match=r"materialize: .*supports_materialize is False"):
        k.materialize(torch.tensor([3]), torch.tensor([0]), torch.tensor([0]))


def test_the_fuzzer_draws_publish_only_where_declared():
    plan = {"accepted": [[2, 0, 1], [1, 0, 2]]}
    dec = DecodeConfig("speculative", 2, 4)
    find(serving_options(get("literal-replay", "gdn"), dec, (3, -1, 1), plan), lambda p: "publish" in p,
         settings=settings(max_examples=200, database=None))
    with pytest.raises(NoSuchExample):
        find(serving_options(get("triton-replay", "gdn"), dec, (3, -1, 1), plan), lambda p: "publish" in p,
             settings=settings(max_examples=100, database=None))
