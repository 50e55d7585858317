"""Validated tokens/s of ``replayssm validate`` (every check on) at real shapes, and where the time goes.

Oracle of the rate: wall-clock of ``run_scenario`` after a warm-up run of the same scenario
(compiles outside the timed run), tokens = accepted tokens of every active row (the number
``replayssm validate`` prints), the repeat run timed apart.  Where the time goes: cProfile of one
run per case (host time: a host sync shows as time in the call that waits), and the host syncs
per step counted with ``torch.cuda.set_sync_debug_mode("warn")`` (grouped by the first-party
frame that asked for it).  Issue 18 item 1's target: >= 5,000 validated tokens/s at batch 8.

    python tools/validate_speed.py --cases mamba2:nano4b gdn:qwen35-4b --batch 8 --steps 40 --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
import traceback
import warnings
from collections import Counter

import torch

from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario


def scenario(fam: str, geom: str, decode: str, batch: int, steps: int, mode: str) -> Scenario:
    window = {"window": 4} if decode == "speculative" else {}
    return Scenario.build(fam, decode=decode, batch=batch, padding=0, geometry=geom, mode=mode, schedule="random",
                          steps=steps, seed=1, buffer=16, **window)


def timed(sc: Scenario, kernel: str, **kw) -> dict:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = run_scenario(sc, kernel, device="cuda", **kw)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"passed": res.passed, "first_failure": None if res.first_failure is None else str(res.first_failure),
            "tokens": res.tokens_accepted, "steps": res.steps_run, "run_s": res.wall_s,
            "tokens_per_s": res.tokens_per_s, "wall_with_finish_s": wall}


def sync_sites(sc: Scenario, kernel: str) -> dict:
    """Host syncs of one run, per first-party call site, and per step."""
    sites: Counter = Counter()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            res = run_scenario(sc, kernel, device="cuda", repeat_check=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for w in got:
        if "synchroniz" not in str(w.message):
            continue
        sites[f"{w.filename.split('/work/')[-1].split('site-packages/')[-1]}:{w.lineno}"] += 1
    n = sum(sites.values())
    return {"syncs": n, "per_step": n / max(res.steps_run, 1), "sites": sites.most_common(25)}


def profile(sc: Scenario, kernel: str, top: int) -> str:
    pr = cProfile.Profile()
    pr.enable()
    run_scenario(sc, kernel, device="cuda", repeat_check=False)
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["mamba2:nano4b", "gdn:qwen35-4b"], help="FAMILY:GEOMETRY")
    ap.add_argument("--decodes", nargs="+", default=["standard", "speculative"])
    ap.add_argument("--kernel", default="triton-replay")
    ap.add_argument("--mode", default="s32a16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", action="store_true", help="cProfile one run per case")
    ap.add_argument("--syncs", action="store_true", help="count host syncs per call site")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    print("gpu", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for case in a.cases:
        fam, geom = case.split(":")
        for dec in a.decodes:
            rec = {"family": fam, "geometry": geom, "decode": dec, "batch": a.batch, "mode": a.mode,
                   "kernel": a.kernel}
            try:
                run_scenario(scenario(fam, geom, dec, a.batch, 3, a.mode), a.kernel, device="cuda", repeat_check=False)
                sc = scenario(fam, geom, dec, a.batch, a.steps, a.mode)
                rec["main"] = timed(sc, a.kernel, repeat_check=False)
                rec["with_repeat"] = timed(sc, a.kernel, repeat_check=True)
                if a.syncs:
                    rec["syncs"] = sync_sites(sc, a.kernel)
                if a.profile:
                    rec["profile"] = profile(sc, a.kernel, a.top)
            except Exception:  # noqa: BLE001 - a failed case is reported, the others still run
                rec["error"] = traceback.format_exc()[-3000:]
            m = rec.get("main", {})
            rep = rec.get("with_repeat", {}).get("wall_with_finish_s", 0)
            print(f"{fam} {geom} {dec} b{a.batch} {a.mode}: {m.get('tokens_per_s', float('nan')):,.0f} tokens/s "
                  f"({m.get('tokens')} tokens, {m.get('steps')} steps, {m.get('run_s', 0):.2f} s, passed "
                  f"{m.get('passed')}); with the repeat run {rep:.2f} s"
                  f"; syncs/step {rec.get('syncs', {}).get('per_step')}", flush=True)
            if "error" in rec:
                print(rec["error"], flush=True)
            if "syncs" in rec:
                for site, n in rec["syncs"]["sites"][:12]:
                    print(f"    sync {n:5d}  {site}")
            if "profile" in rec:
                print(rec["profile"])
            rows.append(rec)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
