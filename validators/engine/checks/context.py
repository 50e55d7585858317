"""What a check sees: the step (or the run) it is called for, and where it reports.

Oracle: none; a container.  :class:`StepContext` is built once per step by the Lockstep and
filled as the step goes (verify, reference, literal model, snapshots, commit); checks read it and
report through :meth:`StepContext.fail`.  Values several checks share (the outputs of the active
rows, the NaN-poison mask) are computed once, on first use, on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from replayssm.interface import KernelSnapshot
from replayssm.scenarios.schedules import StepPlan
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.resolved import ResolvedScenario


@dataclass(eq=False)
class StepContext:
    """One step.  ``run`` is the :class:`~replayssm.validators.engine.runner.Lockstep` (scenario, rows,
    cursors ``wp`` / ``origin`` after the commit, the tolerance rule ``rule``, canaries);
    ``resolved`` its scenario resolved once (family, mode, geometry, decode config, kernel class,
    tolerance: ``validators/engine/resolved.py``)."""

    run: Any
    plan: StepPlan
    inputs: dict[str, torch.Tensor]
    flush_rows: list[int]
    hook: str = ""
    out_given: torch.Tensor | None = None  # the poisoned buffer passed as out=
    returned: Any = None  # what verify returned
    out: torch.Tensor | None = None  # the outputs checked: the return value, else the out= buffer
    out_raw: torch.Tensor | None = None  # ``out`` before the tails of ragged windows were filled
    tail: torch.Tensor | None = None  # [R, T'] True past each active row's window length (ragged steps)
    zero_rows: list[int] = field(default_factory=list)  # rows committing k = 0 (zero_accept "noop")
    probe_rows: list[int] = field(default_factory=list)  # rows with k = 0 in the plan, refusing kernel
    # rows whose checkpoint this verify may rewrite (None: the flush rows; a fold at the next verify: the
    # rows owing one)
    fold_rows: list[int] | None = None
    snapshots: dict[str, KernelSnapshot] = field(default_factory=dict)
    checkpoint: torch.Tensor | None = None  # kernel.checkpoint_state after a flush verify (fp64, all rows)
    lit_checkpoints: list[torch.Tensor] | None = None
    ref_out: torch.Tensor | None = None  # fp64 reference outputs [R, T', ...]
    ref_state: torch.Tensor | None = None  # fp64 reference state after each row's accepted prefix
    ref_first: torch.Tensor | None = None  # ... after window position 0
    ref_state_before: torch.Tensor | None = None  # ... before the window (the committed prefix)
    ref_magnitude: torch.Tensor | None = None  # readout magnitudes [R, T', ...]
    state_mask: torch.Tensor | None = None  # golden truth: the stored elements of ``ref_state`` (None: all)
    lit_outs: list[torch.Tensor] | None = None  # literal model (and SR replicas) outputs
    fp64: dict[str, torch.Tensor] | None = None  # the fp64 running-error bounds (checks/fp64_bound.py)
    walk: torch.Tensor | None = None  # the rule's sr_walk of the active rows at this step (None: computed now)
    use_literal: bool = False
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # error_metrics of the active outputs
    device_record: dict[str, torch.Tensor] = field(default_factory=dict)  # per-step metrics, on the device
    record: dict = field(default_factory=dict)  # per-step metrics, host floats

    @property
    def step(self) -> int:
        return self.plan.step

    @property
    def kernel(self):
        return self.run.kernel

    @property
    def resolved(self) -> ResolvedScenario:
        return self.run.resolved

    @property
    def rule(self):
        return self.run.rule

    def fail(self, check: str, message: str, **where) -> None:
        self.run.fail(self.step, check, message, **where)

    def cause(self, row: int, position: int | None = None) -> str:
        """Where a value differs, in the terms of the bookkeeping (docs/recurrences.md): the step,
        the row and its slot (and window position), the accepted count k and the window length,
        and the cursors before the verify and after the commit under the declared policy."""
        run, p = self.run, self.plan
        dec = run.dec
        k = p.accepted[row]
        T = 1 if p.standard else (p.window_lens[row] if p.window_lens is not None else run.sc.window)
        wp, org = run.cursors_before(p.step)[row]
        flush = dec.is_flush(wp)
        wp2, org2 = dec.commit_cursor(wp, org, flush, k)
        at = "" if position is None else f", window position {position}"
        return (f"step {p.step}, row {row} (slot {run.ids_list[row]}){at}: accepted k = {k} of a window of {T}; "
                f"cursors before the verify write_pos {wp}, origin {org}, is_flush {flush}; after the commit "
                f"write_pos {wp2}, origin {org2}, is_flush {dec.is_flush(wp2)}")

    def judged_state(self, x: torch.Tensor) -> torch.Tensor:
        """A state as the state checks judge it: itself, or with golden truth its stored elements
        (the placeholder of ``ref_state`` elsewhere, so they add no error)."""
        if self.state_mask is None:
            return x
        keep = self.state_mask | ~torch.isfinite(x)  # a non-finite value is judged wherever it is
        return torch.where(keep, x, self.ref_state.to(x.dtype))

    # ---- shared, computed once -------------------------------------------------------------------------
    @property
    def sr_walk(self) -> torch.Tensor:
        """The tolerance rule's stochastic-rounding walk of the active rows at this step."""
        return self.walk if self.walk is not None else self.rule.sr_walk(self.run.active_idx)

    @cached_property
    def o_act(self) -> torch.Tensor:
        """The outputs of the active rows."""
        return self.out.index_select(0, self.run.active_idx)

    @cached_property
    def unwritten(self) -> torch.Tensor:
        """Active outputs still holding the exact NaN poison."""
        return inv.unwritten_mask(self.o_act)

    @cached_property
    def lit_nonfinite(self) -> torch.Tensor | None:
        """Non-finite outputs of the literal model in the active rows (None without it)."""
        if not self.lit_outs:
            return None
        return ~torch.isfinite(self.lit_outs[0].index_select(0, self.run.active_idx))


@dataclass(eq=False)
class RunContext:
    """The end of a run: the Lockstep, the kernel as given (to build a fresh one), the chained
    output digest after each step, and the exception record if a step raised."""

    run: Any
    kernel: Any
    step_digests: list[str]
    exception: dict | None = None
    repeat: bool = True
    hook: str = "end-of-run"

    @property
    def resolved(self) -> ResolvedScenario:
        return self.run.resolved

    def fail(self, step: int, check: str, message: str, **where) -> None:
        self.run.fail(step, check, message, **where)


__all__ = ["RunContext", "StepContext"]
