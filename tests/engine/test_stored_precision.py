"""Stored-precision checks: what a kernel really stores, and the error one flush adds.

Oracle: exact representability (``validators/engine/checks/stored_precision.py``) and the fp64 fold of
the kernel's own storage (``validators/engine/checks/flush_increment.py``).  A declared-fp32 checkpoint
kept at bf16 precision used to pass at qwen35-4b geometry (its state error is within 2x the
literal model's bf16-record-level error); both checks name it now, at tiny and at qwen35-4b.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.precision import FORMATS, STATE_FORMATS, PrecisionMode, StorageFormat, lower_format
from replayssm.scenarios import Scenario
from replayssm.validators import run_scenario
from replayssm.validators.engine.checks.stored_precision import (
    MIN_VALUES,
    SAMPLE,
    coarser_formats,
    evenly_spaced,
    exact_shares,
    verdict,
)
from replayssm.validators.engine.mutants import MUTANTS
from replayssm.validators.engine.mutants.field_bugs import store_one_lower

pytestmark = pytest.mark.usefixtures("one_thread")


def test_coarser_formats_follow_the_formats_table():
    assert coarser_formats("fp32") == ["bf16", "fp16", "fp8e4m3"]
    assert coarser_formats("bf16") == ["fp8e4m3"]
    assert coarser_formats("fp16") == ["bf16", "fp8e4m3"]


@pytest.mark.parametrize("n", [SAMPLE + 1, 2**24 + 3, 2**27, 512 * 32 * 128 * 128 + 7],
                         ids=["n10001", "n2p24p3", "n2p27-kda-batch256", "n-kda-batch512"])
def test_the_sample_indices_stay_inside_every_size(n):
    # a float32 linspace put the last index at n for n = 2^27 (KDA's checkpoint at batch 256 on the H200)
    idx = evenly_spaced(n, SAMPLE)
    assert idx.dtype == torch.int64 and idx.numel() == SAMPLE
    assert int(idx[0]) == 0 and int(idx[-1]) == n - 1
    assert bool((idx[1:] > idx[:-1]).all())


def test_the_verdict_names_what_is_stored():
    g = torch.Generator().manual_seed(0)
    fp32 = torch.randn(4096, generator=g, dtype=torch.float64).to(torch.float32).to(torch.float64)
    assert verdict("checkpoint", "fp32", fp32) is None
    assert exact_shares(fp32, "fp32")["bf16"] < 0.01
    msg = verdict("checkpoint", "fp32", fp32.to(torch.bfloat16).to(torch.float64))
    assert msg.startswith("checkpoint declared fp32: 100 % of 4096 sampled values") and "bf16-exact" in msg
    # too few nonzero values: no verdict (zeros are not evidence)
    few = torch.zeros(4096, dtype=torch.float64)
    few[: MIN_VALUES - 1] = 1.0
    assert verdict("checkpoint", "fp32", few) is None


@pytest.mark.parametrize("family,geometry,mode", [("gdn", "tiny", "s32a16"), ("mamba2", "tiny", "s32a32"),
                                                  ("gdn", "qwen35-4b", "s32a16")], ids=lambda v: str(v))
def test_a_bf16_checkpoint_in_an_fp32_container_is_named(family, geometry, mode):
    kw = {} if geometry == "tiny" else {"batch": 1, "padding": 0, "window": 2, "buffer": 4}
    sc = Scenario.build(family, decode="speculative", geometry=geometry, mode=mode, steps=6, **kw)
    res = run_scenario(sc, "mutant-checkpoint-bf16-precision", repeat_check=False)
    assert not res.passed
    assert res.first_failure.check == "stored-precision", res.to_markdown()
    assert "checkpoint declared fp32: 100 %" in res.first_failure.message
    assert "flush-increment" in res.failure_counts, res.to_markdown()


@pytest.mark.parametrize("family,mode", [("gdn", "s32a16"), ("mamba2", "s32a16"), ("gdn", "s16a16-sr")],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("decode", ["speculative", "standard"])
def test_correct_literal_models_raise_no_stored_precision_alarm(family, mode, decode):
    sc = Scenario.tiny(family, decode, mode=mode, steps=16, distribution="large-delta")
    res = run_scenario(sc, "literal-replay", repeat_check=False)
    assert res.passed, res.to_markdown()
    assert {"stored-precision", "flush-increment"} <= {c.split(" ")[0] for c in res.checks}


# ---- a format has one home: every state format's next-lower store fails, a new row gets sane defaults ---------
def _mode_of(fmt) -> str:
    return "s64a64" if fmt.name == "fp64" else f"s{fmt.token}a{'32' if fmt.name == 'fp32' else '16'}"


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("fmt", list(STATE_FORMATS.values()), ids=list(STATE_FORMATS))
def test_a_state_stored_one_format_lower_fails_for_every_format(fmt, family):
    """Table-driven over precision.FORMATS: the literal model passes, the state rounded through the row's
    next-lower format (``lower_format``) fails, at the mode whose state is that format."""
    assert lower_format(fmt.name) is not None
    sc = Scenario.tiny(family, mode=_mode_of(fmt), schedule="per-row", steps=12, seed=3)
    assert run_scenario(sc, "literal-replay", repeat_check=False).passed
    res = run_scenario(sc, MUTANTS["mutant-low-precision-state"].classes[family], repeat_check=False,
                       stop_on_failure=True)
    assert not res.passed and res.first_failure.check != "exception", res.headline()


def test_a_new_format_row_gets_sane_defaults(monkeypatch):
    """A row added by the documented recipe (no floor, no next-lower format): its floor stays at most 2^-4 of
    the row maximum, its next-lower format is the state format with the next larger u, and where there is
    none the stored-one-lower mutant refuses the mode (no KeyError counted as a catch)."""
    e5m2 = StorageFormat("fp8e5m2", "e5", torch.float8_e5m2, 2.0**-3, 1, ("state",), qmax=57344.0,
                         scale_block="row")
    fp12 = StorageFormat("fp12", "12", torch.float16, 2.0**-6, 2, ("state",))
    for f in (e5m2, fp12):
        monkeypatch.setitem(FORMATS, f.name, f)
        monkeypatch.setitem(STATE_FORMATS, f.name, f)
    assert e5m2.floor * e5m2.unit_roundoff <= 2.0**-4 and fp12.floor == 4.0
    assert lower_format("fp12") == "fp8e4m3" and lower_format("fp8e5m2") is None
    assert lower_format("fp8e4m3") == "fp4e2m1"  # an explicit row entry wins over the default
    low = MUTANTS["mutant-low-precision-state"].classes["mamba2"]
    assert "no storage format below fp8e5m2" in low.unsupported_reason(PrecisionMode("fp8e5m2", "bf16"), None, {})
    x = torch.linspace(-3, 3, 64).reshape(4, 16)
    assert 0 < (store_one_lower(x, lower_format("fp12")) - x).abs().max() <= x.abs().max() * 2.0**-4
