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
every ring phase, the Mamba-2 baseline in both decodes.  Skipped without
``pip install --no-deps sglang==0.5.23``.
"""

import importlib.util

import pytest

from replayssm import adapters
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.runner import run_scenario

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
    ("mamba2", "sglang-baseline", "s32a32", dict(decode="standard", schedule="always-1", buffer=1, steps=4)),
    ("mamba2", "sglang-baseline", "s32a32", dict(decode="speculative", schedule="exhaustive", window=2, buffer=2)),
]


@pytest.mark.parametrize("family,name,mode,kw", CASES, ids=[
    "gdn-sglang-replay-s32a32tf32-L4", "gdn-sglang-replay-s32a32-T2-B2", "mamba2-sglang-baseline-s32a32-L1",
    "mamba2-sglang-baseline-s32a32-T2-B2"])
def test_sglang_kernels_pass_the_engine(sglang_kernels, one_thread, family, name, mode, kw):
    _assert_passes(run_scenario(Scenario.tiny(family, mode=mode, **kw), name))


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
