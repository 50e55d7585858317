"""One orchestrator of a decode step; two executions of it.

Oracle: docs/validation.md (what a step judges) and the step order below.  Expected difference
between the executions: none -- the eager execution (:class:`~replayssm.validators.engine.runner.Lockstep`:
any kernel, any device, one step at a time) and the captured execution (blocks of steps on fixed
buffers, under CUDA graphs on a GPU, the checks deferred to the block's end; its engine parts in
``validators/engine/captured.py``, driven by drift's fast path, ``validators/jobs/drift/fast.py``) give the
same verdicts, failures, metrics and bookkeeping bit for bit (tests/jobs/test_orchestrator_executions.py,
tests/jobs/test_drift_fast.py).

A step is :data:`STEP`, in that order.  :class:`Orchestrator` holds what every execution shares:
the check schedules (which checks are due at a step, what they need), the hook runner (a due
check's device flag first, the check only where it is raised), the failure book (failures and
marginals), the verify bookkeeping of any number of steps at once (coverage, the ``(write_pos,
k)`` phases) and the tolerance envelope's flush counts.  An execution
supplies the state they read (``hooks``, ``coverage``, ``phases``, ``lit_env``, the ``*_every``
samplings, ``dec``, ``active``, ...): the eager one builds it, the captured one drives the
Lockstep it is given.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from replayssm.scenarios.schedules import StepPlan
from replayssm.validators.engine.checks import CHECKS, StepContext
from replayssm.validators.engine.result import Failure

# The phases of one step, in order: reset rows -> inputs (and the checks due) -> the verify's bookkeeping
# and the kernel's verify (its verify-returned checks on what it returned) -> the literal models and the
# fp64 reference window (the outputs' truth) -> the checks of the verify (after-verify, at-flush) -> the
# kernel's commit and the cursors -> the checks of the commit (after-commit).  Each is an execution's
# ``phase_<name>`` method (dashes as underscores), called in this order by :meth:`Orchestrator.run_phases`.
# The captured execution runs a block's device phases in the order its graphs need (verify, commit, then
# the reference of the block), books the block's verifies and commits through the shared methods below,
# and runs the verify's checks at the block's end on a flagged step, on the same values.
STEP = ("reset", "inputs", "verify", "reference", "verify-checks", "commit", "commit-checks")
PHASES = tuple("phase_" + name.replace("-", "_") for name in STEP)
# The verify bookkeeping's coverage keys, in the order the row loop adds them.
FLUSH_KEYS = ("flush verifies", "non-flush verifies")


@dataclasses.dataclass
class StepState:
    """What one step's phases hand each other: the plan as the kernel runs it (``p``), the rows committing
    k = 0 as a no-op (``zero_rows``) and probed (``probe_rows``), then the inputs, the checks due and what
    they need, the flush rows, the step's check context, ..."""

    p: StepPlan
    zero_rows: list[int]
    probe_rows: list[int]
    inputs: dict = dataclasses.field(default_factory=dict)
    due: set = dataclasses.field(default_factory=set)
    needs: set = dataclasses.field(default_factory=set)
    use_lit: bool = False
    flush_rows: list[int] = dataclasses.field(default_factory=list)
    ctx: StepContext | None = None
    lens: list[int] | None = None
    lit_kw: dict = dataclasses.field(default_factory=dict)
    at_flush: bool = False
    staged_flush: bool = False
    deferred_flush: bool = False
    lit_folded: list | None = None
    metrics: dict = dataclasses.field(default_factory=dict)


class Orchestrator:
    """The step's shared phases (see the module docstring); :class:`Lockstep` is one."""

    def run_phases(self, st: StepState) -> None:
        """One step: the execution's phase methods in :data:`STEP`'s order."""
        for name in PHASES:
            getattr(self, name)(st)

    # ---- schedules --------------------------------------------------------------------------------------
    def _enabled(self, schedule: str) -> bool:
        """Whether checks of ``schedule`` can run at all in this run."""
        return {"every-step": True, "invariants": bool(self.invariants_every), "literal": bool(self.literal_every),
                "state": bool(self.state_every), "every-flush": bool(self.invariants_every or self.state_every),
                "once": True, "repeat": True}[schedule]

    def _due(self, s: int, last: bool = False) -> set[str]:
        """The schedules due at step ``s`` (``last``: the plan's last step, where every sampled
        schedule that is on is due, so sampling never leaves the end of a run unjudged)."""
        inv_on = bool(self.invariants_every) and (last or s % self.invariants_every == 0)
        st_on = bool(self.state_every) and (last or s % self.state_every == 0)
        due = {"every-step"}
        if inv_on:
            due.add("invariants")
        if bool(self.literal_every) and s % self.literal_every == 0:
            due.add("literal")
        if st_on:
            due.add("state")
        if self.invariants_every or self.state_every:
            due.add("every-flush")
        return due

    def _needs(self, due: set[str]) -> set[str]:
        """Snapshot points the checks due this step need."""
        return {n for checks in self.hooks.values() for c in checks if c.schedule in due for n in c.needs}

    def run_checks(self, hook: str, ctx, due: set[str]) -> None:
        """Run the due checks of ``hook``: their device flags first, in one host sync, then each
        check whose flag is set (or that has none)."""
        ctx.hook = hook
        checks = [c for c in self.hooks[hook] if c.schedule in due]
        flagged = [c for c in checks if c.flag is not None]
        raised = set()
        if flagged:
            vals = torch.stack([c.flag(ctx).reshape(()) for c in flagged]).tolist()
            raised = {c.name for c, v in zip(flagged, vals) if v}
        for c in checks:
            if c.flag is None or c.name in raised:
                c.run(ctx)

    # ---- failures ---------------------------------------------------------------------------------------
    def fail(self, step: int, check: str, message: str, **where) -> None:
        """Report a failure of ``check``; one of a banded check within the marginal band
        (``value / bound <= marginal_factor``) is kept as a marginal instead."""
        f = Failure(step=step, check=check, message=message, **where)
        marginal = CHECKS[check].banded if check in CHECKS else False
        ratio = f.ratio
        if marginal and ratio is not None and ratio <= self.marginal_factor:
            self.marginal_counts[check] += 1
            if len(self.marginals) < self.max_failures:
                self.marginals.append(f)
            return
        self.failure_counts[check] += 1
        if len(self.failures) < self.max_failures:
            self.failures.append(f)

    # ---- the verify's bookkeeping -----------------------------------------------------------------------
    def count_flushes(self, rows: list[int], mask: torch.Tensor | None = None) -> None:
        """One more flush in the tolerance envelope of each of ``rows`` (a verify's flush rows;
        ``mask``: the same rows as a device mask, added in one op)."""
        env = self.lit_env["flushes"]
        if mask is None:
            for r in rows:
                env[r] += 1
        elif rows:
            env.add_(mask)

    def book_verifies(self, wp: np.ndarray, origin: np.ndarray, fl: np.ndarray, k: np.ndarray) -> None:
        """The bookkeeping of ``n`` verifies of every row (``wp``, ``origin``: the cursors before each,
        ``fl``: the rows each flushes, ``k``: the accepted counts; ``[n, R]`` arrays): the ``(write_pos,
        k)`` phases and the coverage counts of the active rows, added as a row loop adds them -- step
        by step and row by row while a count is still a new key, so the keys come in the same order
        whatever ``n``."""
        a = np.asarray(self.active, dtype=np.int64)
        self.phases.update(zip(wp[:, a].ravel().tolist(), k[:, a].ravel().tolist()))
        wrap = fl & (origin + wp >= self.dec.ring_rows) if self.dec.uses_ring else None
        cov = self.coverage
        nf = int(fl[:, a].sum())
        nw = 0 if wrap is None else int(wrap[:, a].sum())
        counts = ((FLUSH_KEYS[0], nf), (FLUSH_KEYS[1], fl.shape[0] * len(a) - nf), ("ring wraps", nw))
        if any(n and key not in cov for key, n in counts):
            for i in range(fl.shape[0]):
                for r in a.tolist():
                    cov[FLUSH_KEYS[0] if fl[i, r] else FLUSH_KEYS[1]] += 1
                    if wrap is not None and wrap[i, r]:
                        cov["ring wraps"] += 1
            return
        for key, n in counts:
            if n:
                cov[key] += n


__all__ = ["FLUSH_KEYS", "PHASES", "STEP", "Orchestrator", "StepState"]
