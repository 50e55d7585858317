"""Launch-shape exploration on a GPU (one device call): full-cursor-cycle time of replay kernel
configurations against the default baseline, each validated by the engine first
(``replayssm.validators.jobs.bench.run.time_kernel``).

Usage: python tools/explore_launch.py [mamba2|gdn|all] [--batches 128,512] [--rep-ms 150]
Prints one line per (family, case, batch, options); the JSON of all lines goes to $OUT/explore.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from replayssm.families import family as family_of
from replayssm.families import family_names, preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.validators.jobs.bench.run import num_sets, time_kernel

TF = "s32a16-tf32x3"
# the defaults first; then the bf16-part tensor-core readouts at fp32 accuracy (readout="split" /
# split_readout) in several tile shapes, and once in s32a32 (fp32 outputs: the readouts' accuracy shows)
SPLIT = {"readout": "split"}
M2S = {"split_readout": True}
M2_STD = [{}, M2S, {**M2S, "block_p": 32, "num_warps": 2}]
M2_SPEC = [{}, M2S, {**M2S, "num_warps": 2}, {**M2S, "block_p": 32, "num_warps": 4}, {**M2S, "_mode": "s32a32"}]
GDN_STD = [{}, SPLIT]
GDN_SPEC = [{}, SPLIT, {**SPLIT, "key_chunk": 16}, {**SPLIT, "key_chunk": 64}, {**SPLIT, "num_warps": 8},
            {**SPLIT, "block_v": 32, "num_warps": 2}, {**SPLIT, "block_v": 128, "num_warps": 8}, {**SPLIT, "tiles": 1},
            {**SPLIT, "block_v": 16, "num_warps": 1}, {**SPLIT, "_mode": "s32a32"}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("family", nargs="?", default="all")
    ap.add_argument("--batches", default="128,512")
    ap.add_argument("--rep-ms", type=float, default=150)
    ap.add_argument("--mode", default="s32a16")
    ap.add_argument("--cases", default="baseline std,replay std L16,baseline spec,replay spec all",
                    help="comma-separated cases to run")
    ap.add_argument("--spec-opts", default=None, help="JSON list of option dicts: the speculative replay candidates "
                    "instead of the built-in list")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    dev = "cuda"
    lines = []

    def emit(**kw):
        lines.append(kw)
        print(json.dumps(kw), flush=True)

    candidates = {"mamba2": (M2_STD, M2_SPEC), "gdn": (GDN_STD, GDN_SPEC)}
    for fam_name in (family_names() if a.family == "all" else [a.family]):
        fam = family_of(fam_name)
        std_cands, spec_cands = candidates.get(fam_name, ([{}], [{}]))
        if a.spec_opts:
            spec_cands = json.loads(a.spec_opts)
        g = preset(fam.bench_geometry, fam_name)
        gen = torch.Generator(device=dev).manual_seed(0)
        traffic = fam.traffic(g, parse_mode(a.mode))
        for batch in batches:
            nsets = num_sets(batch * traffic.state, dev)
            for case, name, dec, k, cands in (
                    ("baseline std", "triton-baseline", DecodeConfig("standard", 1, 1), 1, [{}]),
                    ("replay std L16", "triton-replay", DecodeConfig("standard", 1, 16), 1, std_cands),
                    ("baseline spec", "triton-baseline", DecodeConfig("speculative", 4, 16), 4, [{}]),
                    ("replay spec all", "triton-replay", DecodeConfig("speculative", 4, 16), 4, spec_cands)):
                if case not in a.cases.split(","):
                    continue
                for o in cands:
                    try:
                        o = dict(o)
                        mode = o.pop("_mode", a.mode)
                        us, chk = time_kernel(fam_name, name, fam.bench_geometry, mode, dec, batch, nsets, k, o, dev,
                                              gen, a.rep_ms)
                        emit(family=fam_name, case=case, batch=batch, opts=o, mode=mode, us=us, check=chk)
                    except Exception as e:  # noqa: BLE001 - a configuration that fails to compile or check is reported
                        emit(family=fam_name, case=case, batch=batch, opts=o, error=str(e)[:300])
                    torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "explore.json"), "w") as f:
        json.dump(lines, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
