"""The two-launch replay path (pre-pass + checkpoint stream) on a GPU, one configuration at a time.

``times``: where a replay step's time goes.  Each phase of the two-launch replay path timed alone
(CUDA graph of one step over rotated slot sets; the graph pins every slot's cursor before each step),
against the traffic model's bytes of that phase.  Phases: ``nonflush`` (a verify at write_pos 8),
``flush`` (the flush verify), ``coef`` (the pre-pass alone, non-flush), ``stream`` (the checkpoint
stream alone, non-flush); with ``{"prepass": false}`` in standard decode the one-launch kernel's
``nonflush`` and ``flush`` steps.  Prints one JSON line.

``profile``: the launches of the same path for ``ncu`` (eager, no graph): ``PROFILE_STEPS`` (default 6)
verify/commit steps from a fresh state (standard decode: step ``i`` runs at write_pos ``i mod 16``,
step 15 is the flush).

Both build one "triton-replay" instance of the family at its benchmark geometry (nano4b /
qwen35-4b) from the installed ``replayssm`` package.

Usage: python tools/split_phases.py times|profile FAMILY DECODE BATCH '{"num_warps": 2}' [MODE]
       [--kernel triton-baseline]  (profile only: the baseline's launches instead)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from replayssm.families import family as family_of
from replayssm.families import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.ops.gdn import replay_split as gdn_split
from replayssm.ops.kda import replay_split as kda_split
from replayssm.ops.mamba2 import replay_split as mamba2_split
from replayssm.registry import get
from replayssm.scenarios.inputs import make_params
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.jobs.bench.run import graph_median_ms, num_sets, random_inputs

SPLIT = {"mamba2": mamba2_split, "gdn": gdn_split, "kda": kda_split}


def state_bytes(family: str) -> int:
    """fp32 state bytes of one batch row at the family's benchmark geometry."""
    g = preset(family_of(family).bench_geometry, family)
    return math.prod(g.state_shape) * 4


def build_replay(family: str, decode: str, slots: int, opts: dict, mode: str = "s32a16", dev: str = "cuda",
                 kernel: str = "triton-replay"):
    """(kernel, geometry, decode config, inputs(rows, gen)) at the family's benchmark geometry."""
    fam = family_of(family)
    dec = DecodeConfig("standard", 1, 16) if decode == "standard" else DecodeConfig("speculative", 4, 16)
    g = preset(fam.bench_geometry, family)
    params = {k: v.to(dev) for k, v in make_params(Scenario.build(family, geometry=fam.bench_geometry)).items()}

    def inputs(rows, gen):
        return random_inputs(fam, g, rows, dec.window, torch.bfloat16, gen, dev)

    kern = get(kernel, family)(KernelConfig(g, params, mode, dec, num_slots=slots, device=torch.device(dev),
                                                     options={"checks": False, **opts}))
    return kern, g, dec, inputs


def times(family: str, decode: str, batch: int, opts: dict, mode: str) -> int:
    dev = "cuda"
    launch_split = SPLIT[family].launch_split
    row_bytes = state_bytes(family)
    nsets = num_sets(batch * row_bytes, dev)
    kern, g, dec, inputs = build_replay(family, decode, batch * nsets, opts, mode, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    sets = []
    for s in range(nsets):
        ids = torch.arange(s * batch, (s + 1) * batch, dtype=torch.int64, device=dev)
        kern.reset(ids, 0.5 * torch.randn((batch, *g.state_shape), generator=gen, device=dev))
        sets.append((ids, inputs(batch, gen),
                     torch.empty((batch, dec.window, *g.out_shape), dtype=torch.bfloat16, device=dev)))
    # fill the ring with plausible records: run a few committed steps first
    acc = torch.full((batch,), dec.window, dtype=torch.int64, device=dev)
    for _ in range(6):
        for ids, inp, out in sets:
            kern.verify(ids, inp, out)
            kern.commit(ids, acc)
    flush_wp = 15 if decode == "standard" else 16

    def pin(wp):
        kern.write_pos.fill_(wp)
        kern.origin.zero_()
        if hasattr(kern, "is_flush"):
            kern.is_flush.fill_(int(dec.is_flush(wp)))

    one_launch = opts.get("prepass") is False and decode == "standard"

    def step(wp, phases):
        def run():
            for ids, inp, out in sets:
                pin(wp)
                if one_launch:
                    kern.launch_replay_decode(kern, ids, inp, out)
                elif family == "mamba2":
                    launch_split(kern, ids, inp, out, False, phases)
                else:
                    launch_split(kern, ids, inp, out, phases)
        return run

    res = {"family": family, "decode": decode, "batch": batch, "opts": opts, "mode": mode}
    phases = (("nonflush", 8, "both"), ("flush", flush_wp, "both"))
    if not one_launch:
        phases += (("coef", 8, "coef"), ("stream", 8, "stream"))
    for name, wp, ph in phases:
        if ph == "stream":
            step(8, "both")()
        res[name] = graph_median_ms(step(wp, ph), warmup_calls=1, rep_ms=120) * 1e3 / nsets
    res["state_read_tbps_nonflush"] = batch * row_bytes / (res["nonflush"] * 1e-6) / 1e12
    print(json.dumps(res), flush=True)
    return 0


def profile(family: str, decode: str, batch: int, opts: dict, mode: str, kernel: str = "triton-replay") -> int:
    dev = "cuda"
    kern, g, dec, inputs = build_replay(family, decode, batch, opts, mode, dev, kernel)
    gen = torch.Generator(device=dev).manual_seed(0)
    ids = torch.arange(batch, dtype=torch.int64, device=dev)
    kern.reset(ids, torch.randn((batch, *g.state_shape), generator=gen, device=dev))
    acc = torch.full((batch,), dec.window, dtype=torch.int64, device=dev)
    out = torch.empty((batch, dec.window, *g.out_shape), dtype=torch.bfloat16, device=dev)
    for _ in range(int(os.environ.get("PROFILE_STEPS", "6"))):
        kern.verify(ids, inputs(batch, gen), out)
        kern.commit(ids, acc)
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="the two-launch replay path of one configuration on a GPU")
    p.add_argument("what", choices=("times", "profile"), help="phase times (JSON line) or launches for ncu")
    p.add_argument("family", choices=tuple(SPLIT))
    p.add_argument("decode", choices=("standard", "speculative"))
    p.add_argument("batch", type=int)
    p.add_argument("options", type=json.loads, help='kernel options as JSON, e.g. \'{"num_warps": 2}\'')
    p.add_argument("mode", nargs="?", default="s32a16")
    p.add_argument("--kernel", default="triton-replay", choices=("triton-replay", "triton-baseline"),
                   help="profile only: the kernel whose launches run (default: triton-replay)")
    a = p.parse_args(argv)
    if a.what == "times":
        if a.kernel != "triton-replay":
            p.error("--kernel: 'times' splits the replay path's phases; expected triton-replay")
        return times(a.family, a.decode, a.batch, a.options, a.mode)
    return profile(a.family, a.decode, a.batch, a.options, a.mode, a.kernel)


if __name__ == "__main__":
    sys.exit(main())
