"""``replayssm list``: registered kernels (by kind: replay, baseline, mutant), precision modes,
geometries, schedules and input distributions.  ``--json`` for machines."""

from __future__ import annotations

import json


def add_parser(subparsers):
    p = subparsers.add_parser("list", help="list kernels, precision modes, geometries, schedules, distributions")
    p.add_argument("what", nargs="?", default="all",
                   choices=["all", "kernels", "modes", "geometries", "schedules", "distributions"])
    p.add_argument("--family", choices=["mamba2", "gdn"], help="only kernels of this family")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def load_kernels() -> None:
    """Import everything that registers kernels: built-ins (replayssm.ops) and every mutant."""
    import replayssm.validators.mutants  # noqa: F401 - registers every mutant
    from replayssm.registry import kernels
    kernels()


def collect(family: str | None = None) -> dict:
    from replayssm.geometry import PRESETS
    from replayssm.precision import STANDARD_MODES, VALID_FORMS
    from replayssm.registry import kernels
    from replayssm.scenarios.inputs import DISTRIBUTIONS
    from replayssm.scenarios.schedules import SCHEDULES
    load_kernels()
    ks = [{"family": f, "name": n, "kind": c.kind, "description": c.description}
          for (f, n), c in kernels(family).items()]
    return {
        "kernels": ks,
        "modes": {"standard": list(STANDARD_MODES), "forms": VALID_FORMS},
        "geometries": {name: {fam: g.to_dict() for fam, g in fams.items()} for name, fams in PRESETS.items()},
        "schedules": dict(SCHEDULES),
        "distributions": {d.name: d.description for d in DISTRIBUTIONS.values()},
    }


def run(args) -> int:
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
    return 0
