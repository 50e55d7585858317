"""``replayssm fuzz|drift|bench --level mixer``: the mixer jobs behind the commands' own parsers.

Each command's parser records its flags' defaults (:func:`remember_defaults`); at the mixer level a
flag given that the mixer job does not read is refused, one line naming it (exit 2), rather than
ignored.  The flags read:

* fuzz: ``--kernel`` (repeatable; default every mixer kernel that is not a mutant), ``--family``,
  ``--include-mutants``, ``--profile``, ``--max-examples``, ``--seed``, ``--device``, ``--modes``,
  ``--failures``, ``--json``, ``--record``.  Exit 0 when nothing failed, 1 when a kernel failed.
* drift: ``--kernels`` (one mixer kernel, default ``mixer-literal-compact-at-commit``), ``--families``,
  ``--modes`` (comma lists: every combination runs), ``--geometry``, ``--rows``, ``--tokens``,
  ``--window``, ``--history`` (B), ``--seed``, ``--device``, ``--out`` (``mixer_drift.json``),
  ``--record``.  Exit 1 when a run fails (an inexact conv window, a non-finite or gross error).
* bench: ``--kernel`` (default ``mixer-triton-replay``), ``--family``, ``--geometry``, ``--precision``,
  ``--batches``, ``--window``, ``--buffer``, ``--ks``, ``--rep-ms`` (a number of timed steps on a CPU:
  ``max(3, rep_ms / 40)``), ``--json``, ``--record``, ``--vllm-src``.  Exit 1 when the configuration
  fails the mixer runner's check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from replayssm.mixer.kernel import mixer_kernel
from replayssm.mixer.spec import mixer_specs
from replayssm.precision import parse_mode
from replayssm.validators.jobs.mixer.bench import bench_mixer, bench_record, table
from replayssm.validators.jobs.mixer.drift import MixerDriftConfig, drift_mixer, drift_record, verdict_line
from replayssm.validators.jobs.mixer.fuzz import fuzz_mixer, fuzzable_mixers

FUZZ_FLAGS = {"kernel", "family", "include_mutants", "profile", "max_examples", "seed", "device", "modes", "failures",
              "json", "record"}
DRIFT_FLAGS = {"kernels", "families", "modes", "geometry", "rows", "tokens", "window", "history", "seed", "device",
               "out", "record", "no_progress"}
BENCH_FLAGS = {"kernel", "family", "geometry", "precision", "batches", "window", "buffer", "ks", "rep_ms", "json",
               "record", "vllm_src"}
DRIFT_KERNEL = "mixer-literal-compact-at-commit"
BENCH_KERNEL = "mixer-triton-replay"
CPU_BATCHES = "1,4"


def remember_defaults(parser) -> None:
    """Keep each flag's default and option string on the parsed namespace (for :func:`refuse_unused`)."""
    flags = {a.dest: (a.option_strings[0], a.default) for a in parser._actions if a.option_strings and a.dest != "help"}
    parser.set_defaults(_flag_defaults=flags)


def refuse_unused(args, used: set[str], command: str) -> None:
    for dest, (flag, default) in getattr(args, "_flag_defaults", {}).items():
        if dest in used or dest == "level":
            continue
        if getattr(args, dest, default) != default:
            raise ValueError(f"{flag}: not used by {command} --level mixer (it reads {_flags(args, used)}; "
                             f"docs/mixer.md)")


def _flags(args, used) -> str:
    names = getattr(args, "_flag_defaults", {})
    return ", ".join(sorted(names[d][0] for d in used if d in names))


def _list(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag}: expected a comma-separated list, got {text!r}")
    return items


def _families(names) -> list[str]:
    specs = mixer_specs()
    for f in names:
        if f not in specs:
            raise ValueError(f"--famil{'ies' if len(names) > 1 else 'y'}: no mixer for {f!r}; expected one of "
                             f"{sorted(specs)}")
    return list(names)


def _modes(names) -> list[str]:
    for m in names:
        try:
            parse_mode(m)
        except ValueError as e:
            raise ValueError(f"--modes: {m!r} is not a precision mode ({e})") from None
    return list(names)


def _write_json(path, data) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def run_fuzz(args, recorder=None):
    refuse_unused(args, FUZZ_FLAGS, "fuzz")
    fams = _families([args.family]) if args.family else None
    modes = _modes(_list(args.modes, "--modes")) if args.modes else None
    targets = [mixer_kernel(k) for k in args.kernel] if args.kernel else fuzzable_mixers(args.include_mutants)
    reports, failed = [], 0
    if args.device == "cpu":
        torch.set_num_threads(1)
    for cls in targets:
        try:
            r = fuzz_mixer(cls, families=fams, modes=modes, profile=args.profile, device=args.device,
                           failures_dir=args.failures, max_examples=args.max_examples, seed=args.seed)
        except ValueError as e:
            if args.kernel:
                raise
            print(f"fuzz: mixer kernel {cls.name} left out: {str(e).split(': ', 1)[-1]}")
            continue
        print(r.summary(), flush=True)
        reports.append(r)
        failed += r.caught
    print(f"fuzz (mixer, {reports[0].profile if reports else args.profile or 'ci'}, {args.device}): "
          f"{len(reports)} mixer kernel(s), {sum(r.examples for r in reports)} scenarios, {failed} failing"
          + (f"; reproducers in {args.failures}/" if failed else ""))
    if args.json:
        _write_json(args.json, [r.to_dict() for r in reports])
    recs = None
    if recorder is not None:
        recs = [recorder.record(
            f"mixer/{r.kernel}/fuzz-{r.profile}",
            metrics={"examples": r.examples, "caught": r.caught, "wall_s": r.wall_s,
                     "time_to_first_failure_s": r.time_to_first_failure_s},
            verdict="fail" if r.caught else "pass", reason=r.verdict or None,
            config={"level": "mixer", "profile": r.profile, "families": list(r.families), "modes": modes},
            kernel=r.kernel, family=None if r.scenario is None else r.scenario.family,
            mode=None if r.scenario is None else r.scenario.mode) for r in reports]
    return 1 if failed else 0, recs


def drift_defaults_given(args) -> dict:
    """The drift command's defaults the mixer level reads differently: its own kernel, family, mode and size."""
    d = getattr(args, "_flag_defaults", {})
    given = {k for k in ("kernels", "families", "modes", "tokens", "rows", "geometry")
             if k in d and getattr(args, k) != d[k][1]}
    return {"kernels": args.kernels if "kernels" in given else DRIFT_KERNEL,
            "families": args.families if "families" in given else "mamba2",
            "modes": args.modes if "modes" in given else "s32a16",
            "tokens": args.tokens if "tokens" in given else 2048,
            "rows": args.rows if "rows" in given else 1,
            "geometry": args.geometry if "geometry" in given else "tiny"}


def run_drift(args, recorder=None):
    refuse_unused(args, DRIFT_FLAGS, "drift")
    v = drift_defaults_given(args)
    kernels = [mixer_kernel(k) for k in _list(v["kernels"], "--kernels")]
    fams = _families(_list(v["families"], "--families"))
    modes = _modes(_list(v["modes"], "--modes"))
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else (
        "cpu" if args.device == "auto" else args.device)
    cfgs = [(k, MixerDriftConfig(f, m, v["tokens"], v["rows"], args.window, args.history, args.seed, v["geometry"]))
            for k in kernels for f in fams for m in modes]
    results, failed = [], 0
    for cls, cfg in cfgs:
        res = drift_mixer(cls, cfg, device=device)
        print(verdict_line(res), flush=True)
        results.append(res)
        failed += not res["passed"]
    dest = Path(args.out) / "mixer_drift.json"
    _write_json(dest, {"level": "mixer", "runs": results})
    print(f"drift (mixer, {device}): {len(results)} run(s), {failed} failing; report {dest}")
    recs = [drift_record(recorder, r) for r in results] if recorder is not None else None
    return 1 if failed else 0, recs


def run_bench(args, recorder=None):
    refuse_unused(args, BENCH_FLAGS, "bench")
    if args.vllm_src:
        os.environ["REPLAYSSM_VLLM_SRC"] = args.vllm_src
    cls = mixer_kernel(args.kernel or BENCH_KERNEL)
    fam = _families([args.family or "mamba2"])[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d = getattr(args, "_flag_defaults", {})
    text = args.batches if device == "cuda" or args.batches != d.get("batches", (None, None))[1] else CPU_BATCHES
    try:
        batches = [int(b) for b in text.split(",") if b]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise ValueError(f"--batches: expected comma-separated positive integers, got {text!r}")
    ks = None
    if args.ks:
        try:
            ks = [int(k) for k in args.ks.split(",") if k]
        except ValueError:
            raise ValueError(f"--ks: expected comma-separated accepted counts, got {args.ks!r}") from None
    reps = 50 if device == "cuda" else max(3, int(args.rep_ms // 40))
    if device == "cpu":
        torch.set_num_threads(1)
    res = bench_mixer(cls, fam, args.geometry or "tiny", args.precision, batches, args.window,
                      None if args.buffer == d.get("buffer", (None, None))[1] else args.buffer, ks, device, reps)
    print(f"{res['kernel']} [{fam} mixer, {res['mode']}, conv {res['conv_policy']}, T'={res['window']}, "
          f"{res['timing']}]; check: {res['check']}")
    if device == "cpu":
        print("(CPU: the times show the table's shape only; Python and the Triton interpreter bound them)")
    print(table(res))
    if args.json:
        _write_json(args.json, res)
    recs = bench_record(recorder, res) if recorder is not None else None
    return 0 if res["checked"] else 1, recs
