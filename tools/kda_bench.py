"""KDA standard decode on a GPU: baseline vs ReplaySSM at batch 1..512, each cell the fastest of a
launch sweep (every candidate validated by the engine first), against the bytes model and the
device's copy bandwidth measured in the same run.

Oracle for the numbers: ``validators/jobs/bench/run.py`` (the same harness as ``replayssm bench``: CUDA
graph of a whole cursor cycle, rotated input/state sets for 4x the L2, ``do_bench`` median, the
family's ``traffic`` bytes model).  This tool only widens the launch sweep beyond the family's
default candidates (``KimiDeltaAttention.bench_launch_candidates``) to find the KDA kernels' best
shapes; ``replayssm bench --family kda`` is the table of record.

Targets (issue 19): replay/baseline >= 1.6x at batch 512 and replay >= 85 % of the copy ceiling.

    python tools/kda_bench.py --out DIR [--batches 1,8,32,128,256,512] [--mode s32a16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
from dataclasses import asdict

import torch

from replayssm.families import family, preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.validators.jobs.bench import run as bench
from replayssm.validators.jobs.bench.run import best_configuration, copy_bandwidth, cursor_cycle, num_sets, row_line

BASELINE = [{"block_v": 8, "num_warps": 1}, {"block_v": 16, "num_warps": 2}, {"block_v": 32, "num_warps": 4}]
REPLAY = [{}, {"prepass": False, "block_v": 8, "num_warps": 1}, {"prepass": False, "block_v": 16, "num_warps": 2},
          {"prepass": False, "block_v": 8, "num_warps": 1, "tiles": 4},
          {"prepass": False, "block_v": 8, "num_warps": 1, "tiles": 1},
          {"prepass": True, "block_v": 8, "num_warps": 1, "coef_warps": 1},
          {"prepass": True, "block_v": 8, "num_warps": 1, "coef_warps": 2},
          {"prepass": True, "block_v": 16, "num_warps": 2, "coef_warps": 1}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,32,128,256,512")
    ap.add_argument("--mode", default="s32a16")
    ap.add_argument("--buffer", type=int, default=16)
    ap.add_argument("--rep-ms", type=float, default=150)
    ap.add_argument("--quick", action="store_true", help="the first two candidates of each kernel only")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "kda_bench_log.txt", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    fam, geometry = family("kda"), family("kda").bench_geometry
    g, m = preset(geometry, "kda"), parse_mode(a.mode)
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy = copy_bandwidth("cuda")
    torch.cuda.empty_cache()
    log(f"copy bandwidth: {copy['tbps']:.3f} TB/s; geometry {geometry} {g}; mode {a.mode}; L = {a.buffer}")
    traffic = fam.traffic(g, m)
    std, base1 = DecodeConfig("standard", 1, a.buffer), DecodeConfig("standard", 1, 1)
    rb, bb = traffic.replay_cycle_mean(std, cursor_cycle(std, 1)[1]), traffic.baseline_step(1)
    bc, rc = (BASELINE[:2], REPLAY[:2]) if a.quick else (BASELINE, REPLAY)
    rows = []
    for batch in (int(x) for x in a.batches.split(",")):
        nsets = num_sets(batch * traffic.state, "cuda")
        b_us, b_opts, b_chk = best_configuration("kda", "triton-baseline", geometry, a.mode, base1, batch, nsets, 1,
                                                 bc, "cuda", gen, a.rep_ms, log)
        r_us, r_opts, r_chk = best_configuration("kda", "triton-replay", geometry, a.mode, std, batch, nsets, 1,
                                                 rc, "cuda", gen, a.rep_ms, log)
        rows.append(bench._row(f"standard L={a.buffer}", batch, b_us, r_us, bb * batch, rb * batch, copy, nsets, b_opts,
                         r_opts, f"{b_chk}/{r_chk}"))
        log(row_line(rows[-1]))
    result = {"family": "kda", "geometry": geometry, "mode": a.mode, "L": a.buffer, "copy": copy,
              "env": bench.environment(), "rows": [asdict(r) for r in rows]}
    (out / "kda_bench.json").write_text(json.dumps(result, indent=1))
    md = bench.table(result)
    last = rows[-1]
    verdict = (f"batch {last.batch}: ratio {last.ratio:.2f} (target >= 1.6), replay {last.replay_pct_copy:.0f} % of "
               f"copy (target >= 85 %), model limit {last.model_limit:.2f}")
    (out / "kda_bench.md").write_text(md + "\n\n" + verdict + "\n")
    log(md)
    log(verdict)


if __name__ == "__main__":
    main()
