"""SGLang 0.5.23's ReplaySSM GDN decode kernels and its Mamba-2 baseline (replayssm/adapters/
sglang_gdn.py, sglang_mamba2.py) through the engine, on CPU under the interpreter.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal model of the
kernel's kind at the same mode for the tolerance rule, exact invariants: checkpoint bit-identical
over a non-flush verify, padding rows and canary slots untouched, every output written, committed
ring rows kept, cursors by the spec rule, bit-identical repeat).  fp32-activation modes only: bf16
``tl.dot`` is wrong under the interpreter; the GPU tests run the 16-bit ones.

Expected (measured 2026-12-01, tiny geometry): every case passes -- the standard GDN decode at
``s32a32-tf32`` (its fp32 dots are tf32 on the GPU; the interpreter computes them in fp32, inside
the tf32 bound), the speculative decode at ``s32a32`` (``dot_precision="ieee"``) through every k at
every ring phase, the Mamba-2 baseline in both decodes.  Its Mamba-2 ``softplus`` is vLLM's
``log(exp(x) + 1)`` and loses the same precision for negative inputs (measured directly below, as
for vLLM in docs/findings.md).  Skipped without
``pip install --no-deps sglang==0.5.23``.
"""

import importlib.util
import sys

import pytest
import torch
import triton
import triton.language as tl

from replayssm import adapters
from replayssm.adapters import _vllm_source
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

if importlib.util.find_spec("sglang") is None:  # not importorskip: its package __init__ needs the runtime
    pytest.skip("sglang not installed (pip install --no-deps sglang==0.5.23)", allow_module_level=True)


@pytest.fixture(scope="module")
def sglang_kernels():
    ok, line = adapters.load(force=True)["sglang"]
    assert ok, line


def _assert_passes(res):
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])


CASES = [  # family, kernel, mode, scenario arguments
    ("gdn", "sglang-replay", "s32a32-tf32", dict(decode="standard", schedule="always-1", buffer=4, steps=7)),
    ("gdn", "sglang-replay", "s32a32", dict(decode="speculative", schedule="exhaustive", window=2, buffer=2)),
    ("gdn", "sglang-replay-serving", "s32a32-tf32", dict(decode="speculative", schedule="exhaustive", window=2,
                                                         buffer=2)),  # B + T' a power of 2; 17 s at B = 6
    ("gdn", "sglang-replay-serving", "s32a32-tf32", dict(decode="speculative", schedule="zero-accept", window=2,
                                                         buffer=2, steps=6, schedule_params={"zero_prob": 0.3},
                                                         kernel_options={"fold_every_commit": True})),
    ("mamba2", "sglang-baseline", "s32a32", dict(decode="standard", schedule="always-1", buffer=1, steps=4)),
    ("mamba2", "sglang-baseline", "s32a32", dict(decode="speculative", schedule="exhaustive", window=2, buffer=2)),
]


@pytest.mark.parametrize("family,name,mode,kw", CASES, ids=[
    "gdn-sglang-replay-s32a32tf32-L4", "gdn-sglang-replay-s32a32-T2-B2", "gdn-sglang-replay-serving-s32a32tf32-T2-B2",
    "gdn-sglang-replay-serving-fold-every-commit-s32a32tf32-T2-B2", "mamba2-sglang-baseline-s32a32-L1",
    "mamba2-sglang-baseline-s32a32-T2-B2-softplus-finding"])
def test_sglang_kernels_pass_the_engine(sglang_kernels, one_thread, family, name, mode, kw):
    res = run_scenario(Scenario.tiny(family, mode=mode, **kw), name)
    if name == "sglang-baseline" and kw["schedule"] == "exhaustive":
        # The exhaustive schedule's zero-state resets (issue 46) let the kernel's softplus loss
        # (log(exp(x) + 1), docs/findings.md finding 9; tests/adapters/test_findings_softplus.py shows it by
        # intervention) show in the state check; every exact invariant holds: a precision finding.
        assert not res.passed and {f.check for f in res.failures} == {"state"}, res.failures[:3]
        assert "lower effective precision" in res.failures[0].message
        return
    _assert_passes(res)


def test_sglang_refuses_what_it_does_not_implement(sglang_kernels):
    from replayssm.validators.pytest_plugin import assert_kernel_valid
    with pytest.raises(ValueError, match="tf32 on the GPU: standard decode implements s32a32-tf32"):
        assert_kernel_valid("sglang-replay", Scenario.tiny("gdn", decode="standard", mode="s32a32", steps=2))
    with pytest.raises(ValueError, match="B \\+ T' must be a power of two"):
        assert_kernel_valid("sglang-replay", Scenario.tiny("gdn", decode="speculative", mode="s32a32", window=2,
                                                          buffer=3, steps=2))
    with pytest.raises(ValueError, match="plain cast"):
        assert_kernel_valid("sglang-replay", Scenario.tiny("gdn", mode="s16a16-sr", steps=2))
    with pytest.raises(ValueError, match="does not support sfp8a16"):
        assert_kernel_valid("sglang-baseline", Scenario.tiny("mamba2", mode="sfp8a16", steps=2))


def test_sglang_serving_bookkeeping_is_fold_at_commit_and_no_other(sglang_kernels, one_thread):
    """Declared as the spec's rule (same ring, B + T' = 4), the serving path fails the cursor check
    at the first commit that folds; declared fold-every-commit (origin fixed at 0), likewise."""
    from replayssm.registry import get
    base = get("sglang-replay-serving", "gdn")
    sc = Scenario.tiny("gdn", decode="speculative", mode="s32a32-tf32", window=2, buffer=2, schedule="always-1",
                       steps=2)
    for pol in ("spec", "fold-every-commit"):
        res = run_scenario(sc, type("Declared", (base,), {"name": f"serving-as-{pol}", "bookkeeping": pol}),
                           repeat_check=False, stop_on_failure=True)
        assert not res.passed and res.first_failure.check == "cursor", res.to_markdown()


def test_sglang_serving_refuses_what_its_path_does_not_implement(sglang_kernels):
    from replayssm.validators.pytest_plugin import assert_kernel_valid
    spec = dict(decode="speculative", window=2, steps=2)
    for kw, match in [(dict(mode="s32a32", buffer=2), "commit fold's tl.dot runs at Triton's default precision"),
                      (dict(mode="s32a32-tf32", buffer=3), "B \\+ T' must be a power of two"),
                      (dict(mode="s16a16", buffer=6), "fold_every_commit folds after every commit: .* B = T'"),
                      (dict(mode="s16a16-tf32", buffer=2), "checkpoint is cast to the key dtype"),
                      (dict(mode="s16a16", buffer=2), "compiles for the GPU only from 16 rows.*ring of 4 rows"),
                      (dict(mode="s32a16", buffer=6), "compiles for the GPU only from 16 rows.*ring of 8 rows"),
                      (dict(mode="s32a32-tf32", buffer=2, kernel_options={"fold_every_commit": 1}),
                       "options.fold_every_commit: expected a bool")]:
        with pytest.raises(ValueError, match=match):
            assert_kernel_valid("sglang-replay-serving", Scenario.tiny("gdn", **spec, **kw))
    with pytest.raises(ValueError, match="does not support .*standard decode"):
        assert_kernel_valid("sglang-replay-serving", Scenario.tiny("gdn", decode="standard", mode="s32a32-tf32",
                                                                  steps=2))


_SOFTPLUS = None  # the kernel module's jitted softplus, bound by the test (the interpreter resolves globals)


@triton.jit
def _apply_softplus(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, _SOFTPLUS(tl.load(x_ptr + i)))


def test_sglang_mamba2_softplus_loses_precision_for_negative_inputs(sglang_kernels, monkeypatch):
    """``mamba_ssm.softplus`` of SGLang against fp64: hundreds of u of fp32 at x = -7 (921 u measured)."""
    from replayssm.adapters import sglang
    monkeypatch.setattr(sys.modules[__name__], "_SOFTPLUS", sglang.modules()["mamba_ssm"].softplus)
    x = torch.tensor([-7.0, -5.0, -3.0, 0.0, 3.0, 25.0, 0.0, 0.0], dtype=torch.float32)
    y = torch.empty_like(x)
    with _vllm_source.launch_guard(x.device):
        _apply_softplus[(1,)](x, y, N=8)
    rel_u = ((y.double() - torch.nn.functional.softplus(x.double())).abs()
             / torch.nn.functional.softplus(x.double()) / 2.0**-24)[:5]
    assert rel_u[0] > 100, rel_u
    assert rel_u[3:].max() < 2, rel_u
