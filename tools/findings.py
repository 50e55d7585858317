"""Issue 13's validate findings in one process (imports and Triton compiles paid once): each case runs
``run_scenario`` -- the comparison path of ``replayssm validate`` -- at the family's real geometry,
batch 8 (``--batch``), on the exhaustive schedule and on a long random one, and prints one JSON line per run:
verdict, first failures (check, step, row, position, message), worst error in units of the bound and
of u, tokens, wall time.  Our kernels run beside the adapters on the same scenarios: a verdict on an
external kernel counts only where ours (a correct implementation) passes the same run.

Usage: python tools/findings.py [--steps 150] [--record FILE] > findings_validate.jsonl

``--record FILE`` also appends one ``findings`` record per run (schema replayssm.record/1); ``replayssm
results page`` shows them with the rule above (the ``control`` column: whether ours passed the same case).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from replayssm import adapters
from replayssm.families import family
from replayssm.guard import check_record_path
from replayssm.records import Recorder, append
from replayssm.records.jobs import validate_record
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

CASES = """
mamba2 vllm-replay standard s32a16
mamba2 vllm-replay-state standard s32a16
mamba2 triton-replay standard s32a16
mamba2 vllm-baseline standard s32a16
mamba2 triton-baseline standard s32a16
mamba2 vllm-replay speculative s32a16-tf32
mamba2 triton-replay speculative s32a16-tf32
mamba2 vllm-baseline speculative s32a16
mamba2 triton-baseline speculative s32a16
gdn vllm-replay standard s32a16
gdn triton-replay standard s32a16
gdn vllm-replay speculative s32a16
gdn triton-replay speculative s32a16
gdn vllm-baseline speculative s32a16
gdn fla-baseline speculative s32a16
gdn triton-baseline speculative s32a16
"""


def one(fam: str, kernel: str, decode: str, mode: str, schedule: str, steps: int, device: str, batch: int = 8,
        recorder: Recorder | None = None) -> dict:
    geometry = {"mamba2": "nano4b", "gdn": "qwen35-4b"}.get(fam, family(fam).bench_geometry)
    kw = dict(window=4, buffer=12) if decode == "speculative" else dict(buffer=16)
    if schedule != "exhaustive":
        kw["steps"] = steps
    sc = Scenario.build(fam, decode=decode, mode=mode, geometry=geometry, batch=batch, schedule=schedule, **kw)
    t0 = time.perf_counter()
    res = run_scenario(sc, kernel, device=device)
    rec = {"family": fam, "kernel": kernel, "decode": decode, "mode": mode, "schedule": schedule,
           "geometry": geometry, "passed": res.passed, "headline": res.headline(), "steps": res.steps_run,
           "tokens": res.tokens_accepted, "wall_s": round(time.perf_counter() - t0, 1),
           "failure_counts": res.failure_counts, "summary": res.summary,
           "first_failures": [{"check": f.check, "step": f.step, "row": f.row, "position": f.position,
                               "message": f.message[:400]} for f in res.failures[:3]]}
    if res.exception:
        rec["exception"] = res.exception.get("message", "")[:400]
    if recorder is not None:
        rec["record"] = validate_record(recorder, res, {"batch": batch})
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--schedules", default="exhaustive,random")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--skip", default="", help="comma list of kernel names to leave out")
    ap.add_argument("--record", default=None, metavar="FILE", help="append one findings record per run")
    a = ap.parse_args()
    check_record_path(a.record)
    recorder = Recorder("findings", device=a.device, source="tools/findings.py") if a.record else None
    print(json.dumps({"adapters": {k: v[1] for k, v in adapters.load().items()}}), flush=True)
    for line in CASES.strip().splitlines():
        fam, kernel, decode, mode = line.split()
        if kernel in a.skip.split(","):
            continue
        for schedule in a.schedules.split(","):
            try:
                rec = one(fam, kernel, decode, mode, schedule, a.steps, a.device, a.batch, recorder)
            except Exception as e:  # noqa: BLE001 - a case that cannot run is reported, the rest go on
                rec = {"family": fam, "kernel": kernel, "decode": decode, "mode": mode, "schedule": schedule,
                       "error": f"{type(e).__name__}: {str(e)[:400]}"}
            if "record" in rec:
                append(a.record, [rec.pop("record")])
            print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
