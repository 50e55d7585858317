"""``replayssm bench``: time a family's Triton baseline and ReplaySSM kernels on a CUDA GPU against
the copy bandwidth and the bytes model (the job is ``replayssm.validators.bench``).

Exit codes: :data:`replayssm.cli.EXIT_CONTRACT` (3 without a CUDA device or with an unwritable ``--json``)."""

from __future__ import annotations

import json

import torch

from replayssm.cli_guard import EnvironmentProblem, check_writable
from replayssm.families import family, family_names
from replayssm.validators.bench import bench_family, table


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="time kernels on a CUDA GPU against the copy bandwidth and the "
                                            "traffic model (standard and speculative decode)")
    p.add_argument("--family", default=None, help="a registered family (default: the first, mamba2)")
    p.add_argument("--geometry", default=None, help="preset (default: the family's bench geometry)")
    p.add_argument("--precision", default="s32a16")
    p.add_argument("--buffer", type=int, default=16, help="L (standard decode)")
    p.add_argument("--batches", default="1,8,32,128,256,512")
    p.add_argument("--spec-batches", default="128,512")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--no-sweep", action="store_true", help="time only the default launch configuration")
    p.add_argument("--rep-ms", type=float, default=200)
    p.add_argument("--json", default=None, help="write the full result here")
    return p


def _ints(flag: str, text: str) -> list[int]:
    try:
        vals = [int(b) for b in text.split(",") if b]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return vals


def run(args) -> int:
    fam = family(args.family or family_names()[0])
    batches = _ints("--batches", args.batches)
    spec_batches = _ints("--spec-batches", args.spec_batches)
    for flag, v, lo in (("--buffer", args.buffer, 1), ("--window", args.window, 1)):
        if v < lo:
            raise ValueError(f"{flag}: expected an integer >= {lo}, got {v}")
    if not args.rep_ms > 0:
        raise ValueError(f"--rep-ms: expected a positive number of milliseconds, got {args.rep_ms}")
    if args.json:
        check_writable(args.json, "--json", is_dir=False)
    if not torch.cuda.is_available():
        raise EnvironmentProblem("bench: no CUDA device visible; the benchmark needs an NVIDIA GPU")
    res = bench_family(fam.name, args.geometry, args.precision, args.buffer, batches, spec_batches, args.window,
                       rep_ms=args.rep_ms, sweep=not args.no_sweep)
    print()
    e = res["env"]
    print(f"{e.get('gpu')}  torch {e['torch']}  triton {e['triton']}  commit {e.get('commit')}"
          f"{' (dirty)' if e.get('dirty') else ''}  {e['date']}  copy {res['copy']['tbps']:.3f} TB/s")
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
