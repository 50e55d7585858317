"""mamba-ssm 2.3.2.post1's Triton ``selective_state_update`` (replayssm/adapters/mamba_ssm.py:
``mamba-ssm-baseline``, Mamba-2) through the engine, on CPU under the interpreter.

Oracle: the validation engine against ``literal-baseline`` (fp64 recurrence on the accepted
stream, the literal baseline at the same mode, exact invariants).  Expected (measured 2026-12-01,
tiny geometry, s32a32): both decodes pass.  The source is an unpacked sdist named by
``REPLAYSSM_MAMBA_SSM_SRC`` (or ``../shared/peers/mamba_ssm-2.3.2.post1`` beside the checkout, or an
installed mamba_ssm); skipped without one.
"""

import os
import pathlib

import pytest

from replayssm import adapters
from replayssm.adapters import mamba_ssm
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

PEER = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "mamba_ssm-2.3.2.post1"


@pytest.fixture(scope="module")
def mamba_ssm_kernel():
    saved = os.environ.get(mamba_ssm.ENV)
    if saved is None and PEER.is_dir():
        os.environ[mamba_ssm.ENV] = str(PEER)
    try:
        ok, line = adapters.load(force=True)["mamba_ssm"]
    finally:
        if saved is None:
            os.environ.pop(mamba_ssm.ENV, None)
    if not ok:
        pytest.skip(line)


@pytest.mark.parametrize("kw", [dict(decode="standard", schedule="always-1", buffer=1, steps=4),
                                dict(decode="speculative", schedule="exhaustive", window=2, buffer=2)],
                         ids=["mamba2-mamba-ssm-baseline-s32a32-L1", "mamba2-mamba-ssm-baseline-s32a32-T2-B2"])
def test_mamba_ssm_baseline(mamba_ssm_kernel, one_thread, kw):
    """Every exact invariant holds; the exhaustive schedule's zero-state resets (issue 46) let the
    kernel's softplus loss (``log(exp(x) + 1)``, docs/findings.md finding 9, established by
    intervention in tests/adapters/test_findings_softplus.py) show in the state check: a precision finding."""
    res = run_scenario(Scenario.tiny("mamba2", mode="s32a32", **kw), "mamba-ssm-baseline")
    if kw["schedule"] == "exhaustive":
        assert not res.passed and {f.check for f in res.failures} == {"state"}, res.failures[:3]
        assert "lower effective precision" in res.failures[0].message
        return
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])


def test_a_wrong_source_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(mamba_ssm.ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="has no mamba_ssm/ops/triton/selective_state_update.py") as e:
        mamba_ssm.find_root()
    assert "\n" not in str(e.value)
    (tmp_path / "mamba_ssm" / "ops" / "triton").mkdir(parents=True)
    (tmp_path / "mamba_ssm" / "ops" / "triton" / "selective_state_update.py").write_text("")
    (tmp_path / "PKG-INFO").write_text("Name: mamba_ssm\nVersion: 2.2.0\n")
    with pytest.raises(RuntimeError, match="mamba_ssm 2.2.0 .*reads mamba-ssm 2.3.2.post1"):
        mamba_ssm.find_root()
