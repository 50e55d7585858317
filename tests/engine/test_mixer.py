"""The mixer level (replayssm/mixer/, replayssm/ops/conv/, validators/engine/mixer/), on CPU at tiny shapes.

Oracles: the whole fp64 step against an independent composition (torch's conv1d over the padded
sequence, then the family's naive sequence); the mixer runner's checks (fp64 whole-step reference,
tolerance rule against the literal mixer, conv window bit for bit read by the declared design);
each conv design passing only under its own declaration; each field-report mutant caught.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import json  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from replayssm.cli import main  # noqa: E402
from replayssm.mixer.kernel import LITERALS, ComposedMixer, MixerConfig, mixer_kernel  # noqa: E402
from replayssm.mixer.spec import mixer_preset  # noqa: E402
from replayssm.ops.conv.literal import STORES  # noqa: E402
from replayssm.records.record import validate as validate_record  # noqa: E402
from replayssm.validators.engine.mixer.mutants import MUTANTS  # noqa: E402
from replayssm.validators.engine.mixer.runner import default_plan, make_inputs, make_params, validate_mixer  # noqa: E402

FAMILIES = ("mamba2", "gdn", "kda")
# the project's shared folder beside the checkout (../shared), or beside the worktrees' folder
VLLM = next((p for p in (pathlib.Path(__file__).resolve().parents[i] / "shared" / "peers" / "vllm-0.33.0"
                         for i in (2, 3)) if p.is_dir()), pathlib.Path("../shared/peers/vllm-0.33.0"))


@pytest.mark.parametrize("fam", FAMILIES)
def test_reference_step_matches_conv1d_then_naive_sequence(fam):
    """The fp64 mixer step, token by token, equals torch's causal conv1d over [window, tokens] then
    the family's SSM step over the sequence (a different formulation of the conv), to 1e-12."""
    g = mixer_preset("tiny", fam)
    spec, p = g.spec, {k: v.double() for k, v in make_params(g, "s64a64", 3).items()}
    gen = torch.Generator().manual_seed(4)
    inp = {k: v[0].double() for k, v in make_inputs(g, "s64a64", 1, 6, gen).items()}
    window = torch.randn(g.conv_channels, g.d_conv - 1, generator=gen, dtype=torch.float64)
    s0 = torch.randn(g.state_shape, generator=gen, dtype=torch.float64)
    st, win, outs = s0, window, []
    for t in range(6):
        y, st, win = spec.reference_step(st, win, {k: v[t] for k, v in inp.items()}, p, g.ssm)
        outs.append(y)
    seq = torch.cat([window, inp["conv_x"].T], dim=1)[None]  # [1, C, W + T]
    c = torch.nn.functional.conv1d(seq, p["conv_weight"][:, None, :], p.get("conv_bias"), groups=g.conv_channels)
    a = torch.nn.functional.silu(c[0].T)  # [T, C]
    st2, want = s0, []
    for t in range(6):
        tok = spec.split(a[t], g.ssm)
        tok.update({n: inp[n][t] for n in spec.gate_inputs(g.ssm)})
        y, st2 = spec.ssm_step(st2, tok, {n: p[n] for n in g.ssm.param_shapes()})
        want.append(spec.norm(y, inp["z"][t], p["norm_weight"], g.ssm))
    torch.testing.assert_close(torch.stack(outs), torch.stack(want), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(st, st2, rtol=1e-12, atol=1e-12)
    assert torch.equal(win, seq[0, :, -(g.d_conv - 1):])


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize("policy", sorted(STORES))
def test_literal_mixer_passes_under_its_own_policy(fam, policy):
    res = validate_mixer(LITERALS[policy], mixer_preset("tiny", fam), "s32a16", default_plan(4, steps=8))
    assert res.passed, res.verdict()
    assert res.worst["mixer-output"] <= 1.0 and res.worst["ssm-state"] <= 1.0


@pytest.mark.parametrize("declared", sorted(STORES))
@pytest.mark.parametrize("implements", sorted(STORES))
def test_conv_store_fails_under_another_declaration(implements, declared):
    """A store read by another design's rule: the committed window is wrong (conv-state), only there."""
    if implements == declared:
        pytest.skip("its own declaration: test_literal_mixer_passes_under_its_own_policy")
    cls = type("Wrong", (ComposedMixer,), {"name": "wrong", "store": STORES[implements], "conv_policy": declared})
    res = validate_mixer(cls, mixer_preset("tiny", "mamba2"), "s32a32", default_plan(4, steps=4))
    assert not res.passed
    assert {f.check for f in res.failures} == {"conv-state"}, res.verdict()


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_conv_mutant_caught_by_default_validation(fam, mutant):
    res = validate_mixer(mutant, mixer_preset("tiny", fam), "s32a16", default_plan(4))
    assert not res.passed
    assert "conv-state" in {f.check for f in res.failures}, res.verdict()


def test_standard_decode_literal_passes_and_no_rollback_is_harmless_there():
    plan = default_plan(4, steps=8, window=1)
    assert validate_mixer("mixer-literal-circular", mixer_preset("tiny", "gdn"), "s16a16", plan).passed
    # with T' = 1 every token is accepted: keeping the "rejected" tokens is the right answer
    assert validate_mixer("mutant-conv-no-rollback", mixer_preset("tiny", "gdn"), "s16a16", plan).passed


def test_triton_mixer_passes_tiny():
    res = validate_mixer("mixer-triton-replay", mixer_preset("tiny", "mamba2"), "s32a32", default_plan(4, steps=3))
    assert res.passed, res.verdict()


@pytest.mark.skipif(not VLLM.is_dir(), reason="no vLLM 0.33.0 tree at ../shared/peers/vllm-0.33.0")
def test_vllm_causal_conv1d_update_adapter_passes(monkeypatch):
    """fp32 activations on CPU: bf16 under the interpreter is refused with its reason (the GPU runs it).
    The release's conv loads beside the fork's kernels when a test before it (same process) loaded them."""
    fork = VLLM.parent / "vllm-replayssm"
    if fork.is_dir():
        from replayssm.adapters import _vllm_source
        _vllm_source.load(str(fork))
    monkeypatch.setenv("REPLAYSSM_VLLM_SRC", str(VLLM))
    res = validate_mixer("mixer-vllm-conv", mixer_preset("tiny", "gdn"), "s32a32", default_plan(4, steps=6))
    assert res.passed, res.verdict()
    if os.environ.get("TRITON_INTERPRET") == "1":
        with pytest.raises(ValueError, match="bf16 activations under the Triton interpreter"):
            validate_mixer("mixer-vllm-conv", mixer_preset("tiny", "gdn"), "s32a16", default_plan(4, steps=2))


def test_real_presets_conv_channels():
    """d_conv = 4 and the conv channels of the real layers: Nemotron-3-Nano-4B 96*80 + 2*8*128, Qwen3.5-4B
    2*16*128 + 32*128, Kimi-Linear-48B 3 * 32*128."""
    got = {f: mixer_preset(p, f) for f, p in (("mamba2", "nano4b"), ("gdn", "qwen35-4b"), ("kda", "kimi-linear-48b"))}
    assert {f: (g.conv_channels, g.d_conv) for f, g in got.items()} == {
        "mamba2": (9728, 4), "gdn": (8192, 4), "kda": (12288, 4)}


def test_bad_inputs_refused_before_any_change():
    g = mixer_preset("tiny", "mamba2")
    k = mixer_kernel("mixer-literal-lazy-offset")(MixerConfig(g, make_params(g, "s32a16", 0), "s32a16",
                                                              default_plan(4).decode, 2))
    k.reset(torch.tensor([0, 1]))
    before = k.conv_storage()
    inp = make_inputs(g, "s32a16", 2, 5, torch.Generator().manual_seed(0))
    inp["conv_x"] = inp["conv_x"][..., :-1].contiguous()
    with pytest.raises(ValueError, match=r"inputs\['conv_x'\]"):
        k.verify(torch.tensor([0, 1]), inp)
    assert all(torch.equal(before[n], v) for n, v in k.conv_storage().items())
    with pytest.raises(ValueError, match="--d_conv|d_conv"):
        mixer_preset("tiny", "mamba2", d_conv=1)


def test_cli_validate_level_mixer(tmp_path, capsys):
    rec = tmp_path / "rec.jsonl"
    rc = main(["validate", "--level", "mixer", "--kernel", "mutant-conv-unwritten-snapshot", "--family", "kda",
               "--steps", "4", "--out", str(tmp_path), "--record", str(rec)])
    assert rc == 1 and "FAIL" in capsys.readouterr().out
    assert (tmp_path / "mutant-conv-unwritten-snapshot-kda-mixer.json").is_file()
    assert main(["validate", "--level", "mixer", "--kernel", "mixer-literal-lazy-offset", "--steps", "4",
                 "--out", str(tmp_path), "--record", str(rec)]) == 0
    records = [json.loads(line) for line in rec.read_text().splitlines()]
    for r in records:
        validate_record(r)
    assert [(r["job"], r["case"], r["verdict"]) for r in records] == [
        ("mixer", "kda/mutant-conv-unwritten-snapshot/s32a16/tiny/mixer-validate", "fail"),
        ("mixer", "mamba2/mixer-literal-lazy-offset/s32a16/tiny/mixer-validate", "pass")]
    assert "conv-state" in records[0]["reason"] and records[1]["metrics"]["steps_run"] == 4
    assert main(["validate", "--level", "mixer", "--kernel", "mixer-literal-lazy-offset", "--schedule", "x",
                 "--out", str(tmp_path)]) == 2
