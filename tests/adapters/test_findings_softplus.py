"""The CPU adapter fuzz's findings on the Mamba-2 kernels written elsewhere (2026-12-01,
docs/findings.md "The adapters fuzzed on CPU"), replayed from their shrunk reproducers
(``tests/fixtures/findings/``) with the root cause shown by intervention.

Oracle: the validation engine (fp64 recurrence, the literal model at the same mode, the fp64
running-error bound), and a counterfactual: the same kernel, the same scenario, with only its
``softplus`` (``log(exp(x) + 1)`` in vLLM's fork, SGLang 0.5.23 and mamba_ssm 2.3.2.post1 under
Triton 3) replaced by an accurate one.  Expected: every reproducer fails at its recorded check with
the kernels' own softplus and passes with the accurate one, so the verdict is the softplus's
precision loss (Δ at tens to hundreds of fp32 u when dt + dt_bias < -3) and nothing else; a
correct implementation (the literal model) passes the same runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
import triton
import triton.language as tl

from replayssm import adapters
from replayssm.adapters import _vllm_source, mamba_ssm
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import literal_twin_name, run_scenario

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "findings"
PEERS = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers"
# the external modules whose Triton kernels call a module-level ``softplus`` (the interpreter resolves
# a kernel's globals when it runs, so replacing the module attribute replaces the function it calls)
SOFTPLUS_MODULES = ("vllm.model_executor.layers.mamba.ops", "sglang.kernels.ops.mamba", "mamba_ssm.ops")
CASES = [  # reproducer, kernel, the check it fails at, source
    ("mamba2-vllm-replay", "vllm-replay", "flush-checkpoint", "vllm"),
    ("mamba2-vllm-replay-state", "vllm-replay-state", "flush-increment", "vllm"),
    ("mamba2-vllm-baseline", "vllm-baseline", "state", "vllm"),
    ("mamba2-sglang-baseline", "sglang-baseline", "state", "sglang"),
    ("mamba2-mamba-ssm-baseline", "mamba-ssm-baseline", "state", "mamba_ssm"),
]


@triton.jit
def _accurate_softplus(dt):
    e = tl.exp(dt)
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))  # log1p(e) to a few ulps (Goldberg)
    return tl.where(dt <= 20.0, lp, dt)


@pytest.fixture(scope="module")
def loaded():
    env = {_vllm_source.ENV: PEERS / "vllm-replayssm", mamba_ssm.ENV: PEERS / "mamba_ssm-2.3.2.post1"}
    saved = {k: os.environ.get(k) for k in env}
    for k, path in env.items():
        if saved[k] is None and path.is_dir():
            os.environ[k] = str(path)
    try:
        return adapters.load(force=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def _softplus_modules() -> list:
    return [m for name, m in list(sys.modules.items())
            if name.startswith(SOFTPLUS_MODULES) and isinstance(getattr(m, "softplus", None), type(_accurate_softplus))]


@pytest.mark.parametrize("stem,kernel,check,source", CASES, ids=[c[0] for c in CASES])
def test_fuzz_finding_is_the_softplus(loaded, one_thread, monkeypatch, stem, kernel, check, source):
    ok, line = loaded[source]
    if not ok:
        pytest.skip(line)
    sc = Scenario.from_json((FIXTURES / f"{stem}.json").read_text())
    assert json.loads((FIXTURES / f"{stem}.json").read_text())["failure"]["kernel"] == kernel
    res = run_scenario(sc, kernel, repeat_check=False)
    assert not res.passed and res.exception is None, res.headline()
    assert res.failures[0].check == check, res.headline()
    assert run_scenario(sc, literal_twin_name(get(kernel, "mamba2"), sc)).passed  # a correct implementation
    mods = _softplus_modules()
    assert mods, f"no loaded module of {SOFTPLUS_MODULES} defines a jitted softplus"
    for m in mods:
        monkeypatch.setattr(m, "softplus", _accurate_softplus)
    fixed = run_scenario(sc, kernel, repeat_check=False)
    assert fixed.passed, fixed.headline()
