"""SGLang 0.5.23's ReplaySSM GDN commit fold (replayssm/adapters/sglang.py), on CPU under the
interpreter: its docstring's claim, tested bit for bit.

Claim (``gdn_replayssm_spec_fold.py``): the fold "is a BITWISE CLONE of
fused_sigmoid_gating_delta_rule_update_kernel's GDN branch (same tile, division-form L2 norm, op
order)".  Oracle: the fused kernel itself, run over the same tokens with its ReplaySSM ring-write
on; the fold replays that ring (raw k, raw v, the kernel's own g and beta) from the same checkpoint.

Expected (measured, the documented verdict): NOT bitwise.  The fused kernel normalises k as
``b_k *= 1.0 / tl.sqrt(sum + 1e-6)`` (reciprocal-multiply, fused_sigmoid_gating_recurrent.py) while
the fold divides, ``b_k / tl.sqrt(sum + 1e-6)``; the two differ by an ulp for about a third of the
k vectors, so about a third of the state elements differ by ~1 ulp after 4 tokens (everything else
in the two update orders matches).  The states agree to fp32 rounding: the fold is a correct fold,
not a bitwise clone, so a bit-identity test of verify-then-fold against the fused update fails.
The speculative decode's flush (``gdn_replayssm_exact_fold_kernel``) makes the same claim and
uses the same division form: the same elements differ (178 / 512 and 214 / 512, at most 1.6 u of
fp32 relative to the row maximum, measured 2026-12-01).
Skipped without ``pip install --no-deps sglang==0.5.23``.
"""

import importlib.util

import pytest
import torch

from replayssm import adapters
from replayssm.adapters._vllm_source import launch_guard

if importlib.util.find_spec("sglang") is None:  # not importorskip: its package __init__ needs the runtime
    pytest.skip("sglang not installed (pip install --no-deps sglang==0.5.23)", allow_module_level=True)


@pytest.fixture(scope="module")
def sglang_modules():
    ok, line = adapters.load(force=True)["sglang"]
    if not ok:
        pytest.skip(line)
    from replayssm.adapters import sglang
    return sglang.modules()


N, T, H, HV, K, V, L, S = 2, 4, 2, 4, 16, 8, 8, 3


def _fused_run(fsg):
    """SGLang's fused sigmoid-gating GDN update over T tokens of two slots (2 and 0), with its
    ReplaySSM ring-write on: (inputs, h0, the fused kernel's states, its ring, slots)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(N, T, H, K, generator=g), torch.randn(N, T, H, K, generator=g)
    v = torch.randn(N, T, HV, V, generator=g)
    a, b = torch.randn(N, T, HV, generator=g), torch.randn(N, T, HV, generator=g)
    A_log, dt_bias = 0.5 * torch.randn(HV, generator=g), torch.randn(HV, generator=g)
    h0 = torch.randn(S, HV, V, K, generator=g)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    fused = h0.clone()
    ring = {"rawv": torch.zeros(S, HV, L, V), "rawk": torch.zeros(S, H, L, K), "g": torch.zeros(S, HV, L),
            "beta": torch.zeros(S, HV, L)}
    with launch_guard(q.device):
        fsg.fused_sigmoid_gating_delta_rule_update(
            A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, fused, slots, use_qk_l2norm_in_kernel=True, cache_ring=True,
            replayssm_rawv=ring["rawv"], replayssm_rawk=ring["rawk"], replayssm_g=ring["g"],
            replayssm_beta=ring["beta"])
    inputs = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    return inputs, h0, fused, ring, slots


def _assert_fp32_close_not_bitwise(got, want):
    assert torch.allclose(got, want, rtol=0, atol=4 * 2.0**-24 * float(want.abs().max()))
    differ = (got != want).float().mean()
    assert differ > 0.05, "the fold now matches bit for bit: the claim holds, update the docstring"


def test_fold_is_not_a_bitwise_clone_of_the_fused_update(sglang_modules, one_thread):
    from replayssm.adapters.sglang import interpreter_loops
    fsg, fold = sglang_modules["fused_sigmoid_gating_recurrent"], sglang_modules["gdn_replayssm_spec_fold"]
    inputs, h0, fused, ring, slots = _fused_run(fsg)
    k = inputs["k"]
    folded = h0.clone()
    with launch_guard(h0.device), interpreter_loops(fold):
        fold.commit_gdn_replayssm_fold_all_layers(
            folded[None], ring["rawv"][None], ring["rawk"][None], ring["g"][None], ring["beta"][None], slots,
            torch.full((N,), T, dtype=torch.int32), L, H, use_qk_l2norm_in_kernel=True)
    assert torch.equal(fused[1], h0[1]) and torch.equal(folded[1], h0[1])  # the slot not named: untouched
    _assert_fp32_close_not_bitwise(folded[slots.long()], fused[slots.long()])
    # the cause: reciprocal-multiply vs division of the same k by its norm
    kk = k.flatten(0, 2)
    nrm = torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
    assert bool(((kk * (1.0 / nrm)) != (kk / nrm)).any())


def test_spec_decode_exact_fold_is_not_a_bitwise_clone_either(sglang_modules, one_thread):
    """``gdn_replayssm_spec_decode``'s flush (``gdn_replayssm_exact_fold_kernel``, "BITWISE CLONE of
    fused_sigmoid_gating_delta_rule_update_kernel's state recurrence") replaying the same ring into
    the same checkpoint: it uses the same division-form norm as the fold above, so the same ~1-ulp
    differences (measured: not bitwise, equal to fp32 rounding)."""
    fsg, spec = sglang_modules["fused_sigmoid_gating_recurrent"], sglang_modules["gdn_replayssm_spec_decode"]
    inputs, h0, fused, ring, slots = _fused_run(fsg)
    state = h0.clone()
    flat = {n: inputs[n].flatten(0, 1).contiguous() for n in ("q", "k", "v", "a", "b")}
    cursors = dict(write_pos=torch.full((S,), T, dtype=torch.int32), cache_base=torch.zeros(S, dtype=torch.int32),
                   is_flush=torch.ones(S, dtype=torch.int8))
    with launch_guard(state.device):
        spec.gdn_replayssm_spec_decode(
            flat["q"], flat["k"], flat["v"], flat["a"], flat["b"], inputs["A_log"], inputs["dt_bias"], state,
            torch.zeros(S, HV, L, V), torch.zeros(S, H, L, K), ring["g"].clone(), ring["rawv"], ring["rawk"],
            ring["beta"], torch.zeros(N * T, HV, V), torch.tensor([0, T, 2 * T], dtype=torch.int32), slots, slots,
            max_cache_len=L, max_spec_len=T, use_qk_l2norm_in_kernel=True, null_block_id=-1, nk=1, nk_flush=1,
            launch_mode="flush", dot_precision="ieee", **cursors)
    assert torch.equal(state[1], h0[1])  # the slot not named: untouched
    _assert_fp32_close_not_bitwise(state[slots.long()], fused[slots.long()])
