"""Where a drift cell's step time goes on the device (issue 18: the bound of the fast path).

    python tools/drift_profile.py OUT.json [--chunks N] [--rows R] [CELL ...]

CELL is ``family.kernel.mode.scenario.schedule`` as in ``tools/drift_rates.py``.  Each cell runs
through ``CellRun`` on the fast path twice, after a first chunk that pays the compiles:

* eagerly (``graphs=False``) under ``torch.profiler`` for ``--chunks`` chunks: device kernels per
  step, device time per step, and the kernels that take it (name, launches per step, us per step);
* with CUDA graphs (the default of a CUDA device), after ``warm`` chunks that capture them, timed
  by wall clock for the same number of chunks: the step time the graphs reach; then as many
  chunks under ``torch.profiler`` (the kernels inside the graph replays: ``graphed_*``), and as
  many again under cProfile: the host functions with the most time of their own per step
  (``host_top``).  Chunks are ``default_chunk`` steps, as ``replayssm drift`` runs them.

Reading: graphs remove the host launches, not the kernels; when the graphed step time is close to
the eager device time per step, the step is bound by the device work of its kernels (their count
times the microseconds a tiny kernel costs, plus the bytes of the state-sized passes); the byte floor of
the fp64 reference is two passes over the fp64 state per step.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections import defaultdict
from pathlib import Path

import torch
from drift_rates import write_cells  # tools/ is the script's directory
from torch.profiler import ProfilerActivity, profile

from replayssm import adapters
from replayssm.validators.jobs.drift.cell_run import CellRun, default_chunk
from replayssm.validators.jobs.drift.cells import CellSpec, SweepConfig

GEOMETRY = {"mamba2": "nano4b", "gdn": "qwen35-4b", "kda": "kimi-linear-48b"}
DEFAULT = [f"{f}.triton-replay.s32a16.long-memory.{s}" for f in ("mamba2", "gdn") for s in ("standard", "spec-random")]


def _cell(cell: str, rows: int, dev: str, chunk: int, graphs: bool | None, geometry: str | None) -> CellRun:
    fam, kernel, mode, scen, sched = cell.split(".")
    cfg = SweepConfig(families=(fam,), kernels=(kernel,), modes=(mode,), schedules=(sched,),
                      geometry=((fam, geometry or GEOMETRY[fam]),), rows=rows, tokens=125_000, local_every=8)
    run = CellRun(CellSpec(fam, kernel, mode, scen, sched), cfg, dev, chunk=chunk, graphs=graphs)
    run.run_steps(chunk)  # compiles, captures, first chunk
    return run


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def _host_profile(run: CellRun, chunks: int, chunk: int, dev: str, top: int) -> list[dict]:
    """Where the host's time goes on the default path (graphs where they apply): cProfile over
    ``chunks`` more chunks, the functions with the most time of their own, per step."""
    pr = cProfile.Profile()
    s0 = run.step
    pr.enable()
    for _ in range(chunks):
        run.run_steps(chunk)
    _sync(dev)
    pr.disable()
    n = max(run.step - s0, 1)
    st = pstats.Stats(pr).stats
    rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls_per_step": round(nc / n, 2),
             "self_us_per_step": round(1e6 * tt / n, 1), "cum_us_per_step": round(1e6 * ct / n, 1)}
            for (f, line, name), (_, nc, tt, ct, _) in rows]


def profile_cell(cell: str, rows: int, chunks: int, dev: str, geometry: str | None = None, chunk: int | None = None,
                 top: int = 25, warm: int = 3) -> dict:
    chunk = chunk or default_chunk(dev, rows, CellSpec(*cell.split(".")).speculative)
    eager = _cell(cell, rows, dev, chunk, False, geometry)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    _sync(dev)
    steps0 = eager.step
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(chunks):
            eager.run_steps(chunk)
        _sync(dev)
    eager_wall = time.perf_counter() - t0
    steps = eager.step - steps0
    total_n, total_us, rows_top = _kernels(prof, dev, steps, top)
    graphed = _cell(cell, rows, dev, chunk, None, geometry)
    for _ in range(warm):  # the graphs are captured on a piece's second occurrence
        graphed.run_steps(chunk)
    _sync(dev)
    g0, t1 = graphed.step, time.perf_counter()
    for _ in range(chunks):
        graphed.run_steps(chunk)
    _sync(dev)
    g_wall = time.perf_counter() - t1
    g_steps = graphed.step - g0
    g0 = graphed.step
    with profile(activities=acts) as gprof:
        for _ in range(chunks):
            graphed.run_steps(chunk)
        _sync(dev)
    g_n, g_us, g_top = _kernels(gprof, dev, graphed.step - g0, top)
    host = _host_profile(graphed, chunks, chunk, dev, top)
    fast = graphed.fast
    return {"cell": cell, "rows": rows, "geometry": geometry or GEOMETRY[cell.split(".")[0]], "chunk": chunk,
            "steps_profiled": steps,
            "device_kernels_per_step": round(total_n, 1), "device_us_per_step": round(total_us, 1),
            "eager_wall_us_per_step": round(1e6 * eager_wall / max(steps, 1), 1),
            "graphed_wall_us_per_step": round(1e6 * g_wall / max(g_steps, 1), 1),
            "graphed_device_kernels_per_step": round(g_n, 1), "graphed_device_us_per_step": round(g_us, 1),
            "graphs": bool(fast and fast.graphs), "captured": len(fast.cache) if fast else 0,
            "replays": fast.replays if fast else 0, "capture_error": fast.capture_error if fast else None,
            "host_top": host, "top_kernels": rows_top, "graphed_top_kernels": g_top}


def _kernels(prof, dev: str, steps: int, top: int) -> tuple[float, float, list[dict]]:
    """Device kernels per step, their device time per step (us) and the ``top`` kernels by time, from
    a ``torch.profiler`` run over ``steps`` steps (kernels inside CUDA graph replays included)."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        on_device = ev.device_type == torch.autograd.DeviceType.CUDA if dev == "cuda" else ev.cpu_parent is None
        if on_device:
            k = kernels[ev.name[:120]]
            k[0] += 1
            k[1] += ev.device_time if dev == "cuda" else ev.cpu_time
    n = max(steps, 1)
    rows_top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return (sum(v[0] for v in kernels.values()) / n, sum(v[1] for v in kernels.values()) / n,
            [{"name": k, "per_step": round(v[0] / n, 2), "us_per_step": round(v[1] / n, 2)} for k, v in rows_top])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("cells", nargs="*", default=DEFAULT)
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--geometry", default=None, help="one preset for every cell (default: nano4b / qwen35-4b / "
                   "kimi-linear-48b by family)")
    a = p.parse_intermixed_args()
    adapters.load()  # the kernels written elsewhere, where their sources are available (cells may name them)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    res = []
    for c in a.cells:
        r = profile_cell(c, a.rows, a.chunks, dev, a.geometry)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("top_kernels") and k != "host_top"}), flush=True)
        for title, key in (("eager", "top_kernels"), ("graphed", "graphed_top_kernels")):
            print(f"  device kernels, {title}:", flush=True)
            for k in r[key][:12]:
                print(f"    {k['us_per_step']:9.1f} us/step {k['per_step']:6.2f}x  {k['name']}", flush=True)
        print("  host (self time per step):", flush=True)
        for h in r["host_top"][:12]:
            print(f"    {h['self_us_per_step']:9.1f} us self {h['cum_us_per_step']:9.1f} us cum "
                  f"{h['calls_per_step']:7.2f}x  {h['function']}", flush=True)
        res.append(r)
    write_cells(a.out, dev, res)


if __name__ == "__main__":
    main()
