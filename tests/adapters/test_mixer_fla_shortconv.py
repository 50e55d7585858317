"""The FLA conv adapter of the mixer level: ``mixer-fla-shortconv`` (flash-linear-attention 0.6.0's
``ShortConvolution`` step, its Triton ``causal_conv1d_update``, with draft snapshots kept by the adapter: the
``draft-snapshots`` design), composed with the family's literal ReplaySSM; on a CPU under the Triton
interpreter.

Oracle: the mixer runner (fp64 whole step, the tolerance rule against the literal mixer, the committed conv
window bit for bit read by the declared design).  Expected: it passes at tiny geometry on mamba2, gdn and kda;
with its rollback dropped (the commit keeps FLA's cache after every verified input) it fails ``conv-state``.
The refusals keep their measured reasons: no CPU driver without the interpreter, the interpreter's truncating
bf16 store, Triton rejecting the store's rounding mode at fp64.  Source: ``pip install fla-core==0.6.0 einops``
(``pip install 'replayssm[adapters]'``); each test skips with the source's one-line reason.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from replayssm.adapters import fla_conv as fc  # noqa: E402
from replayssm.adapters._vllm_source import launch_guard  # noqa: E402
from replayssm.cli import main  # noqa: E402
from replayssm.mixer.kernel import mixer_kernels  # noqa: E402
from replayssm.mixer.spec import mixer_preset  # noqa: E402
from replayssm.validators.engine.mixer.runner import default_plan, validate_mixer  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
NAME = "mixer-fla-shortconv"


@pytest.fixture(scope="module")
def fla_conv():
    reason = fc.FLAShortConvMixer.source_reason()
    if reason:
        pytest.skip(reason)


class FLANoRollback(fc.FLAShortConvStore):
    """The commit keeps FLA's cache after every verified input, the rejected ones included (vLLM #50272's bug:
    ShortConvolution stepped through the drafts with no rollback)."""

    def commit_slot(self, slot, k):
        super().commit_slot(slot, self.T)


def short_conv_launch(dtype, C=64, W=4, n=2):
    """One launch of FLA's ShortConvolution step: (output, FLA's cache after it, the fp32 conv + SiLU it computes,
    the shifted cache)."""
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):  # the module's own init draws from the global generator: seeded here
        torch.manual_seed(0)
        m = fc.conv_module().ShortConvolution(C, W, bias=True, activation="silu", backend="triton")
    m.requires_grad_(False)
    with torch.no_grad():
        m.weight.copy_(m.weight.to(dtype).float())
        m.bias.copy_(m.bias.to(dtype).float())
    x = torch.randn(n, 1, C, generator=gen).to(dtype)
    cache = torch.randn(n, C, W, generator=gen).to(dtype)
    shifted = torch.cat([cache[..., 1:], x.transpose(1, 2)], -1)
    window = shifted.float()
    ref = torch.nn.functional.silu((window * m.weight[:, 0]).sum(-1) + m.bias)
    ops = fc.conv_module()
    with torch.no_grad(), launch_guard(torch.device("cpu"), modules=(ops,)), \
            fc.one_config(ops.causal_conv1d_update_kernel):
        y, cache = m(x, cache=cache, output_final_state=True)
    return y[:, 0], cache, ref, shifted


@pytest.mark.parametrize("fam,mode", [("mamba2", "s32a32"), ("gdn", "s32afp16"), ("kda", "s32a32")],
                         ids=["mamba2-fla-shortconv-s32a32", "gdn-fla-shortconv-s32afp16", "kda-fla-shortconv-s32a32"])
def test_fla_shortconv_adapter_passes(fla_conv, one_thread, fam, mode):
    res = validate_mixer(NAME, mixer_preset("tiny", fam), mode, default_plan(4, steps=6))
    assert res.passed, res.verdict()
    assert res.conv_policy == "draft-snapshots"


def test_fla_shortconv_without_rollback_fails(fla_conv, one_thread):
    cls = type("FLAShortConvNoRollback", (fc.FLAShortConvMixer,), {"name": f"mutant-{NAME}-no-rollback",
                                                                     "store": FLANoRollback})
    res = validate_mixer(cls, mixer_preset("tiny", "gdn"), "s32a32", default_plan(4, steps=6))
    assert not res.passed
    assert "conv-state" in {f.check for f in res.failures}, res.verdict()


@pytest.mark.skipif(not INTERPRETED, reason="the Triton interpreter's bf16 store (a GPU runs bf16)")
def test_fla_shortconv_bf16_refused_under_interpreter_its_store_truncates(fla_conv):
    """The refusal's measured reason: FLA's store names round-to-nearest, the interpreter truncates (every
    output of a 128-output launch equals the round-toward-zero value; round-to-nearest differs on about half).
    With the refusal lifted, s32a16 fails ssm-state on gdn and mamba2 (a one-signed bias the state sums)."""
    with pytest.raises(ValueError, match="bf16 activations under the Triton interpreter"):
        validate_mixer(NAME, mixer_preset("tiny", "gdn"), "s32a16", default_plan(4, steps=1))
    got, _, ref, _ = short_conv_launch(torch.bfloat16)
    toward_zero = (ref.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert torch.equal(got, toward_zero)
    assert (got != ref.to(torch.bfloat16)).float().mean() > 0.25


@pytest.mark.skipif(not INTERPRETED, reason="measured under the Triton interpreter")
def test_fla_shortconv_fp64_refused_triton_rejects_its_store(fla_conv):
    """FLA's update computes in fp32 and stores with ``fp_downcast_rounding='rtne'``: Triton's semantic check (the
    compiler's too) rejects that for an fp32 -> fp64 cast, so FLA's kernel does not take fp64 activations."""
    with pytest.raises(ValueError, match="fp64 activations"):
        validate_mixer(NAME, mixer_preset("tiny", "gdn"), "s64a64", default_plan(4, steps=1))
    with pytest.raises(Exception, match="fp_downcast_rounding should be set only for truncating"):
        short_conv_launch(torch.float64)


def test_fla_shortconv_fp16_window_exact_outputs_rounded_to_nearest(fla_conv):
    """What the adapter relies on: FLA's cache after a step is the shifted window (data movement, exact), and
    its fp16 outputs are the fp32 result rounded to nearest."""
    got, cache, ref, shifted = short_conv_launch(torch.float16)
    assert torch.equal(cache, shifted)
    assert torch.equal(got, ref.to(torch.float16))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device launches FLA's kernel without the interpreter")
def test_fla_shortconv_needs_the_interpreter_on_cpu(fla_conv, monkeypatch):
    """Measured: without the interpreter FLA's step finds no Triton driver for CPU tensors (FLA has no torch path
    for the update), so the run is refused with the way out."""
    code = ("import torch, warnings; warnings.simplefilter('ignore'); from fla.modules import ShortConvolution\n"
            "m = ShortConvolution(8, 4)\n"
            "with torch.no_grad(): m(torch.randn(1, 1, 8), cache=torch.zeros(1, 8, 4), output_final_state=True)")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "0 active drivers" in run.stderr, run.stderr[-2000:]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        validate_mixer(NAME, mixer_preset("tiny", "gdn"), "s32a32", default_plan(4, steps=1))


def test_fla_shortconv_cuda_backend_refused(fla_conv, monkeypatch):
    """``FLA_CONV_BACKEND=cuda`` would route FLA's step to Dao-AILab's kernel: refused, naming the variable."""
    monkeypatch.setenv(fc.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match=fc.BACKEND_ENV):
        validate_mixer(NAME, mixer_preset("tiny", "gdn"), "s32a32", default_plan(4, steps=1))


def test_fla_shortconv_source_missing_is_one_line(monkeypatch):
    monkeypatch.setattr(fc, "_LOADED", {})
    monkeypatch.setattr(fc, "MODULE", "fla.modules.no_such_module")
    reason = fc.FLAShortConvMixer.source_reason()
    assert reason and "\n" not in reason and "pip install fla-core" in reason
    with pytest.raises(ValueError, match="flash-linear-attention"):
        validate_mixer(NAME, mixer_preset("tiny", "gdn"), "s32a32", default_plan(4, steps=1))


def test_fla_shortconv_listed_with_its_availability(capsys):
    """``replayssm list mixer``: the adapter, its design, and whether FLA loads (one line when not)."""
    assert NAME in mixer_kernels()
    assert main(["list", "mixer", "--json"]) == 0
    k = {k["name"]: k for k in json.loads(capsys.readouterr().out)["mixer"]}[NAME]
    assert k["conv_policy"] == "draft-snapshots" and k["ssm_kernel"] == "literal-replay" and "\n" not in k["status"]
    assert k["available"] == (fc.FLAShortConvMixer.source_reason() is None)
