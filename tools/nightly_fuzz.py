"""The nightly fuzz run: 2,000 scenarios for each correct kernel and each legitimate literal variant,
counting false alarms, in parallel processes, split into parts that each fit one device call.

Oracle: a correct kernel (our literal models, the literal model of every bookkeeping policy, the
legitimate literal variants of issue 15, our Triton kernels) must pass every scenario the
``nightly`` fuzz profile's strategies draw (``validators.fuzz.sweep_kernel``: Hypothesis-drawn
scenarios, no shrinking, each run to its first failing step); every failure is a false alarm of
the engine (or a real bug of that kernel) and is kept (scenario JSON + headline) for replay with
``replayssm validate --scenario``.

Jobs are (family, kernel, shard): each kernel's ``--scenarios`` (default 2,000) are split into
shards of ``--shard-size`` scenarios, each with its own Hypothesis seed (``--seed`` + a digest of
kernel and shard), so the parts of a run are independent and their union is the whole run.  Part
``i`` of ``K`` takes every K-th job.  Every job stops drawing new scenarios at the part's deadline
(``--deadline-s``), so one call stays inside the device's per-command limit; the summary says how
many scenarios ran of those planned.

    python tools/nightly_fuzz.py run --set cpu --part 1 --parts 4 --out $OUT     # one part
    python tools/nightly_fuzz.py merge OUT1/nightly_*.json ... > summary.json     # the whole run
    python tools/nightly_fuzz.py plan --set cpu --parts 4                         # jobs per part
    python tools/nightly_fuzz.py run --skip-done OLD/nightly_*.json ...           # finish a cut run

Sets: ``cpu`` (the pure-PyTorch literal kernels, device cpu), ``gpu`` (the Triton kernels,
compiled on the GPU, driven by the engine on the CPU: ``validators/engine/hosted.py``), ``all``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

from replayssm.families import families
from replayssm.records.ledger import append
from replayssm.records.record import Recorder
from replayssm.registry import kernels
from replayssm.validators.engine import runner  # noqa: F401 - registers the policy literals
from replayssm.validators.jobs.fuzz.run import PROFILES, sweep_kernel


def correct_kernels(which: str) -> list[tuple[str, str]]:
    """(family, kernel) of every correct kernel in set ``which``: ``cpu`` = the registered
    ``literal-*`` replay / baseline kernels (literal models, policy literals, legitimate variants),
    ``gpu`` = the ``triton-*`` kernels, ``all`` = both."""
    out = []
    for fam in families():
        for (_f, name), cls in sorted(kernels(fam).items()):
            if cls.kind not in ("replay", "baseline"):
                continue
            if (which in ("cpu", "all") and name.startswith("literal-")) or (
                    which in ("gpu", "all") and name.startswith("triton-")):
                out.append((fam, name))
    return out


def jobs(which: str, scenarios: int, shard_size: int, seed: int, only: str = "") -> list[dict]:
    """Every (kernel, shard) job of the run; ``only``: a comma-separated ``family/kernel`` filter."""
    keep = {x.strip() for x in only.split(",") if x.strip()}
    out = []
    for fam, name in correct_kernels(which):
        if keep and f"{fam}/{name}" not in keep:
            continue
        n_shards = -(-scenarios // shard_size)
        for i in range(n_shards):
            n = min(shard_size, scenarios - i * shard_size)
            digest = int(hashlib.sha256(f"{fam}/{name}/{i}".encode()).hexdigest()[:8], 16)
            out.append({"family": fam, "kernel": name, "shard": i, "examples": n,
                        "seed": (seed * 1_000_003 + digest) % 2**32,
                        "device": "cpu", "kernel_device": "cuda" if name.startswith("triton-") else "cpu"})
    return out


def done_shards(files: list[str]) -> set[tuple]:
    """(family, kernel, shard, seed) of every job that ran all its planned scenarios without an
    error or a failure in the part files ``files`` (a rerun skips them and reruns the rest: cut
    shards, and failing ones after a fix; merge the old and new parts)."""
    done = set()
    for f in files:
        for r in json.loads(Path(f).read_text())["jobs"]:
            if "error" not in r and not r["failures"] and r["scenarios"] == r["planned"]:
                done.add((r["family"], r["kernel"], r["shard"], r["seed"]))
    return done


def part_of(all_jobs: list[dict], part: int, parts: int) -> list[dict]:
    if not 1 <= part <= parts:
        raise SystemExit(f"--part: expected 1 <= part <= parts = {parts}, got {part}")
    return all_jobs[part - 1::parts]


def _run_job(args: tuple[dict, float]) -> dict:
    job, deadline = args
    torch.set_num_threads(1)
    budget = max(0.0, deadline - time.time())
    try:
        res = sweep_kernel(job["kernel"], job["family"], examples=job["examples"], seed=job["seed"],
                           device=job["device"], kernel_device=job.get("kernel_device"), budget_s=budget)
    except Exception as e:  # noqa: BLE001 - a crashed job is reported, not fatal to the part
        res = {"kernel": job["kernel"], "family": job["family"], "seed": job["seed"], "planned": job["examples"],
               "scenarios": 0, "failures": 0, "checks": {}, "examples_failed": [], "error": f"{type(e).__name__}: {e}"}
    res["shard"] = job["shard"]
    return res


def summarise(results: list[dict]) -> dict:
    per = {}
    for r in results:
        key = f"{r['family']}/{r['kernel']}"
        k = per.setdefault(key, {"family": r["family"], "kernel": r["kernel"], "planned": 0, "scenarios": 0,
                                 "false_alarms": 0, "checks": {}, "shards": 0, "errors": 0,
                                 "stopped_by_budget": 0, "wall_s": 0.0})
        k["planned"] += r["planned"]
        k["scenarios"] += r["scenarios"]
        k["false_alarms"] += r["failures"]
        k["shards"] += 1
        k["errors"] += "error" in r
        k["stopped_by_budget"] += bool(r.get("stopped_by_budget"))
        k["wall_s"] = round(k["wall_s"] + r.get("wall_s", 0.0), 1)
        for c, n in r["checks"].items():
            k["checks"][c] = k["checks"].get(c, 0) + n
    for k in per.values():
        k["s_per_scenario"] = round(k["wall_s"] / k["scenarios"], 3) if k["scenarios"] else None
    return {"kernels": per,
            "total": {"scenarios": sum(k["scenarios"] for k in per.values()),
                      "planned": sum(k["planned"] for k in per.values()),
                      "false_alarms": sum(k["false_alarms"] for k in per.values()),
                      "errors": sum(k["errors"] for k in per.values())},
            "examples_failed": [dict(e, kernel=r["kernel"], family=r["family"], shard=r["shard"])
                                for r in results for e in r.get("examples_failed", [])][:50]}


def cmd_run(a) -> int:
    all_jobs = jobs(a.set, a.scenarios, a.shard_size, a.seed, a.only)
    if a.skip_done:
        done = done_shards(a.skip_done)
        all_jobs = [j for j in all_jobs if (j["family"], j["kernel"], j["shard"], j["seed"]) not in done]
    mine = part_of(all_jobs, a.part, a.parts)
    procs = a.procs or os.cpu_count() or 1
    deadline = time.time() + a.deadline_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print(f"nightly fuzz part {a.part}/{a.parts}: {len(mine)} of {len(all_jobs)} jobs, {procs} processes, "
          f"deadline {a.deadline_s} s, profile nightly ({PROFILES['nightly']})", flush=True)
    ctx = mp.get_context("spawn")
    results = []
    with ctx.Pool(min(procs, max(1, len(mine)))) as pool:
        for r in pool.imap_unordered(_run_job, [(j, deadline) for j in mine]):
            results.append(r)
            print(f"  {r['family']}/{r['kernel']} shard {r['shard']}: {r['scenarios']}/{r['planned']} scenarios, "
                  f"{r['failures']} failures{' (' + r['error'] + ')' if 'error' in r else ''}", flush=True)
    summary = summarise(results)
    summary.update({"part": a.part, "parts": a.parts, "set": a.set, "seed": a.seed, "procs": procs,
                    "wall_s": round(time.time() - t0, 1), "jobs": results,
                    "provenance": Recorder("fuzz", device="cuda" if a.set == "gpu" else "cpu").provenance()})
    path = out / f"nightly_{a.set}_part{a.part}of{a.parts}.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    t = summary["total"]
    print(f"part {a.part}/{a.parts}: {t['scenarios']}/{t['planned']} scenarios, {t['false_alarms']} false alarms, "
          f"{t['errors']} errors, {summary['wall_s']} s -> {path}", flush=True)
    return 0


def merged_records(summary: dict, parts: list[dict], run: str) -> list[dict]:
    """One ``fuzz`` record per kernel of a merged run (case ``FAMILY/KERNEL/nightly``: scenarios, false
    alarms, errors, s / scenario), with the provenance the parts carry: every part must name the same
    commit, clean, and the same device, or the merge refuses to record."""
    provs = [p.get("provenance") for p in parts]
    if any(pr is None for pr in provs):
        raise SystemExit("--record: a part file has no provenance (written before parts carried it); "
                         "expected part files of `nightly_fuzz.py run`")
    keys = {(pr["commit"], pr["dirty"], json.dumps(pr["device"], sort_keys=True)) for pr in provs}
    if len(keys) != 1 or next(iter(keys))[1]:
        raise SystemExit(f"--record: the parts must come from one clean commit on one device, got {sorted(keys)}")
    pr = provs[0]
    rec = Recorder("fuzz", source=f"tools/nightly_fuzz.py merge ({run})", commit=pr["commit"], dirty=pr["dirty"],
                   device_info_=pr["device"], versions_=pr["versions"])
    config = {"run": run, "set": parts[0]["set"], "seed": parts[0]["seed"], "profile": "nightly"}
    return [rec.record(f"{k['family']}/{k['kernel']}/nightly",
                       metrics={m: k[m] for m in ("scenarios", "planned", "false_alarms", "errors", "stopped_by_budget",
                                                  "s_per_scenario")},
                       verdict="fail" if k["false_alarms"] or k["errors"] else "pass",
                       config=dict(config, family=k["family"], kernel=k["kernel"], planned=k["planned"]),
                       family=k["family"], kernel=k["kernel"])
            for k in summary["kernels"].values()]


def cmd_merge(a) -> int:
    """The parts' jobs, each (family, kernel, shard) once: the run with more scenarios, and on a tie
    the later file's (a part rerun after hitting its deadline replaces the short one; a shard
    rerun after a fix replaces the failing one: list the files oldest first)."""
    best, parts = {}, [json.loads(Path(f).read_text()) for f in a.files]
    for part in parts:
        for r in part["jobs"]:
            key = (r["family"], r["kernel"], r["shard"], r["seed"])
            if key not in best or r["scenarios"] >= best[key]["scenarios"]:
                best[key] = r
    results = list(best.values())
    summary = summarise(results)
    print(json.dumps(summary, indent=1))
    if a.record:
        append(a.record, merged_records(summary, parts, a.run))
    if a.markdown:
        rows = ["| family | kernel | scenarios | false alarms | s / scenario |", "|---|---|---|---|---|"]
        for k in summary["kernels"].values():
            rows.append(f"| {k['family']} | {k['kernel']} | {k['scenarios']:,} | {k['false_alarms']} | "
                        f"{k['s_per_scenario']} |")
        Path(a.markdown).write_text("\n".join(rows) + "\n")
    return 0


def cmd_plan(a) -> int:
    all_jobs = jobs(a.set, a.scenarios, a.shard_size, a.seed, a.only)
    for p in range(1, a.parts + 1):
        mine = part_of(all_jobs, p, a.parts)
        print(f"part {p}/{a.parts}: {len(mine)} jobs, {sum(j['examples'] for j in mine)} scenarios")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "plan"):
        p = sub.add_parser(name)
        p.add_argument("--set", choices=("cpu", "gpu", "all"), default="cpu")
        p.add_argument("--scenarios", type=int, default=2000, help="scenarios per kernel (the nightly profile's)")
        p.add_argument("--shard-size", type=int, default=50)
        p.add_argument("--seed", type=int, default=20261201)
        p.add_argument("--parts", type=int, default=1)
        p.add_argument("--only", default="", help="comma-separated family/kernel filter (a local smoke run)")
        if name == "run":
            p.add_argument("--part", type=int, default=1)
            p.add_argument("--procs", type=int, default=0, help="processes (default: every CPU core)")
            p.add_argument("--deadline-s", type=float, default=480.0)
            p.add_argument("--out", default=os.environ.get("OUT", "out/nightly"))
            p.add_argument("--skip-done", nargs="*", default=[], metavar="PART_JSON",
                           help="skip the shards these part files completed (finish a run cut by its deadline)")
    m = sub.add_parser("merge")
    m.add_argument("files", nargs="+")
    m.add_argument("--markdown", default="")
    m.add_argument("--record", default="", metavar="FILE",
                   help="append one fuzz record per kernel (case FAMILY/KERNEL/nightly) to FILE")
    m.add_argument("--run", default="nightly", help="the run's name in the records' config (default nightly)")
    a = ap.parse_args(argv)
    for name in ("scenarios", "shard_size", "parts"):
        if getattr(a, name, 1) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(a, name)}")
    return {"run": cmd_run, "merge": cmd_merge, "plan": cmd_plan}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
