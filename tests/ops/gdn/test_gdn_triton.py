"""GDN Triton kernels on the CPU (Triton interpreter): the kernels through the validation engine,
snapshot/restore, the raw launch path and bad input (their rounding helpers are
tests/core/test_triton_rounding.py's).

Oracles: ``run_scenario`` (fp64 reference, literal model at the same mode with the tolerance rule,
exact invariants, repeat bit-identity).
Geometry: 1 key head, 2 value heads, K = 16, V = 8, so the interpreter (one numpy program per
grid cell) stays fast.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

GEO = {"family": "gdn", "num_k_heads": 1, "num_v_heads": 2, "head_k_dim": 16, "head_v_dim": 8}
SUPPORTED = ("s32a32", "s32a16", "s32afp16", "s16a16", "s16a16-sr", "sfp16a16", "sfp16a16-sr", "sfp16afp16",
             "sfp8a16", "sfp8a16-sr")
KERNELS = ("triton-replay", "triton-baseline")


def _sc(mode, decode, T, B, schedule, steps=None, geometry=GEO, **kw) -> Scenario:
    return Scenario(family="gdn", geometry=geometry, mode=mode, decode=decode, window=T, buffer=B, rows=3,
                    num_slots=4, slot_ids=(2, -1, 0), schedule=schedule, steps=steps, **kw)


def _check(res):
    assert res.exception is None, res.exception
    assert res.passed, [str(f) for f in res.failures[:5]]


# ---- through the engine --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KERNELS)
def test_exhaustive_standard(name):
    _check(run_scenario(_sc("s32a16", "standard", 1, 4, "exhaustive"), name))


# bv2x2-tiles2 (two value blocks) is in the slow tier for ./dev test's 10 minutes; test_prepass_readout_variants'
# spec-s32a32-bv4x2 keeps value blocks and tiles in every run.
@pytest.mark.parametrize("options", [{"block_v": 4}, pytest.param({"block_v": 2, "tiles": 2}, marks=pytest.mark.slow)],
                         ids=["bv4x2", "bv2x2-tiles2"])
def test_exhaustive_standard_fused(options):
    """The single-kernel standard decode (prepass off), split over two programs (ticket), of one and
    of two value blocks (the history's coefficients computed once per program)."""
    _check(run_scenario(_sc("s32a16", "standard", 1, 4, "exhaustive", kernel_options={"prepass": False, **options}),
                        "triton-replay"))


# replay-bv4 (68 s of a loaded 2-core run, 2026-12-01) and replay-tile (12.5 s idle) are in the slow tier
# for ./dev test's 10 minutes: two value blocks per head also run in test_prepass_readout_variants (bv4x2)
# and test_exhaustive_standard_fused, the tile kernel in test_long_window_generic_kernel.  replay (the
# pre-pass path, 21.6 s of an idle 2-core run at c28c32a) too: its speculative verify runs in every run in
# test_every_supported_mode (flush and slot reuse, every mode) and test_prepass_readout_variants (spec-*);
# baseline (9.0 s at c28c32a) likewise: its speculative path runs in test_every_supported_mode.
@pytest.mark.parametrize("name,options", [pytest.param("triton-replay", {}, marks=pytest.mark.slow),
                                          pytest.param("triton-baseline", {}, marks=pytest.mark.slow),
                                          pytest.param("triton-replay", {"block_v": 4}, marks=pytest.mark.slow),
                                          pytest.param("triton-replay", {"readout": "tile"}, marks=pytest.mark.slow),
                                          ("triton-replay", {"prepass": False})],
                         ids=["replay", "baseline", "replay-bv4", "replay-tile", "replay-fused"])
def test_exhaustive_speculative(name, options):
    """Every k at every ring phase (empty, mid, last non-flush, flush, wrap), origins != 0;
    block_v=4 splits each value head over two programs (shared record writers); ``tile``
    runs the generic [T', *] single kernel that T' > 4 uses; ``prepass: False`` the single kernel
    written out token by token for T' <= 4 (the default is the pre-pass + stream pair)."""
    _check(run_scenario(_sc("s32a16", "speculative", 3, 4, "exhaustive", kernel_options=options), name))


def test_long_window_generic_kernel():
    """T' = 5 > 4: the generic tile kernel by default."""
    _check(run_scenario(_sc("s32a16", "speculative", 5, 5, "per-row", steps=5), "triton-replay",
                        repeat_check=False))


@pytest.mark.parametrize("L", [1, 2, 8])
def test_standard_buffer_lengths(L):
    _check(run_scenario(_sc("s32a16", "standard", 1, L, "random", steps=L + 2), "triton-replay",
                        repeat_check=False))


@pytest.mark.parametrize("mode", SUPPORTED)
@pytest.mark.parametrize("name", KERNELS)
def test_every_supported_mode(name, mode):
    """Speculative with a flush and slot reuse (every store path: checkpoint, records, drafts)."""
    sr = mode.endswith("-sr")
    sc = _sc(mode, "speculative", 2, 2, "slot-reuse", steps=4, schedule_params={"reset_prob": 0.3})
    _check(run_scenario(sc, name, repeat_check=sr))  # repeat: stochastic rounding is reproducible


def test_standard_decode_every_state_dtype():
    for mode in ("s16a16-sr", "sfp16afp16", "sfp8a16-sr"):
        _check(run_scenario(_sc(mode, "standard", 1, 2, "random", steps=3), "triton-replay", repeat_check=False))


# ---- snapshot / restore, raw path ----------------------------------------------------------------------


def _kernel(name, mode="s16a16-sr", decode=None, checks=True, slots=3):
    from replayssm.families import geometry_from_dict
    decode = decode or DecodeConfig("speculative", 2, 3)
    g = geometry_from_dict(GEO)
    gen = torch.Generator().manual_seed(5)
    params = {"A_log": torch.rand(2, generator=gen).log(), "dt_bias": torch.rand(2, generator=gen) - 0.5}
    return get(name, "gdn")(KernelConfig(g, params, mode, decode, num_slots=slots, options={"checks": checks})), g


def _steps(kern, g, n, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([2, -1, 0])
    T = kern.decode.window
    outs = []
    for i in range(n):
        inp = {k: torch.randn((3, T, *s), generator=gen).to(kern.mode.act_dtype) for k, s in g.input_shapes().items()}
        out = torch.zeros((3, T, *g.out_shape), dtype=kern.mode.act_dtype)
        kern.verify(ids, inp, out)
        kern.commit(ids, torch.tensor([1 + i % T, 1, T]))
        outs.append(out)
    return outs


@pytest.mark.parametrize("name", KERNELS)
def test_snapshot_restore_resumes_bit_for_bit(name):
    a, g = _kernel(name)
    ids = torch.tensor([2, -1, 0])
    a.reset(ids, torch.randn((3, *g.state_shape), generator=torch.Generator().manual_seed(0)),
            torch.tensor([1, 0, 3]))
    _steps(a, g, 3, seed=1)
    snap = a.snapshot()
    assert set(snap.records) == ({"d", "k", "g"} if name == "triton-replay" else set())
    want = _steps(a, g, 3, seed=2)
    b, _ = _kernel(name)
    b.restore(snap)
    got = _steps(b, g, 3, seed=2)
    for x, y in zip(want, got):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    sa, sb = a.snapshot(), b.snapshot()
    assert torch.equal(sa.checkpoint.view(torch.int16), sb.checkpoint.view(torch.int16))
    assert torch.equal(sa.write_pos, sb.write_pos) and torch.equal(sa.origin, sb.origin)


@pytest.mark.parametrize("decode", [DecodeConfig("standard", 1, 3), DecodeConfig("speculative", 2, 3)],
                         ids=["standard", "speculative"])
@pytest.mark.parametrize("name", KERNELS)
def test_raw_path_equals_checked_path(name, decode):
    """checks=False (benchmarks, CUDA graphs) launches the same kernels: bit-identical results."""
    outs, snaps = [], []
    for checks in (True, False):
        k, g = _kernel(name, "sfp8a16-sr", decode, checks=checks)
        k.reset(torch.tensor([2, -1, 0]), torch.randn((3, *g.state_shape), generator=torch.Generator().manual_seed(0)))
        outs.append(_steps(k, g, 4, seed=3))
        snaps.append(k.snapshot())
    for x, y in zip(*outs):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert torch.equal(snaps[0].checkpoint.view(torch.uint8), snaps[1].checkpoint.view(torch.uint8))
    assert torch.equal(snaps[0].write_pos, snaps[1].write_pos)


# ---- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,mode,why", [
    (n, m, w) for n in KERNELS for m, w in (("si8a16", "state dtype int8"), ("s64a64", "fp64"), ("s32a16-tf32", "ieee"))
    if not (n == "triton-replay" and "tf32" in m)])  # the replay pre-pass path has tensor-core readouts (below)
def test_unsupported_modes_refused(name, mode, why):
    with pytest.raises(ValueError, match=why):
        _kernel(name, mode)


@pytest.mark.parametrize("options", [{"prepass": False}, {"kchunks": 2}], ids=["fused", "kchunks2"])
def test_tensor_core_readout_only_on_the_prepass_path(options):
    g = _kernel("triton-replay")[1]
    cfg = KernelConfig(g, {"A_log": torch.zeros(2), "dt_bias": torch.zeros(2)}, "s32a16-tf32x3",
                       DecodeConfig("standard", 1, 4), num_slots=2, options=options)
    with pytest.raises(ValueError, match="ieee"):
        get("triton-replay", "gdn")(cfg)


# spec-tf32x3, spec-s32a32-dot and std-s16a32-dot-x2 are in the slow tier (9, 9 and 6 s of an idle 2-core
# run, 2026-12-01, for ./dev test's 10 minutes): std-tf32 keeps the tensor-core readout in every run;
# spec-fp8sr-kc2 too (10.9 s at c28c32a): std-s32a32-kc4 keeps the dstate chunks, test_every_supported_mode
# the speculative fp8 SR stores; and std-fp8sr-bv4x2 (11.5 s): spec-s32a32-bv4x2 keeps two value blocks and
# tiles, test_standard_decode_every_state_dtype the standard fp8 SR store.
_SLOW = pytest.mark.slow
@pytest.mark.parametrize("decode,mode,options", [
    pytest.param("speculative", "s32a32-tf32x3", {}, marks=_SLOW), ("standard", "s32a16-tf32", {}),
    pytest.param("speculative", "sfp8a16-sr", {"kchunks": 2}, marks=_SLOW), ("standard", "s32a32", {"kchunks": 4}),
    pytest.param("standard", "sfp8a16-sr", {"block_v": 4, "tiles": 2}, marks=_SLOW),
    ("speculative", "s32a32", {"block_v": 4, "tiles": 2}),
    pytest.param("speculative", "s32a32", {"readout": "dot"}, marks=_SLOW),
    pytest.param("standard", "s16a32", {"readout": "dot", "tiles": 2}, marks=_SLOW),
    ("speculative", "s32a32", {"readout": "split"}),
    pytest.param("standard", "sfp16a32", {"readout": "split"}, marks=_SLOW)],
    ids=["spec-tf32x3", "std-tf32", "spec-fp8sr-kc2", "std-s32a32-kc4", "std-fp8sr-bv4x2", "spec-s32a32-bv4x2",
         "spec-s32a32-dot", "std-s16a32-dot-x2", "spec-s32a32-split", "std-sfp16a32-split"])
def test_prepass_readout_variants(decode, mode, options):
    """The pre-pass path's other readouts: one tensor-core dot for every S_0 k / S_0 q of the window
    (tf32, tf32x3; full fp32 under the interpreter; ieee fp32 with readout=dot; bf16 parts at fp32
    accuracy with readout=split: s32a32, where a bf16-accurate readout fails the state check by 350x),
    dstate chunks summed in-thread (kchunks), and several blocks of value rows per stream program (tiles).
    Speculative: per-row acceptance over 8
    verifies (flushes, ring wrap, every k) -- the exhaustive schedule runs on the default path above."""
    if decode == "speculative":
        sc = _sc(mode, decode, 3, 4, "per-row", steps=8, kernel_options=options)
    else:
        sc = _sc(mode, decode, 1, 4, "exhaustive", kernel_options=options)
    _check(run_scenario(sc, "triton-replay"))


@pytest.mark.parametrize("options,why,mode", [
    ({"block_v": 3}, "power of two", "s32a16"), ({"readout": "fma"}, "readout", "s32a16"),
    ({"colour": 1}, "unknown option", "s32a16"), ({"readout": "split"}, "ieee modes", "s32a16-tf32"),
    ({"readout": "split", "prepass": False}, "pre-pass path", "s32a16")],
    ids=["bv3", "fma", "colour", "split-tf32", "split-fused"])
def test_bad_options_refused(options, why, mode):
    g = _kernel("triton-replay")[1]
    cfg = KernelConfig(g, {"A_log": torch.zeros(2), "dt_bias": torch.zeros(2)}, mode,
                       DecodeConfig("standard", 1, 4), num_slots=2, options=options)
    with pytest.raises(ValueError, match=why):
        get("triton-replay", "gdn")(cfg)


@pytest.mark.parametrize("name", KERNELS)
def test_bad_input_raises_before_any_change(name):
    k, g = _kernel(name)
    ids = torch.tensor([2, -1, 0])
    k.reset(ids)
    gen = torch.Generator().manual_seed(0)
    good = {n: torch.randn((3, 2, *s), generator=gen).to(torch.bfloat16) for n, s in g.input_shapes().items()}
    before = k.snapshot()
    bad_calls = {
        "inputs\\['q'\\]: expected dtype": lambda: k.verify(ids, {**good, "q": good["q"].float()}),
        "inputs\\['v'\\]: expected shape": lambda: k.verify(ids, {**good, "v": good["v"][:, :1]}),
        "inputs\\['k'\\]: expected a contiguous": lambda: k.verify(
            ids, {**good, "k": good["k"].transpose(0, 1).contiguous().transpose(0, 1)}),
        "slot_ids\\[0\\]: expected a slot": lambda: k.verify(torch.tensor([7, -1, 0]), good),
        "an active slot appears twice": lambda: k.verify(torch.tensor([0, -1, 0]), good),
        "slot 1 was never reset": lambda: k.verify(torch.tensor([2, -1, 1]), good),
        "has no verify to commit": lambda: k.commit(ids, torch.tensor([1, 1, 1])),
        "out: expected shape": lambda: k.verify(ids, good, torch.empty(3, 1, *g.out_shape, dtype=torch.bfloat16)),
    }
    for msg, call in bad_calls.items():
        with pytest.raises(ValueError, match=msg):
            call()
    _assert_same(before, k.snapshot())
    k.verify(ids, good)
    before = k.snapshot()
    with pytest.raises(ValueError, match="accepted\\[0\\]: expected 1 <= k"):
        k.commit(ids, torch.tensor([3, 1, 1]))
    _assert_same(before, k.snapshot())


def _assert_same(a, b):
    from replayssm.validators.engine.invariants import bits_equal
    assert bits_equal(a.checkpoint, b.checkpoint)
    assert all(bits_equal(a.records[n], b.records[n]) for n in a.records)
    for f in ("write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert all(bits_equal(a.extra[n], b.extra[n]) for n in a.extra)


def test_default_warps_of_the_single_kernel():
    """On the GPU the speculative verify's single kernel (below 16 rows) runs 16 value rows on one
    warp (measured 1.85x faster than two at batch 8, docs/benchmarks.md); standard decode keeps about
    32 state elements per thread; an explicit num_warps wins."""
    from replayssm.families import preset
    g = preset("qwen35-4b", "gdn")
    params = {"A_log": torch.zeros(g.num_v_heads), "dt_bias": torch.zeros(g.num_v_heads)}

    def build(decode, **options):
        k = get("triton-replay", "gdn")(KernelConfig(g, params, "s32a16", decode, num_slots=1, options=options))
        k.interpret = False
        return k
    spec, std = build(DecodeConfig("speculative", 4, 16)), build(DecodeConfig("standard", 1, 16))
    assert spec.launch_shape(8) == (16, 8, 1)
    assert std.launch_shape(8) == (8, 16, 1)  # 8 rows x 128 keys: 32 per thread on one warp
    assert build(DecodeConfig("speculative", 4, 16), num_warps=2).launch_shape(8)[2] == 2
    kda = get("triton-replay", "kda")
    assert not kda.SPEC_ONE_WARP  # KDA's verify keeps launch_shape's default (not measured on one warp)


def test_path_choice_by_rows():
    """The automatic path on the GPU: the single kernel below 16 rows (8 with PDL), the pre-pass path above,
    always the pre-pass path for tensor-core readouts; ``prepass`` overrides; a whole value head per
    stream program from 128 rows up (here checked on the decision functions, with the interpreter
    flag turned off as on a GPU)."""
    k = _kernel("triton-replay", "s32a16", DecodeConfig("standard", 1, 4))[0]
    k.interpret = False
    assert [k.use_split(r) for r in (1, 15, 16, 512)] == [False, False, True, True]
    k.pdl_active = True  # as on an sm_90 GPU, where standard decode launches the pair with PDL: from 8 rows
    assert [k.use_split(r) for r in (1, 7, 8, 512)] == [False, False, True, True]
    assert k.split_tiles(64, 16) == 1 and k.split_tiles(128, 16) == 16
    forced = _kernel("triton-replay", "s32a16", DecodeConfig("standard", 1, 4))[0]
    forced.prepass, forced.interpret = False, False
    assert not forced.use_split(512)
    g = _kernel("triton-replay")[1]
    cfg = KernelConfig(g, {"A_log": torch.zeros(2), "dt_bias": torch.zeros(2)}, "s32a16-tf32x3",
                       DecodeConfig("standard", 1, 4), num_slots=2)
    tc = get("triton-replay", "gdn")(cfg)
    tc.interpret = False
    assert tc.use_split(1)


@pytest.mark.parametrize("option", [{"prepass": True}, {"tiles": 2}, {"kchunks": 2}])
def test_baseline_refuses_replay_path_options(option):
    g = _kernel("triton-replay")[1]
    cfg = KernelConfig(g, {"A_log": torch.zeros(2), "dt_bias": torch.zeros(2)}, "s32a16",
                       DecodeConfig("standard", 1, 1), num_slots=2, options=option)
    with pytest.raises(ValueError, match="unknown option"):
        get("triton-baseline", "gdn")(cfg)
