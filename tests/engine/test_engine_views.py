"""The ``views`` layout: tensors handed over as strided views of wider buffers, as serving engines hold them.

Oracle: the kernel interface's ``supports_strided_views``.  Under ``layout: "views"`` every input
is a slice of one wider buffer, ``out`` a slice of another with canaries in its gaps, ``slot_ids``
column 0 of a block table (stride 3, vLLM #51682) and ``accepted`` column 1 of another; the
literal models (which declare it) pass, the gaps keep their bits (``view-gaps``), and the two
stride mutants are caught.  Our Triton kernels read their tensors with unit strides and declare
no support: a views plan is refused before anything runs, and a strided tensor handed to them
directly is refused naming the tensor and its strides.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.interface import PAD_SLOT
from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.scenarios.inputs import make_initial_state, make_inputs
from replayssm.validators import Lockstep, run_scenario
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.engine_views import column_view, strided_views
from replayssm.validators.engine.runner import build_kernel

pytestmark = pytest.mark.usefixtures("one_thread")

VIEWS = {"layout": "views"}


def test_the_views_are_strided_slices_with_gaps_that_show_a_write():
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    y = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2) + 100
    views, gaps = strided_views("inputs", {"x": x, "y": y}, inv.PAD_CANARY)
    assert torch.equal(views["x"], x) and torch.equal(views["y"], y)
    assert not views["x"].is_contiguous() and views["x"].stride() == (36, 12, 1) and views["y"].storage_offset() == 7
    assert not bool(gaps.changed())
    gaps.buffer[1, 2, 5] = 0.0  # a gap element
    assert bool(gaps.changed()) and gaps.first_change() == (1, 2, 5)
    col, tgaps = column_view("slot_ids", torch.tensor([3, -1, 1]), 0, [0, 2, 4])
    assert col.tolist() == [3, -1, 1] and col.stride() == (3,) and not bool(tgaps.changed())


@pytest.mark.parametrize("family,kernel,decode,params", [
    ("mamba2", "literal-replay", "speculative", VIEWS),
    ("gdn", "literal-replay", "standard", VIEWS),
    ("gdn", "literal-baseline", "speculative", {**VIEWS, "permute_rows": True}),
    ("kda", "literal-replay-fold-at-commit", "speculative", VIEWS),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}" for k in v))
def test_the_literal_models_pass_the_views_layout(family, kernel, decode, params):
    res = run_scenario(Scenario.tiny(family, decode, steps=6, schedule_params=params), kernel)
    assert res.passed, res.to_markdown()
    assert any(c.startswith("view-gaps") for c in res.checks)


@pytest.mark.parametrize("mutant,family,check", [("mutant-out-assumes-contiguous", "mamba2", "view-gaps"),
                                                 ("mutant-slot-ids-unit-stride", "gdn", "unused-slot")])
def test_the_stride_mutants_are_caught_under_the_views_layout_and_pass_without_it(mutant, family, check):
    res = run_scenario(Scenario.tiny(family, schedule_params=VIEWS), mutant)
    assert not res.passed and res.first_failure.check == check, res.to_markdown()
    assert run_scenario(Scenario.tiny(family, steps=4), mutant).passed


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("kernel", ["triton-replay", "triton-baseline"])
def test_our_triton_kernels_declare_no_strided_views_and_a_views_plan_is_refused(family, kernel):
    assert get(kernel, family).supports_strided_views is False
    with pytest.raises(ValueError, match=r"scenario.schedule: .*layout 'views'.*supports_strided_views is False"):
        Lockstep(Scenario.tiny(family, steps=2, schedule_params=VIEWS), kernel)


@pytest.mark.parametrize("family,kernel", [("mamba2", "triton-replay"), ("gdn", "triton-baseline")])
def test_a_strided_tensor_handed_to_a_triton_kernel_is_refused_naming_it_and_its_strides(family, kernel):
    sc = Scenario.tiny(family, steps=2)
    k = build_kernel(kernel, sc, "cpu")
    ids = torch.tensor(sc.resolved_slot_ids, dtype=torch.int64)
    k.reset(ids, make_initial_state(sc, 0, "cpu"), torch.zeros(sc.rows, dtype=torch.int64))
    inputs = make_inputs(sc, 0, "cpu")
    before = k.snapshot()
    col, _ = column_view("slot_ids", ids, 0, [PAD_SLOT])
    with pytest.raises(ValueError, match=r"slot_ids: expected a contiguous tensor, got shape \(3,\) with strides "
                                         r"\(3,\)"):
        k.verify(col, inputs)
    views, _ = strided_views("inputs", inputs, 0.0)
    name = next(iter(inputs))
    with pytest.raises(ValueError, match=rf"inputs\['{name}'\]: expected a contiguous tensor, .* strides "
                                         rf"{tuple(views[name].stride())}".replace("(", r"\(").replace(")", r"\)")):
        k.verify(ids, views)
    after = k.snapshot()
    for slot in range(sc.num_slots):
        assert not inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot)), slot
    k.verify(ids, inputs)
    acc, _ = column_view("accepted", torch.tensor([1, 0, 1]), 1, [-1])
    with pytest.raises(ValueError, match=r"accepted: expected a contiguous tensor, .* strides \(3,\)"):
        k.commit(ids, acc)
