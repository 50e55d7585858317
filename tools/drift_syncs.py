"""Where a drift cell's fast path makes the host wait for the device (issue 18: the idle between chunks).

    python tools/drift_syncs.py OUT.json [--chunks N] [--rows R] [CELL ...]

CELL is ``family.kernel.mode.scenario.schedule`` as in ``tools/drift_rates.py``.  Each cell runs
through ``CellRun`` (the default path: CUDA graphs and the fused reference on a GPU) for a first
chunk that compiles and captures, then ``--chunks`` chunks under
``torch.cuda.set_sync_debug_mode("warn")``: every synchronising CUDA call (a device-to-host read, a
pageable host-to-device copy, ``nonzero``, ``item``) raises a warning, attributed here to the first
stack frame in this repository.  Output: per call site, the synchronising calls per chunk.  A chunk
needs one wait at its end (the output checks and the drain); every other one is device idle time
the host could have hidden.
"""
from __future__ import annotations

import argparse
import json
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from drift_rates import GEOMETRY, write_cells  # tools/ is the script's directory

from replayssm import adapters
from replayssm.validators.jobs.drift.sweep import CellRun, CellSpec, SweepConfig, default_chunk

ROOT = Path(__file__).resolve().parents[1]


def _site() -> str:
    for fr in reversed(traceback.extract_stack()[:-2]):
        p = Path(fr.filename).resolve()
        if p.is_relative_to(ROOT) and p.name != Path(__file__).name:
            return f"{p.relative_to(ROOT)}:{fr.lineno} ({fr.name}: {fr.line})"
    return "?"


def syncs(cell: str, rows: int, chunks: int, dev: str) -> dict:
    fam, kernel, mode, scen, sched = cell.split(".")
    cfg = SweepConfig(families=(fam,), kernels=(kernel,), modes=(mode,), schedules=(sched,),
                      geometry=((fam, GEOMETRY[fam]),), rows=rows, tokens=125_000, local_every=8)
    spec = CellSpec(fam, kernel, mode, scen, sched)
    chunk = default_chunk(dev, rows, spec.speculative)
    run = CellRun(spec, cfg, dev, chunk=chunk)
    run.run_steps(2 * chunk)  # compiles, captures
    sites: Counter = Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            sites[_site()] += 1
        else:
            shown(message, category, filename, lineno, file, line)

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            for _ in range(chunks):
                run.run_steps(chunk)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"cell": cell, "rows": rows, "chunk": chunk, "chunks": chunks,
            "per_chunk": {k: v / chunks for k, v in sites.most_common()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("cells", nargs="*", default=["mamba2.triton-replay.s32a16.long-memory.standard"])
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--rows", type=int, default=8)
    a = p.parse_intermixed_args()
    if not torch.cuda.is_available():
        raise SystemExit("drift_syncs: needs a CUDA device (the sync debug mode is CUDA's)")
    adapters.load()
    res = []
    for c in a.cells:
        r = syncs(c, a.rows, a.chunks, "cuda")
        print(json.dumps(r, indent=1), flush=True)
        res.append(r)
    write_cells(a.out, "cuda", res)


if __name__ == "__main__":
    main()
