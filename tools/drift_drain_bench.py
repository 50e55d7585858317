"""The drift drain's host time for one chunk of a speculative cell: ``BinnedCurve.add`` per pending item
against ``BinnedCurve.add_groups`` once per curve (what ``CellRun._drain`` does; the same
bits, tests/jobs/test_drift_analysis.py).

    python tools/drift_drain_bench.py

Synthetic chunks shaped like a spec-random cell's at 8 rows (64 steps: ~58 flush errors of 1-2 rows, ~8
local errors, a few state samples), 200 of them, each way twice (CPU).
"""
from __future__ import annotations

import time

import numpy as np

from replayssm.validators.jobs.drift.analysis import BinnedCurve

N = 125_000  # tokens per row of a full-report cell


def chunk(rng: np.random.Generator) -> dict[str, list[tuple]]:
    """One chunk's pending errors per curve, in step order: (positions, errors) items."""
    adds: dict[str, list[tuple]] = {"flush": [], "flush_local": [], "state": []}
    for _ in range(64):
        if rng.random() < 0.9:
            rows = int(rng.integers(1, 3))
            err = rng.random(rows) * 1e-3
            adds["flush"].append((rng.integers(1, 2000, rows), err))
            adds["state"].append((rng.integers(1, N, rows), err))
            if rng.random() < 0.13:
                adds["flush_local"].append((rng.integers(1, 2000, 1), rng.random(1) * 1e-4))
        if rng.random() < 0.05:
            adds["state"].append((rng.integers(1, N, 2), rng.random(2) * 1e-3))
    return adds


def main() -> None:
    rng = np.random.default_rng(0)
    chunks = [chunk(rng) for _ in range(200)]
    items = sum(len(v) for c in chunks for v in c.values()) / len(chunks)
    for how in ("add per item", "add_groups", "add per item", "add_groups"):
        curves = {k: BinnedCurve.new(N) for k in ("flush", "flush_local", "state")}
        t0 = time.perf_counter()
        for c in chunks:
            for name, its in c.items():
                if how == "add_groups":
                    curves[name].add_groups(its)
                else:
                    for t, e in its:
                        curves[name].add(t, e)
        dt = (time.perf_counter() - t0) / len(chunks)
        print(f"{how}: {dt * 1e3:.2f} ms per chunk of 64 steps ({dt / 64 * 1e6:.0f} us a step), "
              f"{items:.0f} adds a chunk")


if __name__ == "__main__":
    main()
