"""``replayssm validate``: run one kernel through one scenario and judge it.

Builds the scenario from flags (or ``--scenario FILE``, flags given explicitly override its
fields), runs :func:`replayssm.validators.run_scenario`, writes ``<out>/<stem>.json`` and
``<stem>.md``, prints the verdict and the throughput.  Exit codes: :data:`replayssm.cli.EXIT_CONTRACT`
(the output folder's writability and the run's memory are checked before any work).
"""

from __future__ import annotations

import sys
from pathlib import Path

from replayssm.adapters import availability
from replayssm.cli import check_device, import_kernels
from replayssm.cli_guard import check_memory, check_writable, output_lock, run_bytes, state_elems
from replayssm.cli_list import load_kernels, use_vllm_src
from replayssm.families import family_names
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import default_steps
from replayssm.validators import compile_check
from replayssm.validators.fuzz_artifacts import kernel_of_file, module_of_file
from replayssm.validators.golden_truth import GoldenTruth
from replayssm.validators.runner import run_scenario

# Flags that map onto scenario fields (dest -> field).  Their argparse default is None so an
# explicit flag can override a --scenario file.
_FIELDS = {
    "family": "family", "geometry": "geometry", "precision": "mode", "decode": "decode", "window": "window",
    "buffer": "buffer", "schedule": "schedule", "steps": "steps", "seed": "seed", "distribution": "distribution",
    "initial_state": "initial_state", "slots": "num_slots",
}


# Below this many state elements per step (rows x state) torch's intra-op threads only cost.
SMALL_STATE = 1 << 16


def add_parser(subparsers):
    p = subparsers.add_parser("validate", help="validate a kernel against the fp64 reference on a scenario",
                              description="Validate one kernel on one scenario. Exit 0 pass, 1 mismatch, 2 usage.")
    p.add_argument("--kernel", help="registered kernel name (see `replayssm list kernels`; a kernel of your own: "
                                    "--import FILE.py|MODULE first); optional with a --scenario failure artifact "
                                    "saved by the fuzzer, which names its kernel and the module to import")
    p.add_argument("--scenario", metavar="FILE", help="scenario JSON naming every field (--save-scenario writes "
                                                         "one); flags given explicitly override its fields")
    p.add_argument("--family", help="op family (a registered family; default: the first, mamba2)")
    p.add_argument("--precision", metavar="MODE", help="precision mode id, e.g. s32a16 (default)")
    p.add_argument("--geometry", metavar="NAME", help="preset geometry (default tiny)")
    p.add_argument("--decode", choices=["standard", "speculative"], help="decode kind (default speculative)")
    p.add_argument("--window", type=int, metavar="T", help="speculative window T' (default 4)")
    p.add_argument("--buffer", type=int, metavar="B", help="history block B (speculative, default 12) or L "
                                                           "(standard, default 8)")
    p.add_argument("--schedule", help="acceptance schedule (default exhaustive)")
    p.add_argument("--steps", type=int, help="steps (default: the schedule's own length)")
    p.add_argument("--batch", type=int, help="batch rows (default 3)")
    p.add_argument("--padding", type=int, help="padding rows among them (default 1 when batch >= 2)")
    p.add_argument("--slots", type=int, help="state slots the kernel owns (default 2 x active rows + 1)")
    p.add_argument("--seed", type=int, help="scenario seed (default 0)")
    p.add_argument("--distribution", help="input regime (default mild)")
    p.add_argument("--initial-state", dest="initial_state", choices=["zeros", "random"])
    p.add_argument("--kernel-option", dest="kernel_options", action="append", default=[], metavar="KEY=VALUE",
                   help="kernel option (repeatable), e.g. route=state_and_output")
    p.add_argument("--device", default="cpu", help="cpu (Triton kernels through the interpreter) or cuda[:N]")
    p.add_argument("--compile-for", dest="compile_for", type=int, metavar="SM",
                   help="with --device cpu: also compile every Triton kernel launch of the run for CUDA compute "
                        "capability SM (90 = H200) without a GPU, catching what the interpreter does not check")
    p.add_argument("--out", default="replayssm-results", help="folder for the result JSON and Markdown")
    p.add_argument("--save-scenario", metavar="FILE", help="also write the scenario JSON used")
    p.add_argument("--literal-every", type=int, default=1, help="run the literal model every N steps (0: never)")
    p.add_argument("--invariants-every", type=int, default=1,
                   help="snapshot invariants every N >= 1 steps and the last step")
    p.add_argument("--state-every", type=int, default=1,
                   help="committed-state check every N >= 1 steps and the last step (every flush's checkpoint "
                        "is judged whatever N)")
    p.add_argument("--no-repeat", action="store_true", help="skip the repeated-run bit-identity check")
    p.add_argument("--truth", choices=["reference", "golden"], default="reference",
                   help="where the fp64 truth comes from: the reference recomputed (default), or the golden "
                        "trajectories of a canonical scenario (golden/trajectories; the value checks judge the "
                        "stored elements at the stored steps; refused when the scenario is no golden entry's or "
                        "the data fails its sha256 manifest)")
    p.add_argument("--poison-allocations", dest="poison_allocations", choices=["nan", "large"],
                   help="fill every torch.empty / empty_like / new_empty buffer the kernel allocates during its "
                        "reset, verify and commit calls with NaN or 2^100, so a buffer it never writes shows "
                        "(default: off; validators/poison_alloc.py)")
    p.add_argument("--stop-on-failure", action="store_true", help="stop after the first failing step")
    p.add_argument("--progress", action="store_true", default=None, help="progress bar (default: long runs on a tty)")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: 1 for small geometries, whose "
                                                "ops are too small to split and slow down under CPU contention)")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--vllm-src", metavar="PATH", help="vLLM ReplaySSM source tree for the vllm adapters "
                   "(sets REPLAYSSM_VLLM_SRC)")
    return p


def _option_value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def scenario_from_args(args):
    given = {field: getattr(args, dest) for dest, field in _FIELDS.items() if getattr(args, dest) is not None}
    opts = {}
    for kv in args.kernel_options:
        if "=" not in kv:
            raise ValueError(f"--kernel-option: expected KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        opts[k] = _option_value(v)
    if args.scenario:
        sc = Scenario.load(args.scenario)
        changes = dict(given)
        if opts:
            changes["kernel_options"] = {**sc.kernel_options, **opts}
        if args.batch is not None or args.padding is not None:
            raise ValueError("--batch/--padding: the batch layout comes from --scenario; edit rows/slot_ids there")
        return sc.replace(**changes) if changes else sc
    family = given.pop("family", family_names()[0])
    decode = given.pop("decode", "speculative")
    given.setdefault("geometry", "tiny")
    given.setdefault("schedule", "exhaustive")
    if opts:
        given["kernel_options"] = opts
    kw = {}
    for _name, field in (("window", "window"), ("buffer", "buffer"), ("slots", "num_slots")):
        if field in given:
            kw[field] = given.pop(field)
    return Scenario.build(family, decode=decode, batch=3 if args.batch is None else args.batch,
                          padding=args.padding, **kw, **given)


def run(args) -> int:

    sc = scenario_from_args(args)
    use_vllm_src(args)
    load_kernels()
    module = module_of_file(args.scenario) if args.scenario else None
    if module is not None:  # a failure artifact of a user kernel: import it as --import would
        import_kernels(module)
    if args.kernel is None:
        args.kernel = kernel_of_file(args.scenario) if args.scenario else None
        if args.kernel is None:
            raise ValueError("--kernel: required (or a --scenario failure artifact that names its kernel)")
    try:
        cls = get(args.kernel, sc.family)  # ValueError naming the choices -> exit 2
    except ValueError as e:
        missing = [f"{n}: {line}" for n, (ok, line) in availability().items() if not ok]
        raise ValueError("; ".join([str(e), *(f"adapter {m}" for m in missing)])) from None
    cls.check_options(sc.kernel_options)  # before any work
    if args.compile_for is not None:
        if args.device != "cpu":
            raise ValueError(f"--compile-for: needs --device cpu (the interpreter records the launches; on a "
                             f"GPU the kernels compile as they run), got --device {args.device}")
        compile_check.check_arch(args.compile_for)
    dev = check_device(args.device)
    import contextlib
    import math

    import torch
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads: expected a positive integer, got {args.threads}")
    if args.literal_every < 0:
        raise ValueError(f"--literal-every: expected an integer >= 0 (0: never; the fp64 running-error bound "
                         f"judges the other steps), got {args.literal_every}")
    for flag in ("invariants_every", "state_every"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: expected an integer >= 1, got {getattr(args, flag)} "
                             f"(0 would switch checks off; no option does: a larger N samples them, every flush "
                             f"and the last step are always judged)")
    if args.truth == "golden":
        try:
            GoldenTruth.load(sc)
        except ValueError as e:
            raise ValueError(f"--{e}") from None
    check_writable(args.out, "--out")
    if args.save_scenario:
        check_writable(args.save_scenario, "--save-scenario", is_dir=False)
    n = sc.steps if sc.steps is not None else default_steps(sc)
    check_memory(run_bytes(n, sc.rows, state_elems(sc.geometry_obj)),
                 "--steps" if sc.steps is not None else "--schedule", f"{n:,} steps x {sc.rows} rows")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif dev == "cpu" and math.prod(sc.geometry_obj.state_shape) * sc.rows < SMALL_STATE:
        torch.set_num_threads(1)
    progress = args.progress if args.progress is not None else (n >= 200 and sys.stderr.isatty())
    if args.save_scenario:
        sc.save(args.save_scenario)
    with output_lock(args.out, "--out"):
        with (compile_check.record() if args.compile_for is not None else contextlib.nullcontext([])) as launches:
            res = run_scenario(sc, args.kernel, device=dev, progress=progress, repeat_check=not args.no_repeat,
                               literal_every=args.literal_every, invariants_every=args.invariants_every,
                               state_every=args.state_every, stop_on_failure=args.stop_on_failure,
                               truth=args.truth, poison_allocations=args.poison_allocations)
        stem = f"{sc.family}-{args.kernel}-{sc.mode}-{sc.decode}-{sc.schedule}-seed{sc.seed}"
        pj, pm = res.save(Path(args.out), stem)
        print(res.headline())
        compiled_ok = True
        if args.compile_for is not None:
            compiled_ok, lines = compile_check.report(launches, args.compile_for)
            print("\n".join(lines))
        if not args.quiet:
            print(f"conventions: {res.conventions}")
            for note in res.notes:
                if note.startswith("truth: "):
                    print(note)
            if not res.passed:
                for c, k in sorted(res.failure_counts.items()):
                    print(f"  {c}: {k} failure(s)")
            print(f"throughput: {res.rate} tokens/s ({res.tokens_accepted} accepted tokens, "
                  f"{res.tokens_verified} verified, {res.steps_run} steps in {res.wall_s:.2f} s on {dev}, "
                  f"including the fp64 reference and checks)")
            print(f"result: {pj}  summary: {pm}")
        return 0 if res.passed and compiled_ok else 1

