"""Count the torch operations a drift cell issues per step outside the kernel under test (CPU profile).

Oracle: torch.profiler's record of every top-level ``aten::`` call (calls nested in another aten
call are not counted) made while ``CellRun.run_steps`` runs; calls inside the kernel's
``verify``/``commit``/``launch_*`` are counted apart.  Slow path (``--slow``: Lockstep.step every
step) against the fast path (``validators/jobs/drift/fast.py``, eager: no CUDA graphs on a CPU).

``--fake-kernel`` replaces the Mamba-2 Triton kernel's launches by zero outputs (the harness's
work is the same; the Triton interpreter would take minutes per step at nano4b).  ``--static``
runs the fast path in the pieces a CUDA graph captures on a GPU (fixed buffers, eagerly here) and
counts the calls inside a piece apart: what is left is the host work per step when each piece is
one graph replay.

    python tools/drift_host_ops.py --geometry nano4b --rows 8 --steps 32 --fake-kernel
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from replayssm.validators.jobs.drift.fast import FastCell
from replayssm.validators.jobs.drift.sweep import CellRun, CellSpec, SweepConfig

KERNEL_METHODS = ("verify", "commit", "launch_verify", "launch_commit", "launch_step")


def _mark_kernel(kernel, fake: bool) -> None:
    """Wrap the kernel's entry points in a ``kernel-under-test`` profiler range (and fake them)."""
    for name in KERNEL_METHODS:
        f = getattr(kernel, name, None)
        if f is None:
            continue
        if fake and name == "launch_verify":
            def f(slot_ids, inputs, out):
                out.zero_()
        elif fake and name in ("launch_commit", "launch_step"):
            def f(*args):
                return None

        def wrapped(*a, _f=f, **kw):
            with record_function("kernel-under-test"):
                return _f(*a, **kw)
        setattr(kernel, name, wrapped)


def count(args) -> dict:
    torch.set_num_threads(1)
    cfg = SweepConfig(families=("mamba2",), kernels=(args.kernel,), modes=(args.mode,), schedules=(args.schedule,),
                      geometry=(("mamba2", args.geometry),), rows=args.rows, tokens=args.tokens,
                      local_every=args.local_every)
    spec = CellSpec("mamba2", args.kernel, args.mode, "long-memory", args.schedule)
    run = CellRun(spec, cfg, chunk=args.chunk, fast=not args.slow)
    _mark_kernel(run.ls.kernel, args.fake_kernel)
    pieces = 0
    if args.static:
        run.fast = FastCell(run, static=True)
        piece = run.fast._piece_static

        def marked(*a):
            nonlocal pieces
            pieces += 1
            with record_function("graph-piece"):
                return piece(*a)
        run.fast._piece_static = marked
    run.run_steps(args.warmup)
    pieces = 0
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run.run_steps(args.steps)
    wall = time.perf_counter() - t0
    harness, inside, in_piece = collections.Counter(), 0, 0
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        p, in_kernel, nested, piece = e.cpu_parent, False, False, False
        while p is not None:
            in_kernel |= p.name == "kernel-under-test"
            nested |= p.name.startswith("aten::")
            piece |= p.name == "graph-piece"
            p = p.cpu_parent
        if nested:
            continue
        if piece:
            in_piece += 1
        elif in_kernel:
            inside += 1
        else:
            harness[e.name] += 1
    n = args.steps
    return {"path": "slow" if args.slow else "static" if args.static else "fast", "geometry": args.geometry,
            "rows": args.rows,
            "kernel": args.kernel + (" (faked)" if args.fake_kernel else ""), "schedule": args.schedule,
            "local_every": args.local_every, "steps": n, "harness_ops_per_step": sum(harness.values()) / n,
            "kernel_ops_per_step": inside / n, "profiled_ms_per_step": 1e3 * wall / n,
            "graph_pieces_per_step": pieces / n, "ops_in_pieces_per_step": in_piece / n,
            "top": {k: v / n for k, v in harness.most_common(40)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--geometry", default="tiny")
    ap.add_argument("--kernel", default="triton-replay")
    ap.add_argument("--mode", default="s32a16")
    ap.add_argument("--schedule", default="standard")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=125000, help="per row (sets the state-sample spacing)")
    ap.add_argument("--local-every", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=64, help="steps run before the profiled ones")
    ap.add_argument("--steps", type=int, default=64, help="profiled steps")
    ap.add_argument("--slow", action="store_true", help="the slow path (Lockstep.step every step)")
    ap.add_argument("--fake-kernel", action="store_true", help="zero outputs instead of the Triton launches")
    ap.add_argument("--static", action="store_true", help="the fast path in graph-sized pieces (see above)")
    r = count(ap.parse_args())
    print(f"{r['path']:4s} {r['geometry']:6s} rows={r['rows']} {r['kernel']} {r['schedule']} local_every="
          f"{r['local_every']}: {r['harness_ops_per_step']:.1f} harness ops/step "
          f"(kernel {r['kernel_ops_per_step']:.1f}), {r['profiled_ms_per_step']:.1f} ms/step under the profiler")
    if r["graph_pieces_per_step"]:
        print(f"   outside the graph pieces; a piece per {1 / r['graph_pieces_per_step']:.1f} steps holds "
              f"{r['ops_in_pieces_per_step']:.1f} ops/step (one replay on a GPU)")
    print("   " + ", ".join(f"{k.removeprefix('aten::')} {v:.1f}" for k, v in r["top"].items()))


if __name__ == "__main__":
    main()
