"""The FLA adapter (replayssm/adapters/fla.py: ``fla-baseline``, GDN) through the engine, on CPU
under the interpreter.

Oracle: the validation engine against ``literal-baseline`` (fp64 gated delta rule on the accepted
stream, the literal baseline at the same mode, exact invariants on padding rows, canary slots,
outputs written, bit-identical repeat).  Skipped without ``fla-core`` (``pip install
'replayssm[adapters]'``).  Expected: both decodes pass at s32a32.
"""

import pytest

from replayssm import adapters
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

pytest.importorskip("fla", reason="flash-linear-attention not installed (pip install 'replayssm[adapters]')")


@pytest.fixture(scope="module")
def fla_kernels():
    ok, line = adapters.load(force=True)["fla"]
    assert ok, line


@pytest.mark.parametrize("decode", ["standard", "speculative"], ids=["gdn-fla-baseline-s32a32-L1",
                                                                     "gdn-fla-baseline-s32a32-T2-B2"])
def test_fla_baseline(fla_kernels, one_thread, decode):
    kw = (dict(schedule="always-1", buffer=1, steps=4) if decode == "standard"
          else dict(schedule="exhaustive", window=2, buffer=2))
    res = run_scenario(Scenario.tiny("gdn", decode=decode, mode="s32a32", **kw), "fla-baseline")
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])


def test_fla_refuses_what_it_does_not_implement(fla_kernels):
    from replayssm.validators.pytest_plugin import assert_kernel_valid
    with pytest.raises(ValueError, match="does not support sfp8a16"):
        assert_kernel_valid("fla-baseline", Scenario.tiny("gdn", mode="sfp8a16", steps=2))
