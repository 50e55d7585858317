"""Issue 47 on the GPU: does a -tf32 mode still judge the state?  The vLLM fork's Mamba-2 replay kernel
(``vllm-replay``; its speculative verify folds the checkpoint with bf16 weights, docs/findings.md) and our
``triton-replay`` on the same scenarios: ``nano4b``, batch 8, the exhaustive schedule (and ``--schedules``),
speculative (T' = 4, B = 12) and standard (L = 16) decode, at ``s32a16-tf32`` and ``s32a16``.  A case a
kernel does not implement is recorded with its refusal (the fork's speculative kernel reads out with a
tf32 dot under 16-bit activations: it implements s32a16-tf32, not s32a16).

Prints one JSON line per run (verdict, worst output and state bound ratios, failure counts, the first
failures with value / bound) and a table at the end; ``--json FILE`` writes all records.  The
expectation (issue 47): vllm-replay speculative fails at s32a16-tf32 (flush-checkpoint measured at
2.19x the bound; it passed at 0.055x once the tf32 dot's u entered the state unit), triton-replay passes.

Usage: python tools/tf32_state.py [--vllm-src PATH] [--json FILE] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def one(kernel: str, decode: str, mode: str, schedule: str, steps: int, device: str, batch: int,
        geometry: str = "nano4b") -> dict:
    from replayssm.registry import get
    from replayssm.scenarios.scenario import Scenario
    from replayssm.validators.engine.runner import run_scenario

    kw = dict(window=4, buffer=12) if decode == "speculative" else dict(buffer=16)
    if schedule != "exhaustive":
        kw["steps"] = steps
    sc = Scenario.build("mamba2", decode=decode, mode=mode, geometry=geometry, batch=batch, schedule=schedule, **kw)
    rec = {"kernel": kernel, "decode": decode, "mode": mode, "schedule": schedule, "geometry": geometry, "batch": batch}
    reason = get(kernel, "mamba2").unsupported_reason(sc.precision, sc.decode_config, dict(sc.kernel_options))
    if reason:
        return {**rec, "verdict": "unsupported", "reason": reason}
    t0 = time.perf_counter()
    res = run_scenario(sc, kernel, device=device)
    firsts = [{"check": f.check, "step": f.step, "row": f.row, "value": f.value, "bound": f.bound,
               "ratio": (f.value / f.bound) if f.value is not None and f.bound else None, "message": f.message[:300]}
              for f in res.failures[:3]]
    return {**rec, "verdict": "PASS" if res.passed else "FAIL", "steps": res.steps_run, "tokens": res.tokens_accepted,
            "wall_s": round(time.perf_counter() - t0, 1), "output_bound_ratio": res.summary.get("worst bound_ratio"),
            "state_bound_ratio": res.summary.get("worst state_bound_ratio"),
            "failure_counts": dict(res.failure_counts), "first_failures": firsts,
            **({"exception": res.exception.get("message", "")[:400]} if res.exception else {})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-src", default=os.environ.get("REPLAYSSM_VLLM_SRC"),
                    help="the vLLM ReplaySSM fork's source tree (default $REPLAYSSM_VLLM_SRC)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--schedules", default="exhaustive")
    ap.add_argument("--steps", type=int, default=150, help="steps of a non-exhaustive schedule")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--geometry", default="nano4b", help="a Mamba-2 preset (tiny: a CPU smoke run)")
    ap.add_argument("--modes", default="s32a16-tf32,s32a16")
    ap.add_argument("--kernels", default="vllm-replay,triton-replay")
    ap.add_argument("--json", metavar="FILE", help="write every record here")
    a = ap.parse_args(argv)
    if a.vllm_src:
        if not os.path.isdir(a.vllm_src):
            ap.error(f"--vllm-src: expected the vLLM fork's source directory, got {a.vllm_src!r}")
        os.environ["REPLAYSSM_VLLM_SRC"] = a.vllm_src
    from replayssm import adapters

    loaded = adapters.load(force=True)
    print(json.dumps({"adapters": {k: v[1] for k, v in loaded.items()}}), flush=True)
    recs = []
    for kernel in a.kernels.split(","):
        for decode in ("speculative", "standard"):
            for mode in a.modes.split(","):
                for schedule in a.schedules.split(","):
                    try:
                        rec = one(kernel, decode, mode, schedule, a.steps, a.device, a.batch, a.geometry)
                    except Exception as e:  # noqa: BLE001 - a case that cannot run is reported, the rest go on
                        rec = {"kernel": kernel, "decode": decode, "mode": mode, "schedule": schedule,
                               "verdict": "error", "error": f"{type(e).__name__}: {str(e)[:400]}"}
                    recs.append(rec)
                    print(json.dumps(rec), flush=True)
    print("\n| kernel | decode | mode | schedule | verdict | state ratio | output ratio | first failure |")
    print("|---|---|---|---|---|---|---|---|")
    for r in recs:
        ff = (r.get("first_failures") or [{}])[0]
        first = (f"{ff['check']} @ {ff['step']} ({ff['ratio']:.3g}x)" if ff.get("ratio") else ff.get("check", "")) \
            if ff else r.get("reason", r.get("error", ""))[:80]
        sr, orat = r.get("state_bound_ratio"), r.get("output_bound_ratio")
        print(f"| {r['kernel']} | {r['decode']} | {r['mode']} | {r['schedule']} | {r['verdict']} | "
              f"{'' if sr is None else f'{sr:.3g}'} | {'' if orat is None else f'{orat:.3g}'} | {first} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
