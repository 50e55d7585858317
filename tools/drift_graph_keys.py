"""The CUDA-graph keys of a drift cell's fast path, and the pieces a graph cap leaves to run eagerly (CPU).

    python tools/drift_graph_keys.py [--family gdn] [--schedule spec-random] [--tokens 80000] [--rows 8]
                                     [--caps 256,384,512,1024]

The fast path captures a piece (the steps up to the next host event) as a CUDA graph keyed by
``(first chunk step, shadow flags, re-seeded, flush measured)`` on the key's second occurrence, while
fewer than ``FastCell.max_graphs`` are held; every other piece runs eagerly (host launches: several
times a replay's cost).  Which keys come, and how often, depends on the schedule's accepted counts and
the cursors only, not on the geometry or the device, so this runs the cell's host logic alone (``tiny``
geometry, static pieces, the device work of each piece skipped) and replays the capture rule for
each cap: the share of pieces that would not be graph replays.
"""
from __future__ import annotations

import argparse
from collections import Counter

from replayssm.validators.jobs.drift.fast import FastCell
from replayssm.validators.jobs.drift.sweep import CellRun, CellSpec, SweepConfig


def keys(family: str, schedule: str, tokens: int, rows: int, chunk: int = 64) -> tuple[list[tuple], int]:
    """The pieces' graph keys, in order, over the whole cell, and its steps."""
    cfg = SweepConfig(families=(family,), kernels=("triton-replay",), modes=("s32a16",), schedules=(schedule,),
                      geometry=((family, "tiny"),), rows=rows, tokens=tokens, local_every=8)
    run = CellRun(CellSpec(family, "triton-replay", "s32a16", "long-memory", schedule), cfg, "cpu", chunk=chunk)
    fast = FastCell(run, static=True)
    seq: list[tuple] = []
    # the host's walk, pieces and bookkeeping as they run; no device work, no output checks or drains
    fast._run_graphed = lambda j0, flags, ks, ss, reseed=False, measure=False: seq.append((j0, flags, reseed, measure))
    fast._check_outputs = lambda: None
    fast._bound_step = lambda j, rows: None
    run._drain = run.pending.clear
    while not run.done:
        fast.run(chunk)
        run.pending.clear()
    return seq, run.step


def eager_pieces(seq: list[tuple], cap: int) -> int:
    """Pieces not replayed from a graph under ``cap`` (FastCell._run_graphed's rule: captured, then replayed,
    on a key's second occurrence while fewer than ``cap`` are held)."""
    cache, seen, eager = set(), Counter(), 0
    for key in seq:
        if key not in cache:
            if seen[key] and len(cache) < cap:
                cache.add(key)
            else:
                eager += 1
        seen[key] += 1
    return eager


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="gdn")
    p.add_argument("--schedule", default="spec-random")
    p.add_argument("--tokens", type=int, default=80_000, help="accepted tokens per row")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--caps", default="256,384,512,1024")
    a = p.parse_args()
    seq, steps = keys(a.family, a.schedule, a.tokens, a.rows)
    print(f"{a.family} {a.schedule}, {a.rows} rows x {a.tokens} tokens: {steps} steps, {len(seq)} pieces, "
          f"{len(set(seq))} distinct keys")
    for cap in (int(c) for c in a.caps.split(",")):
        e = eager_pieces(seq, cap)
        print(f"  cap {cap}: {e} pieces not replayed ({100 * e / len(seq):.1f} %)")


if __name__ == "__main__":
    main()
