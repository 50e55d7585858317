"""``replayssm validate --level mixer``: one mixer kernel on the default mixer plan (runner.py).

Flags read: ``--kernel`` (a mixer kernel: ``mixer-literal-<policy>``, ``mixer-triton-replay``, the
adapters ``mixer-vllm-conv``, ``mixer-causal-conv1d``, ``mixer-sglang-conv``, ``mixer-fla-shortconv``, the
``mutant-conv-*``),
``--family``, ``--geometry`` (a family preset; the mixer adds d_conv = 4), ``--precision``, ``--window``
(T', default d_conv + 1), ``--buffer``, ``--steps`` (default 24), ``--seed``, ``--device``, ``--out``,
``--vllm-src``, ``--quiet``; ``--scenario FILE`` replays a mixer scenario instead of the default plan
(the fuzzer's reproducer names its kernel; ``--kernel`` overrides it); any other scenario flag is refused
(exit 2) rather than ignored.  Writes ``<out>/<kernel>-<family>-mixer.json``; exit 0 pass, 1 fail;
``--record FILE`` appends one ``mixer`` record (case ``<family>/<kernel>/<mode>/<geometry>/mixer-validate``).
"""

from __future__ import annotations

import json
import os

from replayssm.guard import check_record_path, check_writable, out_path
from replayssm.mixer.kernel import mixer_kernel
from replayssm.mixer.spec import mixer_preset
from replayssm.records import Recorder, append
from replayssm.records.jobs import source
from replayssm.validators.engine.mixer.runner import default_plan, validate_mixer
from replayssm.validators.engine.mixer.scenario import load_scenario

_UNUSED = ("schedule", "batch", "padding", "slots", "distribution", "initial_state", "save_scenario",
           "compile_for", "decode")


def run_validate(args) -> int:
    for name in _UNUSED:
        if getattr(args, name, None):
            raise ValueError(f"--{name.replace('_', '-')}: not used with --level mixer (the mixer plan is fixed: "
                             f"docs/mixer.md)")
    if getattr(args, "kernel_options", None):
        raise ValueError("--kernel-option: not used with --level mixer")
    if not args.kernel and not args.scenario:
        raise ValueError("--kernel: required with --level mixer (a mixer kernel, e.g. mixer-literal-lazy-offset)")
    if getattr(args, "vllm_src", None):
        os.environ["REPLAYSSM_VLLM_SRC"] = args.vllm_src
    if args.scenario:
        return _replay(args)
    cls = mixer_kernel(args.kernel)
    fam = args.family or "mamba2"
    geometry = mixer_preset(args.geometry or "tiny", fam)
    plan = default_plan(geometry.d_conv, steps=args.steps or 24, window=args.window, buffer=args.buffer)
    mode = args.precision or "s32a16"
    dest = out_path(args.out, f"{cls.name}-{fam}-mixer.json", "--out")
    check_writable(args.out, "--out")
    check_record_path(getattr(args, "record", None))
    res = validate_mixer(cls, geometry, mode, plan, seed=args.seed or 0, device=args.device)
    config = {"level": "mixer", "geometry": args.geometry or "tiny", "d_conv": geometry.d_conv,
              "steps": len(plan.steps), "window": plan.window, "buffer": plan.buffer, "slots": plan.num_slots,
              "seed": args.seed or 0}
    return _report(args, res, dest, config)


def _replay(args) -> int:
    """``--scenario FILE``: a mixer scenario (a fuzzer's reproducer names its kernel) run as saved."""
    for name in ("family", "geometry", "precision", "window", "buffer", "steps", "seed"):
        if getattr(args, name, None) is not None:
            raise ValueError(f"--{name}: not used with --scenario at --level mixer (the file names it)")
    sc, named = load_scenario(args.scenario)
    cls = mixer_kernel(args.kernel or named or "")
    dest = out_path(args.out, f"{cls.name}-{sc.family}-mixer.json", "--out")
    check_writable(args.out, "--out")
    check_record_path(getattr(args, "record", None))
    return _report(args, sc.run(cls, device=args.device), dest, {"level": "mixer", "scenario": str(args.scenario)})


def _report(args, res, dest, config: dict) -> int:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(res.to_dict(), indent=2) + "\n")
    print(res.verdict())
    if not args.quiet:
        print(f"result: {dest}")
    if getattr(args, "record", None):
        append(args.record, [validate_record(Recorder("mixer", device=args.device, source=source(args)), res,
                                             config)])
    return 0 if res.passed else 1


def validate_record(recorder: Recorder, res, config: dict) -> dict:
    """The ``mixer`` record of one mixer validation: its verdict, steps and worst error/bound per check."""
    first = res.first_failure
    geometry = config.get("geometry")
    return recorder.record(f"{res.family}/{res.kernel}/{res.mode}/{geometry or 'scenario'}/mixer-validate",
                           metrics={"steps_run": res.steps_run, "failures": len(res.failures),
                                    **{f"worst_{k}": v for k, v in res.worst.items()}},
                           verdict="pass" if res.passed else "fail",
                           reason=None if first is None else first.describe(),
                           config={**config, "conv_policy": res.conv_policy}, family=res.family, kernel=res.kernel,
                           mode=res.mode, geometry=geometry)
