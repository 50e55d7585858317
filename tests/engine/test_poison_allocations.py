"""Allocation poisoning (``--poison-allocations nan|large``): a buffer a kernel allocates and never writes shows.

Oracle: under :class:`PoisonAllocations` every ``torch.empty`` / ``empty_like`` / ``empty_strided``
/ ``new_empty`` / ``new_empty_strided`` result holds the poison (NaN, or 2^100 clipped to the
format's largest finite value; integers their maximum, booleans True) the moment it is made;
``torch.zeros`` / ``full`` are left alone.  ``mutant-unwritten-slab-adopted`` (kekzl/imp #1503: a
committed slab the forward never wrote) then fails deterministically: ``non-finite`` under NaN,
``state`` under 2^100; the literal models and our Triton kernels (which allocate nothing
uninitialised in their calls) pass with either poison.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.cli import main
from replayssm.scenarios import Scenario
from replayssm.scenarios.schedules import POISON_LARGE
from replayssm.validators import Lockstep, run_scenario
from replayssm.validators.engine.poison_alloc import PoisonAllocations

pytestmark = pytest.mark.usefixtures("one_thread")


def _allocations(dev):
    base = torch.ones(3, device=dev)
    return {"empty": torch.empty(4, device=dev), "empty_like": torch.empty_like(base),
            "empty_strided": torch.empty_strided((2, 2), (1, 2), device=dev), "new_empty": base.new_empty(5),
            "new_empty_strided": base.new_empty_strided((2,), (1,)),
            "bf16": torch.empty(3, dtype=torch.bfloat16, device=dev),
            "fp16": torch.empty(3, dtype=torch.float16, device=dev),
            "int32": torch.empty(3, dtype=torch.int32, device=dev),
            "bool": torch.empty(2, dtype=torch.bool, device=dev)}


def _check_poisoned(dev):
    with PoisonAllocations("nan") as mode:
        nan = _allocations(dev)
        zeros = torch.zeros(3, device=dev)
    assert mode.count == len(nan)
    assert all(bool(t.isnan().all()) for n, t in nan.items() if t.is_floating_point())
    assert bool((nan["int32"] == torch.iinfo(torch.int32).max).all()) and bool(nan["bool"].all())
    assert bool((zeros == 0).all())
    with PoisonAllocations("large"):
        large = _allocations(dev)
    assert bool((large["empty"] == POISON_LARGE).all()) and bool((large["bf16"].float() == POISON_LARGE).all())
    assert bool((large["fp16"] == torch.finfo(torch.float16).max).all())


def test_every_empty_like_allocation_is_filled_with_the_poison():
    _check_poisoned("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_empty_like_allocation_is_filled_with_the_poison_on_the_gpu():
    _check_poisoned("cuda")


@pytest.mark.parametrize("family,decode", [("mamba2", "speculative"), ("gdn", "standard")])
@pytest.mark.parametrize("how,check", [("nan", "non-finite"), ("large", "state")])
def test_an_unwritten_slab_committed_as_state_fails_under_poisoning(family, decode, how, check):
    res = run_scenario(Scenario.tiny(family, decode, steps=4), "mutant-unwritten-slab-adopted", poison_allocations=how,
                       repeat_check=False)
    assert not res.passed and res.first_failure.check == check and res.first_failure.step == 0, res.to_markdown()
    assert res.coverage[f"allocations poisoned ({how})"] > 0


@pytest.mark.parametrize("family,kernel,decode", [("mamba2", "literal-replay", "speculative"),
                                                  ("gdn", "literal-baseline", "speculative"),
                                                  ("gdn", "triton-replay", "standard"),
                                                  ("mamba2", "triton-baseline", "speculative")])
@pytest.mark.parametrize("how", ["nan", "large"])
def test_our_kernels_pass_with_allocations_poisoned(family, kernel, decode, how):
    res = run_scenario(Scenario.tiny(family, decode, steps=4), kernel, poison_allocations=how)
    assert res.passed, res.to_markdown()
    assert any(n.startswith(f"allocations poisoned ({how})") for n in res.notes)


def test_an_unknown_poison_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match=r"--poison-allocations.*'zero'"):
        Lockstep(Scenario.tiny("mamba2", steps=2), "literal-replay", poison_allocations="zero")


def test_the_cli_flag_reaches_the_engine(tmp_path, capsys):
    args = ["validate", "--kernel", "mutant-unwritten-slab-adopted", "--family", "gdn", "--decode", "standard",
            "--steps", "3", "--no-repeat", "--quiet", "--out", str(tmp_path)]
    assert main([*args, "--poison-allocations", "nan"]) == 1
    assert "non-finite" in next(tmp_path.glob("*.md")).read_text()
