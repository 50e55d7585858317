"""The one mutant registry: every broken kernel, registered once, on the literal models of each family.

Oracle: none here; this only builds and records the mutant classes.  A mutant is a mixin with
exactly one deliberate bug, put on top of a family's literal replay model (or literal baseline)
and registered with the kernel registry as ``kind = "mutant"`` (so ``replayssm list`` shows it
and ``replayssm validate --kernel mutant-...`` runs it).  The validation engine must fail every
one of them (tests/engine/test_mutants_engine.py, tests/jobs/test_mutation_gallery.py).

Load the registry through the package, never this module alone: ``from
replayssm.validators.engine.mutants import all_mutants`` imports every mutant module, so every entry
point sees the same set.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from replayssm.families import CAPABILITIES
from replayssm.families import families as _families
from replayssm.registry import register
from replayssm.scenarios.schedules import plan

# The literal models each mutant is built on, per family (the family registry's).
REPLAY_BASES = {name: fam.literal_replay for name, fam in _families().items()}
BASELINE_BASES = {name: fam.literal_baseline for name, fam in _families().items()}

# What kind of slip a mutant stands for (docs/mutation_gallery.md groups them so); "bookkeeping"
# reproducers must shrink to <= 2 rows and <= 8 steps (validators/jobs/fuzz/gallery.py).
CLASSES = ("bookkeeping", "arithmetic", "precision", "interface")


@dataclass(frozen=True)
class MutantSpec:
    name: str
    description: str
    decodes: tuple[str, ...]
    first_bad: Callable | None  # (scenario, plan) -> first step the engine must flag, or None
    classes: dict  # family -> registered kernel class
    klass: str = "bookkeeping"  # one of CLASSES
    field_bug: bool = False  # one of the field bugs of docs/field_bugs.md (each with a first_bad rule)
    # Fuzzed by the CI gallery (tests/jobs/test_mutation_gallery.py): True, False (caught in CI by a
    # direct run of a named scenario instead, tests/engine/test_serving.py), or the families fuzzed (the
    # others caught by a named scenario, tests/jobs/test_mutation_gallery.py).
    gallery: bool | tuple[str, ...] = True
    # Raising is its bug (an out-of-range index, ...): only then does a run that ends in an exception
    # count as a catch (validators/jobs/fuzz/gallery.py); otherwise the engine must fail one of its checks.
    raises: bool = False
    needs: tuple[str, ...] = ("replay-fold",)  # the mechanisms its bug lives in (Family.capabilities)

    def fuzzed(self, fam: str) -> bool:
        return self.gallery is True or (isinstance(self.gallery, tuple) and fam in self.gallery)


MUTANTS: dict[str, MutantSpec] = {}


def register_mutant(mixin: type, name: str, description: str, *, klass: str, needs: tuple[str, ...] = ("replay-fold",),
                    families: tuple[str, ...] | None = None, base: str = "replay",
                    decodes=("speculative", "standard"), first_bad: Callable | None = None,
                    field_bug: bool = False, gallery: bool | tuple[str, ...] = True,
                    raises: bool = False) -> MutantSpec:
    """Register ``mixin`` on the literal replay (or baseline) model of every registered family that
    has the mechanisms ``needs`` (keys of ``replayssm.families.CAPABILITIES``, declared by each family
    in ``Family.capabilities``) as kernel ``name`` (``kind = "mutant"``) and record it in :data:`MUTANTS`.
    ``families``: only these families (a family's own slip, ``Family.mutants``, or one engine's code
    for named families, validators/engine/mutants/serving.py); each must be registered and have ``needs``.

    Mutants built on the literal *baseline* set ``base_kind = "baseline"`` so the runner applies
    the baseline's checks to them (a baseline keeps no cursors)."""
    if klass not in CLASSES:
        raise ValueError(f"klass: expected one of {CLASSES}, got {klass!r}")
    if base not in ("replay", "baseline"):
        raise ValueError(f"base: expected 'replay' or 'baseline', got {base!r}")
    if name in MUTANTS:
        raise ValueError(f"name: mutant {name!r} is already registered")
    unknown = set(needs) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"needs: unknown mechanism(s) {sorted(unknown)}; expected some of {sorted(CAPABILITIES)}")
    having = [n for n, f in _families().items() if set(needs) <= f.capabilities]
    if families is not None:
        missing = [f for f in families if f not in having]
        if missing:
            raise ValueError(f"families: {missing} are not registered families having {sorted(needs)} "
                             f"(those having it: {having})")
        having = list(families)
    bases = REPLAY_BASES if base == "replay" else BASELINE_BASES
    classes = {}
    for fam in having:
        attrs = {"name": name, "family": fam, "kind": "mutant", "description": description,
                 "literal_twin": "literal-baseline" if base == "baseline" else "literal-replay",
                 "base_kind": base, "decodes": tuple(decodes), "__module__": mixin.__module__}
        classes[fam] = register(type(f"{mixin.__name__}_{fam}", (mixin, bases[fam]), attrs), replace=True)
        for key, value in _declarations(mixin).items():
            setattr(classes[fam], key, value)
    spec = MutantSpec(name, description, tuple(decodes), first_bad, classes, klass, field_bug, gallery, raises,
                      tuple(needs))
    MUTANTS[name] = spec
    return spec


def _declarations(mixin: type) -> dict:
    """What a mutant declares beyond its literal base: a mixin overriding ``verify`` without a
    ``window_lens`` (``query_start_loc``) parameter cannot run ragged windows (the packed layout),
    one overriding ``commit`` refuses k = 0, and no mutant runs standard steps on speculative
    slots (its one bug is elsewhere), unless the mixin says otherwise."""
    out = {}
    verify = mixin.__dict__.get("verify")
    params = () if verify is None else inspect.signature(verify).parameters
    if verify is not None and "window_lens" not in params and "supports_ragged_windows" not in mixin.__dict__:
        out["supports_ragged_windows"] = False
    if verify is not None and "query_start_loc" not in params and "supports_packed_layout" not in mixin.__dict__:
        out["supports_packed_layout"] = False
    if "supports_mixed_decode" not in mixin.__dict__:
        out["supports_mixed_decode"] = False
    if "commit" in mixin.__dict__ and "zero_accept" not in mixin.__dict__:
        out["zero_accept"] = "refuse"
    return out


def first_bad_step(name: str, sc, steps=None) -> int | None:
    """The first step at which mutant ``name`` must be flagged on scenario ``sc`` (None: unknown)."""
    spec = MUTANTS[name]
    if spec.first_bad is None:
        return None
    return spec.first_bad(sc, steps if steps is not None else plan(sc))


__all__ = ["BASELINE_BASES", "CLASSES", "MUTANTS", "REPLAY_BASES", "MutantSpec", "first_bad_step",
           "register_mutant"]
