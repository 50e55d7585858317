"""The side-by-side bench job (``replayssm bench --against``) under the interpreter at tiny shapes:
every kernel of every case is validated by the engine and timed through the same path as on the
GPU (no timing asserted: CPU wall clock); the adapters' timed steps move the kernels' state exactly
as their verify + commit do.  GPU numbers: docs/benchmarks.md (the ``side-by-side`` profile).

Oracle: the engine's verdict per configuration (``check_configuration``) and, for the timed steps,
bit identity of checkpoint and records with the interface path after the same steps."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest
import torch

from replayssm import adapters
from replayssm.adapters import _vllm_source
from replayssm.cli import EXIT_ENV, EXIT_USAGE, main
from replayssm.families import family, preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.precision import parse_mode
from replayssm.registry import get
from replayssm.scenarios.inputs import make_params
from replayssm.validators.engine.runner import declared_policy
from replayssm.validators.jobs.bench.against import (
    _verdict,
    against_kernels,
    bench_against,
    common_mode,
    markdown,
    summary_rows,
    write,
)
from replayssm.validators.jobs.bench.run import check_scenario_of, random_inputs

PEERS = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "vllm-replayssm"
COPY = {"tbps": 1.0, "bytes": 1, "ms": 1.0}


@pytest.fixture(scope="module")
def vllm():
    if not PEERS.is_dir():
        pytest.skip(f"no vLLM ReplaySSM source tree at {PEERS} (../shared/peers beside the checkout)")
    saved = os.environ.get(_vllm_source.ENV)
    os.environ[_vllm_source.ENV] = str(PEERS)
    try:
        ok, line = adapters.load(force=True)["vllm"]
    finally:
        if saved is None:
            os.environ.pop(_vllm_source.ENV)
        else:
            os.environ[_vllm_source.ENV] = saved
    assert ok, line


def test_against_kernels_pairs_the_sources_baseline(vllm):
    assert against_kernels("mamba2", ["vllm-replay"]) == {"replay": "vllm-replay", "baseline": "vllm-baseline"}
    assert against_kernels("gdn", ["vllm-baseline"]) == {"baseline": "vllm-baseline"}
    with pytest.raises(ValueError, match="two replay kernels"):
        against_kernels("mamba2", ["vllm-replay", "vllm-replay-state"])
    with pytest.raises(ValueError, match="no kernel 'nope'"):
        against_kernels("mamba2", ["nope"])


def test_common_mode_falls_back_to_tf32_only_when_needed(vllm):
    spec = DecodeConfig("speculative", 4, 16)
    names = ["triton-replay", "vllm-replay"]
    assert common_mode("s32a32", spec, names, "mamba2") == ("s32a32", "")
    # the fork's Mamba-2 speculative kernel reads out with tf32 dots under bf16 activations
    assert common_mode("s32a16", spec, names, "mamba2")[0] == "s32a16-tf32"
    assert common_mode("s32a16", spec, ["triton-baseline", "vllm-baseline"], "mamba2") == ("s32a16", "")
    mode, why = common_mode("s32a16", spec, ["vllm-replay", "triton-baseline"], "mamba2")
    assert mode is None and "vllm-replay" in why and "triton-baseline" in why


# slow tier (the suite's 10-minute budget, measured 12 min 52 s idle at eb48409): the side-by-side run
# under the interpreter; the timed_step tests below keep the against path in CI
@pytest.mark.slow
@pytest.mark.parametrize("fam, ks, sweep", [("mamba2", (2,), ()),
                                            pytest.param("gdn", (2, 1), ("replay",), marks=pytest.mark.slow)],
                         ids=["mamba2-s32a32-k2", "gdn-s32a32-k2-k1-sweep"])
def test_bench_against_runs_and_validates_every_kernel(vllm, one_thread, tmp_path, fam, ks, sweep):
    res = bench_against(fam, ["vllm-replay"], "tiny", "s32a32", L=2, batches=(2,), spec_batches=(2,), window=2,
                        spec_buffer=2, ks=ks, device="cpu", copy=COPY, max_sets=2, sweep_ours=sweep,
                        log=lambda s: None)
    assert [(r["case"], r["batch"]) for r in res["rows"]] == [("standard L=2", 2)] + [
        (f"spec T'=2 B=2 k={k}", 2) for k in ks]
    for r in res["rows"]:
        assert set(r["us"]) == {"triton-replay", "triton-baseline", "vllm-replay", "vllm-baseline"}, r["notes"]
        assert all(v and v > 0 for v in r["us"].values()), r["notes"]
        assert all("of bound" in v for v in r["notes"].values()), r["notes"]
    if sweep:  # every candidate of ours validated and timed (or refused, naming the option), the fastest shown
        spec = res["rows"][1]
        swept = spec["sweep"]["triton-replay"]
        assert len(swept) == len(family(fam).bench_launch_candidates("replay", DecodeConfig("speculative", 2, 2), 2))
        assert swept[0][1] is not None, swept  # the defaults always run
        assert all(us is not None or "options[" in note for _, us, note in swept), swept
        assert spec["us"]["triton-replay"] == min(us for _, us, _ in swept if us is not None)
    assert "at commit" in res["env"]["theirs"]["replay"]
    md = markdown(res)
    assert md.count("\n| spec T'=2 B=2 k=") == len(ks) and "Copy ceiling in the same run" in md
    js, mdfile = write(res, str(tmp_path))
    assert pathlib.Path(js).is_file() and pathlib.Path(mdfile).read_text().startswith(fam)


def test_a_failing_external_kernel_is_timed_with_its_verdict_and_ours_is_not():
    """Theirs is timed whatever the engine says (the verdict goes beside the time); ours must pass."""
    dec = DecodeConfig("speculative", 2, 2)
    theirs = _verdict("mutant-stale-read", "mamba2", "tiny", "s32a32", dec, 2, "cpu", ours=False)
    assert theirs.startswith("FAILS: ")
    assert _verdict("mutant-stale-read", "mamba2", "tiny", "s32a32", dec, 2, "cpu", ours=True).startswith("ours fails")


def _interface_and_timed(a, b, ids, inp, acc, steps=3):
    """``steps`` verify + commit steps of ``a`` through the interface and of ``b`` through its
    ``timed_step``; their snapshots, the checkpoints asserted bit-identical."""
    step = b.timed_step(ids, inp, None, acc)
    for _ in range(steps):
        a.verify(ids, inp)
        a.commit(ids, acc)
        step()
    sa, sb = a.snapshot(), b.snapshot()
    assert torch.equal(sa.checkpoint, sb.checkpoint)
    return sa, sb


def _pair(fam, name, mode, decode, rows):
    g = preset("tiny", fam)
    sc = check_scenario_of(fam, "tiny", mode, decode, decode.window, {})
    params = make_params(sc)
    cls = get(name, fam)
    decode = decode.with_policy(declared_policy(cls))  # a kernel's own bookkeeping (fold-every-commit)
    return [cls(KernelConfig(g, params, mode, decode, num_slots=rows, device=torch.device("cpu")))
            for _ in range(2)], g


@pytest.mark.parametrize("fam, name, mode, spec", [
    ("mamba2", "vllm-replay", "s32a32", False), ("mamba2", "vllm-replay", "s32a32", True),
    ("mamba2", "vllm-baseline", "s32a32", True), ("gdn", "vllm-replay", "s32a32-tf32", False),
    ("gdn", "vllm-replay", "s32a32-tf32", True), ("gdn", "vllm-baseline", "s32a32", True)],
    ids=["mamba2-replay-std", "mamba2-replay-spec", "mamba2-baseline-spec", "gdn-replay-std", "gdn-replay-spec",
         "gdn-baseline-spec"])
def test_timed_step_moves_the_state_as_verify_and_commit(vllm, one_thread, fam, name, mode, spec):
    """After one interface step, three more through ``timed_step`` and through verify + commit leave
    the same checkpoint and records (a flush included: L = 2, or B = 2 with T' = 2)."""
    decode = DecodeConfig("speculative", 2, 2) if spec else DecodeConfig("standard", 1, 2)
    (a, b), g = _pair(fam, name, mode, decode, 2)
    gen = torch.Generator().manual_seed(3)
    ids = torch.arange(2)
    init = 0.5 * torch.randn((2, *g.state_shape), generator=gen)
    for kern in (a, b):
        kern.reset(ids, init)
    inp = random_inputs(family(fam), g, 2, decode.window, parse_mode(mode).act_dtype, gen, "cpu")
    acc = torch.full((2,), decode.window, dtype=torch.int64)
    for kern in (a, b):  # one step through the interface first: the baseline's accepted count is then k
        kern.verify(ids, inp)
        kern.commit(ids, acc)
    sa, sb = _interface_and_timed(a, b, ids, inp, acc)
    for k in sa.records:
        assert torch.equal(sa.records[k], sb.records[k]), k
    if spec and "drafts" in sa.extra:
        assert torch.equal(sa.extra["drafts"], sb.extra["drafts"])


def test_cli_against_refuses_unknown_kernels_and_a_missing_gpu(vllm, capsys):
    """Bad --against names are a usage error naming them; without CUDA the run is refused (exit 3)
    before anything is timed."""
    assert main(["bench", "--against", "nope"]) == EXIT_USAGE
    assert "no kernel named 'nope'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "--against", "vllm-replay", "--family", "gdn"]) == EXIT_ENV
        assert "no CUDA device" in capsys.readouterr().err


@pytest.fixture(scope="module")
def fla():
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla-core not installed (pip install fla-core==0.6.0 einops)")
    ok, line = adapters.load(force=True)["fla"]
    assert ok, line


@pytest.fixture(scope="module")
def sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang not installed (pip install --no-deps sglang==0.5.23)")
    ok, line = adapters.load(force=True)["sglang"]
    assert ok, line


@pytest.mark.parametrize("name, mode, spec", [
    ("sglang-replay", "s32a32-tf32", False), ("sglang-replay-fold", "s32a32", True), ("fla-baseline", "s32a32", False)],
                         ids=["kda-sglang-replay-std-L2", "kda-sglang-replay-fold-spec-T2", "kda-fla-baseline-s32a32"])
def test_kda_timed_step_moves_the_state_as_verify_and_commit(sglang, fla, one_thread, name, mode, spec):
    """The external KDA kernels through ``timed_step``: after the same steps, checkpoint, records and
    the fold's raw window are bit-identical to the interface path's (a flush included at L = 2; FLA's
    in-place serving launch at fp32 activations: the kernel refuses bf16 activations on the CPU, where
    the interpreter's bf16 tl.dot is wrong; not a 16-bit state: the interpreter's fp32 -> bf16 cast
    truncates, measured, where torch's cast in verify rounds to nearest, as the GPU's does)."""
    decode = DecodeConfig("speculative", 2, 2) if spec else DecodeConfig("standard", 1, 2)
    (a, b), g = _pair("kda", name, mode, decode, 2)
    gen = torch.Generator().manual_seed(5)
    ids = torch.arange(2)
    init = 0.5 * torch.randn((2, *g.state_shape), generator=gen)
    inp = random_inputs(family("kda"), g, 2, decode.window, parse_mode(mode).act_dtype, gen, "cpu")
    acc = torch.full((2,), decode.window, dtype=torch.int64)
    for kern in (a, b):
        kern.reset(ids, init)
    sa, sb = _interface_and_timed(a, b, ids, inp, acc)
    assert not torch.equal(sa.checkpoint, init.to(sa.checkpoint.dtype))  # the steps moved it
    for part in ("records", "extra"):
        for k, v in getattr(sa, part).items():
            assert torch.equal(v, getattr(sb, part)[k]), (part, k)
    with pytest.raises(ValueError, match="slot_ids: a timed step takes no padding rows"):
        b.timed_step(torch.tensor([0, -1]), inp, None, acc)
    if name == "fla-baseline":
        (c, _), _ = _pair("kda", name, mode, DecodeConfig("speculative", 2, 2), 2)
        with pytest.raises(ValueError, match="timed step is for standard decode"):
            c.timed_step(ids, inp, None, acc)


# slow tier (the suite's 10-minute budget): 23 s / 30 s under the interpreter on the shared 2-core machine;
# the KDA timed_step tests above keep the adapters' side of the against path in CI
@pytest.mark.slow
@pytest.mark.parametrize("theirs, timed, skipped", [
    ("sglang-replay", "standard L=2", "spec T'=2 B=2 k=2"),
    ("sglang-replay-fold", "spec T'=2 B=2 k=2", "standard L=2")],
    ids=["kda-sglang-replay-fla-std", "kda-sglang-replay-fold-fla-spec"])
def test_bench_against_sglang_and_fla_kda(sglang, fla, one_thread, theirs, timed, skipped):
    """``bench --against SGLANG,fla-baseline`` for KDA at tiny shapes under the interpreter: ours
    (replay, baseline), SGLang's replay kernel of the decode it implements and FLA's baseline, each
    validated, timed, its verdict beside its time; the other decode's case is skipped with SGLang's
    refusal (naming the kernel that implements it); FLA's timed step is standard decode only, so in
    the speculative case its cell says why it was not timed."""
    res = bench_against("kda", [theirs, "fla-baseline"], "tiny", "s32a32", L=2, batches=(2,), spec_batches=(2,),
                        window=2, spec_buffer=2, ks=(2,), device="cpu", copy=COPY, max_sets=2, log=lambda s: None)
    assert res["theirs"] == {"replay": theirs, "baseline": "fla-baseline"}
    rows = {r["case"]: r for r in res["rows"]}
    assert set(rows) == {timed, skipped}
    run, skip = rows[timed], rows[skipped]
    names = {"triton-replay", "triton-baseline", theirs, "fla-baseline"}
    assert run["batch"] == 2 and set(run["us"]) == names, run["notes"]
    timed_names = names - ({"fla-baseline"} if theirs == "sglang-replay-fold" else set())
    assert all(run["us"][n] > 0 and "of bound" in run["notes"][n] for n in timed_names), run["notes"]
    if theirs == "sglang-replay":  # its fp32 dots are tf32 on the GPU: ours stays at the stricter s32a32
        assert run["modes"] == {"triton-replay": "s32a32", "triton-baseline": "s32a32", theirs: "s32a32-tf32",
                                "fla-baseline": "s32a32"}
    else:
        assert run["us"]["fla-baseline"] is None and "timed step is for standard decode" in run["notes"]["fla-baseline"]
    assert skip["batch"] == 0 and "it is the kernel 'sglang-replay" in skip["notes"]["*"], skip["notes"]
    (s,) = summary_rows(res)
    assert s["replay_ratio"] and s["ours_speedup"] and (s["baseline_ratio"] is None) == (theirs != "sglang-replay")
    md = markdown(res)
    assert f"\n| {timed} | 2 |" in md and f"Not run: {skipped}: replay: " in md
