"""Every broken kernel ("mutant") in one registry, loaded one way by every entry point.

Oracle: each mutant is a literal model plus exactly one deliberate bug; the validation engine
must fail every one (tests/engine/test_mutants_engine.py names the step for the field bugs of docs/field_bugs.md,
tests/jobs/test_mutation_gallery.py has the fuzzer find and shrink each; docs/mutation_gallery.md).

Importing this package registers every mutant with the kernel registry (``kind = "mutant"``), so
``replayssm list`` shows them and ``replayssm validate --kernel mutant-...`` runs them;
:func:`all_mutants` returns them, name -> :class:`MutantSpec`.  The modules:

* ``registry.py``: :data:`MUTANTS`, :func:`register_mutant`, :func:`first_bad_step`, the base tables;
* ``field_bugs.py``: docs/field_bugs.md's seven field bugs, each with its first-bad-step rule;
* ``bookkeeping.py``, ``arithmetic.py``, ``precision.py``: the gallery, by kind of slip;
* ``interface.py``: interface slips, each the witness of one exact check (``validators/engine/checks/``);
* ``serving.py``: serving-engine mechanisms of public reports (docs/field_bugs.md);
* ``seams.py``: the seams of issue 50 (inputs rewritten, counts out of range or garbage, transposed state);
* ``family_mutants.py``: each family's own mutants (``Family.mutants``, written in its folder).

To add one: write a mixin overriding the literal model's methods in the module of its kind, then
``register_mutant(Mixin, "mutant-<name>", "what is wrong", klass=..., decodes=(...))``.
"""

from __future__ import annotations

# isort: off
# Registration order (the order of all_mutants() and of docs/mutation_gallery.md).
from replayssm.validators.engine.mutants import field_bugs  # noqa: F401
from replayssm.validators.engine.mutants import bookkeeping  # noqa: F401
from replayssm.validators.engine.mutants import arithmetic  # noqa: F401
from replayssm.validators.engine.mutants import precision  # noqa: F401
from replayssm.validators.engine.mutants import interface  # noqa: F401
from replayssm.validators.engine.mutants import serving  # noqa: F401
from replayssm.validators.engine.mutants import seams  # noqa: F401
from replayssm.validators.engine.mutants import family_mutants  # noqa: F401
# isort: on
from replayssm.validators.engine.mutants.field_bugs import FIELD_BUGS
from replayssm.validators.engine.mutants.registry import (
    BASELINE_BASES,
    CLASSES,
    MUTANTS,
    REPLAY_BASES,
    MutantSpec,
    first_bad_step,
    register_mutant,
)


def all_mutants() -> dict[str, MutantSpec]:
    """Every registered mutant, name -> spec, in registration order."""
    return dict(MUTANTS)


__all__ = ["BASELINE_BASES", "CLASSES", "FIELD_BUGS", "MUTANTS", "REPLAY_BASES", "MutantSpec", "all_mutants",
           "first_bad_step", "register_mutant"]
