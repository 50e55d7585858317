"""Declared conventions: a kernel is measured against the recurrence it claims.

Oracle: ``replayssm/conventions.py`` (beta rounded to the activation dtype, the softplus
threshold, the L2-norm epsilon and form) followed by the fp64 reference and the literal model
(``validators/engine/runner.py`` ``kernel_conventions``).  A correct kernel computing with a
non-default convention (here: the literal replay model with its conventions fixed) fails when it
does not declare it and passes when it does; declarations a family has no use for are refused.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from replayssm.conventions import DEFAULT, declared
from replayssm.families import family
from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.scenarios.inputs import make_initial_state, make_inputs, make_params
from replayssm.validators import run_scenario
from replayssm.validators.engine.runner import kernel_conventions, reference_step

pytestmark = pytest.mark.usefixtures("one_thread")


def fixed_convention_kernel(fam: str, conv: dict, declare: bool):
    """The literal replay model computing with ``conv`` whatever the engine asks (a correct kernel
    with another convention), declaring it or not."""
    base = get("literal-replay", fam)

    def __init__(self, config):
        own = declared(conv, family(fam).conventions, config.mode.act_dtype)
        base.__init__(self, dataclasses.replace(config, conventions=own))

    return type("FixedConvention", (base,), {"name": "fixed-convention", "__init__": __init__,
                                              "conventions": dict(conv) if declare else {}})


CASES = [  # family, mode, decode, convention (each fails the default recurrence: measured below)
    ("gdn", "s32a16", "standard", {"beta_rounded": True}),
    ("gdn", "s32a32", "speculative", {"l2_eps": 1e-2}),
    ("gdn", "s32a32", "standard", {"softplus_threshold": 1.0}),
    ("mamba2", "s32a32", "speculative", {"softplus_threshold": 1.0}),
    ("kda", "s32a16", "standard", {"beta_rounded": True}),
    ("kda", "s32a32", "speculative", {"l2_eps": 1e-2}),
]


@pytest.mark.parametrize("fam,mode,decode,conv", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{next(iter(c[3]))}" for c in CASES])
def test_a_correct_kernel_with_another_convention_passes_only_when_it_declares_it(fam, mode, decode, conv):
    sc = Scenario.tiny(fam, decode, mode=mode, steps=8, distribution="large-delta")
    silent = run_scenario(sc, fixed_convention_kernel(fam, conv, declare=False), repeat_check=False)
    assert not silent.passed, silent.to_markdown()
    assert {"output", "state"} & set(silent.failure_counts), silent.failure_counts
    loud = run_scenario(sc, fixed_convention_kernel(fam, conv, declare=True), repeat_check=False)
    assert loud.passed, loud.to_markdown()
    assert loud.conventions.endswith("(declared)") and silent.conventions == DEFAULT.label(
        family(fam).conventions)


def test_the_reference_follows_the_declared_form_bit_for_bit():
    # u * (1 / sqrt(.)) and u / sqrt(.) differ in the last bits of fp64: the reference computes the declared one
    torch.manual_seed(0)
    sc = Scenario.tiny("gdn", "standard", mode="s64a64")
    tok = {k: v[:, 0].double() for k, v in make_inputs(sc, 0).items()}
    params = {k: v.double() for k, v in make_params(sc).items()}
    state = make_initial_state(sc, 0).double()
    recip = declared({"l2_form": "reciprocal"}, family("gdn").conventions, torch.float64)
    y_r, _ = reference_step("gdn", state, tok, params, recip)
    y_d, _ = reference_step("gdn", state, tok, params)
    qn = tok["q"] * (1.0 / torch.sqrt((tok["q"] ** 2).sum(-1, keepdim=True) + 1e-6))
    assert torch.equal(recip.l2norm(tok["q"]), qn)
    assert not torch.equal(y_r, y_d)
    assert (y_r - y_d).abs().max() < 1e-14 * y_d.abs().max()


@pytest.mark.parametrize("decl,match", [
    ({"l2_eps": 1e-5}, "'l2_eps', which this family's recurrence does not have"),
    ({"softplus_limit": 20}, "unknown 'softplus_limit'"),
    ({"softplus_threshold": "20"}, "softplus_threshold='20'; expected a number"),
], ids=["not-mamba2", "unknown", "bad-value"])
def test_bad_declarations_are_refused(decl, match):
    sc = Scenario.tiny("mamba2", "standard")
    cls = type("Declares", (get("literal-replay", "mamba2"),), {"name": "declares", "conventions": decl})
    with pytest.raises(ValueError, match=f"conventions: kernel 'declares' declares {match}"):
        kernel_conventions(cls, sc)
    with pytest.raises(ValueError, match="conventions"):
        run_scenario(sc, cls, repeat_check=False)


def test_per_decode_declarations():
    cls = type("PerDecode", (get("literal-replay", "gdn"),),
               {"name": "per-decode", "conventions": {"standard": {"beta_rounded": True}, "speculative": {}}})
    std = kernel_conventions(cls, Scenario.tiny("gdn", "standard", mode="s32a16"))
    spec = kernel_conventions(cls, Scenario.tiny("gdn", "speculative", mode="s32a16"))
    assert std.beta_rounded and str(std.beta_dtype) == "torch.bfloat16" and spec.is_default
