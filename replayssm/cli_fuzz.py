"""``replayssm fuzz``: search for failing scenarios with Hypothesis, kernel by kernel.

Every drawn scenario is judged by ``run_scenario`` (the path of ``replayssm validate``); a
failure is shrunk and saved as ``<failures>/<family>-<kernel>.json``, which ``replayssm
validate --scenario FILE`` replays.  ``--budget-s`` spreads a time budget over the kernels and
runs each in chunks of examples with fresh seeds until its share is spent (Hypothesis itself has
no time limit).  Exit codes: :data:`replayssm.cli.EXIT_CONTRACT` (0 when nothing failed, 1 when some
kernel failed; ``--failures`` and ``--json`` are checked writable before the budget is spent).

A marginal scenario (docs/validation.md, "Verdicts") is counted, its worst one saved as
``<failures>/<family>-<kernel>-marginal.json``, and the search goes on (exit 0 when nothing failed);
``--strict`` makes it a failure.  Hypothesis is told each scenario's worst error / bound
(``target``); ``--example-db DIR`` keeps the failing and best-targeted scenarios per kernel and
replays them first on the next run with the same DIR (docs/fuzzing.md, "Example database").
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from replayssm.cli import check_device
from replayssm.cli_backend import add_backend_arguments, check_backend
from replayssm.cli_list import load_kernels
from replayssm.families import family, family_names
from replayssm.guard import check_record_path, check_writable, float_in, int_at_least, name_arg
from replayssm.precision import parse_mode
from replayssm.records import Recorder, add_record_argument, append
from replayssm.records.jobs import fuzz_records, source
from replayssm.registry import get
from replayssm.scenarios.strategies import FUZZ_MODES, supported_decodes
from replayssm.validators.engine import compile_check
from replayssm.validators.engine.fuzz_artifacts import artifact_json
from replayssm.validators.jobs.drift.sweep import parse_shard
from replayssm.validators.jobs.fuzz.run import drawable_modes, fuzz_cost, fuzz_target, fuzzable_kernels, profile_name
from replayssm.validators.jobs.scaleout.ray_jobs import fuzz_ray
from replayssm.validators.jobs.scaleout.shards import partition, shard_from_env


def add_parser(subparsers):
    p = subparsers.add_parser("fuzz", help="property-based search for failing scenarios (Hypothesis)",
                              description="Fuzz registered kernels: Hypothesis draws scenarios, the validation "
                                          "engine judges them; failures are shrunk and saved as replayable JSON.")
    p.add_argument("--kernel", action="append", default=[], type=name_arg,
                   help="kernel name (repeatable; a kernel of your own: --import FILE.py|MODULE first; default: every "
                        "registered kernel that is not a mutant)")
    p.add_argument("--family", type=name_arg, help="only this family (a registered family)")
    p.add_argument("--include-mutants", action="store_true", help="also fuzz the mutants (they must fail)")
    p.add_argument("--profile", choices=["ci", "dev", "nightly"],
                   help="Hypothesis profile (default: $REPLAYSSM_FUZZ_PROFILE or ci)")
    p.add_argument("--max-examples", type=int_at_least(1), help="examples per kernel (per chunk with --budget-s)")
    p.add_argument("--budget-s", type=float_in(0, what="a number of seconds"),
                   help="total time budget in seconds, shared by the kernels")
    p.add_argument("--seed", type=int_at_least(0),
                   help="Hypothesis seed (default: random; ci is derandomized; not applied with --example-db, whose "
                        "database Hypothesis ignores under a seed)")
    p.add_argument("--device", default="cpu", help="cpu (Triton kernels through the interpreter) or cuda[:N]")
    p.add_argument("--kernel-device", dest="kernel_device",
                   help="run the kernel there (cuda[:N]) while the engine, literal model and fp64 reference run on "
                        "--device (default: --device); tiny fuzz scenarios are faster with the engine on cpu")
    p.add_argument("--compile-for", dest="compile_for", type=int_at_least(70, why="a CUDA compute capability"),
                   metavar="SM",
                   help="with --device cpu: also compile every Triton kernel launch of the fuzzed scenarios for "
                        "CUDA compute capability SM (90 = H200) without a GPU (replayssm validate --compile-for)")
    p.add_argument("--modes", help="comma-separated precision modes to draw from (default: every mode a kernel "
                                   "supports); a kernel supporting none of them is left out, with a line saying so")
    p.add_argument("--failures", default="failures", help="folder for shrunk failure artifacts (default failures/)")
    p.add_argument("--json", metavar="FILE", help="write the per-kernel reports as JSON")
    p.add_argument("--strict", action="store_true",
                   help="a marginal scenario (an error above the tolerance bound within the marginal band) is a "
                        "failure; by default it is recorded and the search goes on")
    p.add_argument("--example-db", dest="example_db", metavar="DIR",
                   help="Hypothesis example database (one subfolder per kernel): failing and best-targeted "
                        "scenarios are saved there and replayed first by the next run given the same DIR (the "
                        "nightly run saves it as a CI artifact, a merge run replays it; turns off the profile's "
                        "derandomization)")
    p.add_argument("--shard", default="0/1", metavar="i/n|auto",
                   help="fuzz shard i of n of the kernels, balanced by estimated cost (a CI matrix, a Slurm array; "
                        "default 0/1); auto: from the environment (docs/scaleout.md)")
    add_backend_arguments(p, "kernel")
    add_record_argument(p)
    return p


def _report_dict(r) -> dict:
    return {"kernel": r.kernel, "family": r.family, "profile": r.profile, "examples": r.examples,
            "caught": r.caught, "time_to_first_failure_s": r.time_to_first_failure_s, "wall_s": round(r.wall_s, 3),
            "reproducer_rows": r.reproducer_rows, "reproducer_steps": r.reproducer_steps,
            "failure": None if r.record is None else r.record.to_dict(),
            "artifact": None if r.artifact is None else str(r.artifact), "seeds": getattr(r, "seeds", []),
            "strict": r.strict, "worst_ratio": r.worst_ratio, "marginals": r.marginals,
            "marginal_examples": [{"ratio": e["ratio"], "headline": e["headline"], "margin": e["margin"],
                                   "scenario": e["scenario"].to_dict()} for e in r.marginal_examples],
            "marginal_artifact": None if r.marginal_artifact is None else str(r.marginal_artifact)}


def run(args) -> int:
    check_backend(args)
    shard = _parse_shard(args.shard)
    load_kernels()
    profile = profile_name(args.profile)
    if args.family is not None:
        try:
            family(args.family)
        except ValueError as e:
            raise ValueError(f"--family {args.family}: {str(e).split(': ', 1)[-1]}") from None
    if args.compile_for is not None:
        if args.device != "cpu" or args.kernel_device not in (None, "cpu"):
            raise ValueError("--compile-for: needs the kernel on the cpu (--device cpu, no --kernel-device): the "
                             "interpreter records the launches; on a GPU the kernels compile as they run")
        compile_check.check_arch(args.compile_for)
        if args.backend == "ray":
            raise ValueError("--compile-for: records the launches of this process; not with --backend ray")
    dev = check_device(args.device)
    kdev = None if args.kernel_device is None else check_device(args.kernel_device, "--kernel-device")
    check_writable(args.failures, "--failures")
    if args.example_db:
        check_writable(args.example_db, "--example-db")
    if args.json:
        check_writable(args.json, "--json", is_dir=False)
    check_record_path(args.record)
    if args.kernel:
        fams = [args.family] if args.family else list(family_names())
        targets = []
        for name in args.kernel:
            found = []
            for f in fams:
                try:
                    found.append(get(name, f))
                except ValueError:
                    continue
            if not found:
                raise ValueError(f"--kernel: no kernel {name!r} registered for {fams}")
            targets += found
    else:
        targets = fuzzable_kernels(args.family, include_mutants=args.include_mutants)
    args.mode_ids = _modes(args.modes)
    targets = _supporting(targets, args.mode_ids, named=bool(args.kernel), kernel_device=kdev or dev)
    targets = _shard(targets, shard, kdev or dev)
    if dev == "cpu":
        import torch
        torch.set_num_threads(1)
    reports = []
    t_start = time.perf_counter()
    recording = compile_check.record() if args.compile_for is not None else contextlib.nullcontext([])
    with recording as launches:
        if args.backend == "ray":
            reports += fuzz_ray(targets, profile=profile, device=dev, kernel_device=kdev,
                                failures_dir=args.failures, seed=args.seed, max_examples=args.max_examples,
                                modes=args.mode_ids, strict=args.strict, example_db=args.example_db,
                                budget_s=args.budget_s, address=args.ray_address,
                                gpus_per_task=args.gpus_per_task or 1.0, announce=_announce)
        else:
            _fuzz_targets(args, targets, profile, dev, kdev, t_start, reports)
    n_fail = sum(r.caught for r in reports)
    total = sum(r.examples for r in reports)
    n_marg = sum(bool(r.marginals) and not r.caught for r in reports)
    where = "" if shard == (0, 1) else f", shard {shard[0]}/{shard[1]}"
    print(f"fuzz ({profile}, {dev}{where}): {len(reports)} kernel(s), {total} scenarios, {n_fail} failing, "
          f"{n_marg} marginal{' (--strict: marginals fail)' if args.strict else ''}, "
          f"{time.perf_counter() - t_start:.0f} s" + (f"; reproducers in {args.failures}/" if n_fail else ""))
    compiled_ok = True
    if args.compile_for is not None:
        compiled_ok, lines = compile_check.report(launches, args.compile_for)
        print("\n".join(lines))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([_report_dict(r) for r in reports], indent=2) + "\n")
    if args.record:
        options = {"max_examples": args.max_examples, "budget_s": args.budget_s, "modes": args.mode_ids,
                   "kernel_device": kdev, "include_mutants": args.include_mutants, "strict": args.strict,
                   "example_db": args.example_db}
        append(args.record, fuzz_records(Recorder("fuzz", device=kdev or dev, source=source(args)), reports, options))
    return 1 if n_fail or not compiled_ok else 0


def _parse_shard(text: str) -> tuple[int, int]:
    """``--shard``: ``i/n``, or ``auto`` from the environment (:func:`shard_from_env`)."""
    if text == "auto":
        return shard_from_env()
    try:
        return parse_shard(text)
    except ValueError as e:
        raise ValueError(f"--shard: {str(e).split(': ', 1)[-1]}") from None


def _shard(targets: list, shard: tuple[int, int], kernel_device: str) -> list:
    """Shard ``i`` of ``n`` of ``targets`` (balanced by :func:`fuzz_cost`, a function of the kernels
    only, so every shard agrees), in their order; every target for 0/1."""
    i, n = shard
    if n == 1:
        return targets
    part = partition(targets, n, lambda c: fuzz_cost(c, kernel_device), lambda c: (c.family, c.name))[i]
    return [c for c in targets if c in part]


def _modes(text: str | None) -> tuple[str, ...] | None:
    """``--modes``: the mode ids (each one a precision mode), or None when not given."""
    if text is None:
        return None
    ids = tuple(m.strip() for m in text.split(",") if m.strip())
    if not ids:
        raise ValueError(f"--modes: expected comma-separated precision-mode ids (e.g. s32a32,s16a32), got {text!r}")
    for m in ids:
        try:
            parse_mode(m)
        except ValueError as e:
            raise ValueError(f"--modes: {m!r} is not a precision mode ({e})") from None
    return ids


def _supporting(targets: list, modes: tuple[str, ...] | None, named: bool, kernel_device) -> list:
    """The targets supporting some mode of ``modes`` (default: every fuzzed mode) that can be judged
    where the kernel runs (``drawable_modes``: no bf16 for a kernel written elsewhere under the
    Triton interpreter), under a decode kind they implement; a kernel named with --kernel that
    supports none is an error, any other one is left out with a line."""
    keep = []
    for cls in targets:
        drawable = drawable_modes(cls, kernel_device, modes or FUZZ_MODES)
        try:
            if not drawable:
                raise ValueError
            supported_decodes(cls, tuple(cls.decodes), drawable)
        except ValueError:
            what = f"--modes {','.join(modes)}" if modes else "the fuzzed modes"
            where = " judgeable under the Triton interpreter" if drawable != tuple(modes or FUZZ_MODES) else ""
            if named:
                note = " (on a CPU a kernel written elsewhere runs fp32 activations and states)" if where else (
                    " at the decode sizes the fuzzer draws (its reasons: replayssm validate on the kernel)")
                msg = f"--modes: kernel {cls.family}/{cls.name} supports none of {what}{where}{note}"
                raise ValueError(msg) from None
            print(f"fuzz: {cls.family}/{cls.name} left out: supports none of {what}{where}")
            continue
        keep.append(cls)
    if not keep:
        flag = "--modes" if modes else "--kernel" if named else "--family"
        raise ValueError(f"{flag}: no kernel to fuzz supports any of {list(modes or FUZZ_MODES)} where it runs")
    return keep


def _fuzz_targets(args, targets, profile, dev, kdev, t_start, reports) -> None:
    """Fuzz each kernel of ``targets`` in turn (a share of ``--budget-s`` each), its report into ``reports``."""
    for i, cls in enumerate(targets):
        share = None
        if args.budget_s is not None:
            left = args.budget_s - (time.perf_counter() - t_start)
            share = left / (len(targets) - i)
        merged = fuzz_target(cls, profile=profile, device=dev, kernel_device=kdev, failures_dir=args.failures,
                             seed=args.seed, max_examples=args.max_examples, modes=args.mode_ids,
                             strict=args.strict, example_db=args.example_db, share_s=share)
        reports.append(merged)
        _announce(merged)


def _announce(merged) -> None:
    """One kernel's summary line (and its reproducer when the artifact could not be written)."""
    print(merged.summary(), flush=True)
    if merged.record is not None and merged.artifact is None:
        # Writing the artifact failed after the check before the run: print it rather than lose it.
        print(f"fuzz: {'; '.join(merged.notes) or 'the reproducer was not written'}; the reproducer "
              f"(save it as FILE.json, then replayssm validate --scenario FILE.json):\n"
              f"{artifact_json(merged.scenario, merged.record)}", end="", flush=True)
