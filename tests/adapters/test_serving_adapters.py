"""The adapters whose external kernels take per-row offsets (``query_start_loc`` / ``cu_seqlens``)
driven in the serving layouts they declare, on CPU under the interpreter; the others declare none.

Oracle: ``run_scenario`` (fp64 reference on the accepted stream, the literal model of the adapter's
bookkeeping at the same mode, the window-tail / padding-output / unwritten-output checks, cursor and
committed-storage invariants under the declared policy).  The vLLM kernels are loaded unchanged from
``../shared/peers/vllm-replayssm`` and SGLang's kernel files from its --no-deps install (each source
skipped when absent); fp32 activations only (bf16 ``tl.dot`` is wrong under the interpreter).
Geometry ``micro`` (the smallest tiles the kernels take), speculative T' = 3, B = 5 (B + T' = 8: the
power of two SGLang's ring needs), 3 rows (row 1 padding), explicit plans of 3-4 steps.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest
from serving_plans import MICRO, MIXED, PACKED

from replayssm import adapters
from replayssm.adapters import _vllm_source
from replayssm.adapters.fla import FLABaselineGDN, FLABaselineKDA
from replayssm.adapters.flashinfer import FlashInferCheckpointing, FlashInferSSU
from replayssm.adapters.mamba_ssm import MambaSSMBaseline
from replayssm.adapters.sglang_mamba2 import SGLangMamba2Baseline
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")

PEERS = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "vllm-replayssm"


@pytest.fixture(scope="module")
def loaded():
    """Every adapter source that is available here (the vLLM peers' tree through its variable)."""
    saved = os.environ.get(_vllm_source.ENV)
    if PEERS.is_dir():
        os.environ[_vllm_source.ENV] = str(PEERS)
    try:
        status = adapters.load(force=True)
    finally:
        if saved is None:
            os.environ.pop(_vllm_source.ENV, None)
        else:
            os.environ[_vllm_source.ENV] = saved
    return status


def _need(loaded, source):
    if source == "sglang" and importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang not installed (pip install --no-deps sglang==0.5.23)")
    ok, line = loaded[source]
    if not ok:
        pytest.skip(line)


def _sc(family, mode, params, decode="speculative", **kw) -> Scenario:
    return Scenario.tiny(family, decode=decode, geometry=MICRO[family], mode=mode, window=3, buffer=5,
                         schedule="explicit", schedule_params=params, **kw)


def _passes(res):
    assert res.exception is None, res.exception
    assert res.passed, [str(f) for f in res.failures[:5]]


# (source, family, kernel, mode, the plans it declares)
DECLARED = [("vllm", "mamba2", "vllm-replay", "s32a32", ("packed", "mixed")),
            ("vllm", "gdn", "vllm-replay", "s32a32-tf32", ("packed", "mixed")),
            ("vllm", "mamba2", "vllm-baseline", "s32a32", ("packed", "mixed")),
            ("vllm", "gdn", "vllm-baseline", "s32a32", ("packed", "mixed")),
            ("sglang", "gdn", "sglang-replay", "s32a32", ("packed", "mixed")),
            ("sglang", "gdn", "sglang-replay-serving", "s32a32-tf32", ("packed",)),
            ("sglang", "kda", "sglang-replay-fold", "s32a32", ("packed",))]
CASES = [(src, fam, name, mode, plan) for src, fam, name, mode, plans in DECLARED for plan in plans]


@pytest.mark.parametrize("source,family,name,mode,plan", CASES,
                         ids=[f"{plan}-{mode}-T3-B5-micro-{fam}-{name}" for _, fam, name, mode, plan in CASES])
def test_adapters_run_the_serving_layouts_they_declare(loaded, source, family, name, mode, plan):
    _need(loaded, source)
    res = run_scenario(_sc(family, mode, PACKED if plan == "packed" else MIXED), get(name, family),
                       repeat_check=False)
    _passes(res)
    if plan == "packed":
        assert res.coverage["packed verifies"] == 3
        assert res.tokens_verified == 2 + 3 + 1 + 3 + 3 + 1  # each row's own window, not T' per row
    else:
        assert res.coverage["standard steps on speculative slots"] == 2


def test_a_standard_decode_object_unpacks_a_packed_call_for_its_one_token_kernels(loaded):
    _need(loaded, "vllm")
    sc = Scenario.tiny("gdn", decode="standard", geometry=MICRO["gdn"], mode="s32a32-tf32", buffer=3,
                       schedule="always-1", steps=4, schedule_params={"layout": "packed"})
    res = run_scenario(sc, get("vllm-replay", "gdn"), repeat_check=False)
    _passes(res)
    assert res.coverage["packed verifies"] == 4 and res.coverage["flush verifies"] > 0


@pytest.mark.parametrize("cls", [FLABaselineGDN, FLABaselineKDA, MambaSSMBaseline, SGLangMamba2Baseline,
                                 FlashInferSSU, FlashInferCheckpointing],
                         ids=lambda c: f"{c.family}-{c.name}")
def test_adapters_of_kernels_without_offsets_declare_no_serving_layout(cls):
    """Their kernels take one token per launch (FLA's dense recurrence as the adapter runs it) or a
    padded ``[R, T']`` window with no offsets: nothing to pass through, so nothing is declared."""
    assert not cls.supports_packed_layout and not cls.supports_ragged_windows and not cls.supports_mixed_decode
