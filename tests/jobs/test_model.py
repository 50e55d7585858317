"""The model level (``replayssm model``, validators/jobs/model/): a tiny random qwen3_next and a tiny
random qwen3_5 (Qwen3.5's text model) whose GDN layers, a tiny random nemotron_h whose Mamba-2 mixers
and a tiny random kimi_linear whose KDA layers decode through the kernel under test, judged by teacher
forcing against their fp64-recurrence prefill.

Oracles: transformers' own PyTorch fallback of the GDN layers (qwen3_next's and Qwen3.5's), of the
Mamba-2 mixer and of the KDA layer (the adapters reproduce the model's logits to its fp32 arithmetic,
the GDN ones also its cached token-by-token decode through the literal replay at s64a64); the fp64
teacher (the literal replay at s64a64 matches it to the model's fp32 norms); the ``[model.gdn]``,
``[model.mamba2]`` and ``[model.kda]`` budgets of golden/tolerances.toml (correct kernels inside, the
late-by-one and scratch-KV-rollback mutants far outside); a checkpoint of each architecture written by
save_pretrained loads back (``--weights``) with every weight as saved, and so does the text part of a
Qwen3.5 multimodal checkpoint.  Sizes: qwen3_next and qwen3_5 4 layers (GDN, attention, GDN, GDN),
K = 16, V = 8; nemotron_h 5 layers (Mamba-2, attention, Mamba-2, MLP, Mamba-2), 4 heads x 8, dstate 16,
2 groups; kimi_linear 4 layers (KDA, MLA attention, KDA, KDA), 2 heads, K = V = 16; 16 to 32
positions, so each run takes seconds on the CPU (the Triton one through the interpreter).
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from replayssm.cli import main  # noqa: E402
from replayssm.interface import DecodeConfig  # noqa: E402
from replayssm.precision import parse_mode  # noqa: E402
from replayssm.records.record import validate  # noqa: E402
from replayssm.validators.jobs.drift.model_columns import load_model_result  # noqa: E402
from replayssm.validators.jobs.model import forcing, hf, report  # noqa: E402
from replayssm.validators.jobs.model.job import ModelJob, check_engagement, load_model_budgets, run  # noqa: E402


def _job(**kw) -> ModelJob:
    base = {"modes": ("s32a32",), "schedules": ("random", "always-1"), "tokens": 32}
    return ModelJob(**{**base, **kw})


_GDN_ARCHS = ["qwen3_next", "qwen3_5"]
_GDN_FALLBACKS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                  "causal_conv1d_update")


def _force_gdn_fallback(monkeypatch, arch: str):
    """transformers' PyTorch GDN functions in place of what the module resolved at import (FLA's Triton
    kernels where fla is installed, which need a GPU); ``__wrapped__`` is the torch function.  Returns
    the modeling module."""
    M = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    for name in _GDN_FALLBACKS:
        monkeypatch.setattr(M, name, getattr(getattr(M, name), "__wrapped__", getattr(M, name)))
    return M


@pytest.mark.parametrize("arch", _GDN_ARCHS)
def test_adapter_reproduces_the_torch_fallback(arch, monkeypatch):
    """The GDN adapter's logits (its fp64 reference driver, the teacher) against transformers' own layer
    (``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``) with its PyTorch fallback forced: equal to
    the fallback's fp32 recurrence."""
    _force_gdn_fallback(monkeypatch, arch)
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(3))
    theirs, _ = hf.build_random(arch, "tiny", 0)
    ours, a = hf.build_random(arch, "tiny", 0)
    mixers = forcing.mixers_of(ours, a)
    assert len(mixers) == 3 and a.family == "gdn"
    with torch.no_grad():
        want = theirs(ids).logits[0]
    got, _ = forcing.teacher_logits(ours, mixers, ids[0])
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


@pytest.mark.parametrize("arch", _GDN_ARCHS)
def test_literal_decode_reproduces_the_torch_fallback_decode(arch, monkeypatch):
    """The adapted GDN layers' decode through the literal replay at s64a64 (the student, always-1: one
    committed token per verify) against transformers' own cached decode of the same stream one token at
    a time, its PyTorch fallback forced: after the first token every GDN step of transformers is its
    recurrent fallback with ``causal_conv1d_update`` (counted), and the logits agree to its fp32
    recurrence."""
    M = _force_gdn_fallback(monkeypatch, arch)
    steps = []
    recurrent = M.torch_recurrent_gated_delta_rule
    monkeypatch.setattr(M, "torch_recurrent_gated_delta_rule", lambda *a, **k: steps.append(1) or recurrent(*a, **k))
    n, dec = 12, DecodeConfig("speculative", 4, 8)
    ids = torch.randint(0, 96, (n + dec.window,), generator=torch.Generator().manual_seed(3))
    theirs, _ = hf.build_random(arch, "tiny", 0)
    ours, a = hf.build_random(arch, "tiny", 0)
    mixers = forcing.mixers_of(ours, a)
    cache = hf.new_cache(theirs)
    with torch.no_grad():
        want = torch.cat([theirs(ids[None, t:t + 1], past_key_values=cache, use_cache=True).logits[0]
                          for t in range(n)])
    assert len(steps) == len(mixers) * (n - 1)
    got, eng = forcing.student_logits(ours, mixers, ids, n, "literal-replay", parse_mode("s64a64"), dec, "always-1", 0)
    assert eng.flushes > 0 and eng.rejected_tokens > 0
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


def test_mamba2_adapter_reproduces_the_torch_fallback(monkeypatch):
    """The Mamba-2 adapter's logits against transformers' own ``NemotronHMamba2Mixer`` with its PyTorch
    chunk scan forced (the module resolves mamba_ssm's Triton kernels at import wherever mamba_ssm is
    importable, as on CI once the mamba_ssm adapter's source is on the path, and those need CUDA;
    ``__wrapped__`` is the torch function), with the prefill's Δ floor (``time_step_limit``) at 0 as in
    transformers' decode step and every replayssm kernel: equal to the fallback's fp32 scan."""
    import transformers.models.nemotron_h.modeling_nemotron_h as M
    for name in ("causal_conv1d_fn", "causal_conv1d_update", "mamba2_split_conv1d_scan_combined",
                 "mamba2_selective_state_update", "mamba2_chunk_scan"):
        monkeypatch.setattr(M, name, getattr(getattr(M, name), "__wrapped__", getattr(M, name)))
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(3))
    theirs, _ = hf.build_random("nemotron_h", "tiny", 0)
    for mod in theirs.modules():
        if type(mod).__name__ == "NemotronHMamba2Mixer":
            mod.time_step_limit = (0.0, float("inf"))
    ours, arch = hf.build_random("nemotron_h", "tiny", 0)
    mixers = forcing.mixers_of(ours, arch)
    assert len(mixers) == 3 and arch.family == "mamba2"
    with torch.no_grad():
        want = theirs(ids).logits[0].to(torch.float64)
    got, _ = forcing.teacher_logits(ours, mixers, ids[0])
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


def test_kda_adapter_reproduces_the_torch_fallback(monkeypatch):
    """The KDA adapter's logits against transformers' own ``KimiLinearDeltaAttention`` with its PyTorch
    chunk recurrence and conv forced (the module resolves FLA's Triton KDA kernels at import wherever
    fla is importable; ``__wrapped__`` is the torch function): equal to the fallback's fp32 recurrence
    and gate."""
    import transformers.models.kimi_linear.modeling_kimi_linear as M
    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        monkeypatch.setattr(M, name, getattr(getattr(M, name), "__wrapped__", getattr(M, name)))
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(3))
    theirs, _ = hf.build_random("kimi_linear", "tiny", 0)
    ours, arch = hf.build_random("kimi_linear", "tiny", 0)
    mixers = forcing.mixers_of(ours, arch)
    assert len(mixers) == 3 and arch.family == "kda"
    with torch.no_grad():
        want = theirs(ids).logits[0].to(torch.float64)
    got, _ = forcing.teacher_logits(ours, mixers, ids[0])
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


_ARCHS = ["qwen3_next", "qwen3_5", "nemotron_h", "kimi_linear"]


@pytest.mark.parametrize("arch", _ARCHS)
def test_s64a64_student_equals_teacher(arch):
    rep = run(_job(arch=arch, modes=("s64a64",), schedules=("random",)))
    m = rep["runs"][0]["metrics"]
    assert m["max_abs_dlogprob"] < 1e-5 and m["top1_agreement"] == 1.0
    assert rep["teacher_dtype"] == "float64"
    assert 0.4 * rep["entropy_max"] < rep["entropy"] < 0.6 * rep["entropy_max"]


_ALL = ("random", "always-1", "always-T", "reject-then-accept")


@pytest.mark.parametrize("arch,kernel,schedules", [
    # (the Triton kernels under the interpreter: 9 s each of a 2-core ./dev test, 2026-12-08, in the slow tier;
    # the quick run keeps the literal kernels through the same model-level path, the families' Triton tests
    # validate the kernels)
    ("qwen3_next", "literal-replay", _ALL),
    pytest.param("qwen3_next", "triton-replay", ("random",), marks=pytest.mark.slow),
    ("qwen3_5", "literal-replay", _ALL),
    ("nemotron_h", "literal-replay", _ALL),
    pytest.param("nemotron_h", "triton-replay", ("random",), marks=pytest.mark.slow),
    ("kimi_linear", "literal-replay", _ALL),
    pytest.param("kimi_linear", "triton-replay", ("random",), marks=pytest.mark.slow),
], ids=["gdn-literal", "gdn-triton", "gdn-qwen3_5-literal", "mamba2-literal", "mamba2-triton", "kda-literal",
        "kda-triton"])
def test_correct_kernel_inside_budget(arch, kernel, schedules):
    rep = run(_job(arch=arch, kernel=kernel, schedules=schedules, tokens=32 if kernel == "literal-replay" else 16))
    assert rep["family"] == hf.architecture(arch).family
    assert rep["verdict"] == "pass", [r["failures"] for r in rep["runs"]]
    assert all(r["verdict"] == "pass" for r in rep["runs"])
    assert sum(r["engagement"]["flushes"] for r in rep["runs"]) > 0
    assert sum(r["engagement"]["rejected_tokens"] for r in rep["runs"]) > 0


@pytest.mark.parametrize("arch", _ARCHS)
@pytest.mark.parametrize("mutant", ["late-by-one", "scratch-kv-rollback"])
def test_mutant_outside_budget(arch, mutant):
    """Both model-level mutants (a state published one token late; rMLX #436's rollback replayed through
    a scratch KV cache) move p95 |dlogprob| far beyond the s32a32 budget the correct kernels keep."""
    rep = run(_job(arch=arch, mutant=mutant, schedules=("random",)))
    assert rep["verdict"] == "fail"
    assert any("p95_abs_dlogprob" in f for f in rep["runs"][0]["failures"])


@pytest.mark.parametrize("family", ["gdn", "mamba2", "kda"])
def test_every_mode_has_a_budget_with_provenance(family):
    b = load_model_budgets()
    for mode in ("s32a32", "s32a16", "s16a16", "sfp16a16", "sfp8a16"):
        assert (family, mode) in b, mode
        assert b[(family, mode)]["provenance"]["commit"]


@pytest.mark.parametrize("kw,arg", [
    ({"tokens": 0}, "--tokens"), ({"window": 8, "buffer": 4}, "--window/--buffer"),
    ({"schedules": ("sometimes",)}, "--schedules"), ({"modes": ("s99a1",)}, "precision mode"),
    ({"mutant": "nope"}, "--mutant"), ({"size": "huge"}, "size"), ({"arch": "gpt2"}, "arch"),
    ({"entropy_fraction": 1.5}, "--entropy-fraction"), ({"kernel": "nope"}, "kernel"),
    ({"family": "rwkv7"}, "--family"), ({"family": "mamba2"}, "--family"),
], ids=["tokens", "buffer", "schedule", "mode", "mutant", "size", "arch", "entropy", "kernel", "family",
        "family-arch"])
def test_bad_input_refused(kw, arg):
    with pytest.raises(ValueError, match=arg.replace("-", r"\-").replace("/", "/")):
        run(_job(**kw))


def test_a_plan_without_rejections_is_refused():
    with pytest.raises(ValueError, match="--tokens.*not exercise ReplaySSM"):
        check_engagement(_job(schedules=("always-T",)))
    with pytest.raises(ValueError, match="--tokens.*no flush"):
        check_engagement(_job(tokens=2, schedules=("always-1",)))


@pytest.mark.parametrize("arch", _ARCHS)
def test_local_checkpoint(arch, tmp_path, capsys):
    """A checkpoint of each architecture (``--family gdn|mamba2|kda``) the test writes with save_pretrained
    loads with no network, every weight as saved (none re-initialised by the loader), and runs through the
    CLI (a report naming the architecture and family, schema-valid records)."""
    model, _ = hf.build_random(arch, "tiny", 1, torch.float32)
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    loaded, a = hf.load_local(ckpt, torch.float32)
    saved, got = model.state_dict(), loaded.state_dict()
    assert a.name == arch and sorted(saved) == sorted(got)
    assert [k for k in saved if not torch.equal(saved[k], got[k])] == []
    out, rec = tmp_path / "out", tmp_path / "rec.jsonl"
    rc = main(["model", "--weights", str(ckpt), "--precision", "s32a32", "--schedules", "random",
               "--tokens", "16", "--out", str(out), "--record", str(rec)])
    assert rc == 0, capsys.readouterr()
    rep = json.loads((out / "model.json").read_text())
    assert rep["source"] == str(ckpt) and rep["head_scale"] is None
    assert rep["arch"] == arch and rep["family"] == a.family and rep["mixers"] == 3
    assert (out / "model.md").read_text().startswith(f"# replayssm model: {arch}")
    for line in rec.read_text().splitlines():
        r = validate(json.loads(line))
        assert r["job"] == "model" and r["verdict"] == "pass"


def _qwen3_5_multimodal(seed: int):
    """A tiny ``Qwen3_5ForConditionalGeneration`` (model_type ``qwen3_5``): the tiny qwen3_5 text model
    under a one-block vision tower."""
    text = {**hf.ARCHITECTURES["qwen3_5"].sizes["tiny"], "num_hidden_layers": 4, "initializer_range": hf.INIT_RANGE}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
              "patch_size": 2, "temporal_patch_size": 2, "spatial_merge_size": 1, "num_position_embeddings": 16}
    torch.manual_seed(seed)
    cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    return transformers.Qwen3_5ForConditionalGeneration(cfg).eval()


@pytest.mark.parametrize("mutant", [None, "late-by-one"], ids=["correct", "late-by-one"])
def test_qwen3_5_multimodal_checkpoint_runs_its_text_model(mutant, tmp_path, capsys):
    """A Qwen3.5 checkpoint as published (the multimodal wrapper, model_type ``qwen3_5``) loads its text
    model: every language-model weight as saved (``model.language_model.`` read as ``model.``), the
    vision tower left out; through the CLI the literal replay stays inside the s32a32 budget and the
    late-by-one mutant moves p95 |dlogprob| beyond it (exit 1)."""
    model = _qwen3_5_multimodal(2)
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    loaded, a = hf.load_local(ckpt, torch.float32)
    assert a.name == "qwen3_5" and loaded.config.model_type == "qwen3_5_text"
    saved = {k.replace("model.language_model.", "model."): v for k, v in model.state_dict().items()
             if not k.startswith("model.visual.")}
    got = loaded.state_dict()
    assert sorted(saved) == sorted(got)
    assert [k for k in saved if not torch.equal(saved[k], got[k])] == []
    out = tmp_path / "out"
    rc = main(["model", "--weights", str(ckpt), "--precision", "s32a32", "--schedules", "random", "--tokens", "16",
               "--out", str(out), *(["--mutant", mutant] if mutant else [])])
    assert rc == (1 if mutant else 0), capsys.readouterr()
    rep = json.loads((out / "model.json").read_text())
    assert rep["arch"] == "qwen3_5" and rep["family"] == "gdn" and rep["mixers"] == 3
    fails = rep["runs"][0]["failures"]
    assert any("p95_abs_dlogprob" in f for f in fails) if mutant else fails == []


@pytest.mark.parametrize("model_type", ["gpt2", "qwen3_5_moe_text"])
def test_a_missing_or_foreign_checkpoint_is_one_line(model_type, tmp_path, capsys):
    """A missing directory, and a checkpoint of a model_type without an adapter (a model with no
    recurrent mixer; Qwen3.5's MoE sibling), are one line naming ``--weights``, the type and the
    model_types expected."""
    out = tmp_path / "out"
    assert main(["model", "--weights", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "--weights" in capsys.readouterr().err
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert main(["model", "--weights", str(tmp_path / "foreign"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--weights" in err and repr(model_type) in err and len(err.strip().splitlines()) == 1
    assert all(repr(t) in err for t in ("qwen3_5", "qwen3_5_text", "qwen3_next", "nemotron_h", "kimi_linear"))


def test_html_has_one_plot_per_run(tmp_path):
    """model.html: the runs' table and one SVG plot of |dlogprob| against tokens per mode x schedule, each
    titled by its run, with the mode's budget lines; no script, nothing outside the page."""
    rep = run(_job(arch="kimi_linear", modes=("s32a32", "s32a16"), schedules=("random", "always-1"), tokens=16))
    paths = report.write(rep, tmp_path)
    assert [p.name for p in paths] == ["model.json", "model.md", "model.html"]
    page = paths[2].read_text()
    assert page.count("<svg") == len(rep["runs"]) == 4
    for x in rep["runs"]:
        assert f"<title>{x['mode']} · {x['schedule']} · {x['verdict']}</title>" in page
        assert f"p95 budget {x['budget']['p95_abs_dlogprob']:.3g}" in page
    assert "<script" not in page and "http://www.w3.org/2000/svg" in page and "src=" not in page
    assert "[model.html](model.html)" in paths[1].read_text()
    read = load_model_result(paths[0])  # what the drift report's --model-result reads
    assert read["family"] == "kda" and len(read["runs"]) == 4 and read["runs"][0]["tokens"] == 16


def test_log_bins_cover_every_position_once():
    b = report.log_bins([float(i) for i in range(1, 1001)], bins=20)
    assert b["t"][-1] == 1000 and b["t"] == sorted(set(b["t"])) and len(b["t"]) <= 20
    assert b["max"][-1] == 1000.0 and b["max"][0] == 1.0
    assert report.log_bins([0.5] * 5) == {"t": [1, 2, 3, 4, 5], "max": [0.5] * 5, "mean": [0.5] * 5}
    assert report.log_bins([]) == {"t": [], "max": [], "mean": []}


def test_without_transformers_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(hf, "transformers", None)
    assert main(["model", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "transformers" in err and "replayssm[model]" in err


def test_family_selects_the_architecture(tmp_path, capsys):
    """``--family mamba2`` runs the random nemotron_h (its report names it and the family)."""
    out = tmp_path / "out"
    rc = main(["model", "--family", "mamba2", "--precision", "s32a32", "--schedules", "random", "--tokens", "16",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    rep = json.loads((out / "model.json").read_text())
    assert rep["arch"] == "nemotron_h" and rep["family"] == "mamba2" and rep["mixers"] == 3


def test_a_run_cut_short_keeps_the_records_of_the_runs_it_finished(tmp_path, monkeypatch):
    """``--record`` appends each (mode, schedule) run's record as the run completes: a job stopped during
    its second mode keeps the first mode's record (schema-valid, the same as an uncut job writes), and an
    uncut job writes each run's record once."""
    args = ["model", "--family", "gdn", "--precision", "s32a32,s16a16", "--schedules", "random", "--tokens", "16"]
    whole = tmp_path / "whole.jsonl"
    assert main([*args, "--out", str(tmp_path / "a"), "--record", str(whole)]) in (0, 1)
    full = [validate(json.loads(line)) for line in whole.read_text().splitlines()]
    assert [r["mode"] for r in full] == ["s32a32", "s16a16"]

    real = forcing.run_student

    def stop_at_second_mode(*a, **k):
        if a[6] == "s16a16":
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(forcing, "run_student", stop_at_second_mode)
    cut = tmp_path / "cut.jsonl"
    assert main([*args, "--out", str(tmp_path / "b"), "--record", str(cut)]) == 130
    (kept,) = [validate(json.loads(line)) for line in cut.read_text().splitlines()]
    timeless = [{k: v for k, v in r["metrics"].items() if k != "wall_s"} for r in (kept, full[0])]
    assert kept["case"] == full[0]["case"] and timeless[0] == timeless[1]
    assert not (tmp_path / "b" / "model.json").exists()
