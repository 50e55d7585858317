"""The ``pdl`` option of the replay kernels' two-launch paths (programmatic dependent launch).

Oracle: the engine (fp64 reference, literal model, invariants) on the option's runs; on a GPU the
same kernel without the option gives the same bits (PDL changes when loads are issued, not the
arithmetic).  Under the
Triton interpreter there is no grid dependency control, so the option compiles out there and these
tests hold the option's checking and the reordered loads of the streams (the checkpoint tile before
the cursor snapshot) to the engine; the GPU tests with ``pdl=True`` run the overlap itself
(tests/ops/gdn/test_gdn_gpu.py ``replay-prepass-pdl-*``,
tests/ops/mamba2/test_mamba2_gpu.py ``test_replay_pdl_nano4b``).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.ops.triton.pdl import launch_kwargs, pdl_active, pdl_option
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_pdl_option_refuses_a_non_bool(value):
    with pytest.raises(ValueError, match=r"options\['pdl'\]: expected True or False"):
        pdl_option({"pdl": value})


def test_pdl_option_default_and_activation():
    assert pdl_option({}) is False and pdl_option({"pdl": True}) is True
    assert pdl_option({}, default=True) is True and pdl_option({"pdl": False}, default=True) is False
    assert not pdl_active(True, torch.device("cpu"), interpret=False)
    assert not pdl_active(False, torch.device("cpu"), interpret=False)
    assert launch_kwargs(True) == {"launch_pdl": True} and launch_kwargs(False) == {}


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_kernel_refuses_a_bad_pdl_value(family):
    sc = Scenario.build(family, decode="standard", batch=2, geometry="tiny", mode="s32a32", buffer=4,
                        schedule="always-1", steps=2, kernel_options={"prepass": True, "pdl": "on"})
    with pytest.raises(ValueError, match=r"options\['pdl'\]: expected True or False, got 'on'"):
        run_scenario(sc, "triton-replay")


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_pdl_pair_passes_the_engine(family):
    """s32a16-L4-T1 at tiny, one flush: the pair with the option accepted and judged (the streams'
    checkpoint tile loaded before the cursor snapshot; the speculative pairs run it in
    tests/ops/gdn/test_gdn_triton.py and tests/ops/mamba2/test_mamba2_triton.py, where the interpreter
    always takes them)."""
    sc = Scenario.build(family, decode="standard", batch=2, geometry="tiny", mode="s32a16", buffer=4,
                        schedule="always-1", steps=5, kernel_options={"prepass": True, "pdl": True})
    res = run_scenario(sc, "triton-replay", repeat_check=False)
    assert res.exception is None and res.passed, [str(f) for f in res.failures[:3]]
