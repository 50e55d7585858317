"""vLLM 0.33.0's KDA RecoverSSM (replayssm/adapters/vllm033_kda.py) and the bounded KDA gate law, on CPU.

Oracle: the validation engine (fp64 KDA recurrence under the declared gate law, the literal
``fold-every-commit`` model at the same mode, exact invariants); for the gate law, the fp64
reference ``naive.kda_gates`` against its closed form.  The release's files are loaded unchanged
from ``../shared/peers/vllm-0.33.0`` (or ``$REPLAYSSM_VLLM033_SRC``; skipped without them), through
the Triton interpreter at a tiny one-head-count geometry (H = HV = 2, K = 16, V = 8), fp32
activations only (bf16 modes are GPU-only under the interpreter: refused in one line).

Expected: both gate laws' adapters pass exhaustive T' = 2 schedules; the bounded kernel judged
against the default (softplus) law fails (the witness that the declaration is what is checked); our
KDA Triton kernels refuse the bounded law before any work; the CuTe-DSL path is refused in one line.
"""

import os
import pathlib

import pytest
import torch

from replayssm import adapters
from replayssm.adapters import _vllm033_source
from replayssm.conventions import declared
from replayssm.families import family
from replayssm.ops.kda import naive
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import build_kernel, run_scenario
from replayssm.validators.pytest_plugin import assert_kernel_valid

ROOT = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers"
RELEASE = pathlib.Path(os.environ.get(_vllm033_source.ENV) or ROOT / "vllm-0.33.0").resolve()
MHA = {"family": "kda", "num_k_heads": 2, "num_v_heads": 2, "head_k_dim": 16, "head_v_dim": 8}


@pytest.fixture(scope="module")
def release():
    if not (RELEASE / "vllm/models/kimi_k3/nvidia/ops/recoverssm.py").is_file():
        pytest.skip(f"no vLLM 0.33.0 KDA RecoverSSM files under {RELEASE}")
    saved = os.environ.get(_vllm033_source.ENV)
    os.environ[_vllm033_source.ENV] = str(RELEASE)
    try:
        status = adapters.load(force=True)
    finally:
        if saved is None:
            os.environ.pop(_vllm033_source.ENV, None)
        else:
            os.environ[_vllm033_source.ENV] = saved
    ok, line = status["vllm033"]
    assert ok, line
    return line


def _spec(**kw):
    return Scenario.tiny("kda", geometry=MHA, window=2, buffer=2, schedule="exhaustive", mode="s32a32", **kw)


def _assert_passes(res):
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])


def test_bounded_gate_law_reference():
    """lb * sigmoid(exp(A_log) (a + dt_bias)) per channel, inside (lb, 0); the default law unchanged."""
    g64 = torch.float64
    a = torch.randn(5, 2, 4, dtype=g64) * 3
    A_log, dt = torch.randn(2, dtype=g64), torch.randn(2, 4, dtype=g64)
    conv = declared({"gate_lower_bound": -2.5}, ("gate_lower_bound",), torch.float32)
    g, _ = naive.kda_gates(a, torch.zeros(5, 2, dtype=g64), A_log, dt, conv)
    want = -2.5 / (1 + torch.exp(-torch.exp(A_log)[:, None] * (a + dt)))
    torch.testing.assert_close(g, want, rtol=1e-15, atol=0)
    assert bool((g >= -2.5).all() and (g < 0).all())
    g0, _ = naive.kda_gates(a, torch.zeros(5, 2, dtype=g64), A_log, dt)
    torch.testing.assert_close(g0, -torch.exp(A_log)[:, None] * torch.nn.functional.softplus(a + dt), rtol=1e-14,
                               atol=0)
    for bad in (0.0, -6.0, True):
        with pytest.raises(ValueError, match="gate_lower_bound"):
            declared({"gate_lower_bound": bad}, ("gate_lower_bound",), torch.float32)


def test_our_kda_kernels_refuse_the_bounded_law():
    conv = declared({"gate_lower_bound": -5.0}, family("kda").conventions, torch.float32)
    for name in ("triton-replay", "triton-baseline"):
        with pytest.raises(ValueError, match="conventions: .* not the bounded law gate_lower_bound=-5.0"):
            build_kernel(name, _spec(), "cpu", conventions=conv)


def test_listed_with_source(release):
    for name in ("kda/vllm033-kda-recoverssm", "kda/vllm033-kda-recoverssm-softplus"):
        assert name in release
    assert "vllm 0.33.0 release files at" in release


@pytest.mark.parametrize("name", ["vllm033-kda-recoverssm", "vllm033-kda-recoverssm-softplus"],
                         ids=["h2-K16-V8-T2-B2-bounded", "h2-K16-V8-T2-B2-softplus"])
def test_recoverssm_passes_fold_every_commit(release, one_thread, name):
    res = run_scenario(_spec(), name)
    _assert_passes(res)
    assert ("gate -5 * sigmoid" in res.conventions) == (name == "vllm033-kda-recoverssm"), res.conventions


def test_bounded_kernel_fails_against_the_softplus_law(release, one_thread):
    """The witness: the bounded kernel declared with the default gate law is caught."""
    cls = get("vllm033-kda-recoverssm", "kda")
    undeclared = type("Undeclared", (cls,), {"name": "vllm033-kda-recoverssm-undeclared",
                                              "conventions": {"l2_form": "reciprocal"}})
    res = run_scenario(_spec(), undeclared)
    assert not res.passed
    assert res.failures[0].step == 0


def test_refusals_are_one_line(release):
    for kw, why in [
        (dict(decode="standard", window=1, buffer=4), "speculative decoding only"),
        (dict(mode="s32a16"), "cannot be judged at s32a16 on the CPU"),
        (dict(mode="s16a16-sr"), "plain cast"),
        (dict(kernel_options={"backend": "cute"}), "CuTe-DSL RecoverSSM path .* needs SM10x"),
    ]:
        sc = Scenario.tiny("kda", geometry=MHA, steps=2, **{"decode": "speculative", "window": 2, "buffer": 2,
                                                           "mode": "s32a32", **kw})
        with pytest.raises(ValueError, match=why) as e:
            assert_kernel_valid("vllm033-kda-recoverssm", sc)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no GQA"):
        assert_kernel_valid("vllm033-kda-recoverssm", Scenario.tiny("kda", window=2, buffer=2, steps=2))
