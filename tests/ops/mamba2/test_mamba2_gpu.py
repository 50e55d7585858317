"""The Mamba-2 Triton kernels on a CUDA GPU at serving geometries (nano4b, super120b), batch 1-512.

Oracle: the validation engine (fp64 recurrence on the accepted stream; the literal model at the
same precision mode for the tolerance rule; exact invariants where snapshots are affordable) and,
for CUDA graphs, the same kernel run eagerly.  Expected: every check passes; a tf32 readout has
a measurably larger error than ieee (the GPU really rounds the dot operands) and stays inside the
literal tf32 model's bound; a captured graph replays bit-identically.

Skipped without CUDA (CI has none; the interpreter runs of tests/ops/mamba2/test_mamba2_triton.py cover the
bookkeeping there).  Large batches sample the per-row literal model (``literal_every``) and skip
the full-state snapshots (``invariants_every=steps``: the first and last step); the exact invariants run at batch 4-8.
"""

import pytest
import torch
from gpu_tiers import BIG_MEMORY, in_merge_tier, mode_path_in_merge_tier, tiered

from replayssm.families import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.registry import build
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.pytest_plugin import assert_kernel_valid

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

MODES = ("s32a32", "s32a16", "s32afp16", "s16a16", "s16a16-sr", "sfp16a16", "sfp16a16-sr", "sfp16afp16",
         "sfp8a16", "sfp8a16-sr", "s32a32-tf32", "s32a16-tf32x3")
NO_TF32_BASELINE = tuple(m for m in MODES if "tf32" not in m)


def _sc(geometry, decode, batch, mode="s32a16", schedule="random", steps=None, L=16, **kw):
    if decode == "standard":
        return Scenario.build("mamba2", decode="standard", batch=batch, geometry=geometry, mode=mode, buffer=L,
                              schedule="always-1", steps=steps if steps is not None else L + 2, **kw)
    return Scenario.build("mamba2", decode="speculative", batch=batch, geometry=geometry, mode=mode, window=4,
                          buffer=16, schedule=schedule, steps=steps, **kw)


def _large(batch, steps):
    """Engine sampling for big batches: two literal-model steps, states every few steps."""
    if batch < 64:
        return {}
    return {"literal_every": max(1, steps // 2), "invariants_every": steps, "state_every": 4, "repeat_check": False}


MODE_PATHS = [(m, p) for m in MODES for p in ("prepass", "fused")]


@pytest.mark.parametrize("mode,path", tiered(MODE_PATHS, mode_path_in_merge_tier,
                                             ids=[f"{m}-{p}" for m, p in MODE_PATHS]))
def test_replay_every_mode_nano4b(mode, path):
    """Both paths of "triton-replay" at batch 4 (the automatic choice there is the fused kernel; the
    pre-pass path is the default from 8 rows up)."""
    opts = {"prepass": path == "prepass"}
    assert_kernel_valid("triton-replay", _sc("nano4b", "speculative", 4, mode, steps=10, kernel_options=opts),
                        device="cuda", repeat_check="-sr" in mode)
    assert_kernel_valid("triton-replay", _sc("nano4b", "standard", 4, mode, L=8, steps=10, kernel_options=opts),
                        device="cuda", repeat_check=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["s32a32", "sfp16a16", "sfp8a16"])
def test_replay_split_readout_nano4b(mode):
    """The stream's window readouts as bf16-part tensor-core products (``split_readout``, an option):
    fp32-accurate on the GPU's tensor cores, batch 8 (the pre-pass path), both decodes."""
    opts = {"split_readout": True}
    assert_kernel_valid("triton-replay", _sc("nano4b", "speculative", 8, mode, steps=10, kernel_options=opts),
                        device="cuda", repeat_check=False)
    assert_kernel_valid("triton-replay", _sc("nano4b", "standard", 8, mode, L=8, steps=10, kernel_options=opts),
                        device="cuda", repeat_check=False)


@pytest.mark.parametrize("mode", tiered(("s32a16", "s32a32", "s16a16-sr", "sfp8a16-sr"), in_merge_tier))
def test_replay_pdl_nano4b(mode):
    """The pre-pass path with programmatic dependent launch (``pdl``, an option: the stream starts during
    its pre-pass, its first checkpoint tile's load in flight before it waits), batch 8, both decodes."""
    opts = {"prepass": True, "pdl": True}
    assert_kernel_valid("triton-replay", _sc("nano4b", "speculative", 8, mode, steps=10, kernel_options=opts),
                        device="cuda", repeat_check="-sr" in mode)
    assert_kernel_valid("triton-replay", _sc("nano4b", "standard", 8, mode, steps=18, kernel_options=opts),
                        device="cuda", repeat_check="-sr" in mode)


@pytest.mark.parametrize("mode", tiered(NO_TF32_BASELINE, in_merge_tier))
def test_baseline_every_mode_nano4b(mode):
    assert_kernel_valid("triton-baseline", _sc("nano4b", "standard", 4, mode, L=1, steps=4), device="cuda",
                        repeat_check="-sr" in mode)
    assert_kernel_valid("triton-baseline", _sc("nano4b", "speculative", 4, mode, steps=4), device="cuda",
                        repeat_check=False)


@pytest.mark.parametrize("mode", tiered(["s32a16", "s16a16-sr", "sfp8a16", "s32a32-tf32"], in_merge_tier))
def test_replay_state_route_nano4b(mode):
    assert_kernel_valid("triton-replay-state", _sc("nano4b", "standard", 4, mode, L=8, steps=10), device="cuda",
                        repeat_check=False)
    assert_kernel_valid("triton-replay-state", _sc("nano4b", "speculative", 4, mode, steps=8), device="cuda",
                        repeat_check=False)


@pytest.mark.parametrize("geometry", tiered(["nano4b", "super120b"], lambda g: g == "nano4b"))
def test_speculative_exhaustive_schedule(geometry):
    assert_kernel_valid("triton-replay", _sc(geometry, "speculative", 8, "s32a16", schedule="exhaustive"),
                        device="cuda")


@pytest.mark.parametrize("L", tiered([1, 4, 8, 16, 32], lambda L: L in (1, 16),
                                     ids=[f"s32a16-L{L}-T1-nano4b" for L in (1, 4, 8, 16, 32)]))
def test_standard_decode_every_buffer_length(L):
    assert_kernel_valid("triton-replay", _sc("nano4b", "standard", 8, "s32a16", L=L, steps=L + 2), device="cuda",
                        repeat_check=False)


BATCHES = [("nano4b", 1), ("nano4b", 32), ("nano4b", 128), ("nano4b", 512), ("super120b", 1), ("super120b", 128),
           ("super120b", 512)]


KERNEL_DECODES = [("triton-replay", "standard"), ("triton-replay", "speculative"), ("triton-baseline", "standard"),
                  ("triton-baseline", "speculative")]
# The speculative baseline keeps T' + 1 states per slot (and its literal twin T' more): at batch 512
# that is ~40 GB for one run, so it is timed and fp64-checked there by the benchmark instead.
BATCH_CASES = [(g, b, n, d) for g, b in BATCHES for n, d in KERNEL_DECODES
               if not (b >= 512 and (n, d) == ("triton-baseline", "speculative"))]


def _batch_merge_tier(case) -> bool:
    """The merge tier (tests/gpu_tiers.py): batch 1 and 512 at nano4b."""
    geometry, batch, _, _ = case
    return geometry == "nano4b" and batch in (1, 512)


@pytest.mark.parametrize("geometry,batch,name,decode",
                         tiered(BATCH_CASES, _batch_merge_tier, marks=lambda c: (BIG_MEMORY,) * (c[1] >= 512),
                                ids=[f"{n}-{d}-s32a16-{g}-b{b}" for g, b, n, d in BATCH_CASES]))
def test_batch_sizes(geometry, batch, name, decode):
    steps = 18 if decode == "standard" and name == "triton-replay" else 8
    extra = {"num_slots": batch + 1} if batch >= 64 else {}
    sc = _sc(geometry, decode, batch, "s32a16", steps=steps, L=16 if name == "triton-replay" else 1, **extra)
    assert_kernel_valid(name, sc, device="cuda", **_large(batch, steps))


def _run_errors(mode, steps=12):
    from replayssm.validators.engine.runner import run_scenario
    res = run_scenario(_sc("nano4b", "speculative", 4, mode, steps=steps), "triton-replay", device="cuda",
                       repeat_check=False)
    assert res.passed, res.headline()
    return max(res.metrics["rel_l2"])


def test_tf32_readout_is_really_tf32():
    """The interpreter runs tf32 dots in fp32; on the GPU the tf32 readout must show tf32-size
    error (operands rounded to 10 mantissa bits), well above ieee, and still pass the tolerance
    rule against the literal tf32 model (checked inside _run_errors)."""
    ieee, tf32, x3 = _run_errors("s32a32"), _run_errors("s32a32-tf32"), _run_errors("s32a32-tf32x3")
    assert tf32 > 10 * ieee, f"tf32 readout error {tf32:.2e} is not above ieee {ieee:.2e}: tf32 not applied?"
    assert x3 < 0.1 * tf32, f"tf32x3 error {x3:.2e} should be near fp32, not tf32 {tf32:.2e}"


def _params(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {"A": (-1 - torch.rand(g.nheads, generator=gen)).cuda(),
            "dt_bias": (torch.rand(g.nheads, generator=gen) - 0.5).cuda(),
            "D": torch.rand(g.nheads, generator=gen).cuda()}


def _inputs(g, rows, T, gen):
    out = {}
    for k, shp in g.input_shapes().items():
        t = torch.randn((rows, T, *shp), generator=gen, device="cuda")
        out[k] = (t - 2 if k == "dt" else t).to(torch.bfloat16)
    return out


@pytest.mark.parametrize("decode", ["standard", "speculative"])
def test_cuda_graph_replay_is_bit_identical_to_eager(decode):
    """verify/commit (speculative) and the fused step (standard) captured in a CUDA graph: the
    cursors live on the device, so replaying the graph walks the same cycle as eager launches."""
    g = preset("nano4b", "mamba2")
    dec = DecodeConfig("standard", 1, 4) if decode == "standard" else DecodeConfig("speculative", 4, 8)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.tensor([5, -1, 2, 0], device="cuda")
    init = torch.randn((4, *g.state_shape), generator=gen, device="cuda")
    steps = [(_inputs(g, 4, dec.window, gen), torch.randint(1, dec.window + 1, (4,), generator=gen, device="cuda"))
             for _ in range(6)]
    kernels = [build("triton-replay", KernelConfig(g, _params(g), "s32a16", dec, num_slots=6, device="cuda",
                                                   options={"checks": False})) for _ in range(2)]
    outs = [[torch.full((4, dec.window, *g.out_shape), float("nan"), dtype=torch.bfloat16, device="cuda")
             for _ in steps] for _ in kernels]

    def run(k, o):
        for (inp, acc), out in zip(steps, o):
            if decode == "standard":
                k.launch_step(ids, inp, out)
            else:
                k.launch_verify(ids, inp, out)
                k.launch_commit(ids, acc)

    for k in kernels:
        k.reset(ids, init)
    run(kernels[0], outs[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(kernels[1], outs[1])
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(outs[0], outs[1]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    sa, sb = kernels[0].snapshot(), kernels[1].snapshot()
    assert torch.equal(sa.checkpoint, sb.checkpoint) and torch.equal(sa.write_pos, sb.write_pos)
    assert torch.equal(sa.origin, sb.origin)
