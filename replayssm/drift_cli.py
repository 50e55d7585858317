"""``replayssm drift``: long lock-step runs against fp64, growth-law fits, budgets and reports.

Oracle: :mod:`replayssm.validators.jobs.drift.sweep` (the runs), :mod:`replayssm.validators.jobs.drift.report`
(the analysis and the JSON/Markdown/HTML reports), :mod:`replayssm.validators.jobs.drift.budgets`
(``--check`` against golden/tolerances.toml).  With no options it runs the CPU default: both
families, the literal ReplaySSM models, six precision modes, the long-memory scenario, standard
decode and three speculative schedules, tiny geometry, 2 rows x 2,048 tokens per cell; reports
land in ``out/drift/``.

Exit codes (:data:`replayssm.cli.EXIT_CONTRACT`): 0 pass, 1 a cell failed the default judgement
(:mod:`replayssm.validators.jobs.drift.verdict`: a non-finite output or state, an exact check, an error
above the gross bound, 2^12 u capped at max(1/2, 2^7 u); one ``drift: FAIL`` line per cell), a kernel exceeds its budget
(``--check``) or a cell raised or stopped early (unless ``--allow-incomplete``), 2 bad usage or input, 3 environment
(unwritable ``--out``, no device, a sweep that would not fit in memory, another writer on ``--out``).

Resume: a killed or time-boxed run continues where it stopped when run again with the same
arguments and ``--out`` (each cell checkpoints every ``--checkpoint-every`` seconds); finished cells
are reused only when their recorded configuration, kernel code and versions match exactly.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

from replayssm import __version__, adapters
from replayssm.cli import EXIT_CONTRACT
from replayssm.cli_list import use_vllm_src
from replayssm.families import preset
from replayssm.guard import (
    EnvironmentProblem,
    check_fits,
    check_name,
    check_record_path,
    check_writable,
    float_in,
    footprint,
    int_at_least,
    output_lock,
    ring_rows_of,
)
from replayssm.precision import parse_mode
from replayssm.records import Recorder, add_record_argument, append, describe_commit, git_state
from replayssm.records.jobs import drift_records, source
from replayssm.registry import get
from replayssm.validators.jobs.drift import sweep as D
from replayssm.validators.jobs.drift.budgets import BUDGET_LAWS, Budget, format_budgets, load_budgets
from replayssm.validators.jobs.drift.report import analyse, write_reports
from replayssm.validators.jobs.drift.sweep import SweepConfig, default_devices
from replayssm.validators.jobs.scaleout.claims import report_lock, run_claimed
from replayssm.validators.jobs.scaleout.ray_backend import require_ray, run_ray
from replayssm.validators.jobs.scaleout.shards import shard_from_env

DEFAULTS = {"families": "mamba2,gdn", "kernels": "literal-replay",
            "modes": "s32a32,s32a16,s16a16,sfp16a16,sfp16a16-sr,sfp8a16", "scenarios": "long-memory",
            "schedules": "standard,spec-random,spec-always-1,spec-always-T", "geometry": "tiny"}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "drift", help="long lock-step drift runs against fp64: growth laws, budgets, reports",
        description="Run kernels x precision modes x scenarios in lock-step with the fp64 reference for many "
                    "tokens (standard decode and speculative schedules), fit the growth law of the error, and "
                    "write JSON/Markdown/HTML reports. --check fails when a kernel exceeds its budget.",
        epilog="resume: after a kill or a --deadline, run the same command again with the same --out: finished "
               "cells whose recorded configuration, kernel code and versions match are reused, cut-short cells "
               "continue from their checkpoint, crashed cells rerun; a folder holding another sweep is refused. "
               "A cell that raised or stopped early fails the run (exit 1) unless --allow-incomplete. Without "
               "--check a cell fails (exit 1) on a non-finite output or state, a failed exact check, or an error "
               "above the gross bound (2^12 x its mode's unit roundoff u, capped at max(1/2, 2^7 u)); --check adds "
               "the budgets. "
               + EXIT_CONTRACT)
    g = p.add_argument_group("sweep")
    g.add_argument("--families", default=DEFAULTS["families"], help="comma list (default: %(default)s)")
    g.add_argument("--kernels", default=DEFAULTS["kernels"],
                   help="registered kernel names (kernels of your own: --import FILE.py|MODULE first; "
                        "default: %(default)s)")
    g.add_argument("--modes", default=DEFAULTS["modes"], help="precision-mode ids (default: %(default)s)")
    g.add_argument("--scenarios", default=DEFAULTS["scenarios"],
                   help="input regimes (mild, long-memory, fast-forget, large-delta, heavy-tailed, near-fp16-limit; "
                        "default: %(default)s)")
    g.add_argument("--schedules", default=DEFAULTS["schedules"], help="standard, spec-random, spec-always-1, "
                                                                       "spec-always-T (default: all)")
    g.add_argument("--geometry", default=DEFAULTS["geometry"],
                   help="a preset for every family (tiny) or family=preset pairs (mamba2=nano4b,gdn=qwen35-4b)")
    g.add_argument("--rows", type=int_at_least(1), default=2,
                   help="sequences per cell (batch rows; default: %(default)s)")
    g.add_argument("--tokens", type=int_at_least(SweepConfig.blocks), default=2048,
                   help="accepted tokens per sequence (default: %(default)s)")
    g.add_argument("--buffer", type=int_at_least(1), default=16, help="standard-decode buffer L (default: %(default)s)")
    g.add_argument("--window", type=int_at_least(2), default=4, help="speculative window T' (default: %(default)s)")
    g.add_argument("--history", type=int_at_least(2), default=12,
                   help="speculative history block B (default: %(default)s)")
    g.add_argument("--seed", type=int_at_least(0), default=0)
    g.add_argument("--state-samples", type=int_at_least(2), default=48,
                   help="log-spaced committed-state samples per row")
    g.add_argument("--local-every", type=int_at_least(1), default=1,
                   help="measure the error one flush injects at every n-th flush (default: every flush)")
    a = p.add_argument_group("analysis")
    a.add_argument("--budget", type=float_in(0, what="an error level"), default=1e-2,
                   help="your output-error budget (default: %(default)s)")
    a.add_argument("--horizon", type=float_in(1, lo_open=False, what="a horizon in tokens"), default=None,
                   help="your horizon in tokens (default: --tokens)")
    a.add_argument("--criterion", choices=("aic", "bic"), default="aic")
    a.add_argument("--alpha", type=float_in(0, 1, what="a significance level"), default=0.01,
                   help="significance level of the speculation test")
    a.add_argument("--check", action="store_true",
                   help="also fail (exit 1) when a kernel exceeds its budget (without it a run fails on non-finite "
                        "values, failed exact checks and errors above 2^12 u capped at max(1/2, 2^7 u))")
    a.add_argument("--budgets", default=None, help="budget file (default: golden/tolerances.toml)")
    a.add_argument("--write-budgets", default=None, metavar="PATH",
                   help="derive a budget file from this run's literal-replay cells (x --budget-factor)")
    a.add_argument("--budget-factor", type=float_in(1, lo_open=False, what="a factor"), default=4.0,
                   help="budgets = this x the run's peaks (>= 1; default: %(default)s)")
    r = p.add_argument_group("running")
    r.add_argument("--out", default="out/drift", help="output folder (default: %(default)s)")
    r.add_argument("--shard", default="0/1",
                   help="run shard i of n of the cells, balanced by estimated cost (a CI matrix; default 0/1); auto: "
                        "from REPLAYSSM_SHARD=i/n, SLURM_ARRAY_TASK_ID/_COUNT or BUILDKITE_PARALLEL_JOB/_COUNT")
    r.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="merge the shard folders DIR... into one report in --out (no runs)")
    r.add_argument("--device", default="auto", help="auto (every visible GPU, else cpu), cpu, cuda, cuda:N")
    r.add_argument("--vllm-src", metavar="PATH", help="vLLM ReplaySSM source tree for the vllm adapters "
                   "(sets REPLAYSSM_VLLM_SRC)")
    r.add_argument("--workers", type=int_at_least(1), default=None,
                   help="processes (default: one per GPU; on CPU one per core, at most 4)")
    r.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local: --workers processes on this host; ray: one Ray task per cell on a Ray cluster "
                        "(pip install 'replayssm[ray]'; docs/scaleout.md)")
    r.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="the Ray cluster to join (--backend ray; default: RAY_ADDRESS, else a local cluster)")
    r.add_argument("--gpus-per-cell", type=float_in(0, 1, hi_open=False, what="a fraction of a GPU"), default=None,
                   help="GPUs one Ray task takes, 0 < x <= 1: 0.25 packs four cells per card (--backend ray; "
                        "default 1)")
    r.add_argument("--claim", action="store_true",
                   help="claim mode: many processes (any hosts) share one --out, each running the cells it claims; "
                        "every one writes the report once all cells have results (docs/scaleout.md)")
    r.add_argument("--claim-ttl", type=float_in(0, what="a number of seconds"), default=None, metavar="SECONDS",
                   help="a claim whose heartbeat is older than this is taken over (--claim; default 120)")
    r.add_argument("--checkpoint-every", type=float_in(0, lo_open=False, what="a number of seconds"), default=30.0,
                   help="seconds between cell checkpoints")
    r.add_argument("--deadline", type=float_in(0, what="a number of seconds"), default=None, metavar="SECONDS",
                   help="time-box the run: cells stop at this wall-clock budget and the report says how many "
                        "tokens each reached (not bit-comparable with other runs)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_record_argument(r)
    r.add_argument("--allow-incomplete", action="store_true",
                   help="exit 0 although a cell raised, stopped early (--deadline) or never started")
    return p


def _list(text: str, name: str) -> tuple[str, ...]:
    """A comma list of names; each becomes part of cell ids and so of file names (``check_name``)."""
    items = tuple(x.strip() for x in str(text).split(",") if x.strip())
    if not items:
        raise ValueError(f"--{name}: expected a comma-separated list, got {text!r}")
    if name != "geometry":
        for x in items:
            check_name(x, f"--{name}")
    return items


def _geometry(text: str, families) -> dict:
    if "=" not in text:
        return {f: check_name(text.strip(), "--geometry") for f in families}
    out = {}
    for part in _list(text, "geometry"):
        if "=" not in part:
            raise ValueError(f"--geometry: expected family=preset pairs, got {part!r}")
        f, g = (check_name(x.strip(), "--geometry") for x in part.split("=", 1))
        out[f] = g
    return out


_CONFIG_FLAGS = ("families", "kernels", "modes", "scenarios", "schedules", "geometry", "rows", "tokens", "buffer",
                 "window", "history", "seed", "state_samples", "local_every")


def config_from_args(args):
    try:
        return _config(args)
    except ValueError as e:
        field, _, rest = str(e).partition(": ")
        if field in _CONFIG_FLAGS:
            raise ValueError(f"--{field.replace('_', '-')}: {rest}") from None
        raise


def _config(args):
    families = _list(args.families, "families")
    return SweepConfig(families=families, kernels=_list(args.kernels, "kernels"), modes=_list(args.modes, "modes"),
                       distributions=_list(args.scenarios, "scenarios"), schedules=_list(args.schedules, "schedules"),
                       geometry=tuple(sorted(_geometry(args.geometry, families).items())), rows=args.rows,
                       tokens=args.tokens, buffer=args.buffer, window=args.window, history=args.history,
                       seed=args.seed, state_samples=args.state_samples, local_every=args.local_every)


def _devices(text: str) -> list[str]:
    import torch
    if text == "auto":
        return default_devices()
    if text == "cpu":
        return ["cpu"]
    if text == "cuda":
        if not torch.cuda.is_available():
            raise EnvironmentProblem("--device: cuda asked for but no CUDA device is visible")
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise EnvironmentProblem(f"--device: {text} asked for but no CUDA device is visible")
        return [text]
    raise ValueError(f"--device: expected auto, cpu, cuda or cuda:N, got {text!r}")


def environment(devices: list[str]) -> dict:
    import torch
    import triton

    dev = devices[0]
    name = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu"
    return {"replayssm": __version__, "torch": torch.__version__, "triton": triton.__version__, "device": name}


def git_commit() -> str:
    """HEAD, with ``+uncommitted`` when a source file this process imported from the checkout
    differs from HEAD (:func:`replayssm.records.git_state`)."""
    return describe_commit(*git_state())


def derive_budgets(report: dict, factor: float, kernel: str = "literal-replay", env: dict | None = None):
    """Budgets from a report: ``factor`` x the largest peak of ``kernel`` per family x mode over
    the report's scenarios and schedules; allowed laws = bounded + every law chosen there."""
    if not factor >= 1:
        raise ValueError(f"--budget-factor: expected >= 1, got {factor!r}")
    sw = report["sweep"]
    groups: dict = {}
    for c in report["cells"]:
        if c["kernel"] == kernel:
            groups.setdefault((c["family"], c["mode"]), []).append(c)
    if not groups:
        raise ValueError(f"--write-budgets: the run has no {kernel} cells to derive budgets from")
    env = env or report.get("environment", {})
    hardware = f"{env.get('device', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}"
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    commit = git_commit()
    out, skipped = [], []
    for (fam, mode), cs in sorted(groups.items()):
        peaks_o = [c["output"]["peak"] for c in cs]
        peaks_s = [c["state"]["peak"] for c in cs]
        laws = {"bounded"}
        for c in cs:
            for blk in (c["output"], c["state"]):
                law = (blk.get("fit") or {}).get("law")
                if law in BUDGET_LAWS:
                    laws.add(law)
                elif law in ("exponential", "nonfinite"):
                    skipped.append(f"{fam}.{mode}: {c['id']} grows as {law}; not budgeted")
        if any(p is None or p <= 0 for p in peaks_o + peaks_s) or any(s.startswith(f"{fam}.{mode}:") for s in skipped):
            skipped.append(f"{fam}.{mode}: a non-finite or zero peak; not budgeted")
            continue
        geo = sw["geometry"][fam]
        derived = (f"{factor:g} x the largest peak binned RMS error of {kernel} over scenarios "
                   f"{'/'.join(sw['distributions'])} x schedules {'/'.join(sw['schedules'])} "
                   f"({geo} geometry, {sw['rows']} rows x {sw['tokens']} tokens, seed {sw['seed']}; "
                   f"replayssm drift --write-budgets)")
        out.append(Budget(fam, mode, factor * max(peaks_o), factor * max(peaks_s),
                          tuple(x for x in BUDGET_LAWS if x in laws), int(sw["tokens"]),
                          {"derived": derived, "hardware": hardware, "date": date, "commit": commit}))
    return out, skipped


def _flagged(call):
    """``call()``, a ``shard:`` / ``merge:`` refusal of the drift module naming its flag."""
    try:
        return call()
    except ValueError as e:
        field, sep, rest = str(e).partition(": ")
        if sep and field in ("shard", "merge"):
            raise ValueError(f"--{field}: {rest}") from None
        raise


def sweep_footprint(cfg: SweepConfig, workers: int) -> list[tuple[str, int, int, str]]:
    """The memory estimate of ``workers`` cells running side by side (``guard.footprint``; the
    largest geometry and ring of the sweep; a cell's plan is at most about 2 x --tokens steps, the
    doubling search of the random schedules), each cause charged to its flag, plus the log-spaced
    state-sample targets (four int64/float64 arrays of --state-samples entries per cell)."""
    geo = max((preset(dict(cfg.geometry)[f], f) for f in cfg.families), key=lambda g: math.prod(g.state_shape))
    rings = [(1, "--rows")]
    if any(D.SCHEDULES[s][0] == "speculative" for s in cfg.schedules):
        rings.append((ring_rows_of("speculative", cfg.window, cfg.history),
                      "--window" if cfg.window / 4 > cfg.history / 12 else "--history"))
    if any(D.SCHEDULES[s][0] == "standard" for s in cfg.schedules):
        rings.append((ring_rows_of("standard", 1, cfg.buffer), "--buffer"))
    ring, ring_flag = max(rings)
    terms = footprint(geo, rows=cfg.rows, slots=cfg.rows, window=cfg.window, ring_rows=ring, steps=2 * cfg.tokens,
                      flags={"rows": "--rows", "slots": "--rows",
                             "ring": ring_flag if ring / 16 > cfg.rows / 2 else "--rows",
                             "window": "--window" if cfg.window / 4 > cfg.rows / 2 else "--rows",
                             "steps": "--tokens" if cfg.tokens / 2048 >= cfg.rows / 2 else "--rows"},
                      copies=workers)
    samples = workers * 32 * cfg.state_samples
    what = f"{workers} worker(s) x {cfg.state_samples:,} state samples x 32 B"
    return [*terms, ("--state-samples", samples, 0, what)]


def _check_scaleout(args, shard) -> None:
    """The scale-out flags (docs/scaleout.md), refused before any work."""
    if args.backend != "ray":
        for flag, v in (("--ray-address", args.ray_address), ("--gpus-per-cell", args.gpus_per_cell)):
            if v is not None:
                raise ValueError(f"{flag}: only with --backend ray")
    if args.claim_ttl is not None and not args.claim:
        raise ValueError("--claim-ttl: only with --claim")
    if args.claim:
        for flag, bad in (("--merge", args.merge), ("--shard", shard != (0, 1)),
                          ("--backend ray", args.backend == "ray"),
                          ("--workers", args.workers is not None and args.workers > 1)):
            if bad:
                raise ValueError(f"--claim: claim mode runs every cell of the sweep on a shared --out (one "
                                 f"cell at a time per process); it takes no {flag}")
    if args.backend == "ray":
        if args.merge:
            raise ValueError("--backend: --merge runs no cells; give no --backend ray")
        if args.workers is not None:
            raise ValueError("--workers: --backend ray runs one task per cell on the cluster; give --gpus-per-cell")
        try:
            require_ray()
        except ImportError as e:
            raise EnvironmentProblem(str(e)) from None


def run(args) -> int:
    use_vllm_src(args)
    adapters.load()  # the adapters whose source is available register their kernels
    shard = _flagged(lambda: shard_from_env() if args.shard == "auto" else D.parse_shard(args.shard))
    if args.merge and shard != (0, 1):
        raise ValueError("--merge: merging takes no --shard")
    _check_scaleout(args, shard)
    results = None
    if args.merge:
        cfg, results = _flagged(lambda: D.load_cells(args.merge))
    else:
        cfg = config_from_args(args)
    cells, skipped = cfg.cells()
    if not cells:
        raise ValueError("the sweep has no runnable cell: " + "; ".join(s["reason"] for s in skipped[:3]))
    budgets = None
    if args.check or args.budgets:
        budgets = load_budgets(args.budgets)
        for f, m in sorted({(c.family, c.mode) for c in cells}):
            budgets.get_budget(f, m)  # a missing entry fails here, before any work
    devices = _devices(args.device)
    if devices[0] == "cpu":  # kernels written elsewhere the Triton interpreter cannot run faithfully: refused now
        for c in cells:
            refusal = getattr(get(c.kernel, c.family), "interpreter_refusal", lambda m: None)(parse_mode(c.mode))
            if refusal:
                raise ValueError(f"{refusal} (cell {c.id})")
    out = Path(args.out)
    check_writable(out, "--out")
    if args.write_budgets:
        check_writable(args.write_budgets, "--write-budgets", is_dir=False)
    check_record_path(args.record)
    if not args.merge:
        n_workers = args.workers or (len(devices) if devices[0] != "cpu" else 4)
        check_fits(sweep_footprint(cfg, min(n_workers, len(cells))), devices[0])
    env = environment(devices)
    claimed = None
    if args.claim:  # processes share --out: cells are claimed one by one; the lock below is for the report only
        claimed = run_claimed(cfg, out, device=devices[0], ttl=args.claim_ttl or 120.0, progress=not args.no_progress,
                              checkpoint_every_s=args.checkpoint_every, deadline_s=args.deadline)
    with report_lock(out) if args.claim else output_lock(out, "--out"):  # one writer per output folder
        outcome = None
        if args.merge:
            D.prepare_out(cfg, out)
        else:
            workers = args.workers
            if workers is None:
                workers = len(devices) if devices[0] != "cpu" else max(1, min(4, len(os.sched_getaffinity(0))))
            if claimed is not None:
                outcome, workers = claimed, 1
            elif args.backend == "ray":
                outcome = run_ray(cfg, out, shard=shard, device=devices[0], address=args.ray_address,
                                  gpus_per_cell=args.gpus_per_cell or 1.0, progress=not args.no_progress,
                                  checkpoint_every_s=args.checkpoint_every, deadline_s=args.deadline)
            else:
                outcome = D.run_sweep(cfg, out, shard=shard, workers=workers, devices=devices,
                                      progress=not args.no_progress, checkpoint_every_s=args.checkpoint_every,
                                      deadline_s=args.deadline)
            results = []
            for c in D.shard_cells(cells, shard, cfg):
                p = D.cell_path(out, c.id)
                if p.exists():
                    results.append(json.loads(p.read_text()))
                elif c.id in outcome.out_of_memory:
                    skipped.append({"id": c.id, "reason": f"ran out of device memory with {workers} worker process(es) "
                                                          f"on {', '.join(devices)} ({outcome.out_of_memory[c.id]})"})
                else:
                    skipped.append({"id": c.id, "reason": "the --deadline passed before this cell started"})
        report = analyse(cfg, results, skipped=skipped, budget=args.budget, horizon=args.horizon, budgets=budgets,
                         criterion=args.criterion, alpha=args.alpha, environment=env)
        stem = "drift_report" if shard == (0, 1) else f"drift_report.shard-{shard[0]}-of-{shard[1]}"
        paths = write_reports(report, out, stem)
        timing = None
        if outcome is not None:
            timing = {"cells": len(outcome.cells), "cells_run": len(outcome.ran), "wall_s": round(outcome.wall_s, 3),
                      "tokens": outcome.tokens, "tokens_per_s": round(outcome.tokens_per_s, 1), "devices": devices,
                      "workers": workers, **env}
            D.atomic_write(out / f"timing.shard-{shard[0]}-of-{shard[1]}.json", json.dumps(timing, indent=1) + "\n")
            print(f"drift: {len(outcome.ran)} of {len(outcome.cells)} cell(s) run, {outcome.tokens:,} tokens in "
                  f"{outcome.wall_s:.1f} s ({outcome.tokens_per_s:,.0f} validated tokens/s)", file=sys.stderr)
        print(f"drift: reports {paths['html']} {paths['json']} {paths['md']}", file=sys.stderr)
        if args.record:
            rec = Recorder("drift", device=devices[0], device_count=len(devices), source=source(args))
            n = append(args.record, drift_records(rec, report, timing))
            print(f"drift: {n} record(s) appended to {args.record}", file=sys.stderr)
        if outcome is not None and outcome.out_of_memory:
            ids = sorted(outcome.out_of_memory)
            raise EnvironmentProblem(
                f"drift: {len(ids)} cell(s) ran out of device memory with {workers} worker process(es) on "
                f"{', '.join(devices)} ({ids[0]}{', ...' if len(ids) > 1 else ''}: {outcome.out_of_memory[ids[0]]}); "
                f"the report lists them as not run; rerun the same command with fewer --workers: the "
                f"{len(outcome.ran)} cell(s) with results are kept and only the missing ones run")
        if args.write_budgets:
            bs, notes = derive_budgets(report, args.budget_factor, env=env)
            header = ("Drift budgets per family x precision mode (replayssm drift --check).\n"
                      "Fields: docs/drift_report_schema.md (Budgets); written by replayssm drift --write-budgets.")
            D.atomic_write(Path(args.write_budgets), format_budgets(bs, header))
            load_budgets(args.write_budgets)
            for n in notes:
                print(f"drift: {n}", file=sys.stderr)
            print(f"drift: wrote {len(bs)} budget(s) to {args.write_budgets}", file=sys.stderr)
        judged_fail = [c for c in report["cells"] if not c["verdict"]["pass"]]
        for c in judged_fail:  # the default judgement: one line per failing cell
            print(f"drift: FAIL {c['id']}: {'; '.join(c['verdict']['failures'])}", file=sys.stderr)
        incomplete = [(r["id"], r.get("tokens_run", 0), D.stop_reason(r)) for r in results
                      if D.cell_status(r) != "complete"]
        incomplete += [(x["id"], 0, x["reason"]) for x in skipped if "deadline" in x.get("reason", "")]
        for cid, tok, why in incomplete:
            print(f"drift: INCOMPLETE {cid}: stopped at token {tok:,}: {why}", file=sys.stderr)
        if incomplete and not args.allow_incomplete:
            print(f"drift: {len(incomplete)} cell(s) incomplete: exit 1 (rerun the same command to resume, or "
                  f"--allow-incomplete)", file=sys.stderr)
            return 1
        chk = report["check"]
        if chk["enabled"]:
            if chk["pass"]:
                print(f"drift: budget check PASS ({chk['cells']} cells)", file=sys.stderr)
            else:
                for c in report["cells"]:
                    for f in (c["check"] or {}).get("failures", []):
                        print(f"drift: FAIL {c['id']} (budget check): {f}", file=sys.stderr)
        if judged_fail:
            print(f"drift: {len(judged_fail)} cell(s) failed (non-finite values, an exact check, or an error above "
                  f"the gross bound {report['verdict']['gross_rule']}): exit 1", file=sys.stderr)
            return 1
        return 1 if chk["enabled"] and not chk["pass"] else 0


__all__ = ["add_parser", "config_from_args", "derive_budgets", "run"]
