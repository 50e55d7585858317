"""``replayssm calibrate``: the false-alarm rate of every check on correct kernels, and the checks' resolving power.

The population run (default) judges each family's correct kernels (``validators/jobs/calibration.py``:
its literal models and the variants registered beside them, or ``--kernels``) on ``--scenarios``
scenarios per family drawn over every input distribution, schedule and mode of ``--modes``, and
prints per check the runs, false alarms, worst error / bound ratio and the one-sided 95 % upper
bound on the false-alarm rate.  ``--resolving`` instead runs each known precision loss at every
mode it applies to and prints which check catches it, after how many steps, at what ratio, or
``unresolved``.  ``--render DOC`` regenerates the tables of DOC (docs/calibration.md) from the
newest calibration records of ``--ledger``, running nothing.
Exit codes: :data:`replayssm.cli.EXIT_CONTRACT`; 1 when a correct kernel failed a check (a false
alarm) or a loss is unresolved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from replayssm.cli import check_device
from replayssm.families import family_names
from replayssm.guard import check_record_path, check_writable, int_at_least
from replayssm.records import Recorder, add_record_argument, append
from replayssm.records.jobs import calibration_records, resolving_records, source
from replayssm.records.ledger import load
from replayssm.validators.jobs.calibration import calibrate, resolving_power, update_doc


def _names(text: str | None, flag: str, known=None) -> list[str] | None:
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or (known is not None and any(n not in known for n in names)):
        raise ValueError(f"{flag}: expected a comma-separated list{'' if known is None else f' of {sorted(known)}'}, "
                         f"got {text!r}")
    return names


def add_parser(subparsers):
    p = subparsers.add_parser("calibrate", help="false-alarm rate of each check on correct kernels; resolving power",
                              description="Run the calibration population (correct kernels) and count each check's "
                                          "false alarms, or (--resolving) measure which check catches each known "
                                          "precision loss.")
    p.add_argument("--families", help="comma-separated families (default: every registered family)")
    p.add_argument("--scenarios", type=int_at_least(1), default=100,
                   help="scenarios per family (default 100; the target of issue 47 is 10000)")
    p.add_argument("--steps", type=int_at_least(1), default=12, help="verify/commit steps per scenario (default 12)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the scenario draw (default 0)")
    p.add_argument("--modes", help="comma-separated precision modes (default: validators.calibration.MODES, or "
                                   "RESOLVING_MODES with --resolving)")
    p.add_argument("--kernels", help="comma-separated kernel names to calibrate instead of each family's population "
                                     "(each registered for every family run)")
    p.add_argument("--resolving", action="store_true", help="measure the resolving power instead")
    p.add_argument("--losses", help="with --resolving: comma-separated losses (default: every loss)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    p.add_argument("--render", metavar="DOC", help="regenerate DOC's tables from the records of --ledger; runs nothing")
    p.add_argument("--ledger", default="docs/reports/ledger.jsonl", help="the records --render reads")
    add_record_argument(p)
    return p


def _print_population(rep: dict) -> bool:
    bad = False
    for fam, r in rep["families"].items():
        print(f"{fam}: {r['scenarios']} scenarios of {len(r['population'])} correct kernels, "
              f"{r['false_alarm_scenarios']} with a false alarm (95 % upper bound on the rate {r['upper_95']:.2e})")
        print(f"  {'check':<22} {'runs':>6} {'false':>6} {'upper 95%':>10} {'worst ratio':>12}")
        for c, t in r["checks"].items():
            w = "-" if t["worst_ratio"] is None else f"{t['worst_ratio']:.3g}"
            print(f"  {c:<22} {t['runs']:>6} {t['false_alarms']:>6} {t['upper_95']:>10.2e} {w:>12}")
            if t["first_false_alarm"]:
                print(f"    first false alarm: {t['first_false_alarm']}")
        bad = bad or r["false_alarm_scenarios"] > 0
    return bad


def _print_resolving(rep: dict) -> bool:
    bad = False
    for c in rep["cases"]:
        by = "; ".join(f"{k} ({p['steps']} steps, ratio {'-' if p['ratio'] is None else format(p['ratio'], '.3g')}, "
                       f"{p['scenarios']}/{c['scenarios']})" for k, p in c["checks"].items())
        print(f"{c['family']:<7} {c['loss']:<22} {c['mode']:<14} {c['verdict']:<10} {by or 'no check failed'}")
        bad = bad or c["verdict"] != "resolved"
    return bad


def run(args) -> int:
    if args.render:
        doc = Path(args.render)
        text = doc.read_text()
        doc.write_text(update_doc(text, load(args.ledger), ledger=os.path.relpath(args.ledger, doc.parent)))
        print(f"calibrate: regenerated the tables of {doc} from {args.ledger}")
        return 0
    dev = check_device(args.device)
    if dev == "cpu":
        torch.set_num_threads(1)
    check_record_path(args.record)
    if args.json:
        check_writable(args.json, "--json", is_dir=False)
    fams = _names(args.families, "--families", family_names())
    modes = _names(args.modes, "--modes")
    if args.resolving:
        rep = resolving_power(fams, steps=args.steps, seed=args.seed, modes=modes,
                              losses=_names(args.losses, "--losses"), device=dev, progress=print)
        bad = _print_resolving(rep)
        recs = lambda r: resolving_records(r, rep)  # noqa: E731
    else:
        if args.losses:
            raise ValueError("--losses: only with --resolving")
        kern = _names(args.kernels, "--kernels")
        pop = None if kern is None else {f: tuple(kern) for f in (fams or family_names())}
        rep = calibrate(fams, n=args.scenarios, steps=args.steps, seed=args.seed, modes=modes, device=dev,
                        kernels_=pop, progress=print)
        bad = _print_population(rep)
        recs = lambda r: calibration_records(r, rep)  # noqa: E731
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
    if args.record:
        n = append(args.record, recs(Recorder("calibration", device=dev, source=source(args))))
        print(f"calibrate: appended {n} records to {args.record}")
    return 1 if bad else 0


__all__ = ["add_parser", "run"]
