"""``replayssm bench``: time a family's Triton baseline and ReplaySSM kernels on a CUDA GPU against
the copy bandwidth and the bytes model (the job is ``replayssm.validators.jobs.bench.run``); with
``--against NAME[,NAME]`` our replay and baseline beside an external source's (an adapter kernel
such as ``vllm-replay``, whose source's baseline ``vllm-baseline`` comes along) in one run, on the
same inputs (``replayssm.validators.jobs.bench.against``), JSON and a Markdown table under ``--out``.

Exit codes: :data:`replayssm.cli.EXIT_CONTRACT` (3 without a CUDA device or with an unwritable ``--json``)."""

from __future__ import annotations

import functools
import json
import math

import torch

from replayssm import adapters
from replayssm.cli_backend import add_backend_arguments, check_backend
from replayssm.cli_list import use_vllm_src
from replayssm.families import family, family_names, preset
from replayssm.guard import (
    EnvironmentProblem,
    check_fits,
    check_record_path,
    check_writable,
    float_in,
    int_at_least,
    name_arg,
    ring_rows_of,
    token_elems,
)
from replayssm.records import Recorder, add_record_argument, append
from replayssm.records.jobs import bench_records, source
from replayssm.registry import kernels
from replayssm.validators.jobs.bench.against import bench_against, markdown, write
from replayssm.validators.jobs.bench.run import bench_family, table
from replayssm.validators.jobs.scaleout.ray_jobs import bench_family_ray


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="time kernels on a CUDA GPU against the copy bandwidth and the "
                                            "traffic model (standard and speculative decode)")
    p.add_argument("--family", type=name_arg, default=None, help="a registered family (default: the first, mamba2)")
    p.add_argument("--geometry", type=name_arg, default=None, help="preset (default: the family's bench geometry)")
    p.add_argument("--precision", type=name_arg, default="s32a16")
    p.add_argument("--buffer", type=int_at_least(1), default=16, help="L (standard decode)")
    p.add_argument("--batches", default="1,8,32,128,256,512")
    p.add_argument("--spec-batches", default="128,512")
    p.add_argument("--window", type=int_at_least(1), default=4)
    p.add_argument("--no-sweep", action="store_true", help="time only the default launch configuration")
    p.add_argument("--rep-ms", type=float_in(0, what="a number of milliseconds"), default=200)
    p.add_argument("--json", default=None, help="write the full result here")
    p.add_argument("--against", default=None, metavar="NAME[,NAME]",
                   help="external kernels to time beside ours (adapters, e.g. vllm-replay: its source's baseline "
                        "comes along); every family that has them unless --family")
    p.add_argument("--ks", default=None, help="with --against: accepted counts of the speculative cases "
                                              "(default: the window and half of it)")
    p.add_argument("--out", default=None, help="with --against: folder for against_<family>_<commit>.{json,md}")
    p.add_argument("--sweep-ours", action="store_true", help="with --against: our replay's time is the fastest "
                   "of the family's launch candidates (each validated); default: our defaults")
    p.add_argument("--vllm-src", metavar="PATH", help="vLLM ReplaySSM source tree for the vllm adapters "
                   "(sets REPLAYSSM_VLLM_SRC)")
    add_backend_arguments(p, "row of the table (decode case x batch)")
    add_record_argument(p)
    return p


def _ints(flag: str, text: str) -> list[int]:
    try:
        vals = [int(b) for b in text.split(",") if b]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return vals


def against_families(names: list[str], family_name: str | None) -> list[str]:
    """The families to compare in: ``family_name``, else every family where one of ``names`` is
    registered.  ValueError naming the kernels that are registered nowhere."""
    have = {n: [f for (f, k) in kernels() if k == n] for n in names}
    missing = [n for n, fams in have.items() if not fams]
    if missing:
        status = "; ".join(f"{src}: {line}" for src, (ok, line) in adapters.availability().items() if not ok)
        raise ValueError(f"--against: no kernel named {', '.join(map(repr, missing))} is registered"
                         f"{' (' + status + ')' if status else ''}")
    if family_name:
        return [family(family_name).name]
    return [f for f in family_names() if any(f in fams for fams in have.values())]


def run_against(args, batches, spec_batches) -> int:
    names = [n for n in args.against.split(",") if n]
    if not names:
        raise ValueError(f"--against: expected kernel names, got {args.against!r}")
    use_vllm_src(args)
    adapters.load()
    fams = against_families(names, args.family)
    ks = _ints("--ks", args.ks) if args.ks else sorted({args.window, max(1, args.window // 2)}, reverse=True)
    if args.out:
        check_writable(args.out, "--out", is_dir=True)
    if not torch.cuda.is_available():
        raise EnvironmentProblem("bench: no CUDA device visible; the benchmark needs an NVIDIA GPU")
    for f in fams:
        check_bench_fits(f, args.geometry, batches, spec_batches, args.buffer, args.window)
    copy = None
    for f in fams:
        res = bench_against(f, names, args.geometry, args.precision, args.buffer, batches, spec_batches, args.window,
                            16, ks, rep_ms=args.rep_ms, copy=copy, sweep_ours=("replay",) if args.sweep_ours else ())
        copy = res["copy"]  # one ceiling for the whole run
        print()
        print(markdown(res))
        if args.out:
            print("wrote", *write(res, args.out))
    return 0


def check_bench_fits(family_name: str, geometry: str | None, batches: list[int], spec_batches: list[int], buffer: int,
                     window: int, device: str = "cuda") -> None:
    """Refuse (exit 3) batches whose states and records (fp32, twice: the timed buffers and the
    inputs) would not fit the GPU, naming --batches or --spec-batches."""
    try:
        geo = preset(geometry or family(family_name).bench_geometry, family_name)
    except ValueError:
        return  # the job names the bad geometry
    st, tok = math.prod(geo.state_shape), token_elems(geo)
    terms = []
    for flag, bs, ring in (("--batches", batches, ring_rows_of("standard", 1, buffer)),
                           ("--spec-batches", spec_batches, ring_rows_of("speculative", window, 16))):
        if bs:
            b = max(bs)
            terms.append((flag, 0, 2 * 4 * b * (st + ring * tok), f"a batch of {b:,} x {ring} record rows"))
    for term in terms:
        check_fits([term], device)


def run(args) -> int:
    check_backend(args)
    try:
        fam = family(args.family or family_names()[0])
    except ValueError as e:
        raise ValueError(f"--family {args.family}: {str(e).split(': ', 1)[-1]}") from None
    batches = _ints("--batches", args.batches)
    spec_batches = _ints("--spec-batches", args.spec_batches)
    if args.against is not None:
        if args.backend == "ray":
            raise ValueError("--against: times the kernels side by side in one process; not with --backend ray")
        if args.record is not None:
            raise ValueError("--record: records the family bench (without --against); --against writes its "
                             "JSON and table under --out")
        if args.json:
            raise ValueError("--json: not used with --against (its results go to --out)")
        return run_against(args, batches, spec_batches)
    if args.json:
        check_writable(args.json, "--json", is_dir=False)
    check_record_path(args.record)
    if args.backend == "ray":  # this process needs no GPU: the cluster's cards run the rows and the checks
        res = bench_family_ray(fam.name, args.geometry, args.precision, args.buffer, batches, spec_batches,
                               args.window, rep_ms=args.rep_ms, sweep=not args.no_sweep, address=args.ray_address,
                               gpus_per_task=args.gpus_per_task or 1.0,
                               preflight=functools.partial(check_bench_fits, fam.name, args.geometry, batches,
                                                           spec_batches, args.buffer, args.window))
    else:
        if not torch.cuda.is_available():
            raise EnvironmentProblem("bench: no CUDA device visible; the benchmark needs an NVIDIA GPU")
        check_bench_fits(fam.name, args.geometry, batches, spec_batches, args.buffer, args.window)
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
    if args.record:
        append(args.record, bench_records(Recorder("bench", device="cuda", source=source(args)), res))
    return 0
