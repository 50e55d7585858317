"""Validated tokens/s of single drift cells on one device, one process, one cell at a time (issue 18).

    python tools/drift_rates.py OUT.json [--seconds S] [--rows R] [CELL ...]

CELL is ``family.kernel.mode.scenario.schedule`` (default: Mamba-2 and GDN ``triton-replay`` s32a16
long-memory, standard and spec-random, at ``nano4b`` / ``qwen35-4b``).  Each cell runs through
``CellRun`` (the drift harness's own stepping: the fast path, CUDA graphs and the fp64 reference
included; chunks of ``default_chunk`` steps, as ``replayssm drift`` runs them, or ``--chunk``) for
``--seconds`` of wall time after a first chunk that pays the compiles; the rate is
the accepted tokens of the timed part over its wall time, with a device sync at both ends.  Also
recorded: whether the fast path was taken, the pieces run and of them the graph replays, graphs captured,
a capture error if any, and on a GPU the device memory the cell holds after its first chunk and at the
end (allocated, peak, reserved).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from replayssm import adapters
from replayssm.validators.jobs.drift.sweep import CellRun, CellSpec, SweepConfig, default_chunk

GEOMETRY = {"mamba2": "nano4b", "gdn": "qwen35-4b", "kda": "kimi-linear-48b"}
DEFAULT = [f"{f}.triton-replay.s32a16.long-memory.{s}" for f in ("mamba2", "gdn") for s in ("standard", "spec-random")]


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def rate(cell: str, rows: int, seconds: float, dev: str, chunk: int | None = None) -> dict:
    fam, kernel, mode, scen, sched = cell.split(".")
    cfg = SweepConfig(families=(fam,), kernels=(kernel,), modes=(mode,), schedules=(sched,),
                      geometry=((fam, GEOMETRY[fam]),), rows=rows, tokens=125_000, local_every=8)
    spec = CellSpec(fam, kernel, mode, scen, sched)
    chunk = chunk or default_chunk(dev, rows, spec.speculative)
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    run = CellRun(spec, cfg, dev, chunk=chunk)
    t0 = time.perf_counter()
    run.run_steps(chunk)  # the first chunk: compiles and captures
    _sync(dev)
    warm = time.perf_counter() - t0
    mem_first = _memory(run, dev)
    tokens, t1 = 0, time.perf_counter()
    while not run.done and time.perf_counter() - t1 < seconds:
        tokens += run.run_steps(chunk)
    _sync(dev)
    wall = time.perf_counter() - t1
    fast = run.fast
    return {"cell": cell, "rows": rows, "geometry": GEOMETRY[fam], "chunk": chunk, "first_chunk_s": round(warm, 2),
            "timed_s": round(wall, 2), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "fast": fast is not None, "graphs": bool(fast and fast.graphs), "pieces": fast.pieces if fast else 0,
            "replays": fast.replays if fast else 0,
            "captured": len(fast.cache) if fast else 0, "capture_error": fast.capture_error if fast else None,
            "exception": run.exception, "memory_after_first_chunk": mem_first, "memory_at_end": _memory(run, dev)}


def _memory(run, dev: str) -> dict | None:
    """The device memory the cell holds (GB: allocated now, its peak, reserved by the caching allocator
    and the graphs' pools) and the graphs it keeps (captured; of them, re-seeding ones that keep their
    checkpoint read alive)."""
    if dev != "cuda":
        return None
    fast = run.fast
    gb = 1e9
    return {"allocated_gb": round(torch.cuda.memory_allocated() / gb, 3),
            "peak_allocated_gb": round(torch.cuda.max_memory_allocated() / gb, 3),
            "reserved_gb": round(torch.cuda.memory_reserved() / gb, 3),
            "graphs": len(fast.cache) if fast else 0,
            "reseed_graphs": sum(1 for key in fast.cache if key[2]) if fast else 0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("cells", nargs="*", default=DEFAULT)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--chunk", type=int, default=None, help="steps per chunk (default: drift's default_chunk)")
    a = p.parse_intermixed_args()
    adapters.load()  # the kernels written elsewhere, where their sources are available (cells may name them)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    res = []
    for c in a.cells:
        r = rate(c, a.rows, a.seconds, dev, a.chunk)
        print(json.dumps(r), flush=True)
        res.append(r)
    write_cells(a.out, dev, res)


def write_cells(path: str, dev: str, cells: list[dict]) -> None:
    """The per-cell results with the device and torch they ran on (also tools/drift_profile.py's)."""
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                   "torch": torch.__version__, "cells": cells}, f, indent=1)


if __name__ == "__main__":
    main()
