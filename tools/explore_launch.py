"""Launch-shape exploration on a GPU (one device call): full-cursor-cycle time of replay kernel
configurations against the default baseline, each checked against fp64 first.

Usage: python tools/explore_launch.py [mamba2|gdn|all] [--batches 128,512] [--rep-ms 150]
Prints one line per (family, case, batch, options); the JSON of all lines goes to $OUT/explore.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from replayssm.bench import _params as m2_params
from replayssm.bench import _time_kernel, cursor_cycle, num_sets
from replayssm.geometry import preset
from replayssm.interface import DecodeConfig
from replayssm.ops.gdn import bench_cases as gb

TF = "s32a16-tf32x3"
M2_STD = [{}, {"num_warps": 2}, {"num_warps": 2, "kchunks": 4}, {"num_warps": 4, "kchunks": 4}, {"num_warps": 1},
          {"num_warps": 2, "kchunks": 2}]
M2_SPEC = [{"num_warps": 2}, {"num_warps": 2, "kchunks": 4}, {"num_warps": 4, "kchunks": 4},
           {"num_warps": 1, "kchunks": 4}, {"num_warps": 2, "kchunks": 8}, {"_mode": TF, "num_warps": 4},
           {"_mode": TF, "num_warps": 2}]
GDN_STD = [{"block_v": 16, "num_warps": 1}, {"block_v": 8, "num_warps": 1}, {"block_v": 8, "num_warps": 1, "tiles": 4},
           {"block_v": 8, "num_warps": 1, "tiles": 16}, {"block_v": 16, "num_warps": 1, "tiles": 2}]
GDN_SPEC = [{"block_v": 8, "num_warps": 1}, {"block_v": 16, "num_warps": 1},
            {"block_v": 16, "num_warps": 1, "kchunks": 4}, {"block_v": 16, "num_warps": 2, "kchunks": 4},
            {"block_v": 32, "num_warps": 2, "kchunks": 4}, {"_mode": TF, "block_v": 16, "num_warps": 1},
            {"_mode": TF, "block_v": 16, "num_warps": 2}, {"_mode": TF, "block_v": 32, "num_warps": 4}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("family", nargs="?", default="all")
    ap.add_argument("--batches", default="128,512")
    ap.add_argument("--rep-ms", type=float, default=150)
    ap.add_argument("--mode", default="s32a16")
    ap.add_argument("--cases", default="baseline std,replay std L16,baseline spec,replay spec all",
                    help="comma-separated cases to run (GDN)")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    dev = "cuda"
    lines = []

    def emit(**kw):
        lines.append(kw)
        print(json.dumps(kw), flush=True)

    if a.family in ("mamba2", "all"):
        g = preset("nano4b", "mamba2")
        params = m2_params(g, torch.Generator().manual_seed(0), dev)
        gen = torch.Generator(device=dev).manual_seed(0)
        state_bytes = g.nheads * g.headdim * g.dstate * 4
        for batch in batches:
            nsets = num_sets(batch * state_bytes, dev)
            base1 = DecodeConfig("standard", 1, 1)
            us, _ = _time_kernel("triton-baseline", g, params, a.mode, base1, batch, nsets, [], 1, {}, dev, gen,
                                 a.rep_ms, False)
            emit(family="mamba2", case="baseline std", batch=batch, opts={}, us=us)
            std = DecodeConfig("standard", 1, 16)
            prefix, _ = cursor_cycle(std, 1)
            for o in M2_STD:
                try:
                    o = dict(o)
                    mode = o.pop("_mode", a.mode)
                    us, chk = _time_kernel("triton-replay", g, params, mode, std, batch, nsets, prefix, 1, o, dev,
                                           gen, a.rep_ms, True)
                    emit(family="mamba2", case="replay std L16", batch=batch, opts=o, us=us, fp64=chk)
                except Exception as e:  # noqa: BLE001 - a configuration that fails to compile or check is reported
                    emit(family="mamba2", case="replay std L16", batch=batch, opts=o, error=str(e)[:300])
                torch.cuda.empty_cache()
            if batch < 128:
                continue
            spec = DecodeConfig("speculative", 4, 16)
            us, _ = _time_kernel("triton-baseline", g, params, a.mode, spec, batch, nsets, [], 4, {}, dev, gen,
                                 a.rep_ms, False)
            emit(family="mamba2", case="baseline spec", batch=batch, opts={}, us=us)
            prefix, _ = cursor_cycle(spec, 4)
            for o in M2_SPEC:
                try:
                    o = dict(o)
                    mode = o.pop("_mode", a.mode)
                    us, chk = _time_kernel("triton-replay", g, params, mode, spec, batch, nsets, prefix, 4, o,
                                           dev, gen, a.rep_ms, False)
                    emit(family="mamba2", case="replay spec all", batch=batch, opts=o, mode=mode, us=us, fp64=chk)
                except Exception as e:  # noqa: BLE001
                    emit(family="mamba2", case="replay spec all", batch=batch, opts=o, error=str(e)[:300])
                torch.cuda.empty_cache()
    if a.family in ("gdn", "all"):
        g = preset("qwen35-4b", "gdn")
        params = gb.make_params(g, 0, dev)
        gen = torch.Generator(device=dev).manual_seed(0)
        traffic = gb.GDNTraffic.of(g, a.mode)
        for batch in batches:
            nsets = num_sets(batch * traffic.state, dev)
            for case, name, dec, k, cands in (
                    ("baseline std", "triton-baseline", DecodeConfig("standard", 1, 1), 1, [{}]),
                    ("replay std L16", "triton-replay", DecodeConfig("standard", 1, 16), 1, GDN_STD),
                    ("baseline spec", "triton-baseline", DecodeConfig("speculative", 4, 16), 4, [{}]),
                    ("replay spec all", "triton-replay", DecodeConfig("speculative", 4, 16), 4, GDN_SPEC)):
                if ("spec" in case and batch < 128) or case not in a.cases.split(","):
                    continue
                for o in cands:
                    try:
                        o = dict(o)
                        mode = o.pop("_mode", a.mode)
                        us, chk = gb.time_kernel(name, g, params, mode, dec, batch, nsets, k, o, dev, gen,
                                                 a.rep_ms)
                        emit(family="gdn", case=case, batch=batch, opts=o, mode=mode, us=us, fp64=chk)
                    except Exception as e:  # noqa: BLE001
                        emit(family="gdn", case=case, batch=batch, opts=o, error=str(e)[:300])
                    torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "explore.json"), "w") as f:
        json.dump(lines, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
