"""The Mamba-2 Triton kernels ("triton-baseline", "triton-replay", "triton-replay-state") on CPU,
through the Triton interpreter, at the tiny geometry.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal model at the
same precision mode for the tolerance rule, exact invariants: checkpoint bit-identical over a
non-flush verify, padding rows and unused slots untouched, every output written, committed ring
rows kept, bit-identical repeat); torch's casts for the stored bytes.  Expected: every check
passes; the stored bf16/fp8 bytes equal torch's round-to-nearest-even casts of the kernel's own
fp32 values up to the few elements where the fp32 arithmetic differs by an ulp.

The GPU numerics (tf32 readouts, the GPU's exp/log, the launch configurations of the benchmark)
are tested by tests/ops/mamba2/test_mamba2_gpu.py.
"""

import pytest
import torch

from replayssm import registry
from replayssm.families import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.ops.mamba2.naive import softplus
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.pytest_plugin import assert_kernel_valid

KERNELS = ("triton-baseline", "triton-replay", "triton-replay-state")
MODES = ("s32a32", "s32a16", "s32afp16", "s16a16", "s16a16-sr", "sfp16a16", "sfp16a16-sr", "sfp16afp16",
         "sfp8a16", "sfp8a16-sr", "s32a32-tf32", "s32a16-tf32x3")
G = preset("tiny", "mamba2")


def _spec(mode="s32a16", T=3, B=4, schedule="random", steps=None, **kw):
    return Scenario.tiny("mamba2", decode="speculative", mode=mode, window=T, buffer=B, schedule=schedule,
                         steps=steps, **kw)


def _std(mode="s32a16", L=4, steps=None, **kw):
    return Scenario.tiny("mamba2", decode="standard", mode=mode, buffer=L, schedule="always-1",
                         steps=steps if steps is not None else L + 3, **kw)


def _supported(name, mode):
    cls = registry.get(name, "mamba2")
    from replayssm.precision import parse_mode
    return cls.unsupported_reason(parse_mode(mode), DecodeConfig(), {}) is None


# ---- through the engine ---------------------------------------------------------------------------------


# slow tier (17.3 s of an idle 2-core run at c28c32a, for ./dev test's 10 minutes): the speculative replay
# runs in every run in test_replay_speculative_every_mode and test_gpu_default_paths.
@pytest.mark.slow
def test_speculative_exhaustive_schedule():
    """Every k at every ring phase (empty, mid, last non-flush, flush, wrap), origins 5 and 4."""
    assert_kernel_valid("triton-replay", _spec("s32a16", schedule="exhaustive"))


@pytest.mark.parametrize("name,L", [("triton-replay", 1), ("triton-replay", 4), ("triton-replay", 16),
                                    ("triton-replay-state", 4)],
                         ids=["triton-replay-s32a16-L1", "triton-replay-s32a16-L4", "triton-replay-s32a16-L16",
                              "triton-replay-state-s32a16-L4"])
def test_standard_decode_flush_cycles(name, L):
    assert_kernel_valid(name, _std("s32a16", L, steps=L + 2 if L > 1 else 4), repeat_check=L == 4)


# sfp16a16-sr and sfp8a16-sr in the slow tier (7.3 and 11.1 s of an idle 2-core run, 2026-12-01 and
# c28c32a, for ./dev test's 10 minutes): s16a16-sr keeps stochastic rounding here in every run, sfp8a16
# the fp8 store.
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m in ("sfp16a16-sr", "sfp8a16-sr")
                                  else m for m in MODES])
def test_replay_speculative_every_mode(mode):
    assert_kernel_valid("triton-replay", _spec(mode, steps=7), repeat_check=mode.endswith("-sr"))


@pytest.mark.parametrize("mode", [m for m in MODES if _supported("triton-baseline", m)])
def test_baseline_standard_every_mode(mode):
    assert_kernel_valid("triton-baseline", _std(mode, L=1, steps=3), repeat_check=mode.endswith("-sr"))


# s16a16-sr in the slow tier (9.5 s at c28c32a, for ./dev test's 10 minutes): the baseline's SR store runs
# in every run in test_baseline_standard_every_mode, its speculative path with the other two modes.
@pytest.mark.parametrize("mode", ["s32a16", pytest.param("s16a16-sr", marks=pytest.mark.slow), "sfp8a16"])
def test_baseline_speculative(mode):
    """One state per draft position, the accepted one made live by index (T' = 3: 4 buffers)."""
    assert_kernel_valid("triton-baseline", _spec(mode, steps=5), repeat_check=mode.endswith("-sr"))


@pytest.mark.parametrize("decode,mode", [("standard", "s32afp16"), ("standard", "sfp16afp16"),
                                         ("standard", "sfp8a16-sr"), ("standard", "s32a32-tf32"),
                                         ("speculative", "s16a16-sr")])
def test_replay_state_route_modes(decode, mode):
    sc = _std(mode, L=4, steps=5) if decode == "standard" else _spec(mode, steps=6)
    assert_kernel_valid("triton-replay-state", sc, repeat_check=False)


@pytest.mark.parametrize("kchunks", [2, 4], ids=["kc2", "kc4"])
def test_prepass_chunked_readouts(kchunks):
    """Pre-pass path with dstate read out in chunks summed inside a thread (3-D tiles; the flush
    tile reshaped back to rows): standard fp8 + SR (scales, Philox stream) and speculative fp32."""
    assert_kernel_valid("triton-replay", _std("sfp8a16-sr", L=4, steps=6,
                                              kernel_options={"kchunks": kchunks, "fold_unroll": 2}),
                        repeat_check=False)
    assert_kernel_valid("triton-replay", _spec("s32a32", steps=8, kernel_options={"kchunks": kchunks}),
                        repeat_check=False)


def test_prepass_stream_dot_readout():
    """Pre-pass path with every window readout S0 · C_s as one ieee fp32 tl.dot (vector_readout):
    speculative fp32 and standard fp16 state; kchunks > 1 with it is refused."""
    assert_kernel_valid("triton-replay", _spec("s32a32", steps=8, kernel_options={"vector_readout": True}),
                        repeat_check=False)
    assert_kernel_valid("triton-replay", _std("s16a16", L=4, steps=6, kernel_options={"vector_readout": True}),
                        repeat_check=False)
    with pytest.raises(ValueError, match="kchunks must be 1"):
        assert_kernel_valid("triton-replay", _spec("s32a32", steps=2,
                                                   kernel_options={"vector_readout": True, "kchunks": 2}))


@pytest.mark.parametrize("decode,mode", [("speculative", "s32a32"), ("standard", "sfp16a16")],
                         ids=["spec-s32a32", "std-sfp16a16"])
def test_prepass_split_readout(decode, mode):
    """Pre-pass path with every window readout S0 · C_s as bf16-part tensor-core products at fp32
    accuracy (split_readout): fp32 state and fp32 C (3 x 3 parts), fp16 state and bf16 C (2 x 1);
    the single kernel, the state_and_output route and the tf32 modes refuse it."""
    sc = (_spec(mode, steps=8, kernel_options={"split_readout": True}) if decode == "speculative"
          else _std(mode, L=4, steps=6, kernel_options={"split_readout": True}))
    assert_kernel_valid("triton-replay", sc, repeat_check=False)
    for name, opts, m in (("triton-replay", {"split_readout": True, "prepass": False}, mode),
                          ("triton-replay", {"split_readout": True}, "s32a16-tf32"),
                          ("triton-replay-state", {"split_readout": True}, mode)):
        with pytest.raises(ValueError, match="split_readout"):
            assert_kernel_valid(name, _spec(m, steps=2, kernel_options=opts))


@pytest.mark.parametrize("mode", ["s32a32-tf32", "s32a16-tf32x3"])
def test_fused_tensor_core_readouts(mode):
    """The single fused kernel (prepass off) with tf32 / tf32x3 readouts."""
    assert_kernel_valid("triton-replay", _spec(mode, steps=6, kernel_options={"prepass": False}),
                        repeat_check=False)


@pytest.mark.parametrize("prepass", [False, True], ids=["fused", "prepass"])
@pytest.mark.parametrize("decode", ["standard", "speculative"])
def test_gpu_default_paths(decode, prepass):
    """The GPU's default paths, which the interpreter does not take by default: per-position
    multiply-reduce readouts (standard), rank-1 flush fold (unrolled groups, here 8 > B so some
    positions are masked), with and without the prefetched checkpoint tile; for the single fused
    kernel and for the pre-pass + stream pair (replay_split.py)."""
    if decode == "standard":
        opts = {"vector_readout": False, "fold": "rank1", "prefetch": False, "prepass": prepass}
        sc = _std("s16a16", L=4, steps=6, kernel_options=opts)
    else:
        opts = {"vector_readout": False, "fold": "rank1", "fold_unroll": 8, "prefetch": True, "prepass": prepass}
        sc = _spec("sfp8a16-sr", steps=8, kernel_options=opts)
    assert_kernel_valid("triton-replay", sc, repeat_check=False)


# ---- the fused standard-decode step ------------------------------------------------------------------------


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"A": -1 - torch.rand(G.nheads, generator=g), "dt_bias": torch.rand(G.nheads, generator=g) - 0.5,
            "D": torch.rand(G.nheads, generator=g)}


def _build(name, mode, decode, slots=4, **options):
    return registry.build(name, KernelConfig(G, _params(), mode, decode, num_slots=slots, options=options))


def _inputs(rows, T, dtype, gen):
    out = {}
    for k, shp in G.input_shapes().items():
        t = torch.randn((rows, T, *shp), generator=gen)
        out[k] = (t - 2 if k == "dt" else t).to(dtype)
    return out


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same_snapshot(a, b):
    return (torch.equal(_bits(a.checkpoint), _bits(b.checkpoint)) and torch.equal(a.write_pos, b.write_pos)
            and all(torch.equal(_bits(a.records[k]), _bits(b.records[k])) for k in a.records)
            and torch.equal(a.extra["rng_counter"], b.extra["rng_counter"]))


@pytest.mark.parametrize("mode", ["s32a16", "s16a16-sr"])
def test_fused_step_equals_verify_then_commit(mode):
    a = _build("triton-replay", mode, DecodeConfig("standard", 1, 4))
    b = _build("triton-replay", mode, DecodeConfig("standard", 1, 4))
    gen = torch.Generator().manual_seed(3)
    ids = torch.tensor([2, -1, 0])
    init = torch.randn((3, *G.state_shape), generator=gen)
    a.reset(ids, init)
    b.reset(ids, init)
    for _ in range(9):  # two flushes
        inp = _inputs(3, 1, a.mode.act_dtype, gen)
        ya = a.verify(ids, inp)
        a.commit(ids, torch.ones(3, dtype=torch.int64))
        yb = b.step(ids, inp)
        assert torch.equal(_bits(ya), _bits(yb))
        assert _same_snapshot(a.snapshot(), b.snapshot())
    assert int(b.arrivals.abs().sum()) == 0


# ---- stored bytes are torch's casts ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["s16a16", "sfp8a16", "s32a16"])
def test_stored_bytes_are_round_to_nearest_even(mode):
    """One baseline step from a known state: the stored bf16 / fp8 state and the bf16 outputs are
    torch's round-to-nearest-even casts of the same fp32 values (computed here in fp32).  A
    truncating cast (the interpreter's bf16, spec 9) differs in about half of the elements."""
    k = _build("triton-baseline", mode, DecodeConfig("standard", 1, 1), slots=2)
    gen = torch.Generator().manual_seed(5)
    ids = torch.tensor([1, 0])
    s0 = torch.randn((2, *G.state_shape), generator=gen)
    k.reset(ids, s0)
    s0 = k.checkpoint_state(ids).float()
    inp = _inputs(2, 1, k.mode.act_dtype, gen)
    y = k.verify(ids, inp)
    p = _params()
    x, dt, B, C = (inp[n][:, 0].float() for n in ("x", "dt", "B", "C"))
    rep = G.nheads // G.ngroups
    delta = softplus(dt + p["dt_bias"])
    S = torch.exp(p["A"] * delta)[..., None, None] * s0 + (delta[..., None] * x)[..., None] * \
        B.repeat_interleave(rep, 1)[:, :, None, :]
    y32 = (S * C.repeat_interleave(rep, 1)[:, :, None, :]).sum(-1) + p["D"][:, None] * x
    snap = k.snapshot()
    if mode == "sfp8a16":
        scale = S.abs().amax(-1).clamp_min(1e-30) / 448.0
        stored, want = snap.checkpoint[[1, 0]], (S / scale[..., None]).to(torch.float8_e4m3fn)
    elif mode == "s16a16":
        stored, want = snap.checkpoint[[1, 0]], S.to(torch.bfloat16)
    else:
        stored, want = y[:, 0], y32.to(torch.bfloat16)
    differ = (_bits(stored) != _bits(want)).float().mean().item()
    # fp32 arithmetic order (FMA, summation) moves a value across a rounding boundary in < 2 % of
    # the elements (measured 0-0.6 %); truncation would be ~50 %
    assert differ < 0.02, f"{differ:.1%} of the stored elements differ from torch's cast"


# ---- bookkeeping edges ------------------------------------------------------------------------------------------


def test_snapshot_restore_resumes_bit_for_bit():
    dec = DecodeConfig("speculative", 3, 4)
    a = _build("triton-replay", "sfp8a16-sr", dec)
    gen = torch.Generator().manual_seed(7)
    ids = torch.tensor([3, 1])
    a.reset(ids, torch.randn((2, *G.state_shape), generator=gen), torch.tensor([5, 2]))
    steps = [(_inputs(2, 3, torch.bfloat16, gen), torch.tensor([2, 3])) for _ in range(8)]
    for inp, acc in steps[:3]:
        a.verify(ids, inp)
        a.commit(ids, acc)
    snap = a.snapshot()
    b = _build("triton-replay", "sfp8a16-sr", dec)
    b.restore(snap)
    for inp, acc in steps[3:]:
        ya, yb = a.verify(ids, inp), b.verify(ids, inp)
        assert torch.equal(_bits(ya), _bits(yb))
        a.commit(ids, acc)
        b.commit(ids, acc)
    assert _same_snapshot(a.snapshot(), b.snapshot())


def test_stochastic_rounding_seeded_and_fresh_after_slot_reuse():
    dec = DecodeConfig("standard", 1, 1)
    gen = torch.Generator().manual_seed(9)
    ids = torch.tensor([0])
    init = torch.randn((1, *G.state_shape), generator=gen)
    inp = _inputs(1, 1, torch.bfloat16, gen)

    def run(mode, resets=1):
        k = _build("triton-baseline", mode, dec, slots=1)
        for _ in range(resets):
            k.reset(ids, init)
        k.verify(ids, inp)
        return k.snapshot().checkpoint

    a = run("s16a16-sr3")
    assert torch.equal(_bits(a), _bits(run("s16a16-sr3")))
    assert not torch.equal(_bits(a), _bits(run("s16a16-sr4")))
    assert not torch.equal(_bits(a), _bits(run("s16a16-sr3", resets=2))), "a re-admitted slot reused its stream"


@pytest.mark.parametrize("name,mode,why", [
    ("triton-replay", "s64a64", "compute in fp32"), ("triton-replay", "si8a16", "int8 states are not"),
    ("triton-baseline", "s32a16-tf32", "readout dot tf32"), ("triton-replay-state", "s32a16", "route")])
def test_unsupported_modes_are_refused(name, mode, why):
    opts = {"route": "output_only"} if name == "triton-replay-state" else {}
    with pytest.raises(ValueError, match=why):
        _build(name, mode, DecodeConfig("standard", 1, 4), **opts)


def test_bad_input_is_refused_before_anything_changes():
    k = _build("triton-replay", "s32a16", DecodeConfig("speculative", 2, 4))
    gen = torch.Generator().manual_seed(1)
    ids = torch.tensor([1, -1])
    k.reset(ids)
    good = _inputs(2, 2, torch.bfloat16, gen)
    before = k.snapshot()
    bad = [
        (ids, {**good, "x": good["x"].float()}, "dtype"),
        (ids, {**good, "B": good["B"][:, :1]}, "shape"),
        (ids, {**good, "x": good["x"].transpose(2, 3).contiguous().transpose(2, 3)}, "contiguous"),
        (torch.tensor([4, -1]), good, "slot"),
        (torch.tensor([1, 1]), good, "twice"),
        (torch.tensor([2, -1]), good, "never reset"),
    ]
    for slot_ids, inp, what in bad:
        with pytest.raises(ValueError, match=what):
            k.verify(slot_ids, inp)
    with pytest.raises(ValueError, match="no verify"):
        k.commit(ids, torch.tensor([1, 1]))
    k.verify(ids, good)
    with pytest.raises(ValueError, match="accepted"):
        k.commit(ids, torch.tensor([3, 1]))
    corrupt = k.snapshot()
    corrupt.write_pos[1] = 7  # beyond B: a cursor the device could hold after a bug elsewhere
    k.restore(corrupt)
    after = k.snapshot()
    with pytest.raises(ValueError, match="write_pos"):
        k.verify(ids, good)
    assert _same_snapshot(after, k.snapshot())
    assert torch.equal(before.checkpoint, after.checkpoint)


def test_no_cuda_device_is_a_clear_error(monkeypatch):
    import replayssm.ops.mamba2.triton_common as tc
    monkeypatch.setattr(tc, "INTERPRET", False)
    with pytest.raises(ValueError, match="CUDA device"):
        _build("triton-replay", "s32a16", DecodeConfig("standard", 1, 4))


def test_path_choice_by_rows(monkeypatch):
    """The automatic path on the GPU (the interpreter flag turned off, as on a GPU): the single fused
    kernel below 8 rows, the pre-pass path from there up (the speculative verify with PDL: always; the
    speculative stream's readouts over the whole dstate tile unless ``kchunks`` says otherwise);
    ``prepass`` overrides; the state_and_output route always runs the single kernel."""
    import replayssm.ops.mamba2.replay as rp
    k = _build("triton-replay", "s32a16", DecodeConfig("standard", 1, 4))
    spec = _build("triton-replay", "s32a16", DecodeConfig("speculative", 4, 16))
    monkeypatch.setattr(rp, "INTERPRET", False)
    assert [k.use_split(r) for r in (1, 7, 8, 16, 512)] == [False, False, True, True, True]
    assert [spec.use_split(r) for r in (1, 7, 8, 16, 512)] == [False, False, True, True, True]
    spec.pdl_active = True  # as on an sm_90 GPU, where the speculative verify launches the pair with PDL: always
    assert [spec.use_split(r) for r in (1, 7, 8, 512)] == [True, True, True, True]
    k.pdl_active = True  # (standard decode keeps PDL off by default; given, the rows rule is unchanged)
    assert [k.use_split(r) for r in (1, 7, 8)] == [False, False, True]
    whole = _build("triton-replay", "s32a16", DecodeConfig("speculative", 4, 16))
    assert [whole.chunks_for(r) for r in (8, 31, 32, 512)] == [1, 1, 1, 1]
    fixed = _build("triton-replay", "s32a16", DecodeConfig("speculative", 4, 16), kchunks=2)
    assert [fixed.chunks_for(r) for r in (8, 512)] == [2, 2]
    assert not _build("triton-replay", "s32a16", DecodeConfig("standard", 1, 4), prepass=False).use_split(512)
    assert _build("triton-replay", "s32a16", DecodeConfig("standard", 1, 4), prepass=True).use_split(1)
    assert not _build("triton-replay-state", "s32a16", DecodeConfig("standard", 1, 4)).use_split(512)


@pytest.mark.parametrize("option", [{"prepass": True}, {"kchunks": 4}, {"coef_warps": 2}])
def test_baseline_refuses_replay_path_options(option):
    with pytest.raises(ValueError, match="unknown option"):
        _build("triton-baseline", "s32a16", DecodeConfig("standard", 1, 1), **option)
