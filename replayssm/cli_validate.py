"""``replayssm validate``: run one kernel through one scenario and judge it.

Builds the scenario from flags (or ``--scenario FILE``, flags given explicitly override its
fields), runs :func:`replayssm.validators.run_scenario`, writes ``<out>/<stem>.json`` and
``<stem>.md``, prints the verdict (PASS, MARGINAL or FAIL: docs/validation.md, "Verdicts"), the margin
and the throughput.  Exit codes: :data:`replayssm.cli.EXIT_CONTRACT` (a marginal exits 0 with its
MARGINAL line, 1 with ``--strict``; the output folder's writability and the run's memory are checked
before any work).
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from pathlib import Path

from replayssm.adapters import availability
from replayssm.cli import EXIT_FAIL, EXIT_PASS, check_device
from replayssm.cli_list import load_kernels, use_vllm_src
from replayssm.families import family_names, preset
from replayssm.guard import (
    EXHAUSTIVE_STEPS_PER_PAIR,
    check_fits,
    check_name,
    check_plan_time,
    check_record_path,
    check_writable,
    exhaustive_pairs,
    footprint,
    int_at_least,
    name_arg,
    out_path,
    output_lock,
    ring_rows_of,
)
from replayssm.records import Recorder, add_record_argument, append
from replayssm.records.jobs import source, validate_record
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import _DEFAULT_STEPS, default_steps
from replayssm.validators.engine import compile_check
from replayssm.validators.engine.fuzz_artifacts import kernel_of_file, module_of_file
from replayssm.validators.engine.golden_truth import GoldenTruth
from replayssm.validators.engine.mixer.cli import run_validate
from replayssm.validators.engine.runner import run_scenario

# Flags that map onto scenario fields (dest -> field).  Their argparse default is None so an
# explicit flag can override a --scenario file.
_FIELDS = {
    "family": "family", "geometry": "geometry", "precision": "mode", "decode": "decode", "window": "window",
    "buffer": "buffer", "schedule": "schedule", "steps": "steps", "seed": "seed", "distribution": "distribution",
    "initial_state": "initial_state", "slots": "num_slots",
}


# The flag of each scenario field (a refusal about a field given by a flag names the flag).
_FLAG_OF = {"family": "--family", "geometry": "--geometry", "mode": "--precision", "decode": "--decode",
            "window": "--window", "buffer": "--buffer", "schedule": "--schedule", "steps": "--steps", "seed": "--seed",
            "distribution": "--distribution", "initial_state": "--initial-state", "num_slots": "--slots",
            "rows": "--batch", "kernel_options": "--kernel-option"}

_NO_OFF = ("0 would switch checks off; no option does: a larger N samples them, every flush and the last step "
           "are always judged")

# Below this many state elements per step (rows x state) torch's intra-op threads only cost.
SMALL_STATE = 1 << 16
# A scenario file larger than this is refused before it is read (failure artifacts of explicit
# plans are well under 1 MiB; JSON this size already takes about 20 x its size in Python objects).
MAX_SCENARIO_BYTES = 16 << 20


def add_parser(subparsers):
    p = subparsers.add_parser("validate", help="validate a kernel against the fp64 reference on a scenario",
                              description="Validate one kernel on one scenario. Exit 0 pass (or marginal: an error "
                                          "above the tolerance bound within the marginal band, printed as a "
                                          "MARGINAL line), 1 fail (or marginal with --strict), 2 usage.")
    p.add_argument("--kernel", type=name_arg,
                   help="registered kernel name (see `replayssm list kernels`; a kernel of your own: "
                        "--import FILE.py|MODULE first); optional with a --scenario failure artifact "
                        "saved by the fuzzer, which names its kernel (a module it names is never "
                        "imported: give --import yourself)")
    p.add_argument("--scenario", metavar="FILE", help="scenario JSON naming every field (--save-scenario writes "
                                                         "one); flags given explicitly override its fields")
    p.add_argument("--level", choices=["ssm", "mixer"], default="ssm",
                   help="ssm (default): an SSM kernel; mixer: a mixer kernel (conv1d -> SSM -> gated norm, the conv "
                        "state checked bit for bit; docs/mixer.md)")
    p.add_argument("--family", type=name_arg, help="op family (a registered family; default: the first, mamba2)")
    p.add_argument("--precision", type=name_arg, metavar="MODE", help="precision mode id, e.g. s32a16 (default)")
    p.add_argument("--geometry", type=name_arg, metavar="NAME", help="preset geometry (default tiny)")
    p.add_argument("--decode", choices=["standard", "speculative"], help="decode kind (default speculative)")
    p.add_argument("--window", type=int_at_least(1), metavar="T", help="speculative window T' (default 4)")
    p.add_argument("--buffer", type=int_at_least(1), metavar="B", help="history block B (speculative, default 12) or L "
                                                           "(standard, default 8)")
    p.add_argument("--schedule", type=name_arg, help="acceptance schedule (default exhaustive)")
    p.add_argument("--steps", type=int_at_least(1), help="steps (default: the schedule's own length)")
    p.add_argument("--batch", type=int_at_least(1), help="batch rows (default 3)")
    p.add_argument("--padding", type=int_at_least(0), help="padding rows among them (default 1 when batch >= 2)")
    p.add_argument("--slots", type=int_at_least(1), help="state slots the kernel owns (default 2 x active rows + 1)")
    p.add_argument("--seed", type=int_at_least(0, 2**63 - 1), help="scenario seed (default 0)")
    p.add_argument("--distribution", type=name_arg, help="input regime (default mild)")
    p.add_argument("--initial-state", dest="initial_state", choices=["zeros", "random"])
    p.add_argument("--kernel-option", dest="kernel_options", action="append", default=[], metavar="KEY=VALUE",
                   help="kernel option (repeatable), e.g. route=state_and_output")
    p.add_argument("--device", default="cpu", help="cpu (Triton kernels through the interpreter) or cuda[:N]")
    p.add_argument("--compile-for", dest="compile_for", type=int_at_least(70, why="a CUDA compute capability"),
                   metavar="SM",
                   help="with --device cpu: also compile every Triton kernel launch of the run for CUDA compute "
                        "capability SM (90 = H200) without a GPU, catching what the interpreter does not check")
    p.add_argument("--out", default="replayssm-results", help="folder for the result JSON and Markdown")
    p.add_argument("--save-scenario", metavar="FILE", help="also write the scenario JSON used")
    p.add_argument("--literal-every", type=int_at_least(0, why="0: never; the fp64 running-error bound judges the "
                                                                 "other steps"),
                   default=1, help="run the literal model every N steps (0: never)")
    p.add_argument("--invariants-every", type=int_at_least(1, why=_NO_OFF), default=1,
                   help="snapshot invariants every N >= 1 steps and the last step")
    p.add_argument("--state-every", type=int_at_least(1, why=_NO_OFF), default=1,
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
                        "(default: off; validators/engine/poison_alloc.py)")
    p.add_argument("--stop-on-failure", action="store_true", help="stop after the first failing step")
    p.add_argument("--strict", action="store_true",
                   help="a marginal verdict (an error above the tolerance rule's bound by at most the marginal band, "
                        "docs/validation.md) fails: exit 1 instead of 0")
    p.add_argument("--progress", action="store_true", default=None, help="progress bar (default: long runs on a tty)")
    p.add_argument("--threads", type=int_at_least(1, os.cpu_count() or 1, why="at most one per CPU"),
                   help="CPU threads for torch (default: 1 for small geometries, whose ops are too small to split "
                        "and slow down under CPU contention)")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--vllm-src", metavar="PATH", help="vLLM ReplaySSM source tree for the vllm adapters "
                   "(sets REPLAYSSM_VLLM_SRC)")
    add_record_argument(p)
    return p


def _option_value(text: str):
    for conv in (int, float):
        try:
            v = conv(text)
        except ValueError:
            continue
        if not math.isfinite(v):
            raise ValueError(f"--kernel-option: expected a finite number, true, false or a word, got {text!r}")
        return v
    return {"true": True, "false": False}.get(text.lower(), text)


def _flagged(make, flags: dict[str, str]):
    """``make()``, a ``scenario.<field>`` refusal about a field in ``flags`` naming its flag too."""
    try:
        return make()
    except ValueError as e:
        field, sep, rest = str(e).partition(": ")
        name = field.removeprefix("scenario.")
        if sep and field.startswith("scenario.") and name in flags:
            raise ValueError(f"{flags[name]} ({field}): {rest}") from None
        raise


def _check_size(geo, *, decode: str, window: int, buffer: int, rows: int, active: int, slots: int,
                steps: int | None, schedule: str, flags: dict[str, str], device: str) -> None:
    """Refuse (exit 3) before the scenario's plan or any tensor exists: the run's memory estimate
    (``guard.footprint``) and the time the exhaustive schedule's plan takes to build.  A cause
    that is a product (slots x record rows, rows x window, rows x steps) is blamed on the factor
    furthest above its default (3 rows, 5 slots, T' = 4, B = 12 / L = 8, 64 steps)."""
    spec = decode == "speculative"
    pairs = exhaustive_pairs(decode, window, buffer)
    size_flag = flags["window"] if spec and window / 4 > (buffer + 1) / 13 else flags["buffer"]
    if steps is None:
        steps = EXHAUSTIVE_STEPS_PER_PAIR * pairs if schedule == "exhaustive" else _DEFAULT_STEPS.get(schedule, 0)
        steps_flag = size_flag if schedule == "exhaustive" else flags["schedule"]
    else:
        steps_flag = flags["steps"]
    r_rows, r_slots = rows / 3, slots / 5
    r_ring = max(window / 4, buffer / 12) if spec else buffer / 8
    check_fits(footprint(geo, rows=rows, slots=slots, window=window, ring_rows=ring_rows_of(decode, window, buffer),
                         steps=steps, flags={"rows": flags["rows"], "slots": flags["num_slots"],
                                             "ring": size_flag if r_ring > r_slots else flags["num_slots"],
                                             "window": flags["window"] if window / 4 > r_rows else flags["rows"],
                                             "steps": steps_flag if steps / 64 >= r_rows else flags["rows"]}),
               device)
    if schedule == "exhaustive":
        check_plan_time(pairs, min(active, window) if spec else 1, size_flag)


def scenario_from_args(args):
    given = {field: getattr(args, dest) for dest, field in _FIELDS.items() if getattr(args, dest) is not None}
    opts = {}
    for kv in args.kernel_options:
        if "=" not in kv:
            raise ValueError(f"--kernel-option: expected KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        opts[k] = _option_value(v)
    device = getattr(args, "device", "cpu")
    if args.scenario:
        if args.batch is not None or args.padding is not None:
            raise ValueError("--batch/--padding: the batch layout comes from --scenario; edit rows/slot_ids there")
        try:
            size = os.path.getsize(args.scenario)
        except OSError:
            size = 0  # Scenario.load names the file and why it cannot be read
        if size > MAX_SCENARIO_BYTES:
            raise ValueError(f"--scenario {args.scenario}: {size:,} bytes; a scenario file is at most "
                             f"{MAX_SCENARIO_BYTES >> 20} MiB")
        sc = Scenario.load(args.scenario)
        changes = dict(given)
        if opts:
            changes["kernel_options"] = {**sc.kernel_options, **opts}
        flags = {f: _FLAG_OF[f] for f in changes}
        if changes:
            sc = _flagged(lambda: sc.replace(**changes), flags)
        names = {f: flags.get(f, f"scenario.{f} (in {args.scenario})") for f in _FLAG_OF}
        _check_size(sc.geometry_obj, decode=sc.decode, window=sc.window, buffer=sc.buffer, rows=sc.rows,
                    active=len(sc.active_rows), slots=sc.num_slots, steps=sc.steps, schedule=sc.schedule,
                    flags=names, device=device)
        return sc
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
    batch = 3 if args.batch is None else args.batch
    flags = dict(_FLAG_OF, slot_ids="--padding" if args.padding is not None else "--batch")
    if args.slots is None:  # the default slot count follows the batch
        flags["num_slots"] = "--batch"
    try:
        geo = preset(given["geometry"], family)
    except ValueError:
        geo = None  # Scenario.build names the bad family or geometry
    if geo is not None and decode in ("speculative", "standard"):
        window = kw.get("window", 4 if decode == "speculative" else 1)
        pad = args.padding if args.padding is not None else (1 if batch >= 2 else 0)
        active = max(1, batch - pad)
        # Before Scenario.build: it makes Python objects per row and per slot.
        _check_size(geo, decode=decode, window=window, buffer=kw.get("buffer", 12 if decode == "speculative" else 8),
                    rows=batch, active=active, slots=kw.get("num_slots", 2 * active + 1), steps=given.get("steps"),
                    schedule=given["schedule"], flags=flags, device=device)
    return _flagged(lambda: Scenario.build(family, decode=decode, batch=batch, padding=args.padding, **kw, **given),
                    flags)


def import_command(module: str, scenario: str, kernel: str | None = None) -> str:
    """The command that replays ``scenario`` with ``module`` imported explicitly (``--import``)."""
    cmd = f"replayssm --import {shlex.quote(module)} validate --scenario {shlex.quote(str(scenario))}"
    return cmd + (f" --kernel {shlex.quote(kernel)}" if kernel is not None else "")


def run(args) -> int:
    if getattr(args, "level", "ssm") == "mixer":
        return run_validate(args)

    sc = scenario_from_args(args)
    use_vllm_src(args)
    load_kernels()
    # A data file never runs code: the module a failure artifact names is only shown in the command to run.
    module = module_of_file(args.scenario) if args.scenario else None
    given_kernel = args.kernel
    if args.kernel is None:
        args.kernel = kernel_of_file(args.scenario) if args.scenario else None
        if args.kernel is None:
            raise ValueError("--kernel: required (or a --scenario failure artifact that names its kernel)")
        check_name(args.kernel, f"failure.kernel (in {args.scenario})")
    try:
        cls = get(args.kernel, sc.family)  # ValueError naming the choices -> exit 2
    except ValueError as e:
        if module is not None:
            raise ValueError(f"--kernel: {args.kernel!r} is not registered; {args.scenario} names the module "
                             f"{module!r}, which is never imported from a data file: if you trust it, run "
                             f"{import_command(module, args.scenario, given_kernel)}") from None
        missing = [f"{n}: {line}" for n, (ok, line) in availability().items() if not ok]
        raise ValueError("; ".join([f"--kernel {args.kernel}: {str(e).removeprefix('kernel: ')}",
                                    *(f"adapter {m}" for m in missing)])) from None
    cls.check_options(sc.kernel_options)  # before any work
    if args.compile_for is not None:
        if args.device != "cpu":
            raise ValueError(f"--compile-for: needs --device cpu (the interpreter records the launches; on a "
                             f"GPU the kernels compile as they run), got --device {args.device}")
        compile_check.check_arch(args.compile_for)
    dev = check_device(args.device)
    if dev == "cpu":  # a kernel written elsewhere at a mode the Triton interpreter runs unlike the GPU
        refusal = getattr(cls, "interpreter_refusal", lambda mode: None)(sc.precision)
        if refusal:
            raise ValueError(refusal)
    import contextlib

    import torch
    if args.truth == "golden":
        try:
            GoldenTruth.load(sc)
        except ValueError as e:
            raise ValueError(f"--{e}") from None
    check_writable(args.out, "--out")
    check_record_path(args.record)
    if args.save_scenario:
        check_writable(args.save_scenario, "--save-scenario", is_dir=False)
    stem = f"{sc.family}-{args.kernel}-{sc.mode}-{sc.decode}-{sc.schedule}-seed{sc.seed}"
    for suffix in (".json", ".md"):
        out_path(args.out, stem + suffix, "--kernel")
    n = sc.steps if sc.steps is not None else default_steps(sc)
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
        pj, pm = res.save(Path(args.out), stem)
        if args.record:
            options = {"truth": args.truth, "literal_every": args.literal_every, "repeat_check": not args.no_repeat,
                       "invariants_every": args.invariants_every, "state_every": args.state_every}
            append(args.record, [validate_record(Recorder("validate", device=dev, source=source(args)), res,
                                                 options)])
        print(res.headline() + (" (--strict: a failure)" if args.strict and res.verdict == "marginal" else ""))
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
            for c, k in sorted(res.marginal_counts.items()):
                print(f"  {c}: {k} marginal error(s)")
            print(res.margin_line())
            print(f"throughput: {res.rate} tokens/s ({res.tokens_accepted} accepted tokens, "
                  f"{res.tokens_verified} verified, {res.steps_run} steps in {res.wall_s:.2f} s on {dev}, "
                  f"including the fp64 reference and checks)")
            print(f"result: {pj}  summary: {pm}")
        return EXIT_PASS if res.ok(args.strict) and compiled_ok else EXIT_FAIL

