"""The external KDA kernels through the engine, on CPU under the interpreter: FLA's fused recurrent
KDA (``fla-baseline``, replayssm/adapters/fla.py) and SGLang 0.5.23's KDA ReplaySSM kernels
(``sglang-replay`` standard, ``sglang-replay-fold`` speculative fold-every-commit,
replayssm/adapters/sglang_kda.py).

Oracle: the validation engine (fp64 KDA recurrence on the accepted stream, the literal model of the
kernel's kind and bookkeeping at the same mode for the tolerance rule, exact invariants: padding
rows and canary slots untouched, every output written, checkpoint bit-identical over a non-flush
verify, committed ring rows kept, cursors by the declared policy, bit-identical repeat).
fp32-activation modes only (bf16 ``tl.dot`` is wrong under the interpreter; the GPU tests in
tests/adapters/test_adapters_gpu.py run the 16-bit ones).  Each source skips cleanly when not installed.
Expected (measured, tiny geometry): every case passes.
"""

import importlib.util

import pytest

from replayssm import adapters
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.pytest_plugin import assert_kernel_valid

HAVE = {"fla": importlib.util.find_spec("fla") is not None, "sglang": importlib.util.find_spec("sglang") is not None}
HOW = {"fla": "pip install 'replayssm[adapters]'", "sglang": "pip install --no-deps sglang==0.5.23"}
CASES = [  # source, kernel, mode, scenario arguments
    ("fla", "fla-baseline", "s32a32", dict(decode="standard", schedule="always-1", buffer=1, steps=3)),
    ("fla", "fla-baseline", "s32a32", dict(decode="speculative", schedule="exhaustive", window=2, buffer=2)),
    ("sglang", "sglang-replay", "s32a32-tf32", dict(decode="standard", schedule="always-1", buffer=4, steps=6)),
    ("sglang", "sglang-replay-fold", "s32a32", dict(decode="speculative", schedule="exhaustive", window=2, buffer=2)),
]


def _loaded(source):
    if not HAVE[source]:
        pytest.skip(f"{source} not installed ({HOW[source]})")
    ok, line = adapters.load(force=True)[source]
    assert ok, line


@pytest.mark.parametrize("source,name,mode,kw", CASES, ids=[
    "kda-fla-baseline-s32a32-L1", "kda-fla-baseline-s32a32-T2-B2", "kda-sglang-replay-s32a32tf32-L4",
    "kda-sglang-replay-fold-s32a32-T2"])
def test_external_kda_kernels_pass_the_engine(one_thread, source, name, mode, kw):
    _loaded(source)
    res = run_scenario(Scenario.tiny("kda", mode=mode, **kw), name)
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])
    # judged against the recurrence it declares (sglang-replay: beta rounded, reciprocal L2 norm)
    assert res.conventions.endswith("(declared)") == (name == "sglang-replay"), res.conventions


def test_fla_kda_refuses_what_it_does_not_implement():
    _loaded("fla")
    with pytest.raises(ValueError, match="does not support sfp8a16"):
        assert_kernel_valid("fla-baseline", Scenario.tiny("kda", mode="sfp8a16", steps=2))


def test_sglang_kda_refuses_what_it_does_not_implement():
    _loaded("sglang")
    for name, kw, why in [
        ("sglang-replay", dict(decode="speculative", mode="s32a32", window=2, buffer=2), "it is the kernel "
                                                                                        "'sglang-replay-fold'"),
        ("sglang-replay", dict(decode="standard", mode="s32a32"), "standard decode implements s32a32-tf32"),
        ("sglang-replay", dict(decode="standard", mode="s32a16-tf32"), "16-bit operands .exact products.: ieee"),
        ("sglang-replay-fold", dict(decode="standard", mode="s32a32"), "it is the kernel 'sglang-replay'"),
        ("sglang-replay-fold", dict(decode="speculative", mode="s32a32-tf32", window=2, buffer=2), "ieee"),
        ("sglang-replay-fold", dict(decode="speculative", mode="s16a16-sr", window=2, buffer=2), "plain cast"),
    ]:
        with pytest.raises(ValueError, match=why):
            assert_kernel_valid(name, Scenario.tiny("kda", steps=2, **kw))
