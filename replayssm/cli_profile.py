"""``replayssm profile NAME --device DEV [--record FILE] [--out DIR]``: run a named device profile.

A profile is data (``replayssm/profiles.toml``): the commands one measurement runs, in order or
together, with the device as a parameter.  Each step is a replayssm subcommand, a pytest selection
or a nox session, run in its own process; ``--record FILE`` is passed on to every replayssm step
(the jobs append their records there).  Nothing is written outside ``--out`` and the record file.

Before any step starts, every step's command line is parsed by the real argument parser
(:func:`replayssm.cli.build_parser`), so a profile naming a flag that does not exist, or a device it
does not accept, is refused with nothing run.  Exit status: the worst of the steps' (3 environment
> 2 usage > 1 a verdict failed > 0); a step killed by a signal counts as 3.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from replayssm.cli import UsageError, build_parser, check_device
from replayssm.guard import check_record_path, check_writable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PROFILES = Path(__file__).with_name("profiles.toml")
STEP_KINDS = ("replayssm", "pytest", "nox")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Step:
    kind: str
    args: tuple[str, ...]
    label: str
    env: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    devices: tuple[str, ...]
    steps: tuple[Step, ...]
    parallel: bool = False
    needs: str | None = None


def load_profiles(path: Path = PROFILES) -> dict[str, Profile]:
    """Every profile of the TOML file; ValueError naming the profile and step that is malformed."""
    data = tomllib.loads(Path(path).read_text())
    out = {}
    for name, p in data.items():
        unknown = set(p) - {"description", "devices", "steps", "parallel", "needs"}
        if unknown:
            raise ValueError(f"profile {name}: unknown keys {sorted(unknown)}")
        devices = tuple(p.get("devices", ()))
        if not devices or not set(devices) <= set(DEVICES):
            raise ValueError(f"profile {name}: devices must be a non-empty subset of {list(DEVICES)}, "
                             f"got {list(devices)}")
        steps = []
        for i, s in enumerate(p.get("steps", ())):
            kinds = [k for k in STEP_KINDS if k in s]
            extra = set(s) - set(STEP_KINDS) - {"label", "env"}
            if len(kinds) != 1 or extra:
                raise ValueError(f"profile {name} step {i + 1}: expected exactly one of {list(STEP_KINDS)} "
                                 f"(and optional label, env), got keys {sorted(s)}")
            args = s[kinds[0]]
            if not args or not all(isinstance(a, str) for a in args):
                raise ValueError(f"profile {name} step {i + 1}: {kinds[0]} must be a non-empty list of strings")
            steps.append(Step(kinds[0], tuple(args), s.get("label", f"step {i + 1}"),
                              {str(k): str(v) for k, v in s.get("env", {}).items()}))
        if not steps or not p.get("description"):
            raise ValueError(f"profile {name}: needs a description and at least one step")
        out[name] = Profile(name, p["description"], devices, tuple(steps), bool(p.get("parallel", False)),
                            p.get("needs"))
    return out


def expand(step: Step, device: str, out: str, record: str | None) -> list[str]:
    """The step's argument list with {device} and {out} filled in and, for a replayssm step, the
    record file appended."""
    args = [a.replace("{device}", device).replace("{out}", out) for a in step.args]
    if step.kind == "replayssm" and record:
        args += ["--record", record]
    return args


def check_step(step: Step, args: list[str]) -> None:
    """Parse a replayssm step with the real parser (ValueError naming the step otherwise)."""
    if step.kind != "replayssm":
        return
    try:
        parsed = build_parser().parse_args(args)
    except (UsageError, SystemExit) as e:
        raise ValueError(f"step {step.label!r}: replayssm {' '.join(args)}: {e}") from None
    if getattr(parsed, "command", None) == "profile":
        raise ValueError(f"step {step.label!r}: a profile cannot run another profile")


def command_line(step: Step, args: list[str]) -> list[str]:
    module = {"replayssm": "replayssm", "pytest": "pytest", "nox": "nox"}[step.kind]
    return [sys.executable, "-m", module, *args]


def add_parser(subparsers):
    p = subparsers.add_parser("profile", help="run a named device profile (replayssm/profiles.toml)",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("name", nargs="?", help="the profile (--list shows them)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: the device the profile's steps run on "
                   "(default cpu)")
    p.add_argument("--record", metavar="FILE", help="append the jobs' records to FILE (JSON lines)")
    p.add_argument("--out", metavar="DIR", help="folder for the steps' outputs (default out/profile/NAME)")
    p.add_argument("--list", action="store_true", help="list the profiles and exit")
    p.add_argument("--dry-run", action="store_true", help="print the commands (checked) without running them")
    p.add_argument("--stop-on-failure", action="store_true", help="stop at the first step that does not pass")
    return p


def _rank(rc: int) -> int:
    return {0: 0, 1: 1, 2: 2, 3: 3}.get(rc, 3)


def run(args) -> int:
    profiles = load_profiles()
    if args.list:
        for name, p in profiles.items():
            print(f"{name:18s} [{', '.join(p.devices)}]{' (parallel)' if p.parallel else ''} {p.description}")
        return 0
    if not args.name:
        raise ValueError("profile: expected a profile NAME (replayssm profile --list shows them)")
    if args.name not in profiles:
        raise ValueError(f"profile NAME: unknown profile {args.name!r}; expected one of {sorted(profiles)}")
    prof = profiles[args.name]
    kind = args.device.split(":", 1)[0]
    if kind not in prof.devices:
        raise ValueError(f"--device: profile {prof.name} runs on {' or '.join(prof.devices)}, got {args.device!r}")
    out = args.out or str(Path("out") / "profile" / prof.name)
    record = str(Path(args.record).resolve()) if args.record else None
    planned = [(s, expand(s, args.device, out, record)) for s in prof.steps]
    for step, argv in planned:  # every step checked before any runs
        check_step(step, argv)
    if args.dry_run:
        for step, argv in planned:
            env = " ".join(f"{k}={v}" for k, v in step.env.items())
            print(f"[{step.label}] {env + ' ' if env else ''}python -m {step.kind} {' '.join(argv)}")
        return 0
    check_device(args.device)
    check_writable(out, "--out")
    check_record_path(record)
    Path(out).mkdir(parents=True, exist_ok=True)
    if record:
        Path(record).parent.mkdir(parents=True, exist_ok=True)
    if prof.needs:
        print(f"profile {prof.name}: needs {prof.needs}")
    results = []
    if prof.parallel:
        t0 = time.monotonic()
        procs = [(s, subprocess.Popen(command_line(s, a), env={**os.environ, **s.env})) for s, a in planned]
        results = [(s, p.wait(), time.monotonic() - t0) for s, p in procs]
    else:
        for step, argv in planned:
            t0 = time.monotonic()
            rc = subprocess.run(command_line(step, argv), env={**os.environ, **step.env}).returncode
            results.append((step, rc, time.monotonic() - t0))
            if rc and args.stop_on_failure:
                break
    worst = 0
    for step, rc, wall in results:
        print(f"profile {prof.name}: [{step.label}] exit {rc} ({wall:.1f} s)")
        worst = max(worst, _rank(rc))
    skipped = len(planned) - len(results)
    print(f"profile {prof.name}: {len(results)} of {len(planned)} step(s) run"
          f"{f', {skipped} skipped after a failure' if skipped else ''}; outputs in {out}"
          f"{f'; records in {record}' if record else ''}")
    return worst
