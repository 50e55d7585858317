"""``replayssm list``: registered kernels (by kind: replay, baseline, mutant), the mixer kernels (each
adapter available, or one line saying how to get its source), precision modes, geometries, schedules
and input distributions.  ``--json`` for machines."""

from __future__ import annotations

import json

from replayssm import adapters
from replayssm.families import families
from replayssm.families import family as family_of
from replayssm.mixer.kernel import ComposedMixer, mixer_kernels
from replayssm.precision import STANDARD_MODES, VALID_FORMS
from replayssm.registry import kernels
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.schedules import SCHEDULES
from replayssm.validators.engine import mutants  # noqa: F401 - registers every mutant
from replayssm.validators.engine.mixer import runner as _mixer  # noqa: F401 - registers every mixer kernel


def add_parser(subparsers):
    p = subparsers.add_parser("list", help="list kernels, precision modes, geometries, schedules, distributions")
    p.add_argument("what", nargs="?", default="all",
                   choices=["all", "kernels", "mixer", "modes", "geometries", "schedules", "distributions",
                            "adapters"])
    p.add_argument("--family", help="only kernels of this family (a registered family)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--vllm-src", metavar="PATH", help="vLLM ReplaySSM source tree for the vllm adapters "
                   "(sets REPLAYSSM_VLLM_SRC)")
    return p


def load_kernels() -> None:
    """Import everything that registers kernels: built-ins (replayssm.ops), every mutant and the
    adapters whose source is available (``replayssm.adapters``)."""
    kernels()
    adapters.load()


def collect(family: str | None = None) -> dict:
    load_kernels()
    if family is not None:
        try:
            family_of(family)
        except ValueError as e:  # exit 2 naming the flag and the registered families
            raise ValueError(f"--family {family}: {str(e).split(': ', 1)[-1]}") from None
    geometries: dict[str, dict] = {}
    for fname, fam in families().items():
        for name, g in fam.presets.items():
            geometries.setdefault(name, {})[fname] = g.to_dict()
    ks = [{"family": f, "name": n, "kind": c.kind, "description": c.description}
          for (f, n), c in kernels(family).items()]
    return {
        "kernels": ks,
        "mixer": mixer_listing(),
        "modes": {"standard": list(STANDARD_MODES), "forms": VALID_FORMS},
        "geometries": geometries,
        "schedules": dict(SCHEDULES),
        "distributions": {d.name: d.description for d in DISTRIBUTIONS.values()},
        "adapters": {name: {"available": ok, "status": line} for name, (ok, line) in adapters.availability().items()},
    }


def mixer_listing() -> list[dict]:
    """Every mixer kernel: its conv design, its SSM kernel, and whether its external source loads."""
    out = []
    for name, cls in mixer_kernels().items():
        reason = cls.source_reason()
        out.append({"name": name, "conv_policy": cls.conv_policy, "description": cls.description,
                    "ssm_kernel": cls.ssm_kernel if issubclass(cls, ComposedMixer) else None,
                    "available": reason is None, "status": reason or "available"})
    return out


def use_vllm_src(args) -> None:
    """``--vllm-src PATH``: point the vllm adapters at PATH (before they load)."""
    if getattr(args, "vllm_src", None):
        import os

        os.environ["REPLAYSSM_VLLM_SRC"] = args.vllm_src
        adapters.load(force=True)


def run(args) -> int:
    use_vllm_src(args)
    info = collect(args.family)
    if args.what != "all":
        info = {args.what: info[args.what]}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    if "kernels" in info:
        kinds = {}
        for k in info["kernels"]:
            kinds.setdefault(k["kind"], []).append(k)
        order = sorted(kinds, key=lambda x: (x == "mutant", x))
        for kind in order:
            title = "Broken kernels (mutants: validation must fail them)" if kind == "mutant" else f"Kernels ({kind})"
            print(title + ":")
            for k in kinds[kind]:
                print(f"  {k['family']:<7} {k['name']:<32} {k['description']}")
            print()
    if "mixer" in info:
        print("Mixer kernels (--level mixer; docs/mixer.md):")
        for k in info["mixer"]:
            print(f"  {k['name']:<32} {k['conv_policy']:<18} {k['description']}")
            if not k["available"]:
                print(f"  {'':<32} unavailable: {k['status']}")
        print()
    if "modes" in info:
        print("Precision modes: " + " ".join(info["modes"]["standard"]))
        print("  forms: " + info["modes"]["forms"])
        print()
    if "geometries" in info:
        print("Geometries:")
        for name, fams in info["geometries"].items():
            for fam, g in fams.items():
                dims = ", ".join(f"{k}={v}" for k, v in g.items() if k != "family")
                print(f"  {name:<10} {fam:<7} {dims}")
        print()
    if "schedules" in info:
        print("Schedules:")
        for name, d in info["schedules"].items():
            print(f"  {name:<11} {d}")
        print()
    if "distributions" in info:
        print("Distributions:")
        for name, d in info["distributions"].items():
            print(f"  {name:<16} {d}")
        print()
    if "adapters" in info:
        print("Adapters (kernels written elsewhere):")
        for name, a in info["adapters"].items():
            print(f"  {name:<10} {'available' if a['available'] else 'unavailable'}: {a['status']}")
    return 0
