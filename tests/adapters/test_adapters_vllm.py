"""The vLLM adapters (replayssm/adapters/vllm*.py) through the engine, on CPU under the interpreter.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal model at the
same precision mode for the tolerance rule, exact invariants: checkpoint bit-identical over a
non-flush verify, padding rows and unused slots untouched, every output written, committed ring
rows kept, cursors by the spec rule, bit-identical repeat).  The kernels are loaded unchanged from
``../shared/peers/vllm-replayssm`` (skipped without it).  fp32-activation modes only: bf16
``tl.dot`` is wrong under the interpreter (spec 9); the GPU runs the rest.

Expected: every GDN kernel and the standard-decode Mamba-2 kernels pass short runs.  The vLLM
Mamba-2 kernels compute softplus as ``log(exp(x) + 1)`` (``mamba_ssm.softplus``, used by all of
them); for x = dt + dt_bias < -3 (the ``mild`` regime public tests use) that loses 10-900 u of
relative precision in Δ (measured by ``test_vllm_softplus_loses_precision_for_negative_inputs``),
and at s32a32 their states drift 10-17 u from fp64 where the literal model (log1p) stays within
~2 u.  Against the literal model's rule alone that was up to 1.6x the bound; the tolerance bound
now also takes the fp64 running-error bound of the arithmetic (issue 15, so that correct kernels
with other operation orders pass), and these runs pass within it (docs/findings.md, item 5): the
precision loss is established by the direct softplus test.
"""

import os
import pathlib
import sys

import pytest
import torch
import triton
import triton.language as tl

from replayssm import adapters
from replayssm.adapters import _vllm_source
from replayssm.cli import main
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.fuzz.run import drawable_modes

PEERS = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "vllm-replayssm"


@pytest.fixture(scope="module")
def vllm_kernels():
    """Load the vllm adapters from the peers' source tree (once per module)."""
    if not PEERS.is_dir():
        pytest.skip(f"no vLLM ReplaySSM source tree at {PEERS} (../shared/peers beside the checkout)")
    saved = os.environ.get(_vllm_source.ENV)
    os.environ[_vllm_source.ENV] = str(PEERS)
    try:
        status = adapters.load(force=True)
    finally:
        if saved is None:
            os.environ.pop(_vllm_source.ENV)
        else:
            os.environ[_vllm_source.ENV] = saved
    ok, line = status["vllm"]
    assert ok, line
    return _vllm_source.load()


def _spec(family, mode, T, B, **kw):
    return Scenario.tiny(family, decode="speculative", mode=mode, schedule="exhaustive", window=T, buffer=B, **kw)


def _std(family, mode, L, steps):
    return Scenario.tiny(family, decode="standard", mode=mode, schedule="always-1", buffer=L, steps=steps)


def _assert_passes(res):
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])


@pytest.mark.parametrize("family,name,mode,L,steps", [
    ("mamba2", "vllm-replay", "s32a32", 4, 7),
    ("mamba2", "vllm-replay-state", "s32a32", 4, 7),
    ("mamba2", "vllm-baseline", "s32a32", 1, 4),
    ("gdn", "vllm-replay", "s32a32-tf32", 4, 7),
    ("gdn", "vllm-baseline", "s32a32", 1, 4),
], ids=["mamba2-vllm-replay-s32a32-L4", "mamba2-vllm-replay-state-s32a32-L4", "mamba2-vllm-baseline-s32a32-L1",
        "gdn-vllm-replay-s32a32tf32-L4", "gdn-vllm-baseline-s32a32-L1"])
def test_standard_decode(vllm_kernels, one_thread, family, name, mode, L, steps):
    """Flush cycles (L = 4: three appends and a flush, twice) with a padding row and canary slots."""
    _assert_passes(run_scenario(_std(family, mode, L, steps), name, repeat_check=L > 1))


@pytest.mark.parametrize("name", ["vllm-replay", "vllm-baseline"], ids=lambda n: f"gdn-{n}-T2-B2")
def test_gdn_speculative_exhaustive(vllm_kernels, one_thread, name):
    """Every k at every ring phase (T' = 2, B = 2: ring 4), origins 5 and 12 mod 4, a padding row."""
    mode = "s32a32-tf32" if name == "vllm-replay" else "s32a32"
    _assert_passes(run_scenario(_spec("gdn", mode, 2, 2), name, repeat_check=name == "vllm-replay"))


@pytest.mark.parametrize("name", ["vllm-replay", "vllm-baseline"], ids=lambda n: f"mamba2-{n}-s32a32-T3-B4")
def test_mamba2_speculative_exhaustive_verdict(vllm_kernels, one_thread, name):
    """The documented verdict (docs/findings.md, item 5): every exact invariant holds (the bridges are
    right), and the fork's softplus error (9-17 u of fp32 in the states) lies inside the tolerance
    bound since it takes the fp64 running-error bound of the arithmetic as well (issue 15): the
    end-to-end verdict passes at tiny s32a32, and the accuracy loss itself is established by the
    direct softplus test below.  The speculative replay keeps raw dt records, so flush-increment
    (which re-folds a kernel's own Δ records) says it cannot judge them."""
    res = run_scenario(_spec("mamba2", "s32a32", 3, 4), name, repeat_check=False)
    if name == "vllm-baseline":
        # Since the exhaustive schedule resets through reset(initial_state=None) (zero states, issue 46),
        # the baseline's softplus loss (finding 5: tens of u of fp32) shows in the state check here too;
        # every exact invariant still holds: a precision finding, not a bookkeeping one.
        assert not res.passed and {f.check for f in res.failures} == {"state"}, res.failures[:3]
        assert "lower effective precision" in res.failures[0].message
        return
    assert res.passed, [(f.step, f.check, f.message) for f in res.failures[:3]]
    assert res.summary["worst state_bound_ratio"] < 0.5
    if name == "vllm-replay":
        assert any("flush-increment" in n and "not judged" in n for n in res.notes), res.notes


_FORK_SOFTPLUS = None  # the fork's jitted softplus, bound by the test (the interpreter resolves globals)


@triton.jit
def _apply_fork_softplus(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, _FORK_SOFTPLUS(tl.load(x_ptr + i)))


def test_vllm_softplus_loses_precision_for_negative_inputs(vllm_kernels, monkeypatch):
    """The root cause: the fork's ``softplus`` (log(exp(x) + 1)) against fp64, through a tiny
    Triton kernel that calls it.  Expected relative error at x = -7: hundreds of u (fp32 u = 2^-24)."""
    monkeypatch.setattr(sys.modules[__name__], "_FORK_SOFTPLUS", vllm_kernels["mamba_ssm"].softplus)
    x = torch.tensor([-7.0, -5.0, -3.0, 0.0, 3.0, 25.0, 0.0, 0.0], dtype=torch.float32)
    y = torch.empty_like(x)
    with _vllm_source.launch_guard(x.device):
        _apply_fork_softplus[(1,)](x, y, N=8)
    ref = torch.nn.functional.softplus(x.double())
    rel_u = ((y.double() - ref).abs() / ref / 2.0**-24)[:6]
    assert rel_u[0] > 100, rel_u  # x = -7
    assert rel_u[3:].max() < 2, rel_u  # x >= 0: accurate


def test_refuses_modes_the_kernels_do_not_implement(vllm_kernels):
    from replayssm.validators.pytest_plugin import assert_kernel_valid
    with pytest.raises(ValueError, match="tf32 on the GPU: it implements s32a32-tf32"):
        assert_kernel_valid("vllm-replay", Scenario.tiny("gdn", decode="standard", mode="s32a32", steps=2))
    with pytest.raises(ValueError, match="plain cast"):
        assert_kernel_valid("vllm-baseline", Scenario.tiny("mamba2", decode="standard", mode="s16a16-sr", steps=2))
    with pytest.raises(ValueError, match="standard decode only"):
        assert_kernel_valid("vllm-replay-state", Scenario.tiny("mamba2", mode="s32a32", steps=2))


def test_a_wrong_source_path_is_one_line(tmp_path, capsys):
    """A wrong --vllm-src names what was looked for; nothing runs, no traceback."""
    with pytest.raises(_vllm_source.SourceUnavailable, match="no such folder") as e:
        _vllm_source.find_tree(str(tmp_path / "missing"))
    assert "\n" not in str(e.value)
    (tmp_path / "vllm").mkdir()
    with pytest.raises(_vllm_source.SourceUnavailable, match="kernel file.s. missing, first vllm/model_executor"):
        _vllm_source.find_tree(str(tmp_path))
    saved = os.environ.get(_vllm_source.ENV)
    try:
        assert main(["list", "adapters", "--vllm-src", str(tmp_path / "missing")]) == 0
    finally:
        if saved is None:
            os.environ.pop(_vllm_source.ENV, None)
        else:
            os.environ[_vllm_source.ENV] = saved
        adapters.load(force=True)
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.strip().startswith("vllm"))
    assert "unavailable" in line and "--vllm-src" in line and str(tmp_path / "missing") in line


def test_shape_limits_found_by_the_fuzzer(vllm_kernels, one_thread, monkeypatch):
    """Two findings of the CPU adapter fuzz (2026-12-01, docs/findings.md): a head dimension of 1
    (the per-head A, dt_bias, D views must have stride 0 there too) runs; the GDN replay kernels'
    own limit K >= 9 (next_pow2(K) >= 16 for tl.dot) is declared, so a smaller K is refused before
    anything runs instead of failing as an exception.  And one of the GPU adapter fuzz (2026-12-04):
    the Mamba-2 speculative kernel's dstate contraction does not compile below dstate 9 (tl.dot's
    K >= 16 for 16-bit operands): refused where Triton compiles, in speculative decode only; the
    interpreter (here) runs it."""
    p1 = {"family": "mamba2", "nheads": 1, "headdim": 1, "dstate": 2, "ngroups": 1, "has_z": False}
    sc = Scenario.build("mamba2", decode="speculative", geometry=p1, mode="s32a32", window=2, buffer=2,
                        schedule="exhaustive")
    _assert_passes(run_scenario(sc, "vllm-replay", repeat_check=False))
    cls, d2 = get("vllm-replay", "mamba2"), sc.geometry_obj
    spec, std = sc.decode_config, Scenario.build("mamba2", decode="standard", geometry=p1).decode_config
    assert cls.unsupported_geometry(d2, decode=spec) is None  # the interpreter: no compiler limit
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "dstate >= 9, got 2" in cls.unsupported_geometry(d2, decode=spec)
    assert cls.unsupported_geometry(d2, decode=std) is None
    k4 = {"family": "gdn", "num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 4, "head_v_dim": 4}
    with pytest.raises(ValueError, match="K >= 9, got K = 4"):
        run_scenario(Scenario.build("gdn", decode="standard", geometry=k4, mode="s32a32-tf32", steps=2), "vllm-replay")


def test_a_bf16_state_is_refused_under_the_interpreter(vllm_kernels, one_thread):
    """Under the interpreter Triton's fp32 -> bf16 casts truncate (spec section 9): a kernel written
    elsewhere storing a bf16 state accumulates round-toward-zero errors the GPU does not make (the
    CPU fuzz failed vLLM's Mamba-2 baseline at 5.3 u of bf16 after 5 stores so, 2026-12-01).  The
    engine refuses that mode on the CPU, and the fuzzer does not draw it (nor bf16 activations)."""
    sc = Scenario.tiny("mamba2", decode="standard", mode="s16a32", schedule="always-1", buffer=1, steps=2)
    with pytest.raises(ValueError, match="cannot be judged at s16a32 on the CPU: the Triton interpreter"):
        run_scenario(sc, "vllm-baseline")
    cls = get("vllm-baseline", "mamba2")
    assert drawable_modes(cls, "cpu", ("s32a32", "s16a32", "s32a16", "sfp16a32")) == ("s32a32", "sfp16a32")
    assert drawable_modes(cls, "cuda", ("s32a32", "s16a32")) == ("s32a32", "s16a32")
    assert drawable_modes(get("triton-baseline", "mamba2"), "cpu", ("s16a32",)) == ("s16a32",)  # ours round
