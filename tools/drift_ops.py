"""How many device operations one drift step launches, by part (issue 18: the bound of the fast path).

    python tools/drift_ops.py OUT.json [--steps N] [--rows R] [--geometry G] [CELL ...]

CELL is ``family.kernel.mode.scenario.schedule`` as in ``tools/drift_rates.py``.  Each cell runs on
the fast path as its CUDA graphs would capture it (``static``: fixed buffers and device masks, the
fused fp64 reference step) for ``--steps`` steps after a first chunk, under a dispatch mode that
counts every aten operation that is not a view -- on a GPU each is one kernel node of the step's
graph -- attributed to the outermost part of the step it runs in: the kernel under test (its
launches; a Triton launch is one kernel and is counted by call), the fp64 reference step (with
the readout magnitude where the family's fused pass gives it from its readout products), the
readout magnitude beside it otherwise, the fp64 running-error bound (its scan over a piece; its
coefficients are computed at chunk load, counted there), the output error metric, the accepted-
prefix selection, the shadow state, and the host events between pieces (flush and sample
measurements).  ``_local_scalar_dense`` (a host sync) is counted apart.  Device-independent: run
it on a CPU, where each Triton launch counts as one operation and the interpreter's own tensor
work inside it is not counted.  On a GPU without ``hoist``'s chunk
terms the reference part is a few operations larger than there.

Reading: a CUDA-graph node of a tiny kernel costs microseconds on an H200, so ops per step times that
cost is what a step costs when its kernels move few bytes; the fp64 reference's byte floor is two passes
over the fp64 state per step.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from replayssm.validators.jobs.drift import fast as drift_fast
from replayssm.validators.jobs.drift.cell_run import CellRun
from replayssm.validators.jobs.drift.cells import CellSpec, SweepConfig
from replayssm.validators.jobs.drift.fast import FastCell

FREE = {"aten::detach", "aten::lift_fresh", "aten::alias", "aten::_unsafe_view", "aten::view", "aten::empty"}


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.ops: Counter = Counter()
        self.names: dict[str, Counter] = {}
        self.syncs = 0
        self.inside_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if self.inside_triton:
            pass
        elif name == "aten::_local_scalar_dense":
            self.syncs += 1
        elif not func.is_view and name not in FREE:
            part = self.parts[0] if self.parts else "other"
            self.ops[part] += 1
            self.names.setdefault(part, Counter())[name] += 1
        return func(*args, **(kwargs or {}))

    def wrap(self, obj, attr: str, part: str) -> None:
        fn = getattr(obj, attr)

        def wrapped(*a, **k):
            self.parts.append(part)
            try:
                return fn(*a, **k)
            finally:
                self.parts.pop()
        setattr(obj, attr, wrapped)


def _count_triton_launches(c: _Counter):
    """Count each interpreted Triton launch as one operation of the current part, not its insides."""
    from triton.runtime import interpreter

    call = interpreter.GridExecutor.__call__

    def launch(self, *a, **k):
        part = c.parts[0] if c.parts else "other"
        c.ops[part] += 1
        c.names.setdefault(part, Counter())["triton launch"] += 1
        c.inside_triton += 1
        try:
            return call(self, *a, **k)
        finally:
            c.inside_triton -= 1
    interpreter.GridExecutor.__call__ = launch
    return lambda: setattr(interpreter.GridExecutor, "__call__", call)


def count_cell(cell: str, rows: int, steps: int, geometry: str) -> dict:
    fam, kernel, mode, scen, sched = cell.split(".")
    cfg = SweepConfig(families=(fam,), kernels=(kernel,), modes=(mode,), schedules=(sched,),
                      geometry=((fam, geometry),), rows=rows, tokens=100_000, local_every=8)
    chunk = max(steps, 16)
    run = CellRun(CellSpec(fam, kernel, mode, scen, sched), cfg, "cpu", chunk=chunk, fast=False)
    run.fast = FastCell(run, static=True, fused=True)
    run.run_steps(chunk)  # the first chunk: compiles and the first flushes
    fast, c = run.fast, _Counter()
    restore = _count_triton_launches(c)
    c.wrap(fast.ls.kernel, "launch_verify", "kernel")
    c.wrap(fast.ls.kernel, "launch_commit", "kernel")
    c.wrap(fast.ref, "step", "reference")
    c.wrap(fast.ref, "step_magnitude", "reference")  # with the readout magnitude from the fused products
    c.wrap(drift_fast, "readout_magnitude", "magnitude")
    c.wrap(fast, "_bound_advance", "bound")
    c.wrap(drift_fast, "bound_scan", "bound")
    c.wrap(fast, "_rel", "metric")
    c.wrap(fast, "_keep", "selection")
    c.wrap(fast, "_advance", "shadow")
    c.wrap(fast, "_events", "host events")
    c.wrap(fast, "_bound_step", "host events")
    c.wrap(fast, "_check_outputs", "chunk end")
    c.wrap(fast, "_load_chunk", "chunk end")
    s0 = run.step
    try:
        with c:
            run.run_steps(steps)
    finally:
        restore()
    n = run.step - s0
    per = {p: round(v / n, 1) for p, v in sorted(c.ops.items(), key=lambda kv: -kv[1])}
    return {"cell": cell, "geometry": geometry, "rows": rows, "steps": n,
            "ops_per_step": round(sum(c.ops.values()) / n, 1), "by_part": per,
            "host_syncs_per_step": round(c.syncs / n, 2),
            "top_ops": {p: dict(v.most_common(8)) for p, v in c.names.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("cells", nargs="*", default=[f"{f}.triton-replay.s32a16.long-memory.{s}"
                                               for f in ("mamba2", "gdn") for s in ("standard", "spec-random")])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--geometry", default="tiny")
    a = p.parse_intermixed_args()
    res = [count_cell(c, a.rows, a.steps, a.geometry) for c in a.cells]
    for r in res:
        print(json.dumps({k: r[k] for k in ("cell", "ops_per_step", "host_syncs_per_step", "by_part")}), flush=True)
    with open(a.out, "w") as f:
        json.dump({"torch": torch.__version__, "cells": res}, f, indent=1)


if __name__ == "__main__":
    main()
