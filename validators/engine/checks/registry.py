"""The check registry: every invariant and tolerance check of the engine, as a named unit.

Oracle: none here; this records what each check is.  A check is registered once, with its
failure name (what results, docs and the fuzz corpus call it), the hooks of a step it runs at,
the step schedule it follows, what it catches (one sentence), which kernel kinds it applies to,
the snapshots it needs, and the gallery mutant that witnesses it: a broken kernel whose first
failure, on the witness scenario, is this check (tests/engine/test_checks.py runs every one).

:class:`~replayssm.validators.engine.runner.Lockstep` runs, at each hook, the registered checks of that
hook in registration order, if the step's schedule says so and the kernel's kind is listed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The points of a step (and of a run) where checks run, in the order they come.
HOOKS = {
    "verify-returned": "the kernel's verify has just returned (its return value and the out= buffer)",
    "after-verify": "the window's outputs beside the fp64 reference and the literal model, with the snapshots "
                    "taken around the verify",
    "at-flush": "rows whose verify was a flush: the checkpoint the kernel wrote",
    "after-commit": "after the commit: cursors, snapshots and the committed state",
    "end-of-run": "once, after the last step (or the step that raised)",
}
# When a check runs, in terms of the Lockstep's schedules (n: the step number).
SCHEDULES = {
    "every-step": "every step",
    "invariants": "every invariants_every-th step and the last step",
    "literal": "every literal_every-th step (with a literal model)",
    "state": "every state_every-th step and the last step",
    "every-flush": "every step with a flush (off only for jobs that judge states themselves: both sampled "
                   "schedules 0, which run_scenario refuses)",
    "once": "once per run",
    "repeat": "once per run, when the repeat run is asked for (run_scenario's repeat_check) and no step raised",
}
# Snapshot points a check may need; the Lockstep takes a snapshot only when a check due at that
# step needs it ("inputs": a copy of every tensor handed to verify and commit, taken before the call).
SNAPSHOTS = ("canaries", "before-verify", "after-verify", "after-commit", "checkpoint", "inputs")
KINDS = ("replay", "baseline")
BOTH = KINDS
REPLAY = ("replay",)


@dataclass(frozen=True)
class Check:
    """One registered check.  ``run(ctx)`` reports failures through ``ctx.fail``; ``flag(ctx)``, when
    given, is a device boolean computed before the hook's one host sync: ``run`` is only called when
    it is True.  ``witness`` are ``Scenario.tiny`` overrides on which ``mutant`` (of its first
    registered family, or ``witness["family"]``) fails this check first.  ``banded``: the check
    compares an error with the tolerance rule's bound and reports ``value`` and ``bound``; an error
    above the bound by at most ``tolerances.MARGINAL_FACTOR`` is a marginal, not a failure
    (docs/validation.md, "Verdicts")."""

    name: str
    hooks: tuple[str, ...]
    schedule: str
    catches: str
    kinds: tuple[str, ...]
    mutant: str
    run: Callable
    flag: Callable | None = None
    needs: tuple[str, ...] = ()
    witness: dict = field(default_factory=dict)
    banded: bool = False

    def applies(self, kind: str) -> bool:
        return kind in self.kinds


CHECKS: dict[str, Check] = {}


def register_check(name: str, *, hooks, schedule: str, catches: str, kinds=BOTH, mutant: str, flag=None,
                   needs=(), witness=None, banded: bool = False):
    """Decorator: register the decorated ``run(ctx)`` function as check ``name``."""
    hooks = (hooks,) if isinstance(hooks, str) else tuple(hooks)
    bad = [h for h in hooks if h not in HOOKS]
    if not hooks or bad:
        raise ValueError(f"hooks: expected some of {list(HOOKS)}, got {list(hooks)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {list(SCHEDULES)}, got {schedule!r}")
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds: expected some of {list(KINDS)}, got {kinds!r}")
    if any(n not in SNAPSHOTS for n in needs):
        raise ValueError(f"needs: expected some of {list(SNAPSHOTS)}, got {list(needs)}")
    if name in CHECKS:
        raise ValueError(f"name: check {name!r} is already registered")
    if not catches or not mutant:
        raise ValueError(f"check {name!r}: say what it catches and name its witness mutant")

    def deco(fn):
        CHECKS[name] = Check(name, hooks, schedule, catches, tuple(kinds), mutant, fn, flag, tuple(needs),
                             dict(witness or {}), bool(banded))
        return fn

    return deco


def checks_at(hook: str, kind: str) -> list[Check]:
    """The registered checks of ``hook`` that apply to kernels of ``kind``, in run order."""
    if hook not in HOOKS:
        raise ValueError(f"hook: expected one of {list(HOOKS)}, got {hook!r}")
    return [c for c in CHECKS.values() if hook in c.hooks and c.applies(kind)]


__all__ = ["BOTH", "CHECKS", "HOOKS", "KINDS", "REPLAY", "SCHEDULES", "SNAPSHOTS", "Check", "checks_at",
           "register_check"]
