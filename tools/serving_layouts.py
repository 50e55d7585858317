"""Issue 14 on a GPU: every kernel declaring the serving layouts (ours and, with the vLLM tree carried,
the vLLM adapters) validated on CUDA at real geometry, one ``run_scenario`` per (kernel, plan, batch).

Oracle: the validation engine (fp64 reference on the accepted stream, the literal model every
``--literal-every`` steps and the fp64 running-error bound between, exact invariants).  Plans:
``packed`` (the ragged schedule, a window length per row, tokens packed with query_start_loc, rows
permuted every step) and ``mixed`` (runs of standard steps on the speculative slots).  Expected:
every run passes.  Writes one JSON line per run to ``--out`` (``serving.jsonl``) and a summary line
per run on stdout; stops starting runs after ``--deadline`` seconds.
"""

from __future__ import annotations

import argparse
import json
import time

from replayssm import adapters
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import kernels
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

MODES = ("s32a16", "s32a16-tf32", "s32a32-tf32", "s32a32")
GEOMETRY = {"mamba2": "nano4b", "gdn": "qwen35-4b", "kda": "kimi-linear-48b"}
PLANS = {"packed": {"schedule": "ragged", "schedule_params": {"layout": "packed", "permute_rows": True}},
         "mixed": {"schedule": "mixed", "schedule_params": {"switch_prob": 0.5, "layout": "packed"}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--literal-every", type=int, default=8)
    ap.add_argument("--deadline", type=float, default=420.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny geometry (a CPU dry run under the interpreter)")
    a = ap.parse_args()
    print(json.dumps(adapters.load(force=True)))
    t0, dec = time.time(), DecodeConfig("speculative", 4, 12)
    with open(f"{a.out}/serving.jsonl", "w") as f:
        for (family, name), cls in sorted(kernels().items()):
            if cls.kind == "mutant" or name.startswith("literal") or not cls.supports_packed_layout:
                continue
            mode = next((m for m in MODES if cls.unsupported_reason(parse_mode(m), dec, {}) is None), None)
            for plan, fields in PLANS.items():
                if plan == "mixed" and not (cls.supports_mixed_decode and "standard" in cls.decodes):
                    continue
                for batch in (int(b) for b in a.batches.split(",")):
                    if mode is None or time.time() - t0 > a.deadline:
                        continue
                    geometry = "tiny" if a.tiny else GEOMETRY[family]
                    sc = Scenario.build(family, geometry=geometry, mode=mode, batch=batch, steps=a.steps, **fields)
                    t = time.time()
                    res = run_scenario(sc, cls, device=a.device, literal_every=a.literal_every, repeat_check=False)
                    row = {"family": family, "kernel": name, "plan": plan, "batch": batch, "mode": mode,
                           "passed": res.passed, "exception": res.exception, "seconds": round(time.time() - t, 1),
                           "coverage": {k: str(v) for k, v in res.coverage.items()},
                           "failures": [str(x) for x in res.failures[:3]]}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(f"{'PASS' if res.passed else 'FAIL'} {family} {name} {plan} B{batch} {mode} "
                          f"{row['seconds']} s {row['failures'][:1]}", flush=True)


if __name__ == "__main__":
    main()
