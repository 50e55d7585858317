"""The conv adapters of the mixer level on CPU: ``mixer-causal-conv1d`` (Dao-AILab causal-conv1d 1.7.0's
``causal_conv1d_update_ref``, the ``circular`` design) and ``mixer-sglang-conv`` (SGLang 0.5.23's Triton
``causal_conv1d_update`` with ``intermediate_conv_window``, the ``draft-snapshots`` design, under the
Triton interpreter), each composed with the family's literal ReplaySSM.

Oracle: the mixer runner (fp64 whole step, the tolerance rule against the literal mixer, the committed
conv window bit for bit read by the declared design).  Expected: both pass at tiny geometry; the same
adapter with its rollback dropped (a conv mutant wrapped around it) fails ``conv-state``.  Sources:
``REPLAYSSM_CAUSAL_CONV1D_SRC`` (or the sdist .ci/run unpacks under ``$TMPDIR/replayssm-ci-causal_conv1d``);
``pip install --no-deps sglang==0.5.23``.  Each test skips with its source's one-line reason.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import json  # noqa: E402
import pathlib  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from replayssm.adapters import causal_conv1d as cc  # noqa: E402
from replayssm.adapters import sglang_conv as sc  # noqa: E402
from replayssm.adapters._vllm_source import launch_guard  # noqa: E402
from replayssm.cli import main  # noqa: E402
from replayssm.mixer.kernel import mixer_kernels  # noqa: E402
from replayssm.mixer.spec import mixer_preset  # noqa: E402
from replayssm.validators.engine.mixer.runner import default_plan, validate_mixer  # noqa: E402

CI_TREE = pathlib.Path(tempfile.gettempdir(), "replayssm-ci-causal_conv1d", f"causal_conv1d-{cc.VERSION}")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="module")
def causal_conv1d_src():
    saved = os.environ.get(cc.ENV)
    if saved is None and CI_TREE.is_dir():
        os.environ[cc.ENV] = str(CI_TREE)
    reason = cc.CausalConv1dMixer.source_reason()
    if reason:
        pytest.skip(reason)
    yield
    if saved is None:
        os.environ.pop(cc.ENV, None)


@pytest.fixture(scope="module")
def sglang_conv():
    reason = sc.SGLangConvMixer.source_reason()
    if reason:
        pytest.skip(reason)


class CausalConv1dNoRollback(cc.CausalConv1dStore):
    """The ring's cursor advanced by every verified input, the rejected ones included (vLLM #50272's bug)."""

    def commit_slot(self, slot, k):
        super().commit_slot(slot, self.T)


class SGLangNoRollback(sc.SGLangConvStore):
    """No copy of snapshot k - 1 at commit: the window stays as the kernel's verify left it (all T' inputs)."""

    def commit_slot(self, slot, k):
        pass


def wrapped(adapter, store):
    return type(f"{adapter.__name__}NoRollback", (adapter,), {"name": f"mutant-{adapter.name}-no-rollback",
                                                               "store": store})


@pytest.mark.parametrize("fam,mode", [("mamba2", "s32a16"), ("gdn", "s32a16"), ("kda", "s16a16"), ("gdn", "s32a32"),
                                      ("gdn", "s64a64")],
                         ids=["mamba2-causal-conv1d-s32a16", "gdn-causal-conv1d-s32a16", "kda-causal-conv1d-s16a16",
                              "gdn-causal-conv1d-s32a32", "gdn-causal-conv1d-s64a64"])
def test_causal_conv1d_adapter_passes(causal_conv1d_src, fam, mode):
    """s64a64: the weights go to the reference in the compute dtype (the fuzzer's reproducer of a cast to fp32)."""
    res = validate_mixer("mixer-causal-conv1d", mixer_preset("tiny", fam), mode, default_plan(4, steps=8))
    assert res.passed, res.verdict()
    assert res.conv_policy == "circular"


def test_causal_conv1d_without_rollback_fails(causal_conv1d_src):
    cls = wrapped(cc.CausalConv1dMixer, CausalConv1dNoRollback)
    res = validate_mixer(cls, mixer_preset("tiny", "mamba2"), "s32a16", default_plan(4, steps=8))
    assert not res.passed
    assert "conv-state" in {f.check for f in res.failures}, res.verdict()


def test_causal_conv1d_source_missing_is_one_line(monkeypatch):
    monkeypatch.setattr(cc, "_LOADED", {})
    monkeypatch.setenv(cc.ENV, "/nonexistent/causal-conv1d")
    reason = cc.CausalConv1dMixer.source_reason()
    assert reason and "\n" not in reason and "pip download" in reason and cc.ENV in reason
    with pytest.raises(ValueError, match="causal-conv1d"):
        validate_mixer("mixer-causal-conv1d", mixer_preset("tiny", "gdn"), "s32a16", default_plan(4, steps=1))


@pytest.mark.parametrize("fam,mode", [("mamba2", "s32a32"), ("gdn", "s32afp16")],
                         ids=["mamba2-sglang-conv-s32a32", "gdn-sglang-conv-s32afp16"])
def test_sglang_conv_adapter_passes(sglang_conv, fam, mode):
    res = validate_mixer("mixer-sglang-conv", mixer_preset("tiny", fam), mode, default_plan(4, steps=6))
    assert res.passed, res.verdict()
    assert res.conv_policy == "draft-snapshots"


def test_sglang_conv_without_rollback_fails(sglang_conv):
    cls = wrapped(sc.SGLangConvMixer, SGLangNoRollback)
    res = validate_mixer(cls, mixer_preset("tiny", "gdn"), "s32a32", default_plan(4, steps=6))
    assert not res.passed
    assert "conv-state" in {f.check for f in res.failures}, res.verdict()


@pytest.mark.skipif(not INTERPRETED, reason="the Triton interpreter's bf16 store (a GPU runs bf16)")
def test_sglang_conv_bf16_refused_under_interpreter_its_store_truncates(sglang_conv):
    """The refusal's measured reason: the interpreter stores SGLang's fp32 conv outputs into bf16 by
    truncation (every output equals the round-toward-zero value; round-to-nearest differs on about half)."""
    with pytest.raises(ValueError, match="bf16 activations under the Triton interpreter"):
        validate_mixer("mixer-sglang-conv", mixer_preset("tiny", "gdn"), "s32a16", default_plan(4, steps=1))
    gen = torch.Generator().manual_seed(0)
    C, W, T = 64, 3, 5
    x = torch.randn(2, C, T, generator=gen).to(torch.bfloat16)
    state = torch.randn(2, C, W, generator=gen).to(torch.bfloat16)
    w = ((torch.rand(C, W + 1, generator=gen) * 2 - 1) / 2).to(torch.bfloat16).float()
    b = (torch.rand(C, generator=gen) - 0.5).to(torch.bfloat16).float()
    snaps, idx = torch.zeros(2, T, C, W, dtype=torch.bfloat16), torch.tensor([0, 1], dtype=torch.int32)
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(torch.cat([state.float(), x.float()], -1),
                                                              w[:, None, :], b, groups=C)[..., -T:])
    with launch_guard(torch.device("cpu")):
        got = sc.conv_module().causal_conv1d_update(x, state.clone(), w, b, activation="silu", conv_state_indices=idx,
                                                    intermediate_conv_window=snaps, intermediate_state_indices=idx)
    toward_zero = (ref.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert torch.equal(got, toward_zero)
    assert (got != ref.to(torch.bfloat16)).float().mean() > 0.25


def test_adapters_listed_with_their_availability(capsys):
    """``replayssm list mixer``: every conv adapter, available or with its one line saying how to get it."""
    assert {"mixer-causal-conv1d", "mixer-sglang-conv", "mixer-vllm-conv"} <= set(mixer_kernels())
    assert main(["list", "mixer", "--json"]) == 0
    got = {k["name"]: k for k in json.loads(capsys.readouterr().out)["mixer"]}
    for name in ("mixer-causal-conv1d", "mixer-sglang-conv", "mixer-vllm-conv"):
        k = got[name]
        assert k["ssm_kernel"] == "literal-replay" and "\n" not in k["status"]
        assert k["available"] == (mixer_kernels()[name].source_reason() is None)
    assert got["mixer-causal-conv1d"]["conv_policy"] == "circular"
    assert got["mixer-sglang-conv"]["conv_policy"] == "draft-snapshots"
