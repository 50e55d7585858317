"""The engine's checks: every invariant and tolerance check as a small named unit, in one registry.

Oracle: each unit's module states its own (docs/recurrences.md sections 2-4 and docs/validation.md, the fp64
reference, the tolerance rule of ``validators/engine/tolerances.py``).  ``CHECKS`` (name ->
:class:`Check`) is the registry, in
run order: at each hook of a step the Lockstep runs the registered checks of that hook in this
order (which decides, among failures at the same step, row and position, which one is first).
The modules are imported below in that order.

To add a check: write one module here with a function decorated by :func:`register_check`
(its name, hook, schedule, what it catches, kernel kinds, needed snapshots, and its witness
mutant), import it below at its place in the run order, and register a mutant in
``validators/engine/mutants/`` that this check catches first (tests/engine/test_checks.py runs it);
docs/validation.md lists every check (tests/engine/test_checks.py compares it with the registry).
"""

# isort: off
from replayssm.validators.engine.checks.registry import (BOTH, CHECKS, HOOKS, KINDS, REPLAY, SCHEDULES, SNAPSHOTS,
                                                         Check, checks_at, register_check)
from replayssm.validators.engine.checks import out_param  # noqa: F401  (verify-returned)
from replayssm.validators.engine.checks import inputs_unchanged  # noqa: F401  (verify-returned, after-commit)
from replayssm.validators.engine.checks import view_gaps  # noqa: F401  (verify-returned, after-commit)
from replayssm.validators.engine.checks import window_tail  # noqa: F401  (after-verify)
from replayssm.validators.engine.checks import output_bits  # noqa: F401  (after-verify)
from replayssm.validators.engine.checks import output_tolerance  # noqa: F401  (after-verify)
from replayssm.validators.engine.checks import committed_storage  # noqa: F401  (after-verify)
from replayssm.validators.engine.checks import stored_precision  # noqa: F401  (at-flush)
from replayssm.validators.engine.checks import flush_checkpoint  # noqa: F401  (at-flush)
from replayssm.validators.engine.checks import flush_increment  # noqa: F401  (at-flush)
from replayssm.validators.engine.checks import zero_accept  # noqa: F401  (after-verify, after-commit)
from replayssm.validators.engine.checks import accepted_range  # noqa: F401  (after-verify)
from replayssm.validators.engine.checks import staged_fold  # noqa: F401  (after-commit)
from replayssm.validators.engine.checks import cursor  # noqa: F401  (after-commit)
from replayssm.validators.engine.checks import canaries  # noqa: F401  (after-verify, after-commit)
from replayssm.validators.engine.checks import committed_state  # noqa: F401  (after-commit)
from replayssm.validators.engine.checks import materialize  # noqa: F401  (after-commit)
from replayssm.validators.engine.checks import run_level  # noqa: F401  (end-of-run)
# isort: on
from replayssm.validators.engine.checks.context import RunContext, StepContext
from replayssm.validators.engine.checks.tolerance_rule import SR_WALK_CAP, ToleranceRule

__all__ = ["BOTH", "CHECKS", "HOOKS", "KINDS", "REPLAY", "SCHEDULES", "SNAPSHOTS", "SR_WALK_CAP", "Check",
           "RunContext", "StepContext", "ToleranceRule", "checks_at", "register_check"]
